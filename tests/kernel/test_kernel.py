"""The trainbook Jupyter kernel, driven through a real Jupyter client (jupyter_client).

Run by `make test` (scripts/test-kernel.sh) after the kernelspec is installed into .venv.
Every wait has a deadline, so a broken kernel fails these tests instead of hanging them.
"""

import hashlib
import hmac
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import jupyter_client
import nbformat
import pytest
import zmq

ROOT = Path(__file__).resolve().parents[2]
KERNEL = os.environ.get("TRAINBOOK_KERNEL_NAME", "trainbook")
RUNS = tempfile.mkdtemp(prefix="tb-kernel-runs-")
# A job that runs until it is stopped (the tiny synthetic recipe, many steps).
LONG_JOB = (
    'let job = launch(JobSpec::new("synthetic").preset("tiny").workers(2)'
    f'.max_steps(1_000_000).epochs(100_000).runs_root("{RUNS}"))?;'
)
SHORT_JOB = (
    'let job = launch(JobSpec::new("synthetic").preset("tiny").workers(2)'
    f'.runs_root("{RUNS}"))?;'
)


def start():
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name=KERNEL, startup_timeout=120)
    return km, kc


@pytest.fixture(scope="module")
def kernel():
    km, kc = start()
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def run(kc, code, timeout=120):
    """Executes `code`; returns (reply content, iopub messages of this cell)."""
    msgs = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=msgs.append)
    return reply["content"], msgs


def result_text(msgs):
    return "".join(
        m["content"]["data"].get("text/plain", "")
        for m in msgs
        if m["msg_type"] == "execute_result"
    )


def stream_text(msgs):
    return "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")


def kernel_pid(km):
    return km.provisioner.process.pid


def descendants(pid):
    """Live processes below `pid` (from /proc)."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if rest[0] != "Z":
            table[int(d)] = int(rest[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in table.items():
            if parent == p and child not in out:
                out.append(child)
                frontier.append(child)
    return out


def workers_of(km):
    return [p for p in descendants(kernel_pid(km)) if "trainbook-worker" in cmdline(p)]


def cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return ""


def alive(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def wait_until(cond, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def iopub_until(kc, pred, timeout):
    """Reads iopub until `pred(msg)` holds; returns all messages read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(m)
        if pred(m):
            return seen
    raise AssertionError(
        f"no matching iopub message within {timeout} s; saw {[m['msg_type'] for m in seen]}"
    )


def wait_for_workers(km, n=2, timeout=60):
    assert wait_until(lambda: len(workers_of(km)) >= n, timeout), "workers did not start"
    return workers_of(km)


def test_kernel_info_and_kernelspec(kernel):
    km, kc = kernel
    info = kc.kernel_info(reply=True, timeout=30)["content"]
    assert info["status"] == "ok"
    assert info["implementation"] == "trainbook"
    lang = info["language_info"]
    assert lang["name"] == "rust"
    assert lang["file_extension"] == ".rs"
    assert lang["codemirror_mode"] == "rust"
    spec = km.kernel_spec
    assert spec.interrupt_mode == "message"
    assert spec.language == "rust"


def test_execute_returns_a_result_and_the_prelude_is_loaded(kernel):
    _, kc = kernel
    reply, msgs = run(kc, "1 + 1")
    assert reply["status"] == "ok", reply
    assert reply["execution_count"] >= 1
    assert result_text(msgs) == "2"
    # The prelude is in scope without any `use` in the notebook.
    reply, msgs = run(kc, "JobSpec::new(\"synthetic\").workers(3).into_spec().workers")
    assert reply["status"] == "ok", reply
    assert result_text(msgs) == "3"


def rich_result(msgs):
    """The MIME bundle of the cell's execute_result."""
    [data] = [m["content"]["data"] for m in msgs if m["msg_type"] == "execute_result"]
    return data


def test_tables_and_results_render_as_html(kernel):
    _, kc = kernel
    reply, msgs = run(kc, 'BertTrainer::new().preset("tiny").training_table()?')
    assert reply["status"] == "ok", reply
    data = rich_result(msgs)
    assert '<table class="trainbook-frame"' in data["text/html"]
    assert data["text/plain"].startswith("shape: ("), data["text/plain"]
    # A long table shows its head and tail, not every row.
    rows = int(data["text/plain"].split("(")[1].split(",")[0])
    assert rows > 20 and f"… {rows - 20} more rows" in data["text/html"]

    reply, msgs = run(kc, SHORT_JOB + "\nlet r: TrainResult = job.wait()?;\nr")
    assert reply["status"] == "ok", reply
    data = rich_result(msgs)
    assert '<table class="trainbook-result"' in data["text/html"]
    assert "succeeded" in data["text/plain"] and "run dir" in data["text/plain"]

    reply, msgs = run(kc, "r.epochs()?")
    assert reply["status"] == "ok", reply
    assert ">epoch</th>" in rich_result(msgs)["text/html"]

    # A profiled run shows its top operators under the summary.
    reply, msgs = run(kc, SHORT_JOB.replace(".workers(2)", ".workers(2).max_steps(6).profile(2..4)")
                      + "\njob.wait()?")
    assert reply["status"] == "ok", reply
    data = rich_result(msgs)
    assert '<table class="trainbook-result"' in data["text/html"]
    assert '<table class="trainbook-profile"' in data["text/html"], data["text/html"][-2000:]
    assert "profiled steps 2..4 on rank 0" in data["text/plain"] and "traces: " in data["text/plain"]

    reply, msgs = run(kc, "job")
    assert reply["status"] == "ok", reply
    data = rich_result(msgs)
    assert '<table class="trainbook-job"' in data["text/html"]
    assert "synthetic" in data["text/plain"]

    # A memory plan: its rows, the total against the device, the levers.
    reply, msgs = run(kc, 'let plan = BertMlmTrainer::new().preset("bert-1.5b").workers(8)'
                          '.device(DeviceRequest::Hpu).device_memory("32GiB").plan()?;')
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, "plan.memory.clone().unwrap()")
    assert reply["status"] == "ok", reply
    data = rich_result(msgs)
    assert '<table class="trainbook-plan"' in data["text/html"]
    assert "optimizer state" in data["text/plain"] and "fits: 31.5" in data["text/plain"], data


def test_a_runs_metrics_are_a_polars_dataframe_in_a_cell_without_imports(kernel):
    _, kc = kernel
    reply, msgs = run(kc, SHORT_JOB + "\nlet pr: TrainResult = job.wait()?;")
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, "let df = pr.history_df()?;")
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, "(df.height(), pr.history().height())")
    assert reply["status"] == "ok", reply
    height, rows = map(int, result_text(msgs).strip("()").split(","))
    assert height == rows > 0, msgs
    # polars on it in the next cell: rank 0's loss rows and their mean, against the result's
    # own rows.
    reply, msgs = run(kc, 'let loss = df.filter(&(df.column("name")?.str()?.equal("loss") '
                          '& df.column("rank")?.u64()?.equal(0)))?;\n'
                          '(loss.height(), loss.column("value")?.f64()?.mean().unwrap())')
    assert reply["status"] == "ok", reply
    n, mean = result_text(msgs).strip("()").split(",")
    reply, msgs = run(kc, 'let l: Vec<f64> = pr.metric_rows.iter().filter(|m| m.name == "loss" && m.rank == 0)'
                          '.map(|m| m.value).collect();\n(l.len(), l.iter().sum::<f64>() / l.len() as f64)')
    assert reply["status"] == "ok", reply
    n2, mean2 = result_text(msgs).strip("()").split(",")
    assert int(n) == int(n2) > 0 and abs(float(mean) - float(mean2)) < 1e-9, (n, mean, n2, mean2)
    reply, msgs = run(kc, "let e = pr.epochs_df()?; let m = pr.memory_df()?; (e.height(), m.height())")
    assert reply["status"] == "ok", reply


def test_variables_without_types_are_typed(kernel):
    _, kc = kernel
    # A std type trainbook returns, named as the compiler names it (`PathBuf`).
    reply, msgs = run(kc, 'let file = BertTrainer::new().preset("tiny").training_file()?;')
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, "file.exists()")
    assert result_text(msgs) == "true", (reply, msgs)
    # A tuple pattern, typed as one.
    reply, msgs = run(
        kc, 'let (spec, mut n) = (JobSpec::new("synthetic").workers(3).into_spec(), 1usize);'
    )
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, "n += spec.workers; n")
    assert result_text(msgs) == "4", (reply, msgs)


def test_an_idle_kernel_warms_the_analyzer_up_and_a_waiting_cell_goes_first(tmp_path):
    """Once the prelude is loaded, an idle engine asks rust-analyzer a completion question, so
    the notebook's first `let` does not wait for its first analysis; a cell that is already
    waiting (a headless run sends its first cell at once) goes first and gets no warm-up."""

    def started(log):
        km = jupyter_client.KernelManager(kernel_name=KERNEL)
        km.start_kernel(env={**os.environ, "TRAINBOOK_KERNEL_TIMING": "1"}, stderr=log.open("w"))
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        return km, kc

    def stop(km, kc):
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    queued = tmp_path / "queued.log"
    km, kc = started(queued)
    try:
        content, msgs = run(kc, "let p: usize = 2;\np + 1")
        assert content["status"] == "ok" and result_text(msgs) == "3"
        log = queued.read_text()
        assert "prelude ready" in log and "warmed up" not in log, log
    finally:
        stop(km, kc)

    idle = tmp_path / "idle.log"
    km, kc = started(idle)
    try:
        deadline = time.monotonic() + 120
        while "warmed up" not in idle.read_text():
            assert time.monotonic() < deadline, idle.read_text()
            time.sleep(0.2)
        content, msgs = run(kc, "let p: usize = 2;\np + 1")
        assert content["status"] == "ok" and result_text(msgs) == "3"
    finally:
        stop(km, kc)


def test_dep_adds_a_crate_beside_the_prelude(kernel):
    _, kc = kernel
    reply, _ = run(kc, LONG_JOB)
    assert reply["status"] == "ok", reply
    # itoa is in trainbook's own Cargo.lock, so cargo's cache has it (the kernel is offline).
    reply, _ = run(kc, ':dep itoa = "1"', timeout=300)
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, "let mut buf = itoa::Buffer::new(); buf.format(41u32 + 1).to_string()")
    assert result_text(msgs) == '"42"', (reply, msgs)
    # The prelude was not rebuilt or loaded twice: its job registry still holds the job.
    reply, msgs = run(
        kc, "trainbook::running_jobs().iter().any(|j| j.id() == job.id()) && !job.status().is_finished()"
    )
    assert result_text(msgs) == "true", (reply, msgs)
    reply, _ = run(kc, "job.stop()?;")
    assert reply["status"] == "ok", reply


def test_stdout_streams_to_the_cell(kernel):
    _, kc = kernel
    reply, msgs = run(kc, 'println!("hello from rust"); eprintln!("to stderr");')
    assert reply["status"] == "ok"
    out = [m["content"] for m in msgs if m["msg_type"] == "stream"]
    assert any(s["name"] == "stdout" and "hello from rust" in s["text"] for s in out), out
    assert any(s["name"] == "stderr" and "to stderr" in s["text"] for s in out), out


def test_compile_error_is_an_error_reply_with_rustc_message(kernel):
    _, kc = kernel
    reply, msgs = run(kc, 'let n: u32 = "seven";')
    assert reply["status"] == "error"
    assert reply["ename"] == "CompileError"
    assert "mismatched types" in reply["evalue"]
    errors = [m for m in msgs if m["msg_type"] == "error"]
    assert errors, [m["msg_type"] for m in msgs]
    assert any("seven" in line for line in errors[0]["content"]["traceback"])
    # The kernel keeps working.
    reply, msgs = run(kc, "2 * 21")
    assert result_text(msgs) == "42"


def error_of(msgs):
    errors = [m["content"] for m in msgs if m["msg_type"] == "error"]
    assert len(errors) == 1, [m["msg_type"] for m in msgs]
    return errors[0]


def test_a_question_mark_error_is_an_error_reply_naming_the_line(kernel):
    _, kc = kernel
    reply, _ = run(kc, "let kept_before_error = 7;")
    assert reply["status"] == "ok", reply
    reply, msgs = run(kc, 'let n = 1;\nlet data = std::fs::read("/nonexistent/trainbook")?;\nlet lost = 2;')
    assert reply["status"] == "error", reply
    assert reply["ename"] == "Error"
    assert "No such file or directory" in reply["evalue"], reply
    err = error_of(msgs)
    assert err["evalue"] == reply["evalue"]
    assert any('at cell line 2: let data = std::fs::read("/nonexistent/trainbook")?;' in line
               for line in err["traceback"]), err["traceback"]
    # Earlier variables survive; the kernel goes on answering ok.
    reply, msgs = run(kc, "kept_before_error + 1")
    assert reply["status"] == "ok" and result_text(msgs) == "8", (reply, stream_text(msgs))


def test_a_panic_is_an_error_reply_with_its_message_and_line(kernel):
    _, kc = kernel
    reply, msgs = run(kc, "let a = 1;\nlet v = None::<u32>.unwrap();")
    assert reply["status"] == "error", reply
    assert reply["ename"] == "Panic"
    assert "called `Option::unwrap()` on a `None` value" in reply["evalue"], reply
    assert any("at cell line 2: let v = None::<u32>.unwrap();" in line
               for line in error_of(msgs)["traceback"]), error_of(msgs)
    # A panic on another thread, joined by the cell, does not fail the cell.
    reply, msgs = run(kc, 'std::thread::spawn(|| panic!("in a thread")).join().is_err()')
    assert reply["status"] == "ok" and result_text(msgs) == "true", (reply, stream_text(msgs))


def test_trainbook_errors_fail_the_cell_with_their_message(kernel):
    _, kc = kernel
    reply, _ = run(kc, 'BertTrainer::new().preset("nope").fit()?;')
    assert reply["status"] == "error", reply
    assert "unknown preset 'nope'" in reply["evalue"] and "use " in reply["evalue"], reply
    reply, _ = run(kc, "let r = BertTrainer::new().workers(0).fit()?;")
    assert reply["status"] == "error", reply
    assert "workers" in reply["evalue"], reply
    # A failed training run (the workers' loss diverges) fails the cell, naming the rank.
    reply, msgs = run(
        kc,
        'JobSpec::new("synthetic").preset("tiny").workers(2).optimizer(OptimizerKind::Sgd)'
        f'.lr(1e6).epochs(5).runs_root("{RUNS}").fit()?;',
        timeout=300,
    )
    assert reply["status"] == "error", (reply, stream_text(msgs))
    assert "worker rank" in reply["evalue"] and "loss became" in reply["evalue"], reply


def test_completeness_and_completion(kernel):
    _, kc = kernel
    kc.is_complete("fn f() {")
    r = kc.get_shell_msg(timeout=30)["content"]
    assert r["status"] == "incomplete"
    kc.is_complete("let x = 1;")
    assert kc.get_shell_msg(timeout=30)["content"]["status"] == "complete"
    kc.complete("let v: Vec<u8> = Vec::new(); v.pu", 34)
    r = kc.get_shell_msg(timeout=60)["content"]
    assert r["status"] == "ok"
    assert any(m.startswith("push") for m in r["matches"]), r["matches"][:20]


def test_completion_and_inspection_know_trainbook(kernel):
    """The builder's methods complete after `BertTrainer::new().` and Shift-Tab shows their
    docs, also on a variable bound in an earlier cell."""
    _, kc = kernel
    code = 'BertTrainer::new().preset("tiny").epo'
    kc.complete(code, len(code))
    r = kc.get_shell_msg(timeout=120)["content"]
    assert r["status"] == "ok", r
    assert any(m.startswith("epochs") for m in r["matches"]), r["matches"][:30]
    assert r["cursor_start"] == len(code) - 3 and r["cursor_end"] == len(code), r

    reply, _ = run(kc, 'let trainer_for_completion = BertTrainer::new().preset("tiny");')
    assert reply["status"] == "ok", reply
    code = "trainer_for_completion."
    kc.complete(code, len(code))
    matches = kc.get_shell_msg(timeout=60)["content"]["matches"]
    for method in ("workers", "lr", "launch", "fit", "spec"):
        assert any(m.startswith(method) for m in matches), (method, matches[:40])

    code = "BertTrainer::new().max_length"
    kc.inspect(code, len(code))
    r = kc.get_shell_msg(timeout=60)["content"]
    assert r["status"] == "ok" and r["found"], r
    text = r["data"]["text/plain"]
    assert "max_length" in text and "token" in text.lower(), text


def test_a_trainbook_value_bound_without_a_type_needs_no_second_compile(tmp_path):
    """rust-analyzer sees trainbook, so `let spec = ...;` is typed before evcxr compiles, and
    neither evcxr's type check nor the kernel's probe compile runs (the kernel says so in its
    timing log)."""
    log = tmp_path / "kernel.log"
    km = jupyter_client.KernelManager(kernel_name=KERNEL)
    km.start_kernel(env={**os.environ, "TRAINBOOK_KERNEL_TIMING": "1"}, stderr=log.open("w"))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        deadline = time.monotonic() + 120
        while "trainbook analyzer loaded" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        reply, _ = run(kc, 'let spec_untyped = JobSpec::new("synthetic").workers(3);')
        assert reply["status"] == "ok", reply
        reply, msgs = run(kc, "spec_untyped.clone().into_spec().workers")
        assert result_text(msgs) == "3", (reply, msgs)
        text = log.read_text()
        assert "typed `spec_untyped` as `JobSpec` by the analyzer" in text, text
        assert "probe compile" not in text, text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def sign(key, parts):
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.hexdigest().encode()


def raw_execute(km, code, key):
    """An execute_request on a fresh DEALER socket, signed with `key` (bytes, may be wrong)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://{km.ip}:{km.shell_port}")
    header = {
        "msg_id": uuid.uuid4().hex,
        "session": uuid.uuid4().hex,
        "username": "test",
        "date": "2026-11-22T00:00:00Z",
        "msg_type": "execute_request",
        "version": "5.3",
    }
    content = {
        "code": code,
        "silent": False,
        "store_history": True,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }
    parts = [json.dumps(x).encode() for x in (header, {}, {}, content)]
    sig = sign(key, parts) if key is not None else b""
    sock.send_multipart([b"<IDS|MSG>", sig] + parts)
    return sock


def test_badly_signed_messages_are_not_executed(kernel, tmp_path):
    km, kc = kernel
    marker = tmp_path / "executed"
    code = f'std::fs::write("{marker}", "x").unwrap();'
    socks = [
        raw_execute(km, code, b"not-the-key"),
        raw_execute(km, code, None),  # no signature at all
    ]
    time.sleep(3)
    for s in socks:
        assert s.poll(100) == 0, "the kernel replied to a badly signed request"
        s.close()
    assert not marker.exists(), "a badly signed request was executed"
    # The same request correctly signed runs.
    good = raw_execute(km, code, km.session.key)
    assert good.poll(60_000), "no reply to a correctly signed request"
    good.close()
    assert wait_until(marker.exists, 10)


def test_background_job_display_updates_after_the_cell_returned(kernel):
    _, kc = kernel
    t0 = time.monotonic()
    reply, msgs = run(kc, SHORT_JOB)
    assert reply["status"] == "ok", (reply, stream_text(msgs))
    displays = [m for m in msgs if m["msg_type"] == "display_data"]
    assert displays, [m["msg_type"] for m in msgs]
    display_id = displays[0]["content"]["transient"]["display_id"]
    assert display_id
    cell_id = displays[0]["parent_header"]["msg_id"]
    # The cell has returned; the job keeps drawing into its display.
    updates = iopub_until(
        kc,
        lambda m: m["msg_type"] == "update_display_data"
        and m["content"]["transient"]["display_id"] == display_id,
        timeout=60,
    )
    upd = updates[-1]
    # Between cells, updates are attributed to the cell that started the job.
    assert upd["parent_header"]["msg_id"] == cell_id
    # Waiting in a later cell: that cell receives the final view of the display.
    reply, msgs = run(kc, "job.wait()?.status")
    assert reply["status"] == "ok", (reply, stream_text(msgs))
    assert "Succeeded" in result_text(msgs)
    final = [
        m
        for m in msgs
        if m["msg_type"] == "update_display_data"
        and m["content"]["transient"]["display_id"] == display_id
    ]
    assert final, "the waiting cell got no update of the job's display"
    assert "succeeded" in final[-1]["content"]["data"]["text/plain"].lower()
    assert time.monotonic() - t0 < 120


def test_a_killed_worker_restarts_and_the_cell_gets_a_succeeded_result(kernel):
    km, kc = kernel
    code = (
        'let r = fit(JobSpec::new("synthetic").preset("tiny").workers(2).epochs(10).max_steps(400)'
        f'.checkpoint_every(50).max_failures(1).runs_root("{RUNS}"))?;\n'
        "(r.status, r.restarts.len(), r.restarts[0].resumed_step)"
    )
    before = set(Path(RUNS).glob("*/checkpoints/step-*"))
    msg_id = kc.execute(code)
    pids = wait_for_workers(km)
    # Let it train past its first checkpoint, then kill rank 1 from outside.
    assert wait_until(lambda: set(Path(RUNS).glob("*/checkpoints/step-*")) - before, 120)
    rank1 = [p for p in pids if b"RANK=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0")]
    os.kill(rank1[0], signal.SIGKILL)
    msgs, reply = [], None
    deadline = time.monotonic() + 180
    while reply is None:
        assert time.monotonic() < deadline, "the cell did not finish"
        try:
            m = kc.get_iopub_msg(timeout=1)
            if m["parent_header"].get("msg_id") == msg_id:
                msgs.append(m)
        except queue.Empty:
            pass
        try:
            r = kc.get_shell_msg(timeout=0.01)
            if r["parent_header"].get("msg_id") == msg_id:
                reply = r
        except queue.Empty:
            pass
    # The rest of this cell's output.
    while True:
        try:
            m = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            break
        if m["parent_header"].get("msg_id") == msg_id:
            msgs.append(m)
    assert reply["content"]["status"] == "ok", (error_of(msgs), stream_text(msgs))
    status, restarts, resumed = result_text(msgs).strip("()").split(", ")
    assert (status, restarts) == ("Succeeded", "1"), result_text(msgs)
    # The live dashboard said so: the restart's line, and its marker on the loss plot.
    views = [
        m["content"]["data"]
        for m in msgs
        if m["msg_type"] in ("display_data", "update_display_data")
    ]
    text = "".join(v.get("text/plain", "") for v in views)
    assert "restart 1/1: rank 1 killed by signal 9 (SIGKILL)" in text, text[-3000:]
    assert f"resumed from step {resumed}" in text, text[-3000:]
    html = "".join(v.get("text/html", "") for v in views)
    assert re.search(r">\s*restart\s*</text>", html), "no restart marker on the plot"
    assert not any(alive(p) for p in pids)


def test_interrupt_stops_workers_and_keeps_variables(kernel):
    km, kc = kernel
    run(kc, "let kept = 41;")
    msg_id = kc.execute(LONG_JOB + "\njob.wait()?;")
    pids = wait_for_workers(km)
    t0 = time.monotonic()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=30)
    took = time.monotonic() - t0
    content = reply["content"]
    assert content["status"] == "error"
    assert content["ename"] == "Interrupted", content
    # The cell returned within the kernel's grace period: this text, not the restart's (a cell
    # past its grace is killed and its variables lost). The bound only guards against a hang.
    assert "every variable was kept" in content["evalue"], content
    assert took < 60, f"the interrupted cell returned after {took:.1f} s"
    assert wait_until(lambda: not any(alive(p) for p in pids), 5), "workers survived"
    _, msgs = run(kc, "kept + 1")
    assert result_text(msgs) == "42", "a variable defined before the interrupt was lost"


def test_interrupt_stops_every_trial_of_a_sweep_and_keeps_variables(kernel):
    km, kc = kernel
    run(kc, "let kept = 41;")
    reply, msgs = run(
        kc,
        'let sweep = Sweep::new(JobSpec::new("synthetic").preset("tiny").workers(1)'
        f'.max_steps(1_000_000).epochs(100_000).runs_root("{RUNS}"))'
        '.grid("lr", [1e-3, 2e-3, 3e-3]).metric("loss", Goal::Min).concurrent(2).launch()?;',
    )
    assert reply["status"] == "ok", (error_of(msgs), stream_text(msgs))
    msg_id = kc.execute("sweep.wait()?;")
    # Two trials of one worker each run at once; the third waits for a slot.
    pids = wait_for_workers(km, n=2)
    time.sleep(1)
    assert len(workers_of(km)) == 2, workers_of(km)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=30)
    content = reply["content"]
    assert content["status"] == "error"
    assert content["ename"] == "Interrupted", content
    assert wait_until(lambda: not any(alive(p) for p in pids), 5), "trial workers survived"
    assert not workers_of(km), "a trial started after the interrupt"
    _, msgs = run(kc, "(kept + 1, sweep.status(), sweep.trial_states().iter().map(|t| t.status.name()).collect::<Vec<_>>())")
    assert result_text(msgs) == '(42, Stopped, ["stopped", "stopped", "stopped"])', result_text(msgs)


def test_interrupt_of_a_busy_loop_restarts_the_process_and_says_so():
    km, kc = start()
    try:
        run(kc, "let lost = 1;")
        msg_id = kc.execute(
            'println!("spinning");\nloop { std::thread::sleep(std::time::Duration::from_millis(10)); }'
        )
        # Interrupt once the loop runs (the cell compiled and started), however long that took.
        iopub_until(
            kc,
            lambda m: m["parent_header"].get("msg_id") == msg_id
            and m["msg_type"] == "stream"
            and "spinning" in m["content"]["text"],
            120,
        )
        t0 = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "Interrupted", reply["content"]
        evalue = reply["content"]["evalue"]
        assert "did not stop within the grace period" in evalue, evalue
        assert "variables are lost" in evalue, evalue
        assert time.monotonic() - t0 < 60, "the interrupt of a busy loop hung"
        # The prelude is back; the old variable is gone.
        reply, msgs = run(kc, "JobSpec::new(\"synthetic\").into_spec().workers")
        assert reply["status"] == "ok", reply
        reply, _ = run(kc, "lost")
        assert reply["status"] == "error"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_shutdown_leaves_no_worker():
    km, kc = start()
    run(kc, LONG_JOB)
    pids = wait_for_workers(km)
    child = [p for p in descendants(kernel_pid(km)) if p not in pids]
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert wait_until(lambda: not any(alive(p) for p in pids + child), 10), "processes survived"


def test_sigkill_of_the_kernel_leaves_no_worker():
    km, kc = start()
    run(kc, LONG_JOB)
    pids = wait_for_workers(km)
    everything = descendants(kernel_pid(km))
    os.kill(kernel_pid(km), signal.SIGKILL)
    assert wait_until(lambda: not any(alive(p) for p in everything), 10), [
        (p, cmdline(p)) for p in everything if alive(p)
    ]
    assert pids
    kc.stop_channels()
    km.cleanup_resources()


def nbconvert(tmp_path, name, sources):
    """Writes a notebook of `sources` and runs `jupyter nbconvert --execute` on it."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Rust (trainbook)", "language": "rust"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nbformat.write(nb, tmp_path / f"{name}.ipynb")
    jupyter = Path(sys.executable).parent / "jupyter"
    return subprocess.run(
        [str(jupyter), "nbconvert", "--to", "notebook", "--execute", str(tmp_path / f"{name}.ipynb"),
         "--output", f"{name}.out.ipynb", "--ExecutePreprocessor.timeout=300"],
        capture_output=True, text=True, timeout=400,
    )


def test_nbconvert_executes_a_rust_notebook(tmp_path):
    out = nbconvert(tmp_path, "three", ["let a = 20;", "let b = a * 2;", "b + 2"])
    assert out.returncode == 0, out.stderr[-3000:]
    done = nbformat.read(tmp_path / "three.out.ipynb", as_version=4)
    outputs = done.cells[2].outputs
    assert outputs and outputs[0]["data"]["text/plain"] == "42", outputs


def test_nbconvert_fails_on_a_failing_cell(tmp_path):
    out = nbconvert(tmp_path, "failing", [
        "let a = 20;",
        'let r = BertTrainer::new().preset("nope").fit()?;',
        'println!("never reached");',
    ])
    assert out.returncode != 0, out.stderr[-3000:]
    assert "unknown preset 'nope'" in out.stderr, out.stderr[-3000:]


def test_trainbook_kernel_install_registers_a_kernelspec_jupyter_lists(tmp_path):
    trainbook = ROOT / "target" / "release" / "trainbook"
    out = subprocess.run(
        [str(trainbook), "kernel", "install", "--prefix", str(tmp_path), "--no-check",
         "--name", "tb-test"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    spec_dir = tmp_path / "share/jupyter/kernels/tb-test"
    assert (spec_dir / "kernel.json").is_file()
    jupyter = Path(sys.executable).parent / "jupyter"
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "share/jupyter"))
    listed = subprocess.run(
        [str(jupyter), "kernelspec", "list", "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert "tb-test" in specs
    assert specs["tb-test"]["spec"]["display_name"] == "Rust (trainbook)"
    assert specs["tb-test"]["spec"]["interrupt_mode"] == "message"
    # A bad target is a clear error, not a traceback.
    bad = subprocess.run(
        [str(trainbook), "kernel", "install", "--prefix", "/proc/nope", "--no-check"],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode != 0
    assert bad.stderr.startswith("error:") and "--user" in bad.stderr, bad.stderr
