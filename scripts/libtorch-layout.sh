#!/usr/bin/env bash
# Builds the LIBTORCH directory that torch-sys (tch) and trainbook's c10d shim compile against,
# from the torch wheel in the project venv: include/ is the wheel's headers, lib/ holds only the
# libraries a CPU build needs (plus the CUDA runtime stubs libtorch_cpu.so links to), so rustc's
# linker never pulls libtorch_cuda on a CPU machine. With TRAINBOOK_CUDA=1 (a CUDA machine with
# the nvidia-* wheels installed) lib/ also holds libtorch_cuda and the CUDA libraries it needs.
#   TRAINBOOK_TORCH_PYTHON=PY  take the torch that interpreter imports instead of the venv's (a
#                              container's own torch, e.g. /usr/local/lib/python3.10/dist-packages)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${TRAINBOOK_VENV:-$root/.venv}
out=${LIBTORCH:-$root/.libtorch}
want=${TRAINBOOK_TORCH_PYTHON:-$venv/bin/python}
py=$(command -v "$want") || { echo "error: Python $want not found: run scripts/setup.sh first" >&2; exit 1; }
case $py in /*) ;; *) py=$PWD/$py ;; esac
# The torch package that Python imports, located without importing it (from /, so nothing in the
# current directory can shadow it); its site directory also holds the nvidia-* wheels.
torch=$(cd / && "$py" -c 'import importlib.util as u; s = u.find_spec("torch"); print(s.submodule_search_locations[0] if s else "")') || torch=""
site=$(dirname "$torch")
[ -n "$torch" ] && [ -f "$torch/lib/libtorch_cpu.so" ] || { echo "error: no torch with lib/libtorch_cpu.so in $py: run scripts/setup.sh first" >&2; exit 1; }

mkdir -p "$out/lib"
ln -sfn "$torch/include" "$out/include"
link() { for f in "$@"; do [ -e "$f" ] && ln -sf "$f" "$out/lib/$(basename "$f")"; done; return 0; }
link "$torch"/lib/libtorch_cpu.so "$torch"/lib/libtorch.so "$torch"/lib/libc10.so "$torch"/lib/libshm.so "$torch"/lib/libgomp*.so*
# libtorch_cpu.so needs a handful of symbols from the CUDA runtime and CUPTI even on CPU.
link "$site"/nvidia/*/lib/libcudart.so.* "$site"/nvidia/*/lib/libcupti.so.*
if [ "${TRAINBOOK_CUDA:-0}" = 1 ]; then
  link "$torch"/lib/libtorch_cuda.so "$torch"/lib/libc10_cuda.so "$torch"/lib/libtorch_nvshmem.so "$torch"/lib/libtorch_cuda_linalg.so
  link "$site"/nvidia/*/lib/*.so*
  # Headers for the shim's NCCL backend: ProcessGroupNCCL.hpp pulls in nccl.h, the CUDA runtime,
  # CCCL and cuSOLVER headers, all shipped in the nvidia-* wheels.
  incs=()
  for d in "$site"/nvidia/*/include "$site"/nvidia/*/include/cccl; do [ -d "$d" ] && incs+=("$d"); done
  (IFS=:; echo "${incs[*]}") > "$out/cuda-includes"
  echo 1 > "$out/cuda"
else
  rm -f "$out"/lib/libtorch_cuda.so "$out"/lib/libc10_cuda.so "$out/cuda-includes" "$out/cuda"
fi
# The hpu build (Intel Gaudi: prelude/hpu) embeds this same Python, so that the bridge it imports
# registers HPU in the libtorch trainbook links; it needs that Python's headers and shared
# libpython. TRAINBOOK_HPU=0 turns it off, =1 makes a missing piece an error.
hpu_ok=$("$root/scripts/embeddable-python.sh" "$py")
if [ "${TRAINBOOK_HPU:-}" = 1 ] && [ "$hpu_ok" != 1 ]; then
  echo "error: TRAINBOOK_HPU=1 but $py has no Python.h or shared libpython (Debian: apt-get install python3-dev)" >&2; exit 1
fi
if [ "${TRAINBOOK_HPU:-}" != 0 ] && [ "$hpu_ok" = 1 ]; then echo "$py" > "$out/hpu-python"; else rm -f "$out/hpu-python"; fi
# torch-sys reads the version from this file when present (the wheel keeps it in torch/version.py).
v=$("$py" -c 'import re,sys; s=open(sys.argv[1]).read(); print(re.search(r"__version__ = .([0-9.]+)", s).group(1))' "$torch/version.py")
echo "$v" > "$out/build-version"
