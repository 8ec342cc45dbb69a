//! The options of a training job, shared by `train`, `plan` and `sweep`: [`TrainArgs`] and the
//! groups it is made of, and the job spec they ask for.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::{LmOptions, MlmOptions, QaOptions, TextOptions, VisionOptions};
use trainbook_api::DeviceRequest;
use trainbook_api::{Configure, JobSpec, Nodes, Resume, TrainOptions};

/// A training job: the recipe, its workers, and the groups below. The order of the fields is
/// the order of `--help` within each heading.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Recipe to train (see `trainbook recipes`).
    pub recipe: String,
    /// Number of worker processes (one per device).
    #[arg(short = 'n', long, default_value_t = 2)]
    pub workers: usize,
    /// auto = HPU if the Gaudi stack is present, else CUDA if available, else CPU.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceRequest,
    /// Intra-op threads per worker (default: cores / workers on CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub nodes: NodeArgs,
    /// Seconds a collective (or joining the job) may wait for the other workers before the
    /// job fails with the name of the rank that did not answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub collective_timeout: u64,
    /// Parent directory of the run directory [env: TRAINBOOK_RUNS, default: ./trainbook_runs].
    #[arg(long)]
    pub runs_root: Option<PathBuf>,
    #[command(flatten)]
    pub failures: FailureArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Print one JSON summary as the last line of stdout (human output goes to stderr).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub export: ExportTo,
    #[command(flatten)]
    pub options: RecipeOptions,
}

/// A job of several machines ("More than one machine" in `--help`).
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Rendezvous port on node 0 (default: a free port on one node; 29500 on several).
    #[arg(long, help_heading = "More than one machine")]
    pub master_port: Option<u16>,
    /// Machines in the job, each running this command with its own --node-rank (default: 1,
    /// or what srun, mpirun or torchrun set; see docs/multi-node.md).
    /// MIN:MAX makes the job elastic: it starts once MIN nodes joined (waiting 10 s more for
    /// the rest), goes on without a lost node from its newest checkpoint while MIN are left
    /// (each loss uses one of --max-failures), and takes a node that joins at its next
    /// checkpoint.
    #[arg(long, value_name = "N|MIN:MAX", value_parser = parse_nnodes, help_heading = "More than one machine")]
    pub nnodes: Option<Nodes>,
    /// This machine's rank among the nodes; node 0 hosts the rendezvous and shows the
    /// dashboard for the whole job.
    #[arg(long, value_name = "K", help_heading = "More than one machine")]
    pub node_rank: Option<usize>,
    /// Node 0's address, reachable from every node [default: 127.0.0.1, or the launcher's].
    #[arg(long, value_name = "ADDR", help_heading = "More than one machine")]
    pub master_addr: Option<String>,
    /// The address this node's workers bind for gloo (default: the host name's address).
    #[arg(long, value_name = "ADDR", help_heading = "More than one machine")]
    pub node_addr: Option<String>,
}

/// Naming, resuming and restarting a run ("When things fail" in `--help`).
#[derive(Args, Debug)]
pub struct FailureArgs {
    /// Name of the run directory (<runs root>/<NAME>), so that the same command with
    /// --resume auto continues it after a requeue or a killed driver.
    #[arg(long, value_name = "NAME", help_heading = "When things fail")]
    pub name: Option<String>,
    /// auto: continue the named run from its newest checkpoint (or start it when it has none);
    /// a finished run is not trained again.
    #[arg(long, value_name = "auto|never", default_value = "never", value_parser = parse_resume, help_heading = "When things fail")]
    pub resume: Resume,
    /// Restarts after a failure (a worker's death, a collective error, a hang), each from the
    /// run's newest checkpoint; -1: no limit. The same error at the same step twice is not
    /// retried.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true,
        help_heading = "When things fail"
    )]
    pub max_failures: i32,
    /// Seconds a worker may make no progress (no step, no evaluation batch; checkpoint writes
    /// excepted) before it counts as hung: its native stack is saved and the job fails or
    /// restarts. 0: off.
    #[arg(long, value_name = "SECONDS", default_value_t = trainbook_api::plumbing::settings::DEFAULT_HANG_TIMEOUT_SECS, help_heading = "When things fail")]
    pub hang_timeout: u64,
}

/// The memory plan's check before launch ("Memory" in `--help`).
#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// Memory of each worker's device, e.g. 32GiB (first-generation Gaudi) or 96GB (Gaudi2):
    /// the memory plan checks the job against it instead of what this machine reports.
    #[arg(long, value_name = "SIZE", help_heading = "Memory")]
    pub device_memory: Option<String>,
    /// Launch even when the memory plan says the job does not fit its devices (the plan
    /// errs high).
    #[arg(long, help_heading = "Memory")]
    pub no_memory_check: bool,
}

/// Where the run's metrics go and which worker lines are shown.
#[derive(Args, Debug)]
pub struct OutputArgs {
    /// Do not write TensorBoard event files into the run directory.
    #[arg(long)]
    pub no_tensorboard: bool,
    /// Log the run to this MLflow tracking server (e.g. http://127.0.0.1:5000): options as
    /// params, metrics by step, tags, status, the last checkpoint as an artifact. Default:
    /// $MLFLOW_TRACKING_URI when it names an HTTP server; a server that is down never stops
    /// the training.
    #[arg(long, value_name = "URI")]
    pub mlflow: Option<String>,
    /// Show every worker line instead of merging repeats across workers.
    #[arg(long)]
    pub no_dedup: bool,
    /// Seconds over which repeated lines from different workers are merged.
    #[arg(long, default_value_t = 5.0)]
    pub dedup_window: f64,
    /// Which worker lines to show: off, error, warn, info or debug [env: TRAINBOOK_LOG,
    /// default: info]. The run directory keeps every line.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<trainbook_widgets::LogLevel>,
}

/// `--export DIR [--merge]`: the last checkpoint written as transformers loads it.
#[derive(Args, Debug)]
pub struct ExportTo {
    /// When the job succeeds, write its last checkpoint to DIR as transformers (full models:
    /// causal-lm, bert, bert-mlm, token-classification, question-answering) or peft (LoRA)
    /// load it (see `trainbook export`).
    #[arg(id = "export", long = "export", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// With --export: fold the LoRA adapter into the base weights and write a full model.
    #[arg(long, requires = "export")]
    pub merge: bool,
}

/// The training options every recipe reads and each recipe family's own.
#[derive(Args, Debug)]
pub struct RecipeOptions {
    #[command(
        flatten,
        next_help_heading = "Training (every recipe; default: the preset's)"
    )]
    pub train: TrainOptions,
    #[command(
        flatten,
        next_help_heading = "Text recipes (bert, token-classification, question-answering; bert-mlm: max-length is the block size)"
    )]
    pub text: TextOptions,
    #[command(flatten, next_help_heading = "Masked-LM recipe (bert-mlm)")]
    pub mlm: MlmOptions,
    #[command(flatten, next_help_heading = "Question answering (question-answering)")]
    pub qa: QaOptions,
    #[command(
        flatten,
        next_help_heading = "Causal-LM recipe (causal-lm: GPT-2, Llama, Mistral, Qwen2; max-length is the block size)"
    )]
    pub lm: LmOptions,
    #[command(flatten, next_help_heading = "Image recipes (resnet)")]
    pub vision: VisionOptions,
}

impl TrainArgs {
    pub fn to_spec(&self) -> Result<JobSpec> {
        let mut spec = JobSpec::new(&self.recipe)
            .workers(self.workers)
            .device(self.device);
        self.options.apply(&mut spec);
        spec.threads_per_worker = self.threads;
        // A launcher's variables first; flags given by hand win over them.
        if let Some(t) = trainbook_api::Topology::from_env()? {
            spec = spec.topology(&t);
        }
        let mut spec = self.nodes.apply(spec);
        spec.collective_timeout_secs = self.collective_timeout;
        spec.runs_root = self.runs_root.clone();
        self.failures.apply(&mut spec);
        spec.device_memory = self.memory.device_memory.clone();
        spec.memory_check = !self.memory.no_memory_check;
        self.output.apply(&mut spec)?;
        Ok(spec)
    }
}

impl RecipeOptions {
    fn apply(&self, spec: &mut JobSpec) {
        spec.train = self.train.clone();
        spec.edit_recipe_options(|o: &mut TextOptions| *o = self.text.clone());
        spec.edit_recipe_options(|o: &mut VisionOptions| *o = self.vision.clone());
        spec.edit_recipe_options(|o: &mut MlmOptions| *o = self.mlm.clone());
        spec.edit_recipe_options(|o: &mut QaOptions| *o = self.qa.clone());
        spec.edit_recipe_options(|o: &mut LmOptions| *o = self.lm.clone());
    }
}

impl NodeArgs {
    fn apply(&self, mut spec: JobSpec) -> JobSpec {
        if let Some(n) = self.nnodes {
            spec = spec.nodes(n);
        }
        if let Some(r) = self.node_rank {
            spec.node_rank = r;
        }
        if let Some(a) = &self.master_addr {
            spec.master_addr = a.clone();
        }
        if let Some(p) = self.master_port {
            spec.master_port = Some(p);
        }
        spec.node_addr = self.node_addr.clone();
        spec
    }
}

impl FailureArgs {
    fn apply(&self, spec: &mut JobSpec) {
        spec.run_name = self.name.clone();
        spec.resume = self.resume;
        spec.max_failures = self.max_failures;
        spec.hang_timeout_secs = self.hang_timeout;
    }
}

impl OutputArgs {
    fn apply(&self, spec: &mut JobSpec) -> Result<()> {
        spec.dedup.enabled = !self.no_dedup;
        spec.tensorboard = !self.no_tensorboard;
        spec.mlflow = self.mlflow.clone();
        if !(self.dedup_window.is_finite() && self.dedup_window >= 0.0) {
            anyhow::bail!("--dedup-window must be a number of seconds >= 0");
        }
        spec.dedup.window = Duration::from_secs_f64(self.dedup_window);
        spec.view.log_level = self.log_level;
        Ok(())
    }
}

pub(super) fn parse_device(s: &str) -> Result<DeviceRequest, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// `--nnodes N`, or torchrun's elastic `MIN:MAX`.
fn parse_nnodes(s: &str) -> Result<Nodes, String> {
    let count = |v: &str| {
        match v.trim().parse::<usize>() {
        Ok(0) => Err("a job needs at least 1 node".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "{s} is not a number of nodes nor a range: e.g. --nnodes 2, or --nnodes 2:4 for a job that runs on 2 to 4 nodes"
        )),
    }
    };
    match s.split_once(':') {
        Some((min, max)) => {
            let (min, max) = (count(min)?, count(max)?);
            if min > max {
                return Err(format!(
                    "{s} has more nodes at least than at most: give MIN:MAX, e.g. --nnodes {max}:{min}"
                ));
            }
            Ok((min..=max).into())
        }
        None => Ok(count(s)?.into()),
    }
}

fn parse_resume(s: &str) -> Result<Resume, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}
