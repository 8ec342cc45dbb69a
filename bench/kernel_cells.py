"""What a cell costs in two builds of the trainbook kernel, side by side (alternating rounds):
the kernel start to a first result, a trivial cell, a `let` whose type rust-analyzer infers, and
a completion request. Used to weigh compile-time levers on the kernel's rust-analyzer crates
against what every cell pays (docs/benchmarks.md).

  .venv/bin/python bench/kernel_cells.py --kernels trainbook,trainbook-other --rounds 3

Kernelspecs are found through JUPYTER_PATH. Prints a Markdown table and one JSON line.
"""

import argparse
import json
import statistics
import time

import jupyter_client

TIMEOUT = 180
CELLS = {
    "`1 + 1`": "1 + 1",
    "`let` typed by rust-analyzer": 'let s = JobSpec::new("synthetic");',
}
COMPLETE = "BertTrainer::new().wor"


def timed(f):
    t0 = time.monotonic()
    f()
    return time.monotonic() - t0


def execute(kc, code):
    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=lambda m: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")


def complete(kc):
    msg_id = kc.complete(COMPLETE, len(COMPLETE))
    while True:
        reply = kc.get_shell_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg_id:
            if not reply["content"].get("matches"):
                raise RuntimeError(f"no completions for {COMPLETE!r}")
            return


def one_round(name, repeats):
    t0 = time.monotonic()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name=name, startup_timeout=TIMEOUT)
    try:
        execute(kc, "1 + 1")
        out = {"start to first result": time.monotonic() - t0}
        for label, code in CELLS.items():
            out[label] = statistics.median(timed(lambda: execute(kc, code)) for _ in range(repeats))
        out["completion"] = statistics.median(timed(lambda: complete(kc)) for _ in range(repeats))
        return out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="trainbook,trainbook-other", help="two kernelspec names")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="runs of each cell per kernel start")
    args = ap.parse_args()
    names = args.kernels.split(",")
    rows = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            rows[n].append(one_round(n, args.repeats))
    keys = list(rows[names[0]][0])
    med = {n: {k: statistics.median(r[k] for r in rows[n]) for k in keys} for n in names}
    print(f"| seconds (median of {args.rounds} rounds) | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{med[n][k]:.3f}" for n in names) + " |")
    print(json.dumps({"median": med, "rounds": rows}))


if __name__ == "__main__":
    main()
