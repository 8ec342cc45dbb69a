#!/usr/bin/env bash
# On a machine with Intel Gaudi cards (in the Gaudi container, after `make build`): checks
# trainbook's HPU path end to end and prints a Markdown report to paste into an issue.
#   scripts/gaudi-check.sh [--workers N] [--steps S] [--env-only] [--fallback-only]
# 0. the environment the bridge and trainbook must agree on: torch's version, its C++ ABI
#    (_GLIBCXX_USE_CXX11_ABI), its pybind11 internals tag (compiler type, standard library,
#    build ABI), the torch version the bridge was built for (its required_version.txt) and
#    PT_HPU_LAZY_MODE; --env-only stops after this;
# 1. the bridge as a worker loads it (versions, module, device count);
# 1b. no CPU fallback: two steps of each recipe trainbook ships (AdamW, LAMB and SGD, bf16 too)
#    with PT_HPU_PLACE_ON_CPU=none, so an operator the bridge has no HPU kernel for fails and is
#    named, instead of quietly running on the host every step; --fallback-only stops after this;
# 2. every collective on HPU tensors through hccl (`trainbook check --device hpu`);
# 3. HPU vs CPU: 20 SGD steps of the synthetic BERT on N workers each, parameters compared (1e-5;
#    Gaudi's own kernels may round differently from the CPU's: the difference is reported);
# 4. throughput of the reference BERT job (bert-base-cased when present, else the offline
#    default) for S steps in fp32 and bf16, the first steps excluded as the reference does.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
workers=2 steps=60 env_only=0 fallback_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --env-only) env_only=1; shift ;;
    --fallback-only) fallback_only=1; shift ;;
    --workers) workers=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gaudi-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
tb=$root/target/release/trainbook
worker=$root/target/release/trainbook-worker
[ -x "$tb" ] && [ -x "$worker" ] || { echo "error: run \`make build\` first" >&2; exit 1; }
runs=$(mktemp -d "${TMPDIR:-/tmp}/gaudi-check.XXXXXX")
export TRAINBOOK_RUNS=$runs
failed=0
# The runs are kept when a check failed (the report names their directory), removed otherwise.
trap 'if [ "$failed" = 0 ]; then rm -rf "$runs"; fi' EXIT
section() { printf '\n### %s\n\n' "$1"; }
fenced() { echo '```'; cat; echo '```'; }
summary_field() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d.get(sys.argv[1]))' "$1"; }

echo "## trainbook Gaudi check"
echo
echo "- trainbook: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
echo "- host: $(uname -srm), $(nproc) cores"
command -v hl-smi >/dev/null && echo "- hl-smi: $(hl-smi -v 2>/dev/null | head -n1)"
echo "- libtorch: $(cat "$root/.libtorch/build-version" 2>/dev/null), hpu build: $([ -s "$root/.libtorch/hpu-python" ] && echo yes || echo no)"

section "0. Environment"
# The Python whose torch trainbook links (the hpu build embeds it), else python3.
torch_py=$(cat "$root/.libtorch/hpu-python" 2>/dev/null || echo python3)
"$torch_py" - <<'PY' 2>&1 | fenced
import importlib.util, os
import torch
C = torch._C
print("torch:", torch.__version__)
print("_GLIBCXX_USE_CXX11_ABI:", int(C._GLIBCXX_USE_CXX11_ABI))
# What pybind11 compares before two libraries may share objects (see docs/gaudi.md).
if hasattr(C, "_PYBIND11_COMPILER_TYPE"):
    print("pybind11 internals tag:", "compiler", C._PYBIND11_COMPILER_TYPE, "stdlib", C._PYBIND11_STDLIB,
          "build ABI", C._PYBIND11_BUILD_ABI)
else:  # torch >= 2.12 no longer exports it (its pybind11 keeps the tag in the interpreter's state)
    print("pybind11 internals tag: not exported by this torch")
spec = importlib.util.find_spec("habana_frameworks.torch")
if spec is None or not spec.submodule_search_locations:
    print("bridge: habana_frameworks.torch is not installed for this Python")
else:
    req = os.path.join(list(spec.submodule_search_locations)[0], "required_version.txt")
    if os.path.exists(req):
        want = open(req).read().strip()
        same = want.split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
        print("bridge built for torch:", want, "(matches)" if same else "(DIFFERS: the bridge refuses to load)")
    else:
        print("bridge built for torch: no required_version.txt in", os.path.dirname(req))
print("PT_HPU_LAZY_MODE:", os.environ.get("PT_HPU_LAZY_MODE", "unset (the bridge's default)"))
PY
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
if [ "$env_only" = 1 ]; then exit "$failed"; fi

section "1b. No CPU fallback (PT_HPU_PLACE_ON_CPU=none), 2 steps each"
( bad=0
while IFS='|' read -r name args; do
  err=$(PT_HPU_PLACE_ON_CPU=none "$tb" train $args --device hpu --workers 1 --max-steps 2 --json 2>&1 >/dev/null)
  rc=$?
  ops=$(echo "$err" | grep -o 'aten::[A-Za-z0-9_.]* is not yet supported on HPU' | sed 's/ is not.*//' | sort -u | paste -sd, -)
  if [ "$rc" = 0 ]; then echo "$name: ok, every operator ran on the HPU"
  elif [ -n "$ops" ]; then echo "$name: needs the CPU fallback for $ops"; bad=1
  else echo "$name: failed: $(echo "$err" | grep -m1 '^error' | cut -c1-300)"; bad=1
  fi
done <<'JOBS'
bert adamw bf16|bert --preset tiny --optimizer adamw --precision bf16
bert-mlm lamb fp32|bert-mlm --preset tiny --optimizer lamb
resnet sgd momentum 0.9 bf16|resnet --preset tiny --optimizer sgd --momentum 0.9 --precision bf16
JOBS
exit "$bad" ) | fenced
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
if [ "$fallback_only" = 1 ]; then exit "$failed"; fi

section "1. Bridge"
"$worker" --probe-hpu 2>&1 | tail -n 1 | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("error: "+d["error"] if d["error"] else "\n".join(d["facts"]))' | fenced
"$worker" --probe-hpu 2>/dev/null | grep -q '"error":null' || failed=1

section "2. Collectives on HPU tensors (hccl)"
"$tb" check --workers "$workers" --device hpu 2>&1 | tail -n 3 | fenced || failed=1

section "3. HPU vs CPU, 20 SGD steps"
args=(train synthetic --preset tiny --optimizer sgd --dropout 0 --max-steps 20 --workers "$workers" --json)
hpu_ckpt=$("$tb" "${args[@]}" --device hpu 2>/dev/null | summary_field last_checkpoint)
cpu_ckpt=$("$tb" "${args[@]}" --device cpu 2>/dev/null | summary_field last_checkpoint)
if [ -d "$hpu_ckpt" ] && [ -d "$cpu_ckpt" ]; then
  python3 "$root/scripts/compare_checkpoints.py" "$hpu_ckpt" "$cpu_ckpt" 2>&1 | fenced
  python3 "$root/scripts/compare_checkpoints.py" "$hpu_ckpt" "$cpu_ckpt" >/dev/null || failed=1
else
  echo "a run failed (hpu: ${hpu_ckpt:-none}, cpu: ${cpu_ckpt:-none}); logs under $runs" | fenced
  failed=1
fi

section "4. Throughput, reference BERT job, $steps steps on $workers HPUs"
for precision in fp32 bf16; do
  out=$("$tb" train bert --device hpu --workers "$workers" --max-steps "$steps" --precision "$precision" --eval-rows 0 --json 2>/dev/null | tail -n 1)
  echo "$precision: $(echo "$out" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("status"), "samples/s", d.get("samples_per_second"), "steps", d.get("steps"), "loss", d.get("final_train_loss"), d.get("error") or "")')"
done | fenced

echo
[ "$failed" = 0 ] && echo "**Result: all checks passed.**" || echo "**Result: some checks failed** (run directories under $runs)."
exit "$failed"
