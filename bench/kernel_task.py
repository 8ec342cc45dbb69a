"""Launch -> first loss: a task defined in a notebook cell vs the built-in recipe it mirrors.

Both jobs train the same model on the same amount of data: the `synthetic` recipe's tiny preset
(a 2-layer hidden-64 BERT classifier on 1,024 sequences of 16 tokens), once through the built-in
recipe in `trainbook-worker`, once as a `Task` written in a cell and run by
`trainbook-cell-worker` from the cell's own library. The time is measured inside the kernel, from
`launch` to the first `loss` event, so it holds what differs between the two paths (the worker
program, loading the cell library, the task's JSON, building the model) and nothing of the
cell's compilation. Rounds alternate so load drift hits both.

Prints a Markdown table and one JSON line with the raw numbers.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time

import jupyter_client

TIMEOUT = 300

TASK = r"""
use trainbook_torch::custom::*;
use trainbook_torch::recipes::models::bert::{BertClassifier, BertConfig};

#[derive(Serialize, Deserialize)]
#[serde(crate = "trainbook_torch::custom::serde")]
struct Mirror { rows: i64 }

struct State { model: BertClassifier, ids: Tensor, mask: Tensor, labels: Tensor }

impl Task for Mirror {
    type State = State;
    fn setup(&self, vars: &nn::Path, _: &Setup) -> Result<State> {
        // The tiny preset's model: 2 layers, hidden 64, 4 heads, vocabulary 128, 16 tokens.
        let mut c = BertConfig::tiny(128, 16);
        c.hidden_size = 64;
        c.num_hidden_layers = 2;
        c.num_attention_heads = 4;
        c.intermediate_size = 128;
        let model = BertClassifier::new(vars, &c, 2);
        let ids = Tensor::randint_low(2, 128, [self.rows, 16], (Kind::Int64, tch::Device::Cpu));
        let mask = Tensor::ones([self.rows, 16], (Kind::Int64, tch::Device::Cpu));
        let labels = Tensor::randint(2, [self.rows], (Kind::Int64, tch::Device::Cpu));
        Ok(State { model, ids, mask, labels })
    }
    fn len(&self, s: &State, split: Split) -> usize {
        if split == Split::Train { s.labels.size()[0] as usize } else { 0 }
    }
    fn step(&self, s: &State, batch: &Batch) -> Result<Step> {
        let idx = Tensor::from_slice(&batch.indices.iter().map(|&i| i as i64).collect::<Vec<_>>());
        let logits = s.model.forward(&s.ids.index_select(0, &idx), Some(&s.mask.index_select(0, &idx)), None, batch.train);
        Ok(Step::classification(logits, s.labels.index_select(0, &idx)))
    }
}

fn first_loss(spec: JobSpec) -> Result<f64> {
    let t0 = std::time::Instant::now();
    let job = trainbook::launch(spec)?;
    let rx = job.subscribe();
    let seconds = loop {
        match rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(Update::Metric(m)) if m.name == "loss" => break t0.elapsed().as_secs_f64(),
            Ok(Update::Finished(s)) => bail!("the job ended ({s:?}) before its first loss"),
            Ok(_) => {}
            Err(e) => bail!("no loss within 2 minutes: {e}"),
        }
    };
    job.stop()?;
    let _ = job.wait(); // an error: "the job was stopped", as asked
    Ok(seconds)
}
"""

BUILTIN = (
    'first_loss(JobSpec::new("synthetic").preset("tiny").workers(2).device(DeviceRequest::Cpu)'
    '.epochs(1).runs_root("{runs}").show_plot(false))?'
)
CELL = (
    "first_loss(Trainer::new(Mirror {{ rows: 1024 }}).workers(2).device(DeviceRequest::Cpu)"
    '.global_batch_size(8).epochs(1).runs_root("{runs}").show_plot(false).into_spec())?'
)


def run(kc, code):
    out = []

    def hook(m):
        if m["msg_type"] == "execute_result":
            out.append(m["content"]["data"]["text/plain"])
        elif m["msg_type"] == "stream":
            out.append(m["content"]["text"])

    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code[:80]!r} failed: {reply['content'].get('evalue')}\n{''.join(out)}")
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    runs = tempfile.mkdtemp(prefix="tb-bench-task-")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="trainbook", startup_timeout=TIMEOUT)
    try:
        run(kc, "1 + 1")
        t = time.monotonic()
        run(kc, TASK)
        define_s = time.monotonic() - t
        # One unmeasured launch of each: compiles both cells' code and warms the page cache.
        run(kc, BUILTIN.format(runs=runs))
        run(kc, CELL.format(runs=runs))
        times = {"builtin": [], "cell": []}
        for _ in range(args.rounds):
            times["builtin"].append(float(run(kc, BUILTIN.format(runs=runs))))
            times["cell"].append(float(run(kc, CELL.format(runs=runs))))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("| launch -> first loss, 2 CPU workers | median (s) |", file=sys.stderr)
    print("|---|---|", file=sys.stderr)
    print(f"| built-in `synthetic` recipe (trainbook-worker) | {med['builtin']:.2f} |", file=sys.stderr)
    print(f"| the same model as a cell-defined `Task` (trainbook-cell-worker) | {med['cell']:.2f} |", file=sys.stderr)
    print(f"| ratio cell / built-in | {med['cell'] / med['builtin']:.2f}x |", file=sys.stderr)
    print(f"(the cell defining the task, compiled against the whole of trainbook: {define_s:.1f} s)", file=sys.stderr)
    print(json.dumps({"bench": "task_first_loss", "rounds": args.rounds, "median_s": med,
                      "ratio": med["cell"] / med["builtin"], "define_cell_s": define_s, "runs_s": times}))


if __name__ == "__main__":
    main()
