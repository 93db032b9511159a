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
    let threads: Vec<u64> = rows
        .iter()
        .map(|r| r["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, [1, 2]);
    for row in rows {
        assert_eq!(row["algorithm"], "gcra");
        assert_eq!(row["keys"], "hot");
        assert!(row["workload"]
            .as_str()
            .is_some_and(|w| w.contains("burst")));
        for implementation in ["floodgate", "mutex_twin", "textbook"] {
            let m = &row[implementation];
            assert!(m["mdps"].as_f64() > Some(0.0), "{implementation}: {row}");
            assert_eq!(
                m["runs_mdps"].as_array().map(Vec::len),
                Some(repeats as usize)
            );
            assert!(m["ran_s"].as_f64() > Some(0.0));
            assert!(m["admitted_fraction"].as_f64() > Some(0.9), "{row}");
        }
        let ratio = row["floodgate"]["mdps"].as_f64().unwrap()
            / row["mutex_twin"]["mdps"].as_f64().unwrap();
        let reported = row["vs_mutex_twin"].as_f64().unwrap();
        assert!((ratio - reported).abs() <= 1e-9 * ratio, "{row}");
        if cfg!(feature = "compare") {
            assert!(row["governor"]["mdps"].as_f64() > Some(0.0), "{row}");
            assert!(row["vs_governor"].as_f64() > Some(0.0), "{row}");
        } else {
            assert!(row["governor"].is_null() && row["vs_governor"].is_null());
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
    let implementations: Vec<&str> = lines.map(|l| l.split(',').nth(3).unwrap()).collect();
    let mut want = vec!["floodgate", "mutex_twin", "textbook"];
    if cfg!(feature = "compare") {
        want.push("governor");
    }
    assert_eq!(implementations, want);

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
        .find(|l| l.starts_with("gcra"))
        .expect("a gcra row");
    assert_eq!(
        row.contains("n/a"),
        !cfg!(feature = "compare"),
        "governor is n/a exactly without the compare feature: {row}"
    );
    assert!(table.contains("median of 1 run of"), "{table}");
}
