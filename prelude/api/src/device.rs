//! The devices a job can ask for and run on, and the collective backend that goes with each.
//! Which device `auto` becomes is the engine's decision (it probes the machine).

use std::str::FromStr;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// What the user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRequest {
    /// HPU if the Gaudi stack is present, else CUDA if available, else CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
    Hpu,
}

impl DeviceRequest {
    /// The device kind a request names (`None` for `Auto`, which the machine decides).
    pub fn kind(self) -> Option<DeviceKind> {
        match self {
            DeviceRequest::Auto => None,
            DeviceRequest::Cpu => Some(DeviceKind::Cpu),
            DeviceRequest::Cuda => Some(DeviceKind::Cuda),
            DeviceRequest::Hpu => Some(DeviceKind::Hpu),
        }
    }
}

impl FromStr for DeviceRequest {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "cpu" => Self::Cpu,
            "cuda" | "gpu" => Self::Cuda,
            "hpu" | "gaudi" => Self::Hpu,
            other => bail!("unknown device '{other}': use auto, cpu, cuda or hpu"),
        })
    }
}

/// The device kind a job runs on, after resolving `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Hpu,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Hpu => "hpu",
        }
    }

    pub fn backend(self) -> Backend {
        match self {
            DeviceKind::Cpu => Backend::Gloo,
            DeviceKind::Cuda => Backend::Nccl,
            DeviceKind::Hpu => Backend::Hccl,
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which c10d backend carries the model's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Gloo,
    Nccl,
    Hccl,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
            Backend::Hccl => "hccl",
        }
    }
}
