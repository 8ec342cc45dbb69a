//! The `trainbook` command line: the parser and the dispatch to each command's module. Each
//! module holds its command's arguments and what it does; `args` the options of a training
//! job that `train`, `plan` and `sweep` share.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod args;
mod check;
mod export;
mod generate;
mod kernel;
mod plan;
mod prepare;
mod recipes;
mod sweep;
mod tokenizer;
mod train;

pub use args::{ExportTo, FailureArgs, MemoryArgs, NodeArgs, OutputArgs, RecipeOptions, TrainArgs};
pub use check::CheckArgs;
pub use kernel::KernelArgs;
pub use prepare::PrepareArgs;
pub use sweep::SweepArgs;
pub use tokenizer::{TokenizerArgs, TokenizerCommand};

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
    Generate(Box<generate::GenerateArgs>),
    /// Write a causal-lm checkpoint as the directories transformers and peft load (a LoRA
    /// adapter, or with --merge a full model).
    Export(export::ExportArgs),
    /// List the available recipes.
    Recipes,
    /// Tokenizers: `trainbook tokenizer train --data corpus.txt --vocab-size 32000 --out DIR`.
    #[command(subcommand)]
    Tokenizer(TokenizerCommand),
    /// Verify allreduce, broadcast and barrier across N worker processes (no training).
    Check(CheckArgs),
    /// The Jupyter kernel: `trainbook kernel install [--user|--sys-prefix|--prefix P]`,
    /// `trainbook kernel check` (runs `trainbook-kernel`; see `trainbook kernel --help`).
    #[command(disable_help_flag = true)]
    Kernel(KernelArgs),
}

/// Runs the CLI; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Recipes => recipes::run(),
        Command::Tokenizer(TokenizerCommand::Train(args)) => tokenizer::train(&args),
        Command::Kernel(args) => kernel::run(&args.args),
        Command::Check(args) => check::run(&args),
        Command::Sweep(args) => exit_code(sweep::run(&args), args.job.json),
        Command::Plan(args) => exit_code(plan::run(&args), args.json),
        Command::Train(args) => exit_code(train::run(&args), args.json),
        Command::Prepare(args) => exit_code(prepare::run(&args), args.json),
        Command::Generate(args) => exit_code(generate::run(&args), args.json),
        Command::Export(args) => exit_code(export::run(&args), false),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_parser_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn train_flags_reach_their_groups() {
        let cli = Cli::try_parse_from([
            "trainbook",
            "train",
            "bert",
            "-n",
            "3",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--name",
            "r",
            "--max-failures",
            "-1",
            "--device-memory",
            "32GiB",
            "--no-dedup",
            "--export",
            "out",
            "--merge",
            "--json",
        ])
        .unwrap();
        let Command::Train(args) = cli.command else {
            panic!("not train: {:?}", cli.command)
        };
        assert_eq!((args.recipe.as_str(), args.workers), ("bert", 3));
        assert_eq!(args.nodes.node_rank, Some(1));
        assert_eq!(args.failures.name.as_deref(), Some("r"));
        assert_eq!(args.failures.max_failures, -1);
        assert_eq!(args.memory.device_memory.as_deref(), Some("32GiB"));
        assert!(args.output.no_dedup && args.json && args.export.merge);
        assert_eq!(args.export.dir, Some(std::path::PathBuf::from("out")));
    }

    #[test]
    fn merge_needs_export() {
        assert!(Cli::try_parse_from(["trainbook", "train", "bert", "--merge"]).is_err());
    }
}
