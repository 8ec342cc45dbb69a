//! Text: tokenizers and text-classification datasets.

pub mod cache;
pub mod dataset;
pub mod tokenizer;
pub mod wordpiece;
