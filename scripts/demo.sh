#!/usr/bin/env bash
# The main job: notebooks/bert.ipynb executed headless (nbconvert's executor, the trainbook
# kernel), on the offline default model and data, scaled to the device by the notebook itself.
# Leaves the executed notebook, with its final dashboard, and an HTML copy to open in a browser.
#   TRAINBOOK_DEMO_OUT=DIR   where to put them (default trainbook_runs/notebooks)
#   extra arguments go to scripts/notebook.py, e.g. -p epochs 2 (papermill's -p NAME VALUE)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${TRAINBOOK_DEMO_OUT:-$root/trainbook_runs/notebooks}
# Runs started by the notebook go beside its copy, not into the source tree.
export TRAINBOOK_RUNS=${TRAINBOOK_RUNS:-$root/trainbook_runs}
exec .venv/bin/python scripts/notebook.py execute notebooks/bert.ipynb "$out/bert.ipynb" --html "$@"
