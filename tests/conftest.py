"""Loaded for every test under tests/; as a rootless conftest its folder is on sys.path, so the
test files share helpers kept here (ports.py).

It also gives each pytest process its own temporary directory, `<tmp>/trainbook-pytest/<pid>`,
for itself and every program it starts (TMPDIR): the tests' runs, checkpoints, kernels' files
and servers' stores go there. Directories of earlier pytest processes that have ended are
removed first, so a test run leaves at most its own files behind (to read after a failure) and
repeated runs do not fill the disk. Jupyter's per-user data directory (JUPYTER_DATA_DIR: the
kernels' history store, connection files) is in there too, so tests leave the user's own alone.
"""
import os
import shutil
import tempfile
from pathlib import Path


def _own_tmpdir():
    base = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
    if base.parent.name == "trainbook-pytest":  # a pytest started by a test: share its parent's
        return base
    base = base / "trainbook-pytest"
    base.mkdir(parents=True, exist_ok=True)
    for old in base.iterdir():
        if not (old.name.isdigit() and Path("/proc", old.name).exists()):
            shutil.rmtree(old, ignore_errors=True)
    own = base / str(os.getpid())
    own.mkdir(exist_ok=True)
    return own


os.environ["TMPDIR"] = str(_own_tmpdir())
tempfile.tempdir = os.environ["TMPDIR"]
os.environ["JUPYTER_DATA_DIR"] = str(Path(os.environ["TMPDIR"]) / "jupyter-data")
