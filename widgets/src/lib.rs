//! trainbook-widgets: training state drawn for people — loss plot, progress, log panel,
//! metrics table, tables of any data, and the dashboard that holds them. Pure functions of
//! plain data: no knowledge of workers, sockets or terminals, so the notebook and the terminal
//! show the same numbers the same way. Every widget has a plain-text twin.

pub mod dashboard;
pub mod format;
pub mod grid;
mod html;
pub mod logs;
pub mod memory;
pub mod plot;
pub mod progress;
pub mod series;
pub mod sweep;
pub mod table;
mod theme;

pub use dashboard::{Dashboard, DashboardOptions, Outcome};
pub use format::{eta, format_duration, format_metric, format_rate, progress_line};
pub use grid::Grid;
pub use html::escape;
pub use logs::{LogLevel, LogLine, LogPanel};
pub use memory::format_bytes;
pub use plot::{loss_bundle, loss_svg, svg_to_png, PlotOptions};
pub use progress::ProgressView;
pub use series::{downsample_minmax, Curves, Series, MAX_PLOT_POINTS};
pub use sweep::{sweep_svg, SweepView, TrialRow};
pub use table::{EpochRow, MetricsTable};

/// A MIME bundle: `{"text/plain": "...", "text/html": "...", "image/png": "<base64>"}`.
pub type Bundle = serde_json::Map<String, serde_json::Value>;
