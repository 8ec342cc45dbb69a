#!/usr/bin/env bash
# The kernel's tests drive the real kernel through Jupyter's own client (jupyter_client,
# nbconvert) from the project venv, where `make build` installed the kernelspec; the notebook
# tests execute notebooks/*.ipynb headless through it; the docker tests run the Dockerfile's steps.
#   scripts/test-kernel.sh [PATH...] [PYTEST OPTIONS...]   (paths given: only those tests)
# With no paths: tests/docker first, alone (it rebuilds the kernel's trainbook_torch library and
# reinstalls the kernelspec that the other tests use), then every other test file, files spread
# over TRAINBOOK_TEST_JOBS pytest processes (default 2; most tests wait on worker processes,
# kernels and servers, so two share a 2-core machine well; 1 runs them in one process).
# Given paths run in one process. pytest prints the 30 slowest tests at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30)
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "${pytest[@]}" "$@"
fi
jobs=${TRAINBOOK_TEST_JOBS:-2}
spread=()
if [ "$jobs" -gt 1 ]; then spread=(-n "$jobs" --dist loadfile); fi
"${pytest[@]}" tests/docker "$@"
# The files with the longest tests first, so that neither process is left with them at the end.
exec "${pytest[@]}" "${spread[@]}" tests/slurm tests/tracking tests/notebooks tests/kernel tests/hpu tests/data tests/docs "$@"
