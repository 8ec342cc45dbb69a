use super::*;
use crate::text::hdf5_shards::write_example_shard;
use crate::text::mlm_source;

const SEQ: usize = 32;
const MAX_PRED: usize = 5;
const VOCAB: i64 = 30522;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("trainbook-records-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Three shards in `d/shards`: 300, 75 (without next-sentence labels) and 137 sequences.
fn shards(d: &Path) -> PathBuf {
    let dir = d.join("shards");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, n, seed, leave_out) in [
        ("train_0.hdf5", 300, 1, None),
        ("train_1.hdf5", 75, 2, Some("next_sentence_labels")),
        ("train_2.h5", 137, 3, None),
    ] {
        write_example_shard(&dir.join(name), n, SEQ, MAX_PRED, seed, leave_out).unwrap();
    }
    dir
}

/// Every dataset of every shard, read whole with the HDF5 library: (shard, field) -> rows.
fn read_whole(dir: &Path) -> Vec<Vec<Option<Vec<Vec<i64>>>>> {
    hdf5_shards::shard_files(dir)
        .iter()
        .map(|path| {
            let f = hdf5::File::open(path).unwrap();
            FIELDS
                .iter()
                .map(|field| {
                    let ds = f.dataset(field).ok()?;
                    let rows = if ds.ndim() == 1 {
                        ds.read_1d::<i64>()
                            .unwrap()
                            .iter()
                            .map(|&v| vec![v])
                            .collect()
                    } else {
                        let a = ds.read_2d::<i64>().unwrap();
                        a.rows().into_iter().map(|r| r.to_vec()).collect()
                    };
                    Some(rows)
                })
                .collect()
        })
        .collect()
}

/// Every array of every record equals the shards' (read whole by the HDF5 library), and every
/// sequence a job reads from the records equals the one it reads from the shards; slabs far
/// smaller than a shard (chunks of 16, 24 and 40 rows: slabs of 240) so that a shard is read
/// in several, the last one short.
#[test]
fn records_hold_exactly_the_shards_arrays() {
    let d = temp("equal");
    let dir = shards(&d);
    let out = d.join("records");
    let mut calls = Vec::new();
    let index = prepare(&dir, &out, 1, &mut |p| {
        calls.push(p.clone());
        Ok(())
    })
    .unwrap();
    let m = &index.manifest;
    assert_eq!(
        (index.sequences, m.seq_len, m.max_pred),
        (512, SEQ, MAX_PRED)
    );
    // The arrays, then the record's checksum.
    assert_eq!(m.record_bytes, (3 * SEQ + 2 * MAX_PRED + 1) * 4 + 4);
    let names: Vec<&str> = m.shards.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["train_0.hdf5", "train_1.hdf5", "train_2.h5"]);
    let nsp: Vec<bool> = m.shards.iter().map(|s| s.next_sentence_labels).collect();
    assert_eq!(nsp, [true, false, true]);
    for s in &m.shards {
        let meta = std::fs::metadata(dir.join(&s.name)).unwrap();
        assert_eq!(s.bytes, meta.len());
        assert!(s.modified_ns.is_some());
    }
    // Progress after each slab (2 + 2 + 1: the second shard, without next-sentence labels,
    // is read in slabs of 48) and at the end, growing to the whole input.
    assert_eq!(calls.len(), 6, "{calls:?}");
    assert!(calls.windows(2).all(|w| w[0].bytes <= w[1].bytes));
    let last = calls.last().unwrap();
    assert_eq!((last.bytes, last.texts), (last.total_bytes, 512));

    // The records' bytes, array by array.
    let whole = read_whole(&dir);
    for (k, f) in index.files.iter().enumerate() {
        let bytes = std::fs::read(out.join(&f.file)).unwrap();
        assert_eq!(bytes.len(), f.sequences as usize * m.record_bytes);
        for (r, record) in bytes.chunks_exact(m.record_bytes).enumerate() {
            let (body, crc) = record.split_at(m.record_bytes - 4);
            assert_eq!(crc32c::crc32c(body).to_le_bytes(), crc, "shard {k} row {r}");
            for (a, array) in m.arrays[..FIELDS.len()].iter().enumerate() {
                let n = array.shape[0];
                let got: Vec<i64> = record[array.offset..array.offset + 4 * n]
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect();
                match &whole[k][a] {
                    Some(rows) => assert_eq!(got, rows[r], "shard {k} row {r} {}", array.name),
                    None => assert_eq!(got, vec![0; n], "shard {k} row {r} {}", array.name),
                }
            }
        }
    }

    // The sequences a job reads.
    let (from_shards, from_records) = (
        Hdf5Shards::open(&dir).unwrap(),
        Hdf5Records::open(&out).unwrap(),
    );
    assert_eq!(from_records.rows, from_shards.rows);
    for i in 0..from_shards.rows {
        let (a, b) = (
            from_shards.get(i, VOCAB).unwrap(),
            from_records.get(i, VOCAB).unwrap(),
        );
        assert_eq!(a.input_ids, b.input_ids, "sequence {i}");
        assert_eq!(a.input_mask, b.input_mask, "sequence {i}");
        assert_eq!(a.segment_ids, b.segment_ids, "sequence {i}");
        assert_eq!(a.labels, b.labels, "sequence {i}");
        assert_eq!(a.next_sentence_label, b.next_sentence_label, "sequence {i}");
    }
    assert!(from_records.get(512, VOCAB).is_err());
    // A vocabulary too small for the ids: the records file is named.
    let e = from_records.get(0, 500).unwrap_err().to_string();
    assert!(
        e.contains("records-00000.bin") && e.contains("vocabulary"),
        "{e}"
    );
    std::fs::remove_dir_all(d).ok();
}

fn text_settings(max_length: usize) -> trainbook_api::plumbing::settings::TextSettings {
    trainbook_api::plumbing::settings::TextSettings {
        max_length,
        padding: trainbook_api::Padding::Dynamic,
        text_column: "text".into(),
        label_column: "label".into(),
        text_pair_column: None,
        eval_fraction: None,
        eval_data: None,
        from_scratch: false,
        random_init: false,
    }
}

/// A job's training and held-out samples (every 20th sequence held out) are the same read from
/// the records as from the shards; a stopped preparation continues after its whole files and
/// ends with the same records; a job refuses unfinished records and another max_length.
#[test]
fn a_job_reads_the_same_samples_from_the_records_and_a_stopped_preparation_resumes() {
    let d = temp("job");
    let dir = shards(&d);
    let out = d.join("records");
    let straight = prepare(&dir, &out, SLAB_ROWS, &mut |_| Ok(())).unwrap();
    // Again: nothing to do.
    let mut calls = 0;
    let again = prepare(&dir, &out, SLAB_ROWS, &mut |_| {
        calls += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!((again, calls), (straight.clone(), 0));

    let tok_dir = crate::assets::minilm_dir();
    let tok = crate::text::tokenizer::TextTokenizer::from_model_dir(&tok_dir, 1 << 20).unwrap();
    let samples = |data: &Path, max_length: usize| {
        mlm_source::train_and_eval(
            data.to_str().unwrap(),
            (None, None),
            &text_settings(max_length),
            &tok,
            &tok_dir,
            &|_| {},
        )
    };
    let (shard_train, shard_eval) = samples(&dir, SEQ).unwrap();
    let (record_train, record_eval) = samples(&out, SEQ).unwrap();
    assert!(record_train
        .describe()
        .contains("records of the HDF5 shards in"));
    assert!(shard_train.describe().starts_with("HDF5 shards in"));
    assert_eq!((shard_train.count, shard_eval.count), (487, 25));
    for (a, b) in [(&shard_train, &record_train), (&shard_eval, &record_eval)] {
        assert_eq!(a.count, b.count);
        for k in 0..a.count {
            let (mlm_source::Sample::Masked(x), mlm_source::Sample::Masked(y)) =
                (a.get(k, VOCAB).unwrap(), b.get(k, VOCAB).unwrap())
            else {
                panic!("masked sequences expected");
            };
            assert_eq!(
                (x.input_ids, x.input_mask, x.segment_ids, x.labels),
                (y.input_ids, y.input_mask, y.segment_ids, y.labels),
                "sample {k}"
            );
        }
    }
    let e = samples(&out, 64).err().unwrap().to_string();
    assert!(
        e.contains("32-token sequences") && e.contains("--max-length 32"),
        "{e}"
    );

    // Stopped after the first file: no index, a job says how to finish.
    let stopped = d.join("stopped");
    let mut slabs = 0;
    let e = prepare(&dir, &stopped, SLAB_ROWS, &mut |_| {
        slabs += 1;
        anyhow::ensure!(slabs < 2, "stopped by the test");
        Ok(())
    });
    assert!(e.is_err());
    assert!(stopped.join("records-00000.bin").is_file());
    assert!(!stopped.join("records-00001.bin").exists());
    let e = samples(&stopped, SEQ).err().unwrap().to_string();
    assert!(
        e.contains("unfinished") && e.contains("trainbook prepare"),
        "{e}"
    );
    // A half-written file a killed preparation left is removed.
    std::fs::write(stopped.join("records-00001.bin.tmp-1"), b"half").unwrap();
    let mut resumed = 0;
    let index = prepare(&dir, &stopped, SLAB_ROWS, &mut |p| {
        resumed = p.resumed_texts;
        Ok(())
    })
    .unwrap();
    assert_eq!(resumed, 300);
    assert_eq!(index.files, straight.files);
    assert!(!stopped.join("records-00001.bin.tmp-1").exists());
    std::fs::remove_dir_all(d).ok();
}

/// A directory without shards, a shard missing an array, shards of different lengths: one
/// error each, naming the files and the fix.
#[test]
fn bad_shards_are_one_clear_error() {
    let d = temp("bad");
    let out = d.join("out");
    let err = |dir: &Path| {
        format!(
            "{:#}",
            prepare(dir, &out, SLAB_ROWS, &mut |_| Ok(())).unwrap_err()
        )
    };
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("notes.md"), "no shards here").unwrap();
    let e = err(&empty);
    assert!(
        e.contains("empty") && e.contains("no .hdf5 or .h5 file"),
        "{e}"
    );

    let missing = d.join("missing");
    std::fs::create_dir_all(&missing).unwrap();
    write_example_shard(&missing.join("a.hdf5"), 20, SEQ, MAX_PRED, 1, None).unwrap();
    write_example_shard(
        &missing.join("b.hdf5"),
        20,
        SEQ,
        MAX_PRED,
        2,
        Some("masked_lm_ids"),
    )
    .unwrap();
    let e = err(&missing);
    assert!(
        e.contains("b.hdf5") && e.contains("no dataset 'masked_lm_ids'") && e.contains("input_ids"),
        "{e}"
    );

    let lengths = d.join("lengths");
    std::fs::create_dir_all(&lengths).unwrap();
    write_example_shard(&lengths.join("a.hdf5"), 20, SEQ, MAX_PRED, 1, None).unwrap();
    write_example_shard(&lengths.join("b.hdf5"), 20, 2 * SEQ, MAX_PRED, 2, None).unwrap();
    let e = err(&lengths);
    assert!(
        e.contains("b.hdf5 holds 64-token sequences")
            && e.contains("a.hdf5 holds 32")
            && e.contains("one set of shards"),
        "{e}"
    );
    // Nothing was written for any of them.
    assert!(!out.join(INDEX).exists());
    std::fs::remove_dir_all(d).ok();
}
