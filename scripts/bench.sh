#!/usr/bin/env bash
# Engine benchmarks, side by side in one run (the machine is shared and noisy: compare ratios).
#   scripts/bench.sh [a] [b] [c]     (default: all)
# a: allreduce of 110M float32, 2 workers on loopback: trainbook vs torch.distributed (gloo)
# b: samples/s, 2 workers x 1 thread vs 1 worker x 2 threads
# c: time from launch to the first loss event, tiny preset, 2 workers
# Results: JSON lines on stdout and a summary; copy them into docs/benchmarks.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export LIBTORCH=${LIBTORCH:-$root/.libtorch}
want=("$@"); [ ${#want[@]} -gt 0 ] || want=(a b c)
has() { local x; for x in "${want[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
features=$(test "$(cat .libtorch/cuda 2>/dev/null)" = 1 && echo --features trainbook/cuda || true)
out=$(mktemp)
# Build first, so no compilation overlaps the first measured round.
cargo bench -q -p trainbook $features --bench engine --no-run
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)" >&2

if has a; then
  bench/torch-venv.sh
  # Alternate the two implementations so load drift hits both.
  for round in $(seq "${BENCH_AR_ROUNDS:-5}"); do
    cargo bench -q -p trainbook $features --bench engine -- a | tee -a "$out"
    .bench-venv/bin/python bench/torch_allreduce.py --numel 110000000 --iters 10 | sed 's/^{/{"bench": "allreduce", /' | tee -a "$out"
  done
fi
has b && cargo bench -q -p trainbook $features --bench engine -- b | tee -a "$out"
has c && cargo bench -q -p trainbook $features --bench engine -- c | tee -a "$out"

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ar = [r for r in rows if r.get("bench") == "allreduce"]
if ar:
    # Rounds alternate trainbook, torch; pair each with its neighbour (same machine state) and
    # take the median of the paired ratios, plus the ratio of the best runs.
    ours = [r for r in ar if r.get("impl") == "trainbook"]
    torch = [r for r in ar if r.get("impl") == "torch.distributed"]
    paired = statistics.median(a["median_s"] / b["median_s"] for a, b in zip(ours, torch))
    best = min(r["min_s"] for r in ours) / min(r["min_s"] for r in torch)
    om = statistics.median(r["median_s"] for r in ours)
    tm = statistics.median(r["median_s"] for r in torch)
    print(f"(a) allreduce 110M f32, 2 workers, {len(ours)} alternating rounds: trainbook {om*1e3:.0f} ms, "
          f"torch.distributed {tm*1e3:.0f} ms (medians); median paired ratio {paired:.3f}x, best-run ratio {best:.3f}x (target <= 1.05)")
for r in rows:
    if r.get("bench") == "throughput":
        print(f"(b) samples/s: 2x1 {r['two_workers_one_thread']:.1f}, 1x2 {r['one_worker_two_threads']:.1f}, ratio {r['ratio']:.3f} (target >= 0.85)")
    if r.get("bench") == "startup":
        print(f"(c) launch -> first loss: median {r['median_s']:.2f} s over {len(r['runs_s'])} runs (target <= 2 s)")
PY
rm -f "$out"
