"""Pre-training corpora at scale: `trainbook prepare` and jobs on a prepared corpus.

For each corpus size (default 50 MB, 500 MB and 2 GB of text, made by repeating the offline
Brown corpus with a counter in front of every line so that texts differ):
  - `trainbook prepare`: seconds, MB/s, its own peak RSS (VmHWM through /usr/bin/time);
  - 2 workers x 20 steps of bert-mlm (tiny model, 128-token blocks) on the prepared set: each
    rank's peak RSS (TrainResult::memory) and launch -> first step (the first loss's time in
    metrics.parquet, counted from the job's start).
Side by side, on the smallest corpus, same cores, same tokenizer.json: Hugging Face tokenizers'
encode_batch over the same texts in batches (what `datasets.map(batched=True)` calls), MB/s,
alternating with trainbook's prepare for --rounds rounds. One JSON line per measurement and a
markdown table on stderr.

    python3 bench/prepare_corpus.py [--sizes-mb 50 500 2000] [--rounds 2] [--keep DIR]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINBOOK = ROOT / "target/release/trainbook"
BROWN = ROOT / ".data/datasets/brown/brown.txt"
TOKENIZER = ROOT / ".data/models/all-MiniLM-L6-v2/tokenizer.json"
VENV_PY = ROOT / ".venv/bin/python"


def make_corpus(path, mb):
    lines = [l for l in BROWN.read_text().splitlines() if l.strip()]
    target, n = mb * 1_000_000, 0
    with open(path, "w") as f:
        while f.tell() < target:
            for l in lines:
                f.write(f"{n} {l}\n")
                n += 1
                if n % 10000 == 0 and f.tell() >= target:
                    break
    return path


def timed(cmd, env=None):
    """Runs cmd under /usr/bin/time -v; returns (seconds, peak RSS bytes, stdout)."""
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-v", *map(str, cmd)], capture_output=True, text=True, env=env)
    secs = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"{cmd} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    rss = next(int(l.split()[-1]) * 1024 for l in p.stderr.splitlines() if "Maximum resident" in l)
    return secs, rss, p.stdout


def prepare(corpus, out):
    shutil.rmtree(out, ignore_errors=True)
    secs, rss, stdout = timed([TRAINBOOK, "prepare", "--data", corpus, "--out", out, "--json"])
    s = json.loads(stdout.strip().splitlines()[-1])
    # MB/s over the preparation itself (reading, tokenising, writing), as the encode_batch
    # side is timed over its tokenising alone; `seconds` is the whole command.
    return {"seconds": secs, "peak_rss": rss, "mb_per_s": s["text_bytes"] / 1e6 / s["seconds"],
            "texts": s["texts"], "tokens": s["train_tokens"] + s["eval_tokens"],
            "disk_bytes": s["disk_bytes"], "shards": s["shards"]}


def train(prepared, runs):
    import polars as pl
    env = {**os.environ, "TRAINBOOK_RUNS": str(runs)}
    t0 = time.time()
    p = subprocess.run([TRAINBOOK, "train", "bert-mlm", "--preset", "tiny", "--max-length", "128",
                        "--data", str(prepared), "--workers", "2", "--device", "cpu",
                        "--max-steps", "20", "--train-rows", "100000000", "--eval-rows", "64",
                        "--json"], capture_output=True, text=True, env=env)
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["status"] == "succeeded" and s["steps"] == 20, s
    df = pl.read_parquet(Path(s["run_dir"]) / "metrics.parquet").filter(pl.col("name") == "loss")
    # `time` counts from the job's start, a few milliseconds after the command's.
    return {"peak_rss": {m["rank"]: m["peak"] for m in s["memory"]},
            "first_step_s": float(df["time"].min()), "wall_s": time.time() - t0}


HF = """
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
tok.no_truncation(); tok.no_padding()
texts = [l.rstrip("\\n") for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
t0 = time.time()
n = 0
for i in range(0, len(texts), 10000):
    n += sum(len(e.ids) for e in tok.encode_batch(texts[i:i + 10000]))
print(json.dumps({"seconds": time.time() - t0, "tokens": n}))
"""


def hf_encode(corpus):
    p = subprocess.run([str(VENV_PY), "-c", HF, str(TOKENIZER), str(corpus)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr)
    r = json.loads(p.stdout)
    r["mb_per_s"] = corpus.stat().st_size / 1e6 / r["seconds"]
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[50, 500, 2000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="work directory kept afterwards (default: a temporary one)")
    a = ap.parse_args()
    if subprocess.run([str(VENV_PY), "-c", "import tokenizers"], capture_output=True).returncode != 0:
        subprocess.run([str(VENV_PY), "-m", "pip", "install", "-q", "tokenizers==0.23.2"], check=True)
    work = a.keep or Path(tempfile.mkdtemp(prefix="tb-prepare-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for mb in sorted(a.sizes_mb):
        corpus = make_corpus(work / f"corpus-{mb}mb.txt", mb)
        out = work / f"prepared-{mb}mb"
        r = {"size_mb": mb, "prepare": prepare(corpus, out), "train": train(out, work / "runs")}
        if mb == min(a.sizes_mb):
            ours, hf = [], []
            for _ in range(a.rounds):
                ours.append(prepare(corpus, out)["mb_per_s"])
                hf.append(hf_encode(corpus)["mb_per_s"])
            r["speed"] = {"trainbook_mb_per_s": ours, "hf_tokenizers_mb_per_s": hf,
                          "ratio": max(ours) / max(hf)}
        print(json.dumps(r), flush=True)
        rows.append(r)
        corpus.unlink()
    print("| corpus | prepare | MB/s | prepare peak RSS | shards | on disk | worker peak RSS (rank 0 / 1) | launch -> first step |", file=sys.stderr)
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", file=sys.stderr)
    for r in rows:
        p, t = r["prepare"], r["train"]
        peaks = " / ".join(f"{t['peak_rss'][k] / 2**20:.0f} MiB" for k in sorted(t["peak_rss"]))
        print(f"| {r['size_mb']} MB | {p['seconds']:.1f} s | {p['mb_per_s']:.1f} | {p['peak_rss'] / 2**20:.0f} MiB "
              f"| {p['shards']} | {p['disk_bytes'] / 1e6:.0f} MB | {peaks} | {t['first_step_s']:.1f} s |", file=sys.stderr)
    for r in rows:
        if "speed" in r:
            s = r["speed"]
            print(f"tokenising {r['size_mb']} MB, best of {a.rounds}: trainbook prepare {max(s['trainbook_mb_per_s']):.2f} MB/s, "
                  f"HF tokenizers encode_batch {max(s['hf_tokenizers_mb_per_s']):.2f} MB/s: {s['ratio']:.2f}x (target >= 0.9)",
                  file=sys.stderr)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
