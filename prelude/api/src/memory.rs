//! Memory planned before launch: what each device will hold for a job (parameters, gradients,
//! optimizer state, communication buffers, activations, the framework's own), against what the
//! device has, and which levers make a job fit that does not.
//!
//! Finding out by an out-of-memory error after a 128-card allocation has started is the
//! expensive way; the plan is arithmetic on the model's shapes and the job's options, so it
//! runs in milliseconds on any machine, for any device (`device_memory` plans for a machine you
//! are not on). [`MemoryPlan`] is what `Train::plan` returns in [`crate::run::Plan::memory`],
//! what `trainbook plan` prints, and what a job checks before its workers start.

use std::fmt;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::device::DeviceKind;
use crate::table::{Column, Table};

/// What a recipe knows of its model's memory for one job: the trainable tensors (element
/// counts) and the activations of one micro-batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Footprint {
    /// The model in a few words (e.g. "BERT, 48 layers, hidden 1600, 25 heads, vocabulary 30522").
    pub model: String,
    /// Element counts of the trainable tensors, in name order (the order workers bucket them).
    pub trainable: Vec<u64>,
    /// Elements of trainable tensors that bf16 autocast copies into bf16 for the forward pass
    /// (the weights of matrix multiplies), kept until the backward pass has used them.
    pub cast_by_autocast: u64,
    /// Bytes of variables that are not trained (batch-norm statistics, ...).
    pub frozen_bytes: u64,
    /// Bytes of activations one micro-batch keeps at its peak (saved for the backward pass,
    /// plus the backward pass's own working set), by part.
    pub activations: Vec<(String, u64)>,
    /// Each layer's name and the bytes of its parameters, whole (trained ones in fp32, frozen ones as held):
    /// ZeRO-3's units, gathered one or two at a time. Empty when unknown: then the plan counts
    /// the whole model as one unit.
    pub units: Vec<(String, u64)>,
}

impl Footprint {
    /// Trainable parameters.
    pub fn parameters(&self) -> u64 {
        self.trainable.iter().sum()
    }
}

/// One line of a plan: what takes the memory, how much, and why that much.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryRow {
    pub what: String,
    pub bytes: u64,
    pub detail: String,
}

/// How much memory a device has, and where that figure comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    pub bytes: u64,
    /// e.g. "--device-memory", "nvidia-smi", "MemAvailable / 2 workers".
    pub source: String,
}

/// One change that lowers the peak, and the plan's total with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lever {
    /// The option to set, as a flag (e.g. "--zero 1", "--activation-checkpointing").
    pub change: String,
    pub total: u64,
    /// Whether the job fits with it (`None` without a known capacity).
    pub fits: Option<bool>,
}

/// The memory one device (each worker's) is planned to hold at the job's peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub recipe: String,
    pub device: DeviceKind,
    pub workers: usize,
    pub model: String,
    /// Trainable parameters.
    pub parameters: u64,
    /// Samples per forward pass on a device, and micro-batches per step.
    pub batch_per_device: usize,
    pub grad_accum: usize,
    /// The options that shape the plan, as flags (e.g. "adamw, ZeRO-1, bf16").
    pub setup: String,
    pub rows: Vec<MemoryRow>,
    /// Sum of the rows: the planned peak per device.
    pub total: u64,
    /// What rank 0 holds beyond `total` while it writes a checkpoint, and why (0 when nothing:
    /// on CPU under ZeRO, the optimizer state gathered from the shards).
    #[serde(default)]
    pub rank0_extra: u64,
    #[serde(default)]
    pub rank0_detail: String,
    pub capacity: Option<Capacity>,
    /// Levers not in use and what each would bring the total to (the job's own options plus
    /// that one; the last one all of them).
    pub levers: Vec<Lever>,
}

impl MemoryPlan {
    /// Whether the planned peak fits the device (`None` when its memory is unknown).
    pub fn fits(&self) -> Option<bool> {
        self.capacity.as_ref().map(|c| self.peak() <= c.bytes)
    }

    /// The highest planned peak of any worker: rank 0's when it writes a checkpoint.
    pub fn peak(&self) -> u64 {
        self.total + self.rank0_extra
    }

    /// The bytes of one row by its name (`parameters`, `gradients`, ...).
    pub fn bytes_of(&self, what: &str) -> Option<u64> {
        self.rows.iter().find(|r| r.what == what).map(|r| r.bytes)
    }

    /// One row per part: what, GiB, detail; then the total and the device's capacity.
    pub fn table(&self) -> Table {
        let mut what: Vec<String> = self.rows.iter().map(|r| r.what.clone()).collect();
        let mut bytes: Vec<u64> = self.rows.iter().map(|r| r.bytes).collect();
        let mut detail: Vec<String> = self.rows.iter().map(|r| r.detail.clone()).collect();
        if self.rank0_extra > 0 {
            what.push("rank 0 at checkpoints".into());
            bytes.push(self.rank0_extra);
            detail.push(self.rank0_detail.clone());
        }
        what.push("total".into());
        bytes.push(self.peak());
        detail.push(self.verdict());
        Table::from_columns(vec![
            Column::str("what", what.into_iter().map(Some)),
            Column::float("gib", bytes.iter().map(|b| Some(gib(*b)))),
            Column::str("detail", detail.into_iter().map(Some)),
        ])
        .expect("plan columns have one value per row")
    }

    /// "fits: 21.3 of 32.0 GiB", "does not fit: ...", or "device memory unknown".
    pub fn verdict(&self) -> String {
        match &self.capacity {
            Some(c) if self.peak() <= c.bytes => format!(
                "fits: {:.2} of {:.2} GiB ({})",
                gib(self.peak()),
                gib(c.bytes),
                c.source
            ),
            Some(c) => format!(
                "does not fit: {:.2} GiB planned, the device has {:.2} GiB ({})",
                gib(self.peak()),
                gib(c.bytes),
                c.source
            ),
            None => "device memory unknown: give --device-memory (e.g. 32GiB)".into(),
        }
    }

    /// The error of a job that does not fit, with the levers that would make it fit.
    pub fn not_fitting_error(&self) -> String {
        let mut msg = format!(
            "{} on {} x {}: {}.\n{self}",
            self.recipe,
            self.workers,
            self.device.name(),
            self.verdict()
        );
        let fitting: Vec<&Lever> = self
            .levers
            .iter()
            .filter(|l| l.fits == Some(true))
            .collect();
        if fitting.is_empty() {
            msg.push_str("\nNo lever alone makes it fit: use more devices (ZeRO shards over them), a smaller model, or a device with more memory.");
        } else {
            msg.push_str("\nIt fits with: ");
            let list: Vec<String> = fitting
                .iter()
                .map(|l| format!("{} ({:.2} GiB)", l.change, gib(l.total)))
                .collect();
            msg.push_str(&list.join("; "));
            msg.push('.');
        }
        msg.push_str(
            "\nTo launch anyway (the plan errs high), pass --no-memory-check (.memory_check(false)).",
        );
        msg
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory plan per device: {} ({} parameters trained) on {} x {}, {} per device x {} micro-batch(es), {}",
            self.model,
            count(self.parameters),
            self.workers,
            self.device.name(),
            self.batch_per_device,
            self.grad_accum,
            self.setup
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "  {:<24} {:>9.2} GiB  {}",
                r.what,
                gib(r.bytes),
                r.detail
            )?;
        }
        if self.rank0_extra > 0 {
            writeln!(
                f,
                "  {:<24} {:>9.2} GiB  {}",
                "+ rank 0 at checkpoints",
                gib(self.rank0_extra),
                self.rank0_detail
            )?;
        }
        writeln!(
            f,
            "  {:<24} {:>9.2} GiB  {}",
            "total",
            gib(self.peak()),
            self.verdict()
        )?;
        if !self.levers.is_empty() {
            writeln!(f, "  levers:")?;
            for l in &self.levers {
                let mark = match l.fits {
                    Some(true) => "fits",
                    Some(false) => "does not fit",
                    None => "",
                };
                writeln!(f, "    {:<40} {:>9.2} GiB  {mark}", l.change, gib(l.total))?;
            }
        }
        Ok(())
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// 1.55B, 110M, 4.4M, 950.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 10_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// A size such as `32GiB`, `96GB`, `512MiB` or a number of bytes. GiB/MiB/KiB are powers of
/// 1024, GB/MB/KB powers of 1000; a device's "32 GB" of HBM is 32 GiB.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = match num.parse() {
        Ok(v) => v,
        Err(_) => bail!("'{text}' is not a memory size: write e.g. 32GiB, 96GB or 512MiB"),
    };
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024f64.powi(2),
        "mb" => 1e6,
        "g" | "gib" => 1024f64.powi(3),
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        u => bail!("unknown unit '{u}' in '{text}': use GiB, GB, MiB, MB, KiB or KB"),
    };
    let bytes = value * scale;
    if !(bytes.is_finite() && bytes >= 1.0) {
        bail!("memory size '{text}' must be at least one byte");
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("32GiB").unwrap(), 32 << 30);
        assert_eq!(parse_bytes("96GB").unwrap(), 96_000_000_000);
        assert_eq!(parse_bytes("1.5 gib").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        for bad in ["", "GiB", "32 parsecs", "0GiB", "-1GB"] {
            let e = parse_bytes(bad).unwrap_err().to_string();
            assert!(
                e.contains("32GiB") || e.contains("unit") || e.contains("at least"),
                "{bad}: {e}"
            );
        }
    }
}
