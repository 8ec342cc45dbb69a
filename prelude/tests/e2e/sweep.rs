//! Sweeps with real trials: each trial's workers are real processes training the tiny BERT on
//! gloo, ASHA reads their real evaluation losses, and what runs at once is read from /proc.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::wait_until;
use trainbook::engine::testing::{children_of, process_alive};
use trainbook::SweepStatus;
use trainbook::{
    Asha, BertTrainer, Configure, ConfigureText, ConfigureTraining, DeviceRequest, Goal,
    OptimizerKind, Sweep, SweepJob, TrialStatus,
};

fn runs_root() -> PathBuf {
    crate::common::scratch("trainbook-sweep-tests")
}

/// The tiny BERT on one CPU worker, a few seconds per trial.
fn tiny_bert(epochs: u64) -> BertTrainer {
    BertTrainer::new()
        .preset("tiny")
        .workers(1)
        .device(DeviceRequest::Cpu)
        .runs_root(runs_root())
        .train_rows(128)
        .eval_rows(64)
        .max_length(32)
        .optimizer(OptimizerKind::Sgd)
        .epochs(epochs)
}

/// The trial run directories of this process's live worker processes, read from /proc.
fn trials_alive() -> BTreeSet<String> {
    children_of(std::process::id())
        .into_iter()
        .filter_map(|pid| std::fs::read(format!("/proc/{pid}/environ")).ok())
        .filter_map(|env| {
            env.split(|b| *b == 0)
                .filter_map(|kv| std::str::from_utf8(kv).ok())
                .find_map(|kv| kv.strip_prefix("TRAINBOOK_RUN_DIR=").map(String::from))
        })
        .collect()
}

/// Watches /proc until dropped; returns the most trials seen alive at once.
struct Watch {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Watch {
    fn start() -> Watch {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !d.load(Ordering::SeqCst) {
                most = most.max(trials_alive().len());
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        });
        Watch {
            done,
            thread: Some(thread),
        }
    }
    fn most(mut self) -> usize {
        self.done.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

#[test]
fn asha_prunes_trials_runs_two_at_a_time_and_picks_the_best_finished_one() {
    let watch = Watch::start();
    // Two learning rates that train, then four that blow the loss up: the late ones meet the
    // good ones' values at the first rung, so ASHA must stop at least two of them.
    let result = Sweep::new(tiny_bert(4))
        .grid("lr", [3e-2, 1e-2, 5.0, 10.0, 20.0, 40.0])
        .metric("eval_loss", Goal::Min)
        .concurrent(2)
        .scheduler(Asha::default().grace_period(1).reduction_factor(2.0))
        .fit()
        .unwrap();
    let most = watch.most();
    assert_eq!(
        most, 2,
        "two trials' workers at once, never more (seen {most})"
    );
    let trials = &result.trials;
    assert_eq!(trials.len(), 6);
    let pruned: Vec<_> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Pruned)
        .collect();
    assert!(pruned.len() >= 2, "{:#?}", result.trials());
    for t in &pruned {
        assert!(
            t.reports.len() < 4,
            "trial {} was pruned before its end",
            t.id
        );
        assert!(
            t.note.as_deref().is_some_and(|n| n.contains("rung")),
            "{:?}",
            t.note
        );
        // A pruned trial keeps its metrics and the checkpoint of its last evaluated epoch.
        let r = t.result.as_ref().unwrap();
        let ckpt = r
            .last_checkpoint
            .as_ref()
            .expect("a pruned trial's checkpoint");
        assert!(
            ckpt.join("model.safetensors").is_file(),
            "{}",
            ckpt.display()
        );
        assert!(!r.metric_rows.is_empty());
    }
    // The best: the lowest final eval_loss among trials that ran to their end.
    let done: Vec<_> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Succeeded)
        .collect();
    assert!(!done.is_empty());
    let lowest = done
        .iter()
        .min_by(|a, b| a.last().unwrap().total_cmp(&b.last().unwrap()))
        .unwrap();
    let best = result.best_trial().unwrap();
    assert_eq!(best.id, lowest.id);
    let best_result = result.best().unwrap();
    assert_eq!(best_result.run_dir, best.run_dir.clone().unwrap());
    assert_eq!(
        best_result.metrics["eval_loss"],
        best.last().unwrap(),
        "the result is the best trial's"
    );
    assert!(best_result.last_checkpoint.is_some());
    // ... and the table says the same about it.
    let table = result.trials();
    let row = best.id - 1;
    assert_eq!(
        table.column("trial").unwrap().f64s()[row],
        Some(best.id as f64)
    );
    assert_eq!(
        table.column("lr").unwrap().f64s()[row],
        best.params[0].1.as_f64()
    );
    assert_eq!(
        table.column("status").unwrap().get(row).to_string(),
        "succeeded"
    );
    // sweep.json names the same best trial and holds every trial's run directory.
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(result.dir.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(doc["best_trial"], best.id);
    assert_eq!(doc["trials"].as_array().unwrap().len(), 6);
    for t in trials {
        assert!(t.run_dir.as_ref().unwrap().starts_with(&result.dir));
    }
    assert!(trials_alive().is_empty());
}

#[test]
fn an_unknown_parameter_or_a_wrong_type_fails_before_any_worker_starts() {
    let before = std::fs::read_dir(runs_root()).unwrap().count();
    let e = Sweep::new(tiny_bert(1))
        .grid("lr", [1e-3])
        .grid("learning_rate", [1e-3, 1e-2])
        .fit()
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("has no option 'learning_rate'")
            && msg.contains("lr, ")
            && msg.contains("max_length"),
        "{msg}"
    );
    let e = Sweep::new(tiny_bert(1))
        .grid("epochs", [1.5])
        .fit()
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("sweep parameter epochs=1.5"),
        "{e:#}"
    );
    let e = Sweep::new(tiny_bert(1))
        .choice("optimizer", ["sgd", "adam"])
        .samples(4)
        .fit()
        .unwrap_err();
    assert!(format!("{e:#}").contains("unknown variant `adam`"), "{e:#}");
    assert!(
        children_of(std::process::id()).is_empty(),
        "no worker started"
    );
    assert_eq!(
        std::fs::read_dir(runs_root()).unwrap().count(),
        before,
        "no sweep directory either"
    );
}

#[test]
fn stop_ends_every_trial_and_leaves_no_worker() {
    let sweep: SweepJob = Sweep::new(tiny_bert(50))
        .grid("lr", [1e-3, 2e-3, 3e-3, 4e-3])
        .concurrent(2)
        .launch()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || sweep
            .trial_states()
            .iter()
            .filter(|t| t.step > 0)
            .count()
            == 2),
        "two trials never both trained"
    );
    let pids: Vec<u32> = (1..=2)
        .flat_map(|i| sweep.trial(i).unwrap().pids())
        .collect();
    assert_eq!(pids.len(), 2);
    sweep.stop().unwrap();
    assert_eq!(sweep.status(), SweepStatus::Stopped);
    let e = sweep.wait().unwrap_err();
    assert!(format!("{e}").contains("the sweep was stopped"), "{e}");
    let trials = sweep.trial_states();
    assert!(
        trials.iter().all(|t| t.status == TrialStatus::Stopped),
        "{trials:#?}"
    );
    assert!(
        trials[2].note.as_deref() == Some("not started: the sweep was stopped"),
        "{:?}",
        trials[2].note
    );
    assert!(pids.iter().all(|p| !process_alive(*p)));
    assert!(trials_alive().is_empty());
    assert!(sweep.trial(3).is_err(), "trial 3 never started");
}
