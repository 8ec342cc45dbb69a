//! What a job's live view shows (plot, logs, their level, the loss axis): options that ride
//! along in a [`crate::spec::JobSpec`], read by whichever view shows the job. Their own module,
//! so the spec names them without naming the runner.

use anyhow::{anyhow, Result};

use crate::logs::LogLevel;

/// What a job's live view shows; see the `show_*`/`log_level` builder methods.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewOptions {
    pub plot: bool,
    pub logs: bool,
    /// `None`: `$TRAINBOOK_LOG`, else `info`.
    pub log_level: Option<LogLevel>,
    pub log_scale: bool,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            plot: true,
            logs: true,
            log_level: None,
            log_scale: false,
        }
    }
}

/// Environment variable with the default log level of live views (`off`, `error`, `warn`,
/// `info`, `debug`), like `RUST_LOG`.
pub const LOG_LEVEL_ENV: &str = "TRAINBOOK_LOG";

impl ViewOptions {
    /// The level the view filters at: the one set, else `$TRAINBOOK_LOG`, else `info`.
    pub fn log_level(&self) -> Result<LogLevel> {
        match self.log_level {
            Some(l) => Ok(l),
            None => match std::env::var(LOG_LEVEL_ENV) {
                Ok(v) => v.parse().map_err(|e| anyhow!("{LOG_LEVEL_ENV}={v:?}: {e}")),
                Err(_) => Ok(LogLevel::Info),
            },
        }
    }
}
