//! What reading one pre-training sequence costs, three ways: a memory-mapped record of
//! `trainbook prepare` (its checksum checked), a 128-token block of the prepared token corpus
//! (before its masking) and a sequence of 002's HDF5 shards. Runs on the work directory that
//! `bench/hdf5_records.py --keep DIR` leaves:
//!
//! ```text
//! HDF5_BENCH_DIR=DIR cargo bench -p trainbook-recipes --bench hdf5_read
//! ```
//!
//! 20,000 reads in a fixed scattered order (200 for the shards, whose reads decompress); the
//! first read of each source (opening, checks) is before the clock. Results: docs/benchmarks.md.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use trainbook_recipes::text::corpus::records::Hdf5Records;
use trainbook_recipes::text::corpus::{PreparedCorpus, Split};
use trainbook_recipes::text::hdf5_shards::Hdf5Shards;

/// BERT's uncased vocabulary, which the shards' ids index.
const VOCAB: i64 = 30522;

/// Microseconds per call of `read` over `reads`, after one read outside the clock.
fn each(reads: &[usize], read: &dyn Fn(usize) -> Result<()>) -> Result<f64> {
    read(reads[0])?;
    let t = Instant::now();
    for &i in reads {
        read(i)?;
    }
    Ok(t.elapsed().as_secs_f64() / reads.len() as f64 * 1e6)
}

fn main() -> Result<()> {
    let dir =
        PathBuf::from(std::env::var("HDF5_BENCH_DIR").context(
            "set HDF5_BENCH_DIR to the directory `bench/hdf5_records.py --keep DIR` left",
        )?);
    let records = Hdf5Records::open(&dir.join("records"))?;
    let tokens = PreparedCorpus::open(&dir.join("tokens"))?;
    let stream = tokens.stream(Split::Train);
    let shards = Hdf5Shards::open(&dir.join("shards"))?;
    let n = records.rows.min(stream.blocks(128));
    anyhow::ensure!(n > 0, "{} holds no sequence", dir.display());
    let order: Vec<usize> = (0..20_000).map(|i| (i * 7919) % n).collect();
    let record = each(&order, &|i| {
        std::hint::black_box(records.get(i, VOCAB)?);
        Ok(())
    })?;
    let block = each(&order, &|i| {
        std::hint::black_box(stream.block(i, 128)?);
        Ok(())
    })?;
    let shard = each(&order[..200], &|i| {
        std::hint::black_box(shards.get(i, VOCAB)?);
        Ok(())
    })?;
    println!("per sequence: record {record:.2} us, token block {block:.2} us, shard {shard:.0} us");
    Ok(())
}
