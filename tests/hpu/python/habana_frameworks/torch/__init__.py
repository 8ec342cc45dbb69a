"""Stand-in for `habana_frameworks.torch`: loads the HPU plugin and the Python pieces around it.

Like the real bridge (v1.19+): picks the plugin from PT_HPU_LAZY_MODE and loads it from
`habana_frameworks/torch/lib/` with ctypes.RTLD_GLOBAL; its static initialisers register
PyTorch's built-in HPU device. The stand-in only has the eager plugin. Lazy mode needs Habana's
own torch build (a `+git`/`+hpu` local version), so with stock torch PT_HPU_LAZY_MODE=1 fails here
with the real bridge's message. The stand-in defaults to eager (PT_HPU_LAZY_MODE=0), as recent
bridges do.

One difference: when torch is not imported yet, the plugin is loaded *before* torch. On a
CUDA-enabled torch wheel (trainbook's CI has one, without a GPU) that lets the plugin keep CUDA
out of PyTorch's accelerator detection, so that HPU is the accelerator as on a Gaudi machine
(see NoCUDAHooks in tests/hpu/csrc/hpu_plugin.cpp). Import this package before torch there.
"""
import atexit
import ctypes
import os
import sys
import warnings

_lib_dir = os.path.join(os.path.dirname(__file__), "lib")
_plugin_path = os.path.join(_lib_dir, "libhabana_pytorch2_plugin.so")


def is_lazy():
    return os.getenv("PT_HPU_LAZY_MODE", "0") != "0"


_torch_was_imported = "torch" in sys.modules
if not is_lazy() and not _torch_was_imported:
    ctypes.CDLL(_plugin_path, ctypes.RTLD_GLOBAL)

import torch  # noqa: E402

_run_time_ver = torch.__version__

# As the bridge: it was built for one torch release (required_version.txt beside this file,
# written by build.sh) and refuses another major.minor.
with open(os.path.join(os.path.dirname(__file__), "required_version.txt")) as _f:
    _built_for = _f.read().strip()
if _built_for.split(".")[:2] != _run_time_ver.split("+")[0].split(".")[:2]:
    raise AssertionError(f"habana_frameworks (stand-in) was built for torch {_built_for}, not {_run_time_ver}")
_local = _run_time_ver.split("+", 1)[1] if "+" in _run_time_ver else ""
is_torch_fork = _local.startswith(("git", "hpu"))

if is_lazy() and not is_torch_fork:
    raise AssertionError(f"Stock PyTorch version {_run_time_ver} is not supported in Lazy mode.")
if is_lazy():
    raise AssertionError(
        "trainbook HPU stand-in: lazy mode (libhabana_pytorch_plugin.so) is not imitated; "
        "set PT_HPU_LAZY_MODE=0"
    )

# Real file names: libhabana_pytorch2_plugin.so (Habana's torch fork) or
# libhabana_pytorch2_plugin.upstream.so (stock torch); build.sh makes the second a link to the
# first, so this is the library loaded above when it was.
_plugin = "libhabana_pytorch2_plugin{}.so".format("" if is_torch_fork else ".upstream")
_plugin_lib = ctypes.CDLL(os.path.join(_lib_dir, _plugin), ctypes.RTLD_GLOBAL)

# As the bridge: its device and process-group cleanup runs from Python's atexit when Python is
# initialised (the plugin's static destructors are the fallback; see hpu_plugin.cpp).
atexit.register(_plugin_lib.tb_standin_exit_cleanup)

if _torch_was_imported and torch._C._get_accelerator().type != "hpu":
    warnings.warn(
        "trainbook HPU stand-in: torch was imported before habana_frameworks.torch and CUDA is "
        "built into it, so HPU is not PyTorch's accelerator (autograd on HPU tensors will fail); "
        "import habana_frameworks.torch first",
        stacklevel=2,
    )

import habana_frameworks.torch.core  # noqa: E402,F401
import habana_frameworks.torch.hpu  # noqa: E402,F401
import habana_frameworks.torch.distributed.hccl  # noqa: E402,F401

__version__ = "0.0+trainbook.standin"
