#!/usr/bin/env python3
"""PyTorch baselines for trainbook's ZeRO-3: a Llama trained data-parallel on CPU over gloo,
either plainly (DDP) or with FSDP2 (`fully_shard` on each decoder layer, then the root, the
model built on the meta device and initialised after sharding), for the side-by-side with
`trainbook train causal-lm --zero 3` (bench/zero3_memory.sh runs both).

Same workload as trainbook's: AutoModelForCausalLM from DIR's config.json with random weights,
fp32 (or bf16 mixed precision: FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32); DDP under autocast), --block tokens a sequence, --batch sequences a worker,
AdamW (lr 1e-4), torch.set_num_threads(--threads), --workers processes. After the timed steps,
one consolidated checkpoint (the whole model and optimizer state gathered on rank 0 and
written), as trainbook writes at the end of an epoch, so both peaks include one.

Prints one JSON line: {"mode", "tokens_per_second", "peak_rss_gib": [per rank], "final_loss"}.

  .bench-venv/bin/python bench/torch_fsdp.py --model DIR --mode fsdp2 --workers 2 --threads 1
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a directory with config.json")
    p.add_argument("--mode", choices=["ddp", "fsdp2"], default="fsdp2")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--batch", type=int, default=2, help="sequences a worker a step")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    return p.parse_args()


def build(a, torch, rank):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(a.model)
    if a.mode == "ddp":
        torch.manual_seed(42)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if a.precision == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.to_empty(device="cpu")
    torch.manual_seed(42)
    model.init_weights()
    for buf_name, buf in model.named_buffers():
        # Rotary inverse frequencies live on meta until recomputed.
        if buf.is_meta:
            raise SystemExit(f"buffer {buf_name} was not initialised")
    return model


def worker(a):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build(a, torch, rank)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, vocab, (a.batch, a.block), generator=g)
    autocast = a.precision == "bf16" and a.mode == "ddp"
    loss = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            dist.barrier()
            start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    took = time.perf_counter() - start
    # One consolidated checkpoint, as trainbook's epoch checkpoint.
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, state = get_state_dict(model, opt, options=options)
    if rank == 0:
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": weights, "optimizer": state}, os.path.join(d, "checkpoint.pt"))
    del weights, state
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20])
    peaks = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0:
        tokens = a.steps * a.batch * a.block * world
        print(json.dumps({"mode": a.mode, "precision": a.precision, "workers": world,
                          "tokens_per_second": tokens / took,
                          "peak_rss_gib": [round(float(p), 3) for p in peaks],
                          "final_loss": float(loss)}), flush=True)
    dist.destroy_process_group()


def main():
    a = args()
    if "RANK" in os.environ:
        return worker(a)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.workers):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.workers), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS=str(a.threads))
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a worker failed: exit codes {codes}")


if __name__ == "__main__":
    main()
