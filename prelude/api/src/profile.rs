//! The step profiler's settings and what it found: `--profile 20..25` / `.profile(20..25)`
//! records those optimizer steps on every rank with libtorch's own profiler (Kineto, as
//! `torch.profiler` does), writes a Chrome trace per rank into the run directory
//! (`profile/rank<R>.pt.trace.json`: Perfetto, chrome://tracing and TensorBoard's PyTorch
//! profiler plugin read it), and sums rank 0's operators into a top-ops table.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The optimizer steps to record: `start..end` (step numbers count from 0, `end` excluded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileSteps {
    pub start: u64,
    pub end: u64,
}

impl ProfileSteps {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<std::ops::Range<u64>> for ProfileSteps {
    fn from(r: std::ops::Range<u64>) -> Self {
        ProfileSteps {
            start: r.start,
            end: r.end,
        }
    }
}

impl std::fmt::Display for ProfileSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

impl std::str::FromStr for ProfileSteps {
    type Err = anyhow::Error;
    /// `20..25` (steps 20 to 24), `20..=24` (the same), or `N` (N steps after 5 of warm-up).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            anyhow::anyhow!(
                "profile steps '{s}': write START..END (e.g. 20..25, the end excluded) or a number of steps after 5 of warm-up"
            )
        };
        let num = |t: &str| t.trim().parse::<u64>().map_err(|_| bad());
        let steps = if let Some((a, b)) = s.split_once("..=") {
            ProfileSteps {
                start: num(a)?,
                end: num(b)? + 1,
            }
        } else if let Some((a, b)) = s.split_once("..") {
            ProfileSteps {
                start: num(a)?,
                end: num(b)?,
            }
        } else {
            let n = num(s)?;
            ProfileSteps {
                start: 5,
                end: 5 + n,
            }
        };
        if steps.is_empty() {
            bail!(
                "profile steps {steps} record no step: the end must be after the start (e.g. 20..25)"
            );
        }
        Ok(steps)
    }
}

/// One operator's share of the recorded steps (rank 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpTime {
    pub name: String,
    /// Time in the operator itself, its own child operators' time taken out (milliseconds,
    /// all recorded steps).
    pub self_ms: f64,
    pub calls: u64,
    /// `self_ms` over the recorded steps' wall time.
    pub share: f64,
}

/// What the profiler recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepProfile {
    pub steps: ProfileSteps,
    /// The Chrome traces written, one per rank of this node.
    pub traces: Vec<PathBuf>,
    /// Mean wall time of a recorded step on rank 0 (milliseconds).
    pub step_ms: f64,
    /// The share of the steps' wall time spent inside a recorded operator (the rest is the
    /// host between operators: data, Python-free glue, waiting).
    pub covered: f64,
    /// The operators with the most self time, most first.
    pub ops: Vec<OpTime>,
    /// Device kernels (CUDA), by self time, when the device records them.
    #[serde(default)]
    pub kernels: Vec<OpTime>,
    /// The share of the steps' wall time in which the device ran a kernel or a copy (where it
    /// records them: CUDA). Below 1, the device waited for the host: for data, for the host
    /// queuing work, or at a synchronisation.
    #[serde(default)]
    pub device_busy: Option<f64>,
}

impl StepProfile {
    /// The top-ops table as text (the terminal's and the notebook's text twin).
    pub fn table(&self, rows: usize) -> String {
        let mut out = format!(
            "profiled steps {} on rank 0: {:.2} ms a step, {:.0}% of it inside operators{}\n",
            self.steps,
            self.step_ms,
            100.0 * self.covered,
            self.device_busy
                .map(|b| format!(", the device busy {:.0}% of it", 100.0 * b))
                .unwrap_or_default()
        );
        let mut section = |title: &str, ops: &[OpTime]| {
            if ops.is_empty() {
                return;
            }
            let width = ops
                .iter()
                .take(rows)
                .map(|o| o.name.len().min(48))
                .max()
                .unwrap_or(4)
                .max(title.len());
            out.push_str(&format!(
                "{title:<width$}  {:>10}  {:>7}  {:>6}\n",
                "self ms", "calls", "% step"
            ));
            for o in ops.iter().take(rows) {
                let name: String = o.name.chars().take(48).collect();
                out.push_str(&format!(
                    "{name:<width$}  {:>10.3}  {:>7}  {:>5.1}%\n",
                    o.self_ms,
                    o.calls,
                    100.0 * o.share
                ));
            }
        };
        section("operator", &self.ops);
        section("kernel", &self.kernels);
        for t in &self.traces {
            out.push_str(&format!("trace: {}\n", t.display()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_as_ranges_or_a_count_and_empty_ones_name_the_fix() {
        let p = |s: &str| s.parse::<ProfileSteps>();
        assert_eq!(p("20..25").unwrap(), ProfileSteps { start: 20, end: 25 });
        assert_eq!(p("20..=24").unwrap(), ProfileSteps { start: 20, end: 25 });
        assert_eq!(p("3").unwrap(), ProfileSteps { start: 5, end: 8 });
        assert_eq!(ProfileSteps::from(2..4).to_string(), "2..4");
        let e = p("25..20").unwrap_err().to_string();
        assert!(e.contains("end must be after the start"), "{e}");
        let e = p("a..b").unwrap_err().to_string();
        assert!(e.contains("START..END"), "{e}");
    }
}
