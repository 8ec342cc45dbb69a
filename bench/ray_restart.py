#!/usr/bin/env python3
"""Ray Train's side of the restart benchmark (trainbook's is `cargo bench --bench engine -- r`).

The same job as trainbook's: a tiny BERT (2 layers, hidden 64, 2 heads, vocabulary 128,
16-token sequences, 2 classes) trained on generated sequences by 2 CPU workers, global batch 8,
AdamW lr 1e-3. The loop is written as Ray's docs ask: `ray.train.report` a checkpoint every
--checkpoint-every steps (rank 0 saves model, optimizer and step), `ray.train.get_checkpoint()`
loaded at the start; `FailureConfig(max_failures=1)`. Rank 1 kills itself with SIGKILL at step
--kill-at of the first attempt. Timestamps go to files in a scratch directory: the kill, the
first step after the restart, and the step --kill-at reached again (the work lost made up).
Prints one JSON line. Offline; run with the bench venv after `bench/ray-venv.sh`:

  .bench-venv/bin/python bench/ray_restart.py --rounds 3
"""
import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def train_loop(config):
    import torch
    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint
    from transformers import BertConfig, BertForSequenceClassification

    torch.set_num_threads(1)
    torch.manual_seed(42)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=128,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=256,
            max_position_embeddings=32,
            num_labels=2,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    model = ray.train.torch.prepare_model(model)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, 128, (1024, 16), generator=g)
    labels = torch.randint(0, 2, (1024,), generator=g)
    local = config["global_batch"] // world
    scratch = config["scratch"]
    first_after_restart = start > 0
    for step in range(start, config["steps"]):
        if rank == 1 and start == 0 and step == config["kill_at"]:
            with open(os.path.join(scratch, "killed"), "w") as f:
                f.write(f"{time.time()} {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        i = (step * config["global_batch"] + rank * local) % (1024 - local)
        out = model(input_ids=ids[i : i + local], labels=labels[i : i + local])
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        done = step + 1
        if rank == 0 and first_after_restart:
            first_after_restart = False
            with open(os.path.join(scratch, "first_step"), "w") as f:
                f.write(f"{time.time()} {start}")
        if rank == 0 and start > 0 and done == config["kill_at"]:
            with open(os.path.join(scratch, "recovered"), "w") as f:
                f.write(f"{time.time()}")
        if done % config["checkpoint_every"] == 0:
            metrics = {"loss": out.loss.item(), "step": done}
            if rank == 0:
                with tempfile.TemporaryDirectory() as d:
                    torch.save(
                        {
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "step": done,
                        },
                        os.path.join(d, "state.pt"),
                    )
                    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
            else:
                ray.train.report(metrics)


def one_round(args):
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    scratch = tempfile.mkdtemp(prefix="ray-restart-")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "steps": args.steps,
            "kill_at": args.kill_at,
            "checkpoint_every": args.checkpoint_every,
            "global_batch": 8,
            "scratch": scratch,
        },
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            storage_path=os.path.join(scratch, "storage"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    trainer.fit()

    def read(name):
        with open(os.path.join(scratch, name)) as f:
            return [float(x) for x in f.read().split()]

    killed, kill_step = read("killed")
    first, resumed = read("first_step")
    (recovered,) = read("recovered")
    return {
        "kill_to_first_step_s": first - killed,
        "kill_to_recovered_s": recovered - killed,
        "steps_replayed": kill_step - resumed,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--kill-at", type=int, default=250)
    p.add_argument("--checkpoint-every", type=int, default=100)
    args = p.parse_args()
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    rounds = [one_round(args) for _ in range(args.rounds)]
    ray.shutdown()
    first = [r["kill_to_first_step_s"] for r in rounds]
    recovered = [r["kill_to_recovered_s"] for r in rounds]
    print(
        json.dumps(
            {
                "bench": "restart",
                "impl": "ray",
                "ray": __import__("ray").__version__,
                "workers": 2,
                "checkpoint_every": args.checkpoint_every,
                "kill_at_step": args.kill_at,
                "median_kill_to_first_step_s": statistics.median(first),
                "median_kill_to_recovered_s": statistics.median(recovered),
                "kill_to_first_step_s": first,
                "kill_to_recovered_s": recovered,
                "steps_replayed": [r["steps_replayed"] for r in rounds],
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
