//! trainbook end to end: real worker processes, collectives, the CLI, the notebook view and
//! checkpoints, in one test binary (each test binary links libtorch and polars again, so one
//! binary instead of thirteen saves minutes of build time). `cargo test --test e2e restart::`
//! runs one file of it.

mod common;

mod bert_mlm;
mod bert_parity;
mod bert_recipe;
mod causal_lm;
mod cli;
mod dashboard;
mod encoder_parity;
mod encoder_recipes;
mod engine;
mod example_digits;
mod multinode;
mod notebook;
mod prepare;
mod profile;
mod question_answering;
mod resnet_recipe;
mod restart;
mod sweep;
mod token_classification;
mod zero;
