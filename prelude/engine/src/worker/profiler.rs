//! The step profiler: records the optimizer steps a job names with libtorch's own profiler
//! (Kineto, through `csrc/profiler.cpp`), each step a `ProfilerStep#N` range as in
//! `torch.profiler`, saves a Chrome trace per rank (written to a temporary name, then
//! renamed), and sums a trace into a top-ops table.

use std::collections::HashMap;
use std::os::raw::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use trainbook_api::{OpTime, ProfileSteps, StepProfile};

use crate::shared::ffi::call_status;
use crate::shared::run_dir::RunDir;

extern "C" {
    fn tb_profiler_start(with_cuda: c_int, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_profiler_stop(path: *const c_char, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_range_begin(name: *const c_char) -> *mut c_void;
    fn tb_range_end(range: *mut c_void);
}

/// Operators kept in a summary.
const TOP: usize = 30;
/// The range each recorded step is wrapped in (torch.profiler's name).
const STEP_PREFIX: &str = "ProfilerStep#";

/// Starts recording on this thread (and the autograd threads it starts).
pub(crate) fn start(with_cuda: bool) -> Result<()> {
    call_status("starting libtorch's profiler", |e, n| {
        // SAFETY: the error buffer is `call_status`'s, of length n.
        unsafe { tb_profiler_start(c_int::from(with_cuda), e, n) }
    })
}

/// Stops recording and saves the Chrome trace to `path` (atomically: a temporary file, then
/// a rename); `None` discards what was recorded.
pub(crate) fn stop(path: Option<&Path>) -> Result<()> {
    let Some(path) = path else {
        return call_status("stopping libtorch's profiler", |e, n| {
            // SAFETY: a null path discards the result; the buffer is `call_status`'s.
            unsafe { tb_profiler_stop(std::ptr::null(), e, n) }
        });
    };
    let tmp = PathBuf::from(format!("{}.tmp-{}", path.display(), std::process::id()));
    let c = std::ffi::CString::new(tmp.display().to_string())?;
    call_status("saving the profiler's trace", |e, n| {
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        unsafe { tb_profiler_stop(c.as_ptr(), e, n) }
    })?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// A named range in the trace while it lives.
pub(crate) struct Range(*mut c_void);

impl Range {
    pub(crate) fn new(name: &str) -> Self {
        let c = std::ffi::CString::new(name).unwrap_or_default();
        // SAFETY: `c` is NUL-terminated; the C++ side copies the name.
        Range(unsafe { tb_range_begin(c.as_ptr()) })
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from tb_range_begin and is ended once.
            unsafe { tb_range_end(self.0) }
        }
    }
}

/// A job's profiling on one rank: starts before `steps.start`, wraps each recorded step in a
/// range, stops and saves after the last (or when training ends first).
pub(crate) struct StepProfiler {
    steps: ProfileSteps,
    path: PathBuf,
    with_cuda: bool,
    active: bool,
    range: Option<Range>,
}

impl StepProfiler {
    pub(crate) fn new(steps: ProfileSteps, run_dir: &Path, rank: usize, with_cuda: bool) -> Self {
        StepProfiler {
            steps,
            path: RunDir::new(run_dir).rank_trace(rank),
            with_cuda,
            active: false,
            range: None,
        }
    }

    /// Before optimizer step `step` (counted from 0).
    pub(crate) fn before_step(&mut self, step: u64) -> Result<()> {
        if !self.active && step >= self.steps.start && step < self.steps.end {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            start(self.with_cuda)?;
            self.active = true;
        }
        if self.active {
            self.range = Some(Range::new(&format!("{STEP_PREFIX}{step}")));
        }
        Ok(())
    }

    /// Whether the trace is saved after the step that makes `steps_done`.
    pub(crate) fn saves_after(&self, steps_done: u64) -> bool {
        self.active && steps_done >= self.steps.end
    }

    /// After a step; `steps_done` counts it. Returns the trace's path once it is saved.
    pub(crate) fn after_step(&mut self, steps_done: u64) -> Result<Option<PathBuf>> {
        self.range = None;
        if self.saves_after(steps_done) {
            return self.finish();
        }
        Ok(None)
    }

    /// Saves what was recorded (training ended inside the window); nothing when not recording.
    pub(crate) fn finish(&mut self) -> Result<Option<PathBuf>> {
        self.range = None;
        if !self.active {
            return Ok(None);
        }
        self.active = false;
        stop(Some(&self.path))?;
        Ok(Some(self.path.clone()))
    }
}

impl Drop for StepProfiler {
    fn drop(&mut self) {
        self.range = None;
        if self.active {
            stop(None).ok();
        }
    }
}

/// The fields of a trace event a summary reads (the rest, `args` with shapes, is skipped).
#[derive(serde::Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    ts: serde_json::Value,
    #[serde(default)]
    dur: serde_json::Value,
    #[serde(default)]
    pid: serde_json::Value,
    #[serde(default)]
    tid: serde_json::Value,
}

#[derive(serde::Deserialize)]
struct Trace {
    #[serde(rename = "traceEvents", default)]
    events: Vec<Event>,
}

fn micros(v: &serde_json::Value) -> f64 {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0.0)
}

/// A complete event: [start, end) in microseconds.
struct Span<'a> {
    name: &'a str,
    start: f64,
    end: f64,
    thread: String,
}

/// Sums a Chrome trace's recorded steps: each operator's self time (its own child operators'
/// time taken out), calls and share of the steps' wall time; the share of the wall time spent
/// inside any operator; device kernels when there are any.
pub(crate) fn summarize(path: &Path, steps: ProfileSteps) -> Result<StepProfile> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let trace: Trace = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a Chrome trace", path.display()))?;
    let mut windows = Vec::new();
    // The steps actually recorded (a job may end inside the window it was given).
    let (mut first, mut last) = (u64::MAX, 0);
    let mut ops: Vec<Span> = Vec::new();
    let mut kernels: Vec<Span> = Vec::new();
    for e in trace.events.iter().filter(|e| e.ph == "X") {
        let start = micros(&e.ts);
        let span = Span {
            name: &e.name,
            start,
            end: start + micros(&e.dur),
            thread: format!("{}/{}", e.pid, e.tid),
        };
        match e.cat.as_str() {
            "user_annotation" if e.name.starts_with(STEP_PREFIX) => {
                if let Ok(n) = e.name[STEP_PREFIX.len()..].parse::<u64>() {
                    (first, last) = (first.min(n), last.max(n));
                }
                windows.push((start, span.end));
            }
            "cpu_op" | "user_annotation" | "cuda_runtime" | "cuda_driver" => ops.push(span),
            "kernel" | "gpu_memcpy" | "gpu_memset" => kernels.push(span),
            _ => {}
        }
    }
    anyhow::ensure!(
        !windows.is_empty(),
        "{} holds no {STEP_PREFIX} range: no step was recorded",
        path.display()
    );
    windows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let inside = |s: &Span| windows.iter().any(|w| s.start >= w.0 && s.start < w.1);
    ops.retain(|s| inside(s));
    kernels.retain(|s| inside(s));
    let wall: f64 = windows.iter().map(|w| w.1 - w.0).sum();
    let (self_times, top_level) = self_times(&ops);
    let steps = if first <= last {
        ProfileSteps {
            start: first,
            end: last + 1,
        }
    } else {
        steps
    };
    let busy = union_length(kernels.iter().map(|k| (k.start, k.end)).collect(), &windows);
    Ok(StepProfile {
        device_busy: (!kernels.is_empty()).then(|| busy / wall.max(f64::MIN_POSITIVE)),
        steps,
        traces: vec![path.to_path_buf()],
        step_ms: wall / 1e3 / windows.len() as f64,
        covered: union_length(top_level, &windows) / wall.max(f64::MIN_POSITIVE),
        ops: by_name(ops.iter().zip(self_times), wall),
        kernels: by_name(kernels.iter().map(|k| (k, k.end - k.start)), wall),
    })
}

/// Each span's self time (its direct children's time taken out), and the spans that have no
/// parent on their thread.
fn self_times<'a>(spans: &'a [Span]) -> (Vec<f64>, Vec<(f64, f64)>) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    // By thread, then start; a parent (longer) before a child that starts with it.
    order.sort_by(|&a, &b| {
        let (x, y) = (&spans[a], &spans[b]);
        x.thread
            .cmp(&y.thread)
            .then(x.start.total_cmp(&y.start))
            .then(y.end.total_cmp(&x.end))
    });
    let mut own: Vec<f64> = spans.iter().map(|s| s.end - s.start).collect();
    let mut top = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    for &i in &order {
        let s = &spans[i];
        while let Some(&p) = stack.last() {
            if spans[p].thread == s.thread && spans[p].end > s.start {
                break;
            }
            stack.pop();
        }
        match stack.last() {
            Some(&p) => own[p] -= s.end.min(spans[p].end) - s.start,
            None => top.push((s.start, s.end)),
        }
        stack.push(i);
    }
    (own.into_iter().map(|t| t.max(0.0)).collect(), top)
}

/// The length of the union of `spans`, each clipped to the windows.
fn union_length(mut spans: Vec<(f64, f64)>, windows: &[(f64, f64)]) -> f64 {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    for w in windows {
        let mut reach = w.0;
        for &(s, e) in &spans {
            let (s, e) = (s.max(reach), e.min(w.1));
            if e > s {
                total += e - s;
                reach = e;
            }
        }
    }
    total
}

/// Self times summed by name, most first, the top [`TOP`].
fn by_name<'a>(times: impl Iterator<Item = (&'a Span<'a>, f64)>, wall: f64) -> Vec<OpTime> {
    let mut sums: HashMap<&str, (f64, u64)> = HashMap::new();
    for (s, t) in times {
        let e = sums.entry(s.name).or_default();
        e.0 += t;
        e.1 += 1;
    }
    let mut rows: Vec<OpTime> = sums
        .into_iter()
        .map(|(name, (t, calls))| OpTime {
            name: name.to_string(),
            self_ms: t / 1e3,
            calls,
            share: t / wall.max(f64::MIN_POSITIVE),
        })
        .collect();
    rows.sort_by(|a, b| b.self_ms.total_cmp(&a.self_ms).then(a.name.cmp(&b.name)));
    rows.truncate(TOP);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    /// Real steps of matrix work recorded by libtorch's profiler: the trace is a Chrome trace
    /// with the step ranges, its operators cover the steps, and the heaviest is the matmul.
    #[test]
    fn a_recorded_step_is_a_chrome_trace_whose_operators_cover_it() {
        let dir = std::env::temp_dir().join(format!("trainbook-profile-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let steps = ProfileSteps { start: 1, end: 3 };
        let mut p = StepProfiler::new(steps, &dir, 0, false);
        // Steps of ~25 ms (6 GFLOP): the gaps between operators are tens of microseconds, so
        // a preemption that lands in one stays a small part of the step when other work
        // shares the cores. With 512x512 (4 ms steps) and three busy loops beside it, one run
        // in ten measured 0.83; at this size fifteen runs so loaded all measured 0.998.
        let a =
            Tensor::randn([1024, 1024], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let mut saved = None;
        for step in 0..4 {
            p.before_step(step).unwrap();
            let y = a.matmul(&a).relu().sum(Kind::Float);
            y.backward();
            if let Some(path) = p.after_step(step + 1).unwrap() {
                saved = Some(path);
            }
        }
        let path = saved.expect("saved after step 2");
        assert_eq!(path, RunDir::new(&dir).rank_trace(0));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let names: Vec<&str> = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(names.contains(&"ProfilerStep#1") && names.contains(&"ProfilerStep#2"));
        assert!(!names.contains(&"ProfilerStep#0") && !names.contains(&"ProfilerStep#3"));
        let s = summarize(&path, steps).unwrap();
        assert!(
            s.covered >= 0.9,
            "operators cover {:.2} of the steps",
            s.covered
        );
        assert!(s.ops[0].name.contains("mm"), "{:?}", s.ops);
        assert!(s.ops.iter().any(|o| o.name == "aten::relu"), "{:?}", s.ops);
        let total: f64 = s.ops.iter().map(|o| o.share).sum();
        assert!(total <= 1.0 + 1e-9 && total >= 0.5, "{total}");
        assert!(s.table(5).contains("% step"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn self_time_takes_out_direct_children_only() {
        let span = |name, start, end| Span {
            name,
            start,
            end,
            thread: "1/1".into(),
        };
        // a [0, 10) holds b [1, 5), which holds c [2, 3); d [6, 8) is a's too.
        let spans = vec![
            span("a", 0.0, 10.0),
            span("c", 2.0, 3.0),
            span("b", 1.0, 5.0),
            span("d", 6.0, 8.0),
        ];
        let (own, top) = self_times(&spans);
        assert_eq!(own, vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!(top, vec![(0.0, 10.0)]);
        assert_eq!(
            union_length(vec![(0.0, 4.0), (2.0, 6.0)], &[(1.0, 5.0)]),
            4.0
        );
    }
}
