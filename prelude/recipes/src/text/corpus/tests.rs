use super::*;
use crate::text::mlm::group_texts;
use crate::text::wordpiece::read_texts;

fn tokenizer() -> (TextTokenizer, PathBuf) {
    let dir = crate::assets::minilm_dir();
    (TextTokenizer::from_model_dir(&dir, 1 << 20).unwrap(), dir)
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("trainbook-corpus-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The first `lines` lines of the offline Brown corpus.
fn brown(dir: &Path, lines: usize) -> PathBuf {
    let text = std::fs::read_to_string(crate::assets::brown_txt()).unwrap();
    let path = dir.join("brown.txt");
    let head: Vec<&str> = text.lines().take(lines).collect();
    std::fs::write(&path, head.join("\n")).unwrap();
    path
}

/// Batches of 16 KB: many per test corpus.
fn settings(eval_every: usize, shard_bytes: u64) -> PrepareSettings {
    PrepareSettings {
        eval_every,
        shard_bytes,
        batch_bytes: 16 << 10,
    }
}

fn prepare_into(
    corpus: &Corpus,
    out: &Path,
    s: &PrepareSettings,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Index> {
    let (tok, dir) = tokenizer();
    let m = prepare::manifest(corpus, &tok, &dir, s)?;
    prepare::prepare(corpus, &tok, &m, s.batch_bytes, out, progress)
}

/// The blocks the in-memory path makes (every `every`-th text held out, all ids
/// concatenated and cut), for both splits.
fn in_memory_blocks(path: &Path, every: usize, len: usize) -> [Vec<Vec<i64>>; 2] {
    let (tok, _) = tokenizer();
    let texts = read_texts(path, None).unwrap();
    let (eval, train): (Vec<_>, Vec<_>) = texts
        .iter()
        .enumerate()
        .partition(|(i, _)| i % every == every - 1);
    let blocks = |part: Vec<(usize, &String)>| {
        let refs: Vec<&str> = part.iter().map(|(_, t)| t.as_str()).collect();
        let enc = tok.encode_batch(&refs).unwrap();
        group_texts(
            enc.iter()
                .map(|e| e.ids.iter().map(|&i| i as u32).collect::<Vec<u32>>()),
            len,
        )
    };
    [blocks(train), blocks(eval)]
}

/// The prepared, memory-mapped path gives exactly the in-memory path's blocks, in both splits,
/// with shards far smaller than the corpus (so blocks run across shard boundaries).
#[test]
fn mapped_blocks_equal_the_in_memory_blocks() {
    let d = temp("equal");
    let path = brown(&d, 3000);
    let out = d.join("prepared");
    let index = prepare_into(
        &Corpus::open(&path, "text").unwrap(),
        &out,
        &settings(20, 16 << 10),
        &mut |_| Ok(()),
    )
    .unwrap();
    assert!(index.shards.len() > 5, "{} shards", index.shards.len());
    let set = PreparedCorpus::open(&out).unwrap();
    for len in [32, 128] {
        let [train, eval] = in_memory_blocks(&path, 20, len);
        for (split, want) in [(Split::Train, train), (Split::Eval, eval)] {
            let s = set.stream(split);
            assert_eq!(s.blocks(len), want.len(), "{split:?} {len}");
            for (k, b) in want.iter().enumerate() {
                assert_eq!(&s.block(k, len).unwrap(), b, "{split:?} block {k} of {len}");
            }
        }
    }
    std::fs::remove_dir_all(d).ok();
}

/// A preparation stopped midway leaves no index (a job refuses it, saying how to finish) and
/// continues where it stopped, ending with the same shards as one that never stopped.
#[test]
fn a_stopped_preparation_continues_and_ends_the_same() {
    let d = temp("resume");
    let path = brown(&d, 4000);
    let corpus = Corpus::open(&path, "text").unwrap();
    let s = settings(20, 8 << 10);
    let straight = prepare_into(&corpus, &d.join("straight"), &s, &mut |_| Ok(())).unwrap();

    let out = d.join("stopped");
    let mut calls = 0;
    let e = prepare_into(&corpus, &out, &s, &mut |_| {
        calls += 1;
        anyhow::ensure!(calls < 4, "stopped by the test");
        Ok(())
    });
    assert!(e.is_err());
    let e = PreparedCorpus::open(&out).err().unwrap().to_string();
    assert!(
        e.contains("unfinished") && e.contains("trainbook prepare"),
        "{e}"
    );

    let mut resumed = 0;
    let index = prepare_into(&corpus, &out, &s, &mut |p| {
        resumed = p.resumed_texts;
        Ok(())
    })
    .unwrap();
    assert!(
        resumed > 0 && resumed < index.texts,
        "resumed after {resumed} texts"
    );
    assert_eq!(index.shards, straight.shards);
    // Done: preparing again reads nothing.
    let again = prepare_into(&corpus, &out, &s, &mut |_| panic!("nothing to do")).unwrap();
    assert_eq!(again, index);
    std::fs::remove_dir_all(d).ok();
}

/// The token and record files of a prepared directory, by name (the index holds timings).
fn shard_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tokens") || n.ends_with(".docs") || n.starts_with("shard-"))
        .map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap()))
        .collect();
    files.sort();
    files
}

/// Slices of a preparation (each process a share of the shards, as the ranks of a multi-node
/// job run it) end with exactly the files of a whole preparation; the slice that ends last
/// writes the index, the others say which slices are still to run; a stopped slice continues.
#[test]
fn slices_prepared_apart_make_the_whole_set() {
    let d = temp("slices");
    let path = brown(&d, 3000);
    let corpus = Corpus::open(&path, "text").unwrap();
    let s = settings(20, 16 << 10);
    let (tok, dir) = tokenizer();
    let m = prepare::manifest(&corpus, &tok, &dir, &s).unwrap();
    let whole = prepare_into(&corpus, &d.join("whole"), &s, &mut |_| Ok(())).unwrap();
    assert!(whole.shards.len() >= 6, "{} shards", whole.shards.len());

    let out = d.join("sliced");
    let run = |index, progress: &mut dyn FnMut(&Progress) -> Result<()>| {
        let slice = prepare::Slice { index, count: 3 };
        prepare::prepare_slice(&corpus, &tok, &m, s.batch_bytes, &out, slice, progress)
    };
    // Slice 2 stopped midway, then slice 0 alone: two slices pending.
    let mut calls = 0;
    assert!(run(2, &mut |_| {
        calls += 1;
        anyhow::ensure!(calls < 8, "stopped by the test");
        Ok(())
    })
    .is_err());
    let pending = run(0, &mut |_| Ok(())).unwrap().unwrap_err();
    assert_eq!(pending.slices, vec![1, 2]);
    assert_eq!(pending.shards, whole.shards.len());
    assert!(!out.join(layout::INDEX).exists());
    // Slices 1 and 2 side by side (2 continues after its finished shards): the last writes the
    // index.
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| run(1, &mut |_| Ok(())).unwrap());
        let b = scope.spawn(|| run(2, &mut |_| Ok(())).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let index = a.or(b).expect("the last slice to end writes the index");
    assert_eq!(index.shards, whole.shards);
    assert_eq!(
        (index.texts, index.train_tokens),
        (whole.texts, whole.train_tokens)
    );
    assert_eq!(shard_files(&out), shard_files(&d.join("whole")));
    let set = PreparedCorpus::open(&out).unwrap();
    assert_eq!(set.index.shards, whole.shards);
    // Done: any slice returns the index at once.
    assert_eq!(
        run(0, &mut |_| panic!("nothing to do")).unwrap().unwrap(),
        index
    );
    let e = prepare::prepare_slice(
        &corpus,
        &tok,
        &m,
        s.batch_bytes,
        &out,
        prepare::Slice { index: 3, count: 3 },
        &mut |_| Ok(()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("slice 3/3 does not exist"), "{e}");
    std::fs::remove_dir_all(d).ok();
}

#[test]
fn damaged_or_foreign_sets_are_refused_with_the_fix() {
    let d = temp("bad");
    let path = brown(&d, 600);
    let corpus = Corpus::open(&path, "text").unwrap();
    let out = d.join("prepared");
    let s = settings(20, 4 << 10);
    let index = prepare_into(&corpus, &out, &s, &mut |_| Ok(())).unwrap();

    // Another tokenizer's fingerprint.
    let (tok, tok_dir) = tokenizer();
    let set = PreparedCorpus::open(&out).unwrap();
    set.check_tokenizer(tok.fingerprint(), &tok_dir).unwrap();
    let e = set
        .check_tokenizer(tok.fingerprint() ^ 1, Path::new("/other/tokenizer"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("another tokenizer") && e.contains("--tokenizer /other/tokenizer"),
        "{e}"
    );

    // Other settings into the same directory.
    let e = prepare_into(&corpus, &out, &settings(10, 4 << 10), &mut |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("other settings") && e.contains("another --out"),
        "{e}"
    );

    // A flipped byte: found when a block first reads that shard.
    let victim = layout::tokens_path(&out, Split::Train, 1);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&victim, &bytes).unwrap();
    let set = PreparedCorpus::open(&out).unwrap();
    let first_in_shard_1 = index.shards[0].train.tokens as usize / 8 + 1;
    let e = set
        .stream(Split::Train)
        .block(first_in_shard_1, 8)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train-00001.tokens")
            && e.contains("checksum")
            && e.contains("trainbook prepare"),
        "{e}"
    );

    // A truncated shard: refused when the set is opened.
    bytes.truncate(bytes.len() - 2);
    std::fs::write(&victim, &bytes).unwrap();
    let e = PreparedCorpus::open(&out).err().unwrap().to_string();
    assert!(
        e.contains("train-00001.tokens") && e.contains("truncated"),
        "{e}"
    );

    // Not a prepared set at all.
    let e = PreparedCorpus::open(&d).err().unwrap().to_string();
    assert!(
        e.contains("not a prepared corpus") && e.contains("trainbook prepare"),
        "{e}"
    );
    std::fs::remove_dir_all(d).ok();
}
