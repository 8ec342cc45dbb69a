"""Stand-in for `habana_frameworks.torch.distributed.hccl` (eager mode).

As in the real bridge: importing it loads `_hccl_eager_C` (the `ProcessGroupHCCL` backend and the
c10d collective kernels for the HPU key), derives HLS_MODULE_ID from LOCAL_RANK and registers the
backend name "hccl" for device "hpu" with the extended creator API:

    creator(backend_opts: torch._C._distributed_c10d._DistributedBackendOptions, pg_options)

The real creator calls ProcessGroupHCCL(store, group_rank, group_size, group_id); the stand-in also
passes backend_opts.timeout, which its process group ignores as the bridge's does.
"""
import os

import torch

from habana_frameworks.torch.distributed._hccl_eager_C import ProcessGroupHCCL  # noqa: F401
from habana_frameworks.torch.hpu import HABANA_VISIBLE_MODULES_VAR, HLS_MODULE_ID_VAR


def _setup_module_id(local_rank=-1, world_size=1):
    if HLS_MODULE_ID_VAR in os.environ:
        return
    if local_rank == -1 or world_size == 1:
        # No local rank (or one process): the bridge acquires any free module by type.
        return
    if HABANA_VISIBLE_MODULES_VAR in os.environ:
        visible = os.environ[HABANA_VISIBLE_MODULES_VAR].split(",")
        assert local_rank < len(visible), (
            f"There is not enough devices available for training. "
            f"Please verify if {HABANA_VISIBLE_MODULES_VAR} is set correctly."
        )
        os.environ[HLS_MODULE_ID_VAR] = visible[local_rank]
        return
    os.environ[HLS_MODULE_ID_VAR] = str(local_rank)


def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    """Returns (world_size, rank, local_rank) from the arguments or the environment."""
    if all(v is not None for v in (world_size, rank, local_rank)):
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["RANK"] = str(rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
    world_size = int(os.getenv("WORLD_SIZE", 1))
    rank = int(os.getenv("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    _setup_module_id(local_rank=local_rank, world_size=world_size)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


initialize_distributed_hpu()


def _create_process_group_hccl(backend_opts, pg_opts):
    return ProcessGroupHCCL(
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.group_id,
        timeout=backend_opts.timeout,
    )


torch.distributed.Backend.register_backend(
    "hccl", _create_process_group_hccl, devices=["hpu"], extended_api=True
)
