#!/usr/bin/env bash
# trainbook's CUDA checks and benchmarks, in one run on a GPU machine (packed by
# bench/cuda/pack.sh into .gpu/pack.tar.xz; the machine's python3 must hold the same torch):
#   bash bench/cuda/device.sh [checks|bench|all|scaling|checks+scaling|resnet|strong|speed|lm]
#                                    (default all; results in $OUT or ./cuda-out)
#
# checks: NCCL collectives (`trainbook check`), the optimizer unit tests on the GPU (the fused
#   CUDA AdamW/SGD kernels against libtorch's own optimizers), 1 worker on CUDA against 1 worker
#   on the CPU step for step (fp32, dropout 0), ZeRO-1 against plain data parallelism on CUDA,
#   a bf16 run, and a CUDA checkpoint resumed on the CPU.
# bench: training throughput, trainbook against PyTorch eager (bench/torch_bert.py,
#   bench/torch_resnet.py) on the same GPU, one after the other: BERT-base masked-LM from
#   scratch at 128 tokens and ResNet-50 at 224 px, both bf16; samples/s after warm-up, the ratio,
#   MFU, and each side's peak GPU memory. bench/cuda/summary.py writes summary.md.
# speed: the speed issue's table in one call: a check, BERT with this build, the build in
#   .gpu/base.tar.xz (PACK_REV=... bench/cuda/pack.sh), again and with --cuda-graphs, host waits
#   counted (TRAINBOOK_CUDA_SYNC_DEBUG), profiles with the GPU busy share, the memory plan
#   against measured peaks (with and without activation checkpointing), ResNet-50 fed by its
#   loader and with its images held on the GPU, the strong baselines. DEADLINE (seconds, default 540) bounds the whole call.
# TORCH_BASELINES=0 leaves out bench's older PyTorch runs (bench/torch_*.py; the strong ones stay).
# strong (part of bench too): the strong baselines (bench/cuda/strong.py): PyTorch eager done well
#   and torch.compile for BERT-base MLM (fused q/k/v, SDPA, the head on the masked positions,
#   fused AdamW) and ResNet-50 (NCHW, channels-last, channels-last compiled), data on the GPU.
# scaling: ResNet-50 with 4 and 14 loader threads (is the GPU fed?), BERT at batch 512.
# lm: causal LMs, a Llama-3.2-1B-shaped model in bf16: trainbook's full and LoRA fine-tuning
#   against PyTorch eager + Transformers (+ PEFT) with the fused AdamW (bench/torch_lm.py),
#   tokens/s and peak memory, and the LoRA job's memory plan. ~6 minutes.
# One GPU holds one NCCL rank (NCCL refuses two ranks on one device), so every run has 1 worker.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
what=${1:-all}
final=${OUT:-$root/cuda-out}
work=/tmp/trainbook-cuda
out=$work/results      # every result file; $final gets device.log, summary.md and results.tgz
rm -rf "$work" && mkdir -p "$out" "$final"
log=$final/device.log
exec > >(tee -a "$log") 2>&1
say() { printf '\n=== %s (%ss)\n' "$*" "$SECONDS"; }
py=${PYTHON:-python3}

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

say "bf16 matrix product, 8192^3 (the GPU's measured ceiling)"
"$py" - <<'PY' | tee "$out/matmul.txt"
import torch
a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): a @ b
e.record(); torch.cuda.synchronize()
print(f"{2 * 8192**3 * 10 / (s.elapsed_time(e) / 1e3) / 1e12:.0f} TFLOP/s")
PY

say "unpack"
tar -C "$work" -xJf .gpu/pack.tar.xz || exit 1
want=$(cat "$work/torch-version")
have=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
[ "$want" = "$have" ] || { echo "error: packed for torch $want, this machine has $have: bench/cuda/pack.sh $have"; exit 1; }
LIBTORCH=$(cat "$work/libtorch-path") TRAINBOOK_TORCH_PYTHON=$(command -v "$py") TRAINBOOK_CUDA=1 \
  TRAINBOOK_HPU=0 scripts/libtorch-layout.sh || exit 1
export PATH=$work/bin:$PATH TRAINBOOK_DATA=$work/data TRAINBOOK_RUNS=$work/runs
tb=$work/bin/trainbook
run() { # name, timeout, command...: the command's stdout's last line goes to $out/NAME.json
  local name=$1 limit=$2; shift 2
  say "$name: $*"
  timeout "$limit" "$@" > "$work/$name.stdout"
  local rc=$?
  tail -n1 "$work/$name.stdout" > "$out/$name.json"
  echo "[$name] exit $rc"
  echo "$name $rc" >> "$out/exits.txt"
  return $rc
}
: > "$out/exits.txt"
tiny=(train synthetic --preset tiny --workers 1 --dropout 0 --seed 7 --json --log-level warn)

if [ "$what" = all ] || [ "${what%%+*}" = checks ]; then
  run check1 60 "$tb" check --device cuda --workers 1
  # Two ranks on one GPU: NCCL's answer, recorded (expected: a clear error, not a hang).
  run check2 60 "$tb" check --device cuda --workers 2
  say "optimizer unit tests on the GPU"
  TRAINBOOK_TEST_DEVICE=cuda timeout 120 "$work/bin/engine-unit-tests" --test-threads=1 \
    optim::tests 2>&1 | tail -n 15
  echo "unit $?" >> "$out/exits.txt"
  run cpu_fp32 120 "$tb" "${tiny[@]}" --max-steps 20 --device cpu --threads 8
  run cuda_fp32 120 "$tb" "${tiny[@]}" --max-steps 20 --device cuda
  run cuda_zero1 120 "$tb" "${tiny[@]}" --max-steps 20 --device cuda --zero 1 --optimizer adamw
  run cuda_zero0 120 "$tb" "${tiny[@]}" --max-steps 20 --device cuda --zero 0 --optimizer adamw
  run cuda_bf16 120 "$tb" "${tiny[@]}" --device cuda --precision bf16 --max-steps 60
  ckpt=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["last_checkpoint"] or "")' "$out/cuda_fp32.json" 2>/dev/null)
  run resume_on_cpu 120 "$tb" train synthetic --preset tiny --workers 1 --dropout 0 --seed 7 \
    --max-steps 30 --json --log-level warn --device cpu --threads 8 --resume-from "$ckpt"
  for r in cpu_fp32 cuda_fp32 cuda_zero0 cuda_zero1 cuda_bf16; do
    d=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/$r.json" 2>/dev/null) \
      && cp "$d/metrics.parquet" "$out/$r.parquet" 2>/dev/null
  done
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = resnet ]; then
  B=${BERT_BATCH:-256} R=${RESNET_BATCH:-256}
  bert=(--workers 1 --max-length 128 --global-batch-size "$B")
  [ "$what" = resnet ] || run tb_bert 300 "$tb" train bert-mlm "${bert[@]}" --device cuda --precision bf16 --layers 12 \
    --hidden-size 768 --heads 12 --max-steps "${BERT_STEPS:-80}" --optimizer adamw --lr 5e-5 \
    --weight-decay 0.01 --schedule constant --eval-rows 0 --json --log-level warn
  [ "$what" = resnet ] || [ "${TORCH_BASELINES:-1}" = 0 ] || run torch_bert 300 "$py" bench/torch_bert.py --task mlm "${bert[@]}" --device cuda --precision bf16 \
    --layers 12 --hidden 768 --heads 12 --steps "${BERT_STEPS:-80}" --warmup 20 \
    --data "$TRAINBOOK_DATA/datasets/brown/brown.txt" --model-dir "$TRAINBOOK_DATA/models/all-MiniLM-L6-v2"
  run tb_resnet 300 "$tb" train resnet --workers 1 --device cuda --precision bf16 --arch resnet50 \
    --image-size 224 --global-batch-size "$R" --max-steps "${RESNET_STEPS:-60}" --optimizer adamw \
    --lr 1e-3 --weight-decay 0 --schedule constant --loader-threads 12 --eval-rows 0 --json --log-level warn
  [ "${TORCH_BASELINES:-1}" = 0 ] || run torch_resnet 300 "$py" bench/torch_resnet.py --workers 1 --device cuda --precision bf16 \
    --arch resnet50 --image-size 224 --global-batch-size "$R" --steps "${RESNET_STEPS:-60}" \
    --warmup 20 --num-workers-loader 12 --data "$TRAINBOOK_DATA/datasets/digits/train"
  for r in tb_bert tb_resnet; do
    d=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/$r.json" 2>/dev/null) \
      && cp "$d/metrics.parquet" "$out/$r.parquet" 2>/dev/null
  done
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = strong ]; then
  say "strong baselines: bench/cuda/strong.py"
  timeout 420 "$py" bench/cuda/strong.py --steps "${STRONG_STEPS:-50}" --warmup 15 > "$out/strong.jsonl"
  echo "strong $?" >> "$out/exits.txt"
  cat "$out/strong.jsonl"
fi

if [ "$what" = speed ]; then
  # The speed issue's table in one call (~8 minutes on an H200): a CUDA-against-CPU check of
  # this build, trainbook's BERT and ResNet-50 steps with a profile of each (the device's busy
  # share of a step), the build in .gpu/base.tar.xz (when packed) on the same BERT job for a
  # before/after ratio, then the strong PyTorch baselines, the compiled ones last.
  run check1 60 "$tb" check --device cuda --workers 1
  run cpu_fp32 120 "$tb" "${tiny[@]}" --max-steps 20 --device cpu --threads 8
  run cuda_fp32 120 "$tb" "${tiny[@]}" --max-steps 20 --device cuda
  bert=(train bert-mlm --workers 1 --max-length 128 --global-batch-size 256 --device cuda
    --precision bf16 --layers 12 --hidden-size 768 --heads 12 --max-predictions-per-seq 20
    --optimizer adamw --lr 5e-5 --weight-decay 0.01 --schedule constant --eval-rows 0 --json --log-level warn)
  resnet=(train resnet --workers 1 --device cuda --precision bf16 --arch resnet50 --image-size 224
    --global-batch-size 256 --optimizer adamw --lr 1e-3 --weight-decay 0 --schedule constant
    --loader-threads 14 --eval-rows 0 --json --log-level warn)
  base=()
  if [ -f .gpu/base.tar.xz ]; then
    mkdir -p "$work/base" && tar -C "$work/base" -xJf .gpu/base.tar.xz && base=("$work/base/bin/trainbook")
  fi
  run tb_bert 180 "$tb" "${bert[@]}" --max-steps 80
  [ ${#base[@]} = 0 ] || run base_bert 180 "${base[@]}" "${bert[@]}" --max-steps 80
  run tb_bert_again 180 "$tb" "${bert[@]}" --max-steps 80
  run tb_bert_graphs 180 "$tb" "${bert[@]}" --max-steps 80 --cuda-graphs
  run tb_bert_profile 180 "$tb" "${bert[@]}" --max-steps 36 --profile 30..34
  # The memory plan against the measured peak (max_memory_allocated), with and without
  # activation checkpointing: the plan costs no GPU time, the checkpointed job a few steps.
  run plan_bert 60 "$tb" plan "${bert[@]:1}"
  run plan_bert_ckpt 60 "$tb" plan "${bert[@]:1}" --activation-checkpointing
  run tb_bert_ckpt 180 "$tb" "${bert[@]}" --max-steps 8 --activation-checkpointing
  # Operations that make the host wait for the GPU: none should come once a step per step.
  for n in 10 30; do
    run "tb_bert_syncs$n" 120 env TRAINBOOK_CUDA_SYNC_DEBUG=warn "$tb" "${bert[@]}" --max-steps "$n" --log-level info
    d=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/tb_bert_syncs$n.json" 2>/dev/null) \
      && echo "tb_bert_syncs$n $(grep -ci 'synchroniz' "$d/logs/rank0.log")" | tee -a "$out/syncs.txt" \
      && grep -i -A3 'synchroniz' "$d/logs/rank0.log" | head -40 > "$out/syncs$n.txt"
  done
  run tb_resnet 240 "$tb" "${resnet[@]}" --max-steps 60
  # The model's own speed: the images decoded once and held on the GPU, as the baselines' are.
  run tb_resnet_device 240 "$tb" "${resnet[@]}" --max-steps 60 --data-on-device
  run tb_resnet_profile 240 "$tb" "${resnet[@]}" --max-steps 36 --profile 30..34
  for r in cpu_fp32 cuda_fp32 tb_bert base_bert tb_bert_again tb_bert_graphs tb_resnet tb_resnet_device; do
    d=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/$r.json" 2>/dev/null) \
      && cp "$d/metrics.parquet" "$out/$r.parquet" 2>/dev/null
  done
  for r in tb_bert_profile tb_resnet_profile; do
    d=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/$r.json" 2>/dev/null) \
      && gzip -c "$d/profile/rank0.pt.trace.json" > "$out/$r.trace.json.gz" 2>/dev/null
  done
  # Whatever is left of DEADLINE (seconds since the start, for the whole call) goes to the
  # baselines, so the summary and the results' archive are always written.
  left=$(( ${DEADLINE:-540} - SECONDS - 30 ))
  say "strong baselines: bench/cuda/strong.py (at most ${left}s)"
  timeout "$left" "$py" bench/cuda/strong.py --steps 40 --warmup 15 \
    --only bert-eager,resnet-cl,bert-compiled,resnet-cl-compiled | tee "$out/strong.jsonl"
  echo "strong $?" >> "$out/exits.txt"
fi

if [ "$what" = lm ]; then
  # Causal LMs: a Llama-3.2-1B-shaped model (16 layers of 2048, 32 heads, 8 key/value heads) from
  # random weights, 512-token blocks of the Brown corpus, batch 16, bf16, AdamW; full fine-tuning
  # and LoRA rank 16 on q/k/v/o; trainbook against PyTorch eager + Transformers (+ PEFT) with
  # the fused AdamW and the data on the GPU (bench/torch_lm.py). ~6 minutes.
  lm=$work/llama-1b-shape
  mkdir -p "$lm" && cp "$TRAINBOOK_DATA/models/all-MiniLM-L6-v2/tokenizer.json" "$lm/"
  echo '{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 30522,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": true, "hidden_act": "silu"}' > "$lm/config.json"
  lmjob=(train causal-lm --model "$lm" --from-scratch --workers 1 --device cuda --precision bf16
    --max-length 512 --global-batch-size 16 --lr 1e-4 --eval-rows 0 --json --log-level warn)
  run tb_lm_full 240 "$tb" "${lmjob[@]}" --max-steps 40
  run torch_lm_full 240 "$py" bench/torch_lm.py --model "$lm" --device cuda --precision bf16 --block 512 --batch 16 --steps 30 --warmup 10
  run tb_lm_lora 240 "$tb" "${lmjob[@]}" --max-steps 40 --lora-rank 16
  run torch_lm_lora 240 "$py" bench/torch_lm.py --model "$lm" --device cuda --precision bf16 --block 512 --batch 16 --steps 30 --warmup 10 --lora-rank 16
  run plan_lm_lora 60 "$tb" plan "${lmjob[@]:1}" --lora-rank 16
fi

if [ "$what" = scaling ] || [ "$what" = checks+scaling ]; then
  # Is ResNet-50 fed fast enough? The same job with 4 and 14 loader threads; and BERT at twice
  # the batch on both sides.
  for t in 4 14; do
    run "scale_resnet_loader$t" 300 "$tb" train resnet --workers 1 --device cuda --precision bf16 \
      --arch resnet50 --image-size 224 --global-batch-size 256 --max-steps 60 --optimizer adamw \
      --lr 1e-3 --weight-decay 0 --schedule constant --loader-threads "$t" --eval-rows 0 --json --log-level warn
  done
  run scale_tb_bert512 300 "$tb" train bert-mlm --workers 1 --max-length 128 --global-batch-size 512 \
    --device cuda --precision bf16 --layers 12 --hidden-size 768 --heads 12 --max-steps 60 \
    --optimizer adamw --lr 5e-5 --weight-decay 0.01 --schedule constant --eval-rows 0 --json --log-level warn
  run scale_torch_bert512 300 "$py" bench/torch_bert.py --task mlm --workers 1 --max-length 128 \
    --global-batch-size 512 --device cuda --precision bf16 --layers 12 --hidden 768 --heads 12 \
    --steps 60 --warmup 20 --data "$TRAINBOOK_DATA/datasets/brown/brown.txt" \
    --model-dir "$TRAINBOOK_DATA/models/all-MiniLM-L6-v2"
  for r in scale_resnet_loader4 scale_resnet_loader14 scale_tb_bert512; do
    d=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/$r.json" 2>/dev/null) \
      && cp "$d/metrics.parquet" "$out/$r.parquet" 2>/dev/null
  done
fi

say "summary"
"$py" bench/cuda/summary.py "$out" | tee "$final/summary.md"
tar -C "$work" -czf "$final/results.tgz" results
cat "$out/exits.txt"
