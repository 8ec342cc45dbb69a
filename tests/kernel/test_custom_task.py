"""A training task defined in notebook cells, trained by exec'd workers that run the cell's own
compiled code (trainbook-cell-worker loading the cell library). Driven through a real Jupyter
client, like test_kernel.py."""

import math
import tempfile

import pytest

from test_kernel import cmdline, descendants, error_of, kernel, kernel_pid, run, stream_text, wait_until  # noqa: F401 (kernel: the fixture)

RUNS = tempfile.mkdtemp(prefix="tb-task-runs-")

# A small network on the offline MNIST digits; `version` is logged by setup so a test can tell
# which definition ran; `fail_on` makes one rank's step fail.
TASK = r"""
use trainbook_torch::custom::*;

#[derive(Serialize, Deserialize)]
#[serde(crate = "trainbook_torch::custom::serde")]
struct Digits { hidden: i64, fail_on: Option<usize>, panic: bool }

struct Net { net: nn::Sequential, rank: usize, x: Tensor, y: Tensor, vx: Tensor, vy: Tensor }

fn grey(images: &Tensor) -> Tensor { images.select(1, 0).flatten(1, -1) }

impl Task for Digits {
    type State = Net;
    fn setup(&self, vars: &nn::Path, setup: &Setup) -> Result<Net> {
        setup.log(format!("task version VERSION on rank {}", setup.rank));
        let (x, y, _) = image_tensors(&digits_dir().join("train"))?;
        let (vx, vy, _) = image_tensors(&digits_dir().join("val"))?;
        let net = nn::seq()
            .add(nn::linear(vars / "fc1", 784, self.hidden, Default::default()))
            .add_fn(|t| t.relu())
            .add(nn::linear(vars / "fc2", self.hidden, 10, Default::default()));
        Ok(Net { net, rank: setup.rank, x: grey(&x), y, vx: grey(&vx).narrow(0, 0, 200), vy: vy.narrow(0, 0, 200) })
    }
    fn len(&self, s: &Net, split: Split) -> usize {
        if split == Split::Train { s.y.size()[0] as usize } else { s.vy.size()[0] as usize }
    }
    fn step(&self, s: &Net, batch: &Batch) -> Result<Step> {
        if self.fail_on == Some(s.rank) {
            if self.panic { panic!("the digits step gave up on rank {}", s.rank); }
            bail!("no batch for rank {}", s.rank);
        }
        let (x, y) = if batch.split == Split::Train { (&s.x, &s.y) } else { (&s.vx, &s.vy) };
        let idx = Tensor::from_slice(&batch.indices.iter().map(|&i| i as i64).collect::<Vec<_>>());
        let logits = s.net.forward(&x.index_select(0, &idx));
        let y = y.index_select(0, &idx);
        let margin = logits.max_dim(-1, false).0.mean(Kind::Float).double_value(&[]);
        Ok(Step::classification(logits, y).metric("margin", margin))
    }
}
"""


def fit(workers, batch, extra=""):
    return (
        f"let r = Trainer::new(Digits {{ hidden: 32, fail_on: None, panic: false }})"
        f'.workers({workers}).global_batch_size({batch}).max_steps(20).optimizer(OptimizerKind::Sgd)'
        f'.lr(0.1).runs_root("{RUNS}").show_plot(false){extra}.fit()?;'
    )


# The kernels (by client) in which a version of TASK is defined: a test that needs the task but
# not a particular version defines it only where no earlier test of the module did, so that it
# also runs alone (`-k`).
TASK_DEFINED = set()


def define_task(kc, version):
    ok(kc, TASK.replace("VERSION", str(version)))
    TASK_DEFINED.add(id(kc))


def ensure_task(kc):
    if id(kc) not in TASK_DEFINED:
        define_task(kc, 1)


def ok(kc, code, timeout=240):
    reply, msgs = run(kc, code, timeout=timeout)
    assert reply["status"] == "ok", (error_of(msgs), stream_text(msgs))
    return msgs


def value(kc, expr):
    msgs = ok(kc, f'println!("{{:?}}", {expr});')
    return stream_text(msgs).strip().splitlines()[-1]


def test_a_cell_defined_task_trains_on_two_workers_like_one(kernel):
    km, kc = kernel
    define_task(kc, 1)
    # 2 workers x 16 samples vs 1 worker x 32, 20 SGD steps: the same parameters.
    ok(kc, fit(2, 32))
    ok(kc, "let two = (r.param_sum, r.param_l2, r.steps, r.metrics.clone());")
    ok(kc, fit(1, 32))
    ok(kc, "let one = (r.param_sum, r.param_l2, r.steps);")
    two = [float(v) for v in value(kc, "(two.0, two.1, two.2)").strip("()").split(",")]
    one = [float(v) for v in value(kc, "one").strip("()").split(",")]
    assert two[2] == one[2] == 20
    assert math.isclose(two[0], one[0], rel_tol=1e-5, abs_tol=1e-5), (two, one)
    assert math.isclose(two[1], one[1], rel_tol=1e-5), (two, one)
    # The task's own metric and the ready-made scores reach the result and the metrics table.
    names = value(kc, "two.3.keys().collect::<Vec<_>>()")
    for name in ("eval_margin", "epoch_train_margin", "eval_accuracy", "eval_f1_macro"):
        assert f'"{name}"' in names, names
    rows = value(kc, 'r.metric_rows.iter().filter(|m| m.name == "margin").count()')
    assert int(rows) == 20
    # No worker outlives its job.
    assert not [p for p in descendants(kernel_pid(km)) if "worker" in cmdline(p)]


def test_a_cell_defined_task_under_zero3_trains_like_plain_data_parallelism(kernel):
    km, kc = kernel
    ensure_task(kc)
    # Its layers have no numbered path, so the whole model is ZeRO-3's root: gathered for each
    # step, sharded between steps, and the same parameters as plain data parallelism.
    ok(kc, fit(2, 32))
    ok(kc, "let plain = (r.param_sum, r.param_l2, r.memory[0].parameters);")
    ok(kc, fit(2, 32, ".zero(3)"))
    plain = [float(v) for v in value(kc, "plain").strip("()").split(",")]
    sharded = [float(v) for v in value(kc, "(r.param_sum, r.param_l2, r.memory[0].parameters)").strip("()").split(",")]
    assert math.isclose(sharded[0], plain[0], rel_tol=1e-5, abs_tol=1e-5), (sharded, plain)
    assert math.isclose(sharded[1], plain[1], rel_tol=1e-5), (sharded, plain)
    assert abs(sharded[2] / plain[2] - 0.5) < 0.01, (sharded, plain)


def test_f1_equals_one_computed_from_the_checkpoints_predictions(kernel):
    km, kc = kernel
    ok(kc, fit(2, 32))
    # The trained model, loaded from the checkpoint in the cell, predicts the eval split; F1
    # computed from those predictions equals the job's all-reduced eval_f1_macro.
    ok(
        kc,
        "let (predicted, truth): (Vec<i64>, Vec<i64>) = {\n"
        "    let task = Digits { hidden: 32, fail_on: None, panic: false };\n"
        "    let (_vs, net) = trainbook_torch::custom::load(&task, r.last_checkpoint.as_ref().unwrap())?;\n"
        "    let logits = tch::no_grad(|| net.net.forward(&net.vx));\n"
        "    (Vec::<i64>::try_from(logits.argmax(-1, false))?, Vec::<i64>::try_from(&net.vy)?)\n"
        "};",
    )
    predicted = [int(v) for v in value(kc, "predicted").strip("[]").split(",")]
    truth = [int(v) for v in value(kc, "truth").strip("[]").split(",")]
    f1s = []
    for c in range(10):
        tp = sum(p == c and t == c for p, t in zip(predicted, truth))
        fp = sum(p == c and t != c for p, t in zip(predicted, truth))
        fn = sum(p != c and t == c for p, t in zip(predicted, truth))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    reported = float(value(kc, 'r.metrics["eval_f1_macro"]'))
    assert math.isclose(reported, sum(f1s) / 10, abs_tol=1e-9), (reported, f1s)


def test_redefining_the_task_runs_the_new_code(kernel):
    km, kc = kernel
    define_task(kc, 2)
    ok(kc, fit(2, 32))
    log = value(kc, 'std::fs::read_to_string(r.run_dir.join("logs/rank0.log"))?.contains("task version 2")')
    assert log == "true"


@pytest.mark.parametrize("panic", [False, True])
def test_a_failing_step_on_rank_1_fails_the_job_with_rank_message_and_place(kernel, panic):
    km, kc = kernel
    ensure_task(kc)
    ok(kc, "let kept = 20;")
    code = fit(2, 32).replace("fail_on: None, panic: false", f"fail_on: Some(1), panic: {str(panic).lower()}")
    t0 = __import__("time").monotonic()
    reply, msgs = run(kc, code, timeout=120)
    elapsed = __import__("time").monotonic() - t0
    assert reply["status"] == "error"
    text = str(error_of(msgs)) + stream_text(msgs)
    assert "rank 1" in text, text
    if panic:
        assert "the digits step gave up on rank 1" in text and "panicked at src/lib.rs:" in text, text
        assert "panic!(" in text, text  # the cell's own line of code
    else:
        assert "no batch for rank 1" in text, text
    # It fails fast, not at the 300 s collective timeout (the bound leaves room for compiling
    # the cell and starting two workers on a loaded machine).
    assert elapsed < 60, elapsed
    assert wait_until(
        lambda: not [p for p in descendants(kernel_pid(km)) if "worker" in cmdline(p)],
        5,
    )
    # The kernel keeps its variables (one defined before the failed cell).
    assert value(kc, "kept") == "20"


def test_a_task_of_a_deleted_cell_library_is_a_clear_error(kernel):
    km, kc = kernel
    # What a worker does when the library it is sent to is gone (the kernel that compiled it
    # was shut down, or its build directory removed).
    ok(kc, "let spec = Trainer::new(Digits { hidden: 8, fail_on: None, panic: false }).into_spec();")
    path = value(kc, 'spec.options["task"]["entry"]["file"].as_str().unwrap()').strip('"')
    import os
    import shutil

    shutil.copy(path, path + ".kept")
    os.remove(path)
    try:
        reply, msgs = run(kc, f'let r = fit(spec.runs_root("{RUNS}"))?;', timeout=120)
    finally:
        shutil.move(path + ".kept", path)
    assert reply["status"] == "error"
    text = str(error_of(msgs)) + stream_text(msgs)
    assert "is gone" in text and "Run the cell that defines the task again" in text, text


# A task whose step fails at its 7th training step on rank 0, every time: a deterministic
# error, which a restart does not fix.
FLAKY = r"""
use trainbook_torch::custom::*;
use std::cell::Cell;

#[derive(Serialize, Deserialize)]
#[serde(crate = "trainbook_torch::custom::serde")]
struct Flaky { hidden: i64 }

struct FlakyNet { net: nn::Linear, rank: usize, steps: Cell<u64> }

impl Task for Flaky {
    type State = FlakyNet;
    fn setup(&self, vars: &nn::Path, setup: &Setup) -> Result<FlakyNet> {
        Ok(FlakyNet { net: nn::linear(vars / "fc", 4, 2, Default::default()), rank: setup.rank, steps: Cell::new(0) })
    }
    fn len(&self, _: &FlakyNet, _: Split) -> usize { 256 }
    fn step(&self, s: &FlakyNet, batch: &Batch) -> Result<Step> {
        if batch.split == Split::Train {
            s.steps.set(s.steps.get() + 1);
            if s.rank == 0 && s.steps.get() == 7 {
                bail!("batch 7 cannot be read");
            }
        }
        let x = Tensor::ones([batch.indices.len() as i64, 4], (Kind::Float, tch::Device::Cpu));
        let y = Tensor::zeros([batch.indices.len() as i64], (Kind::Int64, tch::Device::Cpu));
        Ok(Step::classification(s.net.forward(&x), y))
    }
}
"""


def test_a_task_that_fails_at_the_same_step_is_retried_once_not_three_times(kernel):
    km, kc = kernel
    ok(kc, FLAKY)
    code = (
        f'let flaky = Trainer::new(Flaky {{ hidden: 4 }}).workers(2).global_batch_size(8).max_steps(20)'
        f'.max_failures(3).runs_root("{RUNS}").show_plot(false);\n'
        "let job = flaky.launch()?;\n"
        'let err = job.wait().err().map(|e| format!("{e:#}"));'
    )
    ok(kc, code)
    err = value(kc, "err")
    assert "batch 7 cannot be read" in err, err
    assert "the same error at step 7" in err, err
    assert "restart 1/3" in err, err
    assert value(kc, "job.result()?.restarts.len()") == "1"


def test_a_sweep_over_a_cell_defined_task_sets_its_fields_and_prunes(kernel):
    km, kc = kernel
    define_task(kc, 3)
    # `hidden` is the task's own field, `lr` a training option: both swept by name.
    ok(
        kc,
        "let result = Sweep::new(Trainer::new(Digits { hidden: 32, fail_on: None, panic: false })"
        f'.workers(1).global_batch_size(32).epochs(2).optimizer(OptimizerKind::Sgd).runs_root("{RUNS}"))'
        '.grid("hidden", [4, 64]).grid("lr", [0.1, 1e-4]).metric("eval_accuracy", Goal::Max)'
        ".concurrent(2).scheduler(Asha::default().grace_period(1).reduction_factor(2.0)).fit()?;",
        timeout=300,
    )
    statuses = value(kc, "result.trials.iter().map(|t| t.status.name()).collect::<Vec<_>>()")
    assert statuses.count('"succeeded"') >= 1 and statuses.count('"pruned"') >= 1, statuses
    best = value(kc, "result.best_trial()?.params_text()")
    # A learning rate of 1e-4 barely moves a random network in 2 epochs: the best trains at 0.1.
    assert "lr=0.1" in best, best
    config = value(
        kc,
        'std::fs::read_to_string(result.best_trial()?.run_dir.as_ref().unwrap().join("config.json"))?',
    )
    shown = value(kc, "result.best_trial()?.params[0].1.to_string()").strip('"')
    assert f'\\"hidden\\":{shown}' in config.replace(" ", ""), config[:2000]
    acc = float(value(kc, 'result.best()?.metrics["eval_accuracy"]'))
    assert acc > 0.5, acc
    assert not [p for p in descendants(kernel_pid(km)) if "worker" in cmdline(p)]
    # A field the task does not have fails before anything starts, naming the task's fields.
    reply, msgs = run(
        kc,
        "Sweep::new(Trainer::new(Digits { hidden: 32, fail_on: None, panic: false })).grid(\"hiden\", [8]).fit()?;",
    )
    assert reply["status"] == "error"
    err = error_of(msgs)["evalue"]
    assert "no option 'hiden'. The task's fields: fail_on, hidden, panic" in err, err
