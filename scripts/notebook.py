#!/usr/bin/env python3
"""Runs trainbook's notebooks headless and prepares parameterised copies of them.

    notebook.py params  IN OUT [-p NAME=RUST_EXPR ...]   write a parameterised copy
    notebook.py execute IN OUT [-p NAME=RUST_EXPR ...] [--html] [--timeout S]
    notebook.py check-stripped NOTEBOOK...               fail if a notebook has outputs

Parameters follow papermill's convention (papermill itself has no Rust translator): the values
go into a new code cell tagged `injected-parameters` right after the cell tagged `parameters`,
as Rust `let` bindings that shadow the defaults. A value is a Rust expression, e.g.
`-p epochs=1 -p 'preset="tiny"'`; `-p NAME=VALUE` for a name the parameters cell does not bind
is an error, so a typo cannot silently run the full job.

`execute` runs every cell with the trainbook kernel (nbconvert's executor, as
`jupyter nbconvert --execute` does), writes the executed notebook (and with --html an HTML copy next
to it) and exits non-zero when a cell fails, after saving what ran so far.
"""

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat

KERNEL = "trainbook"
LET = re.compile(r"^\s*let\s+(?:mut\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*([^=]+?))?\s*=", re.M)


def parameters_cell(nb):
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            return i
    return None


def parametrize(nb, params):
    """Returns `nb` with an `injected-parameters` cell after the `parameters` cell."""
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    if not params:
        return nb
    at = parameters_cell(nb)
    if at is None:
        raise SystemExit("error: the notebook has no code cell tagged 'parameters'; tag one to pass -p")
    declared = {m.group(1): (m.group(2) or "").strip() for m in LET.finditer(nb.cells[at].source)}
    lines = ["// Parameters injected by scripts/notebook.py"]
    for name, value in params:
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise SystemExit(f"error: parameter '{name}' is not bound in the parameters cell (it binds: {known})")
        ty = f": {declared[name]}" if declared[name] else ""
        lines.append(f"let {name}{ty} = {value};")
    cell = nbformat.v4.new_code_cell("\n".join(lines))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)
    return nb


def parse_params(items):
    out = []
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise SystemExit(f"error: bad parameter '{item}': write NAME=RUST_EXPRESSION, e.g. epochs=1")
        out.append((name.strip(), value.strip()))
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
        p.add_argument("-p", "--param", action="append", metavar="NAME=RUST_EXPR")
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
    nb = parametrize(nbformat.read(args.input, as_version=4), parse_params(args.param))
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
