#!/usr/bin/env bash
# The kernel's tests drive the real kernel through Jupyter's own client (jupyter_client,
# nbconvert) from the project venv, where `make build` installed the kernelspec; the notebook
# tests execute notebooks/*.ipynb headless through it; the docker tests run the Dockerfile's steps.
#   scripts/test-kernel.sh [PATH...] [PYTEST OPTIONS...]   (paths given: only those tests)
# pytest prints the 30 slowest tests at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
targets=(tests/docker tests/kernel tests/notebooks tests/hpu tests/slurm tests/tracking)
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then targets=(); fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "${targets[@]}" "$@"
