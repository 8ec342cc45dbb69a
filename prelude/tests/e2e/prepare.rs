//! `trainbook prepare` and jobs reading a prepared corpus, through the command line: a prepared
//! corpus trains exactly like the raw text it was made from, and bad input is one clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use trainbook::frames::DataType;

use crate::common::last_json;

fn trainbook(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainbook"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn temp(name: &str) -> PathBuf {
    let d = crate::common::scratch(&format!("prepare-{name}"));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Rank 0's training losses, in step order.
fn losses(run_dir: &str) -> Vec<f64> {
    let df =
        trainbook::engine::checkpoint::read_metrics(&Path::new(run_dir).join("metrics.parquet"))
            .unwrap();
    let int = |name: &str| -> Vec<i64> {
        let c = df.column(name).unwrap().cast(&DataType::Int64).unwrap();
        c.i64().unwrap().into_no_null_iter().collect()
    };
    let (rank, step) = (int("rank"), int("step"));
    let names: Vec<String> = df
        .column("name")
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .map(|n| n.unwrap_or_default().to_string())
        .collect();
    let values: Vec<f64> = df
        .column("value")
        .unwrap()
        .f64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let mut rows: Vec<(i64, f64)> = (0..df.height())
        .filter(|&i| rank[i] == 0 && names[i] == "loss")
        .map(|i| (step[i], values[i]))
        .collect();
    rows.sort_by_key(|r| r.0);
    rows.into_iter().map(|r| r.1).collect()
}

/// `d/runs` and `d/cache` as the job's runs and prepared-corpus cache.
fn job_env(d: &Path) -> [(&'static str, PathBuf); 2] {
    [
        ("TRAINBOOK_RUNS", d.join("runs")),
        ("TRAINBOOK_CACHE", d.join("cache")),
    ]
}

/// 20 steps of tiny bert-mlm on 2 CPU workers on `data` (and `extra` options), which must
/// succeed: rank 0's losses and the run directory.
fn train_20_steps(data: &Path, extra: &[&str], env: &[(&str, PathBuf)]) -> (Vec<f64>, PathBuf) {
    let mut args: Vec<&str> =
        "train bert-mlm --preset tiny --workers 2 --device cpu --max-steps 20 --json"
            .split(' ')
            .collect();
    args.extend(["--data", data.to_str().unwrap()]);
    args.extend(extra);
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    let s = last_json(&trainbook(&args, &env));
    assert_eq!(s["status"], "succeeded", "{s}");
    assert_eq!(s["steps"], 20, "{s}");
    let run_dir = s["run_dir"].as_str().unwrap();
    (losses(run_dir), PathBuf::from(run_dir))
}

/// The first 3,000 lines of the Brown corpus in `d/corpus.txt`, prepared into `d/prepared`
/// by `trainbook prepare --json`, whose output is returned too.
fn prepared_brown(d: &Path) -> (PathBuf, PathBuf, Output) {
    let text = std::fs::read_to_string(trainbook::recipes::assets::brown_txt()).unwrap();
    let corpus = d.join("corpus.txt");
    let head: Vec<&str> = text.lines().take(3000).collect();
    std::fs::write(&corpus, head.join("\n")).unwrap();
    let prepared = d.join("prepared");
    let (c, p) = (corpus.to_str().unwrap(), prepared.to_str().unwrap());
    let out = trainbook(&["prepare", "--data", c, "--out", p, "--json"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (corpus, prepared, out)
}

/// 20 steps of tiny bert-mlm on 2 workers from a prepared corpus and from the raw text it was
/// made from (prepared by the job into its cache) give the same losses. The blocks themselves
/// equal the in-memory grouping's (text::corpus's unit tests), and masks depend only on the
/// block, so these are the losses of the in-memory path too.
#[test]
fn a_prepared_corpus_trains_like_its_raw_text() {
    let d = temp("equal");
    let (corpus, prepared, out) = prepared_brown(&d);
    let summary = last_json(&out);
    assert!(summary["texts"].as_u64().unwrap() > 2500, "{summary}");
    assert_eq!(summary["shards"], 1);

    let env = job_env(&d);
    let train = |data: &Path| train_20_steps(data, &["--epochs", "2"], &env).0;
    let (from_prepared, from_raw) = (train(&prepared), train(&corpus));
    assert_eq!(from_prepared.len(), 20);
    for (step, (a, b)) in from_prepared.iter().zip(&from_raw).enumerate() {
        assert!((a - b).abs() <= 1e-6, "step {step}: {a} vs {b}");
    }
    // The raw text was prepared once, into the cache.
    assert_eq!(
        std::fs::read_dir(d.join("cache/prepared")).unwrap().count(),
        1
    );
    std::fs::remove_dir_all(d).ok();
}

/// Two HDF5 pre-training shards of 200 sequences of 32 tokens in `d/books_wiki`, in NVIDIA's
/// layout (int32, gzip); `leave_out` drops a dataset of the second, `seq` is the second's
/// length.
fn hdf5_shards(d: &Path, name: &str, second_seq: usize, leave_out: Option<&str>) -> PathBuf {
    use trainbook::recipes::text::hdf5_shards::write_example_shard;
    let dir = d.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    write_example_shard(&dir.join("train_0.hdf5"), 200, 32, 5, 0, None).unwrap();
    write_example_shard(&dir.join("train_1.hdf5"), 200, second_seq, 5, 1, leave_out).unwrap();
    dir
}

/// HDF5 shards prepared into records train exactly like the shards themselves: 20 steps of
/// tiny bert-mlm on 2 workers give the same losses from the shards, from the records
/// `trainbook prepare` put in the cache (where a job given the shards finds them) and from
/// records prepared into --out. That the records hold the shards' every array is
/// text::corpus::records' unit test.
#[test]
fn hdf5_records_train_like_the_shards() {
    let d = temp("hdf5");
    let shards = hdf5_shards(&d, "books_wiki", 32, None);
    let env = job_env(&d);
    let train = |data: &Path| {
        let (losses, run_dir) = train_20_steps(
            data,
            &["--max-length", "32", "--train-rows", "100000"],
            &env,
        );
        let log = std::fs::read_to_string(run_dir.join("logs/rank0.log")).unwrap();
        assert!(
            log.contains("380 train / 20 eval samples of 32 tokens"),
            "{log}"
        );
        (losses, log)
    };
    let prepare = |extra: &[&str]| {
        let mut args = vec!["prepare", "--data", shards.to_str().unwrap(), "--json"];
        args.extend(extra);
        let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        let out = trainbook(&args, &env);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("400 sequences of 32 tokens"), "{stdout}");
        let s = last_json(&out);
        assert_eq!(
            (s["texts"].as_u64(), s["shards"].as_u64()),
            (Some(400), Some(2))
        );
        // Each sequence's arrays and its checksum, 4 bytes a value.
        assert_eq!(
            s["disk_bytes"].as_u64(),
            Some(400 * (3 * 32 + 2 * 5 + 2) * 4)
        );
        PathBuf::from(s["dir"].as_str().unwrap())
    };

    let (direct, log) = train(&shards);
    assert!(log.contains("reading the HDF5 shards themselves"), "{log}");
    assert!(log.contains("HDF5 shards in"), "{log}");
    // Into the cache: a job given the shards reads the records.
    let cached = prepare(&[]);
    assert!(
        cached.starts_with(d.join("cache/prepared")),
        "{}",
        cached.display()
    );
    let (from_cache, log) = train(&shards);
    assert!(log.contains("records of the HDF5 shards in"), "{log}");
    assert!(!log.contains("reading the HDF5 shards themselves"), "{log}");
    // Into --out: a job given the records.
    let out = d.join("records");
    assert_eq!(prepare(&["--out", out.to_str().unwrap()]), out);
    let (from_out, _) = train(&out);
    assert_eq!(direct.len(), 20);
    for (name, losses) in [("cache", &from_cache), ("--out", &from_out)] {
        for (step, (a, b)) in direct.iter().zip(losses).enumerate() {
            assert!((a - b).abs() <= 1e-6, "{name}, step {step}: {a} vs {b}");
        }
    }
    std::fs::remove_dir_all(d).ok();
}

#[test]
fn bad_input_to_prepare_and_to_a_job_is_one_clear_error() {
    let d = temp("bad");
    let table = d.join("table.csv");
    std::fs::write(&table, "id,body\n1,some text\n").unwrap();
    let expect = |out: Output, needles: &[&str]| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let errors = stderr.lines().filter(|l| l.starts_with("error")).count();
        assert_eq!(errors, 1, "{stderr}");
        for n in needles {
            assert!(stderr.contains(n), "expected {n:?} in {stderr}");
        }
    };
    let out = d.join("out");
    let (t, o) = (table.to_str().unwrap(), out.to_str().unwrap());
    expect(
        trainbook(&["prepare", "--data", t, "--out", o], &[]),
        &["table.csv", "no column 'text'", "text_column"],
    );
    expect(
        trainbook(
            &["prepare", "--data", t, "--out", o, "--eval-fraction", "1.5"],
            &[],
        ),
        &["eval_fraction 1.5"],
    );
    // A directory that is neither a corpus nor a prepared set.
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    expect(
        trainbook(
            &[
                "train",
                "bert-mlm",
                "--preset",
                "tiny",
                "--data",
                empty.to_str().unwrap(),
            ],
            &[("TRAINBOOK_RUNS", &d)],
        ),
        &["holds no text file"],
    );
    // HDF5 shards: a directory without any, a shard missing an array, shards of two lengths.
    std::fs::write(empty.join("notes.md"), "no shards").unwrap();
    let prepare = |data: &Path| trainbook(&["prepare", "--data", data.to_str().unwrap()], &[]);
    expect(
        prepare(&empty),
        &["empty holds no HDF5 pre-training shards", "give --out DIR"],
    );
    let e = empty.to_str().unwrap();
    expect(
        trainbook(&["prepare", "--data", e, "--out", o], &[]),
        &[
            "holds no text file",
            "no HDF5 pre-training shards (.hdf5, .h5)",
        ],
    );
    expect(
        prepare(&hdf5_shards(&d, "missing", 32, Some("masked_lm_ids"))),
        &["train_1.hdf5", "no dataset 'masked_lm_ids'", "input_ids"],
    );
    expect(
        prepare(&hdf5_shards(&d, "lengths", 64, None)),
        &[
            "train_1.hdf5 holds 64-token sequences",
            "train_0.hdf5 holds 32",
            "one set of shards",
        ],
    );
    std::fs::remove_dir_all(d).ok();
}

/// A job on a prepared corpus whose worker is killed mid-epoch restarts from its newest step
/// checkpoint, continues at the exact next block, and ends with the parameters of the run that
/// was never interrupted.
#[test]
fn a_killed_job_on_a_prepared_corpus_resumes_at_the_next_block() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use trainbook::{Configure, ConfigureTraining, JobSpec, JobStatus};

    let d = temp("resume");
    let (_, prepared, _) = prepared_brown(&d);
    // 120 steps in one epoch of 1,920 blocks, a step checkpoint every 40.
    let spec = || {
        JobSpec::new("bert-mlm")
            .workers(2)
            .preset("tiny")
            .device(trainbook::DeviceRequest::Cpu)
            .runs_root(d.join("runs"))
            .data(prepared.display().to_string())
            .train_rows(1920)
            .max_steps(120)
            .checkpoint_every(40)
    };
    let job = trainbook::launch(spec().max_failures(1)).unwrap();
    assert!(
        crate::common::wait_until(std::time::Duration::from_secs(120), || job
            .progress()
            .is_some_and(|p| p.step >= 60)),
        "the job never reached step 60"
    );
    kill(Pid::from_raw(job.pids()[1] as i32), Signal::SIGKILL).unwrap();
    let r = job.wait().expect("the job restarts and succeeds");
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.restarts.len(), 1, "{:?}", r.restarts);
    assert!(r.restarts[0].resumed_step >= 40, "{:?}", r.restarts[0]);
    let straight = trainbook::fit(spec()).unwrap();
    assert_eq!(r.steps, straight.steps);
    let diff = crate::common::max_abs_diff(
        &crate::common::last_model(&r),
        &crate::common::last_model(&straight),
    );
    assert!(diff <= 1e-5, "max abs parameter difference {diff}");
    std::fs::remove_dir_all(d).ok();
}
