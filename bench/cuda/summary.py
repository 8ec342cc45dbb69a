#!/usr/bin/env python3
"""Reads the results directory bench/cuda/device.sh fills and prints a markdown summary: the
checks (pass/fail with the numbers behind them) and the throughput table (samples/s after
warm-up, trainbook / PyTorch, MFU, peak GPU memory).

  python3 bench/cuda/summary.py RESULTS_DIR

Both sides' samples/s are the batch over the median step time after WARMUP steps (trainbook's
from the loss events' times in its metrics.parquet, PyTorch's from its own per-step stamps),
so epoch-end checkpoint writes do not count; PyTorch's mean after warm-up is also printed. MFU counts the model's FLOPs
(3x the forward's matrix products: BERT's layers, attention and the masked-LM head over the
predicted positions only; ResNet-50's 4.09 GMAC forward at 224 px) against the dense bf16 peak
of an H100/H200 SXM, 989.4 TFLOP/s, and against the matrix product measured on the machine.
"""
import json
import math
import os
import sys

import pyarrow.parquet as pq

WARMUP = 20
PEAK_BF16 = 989.4e12


def load(res, name):
    try:
        with open(os.path.join(res, name + ".json")) as f:
            return json.loads(f.read().strip() or "null")
    except (OSError, ValueError):
        return None


def losses(res, name):
    path = os.path.join(res, name + ".parquet")
    if not os.path.exists(path):
        return {}
    t = pq.read_table(path).to_pylist()
    return {r["step"]: (r["value"], r["time"]) for r in t if r["name"] == "loss" and r["rank"] == 0}


def steady_rate(res, name, batch):
    """Samples/s of the median step after WARMUP (consecutive loss events' times): robust to
    the epoch-end checkpoint writes inside the timed steps."""
    steps = losses(res, name)
    ks = sorted(steps)[WARMUP - 1:]
    gaps = sorted((steps[b][1] - steps[a][1]) / (b - a) for a, b in zip(ks, ks[1:]))
    return batch / gaps[len(gaps) // 2] if gaps else None


def bert_flops_per_sequence(layers=12, hidden=768, seq=128, vocab=30522, predicted=0.15):
    per_layer = 24 * seq * hidden**2 + 4 * seq**2 * hidden
    head = predicted * seq * (2 * hidden**2 + 2 * hidden * vocab)
    return 3 * (layers * per_layer + head)


RESNET50_FLOPS_PER_IMAGE = 3 * 2 * 4.09e9


def strong_table(res, measured):
    """trainbook against the strong baselines (bench/cuda/strong.py), same machine, same call."""
    path = os.path.join(res, "strong.jsonl")
    if not os.path.exists(path):
        return
    strong = {}
    for line in open(path):
        try:
            j = json.loads(line)
            strong[j["name"]] = j
        except (ValueError, KeyError):
            pass
    print("\n## Against PyTorch done well (bench/cuda/strong.py: data on the GPU, fused AdamW, bf16)\n")
    print("| model | run | samples/s (median step) | trainbook ÷ this | MFU | peak GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model, tb, names, flops in (("BERT-base MLM, 128 tokens, 20 predictions", "tb_bert", ("bert-eager", "bert-compiled"), bert_flops_per_sequence(predicted=20 / 128)),
                                    ("ResNet-50, 224 px", "tb_resnet", ("resnet-nchw", "resnet-cl", "resnet-cl-compiled"), RESNET50_FLOPS_PER_IMAGE)):
        batch = next((strong[n]["batch"] for n in names if n in strong), 0)
        rt = steady_rate(res, tb, batch) if batch else None
        mfu = lambda r: f"{r * flops / PEAK_BF16:.1%}" + (f" ({r * flops / measured:.1%} of measured)" if measured else "")
        jt = load(res, tb) or {}
        mem_t = (jt.get("memory") or [{}])[0].get("peak")
        if rt:
            print(f"| {model} | trainbook ({'its loader' if tb == 'tb_resnet' else 'its masking on the fly'}) | {rt:.0f} | 1.00 | {mfu(rt)} | {mem_t / 2**30 if mem_t else 0:.1f} |")
        # The speed run's extra trainbook runs: the same job again, and the build before.
        for extra, label in ((tb + "_again", "trainbook, again"), (tb + "_graphs", "trainbook, cuda_graphs"),
                             ("base_" + tb[3:], "trainbook, the build before")):
            rx = steady_rate(res, extra, batch) if batch else None
            if rx and rt:
                print(f"| {model} | {label} | {rx:.0f} | {rt / rx:.2f} | {mfu(rx)} | - |")
        # ResNet with its images held on the GPU (--data-on-device): the model's speed, which
        # the baselines (data made on the GPU) measure; its ratios follow the loader's.
        rd = steady_rate(res, tb + "_device", batch) if batch else None
        if rd and rt:
            print(f"| {model} | trainbook (data on the device) | {rd:.0f} | {rt / rd:.2f} (loader ÷ on device) | {mfu(rd)} | - |")
        for n in names:
            if n in strong:
                r = strong[n]["samples_per_second_median_step"]
                ratio = (f"{rt / r:.2f}" if rt else "-") + (f" (on device {rd / r:.2f})" if rd else "")
                print(f"| {model} | PyTorch {n} | {r:.0f} | {ratio} | {mfu(r)} | {strong[n]['cuda_max_memory_allocated'] / 2**30:.1f} |")


def plan_table(res):
    """The memory plan (`trainbook plan --json`) against the peak the job measured
    (max_memory_allocated, which does not see the plan's framework row)."""
    pairs = (("BERT-base MLM, batch 256, bf16", "plan_bert", "tb_bert"),
             ("the same, activation checkpointing", "plan_bert_ckpt", "tb_bert_ckpt"))
    rows = [(label, load(res, p), load(res, t)) for label, p, t in pairs]
    if not any(p and t for _, p, t in rows):
        return
    print("\n## Memory plan against the measured peak (CUDA)\n")
    print("| job | planned GiB | planned without the framework row | measured peak GiB | plan ÷ measured |")
    print("| --- | --- | --- | --- | --- |")
    for label, plan, result in rows:
        if not (plan and result):
            continue
        framework = sum(r["bytes"] for r in plan.get("rows", []) if r["what"] == "framework")
        peak = ((result.get("memory") or [{}])[0]).get("peak") or 0
        total = plan["total"]
        ratio = f"{(total - framework) / peak:.2f}" if peak else "-"
        print(f"| {label} | {total / 2**30:.2f} | {(total - framework) / 2**30:.2f} | {peak / 2**30:.2f} | {ratio} |")


def main():
    res = sys.argv[1]
    exits = {}
    if os.path.exists(os.path.join(res, "exits.txt")):
        for line in open(os.path.join(res, "exits.txt")):
            k, _, v = line.strip().partition(" ")
            exits[k] = v
    measured = None
    if os.path.exists(os.path.join(res, "matmul.txt")):
        try:
            measured = float(open(os.path.join(res, "matmul.txt")).read().split()[0]) * 1e12
        except (ValueError, IndexError):
            pass
    print("## Checks\n")
    print("| check | result | detail |")
    print("| --- | --- | --- |")

    def row(name, ok, detail):
        print(f"| {name} | {'pass' if ok else 'FAIL'} | {detail} |")

    if "check1" in exits:
        row("trainbook check, 1 worker (NCCL allreduce, broadcast, barrier)", exits["check1"] == "0", f"exit {exits['check1']}")
    if "check2" in exits:
        # One GPU: 2 workers must be refused before any process starts, not hang in NCCL.
        row("trainbook check, 2 workers on 1 GPU: refused up front", exits["check2"] == "1", f"exit {exits['check2']}")
    if "unit" in exits:
        row("optimizer unit tests on the GPU (fused CUDA AdamW/SGD vs libtorch, LAMB/LANS vs PyTorch, 1e-6)", exits["unit"] == "0", f"exit {exits['unit']}")
    cpu, cuda = losses(res, "cpu_fp32"), losses(res, "cuda_fp32")
    if cpu and cuda:
        common = sorted(set(cpu) & set(cuda))
        diff = max(abs(cpu[s][0] - cuda[s][0]) / max(abs(cpu[s][0]), 1e-12) for s in common)
        jc, jg = load(res, "cpu_fp32") or {}, load(res, "cuda_fp32") or {}
        pd = abs(jc.get("param_l2", math.nan) - jg.get("param_l2", math.nan)) / max(abs(jc.get("param_l2", 1.0)), 1e-12)
        row("1 worker CUDA vs CPU, fp32, dropout 0, 20 steps", diff <= 1e-4 and pd <= 1e-4,
            f"{len(common)} steps, max relative loss difference {diff:.2e}, parameter L2 {pd:.2e}")
    z0, z1 = losses(res, "cuda_zero0"), losses(res, "cuda_zero1")
    if z0 and z1:
        common = sorted(set(z0) & set(z1))
        diff = max(abs(z0[s][0] - z1[s][0]) for s in common)
        j0, j1 = load(res, "cuda_zero0") or {}, load(res, "cuda_zero1") or {}
        pd = abs(j0.get("param_sum", math.nan) - j1.get("param_sum", math.nan))
        row("ZeRO-1 vs plain, AdamW, CUDA (1 rank: the NCCL reduce-scatter/all-gather path)", diff <= 1e-5 and pd <= 1e-3,
            f"max loss difference {diff:.2e}, parameter-sum difference {pd:.2e}")
    bf = losses(res, "cuda_bf16")
    if bf:
        ks = sorted(bf)
        vals = [bf[k][0] for k in ks]
        ok = all(math.isfinite(v) for v in vals)
        row("bf16 autocast on CUDA, 60 steps", ok, f"loss {vals[0]:.4f} -> {vals[-1]:.4f}")
    r = load(res, "resume_on_cpu")
    if r is not None or "resume_on_cpu" in exits:
        row("a CUDA checkpoint resumed on the CPU", exits.get("resume_on_cpu") == "0" and (r or {}).get("status") == "succeeded",
            f"exit {exits.get('resume_on_cpu')}, steps {(r or {}).get('steps')}")

    print("\n## Throughput (1 worker, one GPU, bf16)\n")
    print("| model | batch | trainbook samples/s | PyTorch samples/s (mean) | ratio | trainbook MFU | PyTorch MFU | trainbook peak GiB | PyTorch peak GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    gib = lambda b: f"{b / 2**30:.1f}" if b else "-"
    for model, tb, pt, flops in (("BERT-base MLM, 128 tokens", "tb_bert", "torch_bert", bert_flops_per_sequence()),
                                 ("ResNet-50, 224 px", "tb_resnet", "torch_resnet", RESNET50_FLOPS_PER_IMAGE)):
        jt, jp = load(res, tb), load(res, pt)
        if not jt and not jp:
            continue
        batch = (jp or {}).get("global_batch_size") or 0
        rt = steady_rate(res, tb, batch) if batch else None
        rp = (jp or {}).get("samples_per_second_median_step")
        mem_t = ((jt or {}).get("memory") or [{}])[0].get("peak")
        mem_p = (jp or {}).get("cuda_max_memory_allocated")
        mfu = lambda r: f"{r * flops / PEAK_BF16:.1%}" + (f" ({r * flops / measured:.1%} of measured)" if measured else "") if r else "-"
        ratio = f"{rt / rp:.2f}" if rt and rp else "-"
        mean = (jp or {}).get("samples_per_second_after_warmup") or 0
        print(f"| {model} | {batch} | {rt or 0:.0f} | {rp or 0:.0f} ({mean:.0f}) | {ratio} | {mfu(rt)} | {mfu(rp)} | {gib(mem_t)} | {gib(mem_p)} |")
    strong_table(res, measured)
    scaled = [(n, load(res, n)) for n in ("scale_resnet_loader4", "scale_resnet_loader14", "scale_tb_bert512", "scale_torch_bert512")]
    if any(j for _, j in scaled):
        print("\n## Scaling runs\n")
        print("| run | samples/s (median step) | peak GiB |")
        print("| --- | --- | --- |")
        for name, j in scaled:
            if not j:
                continue
            batch = 512 if "bert512" in name else 256
            rate = j.get("samples_per_second_median_step") if name.startswith("scale_torch") else steady_rate(res, name, batch)
            peak = j.get("cuda_max_memory_allocated") or ((j.get("memory") or [{}])[0].get("peak"))
            print(f"| {name} | {rate or 0:.0f} | {gib(peak)} |")
    eager, graphed = losses(res, "tb_bert"), losses(res, "tb_bert_graphs")
    if eager and graphed:
        common = sorted(set(eager) & set(graphed))
        diff = max(abs(eager[s][0] - graphed[s][0]) / abs(eager[s][0]) for s in common)
        print(f"\ncuda_graphs against eager, BERT: {len(common)} steps, largest relative loss difference {diff:.2e}"
              f" (steps 1-3 eager in both; the same seeds, dropout on), exit {exits.get('tb_bert_graphs')}")
    if os.path.exists(os.path.join(res, "syncs.txt")):
        counts = dict(line.split() for line in open(os.path.join(res, "syncs.txt")) if len(line.split()) == 2)
        print("\n## Host waits for the GPU (TRAINBOOK_CUDA_SYNC_DEBUG=warn, BERT job)\n")
        print("| steps | warnings in rank 0's log |")
        print("| --- | --- |")
        for name, count in sorted(counts.items()):
            print(f"| {name.removeprefix('tb_bert_syncs')} | {count} |")
        print("\nThe same count at 10 and 30 steps: none inside a step (set-up and the final checkpoint only).")
    profiles = [(n, (load(res, n) or {}).get("profile")) for n in ("tb_bert_profile", "tb_resnet_profile")]
    if any(p for _, p in profiles):
        print("\n## Step profiles (trainbook --profile, rank 0)\n")
        for name, p in profiles:
            if not p:
                continue
            busy = p.get("device_busy")
            # The rate if the GPU never waited (for data, for the host, at a synchronisation):
            # the batch over the GPU's busy time per step, the model's own speed.
            bound = f", {256 / (p['step_ms'] * busy / 1e3):.0f} samples/s if the GPU never waited (batch 256)" if busy else ""
            print(f"### {name}: {p['step_ms']:.2f} ms a step, {100 * p['covered']:.0f}% inside operators"
                  + (f", the GPU busy {100 * busy:.1f}%" if busy is not None else "") + bound + "\n")
            print("| kernel | self ms (all steps) | calls | % of steps |")
            print("| --- | --- | --- | --- |")
            for k in p.get("kernels", [])[:15]:
                print(f"| {k['name'][:90]} | {k['self_ms']:.3f} | {k['calls']} | {100 * k['share']:.1f} |")
            print()
    plan_table(res)
    if measured:
        print(f"\nMeasured bf16 matrix product (8192^3): {measured / 1e12:.0f} TFLOP/s; datasheet peak {PEAK_BF16 / 1e12:.0f}.")


if __name__ == "__main__":
    main()
