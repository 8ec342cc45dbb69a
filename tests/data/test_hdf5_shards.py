"""bert-mlm on NVIDIA/Habana BERT pre-training HDF5 shards (002's
hdf5_lower_case_1_seq_len_128_max_pred_20_... layout), made here with h5py exactly as
create_pretraining_data.py writes them: int32 datasets, gzip-compressed. Run: .venv/bin/python
-m pytest tests/data
"""
import json
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINBOOK = ROOT / "target/release/trainbook"
SEQ, MAX_PRED, VOCAB = 32, 5, 30522


def write_shard(path, n, seed, drop=None, bad_shape=None):
    """n sequences: [CLS] tokens [SEP], up to MAX_PRED masked positions (padded with 0)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, VOCAB, size=(n, SEQ), dtype=np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    positions = np.zeros((n, MAX_PRED), dtype=np.int32)
    labels = np.zeros((n, MAX_PRED), dtype=np.int32)
    for r in range(n):
        k = rng.integers(2, MAX_PRED + 1)
        pos = np.sort(rng.choice(np.arange(1, SEQ - 1), size=k, replace=False))
        positions[r, :k], labels[r, :k] = pos, ids[r, pos]
        ids[r, pos] = 103  # [MASK]
    data = {
        "input_ids": ids,
        "input_mask": np.ones((n, SEQ), dtype=np.int32),
        "segment_ids": np.concatenate([np.zeros((n, SEQ // 2)), np.ones((n, SEQ // 2))], 1).astype(np.int32),
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "next_sentence_labels": rng.integers(0, 2, size=(n,), dtype=np.int32),
    }
    if bad_shape:
        data[bad_shape] = data[bad_shape][:, :-1]
    with h5py.File(path, "w") as f:
        for name, value in data.items():
            if name != drop:
                f.create_dataset(name, data=value, dtype="i4", compression="gzip")


def train(data, tmp_path, *extra):
    env = {**os.environ, "TRAINBOOK_RUNS": str(tmp_path / "runs")}
    return subprocess.run(
        [str(TRAINBOOK), "train", "bert-mlm", "--preset", "tiny", "--workers", "2", "--device", "cpu",
         "--data", str(data), "--max-length", str(SEQ), "--max-steps", "20", "--train-rows", "100000",
         "--json", *extra],
        env=env, capture_output=True, text=True, timeout=300)


def test_shards_in_the_pretraining_layout_train_20_steps(tmp_path):
    shards = tmp_path / "books_wiki"
    shards.mkdir()
    for i in range(2):
        write_shard(shards / f"books_wiki_en_corpus_train_{i}.hdf5", 200, seed=i)
    p = train(shards, tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["status"] == "succeeded" and s["steps"] == 20, s
    log = (Path(s["run_dir"]) / "logs" / "rank0.log").read_text()
    # 400 sequences, every 20th held out: 380 train, 20 eval.
    assert "380 train / 20 eval samples of 32 tokens" in log, log[-3000:]
    assert "HDF5 shards in" in log and "up to 5 predictions each" in log
    # 002's objective: the next-sentence head trains on the shards' labels (said once).
    assert log.count("training the next-sentence head") == 1, log[-3000:]
    assert "next_sentence_accuracy" in (Path(s["run_dir"]) / "dllogger.json").read_text()
    assert 0 < s["final_train_loss"] < 20, s
    # `trainbook prepare` converts them once into memory-mapped records.
    p = subprocess.run([str(TRAINBOOK), "prepare", "--data", str(shards), "--out", str(tmp_path / "p")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("damage, field", [("drop", "masked_lm_ids"), ("bad_shape", "masked_lm_positions")])
def test_a_shard_missing_a_dataset_or_with_the_wrong_shape_names_the_file_and_the_field(tmp_path, damage, field):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_shard(shards / "a.hdf5", 50, seed=0)
    write_shard(shards / "b.hdf5", 50, seed=1, **{damage: field})
    p = train(shards, tmp_path)
    assert p.returncode != 0
    errors = [l for l in p.stderr.splitlines() if l.startswith("error")]
    assert len(errors) == 1, p.stderr
    assert "b.hdf5" in errors[0] and f"'{field}'" in errors[0] and "input_ids" in errors[0], errors[0]
    # Found before any worker started: no run directory.
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
