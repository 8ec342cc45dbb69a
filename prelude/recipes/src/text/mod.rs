//! Text: tokenizers (and their training), text-classification datasets, masked-LM blocks.

pub mod cache;
pub mod dataset;
pub mod mlm;
pub mod tokenizer;
pub mod wordpiece;
