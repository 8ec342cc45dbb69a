//! What a job's recipe name stands for: a recipe of the injected [`Registry`], a user's task,
//! or one of the engine's own jobs ([`CHECK`], [`BENCH_ALLREDUCE`]), and the job's resolved
//! hyper-parameters. The driver and the worker both decide by [`JobKind`].

use anyhow::{bail, Result};
use trainbook_api::{Hyper, JobSpec};

use crate::worker::recipe::{RecipeEntry, Registry};
use crate::worker::task::{self, TASK};

/// The job name of `trainbook check`: workers verify the collectives instead of training.
pub const CHECK: &str = "check";
/// The job name of the allreduce benchmark (see `benches/engine.rs`).
pub(crate) const BENCH_ALLREDUCE: &str = "bench-allreduce";

/// What a job's recipe name stands for: a recipe of the registry, or one of the engine's own
/// jobs. The driver and the worker both decide by it, so a name cannot mean one thing to one
/// side and another to the other.
#[derive(Clone, Copy)]
pub enum JobKind {
    Recipe(&'static RecipeEntry),
    /// A user's [`Task`](crate::worker::task::Task), run from the user's own code.
    Task,
    /// `trainbook check`: the collectives verified, nothing trained.
    Check,
    /// The allreduce benchmark.
    BenchAllreduce,
}

impl Registry {
    /// What `name` stands for, or an error that lists the recipes there are.
    pub fn job_kind(&self, name: &str) -> Result<JobKind> {
        match name {
            CHECK => return Ok(JobKind::Check),
            BENCH_ALLREDUCE => return Ok(JobKind::BenchAllreduce),
            TASK => return Ok(JobKind::Task),
            _ => {}
        }
        if let Some(e) = self.get(name) {
            return Ok(JobKind::Recipe(e));
        }
        let known: Vec<&str> = self.entries().iter().map(|e| e.name).collect();
        bail!(
            "unknown recipe '{name}': available recipes are {}",
            known.join(", ")
        )
    }

    /// The job's hyper-parameters, fully resolved: the recipe's preset (see [`PresetFn`](crate::worker::recipe::PresetFn))
    /// with the job's shared options on top. `None` for the engine's own jobs, which train
    /// nothing.
    pub fn resolve(&self, spec: &JobSpec) -> Result<Option<Hyper>> {
        let hyper = match self.job_kind(&spec.recipe)? {
            JobKind::Recipe(e) => (e.preset)(spec)?,
            JobKind::Task => task::preset(spec)?,
            JobKind::Check | JobKind::BenchAllreduce => return Ok(None),
        };
        Ok(Some(hyper.with_overrides(&spec.train)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::device::Device;
    use crate::worker::recipe::Recipe;

    fn none(_: &Hyper, _: Device, _: &dyn Fn(String)) -> Result<Box<dyn Recipe>> {
        bail!("not built in this test")
    }

    fn small(spec: &JobSpec) -> Result<Hyper> {
        let name = spec.train.preset.as_deref().unwrap_or("small");
        Ok(Hyper::new(
            name,
            3,
            8,
            0.1,
            trainbook_api::OptimizerKind::Sgd,
        ))
    }

    static ENTRIES: &[RecipeEntry] = &[RecipeEntry {
        name: "toy",
        description: "a recipe of this test",
        presets: &[("small", "a preset"), ("big", "another")],
        preset: small,
        build: none,
        footprint: None,
    }];
    #[test]
    fn names_and_presets_are_checked_against_the_injected_table() {
        let r = Registry::new(ENTRIES);
        assert!(r.job_kind("toy").map(|_| ()).is_ok());
        assert!(r.job_kind(CHECK).map(|_| ()).is_ok());
        let e = r.job_kind("tpy").map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("unknown recipe 'tpy'") && e.contains("toy"),
            "{e}"
        );
        assert!(r.check_preset("toy", "big").is_ok());
        let e = r.check_preset("toy", "huge").unwrap_err().to_string();
        assert_eq!(e, "unknown preset 'huge' for recipe toy: use small, big");
        // The engine's own jobs have no presets.
        assert!(r.check_preset(CHECK, "anything").is_ok());
    }

    #[test]
    fn resolving_puts_the_jobs_options_over_the_preset() {
        use trainbook_api::ConfigureTraining;
        let r = Registry::new(ENTRIES);
        let h = r
            .resolve(&JobSpec::new("toy").lr(0.5).max_steps(7))
            .unwrap()
            .unwrap();
        assert_eq!((h.preset.as_str(), h.epochs, h.lr), ("small", 3, 0.5));
        assert_eq!(h.max_steps, Some(7));
        assert!(r.resolve(&JobSpec::new(CHECK)).unwrap().is_none());
        assert!(r.resolve(&JobSpec::new("tpy")).is_err());
    }
}
