//! The step profiler through the command line, as a user runs it: `--profile 3..6` writes a
//! Chrome trace per rank, and the operators it records cover the steps' wall time.

use std::process::Command;

use crate::common::last_json;

#[test]
fn profiled_steps_write_a_chrome_trace_per_rank_and_a_top_ops_table() {
    let runs = crate::common::scratch("profile-runs");
    let out = Command::new(env!("CARGO_BIN_EXE_trainbook"))
        .args([
            "train",
            "bert-mlm",
            "--preset",
            "tiny",
            "--workers",
            "2",
            "--device",
            "cpu",
            "--max-steps",
            "8",
            "--profile",
            "3..6",
            "--json",
        ])
        .env("TRAINBOOK_RUNS", &runs)
        .output()
        .unwrap();
    let s = last_json(&out);
    assert_eq!(s["status"], "succeeded", "{s}");
    let p = &s["profile"];
    assert_eq!(
        (p["steps"]["start"].as_u64(), p["steps"]["end"].as_u64()),
        (Some(3), Some(6)),
        "{p}"
    );
    // The steps' wall time is spent inside libtorch's operators (and the allreduce), not in
    // unrecorded host code between them.
    let covered = p["covered"].as_f64().unwrap();
    assert!(covered >= 0.9, "operators cover {covered:.2} of the steps");
    let ops: Vec<&str> = p["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert!(
        ops.contains(&"aten::mm") && ops.iter().any(|o| o.contains("all_reduce")),
        "{ops:?}"
    );
    let traces: Vec<&str> = p["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(traces.len(), 2, "{traces:?}");
    for (rank, t) in traces.iter().enumerate() {
        assert!(
            t.ends_with(&format!("profile/rank{rank}.pt.trace.json")),
            "{t}"
        );
        let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(t).unwrap()).unwrap();
        let steps: Vec<&str> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                e["name"]
                    .as_str()
                    .filter(|n| n.starts_with("ProfilerStep#"))
            })
            .collect();
        assert_eq!(
            steps,
            ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"],
            "rank {rank}"
        );
    }
    // The terminal shows the table.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("profiled steps 3..6 on rank 0") && err.contains("% step"),
        "{err}"
    );
    std::fs::remove_dir_all(&runs).ok();
}
