#!/usr/bin/env bash
# A model whose plain data-parallel run does not fit this machine with 4 workers, trained under
# ZeRO-3: a Llama of hidden 1024, LAYERS layers (20: 317M parameters), vocabulary 32,000, full
# fine-tuning with AdamW, 256 tokens, 2 sequences a worker, 4 steps and the epoch's evaluation and
# checkpoint. Prints the memory check's verdict for DDP on 4 workers, then each worker's peak
# resident set (whole run and training steps only, sampled from /proc every 0.25 s) of DDP on 2
# workers (a replicated rank holds the same whatever the worker count) and of ZeRO-3 on 4.
#
#   bench/zero3_large.sh [LAYERS] [DDP_WORKERS]
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$work/llama
. bench/llama_shape.sh
llama_shape "$work" "$layers" 200
opts() {
  echo causal-lm --model "$model" --from-scratch --data "$work/text.txt" --workers "$1" --threads 1 \
    --max-length 256 --global-batch-size $((2 * $1)) --max-steps 4 --epochs 1 --device cpu --zero "$2"
}
echo "== DDP on 4 workers: the memory check"
trainbook plan $(opts 4 0) | grep -E "^  total" || true
# Samples every worker's VmRSS while `trainbook train` runs; prints the peaks.
measured() {
  local log=$work/log.$1.$2 rss=$work/rss.$1.$2
  ( while true; do
      for p in $(pgrep -f trainbook-worker); do
        awk -v p="$p" -v t="$(date +%s.%N)" '/VmRSS/{print t, p, $2}' "/proc/$p/status" 2>/dev/null
      done
      sleep 0.25
    done ) > "$rss" &
  local sampler=$!
  # Expanded now: the EXIT trap runs outside this function, where `sampler` is not set.
  trap "kill $sampler 2>/dev/null; rm -rf '$work'" EXIT
  # The plan errs high and the machine's free memory moves: measure whatever it says.
  trainbook train $(opts "$1" "$2") --no-memory-check --runs-root "$work/runs" 2>&1 \
    | while IFS= read -r l; do echo "$(date +%s.%N) $l"; done > "$log"
  kill "$sampler"
  python3 - "$rss" "$log" "$1" "$2" <<'EOF'
import sys
rss, log, workers, zero = sys.argv[1:]
rows = [l.split() for l in open(rss)]
steps = [float(l.split()[0]) for l in open(log) if "train epoch:[0]" in l]
peaks = {}
for t, p, kib in rows:
    whole, train = peaks.get(p, (0, 0))
    gib = int(kib) / 2**20
    peaks[p] = (max(whole, gib), max(train, gib) if float(t) <= max(steps) else train)
print(f"--zero {zero}, {workers} workers: peak RSS per worker (whole run / training steps):",
      ", ".join(f"{w:.2f} / {t:.2f} GiB" for w, t in peaks.values()))
print("  ", [l.split(None, 1)[1].strip() for l in open(log) if "succeeded" in l or "failed" in l][-1:])
EOF
}
# DDP_WORKERS 0: only ZeRO-3.
[ "${2:-2}" = 0 ] || measured "${2:-2}" 0
measured 4 3
