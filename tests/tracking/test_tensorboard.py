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
# The options the first test's job sets on the command line (--workers is not an option).
SET_OPTIONS = ["preset", "train_rows", "eval_rows", "epochs", "schedule", "lr"]


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
    # HParams: the options this job sets are the columns (not the 30-odd it resolves), the
    # evaluation metrics and the training loss the metric columns, named as its scalars.
    content = acc.PluginTagToContent("hparams")
    experiment = hp_metadata.parse_experiment_plugin_data(content["_hparams_/experiment"])
    start = hp_metadata.parse_session_start_info_plugin_data(content["_hparams_/session_start_info"])
    columns = [h.name for h in experiment.hparam_infos]
    assert sorted(columns) == sorted(SET_OPTIONS), columns
    assert sorted(start.hparams) == sorted(SET_OPTIONS), dict(start.hparams)
    assert start.hparams["lr"].number_value == 0.001 and start.hparams["schedule"].string_value == "linear"
    assert start.hparams["preset"].string_value == "tiny" and start.hparams["epochs"].number_value == 2
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics[0] == "eval/loss" and metrics[-1] == "train/loss", metrics
    assert {"eval/loss", "eval/accuracy", "train/loss"} <= set(metrics), metrics
    assert set(metrics) <= set(acc.Tags()["scalars"]), (metrics, acc.Tags()["scalars"])
    assert all(m.name.group == "" for m in experiment.metric_infos)


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
    """The trials of a sweep are HParams sessions of one experiment: a real `tensorboard`
    server's hparams plugin shows the swept options as the hyper-parameter columns (not the
    30-odd options each trial resolves), the evaluation metrics and the training loss as the
    metric columns, and one row per trial with its values in both."""
    p = subprocess.run(
        [str(TRAINBOOK), "sweep", "synthetic", "--preset", "tiny", "--workers", "1", "--max-steps", "4",
         "--grid", "lr=0.001,0.01", "--choice", "optimizer=sgd,adamw", "--runs-root", RUNS,
         "--name", "hp-sweep", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    sweep_dir = Path(RUNS) / "hp-sweep"
    trials = sorted(d for d in sweep_dir.iterdir() if list(d.glob("events.out.tfevents.*")))
    assert len(trials) == 2, list(sweep_dir.iterdir())
    # Each file: the experiment (the same in every trial), a session start with the trial's
    # values of the swept options, a session end with the outcome.
    declared, lrs = [], []
    for t in trials:
        content = accumulator(t).PluginTagToContent("hparams")
        experiment = hp_metadata.parse_experiment_plugin_data(content["_hparams_/experiment"])
        start = hp_metadata.parse_session_start_info_plugin_data(content["_hparams_/session_start_info"])
        end = hp_metadata.parse_session_end_info_plugin_data(content["_hparams_/session_end_info"])
        experiment.ClearField("time_created_secs")  # each trial's own start
        declared.append(experiment.SerializeToString(deterministic=True))
        assert [h.name for h in experiment.hparam_infos] == ["lr", "optimizer"], experiment
        assert sorted(start.hparams) == ["lr", "optimizer"], dict(start.hparams)
        assert start.hparams["optimizer"].string_value in ("sgd", "adamw")
        lrs.append(start.hparams["lr"].number_value)
        assert end.status == hp_api.STATUS_SUCCESS
    assert sorted(lrs) == [0.001, 0.01]
    assert all(d == declared[0] for d in declared)
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
        # What the HParams tab asks for: the experiment's columns.
        served = post_json(f"http://127.0.0.1:{port}/data/plugin/hparams/experiment",
                           {"experimentName": "", "hparamsLimit": 1000})
        assert [h["name"] for h in served["hparamInfos"]] == ["lr", "optimizer"], served
        lr = served["hparamInfos"][0]
        assert lr["type"] == "DATA_TYPE_FLOAT64" and lr["differs"], lr
        assert sorted(lr["domainDiscrete"]) == [0.001, 0.01], lr
        assert served["hparamInfos"][1]["type"] == "DATA_TYPE_STRING"
        metrics = [m["name"]["tag"] for m in served["metricInfos"]]
        # The sweep's metric (eval_loss) first, the training loss last.
        assert metrics[0] == "eval/loss" and metrics[-1] == "train/loss", metrics
        assert metrics == [m.name.tag for m in experiment.metric_infos]
        assert not [m for m in metrics if m.startswith("throughput/")], metrics
        # One row per trial: its swept values and a value in every metric column.
        for g in groups["sessionGroups"]:
            assert sorted(g["hparams"]) == ["lr", "optimizer"], g
            values = {v["name"]["tag"]: v["value"] for v in g["metricValues"]}
            assert set(values) == set(metrics), (values, metrics)
            assert all(isinstance(v, float) or isinstance(v, int) for v in values.values()), values
        assert sorted(g["hparams"]["lr"] for g in groups["sessionGroups"]) == [0.001, 0.01], groups
    finally:
        server.terminate()
        server.communicate(timeout=30)


def post_json(url, body):
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())
