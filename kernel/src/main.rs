//! trainbook-kernel: the Jupyter kernel for trainbook notebooks (Rust cells via evcxr, with the
//! trainbook prelude preloaded). `trainbook kernel ...` runs this program.

mod analysis;
mod cell_libs;
mod channel;
mod completion;
mod evaluator;
mod history;
mod infer;
mod install;
mod iopub;
mod is_complete;
mod kernel;
mod procs;
mod scan;
mod toolchain;
mod verdict;
mod wire;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "trainbook-kernel",
    version,
    about = "The trainbook Jupyter kernel: Rust cells (evcxr) with the trainbook prelude preloaded, \
             live training displays, and interrupts that stop jobs but keep your variables",
    after_help = "Set up once with `trainbook kernel install`, then pick \"Rust (trainbook)\" in \
                  Jupyter, or run `jupyter nbconvert --execute --to notebook nb.ipynb`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the kernel for Jupyter (the kernelspec's command line).
    Run {
        /// The connection file Jupyter wrote (ports, key, transport).
        #[arg(long, short = 'f', value_name = "FILE")]
        connection_file: PathBuf,
    },
    /// Install the "trainbook" kernelspec so Jupyter lists the kernel.
    Install(InstallArgs),
    /// Load the prelude into a fresh Rust process and run a cell, as a kernel start would.
    Check {
        /// The cell to run; it must evaluate to 1.
        #[arg(long, default_value = CHECK_CELL)]
        code: String,
    },
}

#[derive(Args)]
struct InstallArgs {
    /// Install for the current user (~/.local/share/jupyter). The default.
    #[arg(long, conflicts_with_all = ["sys_prefix", "prefix"])]
    user: bool,
    /// Install into the active Python environment ($VIRTUAL_ENV or python3's sys.prefix).
    #[arg(long, conflicts_with = "prefix")]
    sys_prefix: bool,
    /// Install into PREFIX/share/jupyter.
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<PathBuf>,
    /// Kernelspec name.
    #[arg(long, default_value = "trainbook")]
    name: String,
    /// Name shown in Jupyter's kernel picker.
    #[arg(long, default_value = "Rust (trainbook)")]
    display_name: String,
    /// Skip loading the prelude into a test cell first.
    #[arg(long)]
    no_check: bool,
}

fn main() {
    // As the cell process: report failed cells (see verdict.rs) before evcxr takes over.
    if std::env::var_os(verdict::CELL_PROCESS_ENV).is_some() {
        verdict::install();
    }
    // When evcxr starts this executable as its cell process, this call never returns.
    evcxr::runtime_hook();
    let cli = Cli::parse();
    if let Err(e) = real_main(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { connection_file } => run(&connection_file),
        Command::Install(args) => install(args),
        Command::Check { code } => {
            let took = check(&code)?;
            println!("the prelude loads; first cell result after {took:.1} s");
            Ok(())
        }
    }
}

fn run(connection_file: &Path) -> Result<()> {
    let connection = kernel::read_connection_file(connection_file)?;
    let run_dir = create_run_dir()?;
    let prelude = match cell_libs::CellLibs::locate() {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("trainbook-kernel: {e:#}; starting without the prelude");
            None
        }
    };
    let toolchain = prepare_env(prelude.as_ref());
    let config = kernel::KernelConfig {
        connection,
        run_dir,
        prelude,
        toolchain,
    };
    runtime()?.block_on(kernel::serve(config))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// A private directory for this kernel: the side-channel socket and evcxr's build directory.
/// Directories of kernels that died without cleaning up are removed.
fn create_run_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let uid = unsafe { libc::getuid() };
    let base = std::env::temp_dir().join(format!("trainbook-kernel-{uid}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&base)
        .with_context(|| format!("cannot create {}", base.display()))?;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700))?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = base.join(format!("{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(dir.join("build"))?;
    // evcxr builds cells here and keeps the directory (we remove it at shutdown). Set before
    // any thread starts.
    unsafe { std::env::set_var("EVCXR_TMPDIR", dir.join("build")) };
    Ok(dir)
}

/// Finds the toolchain and sets this process's environment for evcxr (see `toolchain.rs`).
/// Runs before any thread starts.
fn prepare_env(prelude: Option<&cell_libs::CellLibs>) -> Option<toolchain::Toolchain> {
    let flags = prelude.map(|p| p.encoded_rustflags());
    let found = toolchain::Toolchain::find().and_then(|t| {
        // SAFETY: called from `run` and `check` before they start the async runtime or the
        // evaluator thread; this process has one thread here.
        unsafe { t.apply(flags.as_deref())? };
        Ok(t)
    });
    match found {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("trainbook-kernel: {e:#}");
            None
        }
    }
}

fn install(args: InstallArgs) -> Result<()> {
    let target = match (args.sys_prefix, args.prefix) {
        (_, Some(p)) => install::Target::Prefix(p),
        (true, None) => install::Target::SysPrefix,
        _ => install::Target::User,
    };
    if !args.no_check {
        let took = check(CHECK_CELL)?;
        eprintln!("prelude check passed ({took:.1} s to a first cell result)");
    }
    let exe = std::env::current_exe()?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let dir = install::write_kernelspec(&target, &args.name, &args.display_name, &exe)?;
    println!("installed kernelspec {:?} in {}", args.name, dir.display());
    Ok(())
}

// No `let`: a variable would make the check wait for rust-analyzer's first analysis (~3 s).
const CHECK_CELL: &str = "1 + trainbook::running_jobs().len()";

/// Starts the evaluator as a kernel would, runs `code` (which must evaluate to 1), and returns the
/// seconds it took.
fn check(code: &str) -> Result<f64> {
    let prelude = cell_libs::CellLibs::locate()?;
    let run_dir = create_run_dir()?;
    let toolchain = prepare_env(Some(&prelude));
    let started = Instant::now();
    let result = runtime()?.block_on(async {
        let (publisher, mut outbox) = iopub::Publisher::new();
        let channel = channel::ChannelServer::start(&run_dir, publisher.clone())?;
        let evaluator = evaluator::Evaluator::start(
            evaluator::ChildSetup {
                prelude: Some(prelude),
                toolchain,
                channel_socket: channel.path().to_path_buf(),
                analysis_dir: None,
            },
            publisher.clone(),
        );
        let cell = jupyter_protocol::JupyterMessage::new(
            jupyter_protocol::ExecuteRequest::new("check".into()),
            None,
        );
        publisher.begin_cell(&cell);
        let outcome = evaluator.execute(code.to_string()).await;
        publisher.end_cell();
        let mut printed = String::new();
        while let Ok(m) = outbox.try_recv() {
            if let jupyter_protocol::JupyterMessageContent::StreamContent(s) = &m.content {
                printed.push_str(&s.text);
            }
        }
        evaluator.cell_process.kill_child();
        match outcome {
            evaluator::Outcome::Ok { data }
                if data.get("text/plain").and_then(|v| v.as_str()) == Some("1") =>
            {
                if printed.contains("trainbook:") {
                    anyhow::bail!("the prelude loaded with warnings:\n{printed}");
                }
                Ok(())
            }
            evaluator::Outcome::Ok { data } => {
                anyhow::bail!("a test cell returned {data:?} instead of 1\n{printed}")
            }
            evaluator::Outcome::Error(e) => anyhow::bail!(
                "the prelude does not load into a cell: {}\n{}\n{printed}",
                e.evalue,
                e.traceback.join("\n")
            ),
        }
    });
    let _ = std::fs::remove_dir_all(&run_dir);
    result?;
    Ok(started.elapsed().as_secs_f64())
}
