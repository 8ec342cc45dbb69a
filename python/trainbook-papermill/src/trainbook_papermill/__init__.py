"""papermill support for notebooks on the trainbook kernel (Rust).

    pip install ./python/trainbook-papermill        # from a clone of trainbook
    papermill notebooks/bert.ipynb out.ipynb -p preset tiny -p epochs 1

Once installed, importing papermill registers `RustTranslator` for the kernel named `trainbook`
(see `trainbook_papermill.engine` for how: papermill 2.7 has no translator entry points), so
`-p NAME VALUE` injects, after the cell tagged `parameters`, a cell of

    // Parameters
    let preset = trainbook::param!(preset = "tiny")?;
    let epochs = trainbook::param!(epochs = 1)?;

that rebinds each name with the type the parameters cell declares (`Option<T>` takes `Some(v)`,
and None for None). A value that does not fit its type fails that cell with a message naming the
parameter, its type and what to pass; a name the parameters cell does not declare fails it to
compile; either way papermill exits non-zero. `papermill --help-notebook NOTEBOOK` lists the
parameters (`RustTranslator.inspect`).
"""

# papermill first: importing it loads the `trainbook` engine entry point, i.e. `.engine`, which
# must not find this package half-imported with `.translator` in progress.
import papermill  # noqa: F401

from .engine import TrainbookEngine
from .translator import KERNEL_NAME, RustTranslator, UntranslatableParameter, rust_string

__all__ = ["KERNEL_NAME", "RustTranslator", "TrainbookEngine", "UntranslatableParameter", "rust_string"]
