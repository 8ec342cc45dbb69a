#!/usr/bin/env python3
"""Runs trainbook's notebooks headless and prepares parameterised copies of them.

    notebook.py params  IN OUT [-y YAML ...] [-p NAME VALUE ...] [-r NAME VALUE ...]   a parameterised copy
    notebook.py execute IN OUT [-y YAML ...] [-p NAME VALUE ...] [-r NAME VALUE ...] [--html] [--timeout S]
    notebook.py check-stripped NOTEBOOK...               fail if a notebook has outputs

Parameters are papermill's, translated by the same translator papermill uses for the trainbook
kernel (python/trainbook-papermill, installed into .venv by scripts/setup.sh): `-p NAME VALUE`
reads VALUE as papermill's command line does (True/False, None, an integer, a float, else a
string), `-r NAME VALUE` passes it as a string, `-y YAML` passes a mapping of names to values
(lists and dicts too, e.g. `-y '{"lrs": [0.001, 0.1]}'`), and papermill's own `parameterize_notebook` adds
the cell tagged `injected-parameters` after the cell tagged `parameters`, e.g.
`let preset = trainbook::param!(preset = "tiny")?;`, which rebinds the name with the type the
parameters cell declares. A name the parameters cell does not declare is an error here, before
anything runs, so a typo cannot silently run the full job.

`execute` runs every cell with the trainbook kernel (nbconvert's executor, as
`jupyter nbconvert --execute` does), writes the executed notebook (and with --html an HTML copy next
to it) and exits non-zero when a cell fails, after saving what ran so far.
"""

import argparse
import sys
import time
from pathlib import Path

import nbformat
import yaml
from papermill.cli import _resolve_type as papermill_value  # how `papermill -p` reads a value
from papermill.iorw import NoDatesSafeLoader, load_notebook_node
from papermill.parameterize import parameterize_notebook

try:
    from trainbook_papermill import KERNEL_NAME as KERNEL, RustTranslator, UntranslatableParameter
except ImportError:  # not installed (yet): the same package, from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "trainbook-papermill" / "src"))
    from trainbook_papermill import KERNEL_NAME as KERNEL, RustTranslator, UntranslatableParameter


def parameters_cell(nb):
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            return cell
    return None


def parametrize(nb, params):
    """Returns `nb` with an `injected-parameters` cell after the `parameters` cell, as papermill
    writes it; `params` is a dict of papermill values."""
    if not params:
        nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
        return nb
    cell = parameters_cell(nb)
    if cell is None:
        raise SystemExit("error: the notebook has no code cell tagged 'parameters'; tag one to pass -p")
    declared = [p.name for p in RustTranslator.inspect(cell)]
    for name in params:
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise SystemExit(f"error: parameter '{name}' is not declared in the parameters cell (it declares: {known})")
    try:
        return parameterize_notebook(nb, params, kernel_name=KERNEL, language="rust")
    except UntranslatableParameter as e:
        raise SystemExit(f"error: {e}") from None


def parse_params(params, raw_params, yaml_params=None):
    """`-y` mappings, then `-p`, then `-r` pairs (papermill's order), their values as papermill's
    command line reads them."""
    out = {}
    for text in yaml_params or []:
        try:
            mapping = yaml.load(text, Loader=NoDatesSafeLoader) or {}
        except yaml.YAMLError as e:
            raise SystemExit(f"error: -y {text!r} is not YAML: {e}") from None
        if not isinstance(mapping, dict):
            raise SystemExit(f"error: -y {text!r} is not a mapping of parameter names to values")
        out.update(mapping)
    out.update((name, papermill_value(value)) for name, value in params or [])
    out.update(raw_params or [])
    return out


def execute(nb, path, timeout):
    """Runs every cell with nbconvert's executor (nbclient underneath), as
    `jupyter nbconvert --execute` does; returns the executed notebook (as far as it got) and
    the failing cell's error or None."""
    from nbclient.exceptions import CellExecutionError
    from nbconvert.preprocessors import ExecutePreprocessor

    ep = ExecutePreprocessor(kernel_name=KERNEL, timeout=timeout, startup_timeout=180)
    try:
        nb, _ = ep.preprocess(nb, {"metadata": {"path": str(path.parent)}})
        return nb, None
    except CellExecutionError as e:
        return ep.nb, e


def outputs_of(nb):
    return sum(len(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code") + sum(
        1 for c in nb.cells if c.cell_type == "code" and c.get("execution_count") is not None
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("params", "execute"):
        p = sub.add_parser(name)
        p.add_argument("input", type=Path)
        p.add_argument("output", type=Path)
        p.add_argument("-p", "--parameters", action="append", nargs=2, metavar=("NAME", "VALUE"),
                       help="a parameter, its value read as papermill's -p reads it")
        p.add_argument("-r", "--parameters_raw", action="append", nargs=2, metavar=("NAME", "VALUE"),
                       help="a parameter whose value is a string, as papermill's -r")
        p.add_argument("-y", "--parameters_yaml", action="append", metavar="YAML",
                       help="parameters as a YAML mapping (lists, dicts), as papermill's -y")
        if name == "execute":
            p.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
            p.add_argument("--html", action="store_true", help="also write an HTML copy beside OUT")
    p = sub.add_parser("check-stripped")
    p.add_argument("notebooks", nargs="+", type=Path)
    args = ap.parse_args(argv)

    if args.cmd == "check-stripped":
        bad = [str(p) for p in args.notebooks if outputs_of(nbformat.read(p, as_version=4))]
        if bad:
            raise SystemExit(
                "error: notebooks with outputs or execution counts: " + ", ".join(bad)
                + "\n  strip them: jupyter nbconvert --clear-output --inplace " + " ".join(bad)
            )
        return 0

    if not args.input.is_file():
        raise SystemExit(f"error: no notebook at {args.input}")
    # Read as papermill reads it (papermill's metadata, every cell with a `tags` list).
    nb = parametrize(load_notebook_node(str(args.input)), parse_params(args.parameters, args.parameters_raw, args.parameters_yaml))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.cmd == "params":
        nbformat.write(nb, args.output)
        return 0

    t0 = time.monotonic()
    # Cells run with the notebook's own folder as working directory, as in Jupyter.
    nb, error = execute(nb, args.input.resolve(), args.timeout)
    tmp = args.output.with_name(args.output.name + ".tmp")
    nbformat.write(nb, tmp)
    tmp.replace(args.output)
    written = [args.output]
    if args.html:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nb)
        html = args.output.with_suffix(".html")
        html.write_text(body, encoding="utf-8")
        written.append(html)
    took = time.monotonic() - t0
    where = " and ".join(str(p) for p in written)
    if error is not None:
        print(f"{args.input}: a cell failed after {took:.0f} s; what ran is in {where}", file=sys.stderr)
        print(str(error), file=sys.stderr)
        return 1
    print(f"{args.input}: executed in {took:.0f} s -> {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
