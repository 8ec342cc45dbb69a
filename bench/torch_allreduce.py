#!/usr/bin/env python3
"""Baseline: torch.distributed's own gloo allreduce, to compare trainbook's against.

Launches itself as --world processes on this machine with the env:// contract (MASTER_ADDR=127.0.0.1,
MASTER_PORT=<free port>, RANK, WORLD_SIZE). Each rank: torch.set_num_threads(1),
init_process_group("gloo"), a float32 tensor of --numel elements filled with rank+1, --warmup
untimed then --iters timed in-place SUM allreduces (dist.barrier() before each,
time.perf_counter() around dist.all_reduce(t)). The tensor is refilled before every allreduce
(outside the timing) and every result is checked against sum(rank+1) = W(W+1)/2.

Rank 0 prints one JSON line. Per-iteration time is the max over ranks (a collective is done when
its slowest rank is); median_s/min_s/mean_s are over the timed iterations;
gbytes_per_s = numel*4 / median_s / 1e9 (algorithm bandwidth: tensor bytes per second);
bus_gbytes_per_s = gbytes_per_s * 2(W-1)/W (what each rank sends on a ring).

Run with the bench venv (bench/torch-venv.sh); started with another python that lacks torch, it
re-executes itself with <repo>/.bench-venv/bin/python.

  python3 bench/torch_allreduce.py                      # 2 ranks, 110M floats (440 MB)
  python3 bench/torch_allreduce.py --numel 100000 --iters 3 --warmup 1   # smoke run
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2, help="number of processes (default 2)")
    p.add_argument("--numel", type=int, default=110_000_000, help="float32 elements (default 110M)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--ifname", default="lo",
                   help="GLOO_SOCKET_IFNAME when not already set in the environment (default lo; "
                        "'' leaves gloo to pick the interface from the hostname)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for init and each collective")
    args = p.parse_args(argv)
    if args.world < 1 or args.numel < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--world, --numel and --iters must be >= 1, --warmup >= 0")
    return args


def ensure_torch():
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".bench-venv")
        venv_py = os.path.join(venv, "bin", "python")
        # (compare prefixes: a venv's python is a symlink to the same interpreter)
        if os.path.exists(venv_py) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
            os.execv(venv_py, [venv_py] + sys.argv)
        sys.exit("torch_allreduce.py: torch is not importable; run bench/torch-venv.sh first")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    env = dict(os.environ)
    if args.ifname and not env.get("GLOO_SOCKET_IFNAME"):
        env["GLOO_SOCKET_IFNAME"] = args.ifname
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.world),
               OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    procs = []
    for rank in range(args.world):
        env["RANK"] = env["LOCAL_RANK"] = str(rank)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_worker"]
                                      + sys.argv[1:], env=dict(env)))
    rc = 0
    try:
        pending = list(procs)
        while pending:
            for p in list(pending):
                r = p.poll()
                if r is None:
                    continue
                pending.remove(p)
                if r != 0 and rc == 0:
                    rc = r
                    for q in pending:  # one rank failed: the others would hang in a collective
                        q.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        rc = 130
    for p in procs:
        p.wait()
    return rc


def worker(args):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.timeout))
    assert dist.get_world_size() == world

    value = float(rank + 1)
    expected = world * (world + 1) / 2  # exact in float32 for any sane world size
    t = torch.empty(args.numel, dtype=torch.float32)
    times = []
    for i in range(args.warmup + args.iters):
        t.fill_(value)  # in-place allreduce multiplies on repeat: refill, outside the timing
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)  # SUM, synchronous
        dt = time.perf_counter() - t0
        if not bool((t == expected).all()):
            bad = t[t != expected]
            raise SystemExit(f"rank {rank}: iteration {i}: {bad.numel()} of {t.numel()} elements != "
                             f"{expected} (first: {bad[0].item()})")
        if i >= args.warmup:
            times.append(dt)

    per_iter = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(per_iter, op=dist.ReduceOp.MAX)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return
    ts = sorted(per_iter.tolist())
    n = len(ts)
    median = ts[n // 2] if n % 2 else (ts[n // 2 - 1] + ts[n // 2]) / 2
    nbytes = args.numel * 4
    algbw = nbytes / median / 1e9
    print(json.dumps({
        "impl": "torch.distributed", "backend": "gloo", "world": world, "numel": args.numel,
        "median_s": round(median, 6), "min_s": round(ts[0], 6), "mean_s": round(sum(ts) / n, 6),
        "gbytes_per_s": round(algbw, 3),
        "bus_gbytes_per_s": round(algbw * 2 * (world - 1) / world, 3),
        "iters": args.iters, "warmup": args.warmup, "threads": args.threads,
        "ifname": os.environ.get("GLOO_SOCKET_IFNAME", ""),
        "torch": torch.__version__.split("+")[0],
    }, separators=(",", ":")), flush=True)


def main():
    worker_mode = "--_worker" in sys.argv[1:]
    args = parse_args([a for a in sys.argv[1:] if a != "--_worker"])
    ensure_torch()
    if worker_mode:
        worker(args)
    else:
        sys.exit(launch(args))


if __name__ == "__main__":
    main()
