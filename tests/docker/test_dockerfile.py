"""The Dockerfile cannot be built here (no Docker engine), so CI pins it another way: it is linted,
every RUN in it is one of the scripts below, and each of those scripts runs here for real against
the project venv's Python and torch in the image's place. No Gaudi image is reachable here, so
the Gaudi torch versions are played by the real Python with a torch package whose version.py is
the Gaudi build's: the scripts read exactly that file (they never import torch), and where they
also need headers and libraries, the venv's are linked in.

Scripts the Dockerfile runs (scripts/lint-dockerfile.sh checks this list is complete):
  scripts/container-build.sh  preflight, jupyter, build (which runs scripts/use-tch.sh)
  scripts/install-rust.sh
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = ROOT / ".venv" / "bin" / "python"


def run(*argv, env=None, timeout=600):
    full = dict(os.environ)
    full.pop("TRAINBOOK_TORCH", None)
    full.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run(
        [str(a) for a in argv], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout
    )
    p.seconds = time.monotonic() - t0
    return p


def python_with_torch(tmp_path, version, with_libraries=False):
    """The real Python, with a torch package on its path whose version.py is `version` (a Gaudi
    build's); with_libraries links in the venv's headers and libraries for the layout checks."""
    torch = tmp_path / "site" / "torch"
    torch.mkdir(parents=True)
    if with_libraries:
        venv_torch = next((ROOT / ".venv" / "lib").glob("python3*/site-packages/torch"))
        for d in ("include", "lib"):
            (torch / d).symlink_to(venv_torch / d)
    (torch / "__init__.py").write_text("raise ImportError('needs the Gaudi runtime')\n")
    (torch / "version.py").write_text(f"__version__ = '{version}'\n")
    py = tmp_path / "python3"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={torch.parent} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return py


@pytest.fixture
def gaudi_python(tmp_path):
    """Gaudi 1.22's torch (2.7.1a0+git...): no tch release pairs with it."""
    return python_with_torch(tmp_path, "2.7.1a0+git5a6c5b5")


@pytest.fixture
def gaudi_124_python(tmp_path):
    """Gaudi 1.24.1's torch (2.11.0a0+git...), which trainbook builds with via tch 0.24.0."""
    return python_with_torch(tmp_path, "2.11.0a0+git7a6c5b5", with_libraries=True)


def source_copy(dest):
    """The repository's files (tracked and new, not ignored) copied to dest: a tree that
    scripts may change without touching this checkout."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def test_dockerfile_lints_clean_and_runs_only_tested_scripts():
    p = run("scripts/lint-dockerfile.sh")
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"hadolint \d+\.\d+", p.stdout)
    assert "4 RUN steps, each one tested script of scripts/" in p.stdout


def test_lint_catches_a_dockerfile_that_drifts(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "not-executable.sh").write_text("#!/bin/sh\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM debian:12\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends curl=7.88.1-10\n"
        "RUN scripts/not-executable.sh\n"
        "RUN scripts/gone.sh\n"
        "COPY missing.txt /opt/\n"
    )
    p = run("scripts/lint-dockerfile.sh", tmp_path / "Dockerfile")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "line 2: RUN must run one script of scripts/" in out
    assert "line 3: scripts/not-executable.sh is not executable" in out
    assert "line 4: scripts/gone.sh does not exist" in out
    assert "line 5: COPY source missing.txt does not exist" in out
    assert ".dockerignore must list target" in out


def test_torch_pair_accepts_the_pinned_torch_and_lists_the_pairs():
    p = run("scripts/torch-pair.sh", "--python", VENV_PY)
    assert p.returncode == 0, p.stderr
    assert re.match(r"torch 2\.13\.0( \(2\.13\.0\+\w+\))? in .* <-> tch 0\.26\.0: supported", p.stdout), p.stdout
    rows = run("scripts/torch-pair.sh", "--list")
    assert rows.returncode == 0, rows.stderr
    assert re.search(r"^2\.13\.0 +0\.26\.0 +supported", rows.stdout, re.M), rows.stdout
    # Every Gaudi image's torch has a row, with the tch made for it or the nearest one.
    assert re.search(r"^2\.11\.0 +0\.24\.0 +built with trainbook 2026-11-23 +1\.24\.1", rows.stdout, re.M), rows.stdout
    assert re.search(r"^2\.10\.0 +0\.23\.0 +known, not verified +1\.24\.0", rows.stdout, re.M), rows.stdout
    assert re.search(r"^2\.7\.1 +none +nearest: tch 0\.20\.0 \(torch 2\.7\.0\) +1\.22\.x", rows.stdout, re.M), rows.stdout


def test_torch_pair_explains_a_mismatch(gaudi_python):
    p = run("scripts/torch-pair.sh", "--python", gaudi_python)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "found:     torch 2.7.1 (2.7.1a0+git5a6c5b5)" in p.stderr
    assert "tch 0.20.0 is built for torch 2.7.0" in p.stderr
    assert "TRAINBOOK_TORCH=wheel" in p.stderr
    assert "a Gaudi image whose torch is one of 2.13.0 2.11.0" in p.stderr
    exact = run("scripts/torch-pair.sh", "--torch", "2.10.0")
    assert exact.returncode == 2
    assert "tch 0.23.0 is the release built for torch 2.10.0" in exact.stderr
    bad = run("scripts/torch-pair.sh", "--torch", "latest")
    assert bad.returncode == 1 and "cannot read a version from 'latest'" in bad.stderr


def test_container_mode_fails_at_preflight_in_seconds(gaudi_python):
    p = run("scripts/container-build.sh", "--python", gaudi_python, "preflight",
            env={"TRAINBOOK_TORCH": "container"})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "error: trainbook cannot be built against this torch." in p.stderr
    assert p.seconds < 30, f"preflight took {p.seconds:.1f} s"


def test_auto_mode_falls_back_to_the_wheel_and_says_why(gaudi_python):
    p = run("scripts/container-build.sh", "--python", gaudi_python, "preflight")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WARNING: TRAINBOOK_TORCH=auto falls back to trainbook's own CPU torch" in p.stderr
    assert "the image's torch 2.7.1 (2.7.1a0+git5a6c5b5)" in p.stderr
    check = run("scripts/container-build.sh", "--check", "--python", gaudi_python, "build")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "check passed (wheel)" in check.stderr


def test_unknown_mode_and_step_are_clear_errors():
    p = run("scripts/container-build.sh", "preflight", env={"TRAINBOOK_TORCH": "hpu"})
    assert p.returncode == 1 and "TRAINBOOK_TORCH must be auto, container or wheel, not 'hpu'" in p.stderr
    p = run("scripts/container-build.sh", "compile")
    assert p.returncode == 1 and "unknown argument compile" in p.stderr


def test_install_rust_pins_the_toolchain_the_crates_need():
    p = run("scripts/install-rust.sh", "--check")
    assert p.returncode == 0, p.stderr
    pin = re.search(r"^TOOLCHAIN=(\S+)", (ROOT / "scripts/install-rust.sh").read_text(), re.M).group(1)
    assert f"rustc {pin} and cargo are installed" in p.stderr
    # The pin satisfies every crate's rust-version.
    version = lambda s: tuple(int(x) for x in s.split("."))
    for toml in [ROOT / "Cargo.toml", *ROOT.glob("*/Cargo.toml"), *ROOT.glob("*/*/Cargo.toml")]:
        for need in re.findall(r'^rust-version\s*=\s*"([0-9.]+)"', toml.read_text(), re.M):
            assert version(pin) >= version(need), f"{toml}: rust-version {need} > pinned {pin}"


def test_container_steps_run_against_the_venv_torch(tmp_path):
    """The image's steps for real, with the venv's Python standing in for the image's: its torch is
    trainbook's pair, so auto picks container mode. `build` reruns set-up and make build (warm: no
    compile), installs the kernelspec into that Python's prefix and runs a two-worker check."""
    env = {"TRAINBOOK_RUNS": str(tmp_path / "runs")}
    p = run("scripts/container-build.sh", "--python", VENV_PY, "preflight", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "LIBTORCH will point at it" in p.stderr
    p = run("scripts/container-build.sh", "--python", VENV_PY, "jupyter", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "papermill==" in p.stderr  # headless runs in the image, as `make setup` gives them
    p = run("scripts/container-build.sh", "--python", VENV_PY, "build", env=env, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "trainbook built (container torch 2.13.0)" in p.stderr
    assert "installing trainbook's papermill translator" in p.stderr
    spec = ROOT / ".venv" / "share" / "jupyter" / "kernels" / "trainbook" / "kernel.json"
    assert spec.is_file()


def test_a_gaudi_torch_with_a_built_pair_switches_tch(gaudi_124_python):
    """Gaudi 1.24.1's torch 2.11 has its own tch (0.24.0), which trainbook builds with: auto
    and container mode both build against the image's torch after switching the pin."""
    pair = run("scripts/torch-pair.sh", "--python", gaudi_124_python)
    assert pair.returncode == 3, pair.stdout + pair.stderr
    assert "<-> tch 0.24.0: built with trainbook" in pair.stdout
    for mode in ("auto", "container"):
        p = run("scripts/container-build.sh", "--check", "--python", gaudi_124_python, "build",
                env={"TRAINBOOK_TORCH": mode})
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert "trainbook will build with tch 0.24.0, the release made for torch 2.11.0" in out
        assert "would pin tch and torch-sys to =0.24.0 in Cargo.toml (now 0.26.0)" in out
        assert "check passed (container)" in out


def test_use_tch_switches_the_pins_and_relocks(tmp_path):
    tree = source_copy(tmp_path / "tree")
    p = run(tree / "scripts/use-tch.sh", "0.24.0", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    toml, lock = (tree / "Cargo.toml").read_text(), (tree / "Cargo.lock").read_text()
    assert 'tch = "=0.24.0"' in toml and 'torch-sys = "=0.24.0"' in toml
    assert 'name = "tch"\nversion = "0.24.0"' in lock
    assert 'name = "torch-sys"\nversion = "0.24.0"' in lock
    again = run(tree / "scripts/use-tch.sh", "0.24.0")
    assert again.returncode == 0 and "tch 0.24.0 is already the pin" in again.stderr
    # Back to the pin: the files are as committed again.
    back = run(tree / "scripts/use-tch.sh", "0.26.0", timeout=300)
    assert back.returncode == 0, back.stderr
    assert (tree / "Cargo.toml").read_text() == (ROOT / "Cargo.toml").read_text()
    assert (tree / "Cargo.lock").read_text() == (ROOT / "Cargo.lock").read_text()
    bad = run(tree / "scripts/use-tch.sh", "0.20.0")
    assert bad.returncode == 1 and "tch 0.20.0 is not one trainbook builds with" in bad.stderr
