//! Model definitions, one file per model family.

pub mod bert;
