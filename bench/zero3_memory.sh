#!/usr/bin/env bash
# ZeRO-3 side by side with PyTorch, in one run: each worker's peak resident set and tokens/s of
# trainbook under --zero 0, 2 and 3 and of PyTorch DDP and FSDP2 (bench/torch_fsdp.py:
# `fully_shard` per decoder layer, then the root, built on the meta device), alternating
# trainbook and PyTorch. A Llama trained from scratch (hidden 1024, LAYERS layers, vocabulary
# 32,000: 157M parameters with 8 layers, the shape issue 76 measured DDP and FSDP2 on), full
# fine-tuning with AdamW, 256 tokens, 2 sequences a worker, WORKERS workers x 1 thread over
# gloo, 7 steps, then one consolidated checkpoint (trainbook's epoch checkpoint; the PyTorch
# script writes one too). Prints one JSON line per run.
#
#   bench/zero3_memory.sh [LAYERS] [WORKERS] [PRECISION]
#       (defaults 8, 2 and fp32; bf16: trainbook's --precision bf16 beside FSDP2's
#       MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) and DDP under bf16 autocast.
#       PyTorch from .bench-venv, made by bench/torch-venv.sh, when present)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-8}
workers=${2:-2}
precision=${3:-fp32}
py=${BENCH_VENV:-.bench-venv}/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$work/llama
. bench/llama_shape.sh
llama_shape "$work" "$layers" 400
opts=(causal-lm --model "$model" --from-scratch --data "$work/text.txt" --workers "$workers" --threads 1
      --max-length 256 --global-batch-size $((2 * workers)) --max-steps 7 --epochs 1 --device cpu
      --precision "$precision")
trainbook_run() {
  local planned
  planned=$(trainbook plan "${opts[@]}" --zero "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
  trainbook train "${opts[@]}" --zero "$1" --runs-root "$work/runs" --json 2>/dev/null | tail -1 \
    | python3 -c 'import json,sys
d = json.loads(sys.stdin.read()); planned = int(sys.argv[2])
print(json.dumps({"run": "trainbook --zero " + sys.argv[1] + " " + sys.argv[3], "tokens_per_second": d["samples_per_second"] * 256,
                  "peak_rss_gib": [round(m["peak"] / 2**30, 3) for m in d["memory"]],
                  "parameters_mib": [round(m["parameters"] / 2**20, 1) for m in d["memory"]],
                  "planned_gib": round(planned / 2**30, 3), "final_loss": d["final_train_loss"]}))' "$1" "$planned" "$precision"
}
torch_run() {
  [ -x "$py" ] || { echo "{\"run\": \"torch $1\", \"skipped\": \"no $py (bench/torch-venv.sh)\"}"; return; }
  "$py" bench/torch_fsdp.py --model "$model" --mode "$1" --workers "$workers" --threads 1 --steps 6 \
    --precision "$precision" 2>/dev/null | tail -1
}
trainbook_run 3
torch_run fsdp2
trainbook_run 0
torch_run ddp
trainbook_run 2
