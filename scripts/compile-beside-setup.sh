#!/usr/bin/env bash
# On a machine set-up has not reached yet, `make build` runs this beside scripts/setup.sh: set-up
# mostly waits on downloads (apt, the torch wheel), so the CPU compiles meanwhile every crate of
# the build that needs neither libtorch nor set-up's Python (the kernel with evcxr's
# rust-analyzer, polars, tokenizers...). It is the real build's own command and features
# (scripts/cargo.sh), with --keep-going: what needs libtorch fails here for now, and the real
# build after set-up compiles it and reuses the rest. Its output goes to
# target/compile-beside-setup.log; it never fails the build.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
log=target/compile-beside-setup.log
# make stops this when set-up fails (TERM): cargo goes with it.
scripts/cargo.sh build --release --bins --keep-going >"$log" 2>&1 &
cargo=$!
trap 'kill -TERM "$cargo" 2>/dev/null; exit 143' TERM INT
wait "$cargo"
n=$(grep -c '^ *Compiling ' "$log")
printf '\033[1;34m[build]\033[0m compiled %s crates beside set-up (the rest after it; log: %s)\n' "$n" "$log" >&2
exit 0
