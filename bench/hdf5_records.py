"""HDF5 pre-training shards read three ways, side by side: bert-mlm's samples/s from the shards
themselves, from the records `trainbook prepare` makes of them, and from the same token blocks
as a prepared token corpus.

The data: the offline Brown corpus repeated with a counter in front of every line (so texts
differ), prepared with the default tokenizer (uncased BERT WordPiece, u16 ids); the first
--sequences 128-token blocks of its training stream are masked once, as
create_pretraining_data.py masks (15% of the non-special positions, at most 20, 80% [MASK] /
10% a random token / 10% kept), and written with h5py as NVIDIA's scripts write them: int32
datasets, gzip, h5py's automatic chunks, next_sentence_labels. The shards are then prepared
into records (timed). Each round trains 2 workers x --steps steps of the tiny model (batch 16,
128 tokens) on each of the three, in a rotating order, all on --train-rows 57,000 samples (the
shards' and records' training sequences: every 20th of 60,000 is held out): samples/s as the
job reports it (train_samples_per_second: training steps only). The masked-LM loss alone
(`--next-sentence false`), the token corpus's objective; --next-sentence default lets the jobs
on the shards and records train BERT's next-sentence head too, as they do by default. One JSON
line per run and a markdown table on stderr.

    .venv/bin/python bench/hdf5_records.py [--sequences 60000] [--steps 100] [--rounds 3]
        [--next-sentence false|default] [--keep DIR]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRAINBOOK = ROOT / "target/release/trainbook"
BROWN = ROOT / ".data/datasets/brown/brown.txt"
SEQ, MAX_PRED, VOCAB = 128, 20, 30522
SPECIAL = {0, 100, 101, 102, 103}


def run(cmd, env=None):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{cmd} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def make_corpus(path, mb):
    lines = [l for l in BROWN.read_text().splitlines() if l.strip()]
    n = 0
    with open(path, "w") as f:
        while f.tell() < mb * 1_000_000:
            for l in lines:
                f.write(f"{n} {l}\n")
                n += 1


def train_blocks(prepared, n):
    """The first n blocks of SEQ tokens of the prepared corpus's training stream."""
    index = json.loads((prepared / "index.json").read_text())
    assert index["manifest"]["width"] == "u16", index["manifest"]["width"]
    parts = [np.fromfile(prepared / f"train-{r['shard']:05d}.tokens", dtype="<u2") for r in index["shards"]]
    tokens = np.concatenate(parts)
    if len(tokens) < n * SEQ:
        sys.exit(f"the corpus gives {len(tokens) // SEQ} blocks, fewer than {n}: raise --corpus-mb")
    return tokens[: n * SEQ].astype(np.int32).reshape(n, SEQ)


def write_shard(path, blocks, seed=12345):
    """create_pretraining_data.py's static masking and h5py writing."""
    rng = np.random.default_rng(seed)
    n = len(blocks)
    ids = blocks.copy()
    positions = np.zeros((n, MAX_PRED), dtype=np.int32)
    labels = np.zeros((n, MAX_PRED), dtype=np.int32)
    for r in range(n):
        candidates = np.array([i for i in range(SEQ) if int(ids[r, i]) not in SPECIAL])
        k = min(MAX_PRED, max(1, int(round(len(candidates) * 0.15))))
        pos = np.sort(rng.choice(candidates, size=k, replace=False))
        positions[r, :k], labels[r, :k] = pos, ids[r, pos]
        for p in pos:
            u = rng.random()
            if u < 0.8:
                ids[r, p] = 103
            elif u < 0.9:
                ids[r, p] = rng.integers(1000, VOCAB)
    halves = np.broadcast_to((np.arange(SEQ) >= SEQ // 2).astype(np.int32), (n, SEQ))
    nsp = rng.integers(0, 2, size=(n,), dtype=np.int32)
    arrays = [("input_ids", ids), ("input_mask", np.ones_like(ids)), ("segment_ids", halves),
              ("masked_lm_positions", positions), ("masked_lm_ids", labels), ("next_sentence_labels", nsp)]
    with h5py.File(path, "w") as f:
        for name, value in arrays:
            f.create_dataset(name, data=value, dtype="i4", compression="gzip")
        chunks = f["input_ids"].chunks
    return chunks


def train(data, work, steps, train_rows, extra):
    env = {**os.environ, "TRAINBOOK_RUNS": str(work / "runs"), "TRAINBOOK_CACHE": str(work / "cache")}
    load = os.getloadavg()[0]
    t0 = time.time()
    out = run([TRAINBOOK, "train", "bert-mlm", "--preset", "tiny", "--max-length", SEQ, "--data", data,
               "--workers", "2", "--device", "cpu", "--max-steps", steps, "--train-rows", train_rows,
               "--eval-rows", "64", "--json", *extra], env=env)
    s = json.loads(out.strip().splitlines()[-1])
    assert s["status"] == "succeeded" and s["steps"] == steps, s
    shutil.rmtree(s["run_dir"], ignore_errors=True)
    return {"train_samples_per_s": s["metrics"]["train_samples_per_second"],
            "samples_per_s": s["samples_per_second"], "final_train_loss": s["final_train_loss"],
            "wall_s": time.time() - t0, "load_before": load}


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")) / 2**20
    return f"{cpu}, {os.cpu_count()} vCPU, {mem:.0f} GiB, {platform.platform()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=60000)
    ap.add_argument("--corpus-mb", type=int, default=40)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--next-sentence", choices=["false", "default"], default="false")
    ap.add_argument("--keep", type=Path, help="work directory kept afterwards (default: a temporary one)")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="tb-hdf5-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M")}), flush=True)

    corpus = work / "corpus.txt"
    make_corpus(corpus, a.corpus_mb)
    tokens = work / "tokens"
    shutil.rmtree(tokens, ignore_errors=True)
    run([TRAINBOOK, "prepare", "--data", corpus, "--out", tokens, "--json"])
    shards = work / "shards"
    shards.mkdir(exist_ok=True)
    t0 = time.time()
    chunks = write_shard(shards / "books_wiki_en_corpus_train_0.hdf5", train_blocks(tokens, a.sequences))
    shard_bytes = sum(f.stat().st_size for f in shards.iterdir())
    print(json.dumps({"shards": {"sequences": a.sequences, "bytes": shard_bytes, "input_ids_chunks": chunks,
                                 "write_s": time.time() - t0}}), flush=True)
    records = work / "records"
    shutil.rmtree(records, ignore_errors=True)
    t0 = time.time()
    s = json.loads(run([TRAINBOOK, "prepare", "--data", shards, "--out", records, "--json"]).strip().splitlines()[-1])
    prep = {"seconds": time.time() - t0, "prepare_seconds": s["seconds"], "disk_bytes": s["disk_bytes"],
            "shard_mb_per_s": shard_bytes / 1e6 / s["seconds"]}
    print(json.dumps({"prepare_records": prep}), flush=True)

    sources = {"records": records, "token corpus": tokens, "shards": shards}
    train_rows = a.sequences - a.sequences // 20
    results = {k: [] for k in sources}
    names = list(sources)
    for r in range(a.rounds):
        for name in names[r % 3:] + names[: r % 3]:
            extra = ["--next-sentence", "false"] if a.next_sentence == "false" and name != "token corpus" else []
            res = train(sources[name], work, a.steps, train_rows, extra)
            res.update(round=r, source=name)
            print(json.dumps(res), flush=True)
            results[name].append(res)

    # Records and shards are the same sequences: the same losses.
    same = all(abs(a["final_train_loss"] - b["final_train_loss"]) < 1e-9
               for a, b in zip(results["records"], results["shards"]))
    med = {k: statistics.median(x["train_samples_per_s"] for x in v) for k, v in results.items()}
    print(f"\n{a.sequences:,} sequences of {SEQ} tokens ({shard_bytes / 1e6:.1f} MB of shards, chunks {chunks}); "
          f"records prepared in {prep['prepare_seconds']:.1f} s ({prep['shard_mb_per_s']:.1f} MB of shards/s, "
          f"{prep['disk_bytes'] / 1e6:.0f} MB on disk); 2 workers x {a.steps} steps, tiny model, batch 16, "
          f"next sentence {a.next_sentence}", file=sys.stderr)
    print("| source | train samples/s, each round | median | vs token corpus |", file=sys.stderr)
    print("| --- | --- | --- | --- |", file=sys.stderr)
    for k, v in results.items():
        each = ", ".join(f"{x['train_samples_per_s']:.0f}" for x in v)
        print(f"| {k} | {each} | {med[k]:.0f} | {med[k] / med['token corpus']:.2f} |", file=sys.stderr)
    print(f"records' final training loss equals the shards' in every round: {same}", file=sys.stderr)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
