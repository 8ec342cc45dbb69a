"""`trainbook prepare` on directories Hugging Face `datasets` wrote with `save_to_disk` (Arrow
IPC streams + state.json), made here with the real `datasets` package. The same texts as a
.jsonl file must prepare to the same tokens, byte for byte. Run: .venv/bin/python -m pytest
tests/data
"""
import json
import subprocess
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

ROOT = Path(__file__).resolve().parents[2]
TRAINBOOK = ROOT / "target/release/trainbook"
BROWN = ROOT / ".data/datasets/brown/brown.txt"


@pytest.fixture(scope="module")
def texts():
    lines = [l for l in BROWN.read_text().splitlines() if l.strip()][:4000]
    # A null and an empty text: skipped and kept exactly as the table readers do.
    return lines[:100] + [None, ""] + lines[100:]


def prepare(data, out, *extra):
    p = subprocess.run([str(TRAINBOOK), "prepare", "--data", str(data), "--out", str(out), "--json", *extra],
                       capture_output=True, text=True, timeout=300)
    return p


def tokens(prepared):
    return {f.name: f.read_bytes() for f in sorted(Path(prepared).glob("*.tokens"))}


def as_jsonl(texts, path):
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))


def test_a_saved_dataset_prepares_to_the_same_tokens_as_the_same_texts_in_jsonl(tmp_path, texts):
    ds = Dataset.from_dict({"id": list(range(len(texts))), "text": texts})
    # Several .arrow files, listed in state.json: read in its order.
    ds.save_to_disk(str(tmp_path / "saved"), max_shard_size="100KB")
    assert len(json.loads((tmp_path / "saved/state.json").read_text())["_data_files"]) > 1
    as_jsonl(texts, tmp_path / "same.jsonl")
    p = prepare(tmp_path / "saved", tmp_path / "a")
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(p.stdout.strip().splitlines()[-1])
    q = prepare(tmp_path / "same.jsonl", tmp_path / "b")
    assert q.returncode == 0, q.stderr[-3000:]
    r = json.loads(q.stdout.strip().splitlines()[-1])
    assert s["texts"] == r["texts"] == len(texts) - 1, (s, r)
    assert s["train_tokens"] == r["train_tokens"] > 0 and s["eval_tokens"] == r["eval_tokens"] > 0
    assert tokens(tmp_path / "a") == tokens(tmp_path / "b")

    # A DatasetDict reads its train split; a directory of saved datasets reads each in name
    # order (Wikipedia and BookCorpus side by side).
    half = len(texts) // 2
    DatasetDict({"train": ds, "validation": ds.select(range(10))}).save_to_disk(str(tmp_path / "dict"))
    both = tmp_path / "both"
    ds.select(range(half)).save_to_disk(str(both / "1-wikipedia"))
    ds.select(range(half, len(texts))).save_to_disk(str(both / "2-bookcorpus"))
    for source, out in [(tmp_path / "dict", "c"), (both, "d")]:
        p = prepare(source, tmp_path / out)
        assert p.returncode == 0, p.stderr[-3000:]
        assert tokens(tmp_path / out) == tokens(tmp_path / "b"), source


def test_saved_datasets_with_no_text_column_or_no_train_split_are_clear_errors(tmp_path):
    Dataset.from_dict({"article": ["a text"] * 10, "n": list(range(10))}).save_to_disk(str(tmp_path / "saved"))
    p = prepare(tmp_path / "saved", tmp_path / "a")
    assert p.returncode == 2, p.stderr
    assert "has no column 'text': its columns are article, n; choose one with text_column" in p.stderr, p.stderr
    assert not (tmp_path / "a" / "index.json").exists()
    p = prepare(tmp_path / "saved", tmp_path / "a", "--text-column", "n")
    assert p.returncode == 2 and "column 'n'" in p.stderr and "not text" in p.stderr, p.stderr
    p = prepare(tmp_path / "saved", tmp_path / "a", "--text-column", "article")
    assert p.returncode == 0, p.stderr

    DatasetDict({"test": Dataset.from_dict({"text": ["a text"]})}).save_to_disk(str(tmp_path / "dict"))
    p = prepare(tmp_path / "dict", tmp_path / "b")
    assert p.returncode == 2, p.stderr
    assert "splits test and no 'train'" in p.stderr and str(tmp_path / "dict" / "test") in p.stderr, p.stderr

    # A file listed in state.json and missing.
    saved = tmp_path / "saved"
    for f in saved.glob("*.arrow"):
        f.unlink()
    p = prepare(saved, tmp_path / "c")
    assert p.returncode == 2 and "which its state.json lists" in p.stderr, p.stderr
