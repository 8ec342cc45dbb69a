"""papermill and the trainbook kernel: the translator (python/trainbook-papermill) value by value
(no kernel needed), its registration, `scripts/notebook.py`'s use of it, and papermill runs of
notebooks/bert.ipynb through the real kernel.

Run by `make test` (scripts/test-kernel.sh); scripts/setup.sh installed the package into .venv.
"""

import datetime
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from papermill.engines import NBClientEngine, papermill_engines
from papermill.exceptions import PapermillException
from papermill.translators import papermill_translators

import trainbook_papermill
from trainbook_papermill import RustTranslator, UntranslatableParameter

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "trainbook-papermill"
BERT = ROOT / "notebooks" / "bert.ipynb"
BIN = Path(sys.executable).parent


def t(value):
    return RustTranslator.translate(value)


# ---- translation, value by value ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value, rust",
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (2, "2"),
        (-7, "-7"),
        (2**31 - 1, "2147483647"),
        (-(2**31), "-2147483648"),
        # Beyond i32 a suffix, or rustc would read the literal as an (overflowing) i32.
        (2**31, "2147483648i64"),
        (-(2**31) - 1, "-2147483649i64"),
        (-(2**63), "-9223372036854775808i64"),
        (2**63 - 1, "9223372036854775807i64"),
        (2**63, "9223372036854775808u64"),
        (2**64 - 1, "18446744073709551615u64"),
        (1.5, "1.5"),
        (2.0, "2.0"),
        (-0.25, "-0.25"),
        (1e-05, "1e-05"),
        (1e16, "1e+16"),
        (5e-324, "5e-324"),
        ("tiny", '"tiny"'),
        ("", '""'),
        ('say "hi"', r'"say \"hi\""'),
        ("C:\\runs\\x", r'"C:\\runs\\x"'),
        ("a\nb\tc\rd", r'"a\nb\tc\rd"'),
        ("\x00\x07\x7f", r'"\u{0}\u{7}\u{7f}"'),
        ("\u2028\u202e", r'"\u{2028}\u{202e}"'),  # invisible: escaped
        ("héllo wörld 日本 😀", '"héllo wörld 日本 😀"'),  # printable: kept
        ("{}[]\"'//", r'''"{}[]\"'//"'''),
        ([], "[]"),
        ([1, 2.5, "a", None, True], '[1, 2.5, "a", null, true]'),
        ((1, 2), "[1, 2]"),
        ([[1], [], [[None]]], "[[1], [], [[null]]]"),
        ({}, "{}"),
        ({"lr": 0.1, "name": "x"}, '{"lr": 0.1, "name": "x"}'),
        ({"a": {"b": [1, {"c": None}]}}, '{"a": {"b": [1, {"c": null}]}}'),
        ({'k"ey': 1}, r'{"k\"ey": 1}'),
        # Keys as json.dumps writes them: JSON keys are strings.
        ({1: "a", 2.5: "b", False: "c", None: "d"}, '{"1": "a", "2.5": "b", "false": "c", "null": "d"}'),
        ({2**40: 0}, '{"1099511627776": 0}'),
    ],
)
def test_values_translate_to_json_that_rust_reads(value, rust):
    assert t(value) == rust


@pytest.mark.parametrize(
    "value, message",
    [
        (float("nan"), "nan cannot be passed to a Rust notebook"),
        (float("inf"), "which has no NaN or infinity"),
        (float("-inf"), "-inf cannot be passed"),
        ([1, float("nan")], "nan cannot be passed"),
        ({"a": float("inf")}, "inf cannot be passed"),
        (2**64, "18446744073709551616 is outside the whole numbers"),
        (-(2**63) - 1, "-9223372036854775809 is outside"),
        ("bad \udc80 byte", "lone surrogate"),
        (datetime.date(2024, 1, 2), "a date (datetime.date(2024, 1, 2)) cannot be passed"),
        ({1, 2}, "a set"),
        ({(1, 2): 3}, "the dict key (1, 2) is a tuple"),
    ],
)
def test_values_json_cannot_hold_are_refused(value, message):
    with pytest.raises(UntranslatableParameter) as e:
        t(value)
    assert message in str(e.value)
    assert isinstance(e.value, PapermillException)


def test_codify_writes_one_param_line_per_parameter():
    code = RustTranslator.codify({"preset": "tiny", "epochs": 1, "runs_root": None, "sizes": [8, 16]})
    assert code == (
        "// Parameters\n"
        'let preset = trainbook::param!(preset = "tiny")?;\n'
        "let epochs = trainbook::param!(epochs = 1)?;\n"
        "let runs_root = trainbook::param!(runs_root = null)?;\n"
        "let sizes = trainbook::param!(sizes = [8, 16])?;\n"
    )
    assert RustTranslator.codify({}, comment="Injected") == "// Injected\n"
    assert RustTranslator.comment("two\nlines") == "// two lines"


def test_codify_names_the_parameter_it_refuses():
    with pytest.raises(UntranslatableParameter, match=r"parameter `lr`: nan cannot be passed"):
        RustTranslator.codify({"epochs": 1, "lr": float("nan")})
    for name in ("my-param", "1x", "type", "_", "a b"):
        with pytest.raises(UntranslatableParameter, match="is not a Rust variable name"):
            RustTranslator.codify({name: 1})


def test_the_translator_is_found_for_the_trainbook_kernel_only():
    assert papermill_translators.find_translator("trainbook", "rust") is RustTranslator
    # Other Rust kernels (evcxr's) have no trainbook::param!: no translator for the language.
    with pytest.raises(PapermillException, match="No parameter translator"):
        papermill_translators.find_translator("rust", "rust")
    engine = papermill_engines.get_engine("trainbook")
    assert engine is trainbook_papermill.TrainbookEngine and issubclass(engine, NBClientEngine)


def test_importing_papermill_alone_registers_the_translator_through_the_engine_entry_point():
    (ep,) = [e for e in metadata.entry_points(group="papermill.engine") if e.name == "trainbook"]
    assert ep.value == "trainbook_papermill.engine:TrainbookEngine"
    for first in ("papermill", "trainbook_papermill", "papermill.translators"):
        code = (
            f"import {first}\n"
            "from papermill.translators import papermill_translators as t\n"
            "print(t.find_translator('trainbook', 'rust').__name__)"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == "RustTranslator", proc.stderr


def test_the_installed_package_is_this_source():
    """The package in .venv is the one in python/trainbook-papermill (scripts/setup.sh reinstalls
    it when the source changes; run it after editing)."""
    installed = Path(trainbook_papermill.__file__).parent
    for src in (PACKAGE / "src" / "trainbook_papermill").glob("*.py"):
        assert (installed / src.name).read_text() == src.read_text(), f"stale {src.name}: run scripts/setup.sh"


# ---- the parameters cell, inspected ------------------------------------------------------------


def test_inspect_lists_the_declared_parameters():
    cell = nbformat.v4.new_code_cell(
        "let num_workers: usize = 2;          // worker processes\n"
        "let preset: Option<&str> = None;\n"
        "let mut lr = 1e-3; // learning rate\n"
        'let url: &str = "http://x;y"; // where; from\n'
        "let sizes: Vec<usize> = vec![1, 2]; //   sizes  \n"
        "// let commented: u8 = 1;\n"
        "println!(\"not a parameter\");\n"
    )
    params = [tuple(p) for p in RustTranslator.inspect(cell)]
    assert params == [
        ("num_workers", "usize", "2", "worker processes"),
        ("preset", "Option<&str>", "None", ""),
        ("lr", "None", "1e-3", "learning rate"),
        ("url", "&str", '"http://x;y"', "where; from"),
        ("sizes", "Vec<usize>", "vec![1, 2]", "sizes"),
    ]


def test_papermill_help_notebook_lists_the_parameters():
    proc = subprocess.run(
        [str(BIN / "papermill"), "--help-notebook", str(BERT)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "num_workers: usize (default 2)" in proc.stdout, proc.stdout
    assert "preset: Option<&str> (default None)" in proc.stdout
    assert "runs_root: Option<&str> (default None)" in proc.stdout


# ---- scripts/notebook.py parameterises as papermill does ---------------------------------------


def injected(path):
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    # Right after the parameters cell.
    assert "parameters" in nb.cells[nb.cells.index(cells[0]) - 1].metadata["tags"]
    return cells[0].source


def test_notebook_py_injects_the_cell_papermill_injects(tmp_path):
    # -y first, then -p and -r over it (papermill's order): -p's preset and epochs win.
    args = ["-y", '{"preset": "default", "epochs": 5}', "-p", "preset", "tiny", "-p", "epochs", "2",
            "-p", "train_rows", "None", "-r", "runs_root", "0.5"]
    ours = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "notebook.py"), "params", str(BERT), str(tmp_path / "a.ipynb"), *args],
        capture_output=True, text=True, timeout=120,
    )
    assert ours.returncode == 0, ours.stderr
    theirs = subprocess.run(
        [str(BIN / "papermill"), "--prepare-only", str(BERT), str(tmp_path / "b.ipynb"), *args],
        capture_output=True, text=True, timeout=120,
    )
    assert theirs.returncode == 0, theirs.stderr
    assert injected(tmp_path / "a.ipynb") == injected(tmp_path / "b.ipynb") == (
        "// Parameters\n"
        'let preset = trainbook::param!(preset = "tiny")?;\n'
        "let epochs = trainbook::param!(epochs = 2)?;\n"
        "let train_rows = trainbook::param!(train_rows = null)?;\n"
        'let runs_root = trainbook::param!(runs_root = "0.5")?;\n'
    )


def test_notebook_py_refuses_what_json_cannot_hold(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "notebook.py"), "params", str(BERT), str(tmp_path / "x.ipynb"),
         "-p", "epochs", "inf"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "parameter `epochs`: inf cannot be passed to a Rust notebook" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.ipynb").exists()


# ---- papermill runs through the real kernel ----------------------------------------------------


def papermill(out, *params, timeout=900):
    """`papermill notebooks/bert.ipynb OUT -p ...`, cells running in the notebook's folder;
    returns the process and how long it took."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "papermill"), str(BERT), str(out), "--cwd", str(BERT.parent), "--start-timeout", "180",
         "--execution-timeout", "600", *params],
        capture_output=True, text=True, timeout=timeout,
    )
    took = time.monotonic() - t0
    print(f"papermill {' '.join(params)}: exit {proc.returncode} after {took:.1f} s")
    return proc, took


def error_outputs(nb):
    return [
        (i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]


def test_papermill_runs_the_notebook_with_its_parameters(tmp_path):
    out = tmp_path / "bert.ipynb"
    proc, _ = papermill(out, "-p", "preset", "tiny", "-p", "epochs", "1", "-p", "runs_root", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    assert injected(out) == (
        "// Parameters\n"
        'let preset = trainbook::param!(preset = "tiny")?;\n'
        "let epochs = trainbook::param!(epochs = 1)?;\n"
        f"let runs_root = trainbook::param!(runs_root = {RustTranslator.translate(str(tmp_path / 'runs'))})?;\n"
    )
    nb = nbformat.read(out, as_version=4)
    assert error_outputs(nb) == []
    assert nb.metadata.papermill.parameters == {"preset": "tiny", "epochs": 1, "runs_root": str(tmp_path / "runs")}
    # Every code cell ran, and the parameters took: the tiny preset, one epoch, the runs root.
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    text = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
    assert 'preset "tiny"' in text, text[:3000]
    assert list((tmp_path / "runs").iterdir()), "no run directory under runs_root"


def test_papermill_fails_on_a_parameter_the_notebook_does_not_declare(tmp_path):
    out = tmp_path / "nope.ipynb"
    proc, _ = papermill(out, "-p", "preset", "tiny", "-p", "nope", "1")
    assert proc.returncode != 0, proc.stdout + proc.stderr[-5000:]
    assert "nope" in proc.stdout + proc.stderr
    nb = nbformat.read(out, as_version=4)
    failed = error_outputs(nb)
    # The injected cell fails to compile, naming the parameter; nothing after it runs.
    assert len(failed) == 1 and "nope" in str(failed[0][1]), failed
    assert "injected-parameters" in nb.cells[failed[0][0]].metadata.tags
    later = [c for c in nb.cells[failed[0][0] + 1 :] if c.cell_type == "code"]
    assert later and all(c.execution_count is None for c in later)


def test_papermill_fails_on_a_value_that_does_not_fit_the_declared_type(tmp_path):
    out = tmp_path / "half.ipynb"
    proc, _ = papermill(out, "-p", "num_workers", "1.5")
    assert proc.returncode != 0, proc.stdout + proc.stderr[-5000:]
    message = (
        "parameter `num_workers` is declared `usize` in the notebook's parameters cell, so it cannot take 1.5"
    )
    assert message in proc.stdout + proc.stderr, proc.stderr[-5000:]
    assert "pass a whole number ≥ 0 (papermill: -p num_workers 2)" in proc.stdout + proc.stderr


def test_papermill_fails_when_the_training_cell_fails(tmp_path):
    out = tmp_path / "bad.ipynb"
    proc, _ = papermill(out, "-p", "preset", "nope", "-p", "epochs", "1", "-p", "runs_root", str(tmp_path / "runs"))
    assert proc.returncode != 0, proc.stdout + proc.stderr[-5000:]
    assert "unknown preset 'nope'" in proc.stdout + proc.stderr, proc.stderr[-5000:]
    nb = nbformat.read(out, as_version=4)
    failed = error_outputs(nb)
    assert len(failed) == 1 and "unknown preset 'nope'" in str(failed[0][1]), failed
