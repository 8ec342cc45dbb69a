#!/usr/bin/env bash
# The driver under the load of many ranks (docs/benchmarks.md, "The control plane at 1,024
# ranks"): builds trainbook-simworker (the workers' event protocol without libtorch) and runs
# prelude/benches/driver_load.rs, whose one real driver starts that many simulated workers.
#   bench/driver_load.sh              1,024 ranks, 120 steps of 250 ms
#   bench/driver_load.sh 256 60 500   256 ranks, 60 steps of 500 ms
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export LIBTORCH=$root/.libtorch
source scripts/cargo-features.sh
cargo build --release -q -p trainbook-simworker
export TRAINBOOK_WORKER=$root/target/release/trainbook-simworker
# Each worker holds two pipes to the driver and one socket; the driver raises its own soft limit
# of open files to the hard one. TRAINBOOK_SIM_NOFILE=1024 starts it at the usual default.
ulimit -Sn "${TRAINBOOK_SIM_NOFILE:-$(ulimit -Hn)}"
export TRAINBOOK_RUNS=${TRAINBOOK_RUNS:-${TMPDIR:-/tmp}/trainbook-driver-load}
cargo bench -q -p trainbook --bench driver_load "${features[@]}" -- "$@"
rm -rf "$TRAINBOOK_RUNS"
