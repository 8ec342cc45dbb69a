//! Text: tokenizers and text-classification datasets.

pub mod dataset;
pub mod tokenizer;
