//! `trainbook train`: one job, its dashboard in the terminal, and `--export` after it.

use std::io::IsTerminal;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use trainbook_api::{JobSpec, JobStatus, JobUpdate};

use super::args::TrainArgs;
use crate::dashboard::JobDashboard;

pub(super) fn run(args: &TrainArgs) -> Result<i32> {
    check_export(args)?;
    let spec = args.to_spec()?;
    say_place(&spec);
    // Ctrl-C stops the workers cleanly instead of leaving them to their death signal. The
    // handler goes in before any thread exists, so no other thread receives the signal.
    let current: std::sync::Arc<std::sync::Mutex<(bool, Option<trainbook_api::Job>)>> =
        Default::default();
    let slot = current.clone();
    let _ = super::ctrlc_stop(move || {
        let job = {
            let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
            g.0 = true;
            g.1.clone()
        };
        if let Some(j) = job {
            let _ = j.stop();
        }
    });
    let job = crate::launch(spec)?;
    let interrupted_early = {
        let mut g = current.lock().unwrap_or_else(|e| e.into_inner());
        g.1 = Some(job.clone());
        g.0
    };
    if interrupted_early {
        let _ = job.stop();
    }
    let updates = job.subscribe();
    let mut view = JobDashboard::with_history(&job)?;
    let human_to_stderr = args.json;
    let bar = ProgressBar::with_draw_target(
        Some(0),
        if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("█▉ "),
    );
    eprintln!(
        "trainbook: {} · run directory {}",
        view.dashboard().title,
        job.run_dir().display()
    );
    // The same dashboard as the notebook's: lines the view's level shows are printed, the
    // progress bar carries the progress line, the result view closes the run.
    for u in updates {
        let finished = matches!(u, JobUpdate::Finished(_));
        if let Some(line) = view.apply(&u) {
            let text = line.to_string();
            if bar.is_hidden() {
                if human_to_stderr {
                    eprintln!("{text}");
                } else {
                    println!("{text}");
                }
            } else {
                bar.println(text);
            }
        }
        if let JobUpdate::Progress(p) = &u {
            bar.set_length(p.total_steps);
            bar.set_position(p.step);
            bar.set_message(view.dashboard().progress.line());
        }
        if finished {
            break;
        }
    }
    bar.finish_and_clear();
    let result = job.wait();
    let summary = job.result()?;
    view.finish(&job);
    let spec = job.spec();
    if spec.node_rank > 0 && summary.status == JobStatus::Succeeded {
        // This node's workers reported to node 0: the job's numbers are there.
        eprintln!(
            "trainbook: node {} finished: {} worker(s) done in {:.1} s; the job's metrics, logs and checkpoints are on node 0",
            spec.node_rank, spec.workers, summary.elapsed
        );
    } else {
        eprintln!("{}", view.dashboard().summary_text());
    }
    let wait_error = result.as_ref().err().map(|e| format!("{e:#}"));
    let code = report_end(&summary, wait_error, args.json);
    if spec.node_rank == 0 {
        export_after(args, &summary)?;
    }
    Ok(code)
}

/// A node's place in its job of several nodes, said on stderr before it starts.
fn say_place(spec: &JobSpec) {
    let place = if spec.is_elastic() {
        format!(
            "of an elastic job of {}:{} nodes x {} worker(s)",
            spec.min_nodes.unwrap_or(spec.nodes),
            spec.nodes,
            spec.workers
        )
    } else if spec.nodes > 1 {
        let ranks = spec.local_ranks();
        format!(
            "of {}, ranks {}-{} of {}",
            spec.nodes,
            ranks.start,
            ranks.end - 1,
            spec.world_size()
        )
    } else {
        return;
    };
    eprintln!(
        "trainbook: node {} {place}, rendezvous at {}:{}{}",
        spec.node_rank,
        spec.master_addr,
        spec.master_port
            .unwrap_or(trainbook_api::plumbing::settings::DEFAULT_MASTER_PORT),
        if spec.node_rank > 0 {
            " (node 0 shows the whole job)"
        } else {
            ""
        }
    );
}

/// The recipes whose checkpoints `--export` writes as Hugging Face directories.
const EXPORTS: [&str; 5] = [
    "causal-lm",
    "bert",
    "bert-mlm",
    "token-classification",
    "question-answering",
];

/// `--export` only for the recipes whose checkpoints it writes.
fn check_export(args: &TrainArgs) -> Result<()> {
    if args.export.dir.is_some() && !EXPORTS.contains(&args.recipe.as_str()) {
        anyhow::bail!(
            "--export writes the checkpoints of {}; a {} run's checkpoints are read by trainbook (result.last_checkpoint)",
            EXPORTS.join(", "),
            args.recipe
        );
    }
    Ok(())
}

/// `--export DIR`: a succeeded job's last checkpoint, written where asked as transformers
/// (and, for LoRA, peft) load it.
fn export_after(args: &TrainArgs, summary: &trainbook_api::TrainResult) -> Result<()> {
    match (&args.export.dir, summary.status, &summary.last_checkpoint) {
        (Some(out), JobStatus::Succeeded, Some(ckpt)) if args.recipe != "causal-lm" => {
            let what = crate::recipes::checkpoint::export_encoder(ckpt, out)?;
            eprintln!("trainbook: exported {what}");
        }
        (Some(out), JobStatus::Succeeded, Some(ckpt)) => {
            let what = crate::recipes::causal_lm::inference::export(ckpt, out, args.export.merge)?;
            eprintln!("trainbook: exported {what}");
        }
        (Some(_), JobStatus::Succeeded, None) => {
            anyhow::bail!("--export: the job wrote no checkpoint to export")
        }
        _ => {}
    }
    Ok(())
}

/// What follows a job's summary in the terminal: the profiler's table, warnings, an error the
/// summary does not carry, the JSON line; returns the exit code.
fn report_end(summary: &trainbook_api::TrainResult, wait_error: Option<String>, json: bool) -> i32 {
    if let Some(p) = &summary.profile {
        eprint!("{}", p.table(15));
    }
    for w in &summary.warnings {
        eprintln!("warning: {w}");
    }
    if let (Some(e), None) = (wait_error, &summary.error) {
        eprintln!("error: {e}");
    }
    if json {
        println!("{}", summary.to_json());
    }
    if summary.status == JobStatus::Succeeded {
        0
    } else {
        1
    }
}
