//! trainbook: data-parallel training from notebooks and the command line.
//!
//! This crate is what programs and the CLI use, and what the kernel's trainbook_torch library is built
//! from. It puts together four layers whose dependencies run one way: `trainbook-api` (the
//! notebook-facing types and builders, nothing heavy; notebook cells compile against it
//! alone), `trainbook-engine` (jobs, workers, collectives, the training loop; no UI, no
//! concrete recipe), `trainbook-recipes` (BERT, ResNet, synthetic and their data), and here
//! the runtime that answers the API's operations (the engine with the recipes injected and the
//! notebook view subscribed), the CLI and the notebook view.

/// The `trainbook` command line: one module per command (the `trainbook` binary's entry point).
pub mod commands;
/// Your own model and training step ([`custom::Task`]), trained like the built-in recipes.
pub mod custom;
pub use custom::worker_hook;
/// The dashboard model shared by the notebook view and the terminal.
pub mod dashboard;
mod display;
/// The causal-LM commands (`trainbook generate`, `trainbook export`).
pub mod lm;
/// The notebook view: how a job's dashboard reaches the trainbook kernel's cells.
pub mod notebook;
/// The runtime behind `trainbook_api`'s operations in this process.
pub mod run;
/// A sweep's live view (table, plot, logs) in the notebook and the terminal.
pub mod sweep_view;

/// polars for notebook cells: `result.history_df()?` and the other `*_df()` methods, the
/// `DataFrame` type, the comparison and aggregation traits a filter and a mean need (`df.filter(&df.column("name")?
/// .str()?.equal("loss"))?`) and the `polars` crate itself (`polars::prelude::*`; not glob-
/// imported here, since its `Column` would clash with trainbook's). The kernel imports
/// this (`use trainbook_torch::frames::*;`) for the first cell that uses polars; programs
/// `use trainbook::frames::*;`.
pub mod frames;

/// The engine beneath: `launch` and the driver's other entry points, the `Recipe` contract and
/// registry type, users' tasks, the worker's entry point, the checkpoint files. For code that
/// extends trainbook; notebooks need only the prelude.
pub use trainbook_engine as engine;
/// The recipes beneath: BERT, ResNet and synthetic, their models and data, the classifier
/// models and `REGISTRY`. For code that extends trainbook; notebooks need only the prelude.
pub use trainbook_recipes as recipes;

/// The notebook-facing layer (`trainbook_api`), every item at the top level, and the
/// [`prelude`] that notebooks and scripts import (`use trainbook::prelude::*;`).
pub use trainbook_api::*;
