"""Untyped `let`s and completion: the kernel with its trainbook-aware analyzer vs without it
(TRAINBOOK_KERNEL_ANALYZER=off), side by side in alternating rounds.

  typed let      `let sN: JobSpec = JobSpec::new("synthetic");`   (the floor: one compile)
  untyped let    `let uN = JobSpec::new("synthetic");`            (analyzer, or evcxr's check
                                                                    plus a probe compile)
  completion     complete_request after `BertTrainer::new().preset("tiny").`
  analyzer load  kernel start -> "trainbook analyzer loaded" (from the kernel's timing log)

Medians of --cells cells per kernel. Prints a Markdown table and one JSON line.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import jupyter_client

TIMEOUT = 180
KERNEL = os.environ.get("TRAINBOOK_KERNEL_NAME", "trainbook")


def run(kc, code):
    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=lambda m: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")


def measure(analyzer, cells, tag):
    log = Path(tempfile.mkdtemp()) / "kernel.log"
    env = {**os.environ, "TRAINBOOK_KERNEL_TIMING": "1"}
    if not analyzer:
        env["TRAINBOOK_KERNEL_ANALYZER"] = "off"
    t0 = time.monotonic()
    km = jupyter_client.KernelManager(kernel_name=KERNEL)
    km.start_kernel(env=env, stderr=log.open("w"))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        loaded = None
        if analyzer:
            while "trainbook analyzer loaded" not in log.read_text():
                if time.monotonic() - t0 > TIMEOUT:
                    raise RuntimeError(log.read_text())
                time.sleep(0.05)
            loaded = time.monotonic() - t0
        else:
            # The same quiet start as with the analyzer: evcxr's warm-up has run.
            while "warmed up" not in log.read_text():
                if time.monotonic() - t0 > TIMEOUT:
                    raise RuntimeError(log.read_text())
                time.sleep(0.05)
        typed, untyped, complete = [], [], []
        for i in range(cells):
            t = time.monotonic()
            run(kc, f'let s{tag}_{i}: JobSpec = JobSpec::new("synthetic");')
            typed.append(time.monotonic() - t)
            t = time.monotonic()
            run(kc, f'let u{tag}_{i} = JobSpec::new("synthetic");')
            untyped.append(time.monotonic() - t)
            code = 'BertTrainer::new().preset("tiny").'
            t = time.monotonic()
            kc.complete(code, len(code))
            matches = kc.get_shell_msg(timeout=TIMEOUT)["content"]["matches"]
            complete.append((time.monotonic() - t, len(matches)))
        return {
            "analyzer": analyzer,
            "typed_let_s": statistics.median(typed),
            "untyped_let_s": statistics.median(untyped),
            "completion_s": statistics.median(c[0] for c in complete),
            "completion_matches": complete[-1][1],
            "analyzer_loaded_s": loaded,
            "kernel_rss_mb": rss_mb(km),
        }
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def rss_mb(km):
    pid = km.provisioner.process.pid
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cells", type=int, default=5)
    args = ap.parse_args()
    results = []
    for r in range(args.rounds):
        for analyzer in (True, False):
            results.append(measure(analyzer, args.cells, f"{r}{int(analyzer)}"))
    med = {}
    for analyzer in (True, False):
        rows = [x for x in results if x["analyzer"] == analyzer]
        med[analyzer] = {
            k: statistics.median(x[k] for x in rows if x[k] is not None)
            for k in rows[0]
            if k != "analyzer" and any(x[k] is not None for x in rows)
        }
    print("| | with analyzer | without | ratio |")
    print("|---|---|---|---|")
    for key in ("typed_let_s", "untyped_let_s", "completion_s", "completion_matches", "kernel_rss_mb"):
        a, b = med[True].get(key), med[False].get(key)
        ratio = f"{a / b:.2f}×" if a and b else ""
        print(f"| {key} | {a:.2f} | {b:.2f} | {ratio} |")
    print(f"| analyzer loaded after kernel start | {med[True]['analyzer_loaded_s']:.1f} s | | |")
    print(json.dumps({"bench": "kernel_types", "rounds": results}))


if __name__ == "__main__":
    main()
