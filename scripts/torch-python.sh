#!/usr/bin/env bash
# The project venv's Python, able to `import torch` on a machine without CUDA: for tests and
# fixture generators that compare trainbook with transformers/peft on a CPU machine.
#   scripts/torch-python.sh -c 'import torch, transformers, peft'
#   scripts/torch-python.sh tests/fixtures/make_causal_lm_parity.py
# All arguments go to Python unchanged; works from any directory.
# On CPU .venv has the CUDA torch wheel without its nvidia-* wheels (scripts/setup.sh), and
# `import torch` fails for lack of CUDA libraries; tests/hpu/build.sh makes stub libraries for the
# missing sonames (once, ~1 min) and prints where they are. Only its LD_LIBRARY_PATH line is taken:
# its PYTHONPATH would put the fake Gaudi bridge on the path, which these programs must not see.
# On a machine whose torch imports without stubs (a CUDA set-up) it prints no LD_LIBRARY_PATH.
# Env: PYTHON (default <repo>/.venv/bin/python).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
[ -x "$py" ] || { echo "torch-python.sh: no $py: run scripts/setup.sh (make setup)" >&2; exit 1; }

env_lines=$(PYTHON="$py" "$repo/tests/hpu/build.sh" --print-env) \
    || { echo "torch-python.sh: tests/hpu/build.sh --print-env failed" >&2; exit 1; }
ld=$(printf '%s\n' "$env_lines" | sed -n 's/^LD_LIBRARY_PATH=//p')
if [[ -n $ld ]]; then
    export LD_LIBRARY_PATH=$ld
fi
exec "$py" "$@"
