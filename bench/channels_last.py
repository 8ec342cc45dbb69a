"""ResNet training speed on this CPU with and without one switch, side by side.

Runs `trainbook train resnet` (1 worker, the offline digits, uint8 batches normalised on the
device either way) for ResNet-18 and ResNet-50, alternating runs without and with the switch
so both see the same machine, and prints the steady samples/s of each and their ratio.
The switch is `--channels-last` (the default) or `--data-on-device` (the images decoded once
and held on the device, against the input pipeline's batches: what the loader costs).
Usage: .venv/bin/python bench/channels_last.py [--switch data-on-device] [--rounds 2] [--steps 30] [--size 64]
"""
import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(arch, switch, on, steps, size, runs):
    args = [str(ROOT / "target/release/trainbook"), "train", "resnet", "--preset", "default",
            "--workers", "1", "--device", "cpu", "--arch", arch, "--image-size", str(size),
            "--max-steps", str(steps), "--eval-rows", "0", f"--{switch}", str(on).lower(),
            "--json"]
    out = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "TRAINBOOK_RUNS": runs})
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_second"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--switch", choices=["channels-last", "data-on-device"], default="channels-last")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    key = a.switch.replace("-", "_")
    with tempfile.TemporaryDirectory() as runs:
        for arch in ["resnet18", "resnet50"]:
            got = {False: [], True: []}
            for _ in range(a.rounds):
                for on in [False, True]:
                    got[on].append(run(arch, a.switch, on, a.steps, a.size, runs))
            best = {on: max(v) for on, v in got.items()}
            print(json.dumps({"arch": arch, "image_size": a.size, "off": got[False], key: got[True],
                              f"ratio_{key}": best[True] / best[False]}))


if __name__ == "__main__":
    main()
