//! Text: tokenizers (and their training), text-classification datasets, masked-LM blocks,
//! prepared pre-training corpora.

pub mod cache;
pub mod chat;
pub mod corpus;
pub mod dataset;
pub mod hdf5_shards;
pub mod mlm;
pub mod mlm_source;
pub mod tokenizer;
pub mod wordpiece;
