"""papermill's `papermill.engine` entry point `trainbook`; importing this module registers
`RustTranslator` for the `trainbook` kernel.

papermill 2.7 loads no translator plugins (translators are registered in code, with
`papermill_translators.register`); the plugin groups it does load are `papermill.engine`, when
`papermill` is imported, and `papermill.io`. So the translator's registration rides on an
engine entry point: loading it imports this module. The engine itself is papermill's default
(nbclient), unchanged, so `papermill --engine trainbook` runs notebooks exactly as the default
engine does.
"""

from papermill.engines import NBClientEngine
from papermill.translators import papermill_translators

from .translator import KERNEL_NAME, RustTranslator

# By kernel name, not by language: a notebook on another Rust kernel (evcxr's) says
# `language: rust` too, and `trainbook::param!` exists only on this one.
papermill_translators.register(KERNEL_NAME, RustTranslator)


class TrainbookEngine(NBClientEngine):
    """papermill's nbclient engine, as registered under the name `trainbook`."""
