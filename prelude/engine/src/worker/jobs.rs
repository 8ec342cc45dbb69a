//! What a job runs, resolved: its [`JobKind`] (a field of the spec) and, for a recipe, the
//! registry's entry ([`Work`]), and the job's resolved hyper-parameters. The driver and the
//! worker both decide by [`Work`].

use anyhow::{bail, Result};
use trainbook_api::{Hyper, JobKind, JobSpec};

use crate::worker::recipe::{RecipeEntry, Registry};
use crate::worker::task;

/// What a job runs: a recipe of the registry, a user's task, or one of the engine's own jobs.
/// The driver and the worker both decide by it, so a spec cannot mean one thing to one side
/// and another to the other.
#[derive(Clone, Copy)]
pub enum Work {
    Recipe(&'static RecipeEntry),
    /// A user's [`Task`](crate::worker::task::Task), run from the user's own code.
    Task,
    /// `trainbook check`: the collectives verified, nothing trained.
    Check,
    /// The allreduce benchmark.
    BenchAllreduce,
}

impl Registry {
    /// What `spec` runs; for a recipe, the registry's entry, or an error that lists the
    /// recipes there are.
    pub fn work(&self, spec: &JobSpec) -> Result<Work> {
        match spec.kind {
            JobKind::Check => return Ok(Work::Check),
            JobKind::BenchAllreduce => return Ok(Work::BenchAllreduce),
            JobKind::Task => return Ok(Work::Task),
            JobKind::Recipe => {}
        }
        let name = spec.recipe.as_str();
        if let Some(e) = self.get(name) {
            return Ok(Work::Recipe(e));
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
        let hyper = match self.work(spec)? {
            Work::Recipe(e) => (e.preset)(spec)?,
            Work::Task => task::preset(spec)?,
            Work::Check | Work::BenchAllreduce => return Ok(None),
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
        assert!(r.work(&JobSpec::new("toy")).map(|_| ()).is_ok());
        let check = JobSpec::of_kind(JobKind::Check);
        assert!(matches!(r.work(&check), Ok(Work::Check)));
        // A recipe named like one of the engine's own jobs is a recipe, looked up.
        assert!(r.work(&JobSpec::new("check")).is_err());
        let e = r
            .work(&JobSpec::new("tpy"))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown recipe 'tpy'") && e.contains("toy"),
            "{e}"
        );
        assert!(r.check_preset("toy", "big").is_ok());
        let e = r.check_preset("toy", "huge").unwrap_err().to_string();
        assert_eq!(e, "unknown preset 'huge' for recipe toy: use small, big");
        // The engine's own jobs have no presets.
        assert!(r.check_preset("check", "anything").is_ok());
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
        assert!(r
            .resolve(&JobSpec::of_kind(JobKind::Check))
            .unwrap()
            .is_none());
        assert!(r.resolve(&JobSpec::new("tpy")).is_err());
    }
}
