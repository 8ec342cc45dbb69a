//! The `trainbook` crate re-exported as a Rust dylib. Notebook cells are compiled with
//! `--extern trainbook=<this library>`, so `use trainbook::prelude::*;` resolves here and every
//! cell shares one copy of trainbook's statics (the job registry, the kernel link). Built with
//! `-C prefer-dynamic` by `scripts/build-torch-library.sh`, because cells link the standard library
//! dynamically and it may appear only once in the process.
pub use trainbook::*;
