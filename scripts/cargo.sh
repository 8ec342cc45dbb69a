#!/usr/bin/env bash
# cargo with the features `make build` gives the workspace (scripts/cargo-features.sh: cuda, hpu
# and PYO3_PYTHON), so every make target builds the one configuration and none undoes another's
# build. The features go right after the subcommand:
#   scripts/cargo.sh build --release --bins     scripts/cargo.sh test --release -- --test-threads=1
# CARGO names the cargo to run (default cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
sub=${1:?usage: cargo.sh SUBCOMMAND [ARGS...]}
shift
source scripts/cargo-features.sh
# rust-analyzer's ra_ap_stdx reads CI at compile time (option_env!), so a build with CI set and
# one without would each rebuild rust-analyzer, evcxr and the kernel (3.5 min on 2 cores): a
# `CI=true make test` followed by a plain `make demo`. Nothing of trainbook's reads CI.
unset CI
exec ${CARGO:-cargo} "$sub" "${features[@]}" "$@"
