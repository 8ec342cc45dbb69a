"""trainbook's real HPU code path, end to end, against the stand-in Gaudi bridge (tests/hpu).

The `trainbook` CLI and its workers run exactly as in the Gaudi container: each worker embeds the
Python whose torch trainbook links, imports habana_frameworks (here the stand-in, found through
PYTHONPATH), places model, batches and optimizer state on the HPU device through the engine's C++
helpers, and all-reduces gradients through the hccl backend attached to its c10d process group.
What only a Gaudi machine can confirm is listed in docs/gaudi.md.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from compare_checkpoints import max_abs_diff, read_f32  # noqa: E402
TRAINBOOK = ROOT / "target" / "release" / "trainbook"


def trainbook(env, *args, extra=None, drop=(), timeout=600):
    e = {**env, **(extra or {})}
    for k in drop:
        e.pop(k, None)
    return subprocess.run(
        [str(TRAINBOOK), *args], env=e, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def hpu(env, tmp_path_factory):
    if not TRAINBOOK.exists():
        pytest.fail(f"{TRAINBOOK} is missing: run `make build`")
    runs = tmp_path_factory.mktemp("runs")
    return {**env, "TRAINBOOK_RUNS": str(runs)}


def summary(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def error_lines(proc):
    return [l for l in proc.stderr.splitlines() if l.startswith("error:")]


SGD = ["--preset", "tiny", "--optimizer", "sgd", "--dropout", "0", "--workers", "2", "--json"]
SGD_20 = SGD + ["--max-steps", "20"]


def test_bert_trains_on_two_hpus_through_hccl(hpu):
    s = summary(trainbook(hpu, "train", "bert", "--device", "hpu", "--workers", "2",
                          "--preset", "tiny", "--json"))
    assert s["device"] == "hpu" and s["status"] == "succeeded", s
    assert s["steps"] > 0 and s["final_train_loss"] > 0, s
    log = (Path(s["run_dir"]) / "logs" / "rank1.log").read_text()
    # Each worker acquired its own module (HLS_MODULE_ID from LOCAL_RANK, set by the bridge).
    assert "module_id: 1" in log, log[-2000:]


def test_resnet_trains_on_hpu_with_every_tensor_on_the_device(hpu):
    # The stand-in refuses an operator that mixes HPU and CPU tensors, as a Gaudi does, so this
    # also pins that convolutions, batch-norm buffers and the batches all live on the HPU.
    s = summary(trainbook(hpu, "train", "resnet", "--device", "hpu", "--workers", "2",
                          "--preset", "tiny", "--max-steps", "4", "--json"))
    assert s["device"] == "hpu" and s["status"] == "succeeded" and s["steps"] == 4, s


def test_hpu_equals_cpu_after_20_sgd_steps_and_its_checkpoint_resumes_on_cpu(hpu):
    on_hpu = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", *SGD_20))
    on_cpu = summary(trainbook(hpu, "train", "synthetic", "--device", "cpu", *SGD_20))
    assert on_hpu["steps"] == on_cpu["steps"] == 20
    # The HPU checkpoint is read on the CPU by a program that has never seen an HPU.
    a, b = read_f32(on_hpu["last_checkpoint"]), read_f32(on_cpu["last_checkpoint"])
    assert len(a) > 10
    worst = max_abs_diff(a, b)
    assert worst <= 1e-5, f"HPU and CPU parameters differ by {worst}"
    # The checkpoint written from HPU (CPU copies) continues on a machine without HPUs.
    resumed = summary(trainbook(hpu, "train", "synthetic", "--device", "cpu", *SGD,
                                "--max-steps", "25", "--resume-from", on_hpu["last_checkpoint"]))
    assert resumed["device"] == "cpu" and resumed["steps"] == 25, resumed


def test_zero1_on_hpu_reduce_scatters_through_hccl_and_equals_ddp(hpu):
    # ZeRO-1's reduce-scatter and all-gather of HPU buckets go through the hccl backend's c10d
    # kernels; AdamW with weight decay and clipping exercises the sharded update. On HPU both
    # runs step through the bridge's hpu::optimizer_adamw (the stand-in counts the calls), whose
    # eps enters before bias correction: compared with CPU's AdamW it differs in the first steps
    # (docs/gaudi.md), so ZeRO-1 is compared with DDP on the same device.
    adamw = ["--preset", "tiny", "--optimizer", "adamw", "--weight-decay", "0.01",
             "--grad-clip", "1.0", "--dropout", "0", "--workers", "2", "--max-steps", "20",
             "--json"]
    counts = {"TRAINBOOK_STANDIN_OP_COUNTS": "1"}
    zero = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", "--zero", "1", *adamw,
                             extra=counts))
    ddp = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", *adamw, extra=counts))
    assert zero["device"] == "hpu" and zero["steps"] == ddp["steps"] == 20, zero
    worst = max_abs_diff(read_f32(zero["last_checkpoint"]), read_f32(ddp["last_checkpoint"]))
    assert worst <= 1e-5, f"ZeRO-1 and DDP on HPU differ by {worst}"
    for run in (zero, ddp):
        log = (Path(run["run_dir"]) / "logs" / "rank0.log").read_text()
        # Two calls a step: the tensors that decay and those that do not.
        assert "op calls: hpu::optimizer_adamw=40 " in log, log[-1500:]


def zero1_and_recomputed(hpu, stage):
    """10 AdamW steps (dropout 0.1) under ZeRO-1, and under `stage` with every layer recomputed,
    on 2 HPUs: their summaries, once their parameters are checked equal."""
    adamw = ["--preset", "tiny", "--optimizer", "adamw", "--weight-decay", "0.01",
             "--dropout", "0.1", "--workers", "2", "--max-steps", "10", "--json"]
    plain = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", "--zero", "1",
                              *adamw))
    other = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", "--zero", stage,
                              "--activation-checkpointing", *adamw))
    assert other["device"] == "hpu" and other["steps"] == plain["steps"] == 10, other
    worst = max_abs_diff(read_f32(other["last_checkpoint"]), read_f32(plain["last_checkpoint"]))
    assert worst <= 1e-5, f"ZeRO-{stage} with checkpointing and ZeRO-1 on HPU differ by {worst}"
    return plain, other


def test_zero2_and_activation_checkpointing_on_hpu_equal_zero1(hpu):
    # ZeRO-2's gradient hooks reduce-scatter HPU buckets during the backward pass, and the
    # checkpointed layers are recomputed on the HPU with the random state of their first
    # forward pass (dropout 0.1): the same parameters as ZeRO-1 without recomputation.
    plain, levers = zero1_and_recomputed(hpu, "2")
    assert all(m["gradients"] == 0 for m in levers["memory"]), levers["memory"]


def test_zero3_on_hpu_equals_zero1(hpu):
    # ZeRO-3's unit buffers are freed and allocated again on the HPU (the bridge's allocator),
    # all-gathered around each layer's forward and backward over HCCL, with every layer
    # recomputed: the same parameters as ZeRO-1, 1/2 of them on each rank between steps.
    plain, sharded = zero1_and_recomputed(hpu, "3")
    whole = plain["memory"][0]["parameters"]
    for m in sharded["memory"]:
        assert abs(m["parameters"] / whole - 0.5) < 0.01 and m["gradients"] == 0, sharded["memory"]


def test_sgd_with_momentum_on_hpu_steps_through_the_bridges_fused_op(hpu):
    s = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", *SGD, "--max-steps", "5",
                          "--momentum", "0.9", extra={"TRAINBOOK_STANDIN_OP_COUNTS": "1"}))
    log = (Path(s["run_dir"]) / "logs" / "rank1.log").read_text()
    assert "hpu::optimizer_sgd=0 hpu::optimizer_sgd_momentum=10" in log, log[-1500:]


def test_the_collectives_check_runs_on_hpu_tensors(hpu):
    p = trainbook(hpu, "check", "--workers", "2", "--device", "hpu")
    assert p.returncode == 0, p.stdout + p.stderr
    # check.rs verifies inside each worker that every tensor it reduces is on the HPU.
    assert "collectives ok on hpu:0 tensors" in p.stdout + p.stderr


def test_bf16_autocast_on_hpu(hpu):
    s = summary(trainbook(hpu, "train", "synthetic", "--device", "hpu", "--preset", "tiny",
                          "--precision", "bf16", "--max-steps", "8", "--workers", "2", "--json"))
    assert s["status"] == "succeeded" and s["steps"] == 8, s


def hpu_workers_of(parent):
    """(pid, environment entries) of the HPU workers `parent` started, read from /proc."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PPid:\t{parent}\n" in status and b"TRAINBOOK_DEVICE=hpu" in environ:
            yield int(pid), environ


def test_killing_an_hpu_worker_fails_the_job_naming_its_rank(hpu):
    cli = subprocess.Popen(
        [str(TRAINBOOK), "train", "synthetic", "--device", "hpu", "--workers", "2",
         "--preset", "tiny", "--epochs", "200"],
        env=hpu, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        victim = None
        deadline = time.time() + 120
        while victim is None and time.time() < deadline:
            for pid, environ in hpu_workers_of(cli.pid):
                if b"RANK=1" in environ:
                    victim = pid
            time.sleep(0.2)
        assert victim is not None, "no rank-1 worker appeared"
        time.sleep(4)  # past the bridge import and into training
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode != 0
    # The stand-in's collectives, like HCCL's, never time out (rank 0 waits forever on its dead
    # peer): the driver's own stop (SIGTERM, then SIGKILL 2 s later) ends the job.
    assert time.time() - t0 < 20
    assert "rank 1" in err and "SIGKILL" in err, err[-3000:]


def test_auto_picks_hpu_when_the_bridge_loads_and_cpu_with_one_warning_when_not(hpu):
    s = summary(trainbook(hpu, "train", "synthetic", "--preset", "tiny", "--max-steps", "2",
                          "--workers", "2", "--json"))
    assert s["device"] == "hpu", s
    p = trainbook(hpu, "train", "synthetic", "--preset", "tiny", "--max-steps", "2",
                  "--workers", "2", "--json", extra={"PT_HPU_LAZY_MODE": "1"})
    s = summary(p)
    assert s["device"] == "cpu", s
    warnings = [l for l in p.stderr.splitlines() if l.startswith("warning: the Intel Gaudi")]
    assert len(warnings) == 1, p.stderr
    assert "Lazy mode" in warnings[0] and "hpu" in warnings[0], warnings


@pytest.mark.parametrize(
    "case, extra, drop, needles",
    [
        ("no bridge", {}, ("PYTHONPATH",), ["habana_frameworks", "--device cpu"]),
        ("lazy-mode mismatch", {"PT_HPU_LAZY_MODE": "1"}, (), ["Lazy mode", "PT_HPU_LAZY_MODE"]),
        ("no free module", {"TRAINBOOK_STANDIN_HPU_BUSY": "1"}, (), ["Device acquire failed"]),
        ("too few modules", {"TRAINBOOK_STANDIN_HPU_COUNT": "1"}, (), ["--workers 1"]),
    ],
)
def test_hpu_requested_but_unusable_is_one_clear_error(hpu, case, extra, drop, needles):
    p = trainbook(hpu, "train", "synthetic", "--device", "hpu", "--workers", "2",
                  "--preset", "tiny", extra=extra, drop=drop, timeout=300)
    assert p.returncode != 0, case
    errors = error_lines(p)
    assert len(errors) == 1, (case, p.stderr[-3000:])
    for n in needles:
        assert n in errors[0], (case, errors[0])


def test_the_torch_pair_check_names_both_libraries():
    """bridge.py refuses a Python whose torch loaded a second libtorch (a torch that does not
    pair with the one trainbook links): HPU would be registered in the wrong one. Faked here
    (two libtorch files cannot be loaded on this machine without a second torch install)."""
    code = f"""
import sys, types
for name in ["habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.core"]:
    sys.modules[name] = types.ModuleType(name)
sys.modules["torch"] = types.SimpleNamespace(__version__="2.6.0")
src = open({str(ROOT / 'prelude/hpu/src/bridge.py')!r}).read()
bridge = types.ModuleType("bridge"); exec(src, bridge.__dict__)
bridge._loaded_libtorch = lambda: ["/a/libtorch_cpu.so", "/b/libtorch_cpu.so"]
try:
    bridge.load()
except RuntimeError as e:
    print(e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "torch pair mismatch" in p.stdout, p.stdout + p.stderr
    assert "/a/libtorch_cpu.so" in p.stdout and "/b/libtorch_cpu.so" in p.stdout


def test_the_bert_notebook_trains_on_hpu_headless(hpu, tmp_path):
    """notebooks/bert.ipynb as a Gaudi user runs it: `auto` resolves to HPU, the training cell
    turns on bf16, the workers all-reduce through hccl, the dashboard ends in success."""
    import nbformat

    out = tmp_path / "bert.ipynb"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "notebook.py"), "execute",
         str(ROOT / "notebooks" / "bert.ipynb"), str(out), "--timeout", "600",
         "-p", "preset", "tiny", "-p", "epochs", "1", "-p", "runs_root", str(tmp_path / "runs")],
        env=hpu, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "")
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "2 workers on hpu, collectives: Hccl" in text, text[-3000:]
    config = next((tmp_path / "runs").glob("*/config.json")).read_text()
    assert '"precision": "bf16"' in config, config
    assert "succeeded" in text, text[-3000:]


def test_a_sweep_gives_concurrent_trials_disjoint_hpus(hpu):
    """Two trials at a time on a machine of two HPUs: each trial's worker sees its own module
    through HABANA_VISIBLE_MODULES (read from /proc while they run), never the other's."""
    env = {**hpu, "TRAINBOOK_STANDIN_HPU_COUNT": "2"}
    cli = subprocess.Popen(
        [str(TRAINBOOK), "sweep", "synthetic", "--device", "hpu", "--workers", "1",
         "--preset", "tiny", "--epochs", "2", "--grid", "lr=0.01,0.02,0.03",
         "--metric", "loss:min", "--concurrent", "4", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen = []  # for each poll, the modules of the trial workers alive
    while cli.poll() is None:
        modules = []
        for _, environ in hpu_workers_of(cli.pid):
            vis = [v for v in environ if v.startswith(b"HABANA_VISIBLE_MODULES=")]
            modules.append(vis[0].split(b"=")[1].decode() if vis else None)
        if modules:
            seen.append(sorted(modules, key=str))
        time.sleep(0.05)
    out, err = cli.communicate(timeout=60)
    assert cli.returncode == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert [t["status"] for t in r["trials"]] == ["succeeded"] * 3, r
    assert ["0", "1"] in seen, seen  # two trials at once, one module each
    assert all(len(set(m)) == len(m) and None not in m for m in seen), seen
    assert all(len(m) <= 2 for m in seen), "more trials than HPUs at once"
    assert "2 at a time (4 asked; 2 hpu devices, 1 per trial)" in err, err[-2000:]


def test_gaudi_check_reports_what_the_bridge_and_trainbook_must_agree_on(hpu, tmp_path):
    """`scripts/gaudi-check.sh --env-only` against the stand-in: torch's version and C++ ABI, its
    pybind11 internals tag, the torch the bridge was built for (its required_version.txt) and
    the lazy-mode setting; a bridge built for another torch is called out."""
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gaudi-check.sh"), "--env-only"],
                       env={**hpu, "PT_HPU_LAZY_MODE": "0"}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    # The venv's torch (the one the hpu build embeds), read without importing it.
    version = (ROOT / ".libtorch" / "build-version").read_text().strip()
    assert f"torch: {version}" in out, out
    assert "_GLIBCXX_USE_CXX11_ABI: 1" in out, out
    # torch 2.13 no longer exports pybind11's tag; older ones print compiler, stdlib, build ABI.
    assert "pybind11 internals tag: " in out, out
    assert f"bridge built for torch: {version} (matches)" in out, out
    assert "PT_HPU_LAZY_MODE: 0" in out, out
    # A bridge built for another torch release, as a mismatched container would have.
    pkg = tmp_path / "habana_frameworks" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (tmp_path / "habana_frameworks" / "__init__.py").write_text("")
    (pkg / "required_version.txt").write_text("2.5.1")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gaudi-check.sh"), "--env-only"],
                       env={**hpu, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=300)
    assert "bridge built for torch: 2.5.1 (DIFFERS: the bridge refuses to load)" in p.stdout, p.stdout


def test_gaudi_check_trains_every_recipe_without_the_cpu_fallback_and_names_an_op_that_needs_it(hpu):
    # The stand-in is told the bridge lacks max pooling's kernel, which only ResNet uses: its job
    # names the operator; the others run every operator on the HPU.
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gaudi-check.sh"), "--fallback-only"],
                       env={**hpu, "TRAINBOOK_STANDIN_MISSING": "aten::max_pool2d_with_indices.out"},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0, p.stdout + p.stderr
    for job in ("bert adamw bf16", "bert-mlm lamb fp32"):
        assert f"{job}: ok, every operator ran on the HPU" in p.stdout, p.stdout
    assert ("resnet sgd momentum 0.9 bf16: needs the CPU fallback for "
            "aten::max_pool2d_with_indices.out") in p.stdout, p.stdout
    assert "**Result" not in p.stdout  # --fallback-only stops after its section


def test_masked_lm_with_lamb_trains_on_two_hpus(hpu):
    s = summary(trainbook(hpu, "train", "bert-mlm", "--preset", "tiny", "--optimizer", "lamb",
                          "--device", "hpu", "--workers", "2", "--max-steps", "4", "--json"))
    assert s["device"] == "hpu" and s["status"] == "succeeded" and s["steps"] == 4, s


def test_a_causal_lm_trains_with_lora_on_two_hpus_and_equals_cpu(hpu, tmp_path):
    """The Llama fixture (grouped-query attention, llama3 rotary scaling) with LoRA: rotary
    tables, causal masks and every batch on the HPU (the stand-in refuses an operator that
    mixes HPU and CPU tensors), the written-out attention; the same adapters as on the CPU.
    The HPU run is ZeRO-3's: each rank builds its slices of the frozen base on the host, casts
    nothing (fp32), moves them to its HPU, and the units are gathered there through hccl."""
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"line {i}: the cat saw the moon over the harbour" for i in range(200)))
    job = ["train", "causal-lm", "--model", str(ROOT / "tests/fixtures/causal_lm/llama"),
           "--data", str(text), "--preset", "tiny", "--max-length", "16", "--lora-rank", "4",
           "--lora-dropout", "0", "--workers", "2", "--max-steps", "6", "--json",
           # SGD: AdamW's first steps turn last-digit differences (fused vs written-out attention)
           # into whole learning-rate steps.
           "--optimizer", "sgd", "--lr", "0.5"]
    on_hpu = summary(trainbook(hpu, *job, "--device", "hpu", "--zero", "3"))
    on_cpu = summary(trainbook(hpu, *job, "--device", "cpu"))
    assert on_hpu["device"] == "hpu" and on_hpu["steps"] == 6, on_hpu
    a = Path(on_hpu["last_checkpoint"]) / "model.safetensors"
    b = Path(on_cpu["last_checkpoint"]) / "model.safetensors"
    assert max_abs_diff(read_f32(a), read_f32(b)) < 1e-4


def test_a_rank_stuck_in_its_teardown_after_success_is_killed_and_the_job_succeeds(hpu):
    """The bridge tears down at exit with an untimed barrier; the stand-in's rank 1 hangs there
    (TRAINBOOK_STANDIN_HANG_AT_EXIT=1) after its work is done. The driver kills it hang_timeout
    later and the job succeeds with one warning, instead of never ending."""
    t0 = time.monotonic()
    p = trainbook(hpu, "train", "synthetic", *SGD, "--max-steps", "4", "--device", "hpu",
                  "--hang-timeout", "5", extra={"TRAINBOOK_STANDIN_HANG_AT_EXIT": "1"}, timeout=180)
    wall = time.monotonic() - t0
    r = summary(p)
    assert r["status"] == "succeeded", r
    (warning,) = r["warnings"]
    assert warning.startswith("rank 1 finished its work but had not exited 5 s later"), warning
    assert f"warning: {warning}" in p.stderr
    assert wall < r["elapsed_seconds"] + 30, (wall, r["elapsed_seconds"])


HANDOVER_PROBE = r"""
import habana_frameworks.torch.core  # noqa: F401  (before torch)
import ctypes, datetime, json, sys
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _register_process_group

store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
opts = dist.distributed_c10d._DistributedBackendOptions()
opts.store, opts.group_rank, opts.group_size = store, 0, 1
opts.timeout, opts.group_id, opts.global_ranks_in_group = datetime.timedelta(seconds=30), "0", [0]
backend = dist.Backend._plugins["HCCL"].creator_fn(opts, None)
pg = dist.ProcessGroup(store, 0, 1)
pg._register_backend(torch.device("hpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
_register_process_group("probe", pg)

lib = ctypes.PyDLL(sys.argv[1])
hpu = torch.device("hpu")
hpu_type = 15  # c10::DeviceType::HPU
err = ctypes.create_string_buffer(4096)
lib.tb_backend_from_python.argtypes = [ctypes.py_object, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.tb_backend_from_python.restype = ctypes.c_void_p
lib.tb_backend_from_registry.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.tb_backend_from_registry.restype = ctypes.c_void_p
lib.tb_pybind11_internals_id.restype = ctypes.c_char_p
lib.tb_backend_free.argtypes = [ctypes.c_void_p]
cast = lib.tb_backend_from_python(backend, hpu_type, err, len(err))
cast_err = err.value.decode()
by_name = lib.tb_backend_from_registry(b"probe", hpu_type, err, len(err))
if by_name:
    lib.tb_backend_free(by_name)
print(json.dumps({"ours": lib.tb_pybind11_internals_id().decode(), "cast": bool(cast),
                  "cast_error": cast_err, "by_name": bool(by_name)}))
"""


def test_the_hccl_group_is_handed_over_by_name_whatever_pybind11_tag_trainbook_was_built_with(hpu):
    """trainbook's hand-over helper compiled to a foreign pybind11 internals tag (build.sh builds
    it, as another compiler family would): the cast refuses before trying and names both tags;
    resolving the group by name in torch's registry works all the same."""
    foreign = Path(__file__).resolve().parent / "build" / "handover_foreign.so"
    p = subprocess.run([sys.executable, "-c", HANDOVER_PROBE, str(foreign)], env=hpu,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["ours"] == "__pybind11_internals_v11_foreign_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1__", r
    assert r["cast"] is False and r["by_name"] is True, r
    err = r["cast_error"]
    assert err.startswith("pybind11 internals differ: trainbook's hand-over helper was compiled to "
                          + r["ours"]), err
    assert "registered their bindings under __pybind11_internals_v11_system_" in err, err
    assert "unset TRAINBOOK_HPU_HANDOVER" in err, err


def test_the_pybind11_cast_hand_over_still_works_when_the_tags_agree(hpu):
    s = summary(trainbook(hpu, "train", "synthetic", *SGD, "--max-steps", "4", "--device", "hpu",
                          extra={"TRAINBOOK_HPU_HANDOVER": "cast"}))
    assert s["status"] == "succeeded", s
    p = trainbook(hpu, "train", "synthetic", *SGD, "--max-steps", "4", "--device", "hpu",
                  extra={"TRAINBOOK_HPU_HANDOVER": "pickle"})
    assert p.returncode != 0
    assert "TRAINBOOK_HPU_HANDOVER=pickle is not known: use registry (the default) or cast" in p.stderr, p.stderr[-2000:]


HPU_TASK = r"""
use trainbook_torch::custom::*;

#[derive(Serialize, Deserialize)]
#[serde(crate = "trainbook_torch::custom::serde")]
struct Halves { hidden: i64 }

struct Net { net: nn::Sequential, x: Tensor, y: Tensor }

impl Task for Halves {
    type State = Net;
    fn setup(&self, vars: &nn::Path, setup: &Setup) -> Result<Net> {
        // 256 points, labelled by which half of the plane they lie in; kept on the device.
        let x = Tensor::randn([256, 2], (Kind::Float, tch::Device::Cpu));
        let y = x.select(1, 0).gt(0.0).to_kind(Kind::Int64);
        let net = nn::seq()
            .add(nn::linear(vars / "fc1", 2, self.hidden, Default::default()))
            .add_fn(|t| t.relu())
            .add(nn::linear(vars / "fc2", self.hidden, 2, Default::default()));
        setup.log(format!("task on {}", setup.device));
        Ok(Net { net, x: setup.device.put(&x)?, y: setup.device.put(&y)? })
    }
    fn len(&self, s: &Net, _split: Split) -> usize { s.y.size()[0] as usize }
    fn step(&self, s: &Net, batch: &Batch) -> Result<Step> {
        let idx: Vec<i64> = batch.indices.iter().map(|&i| i as i64).collect();
        let idx = batch.device.put(&Tensor::from_slice(&idx))?;
        let logits = s.net.forward(&s.x.index_select(0, &idx));
        Ok(Step::classification(logits, s.y.index_select(0, &idx)))
    }
}
"""


def test_a_task_defined_in_notebook_cells_trains_on_two_hpus(hpu, tmp_path):
    """The kernel's cell worker has the Gaudi bridge too: a task written in cells trains on HPU,
    strict (no CPU fallback), with AdamW through the bridge's fused op."""
    import jupyter_client

    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="trainbook", startup_timeout=120,
                                                     env={**hpu, "TRAINBOOK_STANDIN_OP_COUNTS": "1"})
    try:
        reply = kc.execute_interactive(HPU_TASK, timeout=300, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok", reply["content"]
        out = []
        fit = ("let r = Trainer::new(Halves { hidden: 16 }).workers(2).device(DeviceRequest::Hpu)"
               ".global_batch_size(32).max_steps(6).optimizer(OptimizerKind::Adamw)"
               f'.runs_root("{tmp_path}").show_plot(false).fit()?;\n'
               'println!("{} {} {} {}", r.status, r.device, r.steps, r.run_dir.display());')
        reply = kc.execute_interactive(fit, timeout=300, output_hook=out.append)
        text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
        text += "".join("\n".join(m["content"].get("traceback", [])) for m in out if m["msg_type"] == "error")
        assert reply["content"]["status"] == "ok", (reply["content"], text[-3000:])
        status, device, steps, run_dir = text.strip().splitlines()[-1].split()
        assert (status, device, steps) == ("succeeded", "hpu", "6"), text[-2000:]
        log = (Path(run_dir) / "logs" / "rank1.log").read_text()
        assert "task on hpu:0" in log and "op calls: hpu::optimizer_adamw=12 " in log, log[-2000:]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
