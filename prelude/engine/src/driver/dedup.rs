//! Cross-worker log de-duplication.
//!
//! N worker processes of a data-parallel job usually print the same lines
//! (per-step losses, library warnings, progress bars).  [`Deduplicator`]
//! collapses such repeats into one summary per time window while never hiding
//! metrics or errors:
//!
//! * A line's *key* is its text with every number-like part removed (see
//!   [`dedup_key`]), plus its stream, so stdout and stderr never merge.
//!   Lines whose key is empty are never merged.
//! * The first line for a key is shown at once.  While a key has been seen
//!   from one rank only, that rank's lines are all shown (one worker's own
//!   repeats are never merged).  Once a second rank prints it within the
//!   window, further lines with that key (from any rank) are held; when the
//!   window that began with the first occurrence ends, one summary is shown:
//!   the latest held line plus
//!   `[repeated Nx across M workers: ranks 0-3; loss 0.41–2.46]`, where N and
//!   M count every line of the window, the ones shown at once included (two
//!   ranks printing one line once each read "repeated 2x across 2 workers:
//!   ranks 0-1"), and the ranges are the min–max of every labelled number
//!   that varied.
//! * Lines that look like errors (and the indented traceback lines after
//!   them) are never held.
//!
//! Time is always passed in, so the logic is deterministic and testable.
//! Memory is bounded: a key's state is dropped as soon as its window ends,
//! and at most `max_keys` keys are tracked at once (the oldest is flushed
//! early when a flood of distinct lines arrives).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Default cap on the number of keys tracked at once.
pub(crate) const DEFAULT_MAX_KEYS: usize = 10_000;
/// At most this many distinct labels are tracked per held group.
const MAX_LABELS: usize = 16;
/// Labels longer than this are ignored (they are not metric names).
const MAX_LABEL_LEN: usize = 64;
/// Windows are clamped to this so `Instant + window` cannot overflow.
const MAX_WINDOW: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) use trainbook_api::DedupOptions;
pub(crate) use trainbook_api::{
    plumbing::format::{Repeats, Shown},
    Stream,
};

fn has_digit(s: &str) -> bool {
    s.chars().any(char::is_numeric)
}

/// A token of >= 8 hex digits (`deadbeefcafe`, `3fa85f64`).
fn is_hex_id(tok: &str) -> bool {
    tok.len() >= 8 && tok.bytes().all(|b| b.is_ascii_hexdigit())
}

fn alnum_tokens(word: &str) -> impl Iterator<Item = &str> {
    word.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
}

/// The part of a line that must match for two lines to be merged.
///
/// Whitespace-separated words without digits or hex ids are kept verbatim.
/// A word containing a digit or a hex id is reduced to its alphanumeric
/// tokens that contain neither (`0-train` -> `train`, `loss:1.97` -> `loss`,
/// `[00:00<?,` -> nothing), so that the *names* around numbers still count
/// (`Epoch 0-train` and `Epoch 0-val` do not merge) while any value,
/// counter, id or timestamp is ignored.  Words are joined by single spaces.
/// An empty result means the line is never merged.
pub(crate) fn dedup_key(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    fn push(w: &str, out: &mut String) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(w);
    }
    for word in text.split_whitespace() {
        if !has_digit(word) && !alnum_tokens(word).any(is_hex_id) {
            push(word, &mut out);
        } else {
            for tok in alnum_tokens(word) {
                if !has_digit(tok) && !is_hex_id(tok) {
                    push(tok, &mut out);
                }
            }
        }
    }
    out
}

/// Does the line itself look like an error?  (`error`, `panicked`,
/// `traceback`, `exception`, `fatal`, ASCII case-insensitive.)
pub fn looks_like_error(text: &str) -> bool {
    const NEEDLES: [&[u8]; 5] = [b"error", b"exception", b"panicked", b"traceback", b"fatal"];
    let h = text.as_bytes();
    for i in 0..h.len() {
        let c = h[i].to_ascii_lowercase();
        if !matches!(c, b'e' | b'p' | b't' | b'f') {
            continue;
        }
        for n in NEEDLES {
            if n[0] == c && h.len() - i >= n.len() && h[i..i + n.len()].eq_ignore_ascii_case(n) {
                return true;
            }
        }
    }
    false
}

/// Parse a number word such as `0.6123`, `-3`, `1e-05,`, `66.4%)`.
fn parse_num(word: &str) -> Option<f64> {
    let s = word.trim_end_matches([',', ';', '%', ')', ']', '}']);
    let first = s.bytes().next()?;
    if !(first.is_ascii_digit() || matches!(first, b'.' | b'-' | b'+')) {
        return None;
    }
    if !s.bytes().any(|b| b.is_ascii_digit())
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'))
    {
        return None;
    }
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

fn clean_label(label: &str) -> Option<&str> {
    let l = label.trim_start_matches(|c: char| !c.is_alphanumeric());
    if l.is_empty() || l.len() > MAX_LABEL_LEN || !l.chars().any(char::is_alphabetic) {
        None
    } else {
        Some(l)
    }
}

/// Calls `f(label, value)` for each labelled number in `text`:
/// `label:NUM`, `label=NUM`, or `Label:` / `Label=` followed by a number word.
pub(crate) fn for_each_labelled_number(text: &str, mut f: impl FnMut(&str, f64)) {
    let mut words = text.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let Some(p) = w.find([':', '=']) else {
            continue;
        };
        let (label, rest) = (&w[..p], &w[p + 1..]);
        let Some(label) = clean_label(label) else {
            continue;
        };
        if rest.is_empty() {
            if let Some(v) = words.peek().and_then(|n| parse_num(n)) {
                f(label, v);
                words.next();
            }
        } else if let Some(v) = parse_num(rest) {
            f(label, v);
        }
    }
}

struct RangeAcc {
    label: String,
    min: f64,
    max: f64,
}

/// Every line of one key in the current window (shown or held), for its summary.
struct Held {
    count: usize,
    ranks: Vec<usize>, // sorted, distinct
    last_rank: usize,
    last_text: String,
    ranges: Vec<RangeAcc>,
}

impl Held {
    fn new() -> Self {
        Held {
            count: 0,
            ranks: Vec::new(),
            last_rank: 0,
            last_text: String::new(),
            ranges: Vec::new(),
        }
    }

    fn add(&mut self, rank: usize, text: &str) {
        self.count += 1;
        if let Err(i) = self.ranks.binary_search(&rank) {
            self.ranks.insert(i, rank);
        }
        self.last_rank = rank;
        self.last_text.clear();
        self.last_text.push_str(text);
        let ranges = &mut self.ranges;
        for_each_labelled_number(text, |label, v| {
            if let Some(r) = ranges.iter_mut().find(|r| r.label == label) {
                r.min = r.min.min(v);
                r.max = r.max.max(v);
            } else if ranges.len() < MAX_LABELS {
                ranges.push(RangeAcc {
                    label: label.to_string(),
                    min: v,
                    max: v,
                });
            }
        });
    }

    fn into_shown(self, stream: Stream) -> Shown {
        let ranges = self
            .ranges
            .into_iter()
            .filter(|r| r.min < r.max)
            .map(|r| (r.label, r.min, r.max))
            .collect();
        Shown {
            rank: self.last_rank,
            stream,
            text: self.last_text,
            repeats: Some(Repeats {
                count: self.count,
                ranks: self.ranks,
                ranges,
            }),
            is_error: false,
        }
    }
}

/// State of one key during its current window.
struct KeyState {
    key: String,
    stream: Stream,
    due: Instant,
    first_rank: usize,
    multi: bool,
    /// Whether lines are held, so a summary is due when the window ends.
    holding: bool,
    seen: Held,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ErrTail {
    /// Indented lines continue the error block (Python tracebacks).
    Indented,
    /// The next line, whatever it is, continues it (Rust panic message).
    NextLine,
}

/// Merges repeated lines from several ranks; see the module docs.
pub(crate) struct Deduplicator {
    config: DedupOptions,
    max_keys: usize,
    /// Latest time seen; earlier `now` arguments are clamped to it.
    clock: Option<Instant>,
    /// Live keys in order of first occurrence (= order of `due`).
    states: VecDeque<KeyState>,
    /// Id of `states[0]`; ids grow by one per new key.
    front_id: u64,
    index: HashMap<String, u64>,
    /// Ids of states that currently hold lines.
    held_ids: BTreeSet<u64>,
    /// Ranks/streams whose last line was part of an error block.
    err_tail: HashMap<(usize, Stream), ErrTail>,
}

fn plain(rank: usize, stream: Stream, text: &str, is_error: bool) -> Shown {
    Shown {
        rank,
        stream,
        text: text.to_string(),
        repeats: None,
        is_error,
    }
}

impl Deduplicator {
    pub(crate) fn new(config: DedupOptions) -> Self {
        Self::with_max_keys(config, DEFAULT_MAX_KEYS)
    }

    /// Like [`Deduplicator::new`] with a custom cap on tracked keys (>= 1).
    pub(crate) fn with_max_keys(mut config: DedupOptions, max_keys: usize) -> Self {
        config.window = config.window.min(MAX_WINDOW);
        Deduplicator {
            config,
            max_keys: max_keys.max(1),
            clock: None,
            states: VecDeque::new(),
            front_id: 0,
            index: HashMap::new(),
            held_ids: BTreeSet::new(),
            err_tail: HashMap::new(),
        }
    }

    /// Number of keys currently tracked (bounded by the window and `max_keys`).
    #[cfg(test)]
    fn active_keys(&self) -> usize {
        self.states.len()
    }

    /// Number of keys currently holding lines for a summary.
    #[cfg(test)]
    fn held_keys(&self) -> usize {
        self.held_ids.len()
    }

    fn tick(&mut self, now: Instant) -> Instant {
        let t = match self.clock {
            Some(c) if c > now => c,
            _ => now,
        };
        self.clock = Some(t);
        t
    }

    /// Remove the oldest key, emitting its summary if it holds lines.
    fn pop_front(&mut self, out: &mut Vec<Shown>) {
        if let Some(st) = self.states.pop_front() {
            self.index.remove(&st.key);
            self.held_ids.remove(&self.front_id);
            self.front_id += 1;
            if st.holding {
                out.push(st.seen.into_shown(st.stream));
            }
        }
    }

    fn expire_until(&mut self, now: Instant, out: &mut Vec<Shown>) {
        while self.states.front().is_some_and(|s| s.due <= now) {
            self.pop_front(out);
        }
    }

    fn classify_error(&mut self, rank: usize, stream: Stream, text: &str) -> bool {
        let tail = self.err_tail.get(&(rank, stream)).copied();
        let own = looks_like_error(text);
        let cont = match tail {
            Some(ErrTail::NextLine) => true,
            Some(ErrTail::Indented) => text.starts_with([' ', '\t']) && !text.trim().is_empty(),
            None => false,
        };
        if own {
            let t = if text.contains("panicked at") {
                ErrTail::NextLine
            } else {
                ErrTail::Indented
            };
            self.err_tail.insert((rank, stream), t);
        } else if cont {
            self.err_tail.insert((rank, stream), ErrTail::Indented);
        } else if tail.is_some() {
            self.err_tail.remove(&(rank, stream));
        }
        own || cont
    }

    /// Feed one line; returns what must be shown now (0 or more entries):
    /// first any summaries that fell due by `now`, then possibly the line.
    pub(crate) fn push(
        &mut self,
        rank: usize,
        stream: Stream,
        text: &str,
        now: Instant,
    ) -> Vec<Shown> {
        let now = self.tick(now);
        let mut out = Vec::new();
        self.expire_until(now, &mut out);
        let is_error = self.classify_error(rank, stream, text);
        if !self.config.enabled || is_error {
            out.push(plain(rank, stream, text, is_error));
            return out;
        }
        let body = dedup_key(text);
        if body.is_empty() {
            out.push(plain(rank, stream, text, false));
            return out;
        }
        let mut key = String::with_capacity(body.len() + 2);
        key.push_str(match stream {
            Stream::Stdout => "o ",
            Stream::Stderr => "e ",
        });
        key.push_str(&body);

        if let Some(&id) = self.index.get(&key) {
            let st = &mut self.states[(id - self.front_id) as usize];
            st.seen.add(rank, text);
            if !st.multi && rank == st.first_rank {
                out.push(plain(rank, stream, text, false));
            } else {
                st.multi = true;
                if !st.holding {
                    st.holding = true;
                    self.held_ids.insert(id);
                }
            }
        } else {
            while self.states.len() >= self.max_keys {
                self.pop_front(&mut out);
            }
            let id = self.front_id + self.states.len() as u64;
            self.index.insert(key.clone(), id);
            let mut seen = Held::new();
            seen.add(rank, text);
            self.states.push_back(KeyState {
                key,
                stream,
                due: now + self.config.window,
                first_rank: rank,
                multi: false,
                holding: false,
                seen,
            });
            out.push(plain(rank, stream, text, false));
        }
        out
    }

    /// Summaries whose window has ended by `now`, in order of their keys'
    /// first occurrence.  Also forgets keys whose window ended.
    pub(crate) fn flush_due(&mut self, now: Instant) -> Vec<Shown> {
        let now = self.tick(now);
        let mut out = Vec::new();
        self.expire_until(now, &mut out);
        out
    }

    /// End of the job: emit every held summary and forget all keys.
    pub(crate) fn finish(&mut self) -> Vec<Shown> {
        let mut out = Vec::new();
        while !self.states.is_empty() {
            self.pop_front(&mut out);
        }
        self.err_tail.clear();
        out
    }

    /// When the next held summary falls due, if any.
    #[cfg(test)]
    fn next_due(&self) -> Option<Instant> {
        let id = *self.held_ids.first()?;
        Some(self.states[(id - self.front_id) as usize].due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::plumbing::format::fmt_num;

    const S: Stream = Stream::Stdout;
    const WEIGHTS: &str = "Some weights of BertForSequenceClassification were not initialized from the model checkpoint at bert-base-cased and are newly initialized: ['classifier.bias', 'classifier.weight']";
    const MAP0: &str = "Map:   0%|          | 0/1000 [00:00<?, ? examples/s]";
    const MAP100: &str = "Map: 100%|██████████| 1000/1000 [00:00<00:00, 3782.66 examples/s]";

    fn ms(t0: Instant, m: u64) -> Instant {
        t0 + Duration::from_millis(m)
    }

    fn bert(step: usize, loss: f64) -> String {
        format!("train epoch:[{step}]\tloss:{loss:.6}")
    }

    /// Deterministic pseudo-random loss in [0.4, 2.5).
    fn loss_of(rank: usize, step: usize) -> f64 {
        let x = (rank * 7919 + step * 104_729) % 2100;
        0.4 + x as f64 / 1000.0
    }

    fn texts(v: &[Shown]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keys_of_reference_lines() {
        assert_eq!(dedup_key(&bert(0, 1.979938)), "train epoch loss");
        assert_eq!(dedup_key(&bert(0, 1.979938)), dedup_key(&bert(1, 1.272513)));
        assert_eq!(dedup_key(""), "");
        assert_eq!(dedup_key("   \t "), "");
        assert_eq!(dedup_key("12345 0.5 [00:00<00:00,"), "");
        // Identical text without digits keeps its words.
        assert_eq!(dedup_key(WEIGHTS), WEIGHTS);
        // Progress bars: numbers and block chars inside number words vanish.
        assert_eq!(dedup_key(MAP0), "Map: | ? examples/s]");
        assert_eq!(dedup_key(MAP100), "Map: examples/s]");
        // ResNet: values ignored, but train and val stay apart.
        let tr0 = dedup_key("Epoch 0-train Loss: 0.6123 Acc: 0.6640");
        let tr1 = dedup_key("Epoch 1-train Loss: 0.4123 Acc: 0.7640");
        let va0 = dedup_key("Epoch 0-val Loss: 0.4811 Acc: 0.8170");
        assert_eq!(tr0, "Epoch train Loss: Acc:");
        assert_eq!(tr0, tr1);
        assert_ne!(tr0, va0);
        // Hex ids vanish, with or without digits.
        assert_eq!(
            dedup_key("worker deadbeefcafe id=3fa85f64-5717-4562-b3fc-2c963f66afa6 up"),
            "worker id up"
        );
        assert_eq!(dedup_key("ptr 0x7ffd1234 run_3fa85f64"), "ptr run");
    }

    #[test]
    fn labelled_numbers() {
        let mut v = Vec::new();
        let mut f = |l: &str, x: f64| v.push((l.to_string(), x));
        for_each_labelled_number(&bert(3, 1.979938), &mut f);
        for_each_labelled_number("Epoch 0-train Loss: 0.6123 Acc: 0.6640", &mut f);
        for_each_labelled_number("(lr=1e-05, top1=66.4%) time=12:30 x: y 12:3", &mut f);
        assert_eq!(
            v,
            vec![
                ("loss".to_string(), 1.979938),
                ("Loss".to_string(), 0.6123),
                ("Acc".to_string(), 0.664),
                ("lr".to_string(), 1e-5),
                ("top1".to_string(), 66.4),
            ]
        );
    }

    #[test]
    fn error_detection() {
        assert!(looks_like_error("RuntimeError: CUDA error: out of memory"));
        assert!(looks_like_error("Traceback (most recent call last):"));
        assert!(looks_like_error(
            "thread 'main' panicked at src/main.rs:2:5:"
        ));
        assert!(looks_like_error("FATAL: rank 3 died"));
        assert!(looks_like_error(
            "torch.distributed.DistBackendException: x"
        ));
        assert!(!looks_like_error(&bert(0, 1.0)));
        assert!(!looks_like_error(WEIGHTS));
        assert!(!looks_like_error("Epoch 0-train Loss: 0.6123 Acc: 0.6640"));
    }

    #[test]
    fn first_occurrence_shown_and_single_rank_never_merged() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let mut shown = 0;
        for step in 0..180 {
            let out = d.push(
                0,
                S,
                &bert(step, loss_of(0, step)),
                ms(t0, step as u64 * 10),
            );
            assert_eq!(out.len(), 1);
            assert_eq!(
                out[0].to_string(),
                format!("(rank 0) {}", bert(step, loss_of(0, step)))
            );
            assert!(out[0].repeats.is_none());
            shown += out.len();
        }
        assert_eq!(shown, 180);
        assert_eq!(d.next_due(), None);
        assert!(d.flush_due(ms(t0, 60_000)).is_empty());
        assert!(d.finish().is_empty());
    }

    #[test]
    fn two_ranks_180_steps_collapse_into_one_summary() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let mut all = Vec::new();
        let (mut lo, mut hi) = (f64::MAX, f64::MIN);
        let mut first = true;
        for step in 0..180 {
            for rank in 0..2 {
                let loss = (loss_of(rank, step) * 1e6).round() / 1e6;
                lo = lo.min(loss);
                hi = hi.max(loss);
                let out = d.push(rank, S, &bert(step, loss), ms(t0, step as u64 * 10));
                if first {
                    assert_eq!(out.len(), 1, "first occurrence shown at once");
                    assert_eq!(out[0].text, bert(0, loss));
                    first = false;
                } else {
                    assert!(out.is_empty(), "step {step} rank {rank} should be held");
                }
                all.extend(out);
            }
        }
        assert_eq!(d.next_due(), Some(ms(t0, 5000)));
        assert!(d.flush_due(ms(t0, 4999)).is_empty());
        let sum = d.flush_due(ms(t0, 5000));
        assert_eq!(sum.len(), 1);
        let s = &sum[0];
        let r = s.repeats.as_ref().unwrap();
        // Every line of the window, the first (shown at once) included.
        assert_eq!(r.count, 360);
        assert_eq!(r.ranks, vec![0, 1]);
        assert_eq!(r.ranges, vec![("loss".to_string(), lo, hi)]);
        assert_eq!(s.rank, 1);
        let last = bert(179, (loss_of(1, 179) * 1e6).round() / 1e6);
        assert_eq!(s.text, last);
        assert_eq!(
            s.to_string(),
            format!(
                "(rank 1) {last} [repeated 360x across 2 workers: ranks 0-1; loss {}–{}]",
                fmt_num(lo),
                fmt_num(hi)
            )
        );
        assert!(s.to_string().contains("; loss 0.4"));
        assert_eq!(d.active_keys(), 0);
        assert_eq!(d.next_due(), None);
        assert!(d.finish().is_empty());
        assert_eq!(all.len(), 1);
    }

    #[test]
    fn two_ranks_one_line_each_read_as_two_lines_of_two_workers() {
        // Rank 1 first, then rank 0, as `trainbook train bert --workers 2` prints its data
        // summary: the line itself at once, then one summary that counts both.
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let line = "loaded 2000 rows from mine.csv";
        let out = d.push(1, S, line, t0);
        assert_eq!(texts(&out), vec![format!("(rank 1) {line}")]);
        assert!(d.push(0, S, line, ms(t0, 3)).is_empty());
        let out = d.finish();
        assert_eq!(
            texts(&out),
            vec![format!(
                "(rank 0) {line} [repeated 2x across 2 workers: ranks 0-1]"
            )]
        );
    }

    #[test]
    fn window_boundary_starts_new_group() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        assert_eq!(d.push(0, S, &bert(0, 1.979938), t0).len(), 1);
        assert!(d.push(1, S, &bert(0, 1.272513), ms(t0, 100)).is_empty());
        assert!(d.push(0, S, &bert(1, 0.9), ms(t0, 4000)).is_empty());
        // A push after the window emits the due summary first, then the
        // line itself as the first occurrence of a new window.
        let out = d.push(1, S, &bert(1, 0.8), ms(t0, 5500));
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].to_string(),
            format!(
                "(rank 0) {} [repeated 3x across 2 workers: ranks 0-1; loss 0.9–1.979938]",
                bert(1, 0.9)
            )
        );
        assert_eq!(out[1].to_string(), format!("(rank 1) {}", bert(1, 0.8)));
        assert!(out[1].repeats.is_none());
        // New window (rank 1's line above began it): rank 1 alone is shown, rank 0 joining is
        // held, and the summary counts all three lines.
        assert_eq!(d.push(1, S, &bert(2, 0.7), ms(t0, 6000)).len(), 1);
        assert!(d.push(0, S, &bert(2, 0.75), ms(t0, 6000)).is_empty());
        assert_eq!(d.next_due(), Some(ms(t0, 10_500)));
        assert!(d.flush_due(ms(t0, 10_499)).is_empty());
        let out = d.flush_due(ms(t0, 10_500));
        assert_eq!(
            texts(&out),
            vec![format!(
                "(rank 0) {} [repeated 3x across 2 workers: ranks 0-1; loss 0.7–0.8]",
                bert(2, 0.75)
            )]
        );
    }

    #[test]
    fn disabled_passes_everything() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions {
            enabled: false,
            ..DedupOptions::default()
        });
        let mut n = 0;
        for step in 0..50 {
            for rank in 0..4 {
                let out = d.push(rank, S, &bert(step, 1.0), t0);
                assert_eq!(out.len(), 1);
                assert!(out[0].repeats.is_none());
                n += 1;
            }
        }
        assert_eq!(n, 200);
        assert_eq!(d.active_keys(), 0);
        assert!(d.finish().is_empty());
    }

    #[test]
    fn error_lines_never_held() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        // A group is being held...
        d.push(0, S, &bert(0, 1.0), t0);
        assert!(d.push(1, S, &bert(0, 2.0), t0).is_empty());
        // ...while both ranks crash with identical tracebacks.
        let tb = [
            "Traceback (most recent call last):",
            "  File \"train.py\", line 42, in <module>",
            "    loss.backward()",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        ];
        for rank in 0..2 {
            for line in tb {
                let out = d.push(rank, Stream::Stderr, line, ms(t0, 10));
                assert_eq!(out.len(), 1, "{line}");
                assert!(out[0].is_error);
                assert!(out[0].repeats.is_none());
            }
        }
        // Rust panic: message line after "panicked at" is part of the error.
        for rank in 0..2 {
            let a = d.push(
                rank,
                Stream::Stderr,
                "thread 'main' panicked at src/main.rs:2:5:",
                t0,
            );
            let b = d.push(
                rank,
                Stream::Stderr,
                "called `Option::unwrap()` on a `None` value",
                t0,
            );
            assert!(a[0].is_error && b[0].is_error);
        }
        // A normal line ends the error block and dedups normally again.
        d.push(0, Stream::Stderr, "warning: slow step 7", t0);
        assert!(d
            .push(1, Stream::Stderr, "warning: slow step 9", t0)
            .is_empty());
        let out = d.finish();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].repeats.as_ref().unwrap().count, 2);
        assert_eq!(out[1].text, "warning: slow step 9");
    }

    #[test]
    fn empty_lines_never_merged() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        for rank in 0..4 {
            for _ in 0..3 {
                let out = d.push(rank, S, "", t0);
                assert_eq!(texts(&out), vec![format!("(rank {rank}) ")]);
            }
        }
        assert_eq!(d.active_keys(), 0);
    }

    #[test]
    fn identical_warning_from_both_ranks_merges_without_ranges() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let out = d.push(0, Stream::Stderr, WEIGHTS, t0);
        assert_eq!(texts(&out), vec![format!("(rank 0) {WEIGHTS}")]);
        assert!(d.push(1, Stream::Stderr, WEIGHTS, ms(t0, 30)).is_empty());
        let out = d.finish();
        assert_eq!(out.len(), 1);
        let r = out[0].repeats.as_ref().unwrap();
        assert_eq!(
            (r.count, r.ranks.clone(), r.ranges.len()),
            (2, vec![0, 1], 0)
        );
        assert_eq!(
            out[0].to_string(),
            format!("(rank 1) {WEIGHTS} [repeated 2x across 2 workers: ranks 0-1]")
        );
    }

    #[test]
    fn the_same_line_from_1024_ranks_is_one_line_and_one_summary() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let line = |r: usize| format!("epoch 1 step 100 loss: {:.4}", 1.0 + r as f64 / 10_000.0);
        let mut shown = Vec::new();
        // All ranks within a second, as a 1,024-rank job's step log arrives.
        for r in 0..1024 {
            shown.extend(d.push(r, S, &line(r), ms(t0, r as u64 / 2)));
        }
        assert_eq!(
            texts(&shown),
            vec!["(rank 0) epoch 1 step 100 loss: 1.0000"]
        );
        let out = d.flush_due(ms(t0, 10_000));
        assert_eq!(
            texts(&out),
            vec!["(rank 1023) epoch 1 step 100 loss: 1.1023 [repeated 1024x across 1024 workers: ranks 0-1023; loss 1–1.1023]"]
        );
    }

    #[test]
    fn progress_bars_from_both_ranks() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        assert_eq!(d.push(0, Stream::Stderr, MAP0, t0).len(), 1);
        assert_eq!(d.push(0, Stream::Stderr, MAP100, ms(t0, 300)).len(), 1);
        assert!(d.push(1, Stream::Stderr, MAP0, ms(t0, 310)).is_empty());
        let other = "Map: 100%|██████████| 1000/1000 [00:00<00:00, 3521.02 examples/s]";
        assert!(d.push(1, Stream::Stderr, other, ms(t0, 600)).is_empty());
        // Stdout never merges with stderr.
        assert_eq!(d.push(1, S, MAP0, ms(t0, 700)).len(), 1);
        let out = d.flush_due(ms(t0, 6000));
        assert_eq!(
            texts(&out),
            vec![
                format!("(rank 1) {MAP0} [repeated 2x across 2 workers: ranks 0-1]"),
                format!("(rank 1) {other} [repeated 2x across 2 workers: ranks 0-1]"),
            ]
        );
    }

    #[test]
    fn resnet_epochs_four_workers() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let line = |kind: &str, r: usize| {
            format!(
                "Epoch 0-{kind} Loss: {:.4} Acc: {:.4}",
                0.6 + r as f64 / 100.0,
                0.66 + r as f64 / 100.0
            )
        };
        let mut shown = Vec::new();
        for r in 0..4 {
            shown.extend(d.push(r, S, &line("train", r), ms(t0, 10 * r as u64)));
        }
        for r in 0..4 {
            shown.extend(d.push(r, S, &line("val", r), ms(t0, 1000 + 10 * r as u64)));
        }
        assert_eq!(
            texts(&shown),
            vec![
                "(rank 0) Epoch 0-train Loss: 0.6000 Acc: 0.6600".to_string(),
                "(rank 0) Epoch 0-val Loss: 0.6000 Acc: 0.6600".to_string(),
            ]
        );
        assert_eq!(d.next_due(), Some(ms(t0, 5000)));
        let out = d.flush_due(ms(t0, 7000));
        assert_eq!(
            texts(&out),
            vec![
                "(rank 3) Epoch 0-train Loss: 0.6300 Acc: 0.6900 [repeated 4x across 4 workers: ranks 0-3; Loss 0.6–0.63, Acc 0.66–0.69]".to_string(),
                "(rank 3) Epoch 0-val Loss: 0.6300 Acc: 0.6900 [repeated 4x across 4 workers: ranks 0-3; Loss 0.6–0.63, Acc 0.66–0.69]".to_string(),
            ]
        );
    }

    #[test]
    fn summaries_in_first_occurrence_order_and_finish_flushes_all() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let keys = ["alpha step 1", "beta step 1", "gamma step 1"];
        for (i, k) in keys.iter().enumerate() {
            d.push(0, S, k, ms(t0, i as u64));
        }
        // Held in reverse order of first occurrence.
        for k in keys.iter().rev() {
            assert!(d.push(2, S, k, ms(t0, 100)).is_empty());
        }
        assert!(d.push(5, S, "alpha step 2", ms(t0, 200)).is_empty());
        assert_eq!(d.held_keys(), 3);
        assert_eq!(d.next_due(), Some(t0 + Duration::from_secs(5)));
        let out = d.finish();
        assert_eq!(
            texts(&out),
            vec![
                "(rank 5) alpha step 2 [repeated 3x across 3 workers: ranks 0,2,5]".to_string(),
                "(rank 2) beta step 1 [repeated 2x across 2 workers: ranks 0,2]".to_string(),
                "(rank 2) gamma step 1 [repeated 2x across 2 workers: ranks 0,2]".to_string(),
            ]
        );
        assert_eq!((d.active_keys(), d.held_keys(), d.next_due()), (0, 0, None));
        assert!(d.finish().is_empty());
        // After finish, the next line is a fresh first occurrence.
        assert_eq!(d.push(2, S, "alpha step 3", ms(t0, 300)).len(), 1);
    }

    /// A distinct digit-free, non-hex word per `i`.
    fn word(mut i: usize) -> String {
        let mut s = String::from("k");
        loop {
            s.push((b'g' + (i % 20) as u8) as char);
            i /= 20;
            if i == 0 {
                return s;
            }
        }
    }

    #[test]
    fn bounded_memory_with_advancing_time() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        let mut summaries = 0;
        let mut max_active = 0;
        for i in 0..100_000usize {
            let now = ms(t0, i as u64);
            let text = format!("msg {} value={}", word(i), i);
            summaries += d
                .push(0, S, &text, now)
                .iter()
                .filter(|s| s.repeats.is_some())
                .count();
            summaries += d
                .push(1, S, &text, now)
                .iter()
                .filter(|s| s.repeats.is_some())
                .count();
            if i % 1000 == 0 {
                summaries += d.flush_due(now).len();
            }
            max_active = max_active.max(d.active_keys());
        }
        assert!(max_active <= 5001, "max_active = {max_active}");
        assert!(d.index.len() <= 5001 && d.held_ids.len() <= 5001);
        summaries += d.finish().len();
        assert_eq!(summaries, 100_000);
        assert_eq!(
            (d.active_keys(), d.index.len(), d.held_ids.len()),
            (0, 0, 0)
        );
    }

    #[test]
    fn bounded_memory_under_flood_at_one_instant() {
        let t0 = Instant::now();
        let mut d = Deduplicator::with_max_keys(DedupOptions::default(), 100);
        let mut summaries = Vec::new();
        for i in 0..10_000usize {
            let text = format!("line {} {i}", word(i));
            for rank in 0..2 {
                summaries.extend(
                    d.push(rank, S, &text, t0)
                        .into_iter()
                        .filter(|s| s.repeats.is_some()),
                );
            }
            assert!(d.active_keys() <= 100);
        }
        summaries.extend(d.finish());
        assert_eq!(summaries.len(), 10_000);
        assert!(summaries
            .iter()
            .all(|s| s.repeats.as_ref().unwrap().count == 2));
    }

    #[test]
    fn time_going_backwards_is_clamped() {
        let t0 = Instant::now();
        let mut d = Deduplicator::new(DedupOptions::default());
        d.push(0, S, "hello world", ms(t0, 10_000));
        assert!(d.push(1, S, "hello world", t0).is_empty());
        assert!(d.flush_due(ms(t0, 14_999)).is_empty());
        assert_eq!(d.flush_due(ms(t0, 15_000)).len(), 1);
    }
}
