# Sourced: sets `features`, the cargo arguments of the features `make build` gives the workspace:
# cuda where set-up found a GPU, and hpu where torch's Python can be embedded (PYO3_PYTHON then
# names that Python, exported). Read from the LIBTORCH layout set-up made (.libtorch); before
# set-up has made it (a fresh machine compiling beside set-up, scripts/compile-beside-setup.sh),
# predicted the way scripts/setup.sh and scripts/libtorch-layout.sh will decide, so the early
# compile builds exactly what the real build then reuses.
features=()
if [ -f .libtorch/build-version ]; then
    if [ "$(cat .libtorch/cuda 2>/dev/null)" = 1 ]; then features+=(--features trainbook/cuda); fi
    if [ -s .libtorch/hpu-python ]; then
        features+=(--features trainbook/hpu)
        PYO3_PYTHON=$(cat .libtorch/hpu-python)
        export PYO3_PYTHON
    fi
else
    if [ "${TRAINBOOK_CUDA:-}" = 1 ] || { [ -z "${TRAINBOOK_CUDA:-}" ] && command -v nvidia-smi >/dev/null 2>&1 \
        && nvidia-smi -L >/dev/null 2>&1; }; then
        features+=(--features trainbook/cuda)
    fi
    # The venv (made from $PYTHON, default python3) shares its base Python's headers and libpython.
    base=${TRAINBOOK_TORCH_PYTHON:-${PYTHON:-python3}}
    if [ "${TRAINBOOK_HPU:-}" != 0 ] && [ "$(scripts/embeddable-python.sh "$base" 2>/dev/null)" = 1 ]; then
        features+=(--features trainbook/hpu)
        if [ -n "${TRAINBOOK_TORCH_PYTHON:-}" ]; then PYO3_PYTHON=$(command -v "$TRAINBOOK_TORCH_PYTHON"); else PYO3_PYTHON=$PWD/.venv/bin/python; fi
        export PYO3_PYTHON
    fi
fi
