"""Shared by the HPU tests: the stand-in Gaudi bridge, built once per session."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def env():
    """Builds the stand-in (no-op when up to date) and returns the environment to run it in:
    strict (PT_HPU_PLACE_ON_CPU=none)."""
    build = subprocess.run(
        ["bash", str(HERE / "build.sh"), "--print-env"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr
    e = dict(os.environ)
    for line in build.stdout.splitlines():
        k, _, v = line.partition("=")
        e[k] = v
    for k in ("PT_HPU_LAZY_MODE", "TRAINBOOK_STANDIN_HPU_BUSY", "HLS_MODULE_ID", "RANK", "LOCAL_RANK"):
        e.pop(k, None)
    # Strict, as the bridge with its CPU fallback off: an operator Gaudi has no kernel for fails
    # (tests/hpu/missing_ops_1.19.txt) instead of quietly running on the host every step.
    e["PT_HPU_PLACE_ON_CPU"] = "none"
    return e
