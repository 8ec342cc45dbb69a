#!/usr/bin/env python3
"""Ray Tune's side of the hyper-parameter sweep benchmark (trainbook's is `trainbook sweep bert
--preset tiny --train-rows 1000 --eval-rows 256 --max-length 64 --global-batch-size 8
--optimizer sgd --momentum 0.9 --epochs 4 --workers 1 --grid lr=1e-4,2e-4,5e-4,1e-3,2e-3,5e-3,1e-2,2e-2
--concurrent 2 --asha --grace 1 --reduction-factor 2 --metric eval_loss:min`).

The same job as trainbook's: each trial trains a BertForSequenceClassification initialised at
random (seed 42) with trainbook's tiny dimensions (2 layers, hidden 64, 4 heads, intermediate
128, 64 positions, 2 types, dropout 0.1, 2 labels, the MiniLM tokenizer's vocabulary) on
Rotten Tomatoes snippets (.data/datasets/rotten_tomatoes/reviews.csv, fresh=0, rotten=1).
The rows are the ones trainbook picks: the table has no test file, so trainbook holds out 20%
with a shuffle seeded 0 (Rust rand 0.8's StdRng, reproduced here) and takes the first
--train-rows of the rest and the first --eval-rows held out. They are tokenized once, before
the clock starts, with the MiniLM tokenizer (truncation, padding to --max-length 64).
Training: SGD (the trial's lr, momentum 0.9, weight decay 0), batch 8, 1 CPU thread per trial,
a seeded shuffle per epoch, --epochs epochs; after each epoch the mean cross-entropy on the
eval rows (eval mode, no grad, batches of 32 as trainbook's evaluation) is reported with
`ray.tune.report({"eval_loss", "epoch"})`: a function trainable, no Ray Train, no checkpoints.

Tune: a grid over --lrs, 1 CPU per trial, --concurrent trials at once, metric eval_loss (min),
ASHAScheduler(time_attr="training_iteration", max_t=--epochs, grace_period=1,
reduction_factor=2) or, with --scheduler none, no scheduler (every trial runs to the end);
`ray.init(num_cpus=2)`, verbose 0, storage in a temporary directory removed afterwards.

Each round prints one JSON line on stdout: wall_seconds (before ray.init to after
tuner.fit() returns), fit_seconds (fit() alone), trials, stopped_early (trials that reported
fewer than --epochs epochs), trial_epochs (reports summed over trials), best_lr and
best_eval_loss (Tune's best trial by its last eval_loss) and per_trial [{lr, epochs,
eval_loss}]. Logs go to stderr. --check also asserts what the scheduler implies (ASHA: some
trial stopped early and one ran to the end; none: every trial ran every epoch) and exits 1
if not. Offline; run with the bench venv after `bench/ray-venv.sh`:

  .bench-venv/bin/python bench/ray_tune.py                     # the full sweep, 1 round
  .bench-venv/bin/python bench/ray_tune.py --scheduler none    # ASHA off, for comparison
  .bench-venv/bin/python bench/ray_tune.py --scheduler none --check --lrs 1e-3,1e-2 --epochs 2 --train-rows 64 --eval-rows 32
"""
import argparse
import contextlib
import csv
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # verbose=0 then prints nothing (the new output prints a table)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 42
EVAL_FRACTION = 0.2  # trainbook's held-out share when the data has no test table
EVAL_BATCH = 32  # trainbook evaluates in batches of max(local batch, 32)
LRS = "1e-4,2e-4,5e-4,1e-3,2e-3,5e-3,1e-2,2e-2"

# --- trainbook's held-out split: Rust rand 0.8.5 `order.shuffle(&mut StdRng::seed_from_u64(0))`.
# StdRng is ChaCha12 (rand_chacha 0.3), seeded by rand_core 0.6's PCG32 expansion; shuffle is
# Fisher-Yates with `gen_range(0..i + 1)` on u32 (widening multiply, rejection zone). Checked
# against rand's own test vectors and trainbook's tokenized cache of these rows.
M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1


def _rotl(x, n):
    return ((x << n) | (x >> (32 - n))) & M32


class _ChaCha:
    def __init__(self, key, rounds):
        self.key = [int.from_bytes(key[i : i + 4], "little") for i in range(0, 32, 4)]
        self.rounds, self.counter, self.buf = rounds, 0, []

    def _block(self):
        s = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *self.key]
        s += [self.counter & M32, self.counter >> 32, 0, 0]
        x = s[:]

        def qr(a, b, c, d):
            x[a] = (x[a] + x[b]) & M32
            x[d] = _rotl(x[d] ^ x[a], 16)
            x[c] = (x[c] + x[d]) & M32
            x[b] = _rotl(x[b] ^ x[c], 12)
            x[a] = (x[a] + x[b]) & M32
            x[d] = _rotl(x[d] ^ x[a], 8)
            x[c] = (x[c] + x[d]) & M32
            x[b] = _rotl(x[b] ^ x[c], 7)

        for _ in range(self.rounds // 2):
            qr(0, 4, 8, 12), qr(1, 5, 9, 13), qr(2, 6, 10, 14), qr(3, 7, 11, 15)
            qr(0, 5, 10, 15), qr(1, 6, 11, 12), qr(2, 7, 8, 13), qr(3, 4, 9, 14)
        self.counter += 1
        return [(a + b) & M32 for a, b in zip(x, s)]

    def next_u32(self):
        if not self.buf:
            self.buf = self._block()[::-1]
        return self.buf.pop()


def _std_rng(seed):
    key = b""
    for _ in range(8):
        seed = (seed * 6364136223846793005 + 11634580027462260723) & M64
        xs, rot = (((seed >> 18) ^ seed) >> 27) & M32, seed >> 59
        key += (((xs >> rot) | (xs << (32 - rot))) & M32).to_bytes(4, "little")
    return _ChaCha(key, 12)


def rust_shuffle(n, seed):
    """`(0..n).collect::<Vec<_>>().shuffle(&mut StdRng::seed_from_u64(seed))` of rand 0.8.5."""
    rng, v = _std_rng(seed), list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        zone = ((bound << (32 - bound.bit_length())) - 1) & M32
        while True:
            m = rng.next_u32() * bound
            if m & M32 <= zone:
                break
        j = m >> 32
        v[i], v[j] = v[j], v[i]
    return v


def _check_rng():
    c = _ChaCha(bytes(32), 20)  # RFC 7539 / rand_chacha test_chacha_true_values_a
    assert [c.next_u32() for _ in range(2)] == [0xADE0B876, 0x903DF1A0]
    c = _ChaCha(bytes([1, 0, 0, 0, 23, 0, 0, 0, 200, 1, 0, 0, 210, 30, 0, 0] + [0] * 16), 12)
    assert c.next_u32() | c.next_u32() << 32 == 10719222850664546238  # rand test_stdrng_construction


def load_data(a):
    """Trainbook's rows, tokenized: ((ids, mask, types, labels) train, (...) eval, vocab)."""
    import torch
    import transformers

    with open(a.data, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["text"] and r["label"]]
    names = sorted({r["label"] for r in rows})  # fresh=0, rotten=1
    order = rust_shuffle(len(rows), 0)
    n_eval = round(len(rows) * EVAL_FRACTION)
    pick = {"train": order[n_eval:][: a.train_rows], "eval": order[:n_eval][: a.eval_rows]}
    tok = transformers.AutoTokenizer.from_pretrained(a.model_dir, use_fast=True)
    out = {}
    for split, idx in pick.items():
        enc = tok([rows[i]["text"] for i in idx], truncation=True, padding="max_length",
                  max_length=a.max_length, return_tensors="pt")
        labels = torch.tensor([names.index(rows[i]["label"]) for i in idx], dtype=torch.long)
        out[split] = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], labels)
    return out["train"], out["eval"], tok.vocab_size


def trainable(config, train=None, evaluation=None, vocab_size=None, epochs=4, batch=8, max_length=64):
    import torch
    import transformers
    from ray import tune

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(SEED)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=max_length, type_vocab_size=2,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=2))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9, weight_decay=0.0)
    ids, mask, types, labels = train
    e_ids, e_mask, e_types, e_labels = evaluation
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(labels), generator=gen)
        for s in range(0, len(order) - batch + 1, batch):  # 1000 / 8: no partial batch
            idx = order[s : s + batch]
            out = model(input_ids=ids[idx], attention_mask=mask[idx], token_type_ids=types[idx], labels=labels[idx])
            opt.zero_grad()
            out.loss.backward()
            opt.step()
        model.eval()
        total = 0.0
        with torch.no_grad():
            for s in range(0, len(e_labels), EVAL_BATCH):
                sl = slice(s, s + EVAL_BATCH)
                out = model(input_ids=e_ids[sl], attention_mask=e_mask[sl], token_type_ids=e_types[sl], labels=e_labels[sl])
                total += out.loss.item() * len(e_labels[sl])
        tune.report({"eval_loss": total / len(e_labels), "epoch": epoch + 1})


def one_round(a, train, evaluation, vocab_size):
    import ray

    storage = tempfile.mkdtemp(prefix="ray-tune-")
    try:  # stdout is for the JSON lines: whatever Ray prints there goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            return _sweep(a, train, evaluation, vocab_size, storage)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)


def _sweep(a, train, evaluation, vocab_size, storage):
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    scheduler = None
    if a.scheduler == "asha":
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=a.epochs, grace_period=1, reduction_factor=2)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    fn = tune.with_parameters(trainable, train=train, evaluation=evaluation, vocab_size=vocab_size,
                              epochs=a.epochs, batch=8, max_length=a.max_length)
    tuner = tune.Tuner(
        tune.with_resources(fn, {"cpu": 1}),
        param_space={"lr": tune.grid_search(a.lrs)},
        tune_config=tune.TuneConfig(metric="eval_loss", mode="min", scheduler=scheduler,
                                    max_concurrent_trials=a.concurrent, num_samples=1),
        run_config=tune.RunConfig(name="sweep", storage_path=storage, verbose=0),
    )
    t1 = time.perf_counter()
    results = tuner.fit()
    t2 = time.perf_counter()
    errors = [str(r.error) for r in results if r.error]
    if errors:
        sys.exit("ray_tune.py: trials failed:\n" + "\n".join(errors))
    per_trial = sorted(
        ({"lr": r.config["lr"], "epochs": r.metrics["training_iteration"], "eval_loss": r.metrics["eval_loss"]}
         for r in results),
        key=lambda t: t["lr"])
    best = results.get_best_result()  # by the last reported eval_loss (Tune's default scope)
    return {
        "wall_seconds": round(t2 - t0, 3),
        "fit_seconds": round(t2 - t1, 3),
        "trials": len(per_trial),
        "stopped_early": sum(t["epochs"] < a.epochs for t in per_trial),
        "trial_epochs": sum(t["epochs"] for t in per_trial),
        "best_lr": best.config["lr"],
        "best_eval_loss": best.metrics["eval_loss"],
        "per_trial": per_trial,
    }


def check(a, r):
    """What the scheduler implies; a list of what failed."""
    bad = []
    if r["trials"] != len(a.lrs):
        bad.append(f"{r['trials']} trials, not {len(a.lrs)}")
    if any(not 1 <= t["epochs"] <= a.epochs for t in r["per_trial"]):
        bad.append("a trial ran outside 1..epochs")
    if a.scheduler == "none" and (r["stopped_early"] or r["trial_epochs"] != len(a.lrs) * a.epochs):
        bad.append("without a scheduler every trial must run every epoch")
    if a.scheduler == "asha" and len(a.lrs) > 2 and a.epochs > 1:
        if not r["stopped_early"]:
            bad.append("ASHA stopped no trial early")
        if not any(t["epochs"] == a.epochs for t in r["per_trial"]):
            bad.append("ASHA let no trial reach max_t")
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lrs", default=LRS, help=f"comma list of learning rates (default {LRS})")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-rows", type=int, default=1000)
    p.add_argument("--eval-rows", type=int, default=256)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--concurrent", type=int, default=2, help="max_concurrent_trials (default 2)")
    p.add_argument("--scheduler", choices=("asha", "none"), default="asha")
    p.add_argument("--rounds", type=int, default=1, help="repeat the sweep; one JSON line each")
    p.add_argument("--check", action="store_true", help="assert what the scheduler implies; exit 1 if not")
    p.add_argument("--model-dir", default=os.path.join(REPO, ".data/models/all-MiniLM-L6-v2"))
    p.add_argument("--data", default=os.path.join(REPO, ".data/datasets/rotten_tomatoes/reviews.csv"))
    a = p.parse_args()
    try:
        a.lrs = [float(x) for x in a.lrs.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lrs must be a comma list of numbers, not {a.lrs!r}")
    if not a.lrs or min(a.epochs, a.train_rows, a.eval_rows, a.max_length, a.concurrent, a.rounds) < 1:
        p.error("--lrs must be non-empty; --epochs, --train-rows, --eval-rows, --max-length, --concurrent and --rounds >= 1")
    for path, what in ((os.path.join(a.model_dir, "config.json"), "model"), (a.data, "dataset")):
        if not os.path.exists(path):
            sys.exit(f"ray_tune.py: {what} not found at {path}; run `make setup` first")
    _check_rng()
    import ray

    t = time.perf_counter()
    train, evaluation, vocab_size = load_data(a)
    prep = time.perf_counter() - t
    print(f"ray_tune.py: {len(train[3])} train / {len(evaluation[3])} eval rows tokenized in {prep:.2f}s", file=sys.stderr)
    failed = False
    for i in range(a.rounds):
        r = one_round(a, train, evaluation, vocab_size)
        bad = check(a, r) if a.check else []
        head = {"bench": "sweep", "impl": "ray", "ray": ray.__version__, "round": i + 1,
                "scheduler": a.scheduler, "concurrent": a.concurrent, "epochs": a.epochs,
                "train_rows": len(train[3]), "eval_rows": len(evaluation[3]), "prep_seconds": round(prep, 3)}
        if a.check:
            head["check"] = "ok" if not bad else "; ".join(bad)
        print(json.dumps({**head, **r}), flush=True)
        failed |= bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
