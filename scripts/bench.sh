#!/usr/bin/env bash
# Engine benchmarks, side by side in one run (the machine is shared and noisy: compare ratios).
#   scripts/bench.sh [a] [b] [c]     (default: all)
# a: allreduce of 110M float32, 2 workers on loopback: trainbook vs torch.distributed (gloo)
# b: samples/s, 2 workers x 1 thread vs 1 worker x 2 threads
# c: time from launch to the first loss event, tiny preset, 2 workers
# d: BERT accuracy: MiniLM on Rotten Tomatoes, 2 CPU workers, AdamW, max_length 64, 1 epoch over
#    4,000 snippets, eval on the 2,562 held-out ones; both padding modes
# e: BERT training throughput, trainbook vs PyTorch eager + Transformers (bench/torch_bert.py),
#    same model/config/batch/threads, alternating BENCH_BERT_ROUNDS (3) times
# f: ResNet offline default (ResNet-18, 64 px, digits): accuracy after its default epochs
# g: ResNet training throughput, trainbook vs PyTorch eager + torchvision (bench/torch_resnet.py),
#    alternating BENCH_RESNET_ROUNDS (3) times; plus p: the input pipeline alone (images/s)
# h: Jupyter kernel latency, trainbook vs stock evcxr_jupyter 0.22 (bench/kernel_bench.py):
#    start -> first result, trivial round trip, execute -> first training display;
#    BENCH_KERNEL_ROUNDS (3) alternating rounds
# t: untyped `let` and completion latency, the kernel with its trainbook-aware analyzer vs
#    without (bench/kernel_types.py), alternating BENCH_KERNEL_ROUNDS (2) rounds
# k: launch -> first loss of a task defined in a notebook cell vs the built-in recipe it mirrors
#    (bench/kernel_task.py), BENCH_TASK_ROUNDS (5) alternating rounds
# m: BERT masked-LM pre-training throughput, trainbook bert-mlm vs PyTorch eager + Transformers
#    BertForMaskedLM + DDP (bench/torch_bert.py --task mlm): 4-layer hidden-256 from scratch,
#    128-token blocks, global batch 32, alternating BENCH_MLM_ROUNDS (3) times
# n: 2 nodes x 1 worker on loopback (two drivers on 127.0.0.2 and 127.0.0.3) vs 1 node x 2
#    workers: BERT default preset training samples/s, 1 thread per worker, alternating
#    BENCH_NODES_ROUNDS (3) times
# z: ZeRO-1 vs plain data parallelism, BERT default preset with AdamW, 1 thread per worker:
#    optimizer-state bytes per rank at 2 and 4 workers, and training step time at 2 workers,
#    alternating BENCH_ZERO_ROUNDS (3) times
# r: restart latency, trainbook vs Ray Train FailureConfig(max_failures=1) (bench/ray_restart.py):
#    tiny BERT, 2 workers, a checkpoint every 100 steps, rank 1 SIGKILLed at step 250: kill ->
#    first step after the restart, kill -> step 250 again, steps replayed; BENCH_RESTART_ROUNDS
#    (3) alternating rounds
# o: heartbeats and hang detection on vs off (hang_timeout 0): BERT default preset samples/s,
#    2 workers x 1 thread, alternating BENCH_ROUNDS (3) times
# s: hyper-parameter sweep, trainbook vs Ray Tune 2.60 (bench/ray_tune.py): tiny BERT, 1,000 Rotten
#    Tomatoes rows, max length 64, global batch 8, SGD m0.9, 4 epochs, eval on 256 rows per epoch,
#    lr on 8 grid points, 2 concurrent trials of 1 worker / 1 CPU, ASHA (max_t 4, grace 1, factor
#    2) on eval_loss; also trainbook without a scheduler, and one plain 4-epoch run of the same
#    job at 1 thread (one epoch's time, for the compute floor); BENCH_SWEEP_ROUNDS (3) rounds
# v: tracking on vs off: TensorBoard event files plus MLflow logging to a local `mlflow server`
#    vs --no-tensorboard and no MLflow: BERT default preset samples/s, BENCH_TRACKING_WORKERS (2)
#    workers x 1 thread, BENCH_TRACKING_ROWS (1,000) rows, alternating BENCH_ROUNDS (3) times
# w: live dashboard rendering (widgets/benches/render.rs): loss plot of 10^6 points, dashboard
#    bundles, per-event cost
# x: checkpoints on the step's path vs in the background (bench/async_checkpoint.py): a
#    bert-base-sized bert-mlm (~1.3 GB checkpoint with AdamW state), no step checkpoints vs one
#    every 10 steps written synchronously vs asynchronously, BENCH_CKPT_ROUNDS (2) alternating rounds
# y: the memory plan against measured peaks (bench/memory_plan.py): bert-mlm on 2 CPU workers
#    from a 2-layer to BERT-large, ZeRO 0/1/2, activation checkpointing, fp32/bf16; the levers'
#    savings; a markdown table on stderr
# j: causal-LM training throughput (tokens/s), trainbook causal-lm vs PyTorch eager +
#    Transformers, with PEFT for LoRA (bench/torch_lm.py): a 4-layer hidden-256 Llama (4 heads, 2
#    key/value heads, the 30,522-token MiniLM vocabulary) from random weights, 128-token blocks,
#    batch 8, AdamW, 1 worker x all cores, full and LoRA rank 8 on q/k/v/o; steady steps only;
#    alternating BENCH_LM_ROUNDS (3) times
# l: the driver under 1,024 simulated ranks (bench/driver_load.sh): start time, the driver's CPU
#    and memory, event latency, the dashboard's size, de-duplication; BENCH_LOAD_RANKS (1024)
# Results: JSON lines on stdout and a summary; copy them into docs/benchmarks.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export LIBTORCH=${LIBTORCH:-$root/.libtorch}
# The PyTorch baselines' venv, where bench/torch-venv.sh makes it (BENCH_VENV, else .bench-venv).
bench_python=${BENCH_VENV:-$root/.bench-venv}/bin/python
want=("$@"); [ ${#want[@]} -gt 0 ] || want=(a b c d e f g h t k m n z r o s v w x y l j)
has() { local x; for x in "${want[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
# Every cargo run with the features `make build` uses (scripts/cargo.sh), and the binaries built
# as `make build` builds them (all default members), so the benchmarks reuse its binaries and
# leave them as they were.
export PYO3_PYTHON=$(cat .libtorch/hpu-python 2>/dev/null || echo python3)
out=$(mktemp)
# Build first, so no compilation overlaps the first measured round.
scripts/cargo.sh bench -q -p trainbook --bench engine --no-run
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)" >&2

if has a; then
  bench/torch-venv.sh
  # Alternate the two implementations so load drift hits both.
  for round in $(seq "${BENCH_AR_ROUNDS:-5}"); do
    scripts/cargo.sh bench -q -p trainbook --bench engine -- a | tee -a "$out"
    "$bench_python" bench/torch_allreduce.py --numel 110000000 --iters 10 | sed 's/^{/{"bench": "allreduce", /' | tee -a "$out"
  done
fi
has b && scripts/cargo.sh bench -q -p trainbook --bench engine -- b | tee -a "$out"
has y && python3 bench/memory_plan.py --trainbook target/release/trainbook | tee -a "$out"
if has j; then
  scripts/cargo.sh build -q --release --bins
  lm=$(mktemp -d)
  cp .data/models/all-MiniLM-L6-v2/tokenizer.json "$lm/"
  echo '{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 30522,
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": false, "hidden_act": "silu"}' > "$lm/config.json"
  for round in $(seq "${BENCH_LM_ROUNDS:-3}"); do
    for rank in 0 8; do
      lora=$([ "$rank" = 0 ] || echo --lora-rank "$rank")
      # The Brown corpus (the recipe's default data), prepared once and cached.
      target/release/trainbook train causal-lm --model "$lm" --from-scratch --device cpu --workers 1 \
        --threads "$(nproc)" --max-length 128 --global-batch-size 8 --max-steps 25 --lr 1e-4 \
        --runs-root "$(mktemp -d)" $lora --json 2>/dev/null | tail -n1 |
        python3 -c "import json,sys; r=json.load(sys.stdin); print(json.dumps({'bench': 'causal_lm', 'impl': 'trainbook', 'lora_rank': $rank, 'round': $round, 'tokens_per_second': r['metrics']['train_samples_per_second'] * 128}))" |
        tee -a "$out"
      scripts/torch-python.sh bench/torch_lm.py --model "$lm" --threads "$(nproc)" --steps 20 --warmup 5 \
        --lora-rank "$rank" 2>/dev/null | sed "s/^{/{\"bench\": \"causal_lm\", \"impl\": \"pytorch\", \"round\": $round, /" |
        tee -a "$out"
    done
  done
fi
if has r; then
  bench/ray-venv.sh
  for round in $(seq "${BENCH_RESTART_ROUNDS:-3}"); do
    BENCH_ROUNDS=1 scripts/cargo.sh bench -q -p trainbook --bench engine -- r | tee -a "$out"
    "$bench_python" bench/ray_restart.py --rounds 1 2>/dev/null | tee -a "$out"
  done
fi
has o && scripts/cargo.sh bench -q -p trainbook --bench engine -- o | tee -a "$out"
if has v; then
  scripts/cargo.sh build -q --release --bins
  # A local MLflow server (SQLite store, artifacts in a temporary directory), as a team's would be.
  mlruns=$(mktemp -d); mlport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  setsid .venv/bin/mlflow server --host 127.0.0.1 --port "$mlport" --workers 1 \
    --backend-store-uri "sqlite:///$mlruns/mlflow.db" --artifacts-destination "$mlruns/artifacts" >/dev/null 2>&1 &
  mlpid=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$mlport/health" >/dev/null && break; sleep 1; done
  for round in $(seq "${BENCH_ROUNDS:-3}"); do
    for tracking in both off; do
      flags=$([ $tracking = off ] && echo --no-tensorboard || echo --mlflow "http://127.0.0.1:$mlport")
      target/release/trainbook train bert --device cpu --workers "${BENCH_TRACKING_WORKERS:-2}" --threads 1 --epochs 1 \
        --train-rows "${BENCH_TRACKING_ROWS:-1000}" --eval-rows 0 --runs-root "$(mktemp -d)" $flags --json 2>/dev/null | tail -n1 |
        python3 -c "import json,sys; r=json.load(sys.stdin); print(json.dumps({'bench': 'tracking', 'tensorboard_and_mlflow': '$tracking', 'round': $round, 'samples_per_second': r['samples_per_second'], 'elapsed_seconds': r['elapsed_seconds'], 'warnings': r['warnings']}))" |
        tee -a "$out"
    done
  done
  kill -- -"$mlpid" 2>/dev/null || kill "$mlpid" 2>/dev/null || true
fi
if has s; then
  bench/ray-venv.sh
  scripts/cargo.sh build -q --release --bins
  sweep_job=(bert --preset tiny --device cpu --workers 1 --train-rows 1000 --eval-rows 256
    --max-length 64 --global-batch-size 8 --optimizer sgd --momentum 0.9 --epochs 4
    --runs-root "$(mktemp -d)")
  lrs=1e-4,2e-4,5e-4,1e-3,2e-3,5e-3,1e-2,2e-2
  # One trainbook sweep as a JSON line: wall time (process start to exit), trial-epochs, pruned.
  tb_sweep() {
    local t0 t1
    t0=$(date +%s.%N)
    target/release/trainbook sweep "${sweep_job[@]}" --grid lr=$lrs --concurrent 2 \
      --metric eval_loss:min "$@" --json 2>/dev/null | tail -n1 > "$out.sweep"
    t1=$(date +%s.%N)
    python3 - "$t0" "$t1" "$*" "$out.sweep" <<'PY'
import json, sys
t0, t1, flags, path = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
r = json.load(open(path))
best = next((t for t in r["trials"] if t["id"] == r["best_trial"]), None)
print(json.dumps({"bench": "sweep", "impl": "trainbook", "scheduler": "asha" if "--asha" in flags else "none",
    "wall_seconds": round(t1 - t0, 3), "sweep_seconds": round(r["elapsed_seconds"], 3),
    "trials": len(r["trials"]), "stopped_early": sum(t["status"] == "pruned" for t in r["trials"]),
    "trial_epochs": sum(len(t["reports"]) for t in r["trials"]),
    "best_lr": best and best["params"]["lr"], "best_eval_loss": best and best["last"],
    "per_trial": [{"lr": t["params"]["lr"], "epochs": len(t["reports"]), "eval_loss": t["last"], "status": t["status"]} for t in r["trials"]]}))
PY
  }
  for round in $(seq "${BENCH_SWEEP_ROUNDS:-3}"); do
    tb_sweep --asha --grace 1 --reduction-factor 2 | tee -a "$out"
    "$bench_python" bench/ray_tune.py --rounds 1 2>/dev/null | tee -a "$out"
  done
  tb_sweep | tee -a "$out"
  target/release/trainbook train "${sweep_job[@]}" --lr 1e-3 --threads 1 --json 2>/dev/null | tail -n1 |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"bench": "sweep_epoch", "epochs": 4, "elapsed_seconds": r["elapsed_seconds"], "epoch_seconds": r["elapsed_seconds"] / 4}))' |
    tee -a "$out"
fi
has c && scripts/cargo.sh bench -q -p trainbook --bench engine -- c | tee -a "$out"

tb=target/release/trainbook
if has d || has e || has f || has g || has m || has n; then scripts/cargo.sh build -q --release --bins; fi
if has d; then
  for padding in dynamic max-length; do
    $tb train bert --workers 2 --device cpu --preset default --optimizer adamw --lr 1e-4 \
      --schedule linear --warmup-ratio 0.1 --global-batch-size 16 --max-length 64 --epochs 1 \
      --train-rows 4000 --eval-rows 100000 --padding $padding --json 2>/dev/null | tail -n1 |
      sed "s/^{/{\"bench\": \"bert_accuracy\", \"padding\": \"$padding\", /" | tee -a "$out"
  done
fi
if has e; then
  bench/torch-venv.sh
  steps=${BENCH_BERT_STEPS:-30}
  for round in $(seq "${BENCH_BERT_ROUNDS:-3}"); do
    $tb train bert --workers 2 --device cpu --preset default --optimizer adamw --lr 5e-5 \
      --global-batch-size 32 --max-length 64 --padding max-length --max-steps "$steps" --eval-rows 0 \
      --json 2>/dev/null | tail -n1 | sed 's/^{/{"bench": "bert_throughput", "impl": "trainbook", /' | tee -a "$out"
    "$bench_python" bench/torch_bert.py --workers 2 --global-batch-size 32 --max-length 64 \
      --steps "$steps" 2>/dev/null | tee -a "$out"
  done
fi
if has m; then
  bench/torch-venv.sh
  steps=${BENCH_MLM_STEPS:-30}
  for round in $(seq "${BENCH_MLM_ROUNDS:-3}"); do
    $tb train bert-mlm --workers 2 --device cpu --preset default --optimizer adamw --lr 5e-4 \
      --data .data/datasets/rotten_tomatoes/reviews.csv --schedule constant --warmup-ratio 0 --global-batch-size 32 --max-steps "$steps" --eval-rows 0 \
      --json 2>/dev/null | tail -n1 | sed 's/^{/{"bench": "bert_mlm_throughput", "impl": "trainbook", /' | tee -a "$out"
    "$bench_python" bench/torch_bert.py --task mlm --workers 2 --global-batch-size 32 \
      --max-length 128 --lr 5e-4 --steps "$steps" --warmup 5 2>/dev/null | tee -a "$out"
  done
fi
if has f; then
  $tb train resnet --workers 2 --device cpu --json 2>/dev/null | tail -n1 |
    sed 's/^{/{"bench": "resnet_accuracy", /' | tee -a "$out"
fi
if has g; then
  bench/torch-venv.sh
  steps=${BENCH_RESNET_STEPS:-30}
  scripts/cargo.sh bench -q -p trainbook --bench engine -- p | tee -a "$out"
  for round in $(seq "${BENCH_RESNET_ROUNDS:-3}"); do
    $tb train resnet --workers 2 --device cpu --preset default --max-steps "$steps" --eval-rows 0 \
      --json 2>/dev/null | tail -n1 | sed 's/^{/{"bench": "resnet_throughput", "impl": "trainbook", /' | tee -a "$out"
    "$bench_python" bench/torch_resnet.py --workers 2 --global-batch-size 32 --image-size 64 \
      --steps "$steps" 2>/dev/null | tee -a "$out"
  done
fi
if has n; then
  steps=${BENCH_NODES_STEPS:-30}
  bert=(train bert --device cpu --preset default --optimizer adamw --lr 5e-5 --threads 1
        --global-batch-size 32 --max-length 64 --padding max-length --max-steps "$steps" --eval-rows 0 --json)
  for round in $(seq "${BENCH_NODES_ROUNDS:-3}"); do
    $tb "${bert[@]}" --workers 2 2>/dev/null | tail -n1 |
      sed 's/^{/{"bench": "nodes_throughput", "layout": "1x2", /' | tee -a "$out"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2", 0)); print(s.getsockname()[1])')
    nodes=(--workers 1 --nnodes 2 --master-addr 127.0.0.2 --master-port "$port")
    $tb "${bert[@]}" "${nodes[@]}" --node-rank 1 --node-addr 127.0.0.3 >/dev/null 2>&1 &
    $tb "${bert[@]}" "${nodes[@]}" --node-rank 0 --node-addr 127.0.0.2 2>/dev/null | tail -n1 |
      sed 's/^{/{"bench": "nodes_throughput", "layout": "2x1", /' | tee -a "$out"
    wait
  done
fi

if has z; then
  steps=${BENCH_ZERO_STEPS:-30}
  bert=(train bert --device cpu --preset default --optimizer adamw --lr 5e-5 --threads 1
        --global-batch-size 32 --max-length 64 --padding max-length --eval-rows 0 --json)
  for workers in 2 4; do
    for zero in 0 1; do
      $tb "${bert[@]}" --workers $workers --zero $zero --max-steps 4 2>/dev/null | tail -n1 |
        sed "s/^{/{\"bench\": \"zero_memory\", \"zero\": $zero, /" | tee -a "$out"
    done
  done
  for round in $(seq "${BENCH_ZERO_ROUNDS:-3}"); do
    for zero in 0 1; do
      $tb "${bert[@]}" --workers 2 --zero $zero --max-steps "$steps" 2>/dev/null | tail -n1 |
        sed "s/^{/{\"bench\": \"zero_step\", \"zero\": $zero, /" | tee -a "$out"
    done
  done
fi

if has w; then
  cargo bench -q -p trainbook-widgets --bench render
fi
if has x; then
  scripts/cargo.sh build -q --release --bins
  .venv/bin/python bench/async_checkpoint.py --rounds "${BENCH_CKPT_ROUNDS:-2}"
fi
if has l; then
  bench/driver_load.sh "${BENCH_LOAD_RANKS:-1024}"
fi

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
    if r.get("bench") == "bert_accuracy":
        m = r["metrics"]
        print(f"(d) padding {r['padding']}: eval accuracy {m.get('eval_accuracy', float('nan')):.4f} after 1 epoch "
              f"({r['steps']} steps), {r['elapsed_seconds']:.0f} s wall, {m['samples_per_second']:.1f} samples/s training (target >= 0.78)")
for r in rows:
    if r.get("bench") == "resnet_accuracy":
        m = r["metrics"]
        print(f"(f) ResNet default: val accuracy {m.get('eval_accuracy', float('nan')):.4f} after {r['steps']} steps, "
              f"{r['elapsed_seconds']:.0f} s wall, {m['samples_per_second']:.1f} images/s training (target >= 0.97)")
    if r.get("bench") == "pipeline":
        print(f"(g) input pipeline alone, {r['threads']} thread(s): {r['images_per_second']:.0f} images/s at 64 px")
for name, label in (("bert_throughput", "(e) BERT"), ("resnet_throughput", "(g) ResNet")):
    bt = [r for r in rows if r.get("bench") == name]
    if not bt:
        continue
    ours = [r["samples_per_second"] for r in bt if r.get("impl") == "trainbook"]
    torch = [r["samples_per_second"] for r in bt if r.get("impl") == "pytorch"]
    paired = statistics.median(a / b for a, b in zip(ours, torch))
    print(f"{label} training samples/s, {len(ours)} alternating rounds: trainbook {statistics.median(ours):.1f}, "
          f"PyTorch eager {statistics.median(torch):.1f} (medians); median paired ratio {paired:.3f}x (target >= 1.0)")
nt = [r for r in rows if r.get("bench") == "nodes_throughput"]
if nt:
    one = [r["metrics"]["train_samples_per_second"] for r in nt if r["layout"] == "1x2"]
    two = [r["metrics"]["train_samples_per_second"] for r in nt if r["layout"] == "2x1"]
    paired = statistics.median(b / a for a, b in zip(one, two))
    print(f"(n) BERT samples/s after warm-up, {len(one)} alternating rounds: 2 nodes x 1 worker on loopback "
          f"{statistics.median(two):.1f}, 1 node x 2 workers {statistics.median(one):.1f} (medians); "
          f"median paired ratio {paired:.3f}x")
zm = [r for r in rows if r.get("bench") == "zero_memory"]
for w in sorted({r["workers"] for r in zm}):
    ddp = next(r for r in zm if r["workers"] == w and r["zero"] == 0)
    zero = next(r for r in zm if r["workers"] == w and r["zero"] == 1)
    full = ddp["memory"][0]["optimizer_state"]
    shares = [m["optimizer_state"] / full for m in zero["memory"]]
    print(f"(z) {w} workers: optimizer state per rank {full / 2**20:.1f} MiB without ZeRO; with ZeRO-1 "
          + ", ".join(f"{m['optimizer_state'] / 2**20:.1f}" for m in zero["memory"])
          + f" MiB = {min(shares):.3f}..{max(shares):.3f} of it (target {1 / w:.3f} +- 5%); peak RSS rank 0 "
          f"{ddp['memory'][0]['peak'] / 2**20:.0f} -> {zero['memory'][0]['peak'] / 2**20:.0f} MiB")
zs = [r for r in rows if r.get("bench") == "zero_step"]
if zs:
    # Step time is the inverse of steady samples/s; pair each ZeRO run with the DDP run before it.
    ddp = [r["metrics"]["train_samples_per_second"] for r in zs if r["zero"] == 0]
    zero = [r["metrics"]["train_samples_per_second"] for r in zs if r["zero"] == 1]
    ratios = [d / z for d, z in zip(ddp, zero)]
    print(f"(z) 2 workers, step time ZeRO-1 / DDP over {len(ratios)} alternating rounds: "
          + ", ".join(f"{x:.3f}" for x in ratios)
          + f"; median {statistics.median(ratios):.3f}x (target <= 1.1); samples/s DDP "
          f"{statistics.median(ddp):.1f}, ZeRO-1 {statistics.median(zero):.1f}")
lm = [r for r in rows if r.get("bench") == "causal_lm"]
for rank in sorted({r["lora_rank"] for r in lm}):
    ours = [r["tokens_per_second"] for r in lm if r["impl"] == "trainbook" and r["lora_rank"] == rank]
    torch = [r["tokens_per_second"] for r in lm if r["impl"] == "pytorch" and r["lora_rank"] == rank]
    paired = statistics.median(a / b for a, b in zip(ours, torch))
    print(f"(j) causal LM {'LoRA rank ' + str(rank) if rank else 'full fine-tuning'}, tokens/s over {len(ours)} "
          f"alternating rounds: trainbook {statistics.median(ours):.0f}, PyTorch eager + Transformers"
          f"{' + PEFT' if rank else ''} {statistics.median(torch):.0f} (medians); median paired ratio {paired:.3f}x (target >= 1.0)")
mlm = [r for r in rows if r.get("bench") == "bert_mlm_throughput"]
if mlm:
    # Steady state on both sides: the first 5 steps left out.
    ours = [r["metrics"]["train_samples_per_second"] for r in mlm if r.get("impl") == "trainbook"]
    torch = [r["samples_per_second_after_warmup"] for r in mlm if r.get("impl") == "pytorch"]
    paired = statistics.median(a / b for a, b in zip(ours, torch))
    print(f"(m) BERT masked-LM samples/s after 5 warm-up steps, {len(ours)} alternating rounds: trainbook "
          f"{statistics.median(ours):.1f}, PyTorch eager + Transformers {statistics.median(torch):.1f} (medians); "
          f"median paired ratio {paired:.3f}x (target >= 1.0)")
PY
if has h; then
  bench/evcxr-stock.sh
  JUPYTER_PATH="$root/.venv/share/jupyter:$root/.bench-evcxr/share/jupyter" \
    .venv/bin/python bench/kernel_bench.py --rounds "${BENCH_KERNEL_ROUNDS:-3}"
fi
if has t; then
  JUPYTER_PATH="$root/.venv/share/jupyter" \
    .venv/bin/python bench/kernel_types.py --rounds "${BENCH_KERNEL_ROUNDS:-2}"
fi
if has k; then
  JUPYTER_PATH="$root/.venv/share/jupyter" \
    .venv/bin/python bench/kernel_task.py --rounds "${BENCH_TASK_ROUNDS:-5}"
fi
rm -f "$out"
