//! End-to-end tests of `floodgate bench`, sized down to a fraction of a second: they
//! check the shape of the output, never a speed.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("bench")
        .args(args)
        .output()
        .expect("the floodgate binary runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn quick_json_is_a_well_formed_table() {
    let output = bench(&[
        "--quick",
        "--json",
        "--duration",
        "400ms",
        "--max-threads",
        "2",
    ]);
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is one JSON document");
    assert_eq!(report["unit"], "million decisions per second");
    assert!(report["machine"]["available_parallelism"].as_u64() >= Some(1));
    assert!(report["machine"]["cpu"].is_string());
    let repeats = report["repeats"].as_u64().expect("repeats");
    assert!(repeats >= 3, "every cell runs at least three times");
    assert!(report["run_ms"].as_f64() >= Some(20.0));
    assert!(report["warm_up_ms"].as_f64() > Some(0.0));
    assert_eq!(report["unstable_spread"].as_f64(), Some(1.2));
    let rows = report["rows"].as_array().expect("rows");
    // Every (group, key count) has one row per thread count, in order.
    let mut groups: Vec<((&str, u64), Vec<u64>)> = Vec::new();
    for r in rows {
        let group = (r["group"].as_str().unwrap(), r["keys"].as_u64().unwrap());
        let threads = r["threads"].as_u64().unwrap();
        match groups.last_mut() {
            Some((g, t)) if *g == group => t.push(threads),
            _ => groups.push((group, vec![threads])),
        }
    }
    for (group, threads) in &groups {
        assert_eq!(threads, &[1, 2], "{group:?}");
    }
    let names: Vec<(&str, u64)> = groups.iter().map(|(g, _)| *g).collect();
    for want in [
        ("gcra", 1),
        ("gcra-keyed-booked", 1_000),
        ("gcra-keyed-booked", 100_000),
        ("gcra-keyed-idle", 100_000),
    ] {
        assert!(names.contains(&want), "{want:?} in {names:?}");
    }
    for row in rows {
        assert!(row["workload"].as_str().is_some_and(|w| !w.is_empty()));
        let mut required = vec!["floodgate", "textbook"];
        // The sliding log is itself a short critical section: it has no mutex twin.
        if row["group"] != "sliding-log" {
            required.push("mutex_twin");
        }
        if row["group"] == "gcra" {
            required.extend(["leased", "leased_coarse", "floor", "no_write_ceiling"]);
        }
        // governor has GCRA only.
        let gcra = row["group"].as_str().is_some_and(|g| g.starts_with("gcra"));
        if cfg!(feature = "compare") && gcra {
            required.push("governor");
        } else if !cfg!(feature = "compare") {
            assert!(row["governor"].is_null(), "{row}");
        }
        for implementation in [
            "floodgate",
            "leased",
            "leased_coarse",
            "mutex_twin",
            "textbook",
            "governor",
            "dashmap_anchor",
            "floor",
            "no_write_ceiling",
        ] {
            let m = &row[implementation];
            if m.is_null() {
                assert!(
                    !required.contains(&implementation),
                    "{implementation}: {row}"
                );
                continue;
            }
            assert!(m["mdps"].as_f64() > Some(0.0), "{implementation}: {row}");
            assert_eq!(
                m["runs_mdps"].as_array().map(Vec::len),
                Some(repeats as usize)
            );
            let spread = m["spread"].as_f64().expect("spread");
            assert!(spread >= 1.0, "{row}");
            assert_eq!(m["unstable"].as_bool(), Some(spread > 1.2), "{row}");
            assert!(m["ran_s"].as_f64() > Some(0.0));
            let admits_all = row["workload"]
                .as_str()
                .is_some_and(|w| w.contains("every decision admits"));
            if admits_all && implementation != "no_write_ceiling" {
                assert!(m["admitted_fraction"].as_f64() > Some(0.9), "{row}");
            }
        }
        // The ratio columns pair the two cells' runs round by round.
        let runs = |cell: &serde_json::Value| -> Option<Vec<f64>> {
            let runs = cell["runs_mdps"].as_array()?;
            runs.iter().map(serde_json::Value::as_f64).collect()
        };
        for (column, baseline) in [("vs_mutex_twin", "mutex_twin"), ("vs_governor", "governor")] {
            let paired: Option<Vec<f64>> = runs(&row["floodgate"])
                .zip(runs(&row[baseline]))
                .map(|(a, b)| a.iter().zip(&b).map(|(a, b)| a / b).collect());
            let reported = &row[column];
            let Some(paired) = paired else {
                assert!(reported.is_null(), "{column} without its cells: {row}");
                continue;
            };
            let listed: Vec<f64> = reported["runs"]
                .as_array()
                .unwrap_or_else(|| panic!("{column}: {row}"))
                .iter()
                .map(|r| r.as_f64().unwrap())
                .collect();
            assert_eq!(listed.len(), paired.len(), "{row}");
            for (l, p) in listed.iter().zip(&paired) {
                assert!((l - p).abs() <= 1e-9 * p, "{column}: {row}");
            }
            let mut sorted = paired.clone();
            sorted.sort_by(f64::total_cmp);
            let mid = sorted.len() / 2;
            let median = if sorted.len() % 2 == 1 {
                sorted[mid]
            } else {
                (sorted[mid - 1] + sorted[mid]) / 2.0
            };
            let spread = sorted[sorted.len() - 1] / sorted[0];
            let got = reported["median"].as_f64().unwrap();
            assert!((got - median).abs() <= 1e-9 * median, "{column}: {row}");
            let got = reported["spread"].as_f64().unwrap();
            assert!((got - spread).abs() <= 1e-9 * spread, "{column}: {row}");
            assert_eq!(reported["unstable"].as_bool(), Some(spread > 1.2), "{row}");
        }
    }
}

#[test]
fn a_group_outside_the_main_job_runs_when_named() {
    let csv = bench(&[
        "--groups",
        "gcra-keyed-idle-disjoint",
        "--keys",
        "1000",
        "--duration",
        "100ms",
        "--max-threads",
        "2",
        "--csv",
    ])
    .stdout;
    let csv = String::from_utf8(csv).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(!rows.is_empty(), "{csv}");
    assert!(
        rows.iter()
            .all(|r| r.starts_with("gcra-keyed-idle-disjoint,1000,")),
        "{csv}"
    );
    assert!(rows.iter().any(|r| r.contains(",2,floodgate,")), "{csv}");
}

#[test]
fn csv_and_table_carry_every_cell() {
    let args = ["--duration", "100ms", "--max-threads", "1"];
    let csv = String::from_utf8(bench(&[&args[..], &["--csv"]].concat()).stdout).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("group,keys,threads,implementation,mdps,spread,unstable,runs,admitted_fraction,ran_s")
    );
    let hot: Vec<&str> = lines
        .filter(|l| l.starts_with("gcra,1,1,"))
        .map(|l| l.split(',').nth(3).unwrap())
        .collect();
    let mut want = vec![
        "floodgate",
        "leased",
        "leased_coarse",
        "mutex_twin",
        "textbook",
    ];
    if cfg!(feature = "compare") {
        want.push("governor");
    }
    want.extend(["floor", "no_write_ceiling"]);
    assert_eq!(hot, want);
    assert!(
        csv.contains("\ngcra-keyed-idle,100000,1,mutex_twin,"),
        "{csv}"
    );
    assert!(
        !csv.contains("gcra-keyed-idle-disjoint"),
        "the disjoint group runs only when named: {csv}"
    );

    // The table's columns and cell format, on the hot-key group alone (the CSV above
    // already ran the whole main job).
    let table =
        String::from_utf8(bench(&[&args[..], &["--groups", "gcra"]].concat()).stdout).unwrap();
    let header = table
        .lines()
        .find(|l| l.starts_with("group"))
        .expect("a header line");
    for column in [
        "floodgate",
        "mutex twin",
        "textbook",
        "floor",
        "no-write",
        "vs mutex",
        "ran",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert_eq!(
        header.contains("governor"),
        cfg!(feature = "compare"),
        "{header}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("gcra ") && l.contains(" 1 "))
        .expect("a gcra hot-key row");
    // Each cell is `median/spread`, then `!` (unstable) or a blank.
    assert!(row.contains('/'), "{row}");
    assert!(table.contains("median/spread of 3 runs of"), "{table}");
    assert!(table.contains("! = spread above 1.2"), "{table}");
}

#[test]
fn plot_writes_a_well_formed_svg() {
    let dir = std::env::temp_dir().join(format!("floodgate-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("scaling.svg");
    // The plot draws the first group measured: the hot-key group alone suffices.
    let output = bench(&[
        "--duration",
        "100ms",
        "--max-threads",
        "2",
        "--groups",
        "gcra",
        "--csv",
        "--plot",
        path.to_str().unwrap(),
    ]);
    assert!(!output.stdout.is_empty());
    let svg = std::fs::read_to_string(&path).expect("the plot was written");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        svg.trim_start().starts_with("<svg"),
        "{}",
        &svg[..svg.len().min(200)]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    // Well-formed: every element that opens closes, in order.
    let mut open: Vec<String> = Vec::new();
    let mut rest = svg.as_str();
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').expect("every tag closes") + start;
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else if !tag.ends_with('/') {
            open.push(tag.split_whitespace().next().unwrap_or("").to_owned());
        }
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
    // One line per contender, labelled in the legend.
    for name in ["floodgate", "leased", "mutex twin", "floor", "no-write"] {
        assert!(svg.contains(name), "{name} missing from the legend");
    }
    assert!(
        svg.contains("<polyline") || svg.contains("<path"),
        "no lines drawn"
    );
}

#[test]
fn latency_reports_ordered_percentiles_beside_the_timer_only_baseline() {
    let output = bench(&["--latency", "--quick", "--json"]);
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is one JSON document");
    assert_eq!(report["threads"].as_u64(), Some(2));
    let rows = report["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["implementation"].as_str().unwrap())
        .collect();
    let mut want = vec!["timer_only", "floodgate", "leased", "mutex_twin"];
    if cfg!(feature = "compare") {
        want.push("governor");
    }
    assert_eq!(names, want);
    assert_eq!(report["rounds"].as_u64(), Some(3), "the default repeats");
    for row in rows {
        let p = |k: &str| row[k].as_u64().expect(k);
        assert!(p("decisions") > 0, "{row}");
        assert!(
            p("p50") <= p("p99") && p("p99") <= p("p999") && p("p999") <= p("max"),
            "{row}"
        );
        for (median, range) in [("p99", "p99_range"), ("p999", "p999_range")] {
            let r: Vec<u64> = row[range]
                .as_array()
                .expect(range)
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert!(r[0] <= p(median) && p(median) <= r[1], "{row}");
        }
    }
    let ratio = &report["floodgate_p999_over_governor"];
    if cfg!(feature = "compare") {
        let r: Vec<f64> = ratio
            .as_array()
            .expect("a ratio to governor")
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(r[1] > 0.0 && r[1] <= r[0] && r[0] <= r[2], "{ratio}");
    } else {
        assert!(ratio.is_null(), "{ratio}");
    }
    let table = String::from_utf8(bench(&["--latency", "--quick"]).stdout).unwrap();
    assert!(
        table.contains("p99.9") && table.contains("timer_only"),
        "{table}"
    );
}

#[test]
fn memory_reports_bytes_per_key_of_every_keyed_table() {
    let output = bench(&["--memory", "--keys", "1000,100000", "--json"]);
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is one JSON document");
    assert_eq!(report["unit"], "heap bytes per key");
    let rows = report["rows"].as_array().expect("rows");
    let mut tables: Vec<&str> = rows.iter().map(|r| r["table"].as_str().unwrap()).collect();
    tables.dedup();
    // Every table of the library's list (floodgate on each storage, then the other
    // keyed columns), in its order.
    let want: Vec<&str> = floodgate_bench::matrix::keyed_tables()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(
        &want[..3],
        [
            "floodgate_heap",
            "floodgate_inline",
            "floodgate_fingerprint"
        ]
    );
    assert_eq!(tables, want);
    assert_eq!(
        rows.len(),
        2 * want.len(),
        "one row per table and key count"
    );
    for row in rows {
        let keys = row["keys"].as_u64().expect("keys");
        let per_key = row["bytes_per_key"].as_f64().expect("bytes_per_key");
        assert!(keys == 1_000 || keys == 100_000, "{row}");
        let bytes = row["bytes"].as_f64().expect("bytes");
        assert!((bytes / keys as f64 - per_key).abs() < 1e-9, "{row}");
        // Mimalloc, counted: a key word and a state word per key at least.
        assert!(per_key >= 16.0, "{row}");
        if row["table"] == "floodgate_inline" && keys == 100_000 {
            assert!(per_key <= 24.0, "{row}");
        }
    }
    let table = String::from_utf8(bench(&["--memory", "--keys", "2000"]).stdout).unwrap();
    assert!(table.contains("2000 keys"), "{table}");
    assert!(table.contains("floodgate_fingerprint"), "{table}");
}

#[test]
fn memory_takes_neither_csv_nor_groups() {
    for extra in ["--csv", "--groups=gcra"] {
        let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(["bench", "--memory", extra])
            .output()
            .expect("the floodgate binary runs");
        assert_eq!(output.status.code(), Some(2), "{extra}");
    }
}
