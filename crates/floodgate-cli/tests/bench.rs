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
    assert!(repeats >= 1);
    assert!(report["run_ms"].as_f64() >= Some(20.0));
    let rows = report["rows"].as_array().expect("rows");
    // Every group (algorithm, keys) has one row per thread count, in order.
    let mut groups: Vec<((&str, &str), Vec<u64>)> = Vec::new();
    for r in rows {
        let group = (
            r["algorithm"].as_str().unwrap(),
            r["keys"].as_str().unwrap(),
        );
        let threads = r["threads"].as_u64().unwrap();
        match groups.last_mut() {
            Some((g, t)) if *g == group => t.push(threads),
            _ => groups.push((group, vec![threads])),
        }
    }
    for (group, threads) in &groups {
        assert_eq!(threads, &[1, 2], "{group:?}");
    }
    let names: Vec<(&str, &str)> = groups.iter().map(|(g, _)| *g).collect();
    assert!(names.contains(&("gcra", "hot")), "{names:?}");
    assert!(names.contains(&("gcra", "many")), "{names:?}");
    for row in rows {
        assert!(row["workload"].as_str().is_some_and(|w| !w.is_empty()));
        let mut required = vec!["floodgate", "textbook"];
        // The sliding log is itself a short critical section: it has no mutex twin.
        if row["algorithm"] != "sliding-log" {
            required.push("mutex_twin");
        }
        // governor has GCRA only.
        if cfg!(feature = "compare") && row["algorithm"] == "gcra" {
            required.push("governor");
        } else if !cfg!(feature = "compare") {
            assert!(row["governor"].is_null(), "{row}");
        }
        for implementation in ["floodgate", "mutex_twin", "textbook", "governor"] {
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
            assert!(m["ran_s"].as_f64() > Some(0.0));
            let admits_all = row["workload"]
                .as_str()
                .is_some_and(|w| w.contains("every decision admits"));
            if admits_all {
                assert!(m["admitted_fraction"].as_f64() > Some(0.9), "{row}");
            }
        }
        for (column, baseline) in [("vs_mutex_twin", "mutex_twin"), ("vs_governor", "governor")] {
            let ratio = row["floodgate"]["mdps"]
                .as_f64()
                .zip(row[baseline]["mdps"].as_f64())
                .map(|(a, b)| a / b);
            match (ratio, row[column].as_f64()) {
                (Some(ratio), Some(reported)) => {
                    assert!((ratio - reported).abs() <= 1e-9 * ratio, "{row}")
                }
                (None, None) => assert!(row[column].is_null(), "{row}"),
                _ => panic!("{column} does not match the columns: {row}"),
            }
        }
    }
}

#[test]
fn csv_and_table_carry_every_cell() {
    let args = [
        "--duration",
        "100ms",
        "--max-threads",
        "1",
        "--repeats",
        "1",
    ];
    let csv = String::from_utf8(bench(&[&args[..], &["--csv"]].concat()).stdout).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("algorithm,keys,threads,implementation,mdps,runs,admitted_fraction,ran_s")
    );
    let hot: Vec<&str> = lines
        .filter(|l| l.starts_with("gcra,hot,1,"))
        .map(|l| l.split(',').nth(3).unwrap())
        .collect();
    let mut want = vec!["floodgate", "mutex_twin", "textbook"];
    if cfg!(feature = "compare") {
        want.push("governor");
    }
    assert_eq!(hot, want);
    assert!(csv.contains("\ngcra,many,1,mutex_twin,"), "{csv}");

    let table = String::from_utf8(bench(&args).stdout).unwrap();
    let header = table
        .lines()
        .find(|l| l.starts_with("algorithm"))
        .expect("a header line");
    for column in [
        "floodgate",
        "mutex twin",
        "textbook",
        "governor",
        "vs mutex",
        "ran",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with("gcra") && l.contains(" hot "))
        .expect("a gcra hot-key row");
    assert_eq!(
        row.contains("n/a"),
        !cfg!(feature = "compare"),
        "governor is n/a exactly without the compare feature: {row}"
    );
    assert!(table.contains("median of 1 run of"), "{table}");
}
