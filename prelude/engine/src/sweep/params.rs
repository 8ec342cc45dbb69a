//! A sweep's parameters turned into trial jobs: random values drawn from the seed, each value
//! put where its option is declared (a shared training option, a recipe's own option, a
//! task's own field), and every trial checked as `fit` checks a job, so that a misspelt name
//! or a value of the wrong type fails before any trial starts.

use anyhow::{anyhow, bail, Context, Result};
use rand::{Rng, SeedableRng};
use trainbook_api::{plumbing::trials::trial_params, ParamValue, Space, SweepSpec, TrialPlan};
use trainbook_api::{JobSpec, TrainOptions};

use crate::worker::recipe::Registry;

/// One random value of `space` (grid spaces are not drawn).
fn draw(space: &Space, rng: &mut rand::rngs::StdRng) -> ParamValue {
    match space {
        Space::Grid(v) | Space::Choice(v) => v[rng.gen_range(0..v.len())].clone(),
        Space::Uniform { low, high } => ParamValue::Float(low + (high - low) * rng.gen::<f64>()),
        Space::LogUniform { low, high } => {
            let (a, b) = (low.ln(), high.ln());
            ParamValue::Float((a + (b - a) * rng.gen::<f64>()).exp())
        }
    }
}

/// Where an option of a job lives.
#[derive(Debug)]
enum Place {
    Training,
    Task,
    Recipe,
}

/// Puts `value` into the option `name` of `spec`.
fn apply(spec: &mut JobSpec, name: &str, value: &ParamValue) -> Result<Place> {
    let shown = || format!("sweep parameter {name}={value}");
    if trainbook_api::plumbing::settings::option_names::<TrainOptions>()
        .iter()
        .any(|n| n == name)
    {
        let mut train = serde_json::to_value(&spec.train)?;
        train[name] = value.to_json();
        spec.train = serde_json::from_value(train).map_err(|e| {
            anyhow!(
                "{}: {e}; give {name} values of its type (`trainbook train --help` lists it)",
                shown()
            )
        })?;
        return Ok(Place::Training);
    }
    if let Some(fields) = crate::worker::task::task_fields(spec) {
        if let Some(old) = fields.get(name) {
            let kind = |v: &serde_json::Value| match v {
                serde_json::Value::Number(n) if n.is_f64() => "number",
                serde_json::Value::Number(_) => "whole number",
                serde_json::Value::String(_) => "text",
                serde_json::Value::Bool(_) => "true/false",
                _ => "structured value",
            };
            let new = value.to_json();
            let fits =
                kind(old) == kind(&new) || (kind(old) == "number" && kind(&new) == "whole number");
            if !fits {
                bail!(
                    "{}: the task's field '{name}' is a {} ({old}), not a {}: give it values of that kind",
                    shown(),
                    kind(old),
                    kind(&new)
                );
            }
            fields.insert(name.to_string(), new);
            return Ok(Place::Task);
        }
    }
    spec.options.insert(name.to_string(), value.to_json());
    Ok(Place::Recipe)
}

/// Every trial of `sweep`, its parameters applied to the base job, each one checked as `fit`
/// checks a job (names, types, ranges, presets). Nothing starts.
pub(crate) fn plan(sweep: &SweepSpec, recipes: &Registry) -> Result<Vec<TrialPlan>> {
    sweep.check()?;
    let base = &sweep.base;
    if base.nodes > 1 {
        bail!("a sweep runs its trials on this machine: use a job of one node (several nodes are not supported for sweeps)");
    }
    if base.master_port.is_some() {
        bail!("a sweep's trials each pick a free rendezvous port: leave master_port unset");
    }
    if base.run_name.is_some() {
        bail!("a sweep names its trials' run directories (trial-1, trial-2, ...): name the sweep instead (.name(\"...\") on the Sweep, --name)");
    }
    crate::driver::validate(base, recipes).context("the sweep's job")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(sweep.seed);
    let params = trial_params(sweep, |space| draw(space, &mut rng));
    let mut known: Option<Vec<String>> = None;
    params
        .into_iter()
        .enumerate()
        .map(|(i, params)| {
            let mut spec = base.clone();
            for (name, value) in &params {
                if let Place::Recipe = apply(&mut spec, name, value)? {
                    // Checked here, with every option the job has: the recipe's own check
                    // would list only the recipe's.
                    let names = known.get_or_insert_with(|| recipe_option_names(base, recipes));
                    if !names.contains(name) {
                        bail!(
                            "sweep parameter {name}={value}: job '{}' has no option '{name}'. {}",
                            base.recipe,
                            option_names(base, recipes)
                        );
                    }
                }
            }
            let id = i + 1;
            let context = || format!("trial {id} ({})", params_text(&params));
            crate::driver::validate(&spec, recipes).with_context(context)?;
            recipes.resolve(&spec).with_context(context)?;
            Ok(TrialPlan { id, params, spec })
        })
        .collect()
}

/// The options a sweep of `spec` can set, for an error about one it cannot: the job's own
/// first (a task's fields, a recipe's options), then the shared training options.
fn option_names(spec: &JobSpec, recipes: &Registry) -> String {
    let mut spec = spec.clone();
    let (whose, mut own): (&str, Vec<String>) = match crate::worker::task::task_fields(&mut spec) {
        Some(fields) => ("The task's fields", fields.keys().cloned().collect()),
        None => ("The recipe's options", recipe_option_names(&spec, recipes)),
    };
    own.sort();
    let training = trainbook_api::plumbing::settings::option_names::<TrainOptions>().join(", ");
    if own.is_empty() {
        format!("The training options: {training}")
    } else {
        format!(
            "{whose}: {}; the training options: {training}",
            own.join(", ")
        )
    }
}

/// The recipe's own options (what the recipe resolved), by name.
fn recipe_option_names(spec: &JobSpec, recipes: &Registry) -> Vec<String> {
    match recipes.resolve(spec) {
        Ok(Some(h)) => h.recipe_options.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

fn params_text(params: &[(String, ParamValue)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::{ConfigureTraining, OptimizerKind};

    #[test]
    fn training_options_are_set_typed_and_recipe_options_by_name() {
        let mut spec = JobSpec::new("bert").lr(1.0);
        assert!(matches!(
            apply(&mut spec, "lr", &ParamValue::Float(3e-4)).unwrap(),
            Place::Training
        ));
        assert_eq!(spec.train.lr, Some(3e-4));
        apply(&mut spec, "optimizer", &"adamw".into()).unwrap();
        assert_eq!(spec.train.optimizer, Some(OptimizerKind::Adamw));
        apply(&mut spec, "epochs", &ParamValue::Int(3)).unwrap();
        assert_eq!(spec.train.epochs, Some(3));
        let e = apply(&mut spec, "epochs", &ParamValue::Float(2.5)).unwrap_err();
        assert!(e.to_string().contains("sweep parameter epochs=2.5"), "{e}");
        let e = apply(&mut spec, "optimizer", &"adam".into()).unwrap_err();
        assert!(e.to_string().contains("unknown variant `adam`"), "{e}");
        assert!(matches!(
            apply(&mut spec, "max_length", &ParamValue::Int(64)).unwrap(),
            Place::Recipe
        ));
        assert_eq!(spec.options["max_length"], 64);
    }

    #[test]
    fn draws_are_in_their_space_and_follow_the_seed() {
        let mut a = rand::rngs::StdRng::seed_from_u64(7);
        let mut b = rand::rngs::StdRng::seed_from_u64(7);
        let space = Space::LogUniform {
            low: 1e-5,
            high: 1e-2,
        };
        for _ in 0..100 {
            let x = draw(&space, &mut a);
            assert_eq!(x, draw(&space, &mut b));
            let v = x.as_f64().unwrap();
            assert!((1e-5..1e-2).contains(&v), "{v}");
        }
        let choice = Space::Choice(vec!["sgd".into(), "adamw".into()]);
        let seen: std::collections::BTreeSet<String> =
            (0..50).map(|_| draw(&choice, &mut a).to_string()).collect();
        assert_eq!(seen.len(), 2);
    }
}
