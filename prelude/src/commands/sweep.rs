//! `trainbook sweep`: many trials of a recipe's options, the unpromising ones stopped early, one
//! live table.

use anyhow::Result;
use clap::Args;
use trainbook_api::Resume;

use super::args::TrainArgs;

#[derive(Args, Debug)]
#[command(
    after_help = "Trials are the grid's product (every combination of the --grid values) times --samples, each \
        sample drawing the --choice/--uniform/--log-uniform parameters afresh. Parameters are the \
        options' own names (lr, warmup_ratio, max_length, ...; `trainbook train --help` lists them).\n\n\
        Examples:\n  trainbook sweep bert --preset tiny --workers 1 --grid lr=1e-4,3e-4,1e-3 --concurrent 2 --asha\n  \
        trainbook sweep bert --preset tiny --workers 1 --log-uniform lr=1e-5,1e-2 --uniform warmup_ratio=0,0.2 \
        --samples 8 --concurrent 2 --asha --reduction-factor 2 --metric eval_accuracy:max\n  \
        trainbook sweep bert --grid optimizer=sgd,adamw --grid lr=1e-4,1e-3 --median --json"
)]
pub struct SweepArgs {
    /// Every value of an option, each in its own trials: NAME=V1,V2,... (repeatable).
    #[arg(long = "grid", value_name = "NAME=V1,V2,..", help_heading = "Sweep")]
    pub grid: Vec<String>,
    /// One of these values drawn per trial: NAME=V1,V2,... (repeatable).
    #[arg(long = "choice", value_name = "NAME=V1,V2,..", help_heading = "Sweep")]
    pub choice: Vec<String>,
    /// A number drawn uniformly per trial: NAME=LOW,HIGH (repeatable).
    #[arg(long = "uniform", value_name = "NAME=LOW,HIGH", help_heading = "Sweep")]
    pub uniform: Vec<String>,
    /// A number drawn log-uniformly per trial (learning rates): NAME=LOW,HIGH (repeatable).
    #[arg(
        long = "log-uniform",
        value_name = "NAME=LOW,HIGH",
        help_heading = "Sweep"
    )]
    pub log_uniform: Vec<String>,
    /// Repetitions of the grid, each drawing the random parameters afresh.
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = "Sweep")]
    pub samples: usize,
    /// Seed of the random parameters.
    #[arg(
        long = "sweep-seed",
        value_name = "SEED",
        default_value_t = 0,
        help_heading = "Sweep"
    )]
    pub sweep_seed: u64,
    /// The metric that ranks trials and feeds early stopping, with its goal.
    #[arg(
        long,
        value_name = "NAME:min|max",
        default_value = "eval_loss:min",
        help_heading = "Sweep"
    )]
    pub metric: String,
    /// Trials at once (fewer when the devices or cores do not hold that many).
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = "Sweep")]
    pub concurrent: usize,
    /// Stop unpromising trials with ASHA (asynchronous successive halving).
    #[arg(long, help_heading = "Early stopping")]
    pub asha: bool,
    /// ASHA's first rung, in reports of the metric (epochs for eval_* metrics).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        help_heading = "Early stopping"
    )]
    pub grace: u64,
    /// ASHA keeps the best 1/F of the trials at each rung; rungs are F apart.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 4.0,
        help_heading = "Early stopping"
    )]
    pub reduction_factor: f64,
    /// ASHA's last report (default: the trials' epochs, for per-epoch metrics).
    #[arg(long, value_name = "N", help_heading = "Early stopping")]
    pub max_t: Option<u64>,
    /// Stop a trial whose best value is worse than the median of the others' running means.
    #[arg(long, conflicts_with = "asha", help_heading = "Early stopping")]
    pub median: bool,
    #[command(flatten)]
    pub job: TrainArgs,
}

impl SweepArgs {
    /// The sweep these flags ask for; `--name` names the sweep's directory.
    pub fn to_sweep(&self) -> Result<trainbook_api::Sweep> {
        use anyhow::{bail, Context};
        use trainbook_api::{Asha, MedianStopping, ParamValue, Space, Sweep, SweepSpec};
        let mut base = self.job.to_spec()?;
        let name = base.run_name.take();
        if base.resume != Resume::Never {
            bail!("--resume is for one run: a sweep's trials always start fresh");
        }
        let split = |flag: &str, arg: &str| -> Result<(String, Vec<ParamValue>)> {
            let (k, v) = arg.split_once('=').with_context(|| {
                format!("--{flag} {arg}: write NAME=VALUES, e.g. --{flag} lr=1e-4,1e-3")
            })?;
            let values: Vec<ParamValue> = v
                .split(',')
                .filter(|x| !x.trim().is_empty())
                .map(ParamValue::parse)
                .collect();
            Ok((k.trim().replace('-', "_"), values))
        };
        let bounds = |flag: &str, arg: &str| -> Result<(String, f64, f64)> {
            let (k, v) = split(flag, arg)?;
            match v.as_slice() {
                [a, b] => match (a.as_f64(), b.as_f64()) {
                    (Some(a), Some(b)) => Ok((k, a, b)),
                    _ => bail!("--{flag} {arg}: LOW and HIGH must be numbers"),
                },
                _ => bail!("--{flag} {arg}: write NAME=LOW,HIGH, e.g. --{flag} warmup_ratio=0,0.2"),
            }
        };
        let mut space = Vec::new();
        for a in &self.grid {
            let (k, v) = split("grid", a)?;
            space.push((k, Space::Grid(v)));
        }
        for a in &self.choice {
            let (k, v) = split("choice", a)?;
            space.push((k, Space::Choice(v)));
        }
        for a in &self.uniform {
            let (k, low, high) = bounds("uniform", a)?;
            space.push((k, Space::Uniform { low, high }));
        }
        for a in &self.log_uniform {
            let (k, low, high) = bounds("log-uniform", a)?;
            space.push((k, Space::LogUniform { low, high }));
        }
        let (metric, goal) = match self.metric.rsplit_once(':') {
            Some((m, g)) => (m.to_string(), g.parse()?),
            None => (self.metric.clone(), Default::default()),
        };
        let scheduler = if self.asha {
            Asha {
                grace_period: self.grace,
                reduction_factor: self.reduction_factor,
                max_t: self.max_t,
            }
            .into()
        } else if self.median {
            MedianStopping {
                grace_period: self.grace,
                ..Default::default()
            }
            .into()
        } else {
            trainbook_api::Scheduler::None
        };
        Ok(Sweep::from_spec(SweepSpec {
            base,
            space,
            samples: self.samples,
            seed: self.sweep_seed,
            metric,
            goal,
            concurrent: self.concurrent,
            scheduler,
            name,
        }))
    }
}

pub(super) fn run(args: &SweepArgs) -> Result<i32> {
    use crate::sweep_view::SweepDashboard;
    use trainbook_api::{SweepStatus, SweepUpdate};
    let sweep = args.to_sweep()?;
    let stop_requested = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop_requested.clone();
    // Ctrl-C: no new trials, running ones stopped (the handler goes in before any thread).
    let _ = super::ctrlc_stop(move || {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        crate::engine::stop_all();
    });
    let job = sweep.launch()?;
    if stop_requested.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = job.stop();
    }
    let updates = job.subscribe();
    let mut view = SweepDashboard::new(&job)?;
    eprintln!(
        "trainbook: {} · sweep directory {}",
        view.view().title,
        job.dir().display()
    );
    let to_stderr = args.job.json;
    let say = |text: String| {
        if to_stderr {
            eprintln!("{text}")
        } else {
            println!("{text}")
        }
    };
    // The same view as the notebook's: worker lines the level shows, and one line per trial
    // that starts or ends (a table reprinted every few seconds helps nobody in a log).
    let mut seen: std::collections::BTreeMap<usize, trainbook_api::TrialStatus> =
        Default::default();
    for u in updates {
        if let Some(line) = view.apply(&u) {
            say(line.to_string());
        }
        match &u {
            SweepUpdate::Trial(t) if seen.get(&t.id) != Some(&t.status) => {
                seen.insert(t.id, t.status);
                let why = t.error.as_deref().or(t.note.as_deref());
                let detail = match (why, t.last()) {
                    (Some(n), _) => format!(" — {}", n.lines().next().unwrap_or(n)),
                    (None, Some(v)) => format!(
                        " — {} {}",
                        job.spec().metric,
                        trainbook_widgets::format_metric(v)
                    ),
                    (None, None) => String::new(),
                };
                say(format!(
                    "trial {} ({}): {}{detail}",
                    t.id,
                    t.params_text(),
                    t.status
                ));
            }
            SweepUpdate::Finished(_) => break,
            _ => {}
        }
    }
    let outcome = job.wait();
    view.finish(&job);
    // The worker lines were printed as they came: the closing table without them.
    eprintln!("{}", view.text_without_logs());
    let result = job.result();
    if let Err(e) = &outcome {
        eprintln!("error: {e:#}");
    }
    if args.job.json {
        println!("{}", result.to_json());
    }
    Ok(if result.status == SweepStatus::Succeeded {
        0
    } else {
        1
    })
}
