//! Text-classification datasets from parquet, CSV/TSV or JSON-lines files (polars): a text
//! column (and for sentence-pair tasks such as MRPC a second one) and a label column, string
//! labels mapped to ids (sorted, and reported), selections like the reference's
//! `select(range(1000))` and seeded train/test splits.

use std::path::Path;

use anyhow::{bail, Context, Result};
use polars::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Texts with integer labels, and the names of those labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextExamples {
    pub texts: Vec<String>,
    /// The second text of each example in a sentence-pair task; empty otherwise.
    pub pairs: Vec<String>,
    pub labels: Vec<i64>,
    /// `label_names[id]`; integers become "0", "1", ...
    pub label_names: Vec<String>,
    /// Rows skipped because the text or label was missing.
    pub skipped: usize,
}

impl TextExamples {
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The first `n` rows (the reference's `select(range(n))`).
    pub fn first(mut self, n: usize) -> Self {
        self.texts.truncate(n);
        self.pairs.truncate(n);
        self.labels.truncate(n);
        self
    }

    /// A seeded split: `(train, test)` with `test_fraction` of the rows in test.
    pub fn split(self, test_fraction: f64, seed: u64) -> Result<(Self, Self)> {
        if !(0.0..1.0).contains(&test_fraction) {
            bail!("test fraction {test_fraction} must be in [0, 1)");
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let n_test = (self.len() as f64 * test_fraction).round() as usize;
        let pick = |idx: &[usize]| TextExamples {
            texts: idx.iter().map(|&i| self.texts[i].clone()).collect(),
            pairs: if self.pairs.is_empty() {
                Vec::new()
            } else {
                idx.iter().map(|&i| self.pairs[i].clone()).collect()
            },
            labels: idx.iter().map(|&i| self.labels[i]).collect(),
            label_names: self.label_names.clone(),
            skipped: 0,
        };
        Ok((pick(&order[n_test..]), pick(&order[..n_test])))
    }
}

/// Reads a table by its extension: `.parquet`, `.csv`, `.tsv`, `.jsonl`/`.ndjson`/`.json`.
pub fn read_table(path: &Path) -> Result<DataFrame> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let file = || std::fs::File::open(path).with_context(|| format!("opening {}", path.display()));
    let df = match ext.as_str() {
        "parquet" => ParquetReader::new(file()?).finish(),
        "csv" | "tsv" => {
            let sep = if ext == "tsv" { b'\t' } else { b',' };
            CsvReadOptions::default()
                .with_has_header(true)
                .with_parse_options(CsvParseOptions::default().with_separator(sep))
                .try_into_reader_with_file_path(Some(path.to_path_buf()))
                .and_then(|r| r.finish())
        }
        "jsonl" | "ndjson" | "json" => JsonReader::new(file()?)
            .with_json_format(JsonFormat::JsonLines)
            .finish(),
        other => bail!(
            "{}: unsupported file type '.{other}': use parquet, csv, tsv or jsonl",
            path.display()
        ),
    };
    anyhow::Context::with_context(df, || format!("reading {}", path.display()))
}

/// Picks the text and label columns. `label_names` fixes the id of each string label (e.g. from
/// the training split, so the test split uses the same ids); otherwise string labels are sorted.
/// The examples of a table: `text_column` (and `pair_column`, for sentence pairs) and
/// `label_column`. Rows missing any of them are skipped and counted.
pub fn examples(
    df: &DataFrame,
    text_column: &str,
    pair_column: Option<&str>,
    label_column: &str,
    label_names: Option<&[String]>,
) -> Result<TextExamples> {
    let column = |name: &str, role: &str| -> Result<Column> {
        df.column(name).cloned().map_err(|_| {
            let have: Vec<String> = df
                .get_column_names()
                .iter()
                .map(|c| c.to_string())
                .collect();
            anyhow::anyhow!(
                "no {role} column '{name}' (the file has: {}); set the {role} column option",
                have.join(", ")
            )
        })
    };
    let text = column(text_column, "text")?;
    let text = anyhow::Context::with_context(text.str(), || {
        format!("text column '{text_column}' must hold strings")
    })?
    .clone();
    let pair = match pair_column {
        Some(name) => Some(
            anyhow::Context::with_context(column(name, "text pair")?.str(), || {
                format!("text pair column '{name}' must hold strings")
            })?
            .clone(),
        ),
        None => None,
    };
    // Row i's second text: Some(None) when the pair column lacks it (the row is skipped).
    let second = |i: usize| pair.as_ref().map(|p| p.get(i).map(str::to_string));
    let label = column(label_column, "label")?;
    let mut out = TextExamples::default();
    if label.dtype().is_integer() {
        let ids = label.cast(&DataType::Int64)?;
        let ids = ids.i64()?;
        for (i, (t, l)) in text.iter().zip(ids.iter()).enumerate() {
            match (t, l, second(i)) {
                (Some(t), Some(l), b) if l >= 0 && b != Some(None) => {
                    out.texts.push(t.to_string());
                    out.pairs.extend(b.flatten());
                    out.labels.push(l);
                }
                (_, Some(l), _) if l < 0 => {
                    bail!("label column '{label_column}' has a negative label {l}")
                }
                _ => out.skipped += 1,
            }
        }
        let max = out.labels.iter().copied().max().unwrap_or(-1);
        out.label_names = match label_names {
            Some(names) => names.to_vec(),
            None => (0..=max).map(|i| i.to_string()).collect(),
        };
        if max >= out.label_names.len() as i64 {
            bail!(
                "label {max} is outside the {} known labels",
                out.label_names.len()
            );
        }
    } else {
        let strings = label.cast(&DataType::String)?;
        let strings = strings.str()?;
        let names: Vec<String> = match label_names {
            Some(n) => n.to_vec(),
            None => {
                let mut v: Vec<String> = strings.iter().flatten().map(String::from).collect();
                v.sort();
                v.dedup();
                v
            }
        };
        for (i, (t, l)) in text.iter().zip(strings.iter()).enumerate() {
            match (t, l, second(i)) {
                (Some(t), Some(l), b) if b != Some(None) => {
                    let Some(id) = names.iter().position(|n| n == l) else {
                        bail!("label '{l}' is not one of the known labels {names:?}");
                    };
                    out.texts.push(t.to_string());
                    out.pairs.extend(b.flatten());
                    out.labels.push(id as i64);
                }
                _ => out.skipped += 1,
            }
        }
        out.label_names = names;
    }
    if out.is_empty() {
        bail!("no usable rows: every row lacks a text or a label");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, body: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("trainbook-ds-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn csv_with_string_labels_maps_them_sorted() {
        let p = write(
            "a.csv",
            "text,label\ngreat film,fresh\n\"dull, long\",rotten\nfine,fresh\n,rotten\n",
        );
        let ex = examples(&read_table(&p).unwrap(), "text", None, "label", None).unwrap();
        assert_eq!(ex.label_names, ["fresh", "rotten"]);
        assert_eq!(ex.labels, [0, 1, 0]);
        assert_eq!(ex.texts[1], "dull, long");
        assert_eq!(ex.skipped, 1);
    }

    #[test]
    fn jsonl_with_integer_labels_and_first_n() {
        let p = write("b.jsonl", "{\"label\": 4, \"text\": \"five stars\"}\n{\"label\": 0, \"text\": \"one star\"}\n{\"label\": 2, \"text\": \"meh\"}\n");
        let ex = examples(&read_table(&p).unwrap(), "text", None, "label", None)
            .unwrap()
            .first(2);
        assert_eq!(ex.labels, [4, 0]);
        assert_eq!(ex.label_names.len(), 5);
    }

    #[test]
    fn parquet_round_trip_and_split() {
        let mut df = df!("text" => ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], "label" => [0i64, 1, 0, 1, 0, 1, 0, 1, 0, 1]).unwrap();
        let p = write("c.parquet", "");
        ParquetWriter::new(std::fs::File::create(&p).unwrap())
            .finish(&mut df)
            .unwrap();
        let ex = examples(&read_table(&p).unwrap(), "text", None, "label", None).unwrap();
        let (train, test) = ex.clone().split(0.2, 7).unwrap();
        assert_eq!((train.len(), test.len()), (8, 2));
        let (train2, _) = ex.split(0.2, 7).unwrap();
        assert_eq!(train.texts, train2.texts, "same seed, same split");
    }

    #[test]
    fn errors_name_the_problem_and_the_fix() {
        let p = write("d.csv", "review,stars\nok,1\n");
        let err = examples(&read_table(&p).unwrap(), "text", None, "stars", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no text column 'text'") && err.contains("review, stars"),
            "{err}"
        );
        let err = read_table(&write("e.xlsx", "")).unwrap_err().to_string();
        assert!(err.contains("unsupported file type '.xlsx'"), "{err}");
    }

    #[test]
    fn sentence_pairs_keep_their_rows_together() {
        let p = write(
            "f.csv",
            "a,b,label\nthe cat sat,a cat was sitting,yes\nit rained,,no\nhe ran,she slept,no\n",
        );
        let ex = examples(&read_table(&p).unwrap(), "a", Some("b"), "label", None).unwrap();
        assert_eq!(ex.texts, ["the cat sat", "he ran"]);
        assert_eq!(ex.pairs, ["a cat was sitting", "she slept"]);
        assert_eq!((ex.labels.clone(), ex.skipped), (vec![1, 0], 1));
        let (train, test) = ex.split(0.5, 1).unwrap();
        for part in [train, test] {
            let i = part.texts.iter().position(|t| t == "he ran");
            if let Some(i) = i {
                assert_eq!(part.pairs[i], "she slept", "a split keeps pairs aligned");
            }
        }
        let err = examples(&read_table(&p).unwrap(), "a", Some("c"), "label", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no text pair column 'c'"), "{err}");
    }

    #[test]
    fn the_offline_rotten_tomatoes_set_loads() {
        let p = crate::assets::rotten_tomatoes_csv();
        let ex = examples(&read_table(&p).unwrap(), "text", None, "label", None).unwrap();
        assert_eq!(ex.len(), 12_808);
        assert_eq!(ex.label_names, ["fresh", "rotten"]);
    }
}
