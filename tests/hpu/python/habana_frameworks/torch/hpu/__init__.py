"""Minimal stand-in for `habana_frameworks.torch.hpu` (also registered as `torch.hpu`)."""
import os

import torch

HABANA_VISIBLE_MODULES_VAR = "HABANA_VISIBLE_MODULES"
HLS_MODULE_ID_VAR = "HLS_MODULE_ID"

_initialized = False
_initializing = False


def is_available() -> bool:
    """Whether an HPU exists. Like the real one it does not acquire a device (so it is True even
    when TRAINBOOK_STANDIN_HPU_BUSY=1 makes acquisition fail)."""
    return True


def device_count() -> int:
    """Modules on the "machine": 8, as on a Gaudi HLS box (TRAINBOOK_STANDIN_HPU_COUNT changes
    it). Each process still sees the one module it acquires as hpu:0, as with the real bridge."""
    if not is_available():
        return 0
    return int(os.environ.get("TRAINBOOK_STANDIN_HPU_COUNT", "8"))


def current_device() -> int:
    init()
    return 0


def init() -> None:
    """Acquire the device now (the first HPU allocation otherwise does it). Raises the bridge's
    "Device acquire failed." RuntimeError when TRAINBOOK_STANDIN_HPU_BUSY=1."""
    global _initialized, _initializing
    if _initialized or _initializing:
        return
    _initializing = True  # the allocation below calls back into _lazy_init
    try:
        torch.empty(0, device="hpu")
        _initialized = True
    finally:
        _initializing = False


def _lazy_init() -> None:
    # Called by torch (device_lazy_init) before the first tensor is made on an hpu device.
    init()


def is_initialized() -> bool:
    return _initialized


def synchronize(device=None) -> None:
    """Host memory: nothing is ever in flight."""


def get_device_name(device=None) -> str:
    return "GAUDI (trainbook stand-in)"


def is_bf16_supported() -> bool:
    return True


if not hasattr(torch, "hpu"):
    import sys

    torch._register_device_module("hpu", sys.modules[__name__])
