#!/usr/bin/env bash
# Each worker's peak resident set and throughput under ZeRO 0, 2 and 3, side by side in one run:
# a Llama-shaped model trained from scratch (hidden 1024, 8 layers, vocabulary 32,000: 157M
# parameters, the shape issue 76 measured PyTorch DDP and FSDP2 on), full fine-tuning with AdamW,
# 256 tokens, 2 sequences a worker, 2 workers x 1 thread, 6 steps and the epoch's evaluation and
# checkpoint. Prints each run's memory table (the plan's figures: `trainbook plan` with the same
# options).
#
#   bench/zero3_memory.sh [LAYERS] [WORKERS]      (defaults 8 and 2)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-8}
workers=${2:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$work/llama
mkdir -p "$model"
cat > "$model/config.json" <<EOF
{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":1024,"intermediate_size":2816,
 "num_hidden_layers":$layers,"num_attention_heads":16,"num_key_value_heads":16,"vocab_size":32000,
 "max_position_embeddings":2048,"rms_norm_eps":1e-06,"rope_theta":10000.0,"tie_word_embeddings":false,
 "hidden_act":"silu","torch_dtype":"float32","bos_token_id":1,"eos_token_id":2,"initializer_range":0.02}
EOF
cp tests/fixtures/causal_lm/llama/tokenizer.json tests/fixtures/causal_lm/llama/tokenizer_config.json "$model/"
python3 - "$work/text.txt" <<'EOF'
import random, sys
random.seed(0)
words = "the cat a dog saw chased painted found moon ball door harbour night sailor fox".split()
open(sys.argv[1], "w").write("\n".join(" ".join(random.choice(words) for _ in range(300)) for _ in range(400)))
EOF
opts=(causal-lm --model "$model" --from-scratch --data "$work/text.txt" --workers "$workers" --threads 1
      --max-length 256 --global-batch-size $((2 * workers)) --max-steps 6 --epochs 1 --device cpu)
for z in 0 2 3; do
  echo "== --zero $z"
  trainbook plan "${opts[@]}" --zero "$z" | grep -E "^  total" || true
  trainbook train "${opts[@]}" --zero "$z" --runs-root "$work/runs" 2>&1 \
    | grep -E "samples/s · steps|^rank|^ +[0-9]+ +[0-9.]+ [KMG]i?B"
done
