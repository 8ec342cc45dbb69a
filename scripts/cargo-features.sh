# Sourced: sets `features`, the cargo arguments of the features `make build` gives the workspace
# (see the Makefile): cuda where set-up found a GPU, and hpu where torch's Python can be embedded
# (PYO3_PYTHON then names that Python, exported).
features=()
if [ "$(cat .libtorch/cuda 2>/dev/null)" = 1 ]; then features+=(--features trainbook/cuda); fi
if [ -s .libtorch/hpu-python ]; then
    features+=(--features trainbook/hpu)
    PYO3_PYTHON=$(cat .libtorch/hpu-python)
    export PYO3_PYTHON
fi
