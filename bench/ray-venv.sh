#!/usr/bin/env bash
# Adds Ray Train (ray[train] from PyPI) to the bench venv that bench/torch-venv.sh makes, for
# bench/ray_restart.py. Idempotent: exits at once when the venv already imports ray.train.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
venv=${BENCH_VENV:-$repo/.bench-venv}
ray_version=${RAY_VERSION:-2.60.0}
"$here/torch-venv.sh"
if "$venv/bin/python" -c "import ray.train, ray; assert ray.__version__ == '$ray_version'" 2>/dev/null; then
    exit 0
fi
echo "ray-venv.sh: installing ray[train]==$ray_version into $venv" >&2
"$venv/bin/pip" install -q "ray[train]==$ray_version"
