"""trainbook's side of Intel Gaudi's PyTorch bridge, run by the interpreter a worker embeds.

The bridge registers the HPU device and the hccl collectives from Python imports; these
functions do those imports, check that Python's torch is the libtorch the worker itself runs
(one dispatcher, one set of registrations), and create the hccl backend the way
torch.distributed does, so the worker can attach it to its own c10d process group.
"""

import os
import sys


def add_site_dirs(dirs):
    """Makes the packages of the Python trainbook was set up with importable (a venv's
    site-packages is not on an embedded interpreter's default path)."""
    import site

    for d in dirs:
        if d and d not in sys.path and os.path.isdir(d):
            site.addsitedir(d)


def _loaded_libtorch():
    """The libtorch_cpu files mapped into this process (the worker's, and Python torch's)."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(" ")[-1]
            if path.endswith("/libtorch_cpu.so") or "/libtorch_cpu.so." in path:
                found.add(os.path.realpath(path))
    return sorted(found)


def load():
    """Imports the bridge; returns facts for the worker's log, or raises with the fix."""
    # The bridge first: it imports torch itself, after loading its plugin (the order Gaudi's
    # documentation uses, and one the plugin may rely on to register its device hooks).
    try:
        import habana_frameworks.torch.core  # noqa: F401  (registers the HPU device)
    except ModuleNotFoundError as e:
        missing = getattr(e, "name", "") or ""
        if missing.startswith("habana_frameworks"):
            raise RuntimeError(
                f"the Intel Gaudi PyTorch bridge (habana_frameworks) is not importable: {e}. Run "
                "inside the Gaudi container (see the Dockerfile) or put the bridge on PYTHONPATH; "
                "to train without Gaudi, use --device cpu"
            ) from e
        raise RuntimeError(
            f"Python ({sys.executable or 'embedded'}) cannot import what Gaudi's bridge needs: "
            f"{e}. The hpu build needs the Gaudi container's own torch: run inside that "
            "container, or set TRAINBOOK_PYTHON to the python whose torch trainbook was built "
            "against"
        ) from e
    except Exception as e:
        if "lazy" in str(e).lower():
            raise RuntimeError(
                f"{e} (PT_HPU_LAZY_MODE={os.environ.get('PT_HPU_LAZY_MODE')}): trainbook drives the "
                "bridge in eager mode; unset PT_HPU_LAZY_MODE or set it to 0"
            ) from e
        raise
    import torch

    libs = _loaded_libtorch()
    if len(libs) > 1:
        raise RuntimeError(
            "torch pair mismatch: this worker links one libtorch and Python's torch "
            f"{torch.__version__} loaded another ({', '.join(libs)}), so the HPU device would be "
            "registered in the wrong one. Rebuild trainbook against the container's torch "
            "(`make setup` picks it when scripts/torch-pair.sh finds a matching tch)"
        )
    import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers "hccl")
    import habana_frameworks.torch.hpu as hpu

    count = hpu.device_count() if hasattr(hpu, "device_count") else None
    return {
        "torch": torch.__version__,
        "bridge": os.path.dirname(habana_frameworks.torch.core.__file__),
        "lazy_mode": os.environ.get("PT_HPU_LAZY_MODE", ""),
        "module_id": os.environ.get("HLS_MODULE_ID", ""),
        "device_count": count,
        "libtorch": libs[0] if libs else "",
    }


# Process groups this worker registered by name, kept until shutdown() drops them.
_GROUPS = {}


def create_hccl(host, port, rank, world, timeout_ms, prefix, handover):
    """The hccl backend on the job's rendezvous store, created by the constructor the bridge
    registered with torch.distributed (what init_process_group("hccl") would call).

    With handover "registry" (the default) the backend is wrapped in a torch ProcessGroup the way
    init_process_group does and registered in torch's group registry; returns (None, name) and
    the worker resolves the name in C++. Only torch's own bindings touch the bridge's object, so
    trainbook's build need not share pybind11's internals with torch and the bridge. With
    "cast", returns (backend, None) for the worker to cast through pybind11 itself."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = timedelta(milliseconds=timeout_ms)
    store = dist.TCPStore(host, port, world, False, timeout=timeout, wait_for_workers=False)
    store = dist.PrefixStore(prefix, store)
    plugin = dist.Backend._plugins.get("HCCL")
    if plugin is None:
        raise RuntimeError(
            "the Gaudi bridge did not register the hccl backend with torch.distributed "
            "(habana_frameworks.torch.distributed.hccl imported, but Backend has no HCCL)"
        )
    if getattr(plugin, "extended_api", False):
        opts = dist.distributed_c10d._DistributedBackendOptions()
        opts.store, opts.group_rank, opts.group_size, opts.timeout = store, rank, world, timeout
        opts.group_id, opts.global_ranks_in_group = "0", list(range(world))
        backend = plugin.creator_fn(opts, None)
    else:
        backend = plugin.creator_fn(store, rank, world, timeout)
    if handover == "cast":
        return backend, None
    register = getattr(torch._C._distributed_c10d, "_register_process_group", None)
    if register is None:
        raise RuntimeError(
            f"torch {torch.__version__} has no process-group registry (torch 2.3 and later "
            "have one), so the hccl group cannot be handed over by name: set "
            "TRAINBOOK_HPU_HANDOVER=cast to take it through pybind11 instead"
        )
    pg = dist.ProcessGroup(store, rank, world)
    custom = dist.ProcessGroup.BackendType.CUSTOM
    if hasattr(pg, "_set_default_backend"):
        pg._set_default_backend(custom)
    pg._register_backend(torch.device("hpu"), custom, backend)
    name = f"trainbook:{prefix}"
    register(name, pg)
    _GROUPS[name] = pg
    return None, name


def shutdown():
    """What the end of a Python program would do, before this (non-Python) process exits: drop
    the hccl group (its destructor meets the peers' in a barrier), then run the exit handlers
    the bridge registered (its device and process-group cleanup). Without this the bridge's
    static destructors do that cleanup at exit and import Python without the GIL."""
    import atexit
    import gc

    import torch

    unregister = getattr(torch._C._distributed_c10d, "_unregister_process_group", None)
    for name in list(_GROUPS):
        if unregister is not None:
            unregister(name)
        del _GROUPS[name]
    gc.collect()
    atexit._run_exitfuncs()


def peak_memory():
    """The most HPU memory allocated so far in bytes, or None if the bridge cannot tell."""
    import torch

    hpu = getattr(torch, "hpu", None)
    fn = getattr(hpu, "max_memory_allocated", None)
    try:
        return int(fn()) if fn is not None else None
    except Exception:
        return None
