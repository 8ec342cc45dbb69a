//! `trainbook prepare`: a pre-training corpus tokenised once into token shards, or HDF5
//! pre-training shards converted into memory-mapped records.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

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

pub(super) fn run(args: &PrepareArgs) -> Result<i32> {
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
