#!/usr/bin/env bash
# Prints 1 when the Python PY can be embedded (its Python.h and a shared libpython exist), else
# 0. The hpu build (prelude/hpu, through pyo3) embeds torch's Python and needs both. One answer
# for libtorch-layout.sh, which records it, and cargo-features.sh, which predicts it before
# set-up has run.
#   scripts/embeddable-python.sh PY
set -euo pipefail
py=${1:?usage: embeddable-python.sh PY}
"$py" -c 'import os, sysconfig as s; inc = s.get_config_var("INCLUDEPY") or ""; lib = os.path.join(s.get_config_var("LIBDIR") or "", s.get_config_var("LDLIBRARY") or ""); print(int(os.path.exists(os.path.join(inc, "Python.h")) and lib.endswith(".so") and os.path.exists(lib)))'
