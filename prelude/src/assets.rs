//! Where trainbook's offline model and data live (fetched by `make setup`, see
//! scripts/fetch-data.sh): `$TRAINBOOK_DATA`, else `.data/` of this checkout.

use std::path::{Path, PathBuf};

pub fn data_dir() -> PathBuf {
    let dir = std::env::var_os("TRAINBOOK_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(".data")
        });
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// The pretrained all-MiniLM-L6-v2 directory (config.json, model.safetensors, tokenizer files).
pub fn minilm_dir() -> PathBuf {
    data_dir().join("models/all-MiniLM-L6-v2")
}

/// The Rotten Tomatoes snippets table (text, label = fresh/rotten, movie).
pub fn rotten_tomatoes_csv() -> PathBuf {
    data_dir().join("datasets/rotten_tomatoes/reviews.csv")
}
