"""scripts/check-docs.py: on a tiny tree with planted mistakes it reports exactly those, one line
each with its fix, and exits 1; on the repository itself it passes. Both runs ask the built
trainbook binary (TRAINBOOK_BIN, default target/release/trainbook) for its flags, so they are
skipped until `make build` has made it."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check-docs.py"
BINARY = Path(os.environ.get("TRAINBOOK_BIN", REPO / "target" / "release" / "trainbook"))

needs_binary = pytest.mark.skipif(
    not BINARY.is_file(), reason=f"{BINARY} is not built (run `make build`)"
)


def check(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--trainbook", str(BINARY), *args],
        capture_output=True, text=True, timeout=60,
    )


def write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))


@needs_binary
def test_planted_mistakes_are_reported_with_their_fix(tmp_path):
    write(tmp_path / "README.md", """
        # Tiny

        The [guide](docs/guide.md) and its [flags](docs/guide.md#flags) are fine.
        This [page](docs/gide.md) is not there.

        Run `trainbook trian bert` to train.
        """)
    write(tmp_path / "docs" / "guide.md", """
        # Guide

        ## Flags

        Back [up](../README.md#tiny), and [here](#flag).

        ```sh
        trainbook train bert --workers 2 --lr=1e-3 \\
            --epochs 1
        trainbook train bert --wrokers 2   # a typo
        ```
        """)
    r = check("--root", str(tmp_path))
    problems = [l for l in r.stdout.splitlines() if not l.startswith("check-docs:")]
    assert problems == [
        "README.md:4: link `docs/gide.md` — no file or directory docs/gide.md"
        " (did you mean docs/guide.md?); paths are relative to ./",
        "README.md:6: `trainbook trian` — trainbook has no subcommand trian"
        " (did you mean train?); see `trainbook --help`",
        "docs/guide.md:5: link `#flag` — this file has no heading with anchor #flag;"
        " did you mean #flags?",
        "docs/guide.md:10: `trainbook train --wrokers` — train has no --wrokers"
        " (did you mean --workers?); see `trainbook train --help`",
    ], r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("check-docs: 4 problem(s) in 2 file(s)")
    assert r.returncode == 1


@needs_binary
def test_the_repository_passes():
    r = check()
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("check-docs: ") and "all good" in r.stdout


def test_a_missing_binary_says_to_build(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--trainbook", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    assert "make build" in r.stderr
