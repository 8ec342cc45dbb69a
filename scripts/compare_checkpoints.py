#!/usr/bin/env python3
"""Largest absolute difference between the float32 tensors of two trainbook checkpoints
(`model.safetensors` files or the checkpoint directories holding them), read without torch.

    scripts/compare_checkpoints.py A B [--tolerance 1e-5]

Prints `max_abs_diff=<value> tensors=<n>`; exits 1 when the names differ or the difference is
above the tolerance. Used by scripts/gaudi-check.sh and the HPU tests (HPU vs CPU runs).
"""
import argparse
import json
import struct
import sys
from array import array
from pathlib import Path


def read_f32(path):
    """name -> array of float32 values, of one safetensors file or of a checkpoint directory
    (its model.safetensors, or every file its model.safetensors.index.json names)."""
    path = Path(path)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if not (path / "model.safetensors").exists() and index.exists():
            out = {}
            for f in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                out.update(read_f32(path / f))
            return out
        path = path / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        a, b = meta["data_offsets"]
        values = array("f")
        values.frombytes(raw[8 + n + a : 8 + n + b])
        out[name] = values
    return out


def max_abs_diff(a, b):
    if a.keys() != b.keys():
        raise ValueError(f"different tensors: {sorted(a.keys() ^ b.keys())[:5]}")
    return max((max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a), default=0.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tolerance", type=float, default=1e-5)
    args = p.parse_args()
    a, b = read_f32(args.a), read_f32(args.b)
    try:
        diff = max_abs_diff(a, b)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"max_abs_diff={diff:.3g} tensors={len(a)}")
    return 0 if diff <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
