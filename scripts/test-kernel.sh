#!/usr/bin/env bash
# The kernel's tests drive the real kernel through Jupyter's own client (jupyter_client,
# nbconvert) from the project venv, where `make build` installed the kernelspec; the notebook
# tests execute notebooks/*.ipynb headless through it; the docker tests run the Dockerfile's steps.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/docker tests/kernel tests/notebooks tests/hpu tests/slurm tests/tracking "$@"
