//! The files a notebook cell links against ([`CellLibs`]: the trainbook_torch library, the api rlib,
//! their dependencies) and the code every kernel runs first ([`init_code`]).
//!
//! Cells are compiled by evcxr into small shared libraries. They compile against trainbook's
//! prebuilt notebook-facing crate, `trainbook-api` (`--extern trainbook=<its rlib>` plus
//! `-L dependency=<deps>` for its few dependencies), not against the engine: rustc reads the
//! metadata of a cell's whole dependency graph for every cell, and the engine's graph (libtorch
//! bindings, polars, tokenizers) cost ~0.3 s per cell. A kernel start never compiles a
//! dependency. The engine is the prebuilt trainbook_torch library (`libtrainbook_torch.so`), which
//! the cell process loads once, on the first call that needs it (`trainbook_api::runtime`,
//! told where by `TRAINBOOK_TORCH_DYLIB`); so every cell shares one copy of its statics.
//!
//! evcxr learns the types of a cell's variables from rust-analyzer, which cannot see a crate
//! passed with `--extern`; the kernel asks its own analyzer, which sees the api's sources
//! (`analysis.rs`), and else the compiler (`infer.rs`).

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// Code every kernel runs once its Rust process is up (and again after that process restarts):
/// the prelude import, the kernel link and the panic hook that reports failed cells, in one
/// cell (each cell is a compile).
pub fn init_code() -> String {
    format!(
        "use trainbook::prelude::*;\n\
         if let Err(e) = trainbook::notebook::attach() {{ eprintln!(\"trainbook: live displays are off: {{e:#}}\"); }}\n\
         {}",
        crate::verdict::PANIC_HOOK_CODE
    )
}

/// The files a notebook cell links against.
#[derive(Clone, Debug)]
pub struct CellLibs {
    /// `libtrainbook_torch.so` (a Rust dylib built with `-C prefer-dynamic`): the engine.
    pub dylib: PathBuf,
    /// `cells/libtrainbook_api.rlib`, the crate cells compile against (as `trainbook`): the
    /// build of `trainbook-api` inside the trainbook_torch library (`scripts/build-torch-library.sh` puts it
    /// there).
    pub api: PathBuf,
    /// The rlibs of its dependencies (`target/release/deps`).
    pub deps: PathBuf,
    /// The worker binary jobs start.
    pub worker: Option<PathBuf>,
    /// Where libtorch's libraries are (`cells/native-dirs`), for cells that link the
    /// trainbook_torch library itself (cells that name `trainbook_torch`).
    pub native: Vec<PathBuf>,
}

impl CellLibs {
    /// Finds the trainbook_torch library next to this executable (`target/release/`), or where
    /// `TRAINBOOK_TORCH_DYLIB` points.
    pub fn locate() -> Result<CellLibs> {
        let dylib = match std::env::var_os("TRAINBOOK_TORCH_DYLIB") {
            Some(p) => PathBuf::from(p),
            None => exe_dir()?.join("libtrainbook_torch.so"),
        };
        if !dylib.is_file() {
            bail!(
                "the trainbook_torch library {} is missing: build it with `make build` (or \
                 `scripts/build-torch-library.sh`), then run `trainbook kernel install` again",
                dylib.display()
            );
        }
        let dir = dylib.parent().unwrap_or(Path::new(".")).to_path_buf();
        let deps = dir.join("deps");
        if !deps.is_dir() {
            bail!(
                "{} has no deps/ directory next to it; the trainbook_torch library must stay inside the cargo \
                 target directory it was built in",
                dylib.display()
            );
        }
        let api = dir.join("cells").join("libtrainbook_api.rlib");
        if !api.is_file() {
            bail!(
                "{} is missing next to the trainbook_torch library: build it with `make build`, then run \
                 `trainbook kernel install` again",
                api.display()
            );
        }
        let worker = Some(dir.join("trainbook-worker")).filter(|p| p.is_file());
        let native = std::fs::read_to_string(dir.join("cells").join("native-dirs"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(CellLibs {
            dylib,
            api,
            deps,
            worker,
            native,
        })
    }

    /// The rustc flags for cells, as cargo's `CARGO_ENCODED_RUSTFLAGS` (0x1f-separated, so
    /// paths may contain spaces). evcxr's own flags are replaced, so its one essential flag,
    /// `-Cprefer-dynamic` (one libstd for all cells), is repeated here.
    ///
    /// `trainbook_torch` is this library itself (tch, custom tasks): rustc loads an
    /// `--extern` crate only for a cell that names it, so other cells keep the light graph.
    pub fn encoded_rustflags(&self) -> String {
        let mut flags = vec![
            "-Cprefer-dynamic".to_string(),
            "--extern".to_string(),
            format!("trainbook={}", self.api.display()),
            "--extern".to_string(),
            format!("trainbook_torch={}", self.dylib.display()),
            "-L".to_string(),
            format!("dependency={}", self.deps.display()),
        ];
        for dir in &self.native {
            flags.push("-L".to_string());
            flags.push(format!("native={}", dir.display()));
        }
        flags.join("\x1f")
    }

    /// Library search path for the process that loads cells: the trainbook_torch library's
    /// directory and `std_dir`, where the Rust standard library that the cells and the library
    /// link dynamically lives. (The library finds libtorch through its own run path.)
    pub fn library_path(&self, std_dir: Option<&Path>) -> Result<String> {
        let mut dirs = vec![self.dylib.parent().unwrap_or(Path::new(".")).to_path_buf()];
        dirs.extend(std_dir.map(Path::to_path_buf));
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            dirs.extend(std::env::split_paths(&old));
        }
        Ok(std::env::join_paths(dirs)?.to_string_lossy().into_owned())
    }
}

fn exe_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the trainbook-kernel executable")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    Ok(exe.parent().unwrap_or(Path::new(".")).to_path_buf())
}
