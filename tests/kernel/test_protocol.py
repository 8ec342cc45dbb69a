"""The kernel against the Jupyter message specification: the Jupyter project's own conformance
suite (`jupyter_kernel_test`, every test it has; only the pager is left out: a Rust cell has
no `?`-style help that pages), then what the suite does not reach: aborts after a failed cell,
history across a restart, one error output for a panic and for a `?`, completion metadata.

Every message read here is checked against the suite's schema of the specification.
"""

import os
import struct
import uuid
import zlib

import jupyter_client
import jupyter_kernel_test
import pytest
from jupyter_kernel_test.msgspec_v5 import validate_message

KERNEL = os.environ.get("TRAINBOOK_KERNEL_NAME", "trainbook")


def png_1x1():
    """A real 1x1 PNG (the suite only looks for the MIME type; the kernel checks the signature)."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


PNG = "[" + ", ".join(str(b) for b in png_1x1()) + "]"


class TestTrainbookKernel(jupyter_kernel_test.KernelTests):
    kernel_name = KERNEL
    language_name = "rust"
    file_extension = ".rs"

    @classmethod
    def setUpClass(cls):
        cls.km, cls.kc = jupyter_client.manager.start_new_kernel(
            kernel_name=cls.kernel_name, startup_timeout=120, env=without_backtraces()
        )
        # The first cell loads the prelude (a compile): longer than the suite's 15 s per cell
        # on a busy 2-core machine.
        cls.kc.execute_interactive("let warm = 1;", timeout=180)

    code_hello_world = 'println!("hello, world");'
    code_stderr = 'eprintln!("a warning");'
    completion_samples = [
        {"text": "let zebra_count = 3;\nzebra_co", "matches": {"zebra_count"}},
        {"text": "std::mem::swa", "matches": {"swap"}},
    ]
    complete_code_samples = ["let x = 1;", "fn f() -> u8 { 1 }", 'let s = "{";']
    incomplete_code_samples = ["fn f() {", 'let s = "abc', "let v = vec![1,"]
    invalid_code_samples = ["}", "let v = (1, 2));"]
    code_generate_error = 'panic!("boom");'
    code_execute_result = [
        {"code": "40 + 2", "result": "42"},
        {"code": '"trainbook".len()', "result": "9"},
    ]
    code_display_data = [
        {"code": 'display("text/html", "<b>hi</b>")?;', "mime": "text/html"},
        {"code": 'display("image/svg+xml", "<svg xmlns=\\"http://www.w3.org/2000/svg\\"/>")?;',
         "mime": "image/svg+xml"},
        {"code": f"display_png(&{PNG})?;", "mime": "image/png"},
        {"code": 'display_json(&BTreeMap::from([("loss", 0.5)]))?;', "mime": "application/json"},
    ]
    code_history_pattern = "40 + ?"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "std::mem::swap"
    code_clear_output = 'println!("old"); clear_output(false)?;'


def without_backtraces():
    """The environment without RUST_BACKTRACE: the user's switch for backtraces in errors."""
    return {k: v for k, v in os.environ.items() if k != "RUST_BACKTRACE"}


@pytest.fixture(scope="module")
def protocol_kernel():
    km, kc = jupyter_client.manager.start_new_kernel(
        kernel_name=KERNEL, startup_timeout=120, env=without_backtraces()
    )
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def execute(kc, code, timeout=120, **kw):
    """Runs `code`; returns (reply, the cell's iopub messages), each checked against the schema."""
    msg_id = kc.execute(code, **kw)
    reply = kc.get_shell_msg(timeout=timeout)
    validate_message(reply, "execute_reply", msg_id)
    return reply["content"], outputs(kc, msg_id)


def outputs(kc, msg_id):
    """The iopub messages of request `msg_id` up to its idle status, minus status and input."""
    out = []
    while True:
        m = kc.get_iopub_msg(timeout=30)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        validate_message(m)
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return out
        if m["msg_type"] not in ("status", "execute_input"):
            out.append(m)


def test_a_panic_and_a_question_mark_are_one_error_output_each(protocol_kernel):
    _, kc = protocol_kernel
    reply, msgs = execute(kc, 'let n = 1;\npanic!("boom {n}");')
    assert reply["status"] == "error" and reply["evalue"] == "boom 1", reply
    assert [m["msg_type"] for m in msgs] == ["error"], msgs
    tb = "\n".join(msgs[0]["content"]["traceback"])
    assert "backtrace" not in tb and "rust_begin_unwind" not in tb, tb

    reply, msgs = execute(kc, 'std::fs::read("/nonexistent/trainbook")?;')
    assert reply["status"] == "error" and "No such file" in reply["evalue"], reply
    assert [m["msg_type"] for m in msgs] == ["error"], msgs

    # Text the cell printed before it failed is still shown.
    reply, msgs = execute(kc, 'println!("loading"); std::fs::read("/nonexistent")?;')
    assert [m["msg_type"] for m in msgs] == ["stream", "error"], [m["content"] for m in msgs]
    assert msgs[0]["content"]["text"] == "loading\n"


def test_with_rust_backtrace_set_the_error_carries_the_cells_frames(protocol_kernel):
    _, kc = protocol_kernel
    reply, _ = execute(kc, 'unsafe { std::env::set_var("RUST_BACKTRACE", "1") };\n'
                           '#[inline(never)]\n'
                           'fn deep_trouble(n: u32) -> u32 { if n > 2 { panic!("too deep") } n }')
    assert reply["status"] == "ok", reply
    reply, msgs = execute(kc, "let a = 5;\nlet b = deep_trouble(a);")
    assert [m["msg_type"] for m in msgs] == ["error"], msgs
    tb = msgs[0]["content"]["traceback"]
    text = "\n".join(tb)
    assert "backtrace (RUST_BACKTRACE is set)" in text, text
    assert any(line.strip().startswith("deep_trouble") for line in tb), tb
    assert "evcxr" not in text and "std::panicking" not in text, text
    execute(kc, 'unsafe { std::env::remove_var("RUST_BACKTRACE") };')


def test_requests_queued_behind_a_failed_cell_are_aborted(protocol_kernel):
    _, kc = protocol_kernel
    first = kc.execute('panic!("stop here");')
    second = kc.execute('println!("never");')
    third = kc.execute('println!("never either");')
    replies = {}
    for _ in range(3):
        r = kc.get_shell_msg(timeout=120)
        if r["content"]["status"] != "aborted":  # the suite's schema predates "aborted"
            validate_message(r)
        replies[r["parent_header"]["msg_id"]] = r["content"]
    assert replies[first]["status"] == "error"
    assert replies[second]["status"] == "aborted" and replies[third]["status"] == "aborted"
    for msg_id in (second, third):
        assert outputs(kc, msg_id) == []
    # Without stop_on_error the next cell runs.
    kc.execute('panic!("go on");', stop_on_error=False)
    after = kc.execute("2 + 2")
    statuses = {}
    for _ in range(2):
        r = kc.get_shell_msg(timeout=120)
        statuses[r["parent_header"]["msg_id"]] = r["content"]["status"]
    assert statuses[after] == "ok", statuses


def test_completion_metadata_gives_each_match_its_kind_and_signature(protocol_kernel):
    _, kc = protocol_kernel
    code = "let v: Vec<u8> = Vec::new(); v.pu"
    msg_id = kc.complete(code, len(code))
    reply = kc.get_shell_msg(timeout=120)
    validate_message(reply, "complete_reply", msg_id)
    content = reply["content"]
    assert "push" in content["matches"], content["matches"]
    assert not any("(" in m for m in content["matches"]), content["matches"]
    types = {t["text"]: t for t in content["metadata"]["_jupyter_types_experimental"]}
    assert types["push"]["type"] == "function", types["push"]
    assert "fn(" in types["push"]["signature"], types["push"]
    assert (types["push"]["start"], types["push"]["end"]) == (len(code) - 2, len(code))


def test_history_survives_a_restart(protocol_kernel):
    km, kc = protocol_kernel
    marker = f"// history marker {uuid.uuid4().hex}"
    reply, _ = execute(kc, f"{marker}\n7 * 6")
    assert reply["status"] == "ok", reply
    msg_id = kc.history(hist_access_type="tail", n=1, output=True, raw=True)
    [(session, line, (source, output))] = kc.get_shell_msg(timeout=30)["content"]["history"]
    assert source.startswith(marker) and output == "42"
    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=120)
    msg_id = kc.history(hist_access_type="search", pattern=f"{marker}*", raw=True, output=False)
    reply = kc.get_shell_msg(timeout=30)
    validate_message(reply, "history_reply", msg_id)
    found = reply["content"]["history"]
    assert [(s, l) for s, l, _ in found] == [(session, line)], found
    # The new session has a number of its own; `range` with session -1 is the one before.
    kc.history(hist_access_type="range", session=-1, start=line, stop=line + 1, raw=True,
               output=False)
    assert kc.get_shell_msg(timeout=30)["content"]["history"] == [[session, line, found[0][2]]]
