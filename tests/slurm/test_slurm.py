"""trainbook under a real Slurm cluster: Debian's slurm-wlm with one slurmctld and two slurmd
(`slurmd -N node1`, `-N node2`) on this machine, on 127.0.0.2 and 127.0.0.3, authenticated by
a munged of the test's own. docs/failures.md's `srun --nodes 2 --ntasks-per-node 1 trainbook train`
line trains across the two; a worker killed on one node restarts the job; a job cancelled with
`scancel` and submitted again with `--resume auto` continues from its newest checkpoint.

Needs root (Slurm's daemons and the nodes' names in /etc/hosts) and `make setup`'s packages
(slurm-wlm, munge). The cluster is torn down after the module; no daemon outlives it.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
TRAINBOOK = ROOT / "target" / "release" / "trainbook"
NODES = {"node1": "127.0.0.2", "node2": "127.0.0.3"}
# A synthetic job whose result does not depend on how its ranks are spread (SGD, no dropout).
JOB = [
    "train", "synthetic", "--workers", "1", "--device", "cpu", "--preset", "tiny",
    "--optimizer", "sgd", "--dropout", "0", "--seed", "5", "--global-batch-size", "8",
    "--epochs", "10",
]


def wait_until(cond, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def names_resolve():
    try:
        return all(socket.gethostbyname(n) == a for n, a in NODES.items())
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster():
    for tool in ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: `make setup` installs slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.fail("the Slurm test runs Slurm's daemons: run `make test` as root")
    if not names_resolve():
        with open("/etc/hosts", "a") as f:
            f.write("".join(f"{a} {n}\n" for n, a in NODES.items()))
    assert names_resolve(), "node1/node2 do not resolve to 127.0.0.2/127.0.0.3"
    d = Path(tempfile.mkdtemp(prefix="tb-slurm-"))
    for sub in ("state", "spool", "log", "munge", "runs"):
        (d / sub).mkdir()
    os.chmod(d / "munge", 0o700)
    key = d / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    sock = d / "munge" / "sock"
    ctld, slurmd, *node_ports = free_ports(2 + len(NODES))
    nodes = "\n".join(
        f"NodeName={n} NodeAddr={a} NodeHostname={n} Port={port} CPUs=2 State=UNKNOWN"
        for (n, a), port in zip(NODES.items(), node_ports)
    )
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=trainbook
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/linear
ReturnToService=2
MpiDefault=none
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf), TRAINBOOK_RUNS=str(d / "runs"))
    subprocess.run(
        ["munged", "--force", f"--socket={sock}", f"--key-file={key}",
         f"--log-file={d}/munge/log", f"--pid-file={d}/munge/pid", f"--seed-file={d}/munge/seed"],
        check=True, env=env,
    )
    subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env)
    for n in NODES:
        subprocess.run(["slurmd", "-f", str(conf), "-N", n], check=True, env=env)

    def idle():
        out = subprocess.run(["sinfo", "-h", "-o", "%T %D"], env=env, capture_output=True, text=True)
        return out.stdout.split() == ["idle", "2"]

    try:
        assert wait_until(idle, 30), subprocess.run(["sinfo"], env=env, capture_output=True, text=True).stdout
        yield d, env
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        pids = [d / "slurmctld.pid", *(d / f"slurmd-{n}.pid" for n in NODES), d / "munge" / "pid"]
        for p in pids:
            try:
                pid = int(p.read_text())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            if not wait_until(lambda: not alive(pid), 10):
                os.kill(pid, signal.SIGKILL)
        left = [p for p in pids if p.exists() and alive(int(p.read_text() or 0))]
        shutil.rmtree(d, ignore_errors=True)
        assert not left, f"daemons left behind: {left}"


def alive(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def summary(text):
    """The node-0 summary among the JSON lines of both tasks."""
    lines = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    node0 = [s for s in lines if not s["run_dir"].endswith("-node1")]
    assert node0, text
    return node0[-1]


_straight = {}


def straight(env, steps):
    """The same job on one node with 2 workers (run once per step count: the tests compare
    their Slurm runs with the same reference)."""
    if steps not in _straight:
        _straight[steps] = _run_straight(env, steps)
    return _straight[steps]


def _run_straight(env, steps):
    args = [str(TRAINBOOK), *JOB, "--max-steps", str(steps), "--json"]
    args[args.index("--workers") + 1] = "2"
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def workers_of_node(name):
    """trainbook-worker processes started for Slurm node `name` (SLURMD_NODENAME)."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read()
            environ = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"trainbook-worker" in cmd and f"SLURMD_NODENAME={name}".encode() in environ:
            found.append(int(p))
    return found


def test_srun_trains_across_two_nodes_like_one_node(cluster):
    d, env = cluster
    out = subprocess.run(
        ["srun", "--nodes", "2", "--ntasks-per-node", "1", str(TRAINBOOK), *JOB,
         "--max-steps", "40", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = summary(out.stdout)
    assert s["status"] == "succeeded" and s["workers"] == 2 and s["steps"] == 40, s
    one = straight(env, 40)
    assert abs(s["param_l2"] - one["param_l2"]) <= 1e-5, (s["param_l2"], one["param_l2"])


def test_a_worker_killed_on_one_node_restarts_the_job(cluster):
    d, env = cluster
    name = "killed-worker"
    job = subprocess.Popen(
        ["srun", "--nodes", "2", "--ntasks-per-node", "1", str(TRAINBOOK), *JOB,
         "--max-steps", "200", "--checkpoint-every", "20", "--max-failures", "1",
         "--name", name, "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    ckpt = d / "runs" / name / "checkpoints" / "step-40" / "trainer_state.json"
    assert wait_until(ckpt.exists, 120), "no checkpoint at step 40"
    victims = workers_of_node("node2")
    assert victims, "no worker of node2 found"
    os.kill(victims[0], signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    s = summary(stdout)
    assert s["status"] == "succeeded", s
    assert len(s["restarts"]) == 1 and s["restarts"][0]["rank"] == 1, s["restarts"]
    assert abs(s["param_l2"] - straight(env, 200)["param_l2"]) <= 1e-5


def test_a_cancelled_job_submitted_again_resumes_from_its_checkpoint(cluster):
    d, env = cluster
    name = "requeued"
    script = d / "job.sh"
    out = d / "out"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes=2 --ntasks-per-node=1 --output={d}/sbatch-%j.log\n"
        f"srun --output={out}-%j-%t.txt --error={out}-%j-%t.err {TRAINBOOK} {' '.join(JOB)} "
        f"--max-steps 200 --checkpoint-every 20 --name {name} --resume auto --json\n"
    )

    def submit():
        r = subprocess.run(["sbatch", "--parsable", str(script)], env=env,
                           capture_output=True, text=True, check=True)
        return r.stdout.strip().split(";")[0]

    def gone(job_id):
        r = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True)
        return r.stdout.strip() == ""

    first = submit()
    ckpt = d / "runs" / name / "checkpoints" / "step-40" / "trainer_state.json"
    assert wait_until(ckpt.exists, 120), "no checkpoint at step 40"
    subprocess.run(["scancel", first], env=env, check=True)
    assert wait_until(lambda: gone(first), 60), "the cancelled job did not end"
    assert wait_until(lambda: not workers_of_node("node1") and not workers_of_node("node2"), 15)
    second = submit()
    assert wait_until(lambda: gone(second), 300), "the resubmitted job did not end"
    text = Path(f"{out}-{second}-0.txt").read_text()
    err = Path(f"{out}-{second}-0.err").read_text()
    s = summary(text)
    assert s["status"] == "succeeded", (s, err[-2000:])
    assert "resumed from" in err, err[-2000:]
    assert abs(s["param_l2"] - straight(env, 200)["param_l2"]) <= 1e-5


def test_srun_prepares_a_corpus_in_slices_into_one_set(cluster):
    """`srun trainbook prepare --slice auto`: each task tokenises its share of the shards into
    the shared --out; the set equals one prepared whole, and the last task writes the index."""
    d, env = cluster
    brown = ROOT / ".data/datasets/brown/brown.txt"
    args = ["prepare", "--data", str(brown), "--shard-mb", "1", "--json"]
    out = subprocess.run(
        ["srun", "--nodes", "2", "--ntasks-per-node", "1", str(TRAINBOOK), *args,
         "--out", str(d / "sliced"), "--slice", "auto"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    assert len(results) == 2, out.stdout
    assert any(r["pending_slices"] == [] for r in results), out.stdout
    assert "slice " in out.stdout or all(r["pending_slices"] == [] for r in results), out.stdout
    whole = subprocess.run([str(TRAINBOOK), *args, "--out", str(d / "whole")],
                           env=env, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    w = json.loads(whole.stdout.splitlines()[-1])
    assert w["shards"] >= 4, w
    tokens = lambda p: [(f.name, f.read_bytes()) for f in sorted(p.glob("*.tokens"))]
    assert tokens(d / "sliced") == tokens(d / "whole")
    index = json.loads((d / "sliced" / "index.json").read_text())
    assert index["texts"] == w["texts"] and len(index["shards"]) == w["shards"]
