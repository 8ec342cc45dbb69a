"""The memory plan against measured peaks: for each configuration, `trainbook plan --json` (the
planned peak per worker) and `trainbook train --json` (each rank's VmHWM, what
TrainResult::memory reports on CPU), 2 workers of bert-mlm on the Brown corpus, 3 steps (the
peak needs a step with gradients already allocated), no evaluation. Prints one JSON line per
configuration and a markdown table for docs/benchmarks.md.

    python3 bench/memory_plan.py [--only NAME ...] [--trainbook target/release/trainbook]
    python3 bench/memory_plan.py --replan earlier.jsonl   (the plan again, the peaks measured before)
"""

import argparse
import json
import shutil
import subprocess
import sys
import time

# name, global batch (2 workers), options. The first group is what the plan's CPU allocator
# terms were fitted on; the second checks them on configurations not used in the fit.
FIT = [
    ("L2 h512 b16", 32, "--layers 2 --hidden-size 512 --heads 8 --max-length 128"),
    ("L4 h512 b16", 32, "--layers 4 --hidden-size 512 --heads 8 --max-length 128"),
    ("L8 h512 b16", 32, "--layers 8 --hidden-size 512 --heads 8 --max-length 128"),
    ("L4 h512 b8", 16, "--layers 4 --hidden-size 512 --heads 8 --max-length 128"),
    ("L4 h512 b32", 64, "--layers 4 --hidden-size 512 --heads 8 --max-length 128"),
    ("L4 h256 b16", 32, "--layers 4 --hidden-size 256 --heads 8 --max-length 128"),
    ("L4 h768 b16", 32, "--layers 4 --hidden-size 768 --heads 8 --max-length 128"),
]
CHECK = [
    ("tiny (L2 h64 32 tokens) b8", 16, "--layers 2 --hidden-size 64 --heads 4 --max-length 32"),
    ("L4 h512 b16 dropout 0", 32, "--layers 4 --hidden-size 512 --heads 8 --max-length 128 --dropout 0"),
    ("L4 h512 b16 ZeRO-1", 32, "--layers 4 --hidden-size 512 --heads 8 --max-length 128 --zero 1"),
    ("L4 h512 b16 ZeRO-2", 32, "--layers 4 --hidden-size 512 --heads 8 --max-length 128 --zero 2"),
    ("L4 h512 b16 checkpointing", 32, "--layers 4 --hidden-size 512 --heads 8 --max-length 128 --activation-checkpointing"),
    ("L2 h256 b8 bf16", 16, "--layers 2 --hidden-size 256 --heads 4 --max-length 128 --precision bf16"),
    ("L6 h512 b16 ZeRO-2 + checkpointing", 32, "--layers 6 --hidden-size 512 --heads 8 --max-length 128 --zero 2 --activation-checkpointing"),
    ("BERT-base (L12 h768) b8", 16, "--layers 12 --hidden-size 768 --heads 12 --max-length 128"),
    ("BERT-base (L12 h768) b8 ZeRO-1", 16, "--layers 12 --hidden-size 768 --heads 12 --max-length 128 --zero 1"),
    ("BERT-base (L12 h768) b8 ZeRO-2", 16, "--layers 12 --hidden-size 768 --heads 12 --max-length 128 --zero 2"),
    ("BERT-base (L12 h768) b8 checkpointing", 16, "--layers 12 --hidden-size 768 --heads 12 --max-length 128 --activation-checkpointing"),
    ("BERT-large (L24 h1024) b4 ZeRO-2", 8, "--layers 24 --hidden-size 1024 --heads 16 --max-length 128 --zero 2"),
    ("BERT-large (L24 h1024) b4 ZeRO-2 + checkpointing", 8, "--layers 24 --hidden-size 1024 --heads 16 --max-length 128 --zero 2 --activation-checkpointing"),
]


# Causal LMs (causal-lm): Llama shapes from random weights on the Brown corpus, the
# 30,522-token MiniLM vocabulary; full fine-tuning and LoRA (the base frozen). The model
# directory is written by llama_dir().
CAUSAL = [
    ("llama L4 h512 b16", 32, "--max-length 128 @L4 h512"),
    ("llama L4 h512 b16 LoRA r8", 32, "--max-length 128 --lora-rank 8 @L4 h512"),
    ("llama L8 h768 b8", 16, "--max-length 128 @L8 h768"),
    ("llama L8 h768 b8 LoRA r16", 16, "--max-length 128 --lora-rank 16 @L8 h768"),
    ("llama L8 h768 b8 checkpointing", 16, "--max-length 128 --activation-checkpointing @L8 h768"),
]


def llama_dir(shape):
    """A Llama config (layers, hidden from "L4 h512") with the MiniLM tokenizer, in /tmp."""
    import os
    layers, hidden = (int(x[1:]) for x in shape.split())
    d = f"/tmp/trainbook-memory-plan-llama-{layers}x{hidden}"
    os.makedirs(d, exist_ok=True)
    shutil.copy(".data/models/all-MiniLM-L6-v2/tokenizer.json", d)
    with open(f"{d}/config.json", "w") as f:
        json.dump({"model_type": "llama", "vocab_size": 30522, "hidden_size": hidden,
                   "intermediate_size": hidden * 8 // 3, "num_hidden_layers": layers,
                   "num_attention_heads": hidden // 64, "num_key_value_heads": hidden // 128,
                   "max_position_embeddings": 512, "tie_word_embeddings": False}, f)
    return d


def run(exe, command, batch, options):
    if "@" in options:
        options, shape = options.split("@")
        args = [exe, command, "causal-lm", "--model", llama_dir(shape), "--from-scratch",
                "--workers", "2", "--device", "cpu", "--global-batch-size", str(batch),
                "--train-rows", str(batch * 4), "--eval-rows", "0", "--max-steps", "3", "--json",
                "--hang-timeout", "0", "--no-tensorboard", "--runs-root", "/tmp/trainbook-memory-plan"]
        return finish(args + options.split())
    args = [exe, command, "bert-mlm", "--preset", "default", "--workers", "2", "--device", "cpu",
            "--global-batch-size", str(batch), "--train-rows", str(batch * 4), "--eval-rows", "0",
            "--max-steps", "3", "--json", "--hang-timeout", "0", "--no-tensorboard",
            "--runs-root", "/tmp/trainbook-memory-plan"] + options.split()
    return finish(args)


def finish(args):
    out = subprocess.run(args, capture_output=True, text=True)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    # Checkpoints of the large models take gigabytes: only the peaks are kept.
    if result.get("run_dir"):
        shutil.rmtree(result["run_dir"], ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainbook", default="target/release/trainbook")
    ap.add_argument("--only", nargs="*", help="configuration names (substrings)")
    ap.add_argument("--replan", metavar="JSONL",
                    help="plan again the configurations of an earlier run's output and compare with its measured peaks (nothing is trained)")
    a = ap.parse_args()
    measured = {}
    if a.replan:
        for line in open(a.replan):
            r = json.loads(line)
            measured[r["config"]] = r
    rows = []
    for group, configs in (("fit", FIT), ("check", CHECK), ("causal", CAUSAL)):
        for name, batch, options in configs:
            if a.only and not any(o in name for o in a.only):
                continue
            if a.replan and name not in measured:
                continue
            plan = run(a.trainbook, "plan", batch, options)
            t0 = time.time()
            if a.replan:
                before = measured[name]
                peaks = [(r, m * 2**20) for r, m in enumerate(before["measured_mib"])]
            else:
                result = run(a.trainbook, "train", batch, options)
                if result.get("status") != "succeeded":
                    raise SystemExit(f"{name}: {result.get('error')}")
                peaks = [(m["rank"], m["peak"]) for m in result["memory"]]
            # Rank 0 also writes the checkpoints (on CPU under ZeRO it gathers the whole
            # optimizer state for them): its plan is the total plus that.
            planned = [plan["total"] + (plan.get("rank0_extra", 0) if r == 0 else 0) for r, _ in peaks]
            row = {
                "bench": "memory_plan", "group": group, "config": name,
                "planned_mib": [p / 2**20 for p in planned],
                "measured_mib": [p / 2**20 for _, p in peaks],
                "error": [q / p - 1 for q, (_, p) in zip(planned, peaks)],
                "parameters": plan["parameters"], "seconds": time.time() - t0,
                "rows": {r["what"]: r["bytes"] / 2**20 for r in plan["rows"]},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| configuration | group | parameters | planned MiB (rank 0, 1) | measured MiB (rank 0, 1) | error (rank 0, 1) |", file=sys.stderr)
    print("|---|---|---:|---:|---:|---:|", file=sys.stderr)
    for r in rows:
        print(f"| {r['config']} | {r['group']} | {r['parameters'] / 1e6:.1f}M | "
              + ", ".join(f"{m:.0f}" for m in r["planned_mib"]) + " | "
              + ", ".join(f"{m:.0f}" for m in r["measured_mib"]) + " | "
              + ", ".join(f"{e:+.1%}" for e in r["error"]) + " |", file=sys.stderr)


if __name__ == "__main__":
    main()
