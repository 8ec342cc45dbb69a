#!/usr/bin/env python3
"""PyTorch-eager baseline: ResNet-18 image-classification throughput with DDP over gloo on CPU.

Same workload as trainbook's Rust/tch ResNet trainer, so the two can be compared side by side:
torchvision resnet18(num_classes=10, no pretrained weights) in train mode, trained on an
ImageFolder (--data: one folder per class of images, decoded and converted to RGB) with the
transforms RandomResizedCrop(--image-size, scale=(0.6, 1.0)), ToTensor, Normalize(ImageNet
mean/std) and no flip; CrossEntropyLoss, AdamW (lr --lr, weight_decay 0). --global-batch-size is
split evenly over --workers processes, each with torch.set_num_threads(--threads); samples come
from a DistributedSampler (shuffle, seed 42, drop_last), re-shuffled each epoch, as many epochs
as --steps needs. Model init seed 42 on every rank; augmentation seed 42 + rank.

Decoding and augmentation run inside the timed loop (the Rust side times its data pipeline
too). --num-workers-loader 0 (the default) decodes in the training process itself, which is the
fair setting on a 2-core machine: extra loader processes would only compete with the training
threads for the same cores. Raise it on bigger machines to overlap loading with compute.

--arch resnet50 --image-size 224 --device cuda (NCCL, one GPU per rank, pinned host memory)
--precision bf16 (autocast, as trainbook's) is the GPU baseline of bench/cuda/device.sh; raise
--num-workers-loader there so decoding keeps up with the GPU.

Rank 0 times the whole loop (barrier first; all --steps, the first included, loading included)
and the steps after --warmup, and prints one JSON line on stdout (final_loss: last step's loss
averaged over ranks); logs and warnings go to stderr. If --data is left at its default and that
folder does not exist yet, a temporary ImageFolder of random 28x28 grayscale PNGs (10 classes)
stands in for it, with a warning on stderr.
Offline only. Run with the bench venv (another python without torch re-executes into it):

  .bench-venv/bin/python bench/torch_resnet.py                           # 2 workers, 30 steps
  .bench-venv/bin/python bench/torch_resnet.py --workers 1 --threads 2 --steps 10 --image-size 32
"""
import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(REPO, ".data/datasets/digits/train")
SEED = 42
NUM_CLASSES = 10
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="processes (DDP ranks), default 2")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads per worker (default cpu_count // workers, >= 1)")
    p.add_argument("--data", default=DEFAULT_DATA,
                   help=f"ImageFolder root with {NUM_CLASSES} class folders (default %(default)s)")
    p.add_argument("--image-size", type=int, default=64, help="RandomResizedCrop output side (default 64)")
    p.add_argument("--global-batch-size", type=int, default=32, help="samples per step, all workers")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the after-warmup rate")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--num-workers-loader", type=int, default=0,
                   help="DataLoader worker processes per rank (default 0: decode in the training "
                        "process, the fair choice on a 2-core machine)")
    p.add_argument("--arch", choices=("resnet18", "resnet34", "resnet50"), default="resnet18")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo) or cuda (NCCL, GPU r for rank r)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    a = p.parse_args()
    if a.threads is None:
        a.threads = max(1, (os.cpu_count() or 1) // max(1, a.workers))
    if min(a.workers, a.threads, a.image_size, a.steps) < 1 or a.warmup < 0 or a.num_workers_loader < 0:
        p.error("--workers, --threads, --image-size and --steps must be >= 1, "
                "--warmup and --num-workers-loader >= 0")
    if a.global_batch_size < a.workers or a.global_batch_size % a.workers:
        p.error(f"--global-batch-size {a.global_batch_size} is not a positive multiple of --workers {a.workers}")
    if not os.path.isdir(a.data) and os.path.abspath(a.data) != DEFAULT_DATA:
        sys.exit(f"torch_resnet.py: dataset not found at {a.data}")
    return a


def make_synthetic_imagefolder(per_class=64, side=28):
    """Temporary ImageFolder of random grayscale PNGs; the caller removes it."""
    try:
        import numpy as np
        from PIL import Image
    except ImportError as e:
        sys.exit(f"torch_resnet.py: {DEFAULT_DATA} does not exist and no stand-in can be made ({e}); "
                 "run `make setup` (or bench/torch-venv.sh for pillow)")
    root = tempfile.mkdtemp(prefix="torch_resnet_digits_")
    rng = np.random.default_rng(SEED)
    for c in range(NUM_CLASSES):
        os.makedirs(os.path.join(root, str(c)))
        for i in range(per_class):
            px = rng.integers(0, 256, size=(side, side), dtype=np.uint8)
            Image.fromarray(px, mode="L").save(os.path.join(root, str(c), f"{i:04d}.png"))
    return root


def worker(rank, a, port):
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import transforms as T

    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.workers)
    W = a.workers
    G, per = a.global_batch_size, a.global_batch_size // W

    tf = T.Compose([
        T.RandomResizedCrop(a.image_size, scale=(0.6, 1.0)),
        T.ToTensor(),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    # ImageFolder's default loader opens each file with PIL and converts it to RGB.
    data = torchvision.datasets.ImageFolder(a.data, transform=tf)
    if len(data.classes) != NUM_CLASSES:
        raise SystemExit(f"torch_resnet.py: {a.data} has {len(data.classes)} class folders, expected {NUM_CLASSES}")
    sampler = DistributedSampler(data, num_replicas=W, rank=rank, shuffle=True, seed=SEED, drop_last=True)
    loader = DataLoader(data, batch_size=per, sampler=sampler, drop_last=True,
                        num_workers=a.num_workers_loader, persistent_workers=a.num_workers_loader > 0,
                        pin_memory=cuda)
    if len(loader) == 0:
        raise SystemExit(f"torch_resnet.py: {len(data)} images is too few for {W} x {per} per step")

    torch.manual_seed(SEED)  # same init on every rank (DDP also broadcasts rank 0's)
    model = getattr(torchvision.models, a.arch)(weights=None, num_classes=NUM_CLASSES)
    model.train()
    model = DDP(model.to(dev), device_ids=[rank] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    loss_fn = torch.nn.CrossEntropyLoss()
    torch.manual_seed(SEED + rank)  # augmentation randomness differs per rank

    dist.barrier()  # start together, so rank 0's clock does not include the others' setup
    t0 = time.perf_counter()
    t_warm = t0 if a.warmup == 0 else None
    stamps = [t0]  # after each step (loss.item() waits for the device)
    step, epoch = 0, 0
    while step < a.steps:
        sampler.set_epoch(epoch)  # fresh shuffle each epoch, identical across ranks
        for images, targets in loader:
            images, targets = images.to(dev, non_blocking=True), targets.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                out = model(images)
                loss_t = loss_fn(out, targets)
            opt.zero_grad()
            loss_t.backward()  # DDP allreduces gradients here
            opt.step()
            loss = loss_t.item()
            stamps.append(time.perf_counter())
            step += 1
            if step == a.warmup:
                t_warm = time.perf_counter()
            if step == a.steps:
                break
        epoch += 1
    t1 = time.perf_counter()

    # Report the last step's loss averaged over ranks (each rank saw a different shard).
    last = torch.tensor([loss], dtype=torch.float64, device=dev)
    dist.all_reduce(last)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    dist.destroy_process_group()
    if rank == 0:
        timed = a.steps - a.warmup
        print(json.dumps({
            "bench": "resnet_throughput", "impl": "pytorch", "workers": W, "threads": a.threads,
            "image_size": a.image_size, "global_batch_size": G, "steps": a.steps, "warmup": a.warmup,
            "seconds": round(t1 - t0, 4),
            "samples_per_second": round(G * a.steps / (t1 - t0), 3),
            "samples_per_second_after_warmup": round(G * timed / (t1 - t_warm), 3) if timed > 0 else None,
            "samples_per_second_median_step": median_rate(stamps[a.warmup:], G),
            "final_loss": round(last.item() / W, 6),
            "arch": a.arch, "device": a.device, "precision": a.precision,
            "cuda_max_memory_allocated": peak,
            "gpu": torch.cuda.get_device_name(dev) if cuda else None,
            "torch": torch.__version__.split("+")[0], "torchvision": torchvision.__version__.split("+")[0],
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
        import torchvision  # noqa: F401  (fail here, with a hint, rather than in every worker)
    except ImportError as e:
        venv = os.path.join(REPO, ".bench-venv")  # started with another python: re-run in the bench venv
        if os.path.exists(f"{venv}/bin/python") and os.path.realpath(sys.prefix) != os.path.realpath(venv):
            os.execv(f"{venv}/bin/python", [f"{venv}/bin/python", os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit(f"torch_resnet.py: {e}; run bench/torch-venv.sh, then use .bench-venv/bin/python")
    tmp = None
    if not os.path.isdir(a.data):  # only the default path gets here (parse_args)
        tmp = a.data = make_synthetic_imagefolder()
        print(f"torch_resnet.py: warning: {DEFAULT_DATA} not found; using random 28x28 PNGs in {tmp} "
              "(throughput only, the loss means nothing)", file=sys.stderr, flush=True)
    try:
        # spawn, not fork: each worker gets a clean interpreter and its own thread pool.
        mp.spawn(worker, args=(a, free_port()), nprocs=a.workers, join=True)
    except mp.ProcessRaisedException as e:
        sys.exit(f"torch_resnet.py: a worker failed:\n{e}")
    except mp.ProcessExitedException as e:
        sys.exit(f"torch_resnet.py: a worker died: {e}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
