//! Your own model and training step, trained data-parallel by trainbook: a small network of
//! this program's own on the offline MNIST digits, on N worker processes that run this very
//! program again (the `trainbook::worker_hook()` line in `main`).
//!
//!     cargo run --release -p trainbook --example digits -- --workers 2 --epochs 3
//!
//! The live view is the terminal's; the run directory has `metrics.parquet`, the logs and one
//! checkpoint per epoch, from which the end of `main` predicts a digit.

use std::path::PathBuf;

use clap::Parser;
use trainbook::custom::*;
use trainbook::prelude::*;

/// The task's settings: they travel to the workers as JSON.
#[derive(Serialize, Deserialize)]
#[serde(crate = "trainbook::custom::serde")]
struct Digits {
    /// Units of the hidden layer.
    hidden: i64,
    /// The ImageFolder with train/ and val/.
    data: PathBuf,
}

/// What each worker builds once: the model and the data in memory.
struct Worker {
    net: nn::Sequential,
    train: (Tensor, Tensor),
    val: (Tensor, Tensor),
}

/// Images `[N, 3, 28, 28]` as flat grey pixels `[N, 784]`.
fn flat_grey(images: &Tensor) -> Tensor {
    images.select(1, 0).flatten(1, -1)
}

impl Task for Digits {
    type State = Worker;

    fn setup(&self, vars: &nn::Path, setup: &Setup) -> Result<Worker> {
        let (x, y, classes) = image_tensors(&self.data.join("train"))?;
        let (vx, vy, _) = image_tensors(&self.data.join("val"))?;
        if setup.rank == 0 {
            setup.log(format!(
                "digits: {} training and {} validation images, {} classes",
                y.size()[0],
                vy.size()[0],
                classes.len()
            ));
        }
        let net = nn::seq()
            .add(nn::linear(
                vars / "fc1",
                784,
                self.hidden,
                Default::default(),
            ))
            .add_fn(|t| t.relu())
            .add(nn::linear(
                vars / "fc2",
                self.hidden,
                classes.len() as i64,
                Default::default(),
            ));
        Ok(Worker {
            net,
            train: (flat_grey(&x), y),
            val: (flat_grey(&vx), vy),
        })
    }

    fn len(&self, w: &Worker, split: Split) -> usize {
        match split {
            Split::Train => w.train.1.size()[0] as usize,
            Split::Eval => w.val.1.size()[0] as usize,
        }
    }

    fn step(&self, w: &Worker, batch: &Batch) -> Result<Step> {
        let (x, y) = match batch.split {
            Split::Train => &w.train,
            Split::Eval => &w.val,
        };
        let idx: Vec<i64> = batch.indices.iter().map(|&i| i as i64).collect();
        let idx = Tensor::from_slice(&idx);
        let x = batch.device.put(&x.index_select(0, &idx))?;
        let y = batch.device.put(&y.index_select(0, &idx))?;
        let logits = w.net.forward(&x);
        // The mean confidence in the true class: a metric of this task's own.
        let confidence = logits
            .softmax(-1, Kind::Float)
            .gather(1, &y.unsqueeze(1), false)
            .mean(Kind::Float)
            .double_value(&[]);
        Ok(Step::classification(logits, y).metric("confidence", confidence))
    }
}

/// Train a small network on the offline digits with trainbook's data-parallel workers.
#[derive(Parser)]
struct Args {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Passes over the training images.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Stop after this many optimizer steps.
    #[arg(long)]
    max_steps: Option<u64>,
    /// Units of the hidden layer.
    #[arg(long, default_value_t = 128)]
    hidden: i64,
    /// The digits ImageFolder (default: the offline copy `make setup` fetched).
    #[arg(long)]
    data: Option<PathBuf>,
}

fn main() -> Result<()> {
    // Workers of this program's jobs are this program again: there, this line runs the worker
    // and exits.
    trainbook::worker_hook();
    let args = Args::parse();
    let task = Digits {
        hidden: args.hidden,
        data: args.data.unwrap_or_else(digits_dir),
    };
    let data = task.data.clone();
    let mut trainer = Trainer::new(task)
        .workers(args.workers)
        .epochs(args.epochs)
        .global_batch_size(64)
        .optimizer(OptimizerKind::Sgd)
        .lr(0.1);
    if let Some(m) = args.max_steps {
        trainer = trainer.max_steps(m);
    }
    let result = trainer.fit()?;
    for (name, value) in &result.metrics {
        println!("{name:>24} {value:.4}");
    }
    let checkpoint = result
        .last_checkpoint
        .clone()
        .ok_or_else(|| anyhow!("the job wrote no checkpoint"))?;
    let task = Digits {
        hidden: args.hidden,
        data,
    };
    let (_vars, trained) = load(&task, &checkpoint)?;
    let first = trained.val.0.get(0).unsqueeze(0);
    let predicted = tch::no_grad(|| trained.net.forward(&first)).argmax(-1, false);
    println!(
        "checkpoint {}: the first validation image is a {}, predicted {}",
        checkpoint.display(),
        trained.val.1.int64_value(&[0]),
        predicted.int64_value(&[0])
    );
    Ok(())
}
