"""TensorBoard event files of real runs, read back with TensorBoard's own reader (the
`tensorboard` package in .venv): the scalars are the run's metrics.parquet values step for step,
the options are in the Text tab, and a live reader follows a running job."""
import json
import math
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2 as hp_api
from tensorboard.plugins.hparams import metadata as hp_metadata
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TRAINBOOK = ROOT / "target" / "release" / "trainbook"
RUNS = tempfile.mkdtemp(prefix="tb-tracking-runs-")
TAGS = {
    "loss": "train/loss",
    "lr": "train/learning_rate",
    "epoch_train_loss": "train/epoch_loss",
    "epoch_train_accuracy": "train/epoch_accuracy",
    "eval_loss": "eval/loss",
    "eval_accuracy": "eval/accuracy",
    "eval_f1": "eval/f1",
    "samples_per_second": "throughput/samples_per_second",
}


def train(*args):
    p = subprocess.run(
        [str(TRAINBOOK), "train", *args, "--runs-root", RUNS, "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def accumulator(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_equal_the_runs_metrics_step_for_step_and_the_options_are_text():
    r = train("bert", "--preset", "tiny", "--workers", "2", "--train-rows", "128", "--eval-rows", "64",
              "--epochs", "2", "--schedule", "linear", "--lr", "1e-3")
    run = Path(r["run_dir"])
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    acc = accumulator(run)
    rows = pl.read_parquet(run / "metrics.parquet").filter(pl.col("rank") == 0)
    names = set(rows["name"].to_list())
    assert {"loss", "lr", "eval_loss", "eval_accuracy", "samples_per_second"} <= names, names
    for name in names:
        tag = TAGS.get(name, ("eval/" + name[5:]) if name.startswith("eval_") else None)
        if tag is None:
            continue
        mine = rows.filter(pl.col("name") == name).sort("step")
        theirs = acc.Scalars(tag)
        assert [e.step for e in theirs] == mine["step"].to_list(), (name, tag)
        for e, v in zip(theirs, mine["value"].to_list()):
            assert e.value == np.float32(v) or (math.isnan(e.value) and math.isnan(v)), (name, e, v)
    # The resolved options, in the Text tab.
    text = acc.Tensors("options/text_summary") if "options/text_summary" in acc.Tags()["tensors"] else acc.Tensors("options")
    body = text[0].tensor_proto.string_val[0].decode()
    assert '"lr": 0.001' in body and '"schedule": "linear"' in body, body[:2000]


def test_a_live_reader_sees_the_steps_grow_and_no_tensorboard_writes_none():
    cli = subprocess.Popen(
        [str(TRAINBOOK), "train", "synthetic", "--preset", "tiny", "--workers", "2", "--epochs", "100000",
         "--max-steps", "1000000", "--runs-root", RUNS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        run = None
        seen = []
        deadline = time.monotonic() + 120
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(1)
            if run is None:
                started = sorted(Path(RUNS).glob("synthetic-*/events.out.tfevents.*"))
                run = started[-1].parent if started else None
                continue
            acc = accumulator(run)
            if "train/loss" in acc.Tags()["scalars"]:
                last = acc.Scalars("train/loss")[-1].step
                if not seen or last > seen[-1]:
                    seen.append(last)
        assert len(seen) >= 3, f"the reader saw steps {seen} while the job ran"
    finally:
        cli.send_signal(signal.SIGINT)
        cli.communicate(timeout=60)
    r = train("synthetic", "--preset", "tiny", "--workers", "1", "--max-steps", "5", "--no-tensorboard")
    assert not list(Path(r["run_dir"]).glob("*tfevents*"))


def test_a_sweeps_trials_compare_in_tensorboards_hparams_tab():
    """The trials of a sweep are HParams sessions: a real `tensorboard` server's hparams plugin
    lists one session per trial with the trial's options and the run's metrics."""
    p = subprocess.run(
        [str(TRAINBOOK), "sweep", "synthetic", "--preset", "tiny", "--workers", "1", "--max-steps", "4",
         "--grid", "lr=0.001,0.01", "--runs-root", RUNS, "--name", "hp-sweep", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    sweep_dir = Path(RUNS) / "hp-sweep"
    trials = sorted(d for d in sweep_dir.iterdir() if list(d.glob("events.out.tfevents.*")))
    assert len(trials) == 2, list(sweep_dir.iterdir())
    # Each file: a session start with the options, a session end with the outcome.
    for t in trials:
        content = accumulator(t).PluginTagToContent("hparams")
        start = hp_metadata.parse_session_start_info_plugin_data(content["_hparams_/session_start_info"])
        end = hp_metadata.parse_session_end_info_plugin_data(content["_hparams_/session_end_info"])
        assert start.hparams["recipe"].string_value == "synthetic" and start.hparams["workers"].number_value == 1
        assert end.status == hp_api.STATUS_SUCCESS
    # TensorBoard itself, as a user opens it.
    port = free_port()
    server = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "tensorboard"), "--logdir", str(sweep_dir), "--port", str(port),
         "--host", "127.0.0.1", "--load_fast=false", "--reload_interval=1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        groups = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                groups = post_json(f"http://127.0.0.1:{port}/data/plugin/hparams/session_groups",
                                   {"startIndex": 0, "sliceSize": 100, "allowedStatuses": [
                                       "STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
                                    "colParams": []})
            except OSError:
                continue
            if len(groups.get("sessionGroups", [])) == 2:
                break
        assert groups and len(groups["sessionGroups"]) == 2, groups
        lrs = sorted(g["hparams"]["lr"] for g in groups["sessionGroups"])
        assert lrs == [0.001, 0.01], groups
        experiment = post_json(f"http://127.0.0.1:{port}/data/plugin/hparams/experiment", {"experimentName": ""})
        metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert {"train/loss", "eval/loss"} <= metrics, metrics
    finally:
        server.terminate()
        server.communicate(timeout=30)


def post_json(url, body):
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())
