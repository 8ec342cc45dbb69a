"""One rank of the stand-in's distributed checks (run by test_standin.py, or by hand).

Env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torch's env://), CHECK (what to do),
TIMEOUT_S. Prints one JSON line with the results on stdout.

  CHECK=collectives  init_process_group("hccl") and the usual collectives on HPU tensors
  CHECK=registry     create the backend the way torch.distributed does (Backend._plugins,
                     extended API) and attach it to a bare c10d ProcessGroup for HPU: the path
                     trainbook's worker takes from C++
  CHECK=kill         rank 1 dies (SIGKILL) after a first all_reduce; rank 0's next one waits
                     forever (HCCL has no timeout: the stand-in turns gloo's error into a wait)
  CHECK=hang         rank 1 stops (SIGSTOP) instead; rank 0's next one waits forever
"""
import habana_frameworks.torch.core  # noqa: F401  (before torch: see habana_frameworks/torch/__init__.py)

import datetime
import json
import os
import signal
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
check = os.environ.get("CHECK", "collectives")
timeout = datetime.timedelta(seconds=float(os.environ.get("TIMEOUT_S", "30")))
hpu = torch.device("hpu")
out = {"rank": rank, "check": check}


def vals(t):
    return t.cpu().tolist()


if check == "registry":
    from torch._C._distributed_c10d import PrefixStore, ProcessGroup, TCPStore, _DistributedBackendOptions

    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0, timeout)
    plugin = dist.Backend._plugins["HCCL"]
    opts = _DistributedBackendOptions()
    opts.store = PrefixStore("hpu/", store)
    opts.group_rank = rank
    opts.group_size = world
    opts.timeout = timeout
    opts.group_id = "0"
    opts.global_ranks_in_group = list(range(world))
    backend = plugin.creator_fn(opts, None)
    pg = ProcessGroup(store, rank, world)
    pg._register_backend(hpu, ProcessGroup.BackendType.CUSTOM, backend)
    pg._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    t = torch.full((3,), float(rank + 1), device=hpu)
    pg.allreduce([t]).wait()
    out.update(
        extended_api=plugin.extended_api,
        backend_type=type(backend).__name__,
        backend_name=pg._get_backend(hpu).name(),
        allreduce=vals(t),
        device=str(t.device),
    )
    print(json.dumps(out), flush=True)
    raise SystemExit(0)

dist.init_process_group("hccl", rank=rank, world_size=world, timeout=timeout)
out["backend"] = dist.get_backend()
out["hls_module_id"] = os.environ.get("HLS_MODULE_ID")

if check in ("kill", "hang"):
    t = torch.ones(4, device=hpu)
    dist.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL if check == "kill" else signal.SIGSTOP)
    time.sleep(0.5)
    start = time.monotonic()
    # The test waits for this line: from here on, this rank is in the collective that blocks.
    os.write(2, b"second all_reduce\n")
    try:
        dist.all_reduce(t)
        out["error"] = None
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = time.monotonic() - start
    print(json.dumps(out), flush=True)
    os._exit(0)  # no clean shutdown with a dead peer

t = torch.full((5,), float(rank + 1), device=hpu)
dist.all_reduce(t)
out["allreduce"] = vals(t)
out["device"] = str(t.device)
x = torch.arange(4.0, device=hpu).view(2, 2).t()  # not contiguous
dist.all_reduce(x)
out["allreduce_strided"] = vals(x)
w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
w.wait()
out["allreduce_async_max"] = vals(t)
b = torch.full((3,), float(rank), device=hpu)
dist.broadcast(b, src=world - 1)
out["broadcast"] = vals(b)
gathered = [torch.empty(2, device=hpu) for _ in range(world)]
dist.all_gather(gathered, torch.full((2,), float(rank), device=hpu))
out["allgather"] = [vals(g) for g in gathered]
flat = torch.empty(2 * world, device=hpu)
dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), device=hpu))
out["allgather_base"] = vals(flat)
rs = torch.empty(2, device=hpu)
dist.reduce_scatter(rs, [torch.full((2,), float(i), device=hpu) for i in range(world)])
out["reduce_scatter"] = vals(rs)
rsb = torch.empty(2, device=hpu)
dist.reduce_scatter_tensor(rsb, torch.arange(2.0 * world, device=hpu))
out["reduce_scatter_base"] = vals(rsb)
co = [torch.ones(2, device=hpu), torch.full((3,), 2.0, device=hpu)]
dist.all_reduce_coalesced(co)
out["allreduce_coalesced"] = [vals(c) for c in co]
dist.barrier()
out["barrier"] = True
dist.destroy_process_group()
print(json.dumps(out), flush=True)
