//! `prelude/examples/digits.rs`, the plain-program way to train a task of one's own: the
//! program re-executes itself as its 2 workers (its `worker_hook()` line) and predicts from the
//! checkpoint they wrote. `cargo test` builds the examples before it runs this.

use std::path::PathBuf;
use std::process::Command;

/// target/<profile>/examples/digits, beside this test's own target/<profile>/deps/ binary.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile.join("examples").join("digits");
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds it",
        path.display()
    );
    path
}

#[test]
fn the_digits_program_trains_on_two_workers_that_are_itself() {
    let runs = crate::common::scratch("example-digits");
    let out = Command::new(example())
        .args(["--workers", "2", "--max-steps", "30", "--hidden", "64"])
        .env("TRAINBOOK_RUNS", &runs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let metric = |name: &str| -> f64 {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{stdout}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // 30 SGD steps of a small MLP already classify most held-out digits.
    assert!(metric("eval_accuracy") > 0.5, "{stdout}");
    assert!(metric("eval_f1_macro") > 0.4, "{stdout}");
    // The program's own metric, averaged over the epoch's steps.
    let confidence = metric("epoch_train_confidence");
    assert!(confidence > 0.1 && confidence < 1.0, "{stdout}");
    assert!(stdout.contains(", predicted "), "{stdout}");

    // Both workers were this program: their logs are in the run directory.
    let checkpoint = stdout
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint "))
        .and_then(|l| l.split(':').next())
        .map(PathBuf::from)
        .unwrap();
    let run_dir = checkpoint.parent().unwrap().parent().unwrap();
    for rank in 0..2 {
        let log = run_dir.join("logs").join(format!("rank{rank}.log"));
        assert!(log.exists(), "{} is missing", log.display());
    }
}
