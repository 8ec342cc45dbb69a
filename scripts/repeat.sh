#!/usr/bin/env bash
# Runs a test command many times, to tell a flaky test from a sound one:
#   scripts/repeat.sh N COMMAND...         e.g. scripts/repeat.sh 20 scripts/test-kernel.sh tests/tracking/test_mlflow.py -x
#   BUSY=1 scripts/repeat.sh N COMMAND...  the same while a second job keeps both cores busy
#                                          (a CPU-bound training run, restarted as it ends), as on a loaded CI machine
# Each run's output goes to target/repeat/RUN.log; the summary names the runs that failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:?usage: repeat.sh N COMMAND...}; shift
[ $# -gt 0 ] || { echo "usage: repeat.sh N COMMAND..." >&2; exit 2; }
logs=$root/target/repeat
mkdir -p "$logs"
busy=""
if [ "${BUSY:-0}" = 1 ]; then
  ( while :; do "$root/target/release/trainbook" train synthetic --preset tiny --workers 2 --epochs 1000 \
      --max-steps 100000 --runs-root "$logs/busy-runs" >/dev/null 2>&1; done ) &
  busy=$!
  trap 'kill -- -$busy 2>/dev/null; pkill -P $busy 2>/dev/null; kill $busy 2>/dev/null' EXIT
fi
pass=0 fail=0 failed=()
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  if "$@" > "$logs/$i.log" 2>&1; then pass=$((pass + 1)); r=ok; else fail=$((fail + 1)); failed+=("$i"); r=FAILED; fi
  echo "run $i/$n: $r ($(( $(date +%s) - start ))s)"
done
echo "repeat: $pass of $n runs passed${failed:+; failed: ${failed[*]} (logs in $logs/)}"
[ "$fail" = 0 ]
