//! `trainbook tokenizer train`: a BERT WordPiece tokenizer trained from raw text.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum TokenizerCommand {
    /// Train a BERT WordPiece tokenizer from raw text; writes tokenizer.json and vocab.txt.
    #[command(
        after_help = "Examples:\n  trainbook tokenizer train --out my-tokenizer\n  trainbook tokenizer train --data wiki.txt --data books.parquet --vocab-size 32000 --out tok-32k\n\nA BERT model directory uses them when they sit beside its config.json and weights."
    )]
    Train(TokenizerArgs),
}

#[derive(Args, Debug)]
pub struct TokenizerArgs {
    /// Text sources, in order: .txt (a text per non-empty line), .parquet, .csv, .tsv or
    /// .jsonl (repeat the flag for more) [default: the offline Brown corpus].
    #[arg(long)]
    pub data: Vec<PathBuf>,
    /// The text column of tables.
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// Tokens in the vocabulary, the 5 special tokens and the alphabet included.
    #[arg(long, default_value_t = 30_522)]
    pub vocab_size: usize,
    /// Merge a pair of pieces only if it occurs at least this often.
    #[arg(long, default_value_t = 2)]
    pub min_frequency: u64,
    /// Keep case and accents (for cased models); the default lowercases, as uncased BERT.
    #[arg(long)]
    pub cased: bool,
    /// Characters kept in the initial alphabet, the most frequent first.
    #[arg(long, default_value_t = 1000)]
    pub limit_alphabet: usize,
    /// Directory to write tokenizer.json and vocab.txt into (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub json: bool,
}

impl TokenizerArgs {
    fn trainer(&self) -> trainbook_api::TokenizerTrainer {
        trainbook_api::TokenizerTrainer {
            data: self.data.clone(),
            text_column: Some(self.text_column.clone()),
            vocab_size: self.vocab_size,
            min_frequency: self.min_frequency,
            lowercase: !self.cased,
            limit_alphabet: self.limit_alphabet,
        }
    }
}

pub(super) fn train(args: &TokenizerArgs) -> i32 {
    match args.trainer().train(&args.out) {
        Ok(t) => {
            println!(
                "trained a {}-token WordPiece vocabulary on {} texts in {:.1} s: {} and {}",
                t.vocab_size,
                t.texts,
                t.seconds,
                t.tokenizer_json.display(),
                t.vocab_txt.display()
            );
            println!("first text: {}", t.example.join(" "));
            if args.json {
                println!("{}", serde_json::to_string(&t).unwrap_or_default());
            }
            0
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}
