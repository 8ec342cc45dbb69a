#!/usr/bin/env bash
# Installs the Rust toolchain trainbook is built with, through rustup, idempotently: when the
# rustc on PATH already is that version (CI, a developer machine, a cached image layer) it only
# says so. It never changes the default toolchain of an existing rustup.
#   --check        only verify; exit 1 when the pinned rustc is not the one on PATH
#   CARGO_HOME / RUSTUP_HOME  where a fresh install goes (rustup's own defaults otherwise)
set -euo pipefail
# The pin. kernel/Cargo.toml's rust-version is the minimum; tests/docker checks the two agree.
TOOLCHAIN=1.95.0
say() { printf '\033[1;34m[rust]\033[0m %s\n' "$*" >&2; }
check=0
case ${1:-} in --check) check=1 ;; '') ;; *) echo "usage: $0 [--check]" >&2; exit 1 ;; esac

have=$(rustc --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" = "$TOOLCHAIN" ] && command -v cargo >/dev/null 2>&1; then
  say "rustc $TOOLCHAIN and cargo are installed ($(command -v rustc))"
  exit 0
fi
if [ "$check" = 1 ]; then
  say "rustc $TOOLCHAIN is not the rustc on PATH (found: ${have:-none})"
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  # Someone else's rustup: add the toolchain, but leave their default alone.
  rustup toolchain install "$TOOLCHAIN" --profile minimal --component rust-src
  say "installed toolchain $TOOLCHAIN; make it the one builds use: rustup default $TOOLCHAIN (or RUSTUP_TOOLCHAIN=$TOOLCHAIN)"
  exit 1
fi

# Fresh machine (the container): rustup from its official installer. rust-src lets the
# notebook kernel's analyzer see the standard library's types.
say "installing Rust $TOOLCHAIN with rustup into ${CARGO_HOME:-$HOME/.cargo}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
url=https://sh.rustup.rs
if command -v curl >/dev/null 2>&1; then
  curl --proto '=https' --tlsv1.2 -sSf "$url" -o "$tmp/rustup-init.sh"
else
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$url" "$tmp/rustup-init.sh"
fi
sh "$tmp/rustup-init.sh" -y --no-modify-path --profile minimal \
  --default-toolchain "$TOOLCHAIN" --component rust-src
export PATH=${CARGO_HOME:-$HOME/.cargo}/bin:$PATH
have=$(rustc --version | awk '{print $2}')
[ "$have" = "$TOOLCHAIN" ] || { say "rustc on PATH is $have after installing $TOOLCHAIN"; exit 1; }
say "rustc $TOOLCHAIN installed; put ${CARGO_HOME:-$HOME/.cargo}/bin on PATH"
