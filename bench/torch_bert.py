#!/usr/bin/env python3
"""PyTorch-eager baseline: BERT fine-tuning (or, with --task mlm, pre-training) throughput with
DDP over gloo on CPU.

Same workload as trainbook's Rust/tch BERT trainer, so the two can be compared side by side:
BertForSequenceClassification (num_labels=2) from --model-dir, rotten_tomatoes reviews
(fresh=0, rotten=1) tokenized to --max-length (padding="max_length") before timing, AdamW
(lr --lr, weight_decay 0), --global-batch-size split evenly over --workers processes, each
with torch.set_num_threads(--threads). Rank r of W takes positions r, r+W, ... of each global
batch of a seeded permutation (DistributedSampler without padding). Seed 42, train mode.

--task mlm mirrors trainbook's bert-mlm recipe instead: a BertForMaskedLM from scratch
(--layers/--hidden/--heads, intermediate 4x hidden, the tokenizer's vocabulary, 512 positions),
all reviews tokenized with special tokens, concatenated and cut into --max-length blocks
(the reference's group_texts), masked per batch by DataCollatorForLanguageModeling (0.15),
AdamW (lr --lr, weight_decay 0.01).

--device cuda (NCCL instead of gloo, one GPU per rank) with --precision bf16 (autocast, as
trainbook's) is the GPU baseline of bench/cuda/device.sh; --fused-adamw uses PyTorch's fused
AdamW kernel instead of its default (foreach) one. CUDA runs also report the peak of
torch.cuda.max_memory_allocated.

Rank 0 times the whole loop (barrier first; all --steps, the first included) and the steps
after --warmup, and prints one JSON line on stdout (final_loss: last step's loss averaged over
ranks); logs and warnings go to stderr.
Offline only. Run with the bench venv (another python without torch re-executes into it):

  .bench-venv/bin/python bench/torch_bert.py                             # 2 workers, 30 steps
  .bench-venv/bin/python bench/torch_bert.py --workers 1 --threads 2 --steps 10
"""
import argparse
import csv
import json
import os
import socket
import sys
import time

# Set before transformers is imported (spawned workers re-import this module, so they get it too).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # keep to the --threads budget

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 42


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="processes (DDP ranks), default 2")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads per worker (default cpu_count // workers, >= 1)")
    p.add_argument("--model-dir", default=os.path.join(REPO, ".data/models/all-MiniLM-L6-v2"))
    p.add_argument("--data", default=os.path.join(REPO, ".data/datasets/rotten_tomatoes/reviews.csv"),
                   help="CSV with columns text,label (label names mapped to ids in sorted order); "
                        "mlm also takes a .txt file, a text per line")
    p.add_argument("--max-length", type=int, default=64, help="tokens per sample (default 64)")
    p.add_argument("--global-batch-size", type=int, default=32, help="samples per step, all workers")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the after-warmup rate")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--task", choices=("classify", "mlm"), default="classify")
    p.add_argument("--layers", type=int, default=4, help="mlm: transformer layers (default 4)")
    p.add_argument("--hidden", type=int, default=256, help="mlm: hidden size (default 256)")
    p.add_argument("--heads", type=int, default=4, help="mlm: attention heads (default 4)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo) or cuda (NCCL, GPU r for rank r)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    p.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True)")
    a = p.parse_args()
    if a.threads is None:
        a.threads = max(1, (os.cpu_count() or 1) // max(1, a.workers))
    if min(a.workers, a.threads, a.max_length, a.steps) < 1 or a.warmup < 0:
        p.error("--workers, --threads, --max-length and --steps must be >= 1, --warmup >= 0")
    if a.global_batch_size % a.workers:
        p.error(f"--global-batch-size {a.global_batch_size} is not divisible by --workers {a.workers}")
    for path, what in ((os.path.join(a.model_dir, "config.json"), "model"), (a.data, "dataset")):
        if not os.path.exists(path):
            sys.exit(f"torch_bert.py: {what} not found at {path}; run `make setup` first")
    return a


def load_reviews(path):
    if path.endswith(".txt"):  # a text per line, as trainbook's bert-mlm reads .txt corpora
        with open(path, encoding="utf-8") as f:
            texts = [line.strip() for line in f if line.strip()]
        return texts, [0] * len(texts)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ids = {name: i for i, name in enumerate(sorted({r["label"] for r in rows}))}  # fresh=0, rotten=1
    return [r["text"] for r in rows], [ids[r["label"]] for r in rows]


def worker(rank, a, port):
    import torch
    import torch.distributed as dist
    import transformers
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if rank != 0:
        transformers.logging.set_verbosity_error()  # one copy of the load report is enough
        transformers.logging.disable_progress_bar()
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.workers)
    W = a.workers

    # Tokenize everything up front: the clock must see training only.
    texts, labels = load_reviews(a.data)
    tok = transformers.AutoTokenizer.from_pretrained(a.model_dir, use_fast=True)
    torch.manual_seed(SEED)  # same head init on every rank (DDP also broadcasts rank 0's)
    if a.task == "mlm":
        stream = [i for ids_ in tok(texts, truncation=False)["input_ids"] for i in ids_]
        blocks = len(stream) // a.max_length
        ids = torch.tensor(stream[: blocks * a.max_length]).view(blocks, a.max_length)
        labels = torch.zeros(blocks, dtype=torch.long)  # only the permutation's length is used
        collate = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
        config = transformers.BertConfig(
            vocab_size=tok.vocab_size, hidden_size=a.hidden, num_hidden_layers=a.layers,
            num_attention_heads=a.heads, intermediate_size=4 * a.hidden, max_position_embeddings=512)
        model = transformers.BertForMaskedLM(config)
        weight_decay = 0.01
    else:
        enc = tok(texts, truncation=True, padding="max_length", max_length=a.max_length, return_tensors="pt")
        ids, mask, types = enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
        labels = torch.tensor(labels, dtype=torch.long)
        model = transformers.BertForSequenceClassification.from_pretrained(a.model_dir, num_labels=2)
        weight_decay = 0.0
    model.train()  # dropout 0.1 from config.json
    model = DDP(model.to(dev), device_ids=[rank] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=weight_decay,
                            **({"fused": True} if a.fused_adamw else {}))
    autocast = lambda: torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")
    put = lambda t: t.to(dev, non_blocking=True)

    # Seeded permutation, identical on all ranks; a fresh one per epoch if steps outrun the data.
    gen = torch.Generator().manual_seed(SEED)
    n, G, per = len(labels), a.global_batch_size, a.global_batch_size // W
    order = torch.cat([torch.randperm(n, generator=gen) for _ in range(-(-a.steps * G // n))])

    dist.barrier()  # start together, so rank 0's clock does not include the others' loading
    t0 = time.perf_counter()
    t_warm = t0 if a.warmup == 0 else None
    stamps = [t0]  # after each step (loss.item() waits for the device)
    for step in range(a.steps):
        idx = order[step * G + rank:(step + 1) * G:W]  # positions rank, rank+W, ... of this batch
        assert len(idx) == per
        if a.task == "mlm":
            batch = collate([{"input_ids": row} for row in ids[idx]])
            with autocast():
                out = model(input_ids=put(batch["input_ids"]), labels=put(batch["labels"]))
        else:
            with autocast():
                out = model(input_ids=put(ids[idx]), attention_mask=put(mask[idx]),
                            token_type_ids=put(types[idx]), labels=put(labels[idx]))
        opt.zero_grad()
        out.loss.backward()  # DDP allreduces gradients here
        opt.step()
        loss = out.loss.item()
        stamps.append(time.perf_counter())
        if step + 1 == a.warmup:
            t_warm = time.perf_counter()
    t1 = time.perf_counter()

    # Report the last step's loss averaged over ranks (each rank saw a different shard).
    last = torch.tensor([loss], dtype=torch.float64, device=dev)
    dist.all_reduce(last)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    dist.destroy_process_group()
    if rank == 0:
        timed = a.steps - a.warmup
        print(json.dumps({
            "bench": "bert_mlm_throughput" if a.task == "mlm" else "bert_throughput", "impl": "pytorch", "workers": W, "threads": a.threads,
            "max_length": a.max_length, "global_batch_size": G, "steps": a.steps, "warmup": a.warmup,
            "seconds": round(t1 - t0, 4),
            "samples_per_second": round(G * a.steps / (t1 - t0), 3),
            "samples_per_second_after_warmup": round(G * timed / (t1 - t_warm), 3) if timed > 0 else None,
            "samples_per_second_median_step": median_rate(stamps[a.warmup:], G),
            "final_loss": round(last.item() / W, 6),
            "device": a.device, "precision": a.precision,
            "optimizer": "adamw (fused)" if a.fused_adamw else "adamw (torch default)",
            "cuda_max_memory_allocated": peak,
            "gpu": torch.cuda.get_device_name(dev) if cuda else None,
            "torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
        }), flush=True)


def median_rate(stamps, batch):
    """Samples/s of the median step among consecutive stamps (None with fewer than two)."""
    steps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    return round(batch / steps[len(steps) // 2], 3) if steps else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse_args()
    try:
        import torch.multiprocessing as mp
        import transformers  # noqa: F401  (fail here, with a hint, rather than in every worker)
    except ImportError as e:
        venv = os.path.join(REPO, ".bench-venv")  # started with another python: re-run in the bench venv
        if os.path.exists(f"{venv}/bin/python") and os.path.realpath(sys.prefix) != os.path.realpath(venv):
            os.execv(f"{venv}/bin/python", [f"{venv}/bin/python", os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit(f"torch_bert.py: {e}; run bench/torch-venv.sh, then use .bench-venv/bin/python")
    try:
        # spawn, not fork: each worker gets a clean interpreter and its own thread pool.
        mp.spawn(worker, args=(a, free_port()), nprocs=a.workers, join=True)
    except mp.ProcessRaisedException as e:
        sys.exit(f"torch_bert.py: a worker failed:\n{e}")
    except mp.ProcessExitedException as e:
        sys.exit(f"torch_bert.py: a worker died: {e}")


if __name__ == "__main__":
    main()
