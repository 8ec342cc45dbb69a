//! The `trainbook` command line.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::dashboard::JobDashboard;
use crate::{LmOptions, MlmOptions, QaOptions, TextOptions, VisionOptions};
use trainbook_api::DeviceRequest;
use trainbook_api::{Configure, JobSpec, Nodes, Resume, TrainConfig};
use trainbook_api::{JobStatus, JobUpdate};

#[derive(Parser, Debug)]
#[command(
    name = "trainbook",
    version,
    about = "Data-parallel training on CPU, CUDA and Intel Gaudi, from notebooks and the terminal",
    long_about = "Data-parallel training on CPU, CUDA and Intel Gaudi, from notebooks and the terminal.\n\n\
        `trainbook train <recipe> --workers N` starts N worker processes that train in lock-step \
        through PyTorch's c10d collectives (gloo on CPU, NCCL on CUDA), shows progress and \
        de-duplicated worker logs, and writes a run directory with the config, per-rank logs, \
        metrics (parquet) and checkpoints.",
    after_help = "Examples:\n  trainbook train bert --workers 2\n  trainbook train bert --workers 2 --optimizer adamw --lr 5e-5 --max-length 64 --epochs 1\n  trainbook train bert --preset tiny --json\n  trainbook train bert --model ./my-bert --data reviews.parquet --text-column review --label-column stars\n  trainbook train bert --resume-from trainbook_runs/<run>/checkpoints/epoch-0 --epochs 3\n  trainbook train bert --workers 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1   (node 1: the same with --node-rank 1)\n  srun --nodes 2 --ntasks-per-node 1 trainbook train bert --workers 8\n  trainbook train causal-lm --model ./llama --data chat.jsonl --lora-rank 8 --workers 2\n  trainbook generate --model ./llama --adapter <checkpoint> --prompt \"Once upon a time\"\n  trainbook recipes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a recipe with N data-parallel workers.
    Train(Box<TrainArgs>),
    /// What each device would hold for `train` with the same options (parameters, gradients,
    /// optimizer state, buffers, activations), against its memory, and the levers that make a
    /// job fit; exits 3 when it does not fit. Nothing is started.
    #[command(
        after_help = "Examples:\n  trainbook plan bert-mlm --preset bert-1.5b --workers 8 --device hpu --device-memory 32GiB\n  trainbook plan bert-mlm --preset bert-large --workers 2 --zero 2 --activation-checkpointing\n  trainbook plan bert --workers 2 --json\n\nThe plan is arithmetic on the model's shapes: on CPU it is the workers' resident memory; on\nCUDA and Gaudi the tensors plus the runtime's assumed reservations. --device with\n--device-memory plans for a machine you are not on."
    )]
    Plan(Box<TrainArgs>),
    /// Sweep a recipe's options: many trials, several at a time, the unpromising ones stopped
    /// early (ASHA), one live table.
    Sweep(Box<SweepArgs>),
    /// Prepare a pre-training corpus once: tokenised on every core into token shards that
    /// `train bert-mlm --data DIR` memory-maps (bounded memory; a stopped run continues); HDF5
    /// pre-training shards become fixed-size records, mapped the same way.
    #[command(
        after_help = "Examples:\n  trainbook prepare --data wiki.jsonl --out wiki-prepared\n  trainbook prepare --data corpus/ --tokenizer my-tokenizer --out corpus-prepared\n  trainbook train bert-mlm --data corpus-prepared --tokenizer my-tokenizer --workers 2\n  trainbook prepare --data books_wiki/   # HDF5 shards: records in the cache, where jobs\n                                         # given --data books_wiki/ find them\n\nStopped midway (Ctrl-C, a lost machine), the same command continues after the last finished\nshard. A job given raw text prepares it itself, into the data directory's cache."
    )]
    Prepare(PrepareArgs),
    /// Generate text with a causal LM (a model directory, an adapter over it, or a causal-lm
    /// checkpoint), streamed as it comes.
    Generate(Box<crate::lm::GenerateArgs>),
    /// Write a causal-lm checkpoint as the directories transformers and peft load (a LoRA
    /// adapter, or with --merge a full model).
    Export(crate::lm::ExportArgs),
    /// List the available recipes.
    Recipes,
    /// Tokenizers: `trainbook tokenizer train --data corpus.txt --vocab-size 32000 --out DIR`.
    #[command(subcommand)]
    Tokenizer(TokenizerCommand),
    /// Verify allreduce, broadcast and barrier across N worker processes (no training).
    Check {
        #[arg(short = 'n', long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value = "auto", value_parser = parse_device)]
        device: DeviceRequest,
    },
    /// The Jupyter kernel: `trainbook kernel install [--user|--sys-prefix|--prefix P]`,
    /// `trainbook kernel check` (runs `trainbook-kernel`; see `trainbook kernel --help`).
    #[command(disable_help_flag = true)]
    Kernel {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenizerCommand {
    /// Train a BERT WordPiece tokenizer from raw text; writes tokenizer.json and vocab.txt.
    #[command(
        after_help = "Examples:\n  trainbook tokenizer train --out my-tokenizer\n  trainbook tokenizer train --data wiki.txt --data books.parquet --vocab-size 32000 --out tok-32k\n\nA BERT model directory uses them when they sit beside its config.json and weights."
    )]
    Train(TokenizerArgs),
}

#[derive(Args, Debug)]
pub struct TokenizerArgs {
    /// Text sources, in order: .txt (a text per non-empty line), .parquet, .csv, .tsv or
    /// .jsonl (repeat the flag for more) [default: the offline Brown corpus].
    #[arg(long)]
    pub data: Vec<PathBuf>,
    /// The text column of tables.
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// Tokens in the vocabulary, the 5 special tokens and the alphabet included.
    #[arg(long, default_value_t = 30_522)]
    pub vocab_size: usize,
    /// Merge a pair of pieces only if it occurs at least this often.
    #[arg(long, default_value_t = 2)]
    pub min_frequency: u64,
    /// Keep case and accents (for cased models); the default lowercases, as uncased BERT.
    #[arg(long)]
    pub cased: bool,
    /// Characters kept in the initial alphabet, the most frequent first.
    #[arg(long, default_value_t = 1000)]
    pub limit_alphabet: usize,
    /// Directory to write tokenizer.json and vocab.txt into (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub json: bool,
}

impl TokenizerArgs {
    fn trainer(&self) -> trainbook_api::TokenizerTrainer {
        trainbook_api::TokenizerTrainer {
            data: self.data.clone(),
            text_column: Some(self.text_column.clone()),
            vocab_size: self.vocab_size,
            min_frequency: self.min_frequency,
            lowercase: !self.cased,
            limit_alphabet: self.limit_alphabet,
        }
    }
}

fn train_tokenizer(args: &TokenizerArgs) -> i32 {
    match args.trainer().train(&args.out) {
        Ok(t) => {
            println!(
                "trained a {}-token WordPiece vocabulary on {} texts in {:.1} s: {} and {}",
                t.vocab_size,
                t.texts,
                t.seconds,
                t.tokenizer_json.display(),
                t.vocab_txt.display()
            );
            println!("first text: {}", t.example.join(" "));
            if args.json {
                println!("{}", serde_json::to_string(&t).unwrap_or_default());
            }
            0
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}

#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// The corpus: a .txt file (a text per non-empty line), a table (.parquet, .csv, .tsv,
    /// .jsonl, .arrow), a directory of them (read in name order), a directory Hugging Face
    /// datasets' save_to_disk wrote (a DatasetDict: its train split), or a directory of those;
    /// or a directory of HDF5 pre-training shards (NVIDIA's layout), converted to records.
    #[arg(long)]
    pub data: PathBuf,
    /// Directory to write the prepared corpus into (created). Optional for HDF5 shards: their
    /// records then go to the prepared-corpus cache, where a job given the shards finds them.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The text column of tables.
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// Tokenizer directory (tokenizer.json or vocab.txt) [default: the offline uncased BERT
    /// vocabulary that bert-mlm uses by default]. Jobs must train with the same one.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Share of the texts held out for evaluation (every n-th text; 0: none).
    #[arg(long, default_value_t = 0.05)]
    pub eval_fraction: f64,
    /// Input megabytes per shard.
    #[arg(long, default_value_t = 64)]
    pub shard_mb: u64,
    /// Prepare one slice of the shards, I/N (e.g. 1/4), into an --out that every slice shares
    /// (several machines preparing one set in parallel); `auto` takes the rank and the count
    /// from Slurm (SLURM_PROCID/SLURM_NTASKS) or torchrun-style RANK/WORLD_SIZE. The slice that
    /// ends last writes index.json.
    #[arg(long, value_name = "I/N|auto")]
    pub slice: Option<String>,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub json: bool,
}

fn prepare(args: &PrepareArgs) -> Result<i32> {
    let hdf5 = trainbook_recipes::text::hdf5_shards::is_hdf5_dir(&args.data);
    let out = match (&args.out, hdf5) {
        (Some(out), _) => out.clone(),
        (None, true) => trainbook_recipes::text::corpus::records::cache_path(&args.data)?,
        (None, false) => anyhow::bail!(
            "{} holds no HDF5 pre-training shards (.hdf5, .h5), which alone are prepared without --out (into the cache): give --out DIR, the directory to write the prepared corpus into",
            args.data.display()
        ),
    };
    if hdf5 && args.tokenizer.is_some() {
        eprintln!("note: HDF5 shards are tokenised already: --tokenizer is not used (give the shards' vocabulary to the job)");
    }
    let mut spec = trainbook_api::CorpusPreparer::new(&args.data)
        .text_column(&args.text_column)
        .eval_fraction(args.eval_fraction)
        .shard_mb(args.shard_mb);
    spec.tokenizer = args.tokenizer.clone();
    spec.slice = args.slice.as_deref().map(parse_slice).transpose()?;
    let terminal = std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(
        None,
        if terminal {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(ProgressStyle::with_template(
        "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
    )?);
    let mut last = std::time::Instant::now();
    let result = trainbook_recipes::text::corpus::prepare_spec(&spec, &out, &mut |p| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.bytes);
        bar.set_message(match hdf5 {
            true => format!("{} sequences", p.texts),
            false => format!("{} texts, {} tokens", p.texts, p.tokens),
        });
        if !terminal && last.elapsed().as_secs() >= 10 {
            last = std::time::Instant::now();
            eprintln!("{}", p.line());
        }
        Ok(())
    });
    bar.finish_and_clear();
    let r = result?;
    if hdf5 {
        return prepared_records(args, &r);
    }
    if !r.is_complete() {
        let (index, count) = spec.slice.unwrap_or((0, 1));
        let pending: Vec<String> = r
            .pending_slices
            .iter()
            .map(|s| format!("{s}/{count}"))
            .collect();
        println!(
            "slice {index}/{count} of {} is prepared ({} shards in all); still to end: {} (the last slice to end writes index.json)",
            r.dir.display(),
            r.shards,
            pending.join(", ")
        );
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        return Ok(0);
    }
    println!(
        "prepared {}: {} texts, {} train + {} eval tokens in {}",
        r.dir.display(),
        r.texts,
        r.train_tokens,
        r.eval_tokens,
        footprint(&r, "shard", "text")
    );
    println!(
        "train on it: trainbook train bert-mlm --data {}{}",
        r.dir.display(),
        args.tokenizer
            .as_ref()
            .map(|t| format!(" --tokenizer {}", t.display()))
            .unwrap_or_default()
    );
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(0)
}

/// `3 shards (907.0 MB on disk from 2000.0 MB of text), 327.9 s (6.1 MB/s)`: what a
/// preparation wrote of how much input, in how long (when it took any time).
fn footprint(r: &trainbook_api::PreparedCorpus, noun: &str, input: &str) -> String {
    let timing = if r.seconds >= 0.05 {
        format!(
            ", {:.1} s ({:.1} MB/s)",
            r.seconds,
            r.text_bytes as f64 / 1e6 / r.seconds
        )
    } else {
        String::new()
    };
    format!(
        "{} {noun}{} ({:.1} MB on disk from {:.1} MB of {input}){timing}",
        r.shards,
        if r.shards == 1 { "" } else { "s" },
        r.disk_bytes as f64 / 1e6,
        r.text_bytes as f64 / 1e6
    )
}

/// What `prepare` says of HDF5 shards prepared into records.
fn prepared_records(args: &PrepareArgs, r: &trainbook_api::PreparedCorpus) -> Result<i32> {
    let index = trainbook_recipes::text::corpus::records::read_index(&r.dir)?;
    let m = &index.manifest;
    println!(
        "prepared {}: {} sequences of {} tokens (up to {} predictions each) as records of {}",
        r.dir.display(),
        r.texts,
        m.seq_len,
        m.max_pred,
        footprint(r, "HDF5 shard", "shards")
    );
    // Given the shards, a job finds the records in the cache only.
    let data = match &args.out {
        Some(_) => r.dir.display().to_string(),
        None => args.data.display().to_string(),
    };
    println!(
        "train on it: trainbook train bert-mlm --data {data} --max-length {} (with --tokenizer DIR when the shards' vocabulary is not the default uncased BERT one)",
        m.seq_len
    );
    if args.json {
        println!("{}", serde_json::to_string(r)?);
    }
    Ok(0)
}

/// `I/N`, or `auto`: the rank and the number of ranks from Slurm or a torchrun-style launcher.
fn parse_slice(text: &str) -> Result<(usize, usize)> {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let (index, count) = if text == "auto" {
        match (env("SLURM_PROCID"), env("SLURM_NTASKS"), env("RANK"), env("WORLD_SIZE")) {
            (Some(i), Some(n), _, _) | (_, _, Some(i), Some(n)) => (i, n),
            _ => anyhow::bail!(
                "--slice auto found no rank: run it under srun (SLURM_PROCID, SLURM_NTASKS) or set RANK and WORLD_SIZE, or give --slice I/N"
            ),
        }
    } else {
        let parsed = text
            .split_once('/')
            .and_then(|(i, n)| Some((i.trim().parse().ok()?, n.trim().parse().ok()?)));
        parsed.ok_or_else(|| {
            anyhow::anyhow!(
                "--slice {text}: write I/N, e.g. 0/4 for the first of 4 slices, or auto"
            )
        })?
    };
    if count == 0 || index >= count {
        anyhow::bail!("--slice {index}/{count}: I must be at least 0 and below N");
    }
    Ok((index, count))
}

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
    /// Rendezvous port on node 0 (default: a free port on one node; 29500 on several).
    #[arg(long, help_heading = "More than one machine")]
    pub master_port: Option<u16>,
    /// Machines in the job, each running this command with its own --node-rank (default: 1,
    /// or what srun, mpirun or torchrun set; see the README's "More than one machine").
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
    /// Seconds a collective (or joining the job) may wait for the other workers before the
    /// job fails with the name of the rank that did not answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub collective_timeout: u64,
    /// Parent directory of the run directory [env: TRAINBOOK_RUNS, default: ./trainbook_runs].
    #[arg(long)]
    pub runs_root: Option<PathBuf>,
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
    #[arg(long, value_name = "SECONDS", default_value_t = trainbook_api::plumbing::DEFAULT_HANG_TIMEOUT_SECS, help_heading = "When things fail")]
    pub hang_timeout: u64,
    /// Memory of each worker's device, e.g. 32GiB (first-generation Gaudi) or 96GB (Gaudi2):
    /// the memory plan checks the job against it instead of what this machine reports.
    #[arg(long, value_name = "SIZE", help_heading = "Memory")]
    pub device_memory: Option<String>,
    /// Launch even when the memory plan says the job does not fit its devices (the plan
    /// errs high).
    #[arg(long, help_heading = "Memory")]
    pub no_memory_check: bool,
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
    /// Print one JSON summary as the last line of stdout (human output goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// When the job succeeds, write its last checkpoint to DIR as transformers (full models:
    /// causal-lm, bert, bert-mlm, token-classification, question-answering) or peft (LoRA)
    /// load it (see `trainbook export`).
    #[arg(long, value_name = "DIR")]
    pub export: Option<PathBuf>,
    /// With --export: fold the LoRA adapter into the base weights and write a full model.
    #[arg(long, requires = "export")]
    pub merge: bool,
    #[command(
        flatten,
        next_help_heading = "Training (every recipe; default: the preset's)"
    )]
    pub train: TrainConfig,
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

fn parse_device(s: &str) -> Result<DeviceRequest, String> {
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

impl TrainArgs {
    pub fn to_spec(&self) -> Result<JobSpec> {
        let mut spec = JobSpec::new(&self.recipe)
            .workers(self.workers)
            .device(self.device);
        spec.train = self.train.clone();
        spec.edit_recipe_options(|o: &mut TextOptions| *o = self.text.clone());
        spec.edit_recipe_options(|o: &mut VisionOptions| *o = self.vision.clone());
        spec.edit_recipe_options(|o: &mut MlmOptions| *o = self.mlm.clone());
        spec.edit_recipe_options(|o: &mut QaOptions| *o = self.qa.clone());
        spec.edit_recipe_options(|o: &mut LmOptions| *o = self.lm.clone());
        spec.threads_per_worker = self.threads;
        // A launcher's variables first; flags given by hand win over them.
        if let Some(t) = trainbook_api::Topology::from_env()? {
            spec = spec.topology(&t);
        }
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
        spec.collective_timeout_secs = self.collective_timeout;
        spec.runs_root = self.runs_root.clone();
        spec.run_name = self.name.clone();
        spec.resume = self.resume;
        spec.max_failures = self.max_failures;
        spec.hang_timeout_secs = self.hang_timeout;
        spec.dedup.enabled = !self.no_dedup;
        spec.tensorboard = !self.no_tensorboard;
        spec.mlflow = self.mlflow.clone();
        spec.device_memory = self.device_memory.clone();
        spec.memory_check = !self.no_memory_check;
        if !(self.dedup_window.is_finite() && self.dedup_window >= 0.0) {
            anyhow::bail!("--dedup-window must be a number of seconds >= 0");
        }
        spec.dedup.window = Duration::from_secs_f64(self.dedup_window);
        spec.view.log_level = self.log_level;
        Ok(spec)
    }
}

/// Runs the CLI; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Recipes => {
            for r in crate::recipes::REGISTRY.entries() {
                println!("{:<12} {}", r.name, r.description);
                for (p, about) in r.presets {
                    println!("  --preset {p:<10} {about}");
                }
            }
            0
        }
        Command::Tokenizer(TokenizerCommand::Train(args)) => train_tokenizer(&args),
        Command::Kernel { args } => kernel(&args),
        Command::Check { workers, device } => {
            let spec = JobSpec::new(crate::engine::CHECK)
                .workers(workers)
                .device(device);
            match crate::fit(spec) {
                Ok(r) => {
                    for l in job_logs(&r) {
                        println!("{l}");
                    }
                    println!("trainbook check: {workers} workers on {} passed", r.device);
                    0
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    1
                }
            }
        }
        Command::Sweep(args) => exit_code(sweep(&args), args.job.json),
        Command::Plan(args) => exit_code(plan(&args), args.json),
        Command::Train(args) => exit_code(train(&args), args.json),
        Command::Prepare(args) => exit_code(prepare(&args), args.json),
        Command::Generate(args) => exit_code(crate::lm::generate(&args), args.json),
        Command::Export(args) => exit_code(crate::lm::export(&args), false),
    }
}

/// A command's exit code; an error is printed (and, with `--json`, is the last stdout line)
/// and exits 2.
fn exit_code(result: Result<i32>, json: bool) -> i32 {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        if json {
            println!(
                "{}",
                serde_json::json!({"status": "error", "error": format!("{e:#}")})
            );
        }
        2
    })
}

/// `trainbook plan`: the memory plan on stdout (or as JSON); 3 when the job does not fit.
fn plan(args: &TrainArgs) -> Result<i32> {
    use trainbook_api::Train;
    let spec = args.to_spec()?;
    let plan = spec.plan()?;
    let Some(memory) = plan.memory else {
        anyhow::bail!(
            "recipe {} reports no model shapes, so it has no memory plan (bert, bert-mlm and synthetic have one)",
            args.recipe
        );
    };
    if args.json {
        println!("{}", serde_json::to_string(&memory)?);
    } else {
        print!("{memory}");
    }
    if spec.device == DeviceRequest::Auto && spec.device_memory.is_some() {
        eprintln!(
            "note: planned for {} workers, what --device auto picks on this machine; to plan for another machine's accelerators name them (--device hpu or --device cuda)",
            memory.device.name()
        );
    }
    Ok(if memory.fits() == Some(false) { 3 } else { 0 })
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
            .unwrap_or(trainbook_api::plumbing::DEFAULT_MASTER_PORT),
        if spec.node_rank > 0 {
            " (node 0 shows the whole job)"
        } else {
            ""
        }
    );
}

/// `--export` only for the recipes whose checkpoints it writes.
fn check_export(args: &TrainArgs) -> Result<()> {
    if args.export.is_some() && !EXPORTS.contains(&args.recipe.as_str()) {
        anyhow::bail!(
            "--export writes the checkpoints of {}; a {} run's checkpoints are read by trainbook (result.last_checkpoint)",
            EXPORTS.join(", "),
            args.recipe
        );
    }
    Ok(())
}

fn train(args: &TrainArgs) -> Result<i32> {
    check_export(args)?;
    let spec = args.to_spec()?;
    say_place(&spec);
    // Ctrl-C stops the workers cleanly instead of leaving them to their death signal. The
    // handler goes in before any thread exists, so no other thread receives the signal.
    let current: std::sync::Arc<std::sync::Mutex<(bool, Option<trainbook_api::Job>)>> =
        Default::default();
    let slot = current.clone();
    let _ = ctrlc_stop(move || {
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

/// The recipes whose checkpoints `--export` writes as Hugging Face directories.
const EXPORTS: [&str; 5] = [
    "causal-lm",
    "bert",
    "bert-mlm",
    "token-classification",
    "question-answering",
];

/// `--export DIR`: a succeeded job's last checkpoint, written where asked as transformers
/// (and, for LoRA, peft) load it.
fn export_after(args: &TrainArgs, summary: &trainbook_api::TrainResult) -> Result<()> {
    match (&args.export, summary.status, &summary.last_checkpoint) {
        (Some(out), JobStatus::Succeeded, Some(ckpt)) if args.recipe != "causal-lm" => {
            let what = crate::recipes::checkpoint::export_encoder(ckpt, out)?;
            eprintln!("trainbook: exported {what}");
        }
        (Some(out), JobStatus::Succeeded, Some(ckpt)) => {
            let what = crate::recipes::causal_lm::inference::export(ckpt, out, args.merge)?;
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

fn sweep(args: &SweepArgs) -> Result<i32> {
    use crate::sweep_view::SweepDashboard;
    use trainbook_api::{SweepStatus, SweepUpdate};
    let sweep = args.to_sweep()?;
    let stop_requested = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop_requested.clone();
    // Ctrl-C: no new trials, running ones stopped (the handler goes in before any thread).
    let _ = ctrlc_stop(move || {
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

fn job_logs(r: &trainbook_api::TrainResult) -> Vec<String> {
    std::fs::read_to_string(r.run_dir.join("logs").join("rank0.log"))
        .map(|s| s.lines().map(String::from).collect())
        .unwrap_or_default()
}

/// Installs a SIGINT/SIGTERM handler that runs `f` once (on a helper thread).
fn ctrlc_stop(f: impl FnOnce() + Send + 'static) -> Result<()> {
    use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    // Block the signals in this thread (and threads spawned later); a helper waits for them.
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    std::thread::Builder::new()
        .name("trainbook-signals".into())
        .spawn(move || {
            if set.wait().is_ok() {
                eprintln!("trainbook: stopping workers…");
                f();
            }
        })?;
    Ok(())
}

/// Hands `trainbook kernel ...` to the `trainbook-kernel` program, which sits next to this one.
/// The kernel is its own binary because it carries the Rust compiler front end (evcxr) and must
/// not link trainbook itself (cells load trainbook as a shared library).
fn kernel(args: &[std::ffi::OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    const NAME: &str = "trainbook-kernel";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok())
        .and_then(|e| e.parent().map(|d| d.join(NAME)))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from(NAME));
    let err = std::process::Command::new(&program).args(args).exec();
    eprintln!(
        "error: cannot run {}: {err}; build it with `make build` (it is built next to `trainbook`)",
        program.display()
    );
    1
}
