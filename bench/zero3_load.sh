#!/usr/bin/env bash
# Loading a checkpoint larger than a rank's share under ZeRO-3: 4 workers load a Llama of hidden
# 1024, LAYERS layers (20: 317M parameters, a 1.27 GB fp32 safetensors file) written by
# `transformers` with random weights, once as one model.safetensors and once sharded
# (save_pretrained's model-0000k-of-0000n.safetensors + index). Each worker says how far its
# resident set rose above its start while it built the model and read its slices (the worker's
# own "ZeRO-3: rank r built and loaded ..." line, read from VmHWM before the first step); the
# bound is a quarter of the file plus the largest unit. `--zero 2` (every rank loads the whole
# model) is run beside it for contrast.
#
#   bench/zero3_load.sh [LAYERS]
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. bench/llama_shape.sh
llama_shape "$work" "$layers" 40
mkdir -p "$work/sharded"
cp "$work/llama/"* "$work/sharded/"
scripts/torch-python.sh - "$work" <<'EOF'
import sys, torch, transformers
work = sys.argv[1]
torch.manual_seed(0)
config = transformers.AutoConfig.from_pretrained(f"{work}/llama")
model = transformers.LlamaForCausalLM(config)
model.save_pretrained(f"{work}/llama", safe_serialization=True, max_shard_size="100GB")
model.save_pretrained(f"{work}/sharded", safe_serialization=True, max_shard_size="300MB")
EOF
file_gb=$(du -bc "$work"/llama/*.safetensors | tail -1 | awk '{print $1 / 2^30}')
ls "$work/sharded"
# The largest unit is the root: the embeddings and the untied head, 2 x 32,000 x 1,024 fp32.
unit_gb=$(python3 -c "print(2 * 32000 * 1024 * 4 / 2**30)")
echo "checkpoint: $file_gb GiB; bound per worker: $file_gb / 4 + $unit_gb = $(python3 -c "print(round($file_gb / 4 + $unit_gb, 3))") GiB"
run() {
  local model=$1 zero=$2
  trainbook train causal-lm --model "$model" --data "$work/text.txt" --workers 4 --threads 1 \
    --max-length 32 --global-batch-size 4 --max-steps 1 --epochs 1 --optimizer sgd --device cpu \
    --zero "$zero" --no-memory-check --runs-root "$work/runs" 2>&1 | tee "$work/log" \
    | grep -E "ZeRO-3: rank|peak RSS|^ +[0-9]+ |succeeded|failed" || true
}
echo "== one file, --zero 3"; run "$work/llama" 3
echo "== sharded with an index, --zero 3"; run "$work/sharded" 3
echo "== one file, --zero 2 (every rank loads the whole model)"; run "$work/llama" 2
