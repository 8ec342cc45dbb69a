#!/usr/bin/env bash
# Builds trainbook for a CUDA machine that has no Rust toolchain and no network, and packs what
# bench/cuda/device.sh needs into .gpu/ (git-ignored) for copying there:
#   bench/cuda/pack.sh [TORCH_VERSION]        (default 2.11.0: the GPU machine's torch)
#   PACK_REV=<commit> bench/cuda/pack.sh       the binaries of that commit alone, into
#                                              .gpu/base.tar.xz: the build device.sh speed
#                                              compares this one with (a before/after ratio)
#
# trainbook links the libtorch it was compiled against, so the build must use the same torch
# release as the GPU machine's Python (tch checks the exact version). This script:
#   1. installs that torch's CUDA wheel set into $CUDA_BUILD/venv (default /work/cudabuild),
#   2. checks out HEAD into $CUDA_BUILD/tree, switches tch to that torch's release
#      (scripts/use-tch.sh; scripts/torch-pair.sh says which) and lays out $CUDA_BUILD/libtorch,
#   3. builds `trainbook`, `trainbook-worker` and the engine's unit-test binary with the `cuda`
#      feature, strips them, and packs them with the data the checks use (the offline
#      tokenizer, the Brown corpus, the digits) into .gpu/.
# The binaries find libtorch through an rpath to $CUDA_BUILD/libtorch/lib; device.sh recreates
# that directory on the GPU machine from its own torch (scripts/libtorch-layout.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
say() { printf '\033[1;34m[cuda-pack]\033[0m %s\n' "$*" >&2; }
torch=${1:-2.11.0}
build=${CUDA_BUILD:-/work/cudabuild}
tch=$(scripts/torch-pair.sh --buildable | awk -v t="$torch" '$1 == t { print $2 }')
[ -n "$tch" ] || { echo "error: trainbook has no tch pair built for torch $torch (scripts/torch-pair.sh --list)" >&2; exit 1; }

mkdir -p "$build"
if [ "$(cat "$build/venv/.torch" 2>/dev/null)" != "$torch" ]; then
  say "installing torch $torch (CUDA wheels) into $build/venv"
  python3 -m venv "$build/venv"
  "$build/venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch" \
    "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.*"
  echo "$torch" > "$build/venv/.torch"
fi

if [ ! -d "$build/tree/.git" ] && [ ! -f "$build/tree/.git" ]; then
  git worktree add -f --detach "$build/tree" HEAD
fi
rev=${PACK_REV:-HEAD}
(cd "$build/tree" && git checkout -q --detach -f "$(cd "$root" && git rev-parse "$rev")")
# Uncommitted changes of this checkout travel too (a benchmark script being edited).
[ -n "${PACK_REV:-}" ] || git diff HEAD | (cd "$build/tree" && git apply --allow-empty)
(cd "$build/tree" && scripts/use-tch.sh "$tch")
LIBTORCH="$build/libtorch" TRAINBOOK_VENV="$build/venv" TRAINBOOK_CUDA=1 TRAINBOOK_HPU=0 \
  scripts/libtorch-layout.sh

say "building with the cuda feature against torch $torch (tch $tch)"
export LIBTORCH="$build/libtorch"
(cd "$build/tree" && cargo build --release --features trainbook/cuda -p trainbook -p trainbook-recipes --bins \
  && cargo test --release -p trainbook-engine --features cuda --lib --no-run)
test_bin=$(ls -t "$build"/tree/target/release/deps/trainbook_engine-* | grep -v '\.d$' | head -n1)

if [ -n "${PACK_REV:-}" ]; then
  rm -rf .gpu/base && mkdir -p .gpu/base/bin
  cp "$build"/tree/target/release/{trainbook,trainbook-worker} .gpu/base/bin/
  strip .gpu/base/bin/*
  tar -C .gpu/base -cJf .gpu/base.tar.xz bin && rm -rf .gpu/base
  say "$(du -h .gpu/base.tar.xz | cut -f1) in .gpu/base.tar.xz (the binaries of $rev)"
  exit 0
fi
say "packing .gpu/"
rm -rf .gpu/stage .gpu/pack.tar.xz && mkdir -p .gpu/stage/bin .gpu/stage/data/models/all-MiniLM-L6-v2 .gpu/stage/data/datasets
cp "$build"/tree/target/release/{trainbook,trainbook-worker} .gpu/stage/bin/
cp "$test_bin" .gpu/stage/bin/engine-unit-tests
strip .gpu/stage/bin/*
data=${TRAINBOOK_DATA:-.data}
cp "$data"/models/all-MiniLM-L6-v2/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json,config.json} \
  .gpu/stage/data/models/all-MiniLM-L6-v2/
cp -r "$data"/datasets/brown "$data"/datasets/digits "$data"/datasets/rotten_tomatoes .gpu/stage/data/datasets/
echo "$build/libtorch" > .gpu/stage/libtorch-path
echo "$torch" > .gpu/stage/torch-version
tar -C .gpu/stage -cJf .gpu/pack.tar.xz .
rm -rf .gpu/stage
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
say "$(du -h .gpu/pack.tar.xz | cut -f1) in .gpu/pack.tar.xz; on the GPU machine: bash bench/cuda/device.sh"
