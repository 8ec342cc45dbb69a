"""notebooks/*.ipynb executed headless with tiny parameters through the real trainbook kernel
(nbclient, via scripts/notebook.py, as `make demo` does), then checked cell by cell.

Run by `make test` (scripts/test-kernel.sh) after `make build` installed the kernelspec.
"""

import math
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts" / "notebook.py"
NOTEBOOKS = ["bert", "resnet"]
ALL_NOTEBOOKS = ["bert", "resnet", "custom", "pretrain", "llm", "tasks"]
# Enough steps for several live redraws, seconds of training on 2 CPU cores.
TINY = [("preset", "tiny"), ("epochs", "2")]


def notebook_tool(*args, timeout=900):
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=timeout
    )


def execute(name, out_dir, params):
    out = out_dir / f"{name}.ipynb"
    runs = out_dir / "runs"
    args = ["execute", str(ROOT / "notebooks" / f"{name}.ipynb"), str(out), "--timeout", "600"]
    for name, value in params + [("runs_root", str(runs))]:
        args += ["-p", name, value]
    proc = notebook_tool(*args)
    assert out.exists(), proc.stderr
    return proc, nbformat.read(out, as_version=4)


def cell_with(nb, needle):
    cells = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert len(cells) == 1, f"expected one cell with {needle!r}"
    return cells[0]


def text_of(cell):
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            parts.append(o.data.get("text/plain", ""))
    return "".join(parts)


def errors(nb):
    return [
        (c.source.splitlines()[0], o.get("ename"), o.get("evalue"))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_is_committed_without_outputs_and_has_a_parameters_cell(name):
    path = ROOT / "notebooks" / f"{name}.ipynb"
    proc = notebook_tool("check-stripped", str(path))
    assert proc.returncode == 0, proc.stderr
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "trainbook"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "let num_workers: usize = 2;" in tagged[0].source
    # The reference's call shape: a training cell that fits with num_workers workers.
    assert "trainer.fit()?" in cell_with(nb, "trainer.fit()").source


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_headless_and_keeps_the_final_dashboard(name, tmp_path):
    proc, nb = execute(name, tmp_path, TINY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"-> {tmp_path / (name + '.ipynb')}" in proc.stdout
    assert errors(nb) == []
    # Every code cell ran, in order.
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and 'let preset = trainbook::param!(preset = "tiny")?;' in injected[0].source

    # The training cell holds exactly one dashboard, in its final (result) state.
    train = cell_with(nb, "trainer.fit()")
    dashboards = [o for o in train.outputs if o.output_type == "display_data"]
    assert len(dashboards) == 1, [o.output_type for o in train.outputs]
    d = dashboards[0].data
    assert {"text/html", "text/plain", "image/png"} <= set(d), sorted(d)
    assert "succeeded" in d["text/plain"] and "checkpoint: " in d["text/plain"]
    assert "<svg" in d["text/html"] and "val loss" in d["text/html"]
    assert len(d["image/png"]) > 1000

    # Results: a finite final loss and one table row per epoch.
    results = text_of(cell_with(nb, "result.epochs()?"))
    assert "Succeeded after" in results, results
    losses = [float(v) for v in re.findall(r"eval_loss: (\S+)", results)]
    assert losses and all(math.isfinite(v) for v in losses), results
    assert "shape: (2," in results, results  # two epochs

    # The checkpoint predicts without the workers.
    predictions = text_of(cell_with(nb, "predict("))
    assert "loaded " in predictions or "true class" in predictions, predictions
    assert re.search(r"\w \(\d\.\d{3}\)", predictions), predictions  # "label (score)"


def test_a_parameter_the_notebook_does_not_declare_is_an_error(tmp_path):
    proc = notebook_tool(
        "params", str(ROOT / "notebooks" / "bert.ipynb"), str(tmp_path / "x.ipynb"), "-p", "epoch", "1"
    )
    assert proc.returncode != 0
    assert "parameter 'epoch' is not declared" in proc.stderr and "epochs" in proc.stderr
    assert not (tmp_path / "x.ipynb").exists()


def test_a_failing_training_cell_fails_the_headless_run(tmp_path):
    """A notebook whose training cell fails stops there, and both headless runners exit
    non-zero: scripts/notebook.py (as `make demo` runs it) and `jupyter nbconvert --execute`."""
    bad = [("preset", "nope"), ("epochs", "1"), ("runs_root", str(tmp_path / "runs"))]
    args = ["execute", str(ROOT / "notebooks" / "bert.ipynb"), str(tmp_path / "bad.ipynb")]
    for name, value in bad:
        args += ["-p", name, value]
    proc = notebook_tool(*args)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "a cell failed" in proc.stderr and "unknown preset 'nope'" in proc.stderr, proc.stderr
    nb = nbformat.read(tmp_path / "bad.ipynb", as_version=4)
    failed = errors(nb)
    assert len(failed) == 1 and "unknown preset 'nope'" in failed[0][2], failed
    # Nothing after the failing cell ran.
    assert cell_with(nb, "result.epochs()?").execution_count is None

    # The same notebook through nbconvert's own command line.
    args[0] = "params"
    assert notebook_tool(*args).returncode == 0
    jupyter = Path(sys.executable).parent / "jupyter"
    out = subprocess.run(
        [str(jupyter), "nbconvert", "--to", "notebook", "--execute", str(tmp_path / "bad.ipynb"),
         "--output", "bad.out.ipynb", "--ExecutePreprocessor.timeout=600"],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode != 0, out.stderr[-3000:]
    assert "unknown preset 'nope'" in out.stderr, out.stderr[-3000:]


def test_custom_notebook_trains_its_own_model_and_predicts_from_the_checkpoint(tmp_path):
    """notebooks/custom.ipynb: a network and step defined in the notebook, trained by 2 workers
    that run the notebook's compiled code; its own metric in the dashboard and the results."""
    path = ROOT / "notebooks" / "custom.ipynb"
    assert notebook_tool("check-stripped", str(path)).returncode == 0
    proc, nb = execute("custom", tmp_path, [("epochs", "1"), ("max_steps", "20")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert errors(nb) == []
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))

    train = cell_with(nb, "trainer.fit()")
    dashboards = [o for o in train.outputs if o.output_type == "display_data"]
    assert len(dashboards) == 1, [o.output_type for o in train.outputs]
    d = dashboards[0].data
    assert "succeeded" in d["text/plain"], d["text/plain"]
    # The task's own metric and the ready-made F1 are in the final view.
    assert "confidence" in d["text/plain"] and "val f1 macro" in d["text/plain"], d["text/plain"]
    assert "confidence" in d["text/html"]

    results = text_of(cell_with(nb, "result.epochs()?"))
    assert "Succeeded after 20 steps" in results, results
    accuracy = float(re.search(r"eval_accuracy: (\S+)", results).group(1))
    assert 0.3 < accuracy <= 1.0, results  # 20 steps of a small CNN: well above chance (0.1)
    assert re.search(r"eval_confidence: 0\.\d+", results), results

    predicted = text_of(cell_with(nb, "load(&Digits"))
    assert re.search(r"predicted: \[(\d, ){9}\d\]", predicted), predicted
    assert re.search(r"true: +\[(\d, ){9}\d\]", predicted), predicted


def test_pretrain_notebook_trains_a_tokenizer_pretrains_and_fine_tunes(tmp_path):
    """notebooks/pretrain.ipynb with a tiny BERT: a WordPiece vocabulary from the Brown corpus,
    masked-LM pre-training by 2 workers (live view with perplexity), then fine-tuning from the
    checkpoint and from random weights, compared."""
    path = ROOT / "notebooks" / "pretrain.ipynb"
    assert notebook_tool("check-stripped", str(path)).returncode == 0
    params = [("vocab_size", "1000"), ("block_size", "32"), ("layers", "2"), ("hidden_size", "64"),
              ("max_steps", "30"), ("finetune_rows", "512")]
    proc, nb = execute("pretrain", tmp_path, params)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert errors(nb) == []

    tok = text_of(cell_with(nb, "TokenizerTrainer::new()"))
    assert re.search(r"^1000 tokens from 15667 texts", tok, re.M), tok
    assert "[CLS] the " in tok and "[SEP]" in tok, tok

    pre = cell_with(nb, "pretrainer.fit()")
    views = [o for o in pre.outputs if o.output_type == "display_data"]
    assert len(views) == 1 and "succeeded" in views[0].data["text/plain"], pre.outputs
    assert "val perplexity" in views[0].data["text/plain"], views[0].data["text/plain"]
    table = text_of(cell_with(nb, "pretrained.epochs()?"))
    assert "eval_perplexity" in table and "eval_masked_accuracy" in table, table

    scratch = text_of(cell_with(nb, "finetune(&checkpoint, true"))
    assert "from scratch: the architecture of" in scratch, scratch
    loaded = text_of(cell_with(nb, "fn finetune("))
    assert "newly initialized" in loaded and "classifier.weight" in loaded, loaded
    compared = text_of(cell_with(nb, "fn acc("))
    accs = [float(a) for a in re.findall(r": +(0\.\d{4})$", compared, re.M)]
    assert len(accs) == 2 and all(0.3 < a < 1.0 for a in accs), compared


def test_llm_notebook_pretrains_a_llama_fine_tunes_it_with_lora_and_generates(tmp_path):
    """notebooks/llm.ipynb with a tiny Llama: a vocabulary and a Llama shape for the Brown
    corpus, next-token pre-training by 2 workers, a LoRA fine-tune on fresh/rotten answers with
    the accuracy before and after, and text generated into a cell."""
    path = ROOT / "notebooks" / "llm.ipynb"
    assert notebook_tool("check-stripped", str(path)).returncode == 0
    params = [("vocab_size", "1000"), ("block_size", "32"), ("layers", "2"), ("hidden_size", "64"),
              ("pretrain_steps", "30"), ("train_reviews", "512"), ("finetune_steps", "20"),
              ("eval_reviews", "20")]
    proc, nb = execute("llm", tmp_path, params)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert errors(nb) == []

    pre = cell_with(nb, "LlamaShape {")
    views = [o for o in pre.outputs if o.output_type == "display_data"]
    assert len(views) == 1 and "succeeded" in views[0].data["text/plain"], pre.outputs
    assert "perplexity" in views[0].data["text/plain"], views[0].data["text/plain"]
    assert "base model: " in text_of(cell_with(nb, "base model:"))

    data = text_of(cell_with(nb, "Column::str(\"prompt\""))
    assert re.search(r"^512 training and 20 held-out snippets", data, re.M), data
    assert re.search(r"Sentiment: (fresh|rotten)$", data, re.M), data

    lora = cell_with(nb, ".lora_rank(lora_rank)")
    views = [o for o in lora.outputs if o.output_type == "display_data"]
    assert len(views) == 1 and "succeeded" in views[0].data["text/plain"], lora.outputs
    compared = text_of(cell_with(nb, "after LoRA"))
    m = re.search(r"before (\d\.\d{3}), after LoRA (\d\.\d{3})", compared)
    assert m and all(0.0 <= float(a) <= 1.0 for a in m.groups()), compared

    story = cell_with(nb, "the old sailor")
    streamed = [o for o in story.outputs if o.output_type == "display_data"]
    assert len(streamed) == 1 and streamed[0].data["text/plain"].strip(), story.outputs
    printed = "".join(o.text for o in story.outputs if o.output_type == "stream")
    assert re.search(r"^\d+ tokens in \d+\.\d\d s", printed, re.M), story.outputs

    # Llama-2-70B with LoRA on 8 x 96 GB under ZeRO-3: planned from its shape, it fits.
    big = text_of(cell_with(nb, "llama-2-70b-shape"))
    assert "ZeRO-3" in big and re.search(r"total +\d+\.\d\d GiB +fits", big), big


def test_tasks_notebook_tags_words_and_answers_questions(tmp_path):
    """notebooks/tasks.ipynb on its tiny preset: a tagger on Brown part-of-speech tags and a
    question answerer on the generated facts-qa set, each used from its checkpoint in a cell."""
    proc, nb = execute("tasks", tmp_path, [("preset", "tiny"), ("max_steps", "6")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert errors(nb) == []
    # Every span the tagger prints is a piece of its sentence, with its tag and offsets.
    sentence = "The jury said the election was conducted well."
    spans = re.findall(r'^(\S+) "(.*)" \[(\d+)\.\.(\d+)\] \((\d\.\d{3})\)$', text_of(cell_with(nb, "tagger.predict(")), re.M)
    assert spans, text_of(cell_with(nb, "tagger.predict("))
    for _, text, start, end, _ in spans:
        assert sentence[int(start):int(end)] == text
    scores = re.search(r"^exact match (\d+\.\d), F1 (\d+\.\d)$", text_of(cell_with(nb, "qa.answer(")), re.M)
    assert scores and 0 <= float(scores.group(1)) <= float(scores.group(2)) <= 100, text_of(cell_with(nb, "qa.answer("))
    answer = text_of(cell_with(nb, "qa.answer("))
    assert re.search(r'^(".*" \[\d+\.\.\d+\] \(score -?\d+\.\d\d\)|\(no answer; null score -?\d+\.\d\d\))$', answer, re.M), answer


def test_sweep_notebook_prunes_with_asha_and_predicts_with_the_best_trial(tmp_path):
    """notebooks/sweep.ipynb with the tiny BERT: 8 trials (4 learning rates × 2 warm-ups drawn at
    random), 2 at a time, ASHA. The launch cell holds one view that ends with every trial succeeded or
    pruned (the diverging lr=1 trials pruned at their first report), the best trial starred and
    where the results are; then the trials table, the best trial's checkpoint predicting, and one
    trial's own dashboard."""
    path = ROOT / "notebooks" / "sweep.ipynb"
    assert notebook_tool("check-stripped", str(path)).returncode == 0
    source = nbformat.read(path, as_version=4)
    nbformat.validate(source)
    assert source.metadata["kernelspec"]["name"] == "trainbook"
    tagged = [c for c in source.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and 'let preset: &str = "default";' in tagged[0].source

    params = [("preset", "tiny"), ("train_rows", "128"), ("eval_rows", "64"), ("max_length", "32")]
    proc, nb = execute("sweep", tmp_path, params)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert errors(nb) == []
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
    runs = tmp_path / "runs"

    # The plan: the grid's 4 learning rates twice, a warm-up drawn in [0, 0.2) for each trial.
    plan = re.findall(r"^trial (\d+): lr=(\S+), warmup_ratio=(\S+)$", text_of(cell_with(nb, "search.plan()?")), re.M)
    assert [int(t) for t, _, _ in plan] == list(range(1, 9)), plan
    assert [lr for _, lr, _ in plan] == ["0.001", "0.01", "0.1", "1"] * 2, plan
    assert all(0.0 <= float(w) < 0.2 for _, _, w in plan), plan

    # One view in the launch cell, in its final state: nothing pending or running.
    launch = cell_with(nb, ".launch()?")
    views = [o for o in launch.outputs if o.output_type == "display_data"]
    assert len(views) == 1 and len(launch.outputs) == 1, [o.output_type for o in launch.outputs]
    text, html = views[0].data["text/plain"], views[0].data["text/html"]
    lines = text.splitlines()
    assert lines[0] == "sweep · bert · 8 trials · 2 at a time · ASHA (grace 1, factor 2) on eval_loss (min)", text
    summary = re.fullmatch(r"(\d+) succeeded · (\d+) pruned · finished after .+", lines[1])
    assert summary and int(summary.group(1)) + int(summary.group(2)) == 8, text
    # The table: columns two or more spaces apart (a time reads "1m 05s", a note is a sentence).
    header = lines.index(next(l for l in lines if l.startswith("trial ")))
    columns = re.split(r" {2,}", lines[header].strip())
    assert columns[:8] == ["trial", "lr", "warmup_ratio", "status", "step", "latest eval_loss", "best eval_loss", "time"], text
    rows = [dict(zip(columns, re.split(r" {2,}", l.strip()))) for l in lines[header + 1 : header + 9]]
    assert [r["trial"].lstrip("★ ") for r in rows] == [str(i) for i in range(1, 9)], text
    assert [r["lr"] for r in rows] == ["0.001", "0.01", "0.1", "1"] * 2, text
    assert {r["status"] for r in rows} == {"succeeded", "pruned"}, text
    for r in rows[3], rows[7]:  # lr=1 diverges within its first epoch: pruned at report 1
        assert r["status"] == "pruned" and float(r["latest eval_loss"]) > 1.0, r
        assert r["step"].endswith("/24") and int(r["step"].split("/")[0]) < 16, r
        assert re.match(r"eval_loss \S+ at report 1 is outside the best 1/2 of \d trials at rung 1 \(cutoff 0\.\d+\)$", r["note"]), r
    for r in rows:
        if r["status"] == "succeeded":
            assert r["step"] == "24/24" and "note" not in r, r  # 3 epochs of 8 steps
    # The best trial: starred, succeeded, named with its parameters.
    best = re.search(r"^best: trial (\d+) \(lr=(\S+), warmup_ratio=(\S+)\) eval_loss (\d\.\d{4})$", text, re.M)
    assert best, text
    best_id = int(best.group(1))
    assert rows[best_id - 1]["trial"] == f"★ {best_id}" and rows[best_id - 1]["status"] == "succeeded", text
    assert text.count("★") == 1
    assert re.search(rf"^succeeded · results in {re.escape(str(runs))}/sweep-bert-\S+$", text, re.M), text
    assert 'class="trainbook-sweep-table"' in html and "<svg" in html and html.count("<tr") == 9
    assert "× pruned" in html and "✓ succeeded" in html and "● running" not in html and "○ pending" not in html

    # The trials table: one row per trial, every column.
    trials = cell_with(nb, "result.trials()")
    assert re.search(r"^Succeeded after \d+ s; results in ", text_of(trials), re.M), text_of(trials)
    table = [o for o in trials.outputs if o.output_type == "execute_result"]
    assert len(table) == 1 and "text/html" in table[0].data, trials.outputs
    t = table[0].data["text/plain"]
    assert t.startswith("shape: (8, 11)"), t
    for column in ("trial", "lr", "warmup_ratio", "status", "eval_loss", "best_eval_loss", "reports", "steps", "run_dir", "note"):
        assert column in t.splitlines()[1], t

    # The best trial's checkpoint predicts, without the workers.
    predicted = text_of(cell_with(nb, "TextClassifier::load("))
    assert f"best: trial {best_id} (lr={best.group(2)}, warmup_ratio={best.group(3)})" in predicted, predicted
    assert re.search(r"^at its end: eval_loss \d\.\d{4}, eval_accuracy [01]\.\d{3}$", predicted, re.M), predicted
    assert re.search(rf"^loaded {re.escape(str(runs))}/sweep-bert-\S+/trial-{best_id}/checkpoints/epoch-\d$", predicted, re.M), predicted
    labels = re.findall(r"^(fresh|rotten) \(\d\.\d{3}\)  \S", predicted, re.M)
    assert len(labels) == 2, predicted

    # That trial's own dashboard, finished.
    shown = cell_with(nb, "sweep.trial(best_id)?.show()?")
    dashboards = [o for o in shown.outputs if o.output_type == "display_data"]
    assert len(dashboards) == 1, [o.output_type for o in shown.outputs]
    d = dashboards[0].data["text/plain"]
    assert "succeeded" in d and "epoch 3/3 · step 24/24" in d, d
    assert re.search(rf"^run directory: \S+/trial-{best_id}$", d, re.M), d


# Names the notebooks' prose mentions that are not trainbook's, and why.
NOT_TRAINBOOK = {
    "notebook_launcher": "Hugging Face accelerate's, named for comparison",
    "resnet50": "torchvision's resnet50(weights=...), named for comparison",
}


def trainbook_names():
    """Every function, method, option setter and module name in trainbook's Rust sources."""
    names = set()
    for f in list(ROOT.glob("prelude/**/*.rs")) + list(ROOT.glob("widgets/**/*.rs")):
        text = f.read_text()
        names |= set(re.findall(r"\b(?:fn|mod)\s+([a-z_][a-z0-9_]*)", text))
        # Setters generated by `options!` from `name: Type => Resolved,` lines.
        names |= set(re.findall(r"^\s*([a-z_][a-z0-9_]*)\s*:[^,\n]*=>", text, re.M))
    return names


def test_every_api_the_notebooks_prose_names_exists():
    """A method or function a notebook's text names in backticks (`result.history_df()`,
    `.lr(..)`, `Type::method`) exists in trainbook, so the prose cannot send a reader to an API
    that was renamed or removed."""
    known = trainbook_names()
    missing = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(nb, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for tick in re.findall(r"`([^`\n]+)`", cell.source):
                if re.fullmatch(r"[\w./-]+\.(json|parquet|csv|txt|ipynb|md|safetensors)", tick):
                    continue  # a file name
                names = set(re.findall(r"\b(?:result|job|sweep|trainer|best|spec|trial|r)\.([a-z_]\w*)", tick))
                names |= set(re.findall(r"\.([a-z_]\w*)\s*\(", tick))
                names |= set(re.findall(r"::([a-z_]\w*)", tick))
                names |= set(re.findall(r"(?<![\w.:])([a-z_]\w*)\s*\(", tick))
                missing += [f"{nb.name}: `{tick}` names `{n}`" for n in sorted(names - known - NOT_TRAINBOOK.keys())]
    assert not missing, "notebook text names APIs trainbook does not have:\n" + "\n".join(missing)
