"""Kernel latency, trainbook vs stock evcxr_jupyter, side by side (alternating rounds).

  kernel start -> first cell result   (start_new_kernel, then `1 + 1`)
  trivial cell round trip             (median of 15 `1 + 1` in a started kernel)
  first training display              (trainbook only: execute -> first display_data)

Kernelspecs are found through JUPYTER_PATH (scripts/bench.sh sets it). Every wait has a
deadline. Prints a Markdown table and one JSON line with the raw numbers.
"""

import argparse
import json
import queue
import statistics
import sys
import time

import jupyter_client

TIMEOUT = 180
# Blocks until the job ends; its live display appears when the workers have been started.
TRAIN_CELL = 'BertTrainer::new().preset("tiny").workers(2).runs_root("{runs}").fit()?.status'


def start(name):
    t0 = time.monotonic()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name=name, startup_timeout=TIMEOUT)
    return km, kc, t0


def run(kc, code):
    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=lambda m: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")


def stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def first_result(name):
    km, kc, t0 = start(name)
    try:
        run(kc, "1 + 1")
        return time.monotonic() - t0
    finally:
        stop(km, kc)


def round_trips(name, n=15):
    km, kc, _ = start(name)
    try:
        run(kc, "1 + 1")
        times = []
        for _ in range(n):
            t = time.monotonic()
            run(kc, "1 + 1")
            times.append(time.monotonic() - t)
        return statistics.median(times)
    finally:
        stop(km, kc)


def first_display(name, runs):
    km, kc, _ = start(name)
    try:
        run(kc, "1 + 1")
        while True:  # drop the warm-up cell's messages
            try:
                kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                break
        t0 = time.monotonic()
        msg_id = kc.execute(TRAIN_CELL.format(runs=runs))
        shown = None
        deadline = t0 + TIMEOUT
        while time.monotonic() < deadline:
            m = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if shown is None and m["msg_type"] == "display_data" and \
                    (m["content"].get("transient") or {}).get("display_id"):
                shown = time.monotonic() - t0
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
        reply = kc.get_shell_msg(timeout=TIMEOUT)["content"]
        if reply["status"] != "ok":
            raise RuntimeError(f"training cell failed: {reply.get('evalue')}")
        if shown is None:
            raise RuntimeError("the training cell showed no display")
        return shown
    finally:
        stop(km, kc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="trainbook,evcxr-stock")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs-root", default="/tmp/trainbook-kernel-bench-runs")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    specs = jupyter_client.kernelspec.KernelSpecManager().find_kernel_specs()
    missing = [k for k in kernels if k not in specs]
    if missing:
        sys.exit(f"error: kernelspec(s) {missing} not found (JUPYTER_PATH?); have {sorted(specs)}")

    raw = {k: {"first_result": [], "round_trip": [], "first_display": []} for k in kernels}
    for k in kernels:  # warm-up: build dirs, page cache
        first_result(k)
    for r in range(args.rounds):
        order = kernels if r % 2 == 0 else kernels[::-1]
        for k in order:
            raw[k]["first_result"].append(first_result(k))
            raw[k]["round_trip"].append(round_trips(k))
            if k == "trainbook":
                raw[k]["first_display"].append(first_display(k, args.runs_root))
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {raw[k]['first_result'][-1]:.2f}s/{raw[k]['round_trip'][-1]:.3f}s" for k in kernels),
            file=sys.stderr)

    med = {k: {m: (statistics.median(v) if v else None) for m, v in raw[k].items()} for k in kernels}
    print("| metric | " + " | ".join(kernels) + (" | ratio (trainbook / stock) |" if len(kernels) == 2 else " |"))
    print("|---" * (len(kernels) + 1 + (len(kernels) == 2)) + "|")
    for metric, label in [("first_result", "kernel start → first cell result (s)"),
                          ("round_trip", "trivial cell round trip (s)"),
                          ("first_display", "execute → first training display (s)")]:
        cells = [f"{med[k][metric]:.2f}" if med[k][metric] is not None else "n/a" for k in kernels]
        ratio = ""
        if len(kernels) == 2 and all(med[k][metric] for k in kernels):
            pairs = [a / b for a, b in zip(raw[kernels[0]][metric], raw[kernels[1]][metric])]
            ratio = f" {statistics.median(pairs):.2f}× |"
        elif len(kernels) == 2:
            ratio = " n/a |"
        print(f"| {label} | " + " | ".join(cells) + " |" + ratio)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "raw": raw, "median": med}))


if __name__ == "__main__":
    main()
