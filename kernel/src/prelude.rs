//! Where the trainbook prelude lives and how notebook cells link to it.
//!
//! Cells are compiled by evcxr into small shared libraries. Instead of letting evcxr build the
//! trainbook crate (and libtorch bindings, polars, tokenizers) again in its own build directory,
//! cells link the prebuilt `libtrainbook_prelude.so` from trainbook's release build:
//! `--extern trainbook=<dylib>` plus `-L dependency=<deps>` for the crate metadata. A kernel start
//! therefore never compiles a dependency, and every cell shares one copy of trainbook's statics.
//!
//! evcxr learns the types of a cell's variables from rust-analyzer, which cannot see a crate
//! passed with `--extern`; the kernel asks the compiler instead (see `infer.rs`).

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
pub struct Prelude {
    /// `libtrainbook_prelude.so` (a Rust dylib built with `-C prefer-dynamic`).
    pub dylib: PathBuf,
    /// The rlib metadata of trainbook and its dependencies (`target/release/deps`).
    pub deps: PathBuf,
    /// The worker binary jobs start.
    pub worker: Option<PathBuf>,
    /// libtorch's library directory: crates inside the prelude carry `-ltorch_cpu`-style link
    /// requests that the linker must be able to resolve when it links a cell.
    pub libtorch_lib: Option<PathBuf>,
}

impl Prelude {
    /// Finds the prelude next to this executable (`target/release/`), or where
    /// `TRAINBOOK_PRELUDE_DYLIB` points.
    pub fn locate() -> Result<Prelude> {
        let dylib = match std::env::var_os("TRAINBOOK_PRELUDE_DYLIB") {
            Some(p) => PathBuf::from(p),
            None => exe_dir()?.join("libtrainbook_prelude.so"),
        };
        if !dylib.is_file() {
            bail!(
                "the trainbook prelude library {} is missing: build it with `make build` (or \
                 `scripts/build-prelude.sh`), then run `trainbook kernel install` again",
                dylib.display()
            );
        }
        let dir = dylib.parent().unwrap_or(Path::new(".")).to_path_buf();
        let deps = dir.join("deps");
        if !deps.is_dir() {
            bail!(
                "{} has no deps/ directory next to it; the prelude must stay inside the cargo \
                 target directory it was built in",
                dylib.display()
            );
        }
        let worker = Some(dir.join("trainbook-worker")).filter(|p| p.is_file());
        // The LIBTORCH trainbook was built with (.cargo/config.toml sets it for every build).
        let libtorch_lib = std::env::var_os("LIBTORCH")
            .map(PathBuf::from)
            .or_else(|| option_env!("LIBTORCH").map(PathBuf::from))
            .map(|p| p.join("lib"))
            .filter(|p| p.is_dir());
        Ok(Prelude {
            dylib,
            deps,
            worker,
            libtorch_lib,
        })
    }

    /// The rustc flags for cells, as cargo's `CARGO_ENCODED_RUSTFLAGS` (0x1f-separated, so
    /// paths may contain spaces). evcxr's own flags are replaced, so its one essential flag,
    /// `-Cprefer-dynamic` (one libstd for all cells), is repeated here.
    pub fn encoded_rustflags(&self) -> String {
        let mut flags = vec![
            "-Cprefer-dynamic".to_string(),
            "--extern".to_string(),
            format!("trainbook={}", self.dylib.display()),
            "-L".to_string(),
            format!("dependency={}", self.deps.display()),
        ];
        if let Some(lib) = &self.libtorch_lib {
            flags.push("-L".to_string());
            flags.push(format!("native={}", lib.display()));
        }
        flags.join("\x1f")
    }

    /// Library search path for the process that loads cells: the prelude's directory and
    /// `std_dir`, where the Rust standard library the cells link dynamically lives.
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
