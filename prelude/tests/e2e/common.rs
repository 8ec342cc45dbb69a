//! Helpers shared by the end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::Output;
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

/// The named tensors of a safetensors file, sorted by name; for `<dir>/<stem>.safetensors`
/// that is sharded in `dir` (a ZeRO-3 checkpoint), those of the whole set.
pub fn load(path: &Path) -> Vec<(String, tch::Tensor)> {
    use trainbook::engine::checkpoint::TensorFiles;
    let sharded = || {
        let stem = path.file_name()?.to_str()?.strip_suffix(".safetensors")?;
        TensorFiles::open(path.parent()?, stem).ok().flatten()
    };
    let mut v = match sharded().filter(|_| !path.exists()) {
        Some(files) => files.read_all().unwrap(),
        None => tch::Tensor::read_safetensors(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display())),
    };
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

/// The JSON summary a `--json` command prints as its last stdout line.
pub fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| {
        panic!(
            "last stdout line is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The weights file of a run's last checkpoint.
pub fn last_model(r: &trainbook::TrainResult) -> PathBuf {
    r.last_checkpoint
        .as_ref()
        .expect("a final checkpoint")
        .join("model.safetensors")
}

/// A directory for this test process to write runs, checkpoints and corpora into:
/// `<tmp>/trainbook-e2e/<pid>/<name>`, created. The first call also removes the directories of
/// earlier test processes that have ended, so one run of this binary leaves at most its own
/// output behind (to read after a failure) and repeated runs do not fill the disk: a run of
/// the whole binary writes several GB of checkpoints.
pub fn scratch(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let base = std::env::temp_dir().join("trainbook-e2e");
    SWEPT.call_once(|| {
        for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok();
            let alive = pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists());
            if !alive {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let dir = base.join(std::process::id().to_string()).join(name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Every value the job reported for metric `name`, all ranks, in arrival order.
pub fn metric_values(job: &trainbook::Job, name: &str) -> Vec<f64> {
    job.metric_rows()
        .iter()
        .filter(|m| m.name == name)
        .map(|m| m.value)
        .collect()
}
