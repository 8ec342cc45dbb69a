//! What the driver and the worker sides share: the environment through which a worker gets
//! its job ([`env`]), the events it sends back ([`events`]), the run directory's files and
//! crash-safe writing ([`checkpoint`]), every path of a run directory ([`run_dir`]), tensors in one safetensors file or sharded over several ([`tensor_files`]), and the one way C++ errors cross into Rust ([`ffi`]).

pub(crate) mod checkpoint;
pub(crate) mod env;
pub(crate) mod events;
pub(crate) mod ffi;
pub(crate) mod run_dir;
pub(crate) mod tensor_files;
