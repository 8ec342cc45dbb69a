"""ResNet training speed on this CPU with and without channels-last, side by side.

Runs `trainbook train resnet` (1 worker, the offline digits, uint8 batches normalised on the
device either way) for ResNet-18 and ResNet-50, alternating NCHW and channels-last runs so
both see the same machine, and prints the steady samples/s of each and their ratio.
Usage: .venv/bin/python bench/channels_last.py [--rounds 2] [--steps 30] [--size 64]
"""
import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(arch, channels_last, steps, size, runs):
    args = [str(ROOT / "target/release/trainbook"), "train", "resnet", "--preset", "default",
            "--workers", "1", "--device", "cpu", "--arch", arch, "--image-size", str(size),
            "--max-steps", str(steps), "--eval-rows", "0", "--channels-last", str(channels_last).lower(),
            "--json"]
    out = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "TRAINBOOK_RUNS": runs})
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_second"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as runs:
        for arch in ["resnet18", "resnet50"]:
            got = {False: [], True: []}
            for _ in range(a.rounds):
                for cl in [False, True]:
                    got[cl].append(run(arch, cl, a.steps, a.size, runs))
            best = {cl: max(v) for cl, v in got.items()}
            print(json.dumps({"arch": arch, "image_size": a.size, "nchw": got[False], "channels_last": got[True],
                              "ratio_channels_last": best[True] / best[False]}))


if __name__ == "__main__":
    main()
