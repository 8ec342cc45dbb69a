#!/usr/bin/env bash
# Two trainbook builds on the same job, alternated, in one run: samples/s of each run and the
# ratio of the best of each (this machine's noise cancels out of a side-by-side ratio).
#   bench/compare_builds.sh BEFORE_BIN_DIR AFTER_BIN_DIR ROUNDS -- TRAIN_ARGS...
# e.g. bench/compare_builds.sh /tmp/old/bin target/release 2 -- bert-mlm --workers 1 --max-steps 30
# Each BIN_DIR holds `trainbook` and `trainbook-worker` (a build's target/release, or the bin/
# of a bench/cuda/pack.sh pack). The job runs with --json; its samples_per_second counts the
# steps after the warm-up.
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || {
  echo "usage: $0 BEFORE_BIN_DIR AFTER_BIN_DIR ROUNDS -- TRAIN_ARGS..." >&2
  exit 2
}
before=$1 after=$2 rounds=$3
shift 4
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
rate() { # bin dir, train args -> samples/s
  local bin=$1
  shift
  TRAINBOOK_RUNS=$runs "$bin/trainbook" train "$@" --json --log-level warn 2>/dev/null | tail -n1 |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["samples_per_second"], 2))'
}
declare -a b a
for ((r = 1; r <= rounds; r++)); do
  b+=("$(rate "$before" "$@")")
  a+=("$(rate "$after" "$@")")
  echo "round $r: before ${b[-1]} samples/s, after ${a[-1]}"
done
python3 - "${b[*]}" "${a[*]}" <<'PY'
import sys
b, a = ([float(x) for x in s.split()] for s in sys.argv[1:3])
print(f"before {b}, after {a}: after / before (best of each) {max(a) / max(b):.3f}")
PY
