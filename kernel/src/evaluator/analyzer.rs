//! The two rust-analyzers: the trainbook-aware one (`analysis.rs`), loaded beside evcxr on its
//! own thread, and evcxr's own, warmed up before the first cell needs it.

use super::timing;
use crate::analysis::{self, Analyzer};
use evcxr::CommandContext;
use std::path::PathBuf;
use std::time::Instant;

/// The trainbook-aware analyzer (`analysis.rs`): loading on its own thread, ready, or off.
pub(super) enum Analysis {
    Loading(std::thread::JoinHandle<Option<Analyzer>>),
    Ready(Box<Analyzer>),
    Off,
}

impl Analysis {
    /// `TRAINBOOK_KERNEL_ANALYZER=off` keeps it off (it holds a few hundred MB).
    pub(super) fn start(dir: PathBuf) -> Analysis {
        if std::env::var("TRAINBOOK_KERNEL_ANALYZER").is_ok_and(|v| v == "off") {
            return Analysis::Off;
        }
        let Some(api) = analysis::api_sources() else {
            return Analysis::Off;
        };
        let spawned = std::thread::Builder::new()
            .name("analysis".into())
            .spawn(move || {
                // Behind the cells, which share these cores.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
                let t = Instant::now();
                let lock = analysis::lock_file(&api);
                match Analyzer::load(&dir, &api, lock.as_deref()) {
                    Ok(a) => {
                        timing("trainbook analyzer loaded in", t);
                        Some(a)
                    }
                    Err(e) => {
                        eprintln!(
                            "trainbook-kernel: completion and types will not know trainbook: {e:#}"
                        );
                        None
                    }
                }
            });
        match spawned {
            Ok(handle) => Analysis::Loading(handle),
            Err(_) => Analysis::Off,
        }
    }

    /// The analyzer, waiting for it if it is still loading.
    pub(super) fn get(&mut self) -> Option<&mut Analyzer> {
        if let Analysis::Loading(_) = self {
            let Analysis::Loading(handle) = std::mem::replace(self, Analysis::Off) else {
                unreachable!()
            };
            if let Ok(Some(a)) = handle.join() {
                *self = Analysis::Ready(Box::new(a));
            }
        }
        match self {
            Analysis::Ready(a) => Some(a),
            _ => None,
        }
    }

    /// The analyzer if it has loaded; a cell never waits for it.
    pub(super) fn ready(&mut self) -> Option<&mut Analyzer> {
        match self {
            Analysis::Loading(h) if h.is_finished() => self.get(),
            Analysis::Ready(a) => Some(a),
            _ => None,
        }
    }
}

/// evcxr asks rust-analyzer for the types of every cell's new variables. The first question
/// makes it resolve the standard library's names and impls, ~3 s on a 2-core machine, which
/// the notebook's first `let` cell would wait for. A completion query asks the same of it
/// without compiling anything.
pub(super) fn warm_up_analyzer(ctx: &mut CommandContext) {
    let t = Instant::now();
    let code = "let trainbook_warm_up: Vec<String> = Vec::new();\ntrainbook_warm_up.";
    let _ = ctx.completions(code, code.len());
    timing("analyzer warmed up in", t);
}
