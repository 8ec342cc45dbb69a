#!/usr/bin/env python3
"""Run: .venv/bin/python bench/driver_cpu.py (after `make build`). The trainbook driver process's own CPU (its threads: event loop, TensorBoard writer, MLflow
client; not the workers) while a job trains, with tracking on vs off."""
import json, os, subprocess, sys, time, tempfile, socket
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TB = os.path.join(REPO, "target", "release", "trainbook")
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
port = free_port(); d = tempfile.mkdtemp()
srv = subprocess.Popen([os.path.join(REPO, ".venv", "bin", "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    "--backend-store-uri", f"sqlite:///{d}/db", "--artifacts-destination", f"{d}/art"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
import urllib.request
for _ in range(120):
    try: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); break
    except OSError: time.sleep(1)
tick = os.sysconf("SC_CLK_TCK")
def own_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick  # utime + stime of the process itself
for rnd in range(2):
    for mode in ("on", "off"):
        flags = ["--mlflow", f"http://127.0.0.1:{port}"] if mode == "on" else ["--no-tensorboard"]
        p = subprocess.Popen([TB, "train", "bert", "--device", "cpu", "--workers", "1", "--threads", "1", "--epochs", "1",
            "--train-rows", "300", "--eval-rows", "0", "--runs-root", tempfile.mkdtemp(), "--json", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        samples = []
        while p.poll() is None:
            try: samples.append((time.monotonic(), own_cpu(p.pid)))
            except (OSError, IndexError): pass
            time.sleep(0.5)
        r = json.loads(p.stdout.read().strip().splitlines()[-1])
        n = len(samples); a, b = samples[n // 4], samples[3 * n // 4]
        rate = (b[1] - a[1]) / (b[0] - a[0])
        print(json.dumps({"round": rnd + 1, "tracking": mode, "driver_cpu_cores_mid_run": round(rate, 5),
                          "samples_per_second": round(r["samples_per_second"], 3), "warnings": r["warnings"]}), flush=True)
os.killpg(srv.pid, 9)
