//! Helpers shared by the end-to-end tests.

use std::path::Path;
use std::time::{Duration, Instant};

/// Polls `f` every 10 ms until it holds or `timeout` passes; whether it held.

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The named tensors of a safetensors file, sorted by name.
pub fn load(path: &Path) -> Vec<(String, tch::Tensor)> {
    let mut v = tch::Tensor::read_safetensors(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The largest absolute difference between two files of named tensors, which must hold the
/// same names.
pub fn max_abs_diff(a: &Path, b: &Path) -> f64 {
    let (a, b) = (load(a), load(b));
    assert_eq!(
        a.iter().map(|t| &t.0).collect::<Vec<_>>(),
        b.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    a.iter()
        .zip(&b)
        .map(|((_, x), (_, y))| {
            (x.to_kind(tch::Kind::Double) - y.to_kind(tch::Kind::Double))
                .abs()
                .max()
                .double_value(&[])
        })
        .fold(0.0, f64::max)
}
