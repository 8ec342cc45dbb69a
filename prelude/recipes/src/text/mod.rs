//! Text: tokenizers (and their training), text-classification datasets, masked-LM blocks,
//! prepared pre-training corpora, and the scores of token classification (entities) and
//! extractive question answering (answers).

pub mod answers;
pub mod cache;
pub mod chat;
pub mod corpus;
pub mod dataset;
pub mod entities;
pub(crate) mod files;
pub mod hdf5_shards;
pub mod mlm;
pub mod mlm_source;
pub mod squad;
pub mod tagged;
pub mod tokenizer;
pub mod wordpiece;
