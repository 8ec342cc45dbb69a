"""Checkpoints on the step's path vs in the background (`--checkpoint-async`), side by side.

The same bert-mlm job (a bert-base-sized model from scratch: ~110M parameters, so a checkpoint
with its AdamW state is ~1.3 GB and takes seconds to write) runs without step checkpoints, with
a step checkpoint every N steps written synchronously, and the same written in the background,
alternating for --rounds rounds. Reported: each run's training wall time (from the job's JSON),
the time per checkpoint the step pays (sync and async), and the ratios to the run without
checkpoints; one JSON line per run on stdout, the summary on stderr.

    .venv/bin/python bench/async_checkpoint.py [--rounds 2] [--steps 40] [--every 10] [--device cpu]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The build's binary, or TRAINBOOK_BIN (bench/cuda's packed one on a GPU machine).
TB = Path(os.environ.get("TRAINBOOK_BIN", ROOT / "target" / "release" / "trainbook"))


def run(mode, steps, every, threads, device):
    job = [str(TB), "train", "bert-mlm", "--preset", "default", "--device", device, "--workers", "1",
           "--threads", str(threads), "--layers", "12", "--hidden-size", "768", "--heads", "12",
           "--max-length", "64", "--global-batch-size", "8", "--max-steps", str(steps),
           "--epochs", "1", "--runs-root", tempfile.mkdtemp(prefix="bench-ckpt-"), "--json"]
    if mode != "none":
        job += ["--checkpoint-every", str(every), "--checkpoint-async", "true" if mode == "async" else "false"]
    t0 = time.monotonic()
    p = subprocess.run(job, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{mode}: trainbook failed ({p.returncode}):\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"bench": "async_checkpoint", "mode": mode, "steps": steps, "every": every, "wall_seconds": wall,
            "elapsed_seconds": r["elapsed_seconds"], "train_samples_per_second": r["metrics"].get("train_samples_per_second")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or hpu")
    a = ap.parse_args()
    rows = []
    for _ in range(a.rounds):
        for mode in ("none", "sync", "async"):
            r = run(mode, a.steps, a.every, a.threads, a.device)
            print(json.dumps(r), flush=True)
            rows.append(r)
    # Checkpoints written during training (the one at the end is written by every mode alike).
    n = len(range(a.every, a.steps, a.every))
    med = {m: statistics.median(r["elapsed_seconds"] for r in rows if r["mode"] == m) for m in ("none", "sync", "async")}
    print(f"(x) {a.device}: bert-base-sized bert-mlm, {a.steps} steps, a step checkpoint every {a.every} ({n} during training), "
          f"{a.rounds} alternating rounds, median job seconds: none {med['none']:.1f}, sync {med['sync']:.1f}, "
          f"async {med['async']:.1f}; per checkpoint the step pays {(med['sync'] - med['none']) / n:.2f} s sync, "
          f"{(med['async'] - med['none']) / n:.2f} s async; job time vs none: sync {med['sync'] / med['none']:.3f}x, "
          f"async {med['async'] / med['none']:.3f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
