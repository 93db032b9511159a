//! `floodgate bench` given arguments it cannot honour: a clear message and a non-zero
//! exit, never a panic; and arguments that must not change what a group measures.
//! Each run is cut to a fraction of a second (one group, one thread, `--duration 1ms`
//! and the 20 ms floor per run); nothing here asserts a speed.

use std::process::{Command, Output};

fn floodgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(args)
        .output()
        .expect("the floodgate binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn key_counts_no_keyed_table_can_hold_are_refused_not_a_panic() {
    // 10^11 keys: over the keyed table's default memory budget; u64::MAX: over its
    // largest capacity. Both with --memory and for a timed keyed group.
    for keys in ["100000000000", "18446744073709551615"] {
        for args in [
            &["bench", "--memory", "--keys", keys][..],
            &[
                "bench",
                "--groups",
                "gcra-keyed-idle",
                "--keys",
                keys,
                "--max-threads",
                "1",
                "--duration",
                "1ms",
            ][..],
        ] {
            let output = floodgate(args);
            let message = stderr(&output);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
            assert!(!message.contains("panicked"), "{args:?}: {message}");
            assert!(
                message.starts_with(&format!("floodgate: --keys {keys}: ")),
                "{args:?}: {message}"
            );
            assert!(output.stdout.is_empty(), "{args:?}");
        }
    }
}

#[test]
fn keys_leave_the_one_key_group_at_one_key() {
    // `gcra-keyed-hot` sends every thread to one key; --keys sizes the other keyed
    // groups and must not turn it into a many-key run (whose hot-key table, sized for
    // its one key, would churn).
    let output = floodgate(&[
        "bench",
        "--groups",
        "gcra-keyed-hot,gcra-keyed-idle",
        "--keys",
        "5000",
        "--max-threads",
        "1",
        "--duration",
        "1ms",
        "--csv",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let csv = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(
        rows.iter()
            .any(|r| r.starts_with("gcra-keyed-hot,1,1,leased,")),
        "{csv}"
    );
    assert!(
        rows.iter()
            .any(|r| r.starts_with("gcra-keyed-idle,5000,1,")),
        "{csv}"
    );
    for row in &rows {
        let mut fields = row.split(',');
        let (group, keys) = (fields.next().unwrap(), fields.next().unwrap());
        match group {
            "gcra-keyed-hot" => assert_eq!(keys, "1", "{row}"),
            "gcra-keyed-idle" => assert_eq!(keys, "5000", "{row}"),
            other => panic!("unexpected group {other}: {row}"),
        }
    }
}

#[test]
fn the_plot_names_the_group_and_key_count_it_draws() {
    // Without `gcra`, the plot draws the first group chosen, at its first key count:
    // its title must say which, not "on one hot key".
    let dir = std::env::temp_dir().join(format!("floodgate-plot-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("keyed.svg");
    let output = floodgate(&[
        "bench",
        "--groups",
        "gcra-keyed-idle",
        "--keys",
        "1000,2000",
        "--max-threads",
        "1",
        "--duration",
        "1ms",
        "--csv",
        "--plot",
        path.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(&path);
    std::fs::remove_dir_all(&dir).ok();
    assert!(output.status.success(), "{}", stderr(&output));
    let svg = svg.expect("the plot was written");
    assert!(svg.contains("gcra-keyed-idle, 1000 keys"), "{svg}");
    assert!(!svg.contains("hot key"), "{svg}");
}

#[test]
fn an_unwritable_plot_path_is_an_error_naming_it() {
    let path = std::env::temp_dir()
        .join(format!("floodgate-no-such-dir-{}", std::process::id()))
        .join("x.svg");
    let output = floodgate(&[
        "bench",
        "--groups",
        "gcra",
        "--max-threads",
        "1",
        "--duration",
        "1ms",
        "--plot",
        path.to_str().unwrap(),
    ]);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(
        message.starts_with(&format!("floodgate: --plot {}: ", path.display())),
        "{message}"
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn an_interrupted_run_neither_truncates_an_earlier_plot_nor_leaves_an_empty_one() {
    let dir = std::env::temp_dir().join(format!("floodgate-plot-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let earlier = dir.join("earlier.svg");
    std::fs::write(&earlier, "<svg>an earlier plot</svg>").unwrap();
    let fresh = dir.join("fresh.svg");
    for path in [&earlier, &fresh] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(["bench", "--groups", "gcra", "--duration", "60s", "--plot"])
            .arg(path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the floodgate binary starts");
        // The path is checked before the first run; a minute of runs is still ahead.
        std::thread::sleep(std::time::Duration::from_secs(1));
        child.kill().expect("the run is still going");
        child.wait().unwrap();
    }
    let kept = std::fs::read_to_string(&earlier);
    let left = fresh.exists();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(kept.unwrap(), "<svg>an earlier plot</svg>");
    assert!(!left, "an interrupted run left an empty plot file");
}

#[test]
fn repeats_past_the_most_a_run_honours_are_refused() {
    // The throughput table ran at most 1000 repeats whatever was asked (and reported
    // 1000); --latency ran every round asked for, a run without end for a large count.
    for args in [
        &[
            "bench",
            "--repeats",
            "1001",
            "--groups",
            "gcra",
            "--max-threads",
            "1",
        ][..],
        &[
            "bench",
            "--latency",
            "--quick",
            "--repeats",
            "18446744073709551615",
        ][..],
    ] {
        let output = floodgate(args);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
        assert!(message.contains("--repeats"), "{args:?}: {message}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn flags_a_mode_does_not_read_are_refused_not_ignored() {
    // --latency times one hot key (no groups, no key counts, no time budget);
    // --memory times nothing. A flag they would drop is an error instead.
    for args in [
        &[
            "bench",
            "--latency",
            "--quick",
            "--groups",
            "gcra-keyed-idle",
        ][..],
        &["bench", "--latency", "--quick", "--keys", "1000"][..],
        &["bench", "--latency", "--quick", "--duration", "1s"][..],
        &["bench", "--memory", "--keys", "1000", "--duration", "1s"][..],
        &["bench", "--memory", "--keys", "1000", "--max-threads", "1"][..],
        &["bench", "--memory", "--keys", "1000", "--repeats", "5"][..],
        &["bench", "--memory", "--keys", "1000", "--quick"][..],
    ] {
        let output = floodgate(args);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
        assert!(
            message.contains("cannot be used with"),
            "{args:?}: {message}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

/// `bench --groups GROUPS --duration 1ms` and `extra`: every run at the 20 ms floor.
fn short_bench<'a>(groups: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["bench", "--groups", groups, "--duration", "1ms"];
    args.extend_from_slice(extra);
    args
}

/// Asserts a usage error: status 2, `needle` in the message, no panic, nothing on
/// stdout.
fn assert_refused(args: &[&str], needle: &str) {
    let output = floodgate(args);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
    assert!(!message.contains("panicked"), "{args:?}: {message}");
    assert!(
        message.contains(needle),
        "{args:?}: {needle:?} not in {message}"
    );
    assert!(output.stdout.is_empty(), "{args:?}");
}

#[test]
fn a_key_count_given_twice_is_refused() {
    // It was measured twice and printed as two identical rows (or columns), each
    // holding only one of the two measurements.
    let keys = ["--keys", "1000,2000,1000", "--max-threads", "1"];
    assert_refused(
        &short_bench("gcra-keyed-idle", &keys),
        "--keys: 1000 is given twice",
    );
    assert_refused(
        &["bench", "--memory", "--keys", "1000,1000"],
        "--keys: 1000 is given twice",
    );
}

#[test]
fn key_counts_no_chosen_group_reads_are_refused_not_ignored() {
    // `gcra` is one hot key and `gcra-keyed-hot` one key of a keyed limiter: --keys
    // sizes neither, and a run with it measured as if it had not been given.
    for groups in ["gcra", "gcra-keyed-hot", "gcra,gcra-keyed-hot"] {
        assert_refused(
            &short_bench(groups, &["--keys", "5000", "--max-threads", "1"]),
            "--keys: no group chosen",
        );
    }
}

#[test]
fn a_zero_duration_is_refused() {
    // It ran every cell at the 20 ms floor, as if a budget had been given.
    assert_refused(
        &["bench", "--groups", "gcra", "--duration", "0s"],
        "--duration",
    );
}

#[test]
fn disjoint_keys_need_a_key_for_every_thread() {
    // With fewer keys than threads, the threads past the keys all visit the last key:
    // the row is no longer "each thread on its own keys".
    assert_refused(
        &short_bench(
            "gcra-keyed-idle-disjoint",
            &["--keys", "1", "--max-threads", "2"],
        ),
        "--keys 1: gcra-keyed-idle-disjoint",
    );
}

/// A plot that cannot be written once the runs are done (here a device that is always
/// full: opening it for writing succeeds, writing fails) is reported with status 1,
/// and the measurements it drew from are still printed.
#[cfg(target_os = "linux")]
#[test]
fn a_plot_that_fails_after_the_runs_keeps_the_measurements() {
    let extra = ["--max-threads", "1", "--csv", "--plot", "/dev/full"];
    let output = floodgate(&short_bench("gcra", &extra));
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(
        message.starts_with("floodgate: --plot /dev/full: "),
        "{message}"
    );
    let csv = String::from_utf8(output.stdout).unwrap();
    assert!(
        csv.lines().any(|l| l.starts_with("gcra,1,1,floodgate,")),
        "the measurements were lost: {csv:?}"
    );
}
