//! What a training job is: recipe, workers, device and hyper-parameters (the types live in
//! `trainbook-api`, which notebook cells compile against), and the checks the engine makes
//! before any process starts. A spec is serialised as the run directory's `config.json`, which
//! is also how workers receive it.

use anyhow::{Context, Result};

pub use trainbook_api::spec::*;

/// Checks what can be checked before any process starts: the spec's own ranges
/// ([`JobSpec::check`]), recipe and preset names against `recipes`, and that a checkpoint to
/// resume from is readable.
pub fn validate(spec: &JobSpec, recipes: &crate::recipe::Registry) -> Result<()> {
    spec.check()?;
    recipes.check_name(&spec.recipe)?;
    if let Some(p) = &spec.train.preset {
        recipes.check_preset(&spec.recipe, p)?;
    }
    if let Some(r) = &spec.train.resume_from {
        crate::checkpoint::TrainerState::read(r)
            .with_context(|| format!("cannot resume from {}", r.display()))?;
    }
    Ok(())
}
