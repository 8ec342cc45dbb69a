#!/usr/bin/env bash
# Creates <repo>/.bench-venv with torch==2.13.0 from PyPI for CPU-only benchmarks
# (torch.distributed + gloo). Idempotent: exits at once when the venv already imports torch.
#
#   bench/torch-venv.sh            # build if needed (quiet; one line on stderr when it builds)
#   bench/torch-venv.sh --force    # rebuild from scratch
#
# TORCH_BENCH_MODE picks how the CUDA side of the (CUDA 13) Linux wheel is satisfied:
#   nvidia (default) torch --no-deps + every real nvidia-* wheel whose library is loaded at
#          `import torch` (no triton, cusolver, nvtx, cuda-bindings). ~2.3 GB download,
#          ~3.8 GB on disk, ~125 s cold here.
#   full   plain `pip install torch==2.13.0` (~3 GB download).
# Env: BENCH_VENV (default <repo>/.bench-venv), PYTHON (default python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
venv=${BENCH_VENV:-$repo/.bench-venv}
py=${PYTHON:-python3}
mode=${TORCH_BENCH_MODE:-nvidia}
torch_version=2.13.0
stamp=$venv/.torch-bench-stamp

force=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "torch-venv.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

works() {
    [[ -x $venv/bin/python && -f $stamp ]] || return 1
    "$venv/bin/python" -W ignore -c "
import sys, torch, torch.distributed as d, transformers, torchvision
sys.exit(0 if torch.__version__.split('+')[0] == '$torch_version' and d.is_gloo_available() else 1)
" >/dev/null 2>&1
}

if [[ $force == 0 ]] && works; then
    exit 0
fi

case $mode in
    nvidia|full) ;;
    *) echo "torch-venv.sh: TORCH_BENCH_MODE must be nvidia or full (got '$mode')" >&2; exit 2 ;;
esac

start=$SECONDS
case $venv in /|"$HOME"|"$repo") echo "torch-venv.sh: refusing to replace $venv" >&2; exit 2 ;; esac
rm -rf -- "$venv"
"$py" -m venv "$venv"
printf '*\n' >"$venv/.gitignore"
pip_install() {
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input --no-warn-conflicts "$@"
}

# Exact versions torch 2.13.0 pins (via cuda-toolkit[...]==13.0.3 and its own requirements).
cuda_rt=(nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85)
cuda_import=(nvidia-cublas==13.1.1.3 nvidia-cuda-nvrtc==13.0.88 nvidia-cufft==12.0.0.61
    nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 nvidia-cusparse==12.6.3.3
    "nvidia-nvjitlink>=13.0.88,<14" nvidia-cudnn-cu13==9.20.0.48 nvidia-cusparselt-cu13==0.8.1
    nvidia-nccl-cu13==2.29.7 nvidia-nvshmem-cu13==3.4.5)
# torch's pure-Python requirements, plus numpy (optional, silences a warning at import).
py_deps=(filelock "typing-extensions>=4.10.0" "setuptools>=77.0.3" "sympy>=1.13.3"
    "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy)
# Hugging Face stack for bench/torch_bert.py (the PyTorch-eager BERT baseline), plus torchvision
# and pillow for bench/torch_resnet.py. torchvision is installed --no-deps (below) so pip leaves
# torch (and, in nvidia mode, its deliberately partial CUDA deps) alone; its own deps are numpy
# and pillow, which are listed here.
hf_deps=("transformers==5.23.0" "safetensors==0.8.0" tokenizers pillow)
vision_deps=("torchvision==0.28.0")  # the release that pins torch==2.13.0

case $mode in
    full)
        pip_install "torch==$torch_version" numpy
        ;;
    nvidia)
        pip_install --no-deps "torch==$torch_version" "${cuda_rt[@]}" "${cuda_import[@]}"
        pip_install "${py_deps[@]}"
        ;;
esac
pip_install "${hf_deps[@]}"
pip_install --no-deps "${vision_deps[@]}"

echo "torch==$torch_version mode=$mode" >"$stamp"
if ! works; then
    echo "torch-venv.sh: $venv was built (mode=$mode) but cannot import torch with gloo:" >&2
    "$venv/bin/python" -c 'import torch.distributed as d; print(d.is_gloo_available())' >&2 || true
    rm -f -- "$stamp"
    exit 1
fi
echo "torch-venv.sh: $venv ready (torch $torch_version, mode=$mode, $((SECONDS - start))s)" >&2
