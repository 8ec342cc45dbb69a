//! Jobs of several nodes, on one machine: each "node" is its own `trainbook train` driver
//! process on its own loopback address (127.0.0.2 for node 0, 127.0.0.3 for node 1), joined
//! through node 0's rendezvous store exactly as separate machines would be.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::last_json;

const NODE0: &str = "127.0.0.2";
const NODE1: &str = "127.0.0.3";

fn runs_root() -> PathBuf {
    crate::common::scratch("trainbook-multinode-tests")
}

/// A port free on node 0's address now (the test's two drivers must agree on it beforehand,
/// as nodes do). Taken from below the kernel's ephemeral range (32768 and up by default): a
/// port-0 bind would hand out a port that any connection on the machine may take before the
/// driver binds it (tests/ports.py says the same for the Python tests). Where the scan starts
/// varies by process and time, so tests running side by side pick different ports.
fn free_port() -> u16 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0)
        ^ (std::process::id() as u64 * 2_654_435_761);
    let (low, span) = (10_000u64, 22_000u64);
    (0..span)
        .map(|i| (low + (seed + i * 7_919) % span) as u16)
        .find(|&p| std::net::TcpListener::bind((NODE0, p)).is_ok())
        .expect("no free port below 32000 on 127.0.0.2")
}

/// A synthetic job: SGD, no dropout, 20 steps of a global batch of 8.
fn job_args(workers: &str, steps: &str) -> Vec<String> {
    [
        "train",
        "synthetic",
        "--workers",
        workers,
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--optimizer",
        "sgd",
        "--dropout",
        "0",
        "--seed",
        "5",
        "--global-batch-size",
        "8",
        "--max-steps",
        steps,
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn start(args: &[String], env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainbook"));
    cmd.args(args)
        .env("TRAINBOOK_RUNS", runs_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits for a driver with a hard deadline, so a hang fails the test instead of stalling CI.
fn finish(mut child: Child, deadline: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "a node did not finish within {deadline:?}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn with_flags(mut args: Vec<String>, node: usize, port: u16) -> Vec<String> {
    let addr = if node == 0 { NODE0 } else { NODE1 };
    args.extend(
        [
            "--nnodes".to_string(),
            "2".into(),
            "--node-rank".into(),
            node.to_string(),
            "--master-addr".into(),
            NODE0.into(),
            "--master-port".into(),
            port.to_string(),
            "--node-addr".into(),
            addr.into(),
        ]
        .into_iter(),
    );
    args
}

/// Runs a 2-node job; `node_env(k)` is node k's launcher environment.
fn two_nodes(
    args: impl Fn(usize) -> Vec<String>,
    node_env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> (Output, Output) {
    // Node 1 first: its driver waits for node 0's rendezvous like a node booted early.
    let n1 = start(&args(1), &node_env(1));
    std::thread::sleep(Duration::from_millis(300));
    let n0 = start(&args(0), &node_env(0));
    let out0 = finish(n0, Duration::from_secs(180));
    let out1 = finish(n1, Duration::from_secs(30));
    (out0, out1)
}

fn checkpoint(s: &serde_json::Value) -> PathBuf {
    PathBuf::from(s["last_checkpoint"].as_str().expect("a last checkpoint"))
}

/// 2 nodes x 1 worker end where 1 node x 1 worker ends, and node 0 tells the whole job.
#[test]
fn two_nodes_train_like_one() {
    let port = free_port();
    let (out0, out1) = two_nodes(|k| with_flags(job_args("1", "20"), k, port), |_| vec![]);
    let err1 = String::from_utf8_lossy(&out1.stderr);
    assert!(
        out0.status.success(),
        "node 0 failed: {}\nnode 1: {err1}",
        String::from_utf8_lossy(&out0.stderr)
    );
    assert!(out1.status.success(), "node 1 failed: {err1}");
    assert!(err1.contains("node 1 of 2, ranks 1-1 of 2"), "{err1}");
    let s0 = last_json(&out0);
    assert_eq!(s0["status"], "succeeded");
    assert_eq!(s0["workers"], 2);
    assert_eq!(s0["steps"], 20);

    // Node 0's run directory holds every rank's log; node 1's keeps node 0's run name.
    let run0 = PathBuf::from(s0["run_dir"].as_str().unwrap());
    let rank1 = std::fs::read_to_string(run0.join("logs/rank1.log")).unwrap();
    assert!(
        rank1.contains("loss"),
        "rank 1's lines reach node 0: {rank1}"
    );
    let run1 = PathBuf::from(last_json(&out1)["run_dir"].as_str().unwrap());
    assert_eq!(
        run1.file_name().unwrap().to_string_lossy(),
        format!("{}-node1", run0.file_name().unwrap().to_string_lossy())
    );

    trains_like_one_worker(&s0, &job_args("1", "20"));
}

/// The job `one` (one node, one worker) ends with the parameters of `summary`'s job (1e-5).
fn trains_like_one_worker(summary: &serde_json::Value, one: &[String]) {
    let one = finish(start(one, &[]), Duration::from_secs(120));
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let max_diff = crate::common::max_abs_diff(
        &checkpoint(summary).join("model.safetensors"),
        &checkpoint(&last_json(&one)).join("model.safetensors"),
    );
    assert!(max_diff <= 1e-5, "max abs parameter difference {max_diff}");
    eprintln!("max abs parameter difference to one worker: {max_diff:e}");
}

/// Killing node 1's worker fails node 0's job, which names global rank 1 and the signal.
#[test]
fn a_worker_killed_on_node_1_fails_node_0_naming_its_rank() {
    let port = free_port();
    let n1 = start(&with_flags(job_args("1", "100000"), 1, port), &[]);
    let n0 = start(&with_flags(job_args("1", "100000"), 0, port), &[]);
    // Wait until node 1's worker trains (its log has a loss line on node 0).
    let t0 = Instant::now();
    let worker = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "node 1 never started"
        );
        let started = std::fs::read_dir(runs_root()).unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("logs/rank1.log"))
                .map(|l| l.contains("loss"))
                .unwrap_or(false)
        });
        if let (true, Some(&w)) = (
            started,
            trainbook::engine::testing::children_of(n1.id()).first(),
        ) {
            break w;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out0 = finish(n0, Duration::from_secs(60));
    let out1 = finish(n1, Duration::from_secs(30));
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "node 0 took {:?} to fail",
        killed.elapsed()
    );
    assert!(!out0.status.success());
    assert!(!out1.status.success());
    let s0 = last_json(&out0);
    assert_eq!(s0["status"], "failed");
    let error = s0["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("rank 1") && error.contains("SIGKILL"),
        "node 0 names the killed rank: {error}"
    );
}

/// Node 1's driver killed (its workers die with it): node 0 fails within seconds and names
/// node 1 as lost, not its own rank 0 whose connection closed.
#[test]
fn node_1_s_driver_killed_is_named_lost_by_node_0() {
    let port = free_port();
    let name = format!("lost-node-{}", std::process::id());
    let named = |node| {
        let mut a = with_flags(job_args("1", "100000"), node, port);
        a.extend(["--name".to_string(), name.clone()]);
        a
    };
    let mut n1 = start(&named(1), &[]);
    let n0 = start(&named(0), &[]);
    let log = runs_root().join(&name).join("logs/rank1.log");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("loss")) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "node 1 never trained"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed = Instant::now();
    n1.kill().unwrap();
    n1.wait().unwrap();
    let out0 = finish(n0, Duration::from_secs(60));
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "node 0 took {took:?} to fail"
    );
    assert!(!out0.status.success());
    let error = last_json(&out0)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        error.starts_with("node 1 was lost: its driver stopped reporting"),
        "node 0 names the lost node: {error}"
    );
    assert!(error.contains("rank 0 exit code 1"), "{error}");
    std::fs::remove_dir_all(runs_root().join(&name)).ok();
    std::fs::remove_dir_all(runs_root().join(format!("{name}-node1"))).ok();
}

/// The command of node `k` of a named 2-node job that may restart once (300 steps, a step
/// checkpoint every 20).
fn restartable_nodes(name: &str) -> impl Fn(usize) -> Vec<String> + '_ {
    let port = free_port();
    move |node| {
        let mut a = with_flags(job_args("1", "300"), node, port);
        a.extend(
            [
                "--name",
                name,
                "--max-failures",
                "1",
                "--checkpoint-every",
                "20",
            ]
            .map(String::from),
        );
        a
    }
}

/// Waits for node 0's checkpoint of step `step` of the run `name`.
fn wait_for_checkpoint(name: &str, step: u64) {
    let path = runs_root()
        .join(name)
        .join(format!("checkpoints/step-{step}/trainer_state.json"));
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no checkpoint at step {step}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With `--max-failures 1`, node 1's driver killed and then run again: node 0 names the lost
/// node, restarts the job from its newest checkpoint once node 1 is back, and both end with the
/// parameters of the same job on one node.
#[test]
fn a_lost_node_rejoins_and_the_job_restarts_and_succeeds() {
    let name = format!("rejoin-{}", std::process::id());
    let named = restartable_nodes(&name);
    let mut n1 = start(&named(1), &[]);
    let n0 = start(&named(0), &[]);
    wait_for_checkpoint(&name, 40);
    n1.kill().unwrap();
    n1.wait().unwrap();
    // The same command on node 1 again, as a person or a requeue would.
    std::thread::sleep(Duration::from_millis(500));
    let n1 = start(&named(1), &[]);
    let out0 = finish(n0, Duration::from_secs(120));
    let out1 = finish(n1, Duration::from_secs(60));
    let s0 = last_json(&out0);
    assert!(
        out0.status.success() && out1.status.success(),
        "node 0: {}\nnode 1: {}",
        String::from_utf8_lossy(&out0.stderr),
        String::from_utf8_lossy(&out1.stderr)
    );
    let restarts = s0["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 1, "{s0}");
    assert_eq!(restarts[0]["reason"], "node 1 lost", "{s0}");
    assert!(restarts[0]["resumed_step"].as_u64().unwrap() >= 40, "{s0}");
    // The same job on one node, unbroken.
    let mut one = job_args("2", "300");
    one.extend(["--runs-root".to_string(), runs_root().display().to_string()]);
    let straight = last_json(&finish(start(&one, &[]), Duration::from_secs(120)));
    let (a, b) = (
        s0["param_l2"].as_f64().unwrap(),
        straight["param_l2"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    std::fs::remove_dir_all(runs_root().join(&name)).ok();
    std::fs::remove_dir_all(runs_root().join(format!("{name}-node1"))).ok();
}

/// With `--max-failures 1`, a worker killed on node 1: node 0 restarts the job, node 1's driver
/// follows with a new worker, and both succeed.
#[test]
fn a_worker_killed_on_node_1_restarts_both_nodes() {
    let name = format!("both-restart-{}", std::process::id());
    let named = restartable_nodes(&name);
    let n1 = start(&named(1), &[]);
    let n0 = start(&named(0), &[]);
    wait_for_checkpoint(&name, 40);
    let worker = trainbook::engine::testing::children_of(n1.id())[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out0 = finish(n0, Duration::from_secs(120));
    let out1 = finish(n1, Duration::from_secs(60));
    assert!(
        out0.status.success() && out1.status.success(),
        "node 0: {}\nnode 1: {}",
        String::from_utf8_lossy(&out0.stderr),
        String::from_utf8_lossy(&out1.stderr)
    );
    let s0 = last_json(&out0);
    let restarts = s0["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 1, "{s0}");
    assert_eq!(restarts[0]["rank"], 1, "{s0}");
    std::fs::remove_dir_all(runs_root().join(&name)).ok();
    std::fs::remove_dir_all(runs_root().join(format!("{name}-node1"))).ok();
}

/// Node ranks and node 0's address from the variables of `srun --ntasks-per-node=1` and of
/// Open MPI's `mpirun --map-by ppr:1:node`, with no topology flags.
#[test]
fn slurm_and_open_mpi_environments_place_the_nodes() {
    let slurm = |port: u16| {
        move |k: usize| {
            vec![
                ("SLURM_PROCID", k.to_string()),
                ("SLURM_NTASKS", "2".to_string()),
                ("SLURM_NNODES", "2".to_string()),
                ("SLURM_NODEID", k.to_string()),
                // Node 0 is the list's first host.
                ("SLURM_JOB_NODELIST", "127.0.0.[2-3]".to_string()),
                ("MASTER_PORT", port.to_string()),
            ]
        }
    };
    let mpi = |port: u16| {
        move |k: usize| {
            vec![
                ("OMPI_COMM_WORLD_RANK", k.to_string()),
                ("OMPI_COMM_WORLD_SIZE", "2".to_string()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "1".to_string()),
                ("MASTER_ADDR", NODE0.to_string()),
                ("MASTER_PORT", port.to_string()),
            ]
        }
    };
    for (launcher, env) in [
        (
            "slurm",
            Box::new(slurm(free_port())) as Box<dyn Fn(usize) -> _>,
        ),
        ("open mpi", Box::new(mpi(free_port()))),
    ] {
        let (out0, out1) = two_nodes(|_| job_args("1", "4"), &env);
        let err1 = String::from_utf8_lossy(&out1.stderr);
        assert!(
            out0.status.success() && out1.status.success(),
            "{launcher}: node 0: {}\nnode 1: {err1}",
            String::from_utf8_lossy(&out0.stderr)
        );
        assert!(
            err1.contains("node 1 of 2, ranks 1-1 of 2, rendezvous at 127.0.0.2"),
            "{launcher}: {err1}"
        );
        let s0 = last_json(&out0);
        assert_eq!(s0["workers"], 2, "{launcher}");
        assert_eq!(s0["steps"], 4, "{launcher}");
    }
}

/// A node that cannot reach node 0 says where it looked and what to check, within the
/// collective timeout, instead of hanging.
#[test]
fn a_node_without_node_0_fails_with_what_to_check() {
    let mut args = with_flags(job_args("1", "4"), 1, free_port());
    args.extend(["--collective-timeout".to_string(), "3".into()]);
    let t0 = Instant::now();
    let out = finish(start(&args, &[]), Duration::from_secs(60));
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not reach node 0's rendezvous at 127.0.0.2"),
        "{err}"
    );
}

/// Open MPI's real `mpirun` (Debian's openmpi-bin, which `make setup` installs) starting one
/// driver per "node". Both tasks run on this machine, so each is told it is alone on its node
/// (OMPI_COMM_WORLD_LOCAL_SIZE=1) and binds its own loopback address, as two machines would.
#[test]
fn real_mpirun_starts_a_two_node_job() {
    let mpirun = ["/usr/bin/mpirun", "/usr/local/bin/mpirun"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("mpirun is missing: `make setup` installs Debian's openmpi-bin");
    let dir = runs_root().join(format!("mpirun-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = job_args("1", "4").join(" ");
    let script = format!(
        "OMPI_COMM_WORLD_LOCAL_SIZE=1 exec {} {args} --node-addr 127.0.0.$((2 + OMPI_COMM_WORLD_RANK)) \
         > {dir}/node$OMPI_COMM_WORLD_RANK.out 2> {dir}/node$OMPI_COMM_WORLD_RANK.err",
        env!("CARGO_BIN_EXE_trainbook"),
        dir = dir.display()
    );
    let port = free_port().to_string();
    let child = Command::new(mpirun)
        .args(["--oversubscribe", "-np", "2"])
        .args([
            "-x",
            "MASTER_ADDR",
            "-x",
            "MASTER_PORT",
            "-x",
            "TRAINBOOK_RUNS",
        ])
        .args(["sh", "-c", &script])
        .env("MASTER_ADDR", NODE0)
        .env("MASTER_PORT", &port)
        .env("TRAINBOOK_RUNS", runs_root())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(child, Duration::from_secs(180));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    assert!(
        out.status.success(),
        "mpirun: {}\nnode 0: {}\nnode 1: {}",
        String::from_utf8_lossy(&out.stderr),
        read("node0.err"),
        read("node1.err")
    );
    assert!(read("node1.err").contains("node 1 of 2, ranks 1-1 of 2"));
    let s0: serde_json::Value =
        serde_json::from_str(read("node0.out").lines().last().unwrap_or_default()).unwrap();
    assert_eq!(s0["status"], "succeeded");
    assert_eq!(s0["workers"], 2);
}

/// 16 ranks for real: 8 nodes (each its own driver on its own loopback address, 127.0.0.2 to
/// 127.0.0.9) x 2 workers end where 1 worker ends with the same global batch, and node 0
/// tells the whole job. The rendezvous, the event stream and the drivers' node checks at a
/// size no other test reaches.
#[test]
fn eight_nodes_of_two_workers_train_like_one() {
    const NODES: usize = 8;
    let port = free_port();
    let job = |workers: &str| {
        let mut a = job_args(workers, "10");
        let batch = a.iter().position(|s| s == "--global-batch-size").unwrap() + 1;
        a[batch] = "16".into();
        a
    };
    let node_args = |k: usize| loopback_node(job("2"), k, port, &NODES.to_string());
    // Nodes 7..1 first, waiting for node 0's rendezvous like nodes booted early.
    let others: Vec<Child> = (1..NODES)
        .rev()
        .map(|k| start(&node_args(k), &[]))
        .collect();
    let n0 = start(&node_args(0), &[]);
    let out0 = finish(n0, Duration::from_secs(240));
    let outs: Vec<Output> = others
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();
    let err0 = String::from_utf8_lossy(&out0.stderr);
    assert!(out0.status.success(), "node 0 failed: {err0}");
    for (i, out) in outs.iter().enumerate() {
        let k = NODES - 1 - i;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "node {k} failed: {err}");
        let first = 2 * k;
        assert!(
            err.contains(&format!(
                "node {k} of {NODES}, ranks {first}-{} of 16",
                first + 1
            )),
            "{err}"
        );
    }
    let s0 = last_json(&out0);
    assert_eq!(s0["status"], "succeeded");
    assert_eq!(s0["workers"], 16);
    assert_eq!(s0["steps"], 10);
    let run0 = PathBuf::from(s0["run_dir"].as_str().unwrap());
    for rank in [0, 7, 15] {
        let log = std::fs::read_to_string(run0.join(format!("logs/rank{rank}.log"))).unwrap();
        assert!(
            log.contains("loss"),
            "rank {rank}'s lines reach node 0: {log}"
        );
    }

    trains_like_one_worker(&s0, &job("1"));
}

/// A node's stderr, line by line as it comes, with when each line came.
fn timed_lines(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>> {
    use std::io::BufRead;
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap();
    let into = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            into.lock().unwrap().push((Instant::now(), line));
        }
    });
    lines
}

/// An elastic job's synthetic training: `steps` of a global batch of `batch` on `workers`
/// workers a node, 4 epochs, one thread each.
fn elastic_job(workers: &str, steps: &str, batch: &str) -> Vec<String> {
    let mut a = job_args(workers, steps);
    let at = a.iter().position(|s| s == "--global-batch-size").unwrap() + 1;
    a[at] = batch.into();
    a.extend(["--epochs", "4", "--threads", "1"].map(String::from));
    a
}

/// `job` as node `k` of `nnodes` on one machine: each node binds its own loopback address
/// (127.0.0.2 for node 0), node 0's rendezvous on `port`.
fn loopback_node(mut job: Vec<String>, k: usize, port: u16, nnodes: &str) -> Vec<String> {
    job.extend(
        [
            "--nnodes",
            nnodes,
            "--node-rank",
            &k.to_string(),
            "--master-addr",
            NODE0,
            "--master-port",
            &port.to_string(),
            "--node-addr",
            &format!("127.0.0.{}", k + 2),
        ]
        .map(String::from),
    );
    job
}

/// The command of node `k` of the elastic run `name` (`--nnodes range`), with its restarts
/// and checkpoint interval.
fn elastic_node(
    job: Vec<String>,
    k: usize,
    (port, name): (u16, &str),
    (range, failures, every): (&str, &str, &str),
) -> Vec<String> {
    let mut a = loopback_node(job, k, port, range);
    a.extend(
        [
            "--name",
            name,
            "--max-failures",
            failures,
            "--checkpoint-every",
            every,
        ]
        .map(String::from),
    );
    a
}

/// The elastic job of the acceptance: 4 nodes, `--nnodes 2:4 --max-failures 2`; node 3's
/// driver (and with it its worker) killed at step 100. The job goes on with 3 nodes from its
/// step-100 checkpoint within 5 s, takes node 3 back at the next checkpoint once its command
/// runs again, succeeds on 4 nodes, and ends with the parameters of one worker training the
/// same global batches unbroken (the sampler's order does not depend on the number of ranks).
#[test]
fn an_elastic_job_goes_on_without_a_lost_node_and_takes_it_back_at_a_checkpoint() {
    const NODES: usize = 4;
    let port = free_port();
    let name = format!("elastic-{}", std::process::id());
    // 12 samples a step split over 2, 3 or 4 workers alike.
    let job = |workers: &str| elastic_job(workers, "300", "12");
    let node_args = |k: usize| elastic_node(job("1"), k, (port, &name), ("2:4", "2", "20"));
    let mut others: Vec<Child> = (1..NODES)
        .rev()
        .map(|k| start(&node_args(k), &[]))
        .collect();
    let mut n0 = start(&node_args(0), &[]);
    let said = timed_lines(&mut n0);
    wait_for_checkpoint(&name, 100);
    // Node 3 (started first, so last in the list) dies with its worker.
    let mut n3 = others.remove(0);
    n3.kill().unwrap();
    n3.wait().unwrap();
    let killed = Instant::now();
    let when = |text: &str| {
        let t0 = Instant::now();
        loop {
            if let Some((at, _)) = said.lock().unwrap().iter().find(|(_, l)| l.contains(text)) {
                return *at;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "node 0 never said '{text}'"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let shrunk = when("resized: 4 -> 3 workers on nodes 0, 1, 2 (node 3 lost)");
    // Rank 0's worker of the new start says so once it has loaded the checkpoint, just
    // before its first step.
    let resumed = when("(rank 0) resumed from");
    let took = resumed.saturating_duration_since(killed);
    assert!(
        took < Duration::from_secs(5),
        "the job went on with 3 nodes {took:?} after the loss"
    );
    eprintln!(
        "went on with 3 nodes {:?} (new start) and {took:?} (resumed) after node 3 was lost",
        shrunk.saturating_duration_since(killed)
    );
    // The same command on node 3 again, as a person or a requeue would.
    let n3 = start(&node_args(3), &[]);
    when("resized: 3 -> 4 workers on nodes 0, 1, 2, 3 (node 3 joined)");
    let out0 = finish(n0, Duration::from_secs(180));
    let err0: Vec<String> = said
        .lock()
        .unwrap()
        .iter()
        .map(|(_, l)| l.clone())
        .collect();
    assert!(out0.status.success(), "node 0 failed: {}", err0.join("\n"));
    for (k, out) in [(3, finish(n3, Duration::from_secs(60)))]
        .into_iter()
        .chain(
            others
                .into_iter()
                .zip([2, 1])
                .map(|(c, k)| (k, finish(c, Duration::from_secs(60)))),
        )
    {
        assert!(
            out.status.success(),
            "node {k} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s0 = last_json(&out0);
    assert_eq!(s0["status"], "succeeded");
    assert_eq!(s0["workers"], 4, "{s0}");
    assert_eq!(s0["steps"], 300, "{s0}");
    let resizes = s0["resizes"].as_array().unwrap();
    assert_eq!(resizes.len(), 2, "{s0}");
    assert_eq!(resizes[0]["reason"], "node 3 lost", "{s0}");
    assert_eq!(resizes[0]["resumed_step"], 100, "{s0}");
    assert_eq!(resizes[1]["reason"], "node 3 joined", "{s0}");
    assert!(resizes[1]["resumed_step"].as_u64().unwrap() > 100, "{s0}");
    assert_eq!(s0["restarts"].as_array().unwrap().len(), 1, "{s0}");

    trains_like_one_worker(&s0, &job("1"));
    std::fs::remove_dir_all(runs_root().join(&name)).ok();
    for k in 1..NODES {
        std::fs::remove_dir_all(runs_root().join(format!("{name}-node{k}"))).ok();
    }
}

/// 16 ranks of an elastic job (8 loopback nodes x 2 workers, `--nnodes 4:8`) lose node 5, in
/// the middle: the job goes on with 7 nodes (14 ranks, nodes 6 and 7 renumbered down) from its
/// newest checkpoint and ends with one worker's parameters. A global batch of 112 splits over
/// 16 and 14 workers alike.
#[test]
fn sixteen_elastic_ranks_go_on_with_seven_nodes_when_one_is_killed() {
    const NODES: usize = 8;
    let port = free_port();
    let name = format!("elastic16-{}", std::process::id());
    let job = |workers: &str| elastic_job(workers, "40", "112");
    let node_args = |k: usize| elastic_node(job("2"), k, (port, &name), ("4:8", "1", "10"));
    let mut others: Vec<(usize, Child)> = (1..NODES)
        .rev()
        .map(|k| (k, start(&node_args(k), &[])))
        .collect();
    let n0 = start(&node_args(0), &[]);
    wait_for_checkpoint(&name, 10);
    let at = others.iter().position(|(k, _)| *k == 5).unwrap();
    let (_, mut n5) = others.remove(at);
    n5.kill().unwrap();
    n5.wait().unwrap();
    let out0 = finish(n0, Duration::from_secs(240));
    let err0 = String::from_utf8_lossy(&out0.stderr);
    assert!(out0.status.success(), "node 0 failed: {err0}");
    for (k, c) in others {
        let out = finish(c, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "node {k} failed: {err}");
    }
    let s0 = last_json(&out0);
    assert_eq!(s0["workers"], 14, "{s0}");
    assert_eq!(s0["steps"], 40, "{s0}");
    let resizes = s0["resizes"].as_array().unwrap();
    assert_eq!(resizes.len(), 1, "{s0}");
    assert_eq!(resizes[0]["reason"], "node 5 lost", "{s0}");
    assert_eq!(
        resizes[0]["nodes"],
        serde_json::json!([0, 1, 2, 3, 4, 6, 7])
    );
    // Node 7's workers are ranks 12 and 13 now; their lines reach node 0.
    let run0 = PathBuf::from(s0["run_dir"].as_str().unwrap());
    let log = std::fs::read_to_string(run0.join("logs/rank13.log")).unwrap();
    assert!(log.contains("loss"), "{log}");

    trains_like_one_worker(&s0, &job("1"));
    std::fs::remove_dir_all(runs_root().join(&name)).ok();
    for k in 1..NODES {
        std::fs::remove_dir_all(runs_root().join(format!("{name}-node{k}"))).ok();
    }
}
