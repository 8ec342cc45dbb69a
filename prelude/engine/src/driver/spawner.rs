//! Starting this node's workers for each [`Start`] of the job. The environment through which a
//! worker receives its place in the job (torch's env:// variables and trainbook's,
//! [`crate::shared::env`]) is built here and only here: what is fixed for the job
//! ([`WorkerEnv`]) and what each start sets (ranks, world size, attempt, checkpoint).

use std::path::PathBuf;
use std::sync::mpsc;

use trainbook_api::{DeviceKind, JobSpec};

use super::incoming::Incoming;
use super::membership::{self, Membership};
use super::placement;
use super::processes::{WorkerCommand, Workers};
use super::rendezvous::{self, Node, Start};
use crate::shared::env;
use crate::shared::run_dir::RunDir;
use crate::worker::dist::Store;

/// What every worker of this node is told whatever the start: where the job's rendezvous and
/// event stream are, its run directory, device and threads.
pub(super) struct WorkerEnv {
    master_addr: String,
    master_port: u16,
    events: String,
    token: String,
    run_dir: RunDir,
    device: DeviceKind,
    threads: usize,
    /// The address gloo binds to (several nodes, or several on one machine).
    node_addr: Option<String>,
    /// The workers on this node.
    local_world: usize,
    /// The program's own variables (a task's), then the job's `env`: they may override the
    /// ones above, not the start's.
    extra: Vec<(String, String)>,
}

impl WorkerEnv {
    pub(super) fn new(node: &Node, program_env: Vec<(String, String)>) -> WorkerEnv {
        let spec = &node.config.spec;
        let threads = match node.device {
            DeviceKind::Cpu => spec
                .threads_per_worker
                .unwrap_or_else(|| placement::cpu_threads_per_worker(spec.workers)),
            _ => spec.threads_per_worker.unwrap_or(4),
        };
        let node_addr = spec.node_addr.clone().or_else(|| {
            // Several nodes on one machine (tests, trials) share loopback: each binds the
            // address it was given, else the master's.
            rendezvous::is_loopback(&spec.master_addr).then(|| spec.master_addr.clone())
        });
        let mut extra = Vec::new();
        // The step profiler's Kineto logs its own start, stop and (on a machine without a
        // GPU) a failed GPU count as errors to stderr: kept out of the job's log unless the
        // user asks for them.
        if std::env::var_os("KINETO_LOG_LEVEL").is_none() {
            extra.push(("KINETO_LOG_LEVEL".into(), "6".into()));
        }
        extra.extend(visible_devices_env(
            node.device,
            spec.visible_devices.as_deref(),
        ));
        extra.extend(program_env);
        extra.extend(spec.env.iter().cloned());
        WorkerEnv {
            master_addr: spec.master_addr.clone(),
            master_port: node.store.port(),
            events: node.events.clone(),
            token: node.token.clone(),
            run_dir: node.run_dir.clone(),
            device: node.device,
            threads,
            node_addr,
            local_world: spec.workers,
            extra,
        }
    }

    /// The variables of the worker with local rank `local`, global rank `rank`, on the node
    /// at `place` among the start's nodes.
    fn vars(
        &self,
        local: usize,
        rank: usize,
        place: usize,
        world: usize,
        start: &Start,
    ) -> Vec<(String, String)> {
        let threads = self.threads.to_string();
        let mut vars: Vec<(String, String)> = vec![
            ("LOCAL_RANK".into(), local.to_string()),
            ("LOCAL_WORLD_SIZE".into(), self.local_world.to_string()),
            ("MASTER_ADDR".into(), self.master_addr.clone()),
            ("MASTER_PORT".into(), self.master_port.to_string()),
            (env::AGENT_STORE.into(), "1".into()),
            (env::EVENTS.into(), self.events.clone()),
            (env::TOKEN.into(), self.token.clone()),
            (env::RUN_DIR.into(), self.run_dir.display().to_string()),
            (
                env::CONFIG.into(),
                self.run_dir.config().display().to_string(),
            ),
            (env::DEVICE.into(), self.device.name().into()),
            (env::THREADS.into(), threads.clone()),
            ("OMP_NUM_THREADS".into(), threads.clone()),
            ("MKL_NUM_THREADS".into(), threads),
        ];
        if let Some(a) = &self.node_addr {
            vars.push((env::NODE_ADDR.into(), a.clone()));
        }
        vars.extend(self.extra.iter().cloned());
        vars.extend([
            ("RANK".into(), rank.to_string()),
            ("WORLD_SIZE".into(), world.to_string()),
            ("GROUP_RANK".into(), place.to_string()),
            ("NODE_RANK".into(), place.to_string()),
            (env::ATTEMPT.into(), start.attempt.to_string()),
        ]);
        if let Some(r) = &start.resume {
            vars.push((env::RESUME.into(), r.display().to_string()));
        }
        vars
    }
}

/// The variable that gives a job's workers their devices (see `JobSpec::visible_devices`):
/// local rank i then uses the i-th listed id, as CUDA and the Gaudi bridge number them.
fn visible_devices_env(device: DeviceKind, ids: Option<&[usize]>) -> Option<(String, String)> {
    let var = match device {
        DeviceKind::Cuda => "CUDA_VISIBLE_DEVICES",
        DeviceKind::Hpu => "HABANA_VISIBLE_MODULES",
        DeviceKind::Cpu => return None,
    };
    let list: Vec<String> = ids?.iter().map(ToString::to_string).collect();
    Some((var.into(), list.join(",")))
}

/// Starts this node's workers for a start of the job: their program and environment, where
/// their output goes, and the rendezvous store through which the nodes agree on each start.
pub(super) struct Spawner {
    program: PathBuf,
    cwd: PathBuf,
    env: WorkerEnv,
    tx: mpsc::Sender<Incoming>,
    pub(super) store: Store,
    /// This node (`--node-rank`), the job's most nodes and the workers each runs.
    node: usize,
    nodes: usize,
    workers: usize,
}

impl Spawner {
    /// The spawner of this node's workers of `spec`, running `program` with `env`, their
    /// output going to `tx`.
    pub(super) fn new(
        spec: &JobSpec,
        program: PathBuf,
        env: WorkerEnv,
        tx: mpsc::Sender<Incoming>,
        store: Store,
    ) -> Spawner {
        Spawner {
            program,
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            env,
            tx,
            store,
            node: spec.node_rank,
            nodes: spec.nodes,
            workers: spec.workers,
        }
    }

    /// Starts the workers for `start`: its attempt (0: the first), the checkpoint it resumes
    /// from, and the ranks this node's workers have among its nodes.
    pub(super) fn spawn(&self, start: &Start) -> anyhow::Result<Workers> {
        let members = Membership::new(&start.members, self.nodes, self.workers);
        let (Some(ranks), Some(place)) = (members.ranks(self.node), members.place(self.node))
        else {
            anyhow::bail!(
                "node {} is not one of the nodes of start {} ({})",
                self.node,
                start.attempt,
                membership::list(members.nodes())
            );
        };
        let cmds = ranks
            .enumerate()
            .map(|(local, rank)| WorkerCommand {
                rank,
                program: self.program.clone(),
                env: self.env.vars(local, rank, place, members.world(), start),
                cwd: self.cwd.clone(),
            })
            .collect();
        let tx = self.tx.clone();
        Workers::spawn(cmds, move |r| tx.send(Incoming::Raw(r)).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_go_to_the_variable_of_the_device() {
        let ids = [2, 3];
        assert_eq!(
            visible_devices_env(DeviceKind::Cuda, Some(&ids)),
            Some(("CUDA_VISIBLE_DEVICES".into(), "2,3".into()))
        );
        assert_eq!(
            visible_devices_env(DeviceKind::Hpu, Some(&ids)),
            Some(("HABANA_VISIBLE_MODULES".into(), "2,3".into()))
        );
        assert_eq!(visible_devices_env(DeviceKind::Cpu, Some(&ids)), None);
        assert_eq!(visible_devices_env(DeviceKind::Cuda, None), None);
    }

    #[test]
    fn a_start_sets_the_ranks_and_may_not_be_overridden_by_the_job_env() {
        let env = WorkerEnv {
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            events: "tcp://10.0.0.1:5555".into(),
            token: "t".into(),
            run_dir: RunDir::new("/runs/r"),
            device: DeviceKind::Cpu,
            threads: 3,
            node_addr: None,
            local_world: 2,
            extra: vec![
                ("RANK".into(), "99".into()),
                ("OMP_NUM_THREADS".into(), "1".into()),
            ],
        };
        let start = Start {
            attempt: 2,
            resume: Some(PathBuf::from("/runs/r/checkpoints/step-4")),
            members: vec![],
        };
        let vars = env.vars(1, 3, 1, 4, &start);
        let last = |k: &str| {
            vars.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            last("RANK"),
            Some("3"),
            "the start's rank wins over the job's env"
        );
        assert_eq!(
            last("OMP_NUM_THREADS"),
            Some("1"),
            "the job's env wins over trainbook's"
        );
        assert_eq!(last("LOCAL_RANK"), Some("1"));
        assert_eq!(last("WORLD_SIZE"), Some("4"));
        assert_eq!(last(env::ATTEMPT), Some("2"));
        assert_eq!(last(env::CONFIG), Some("/runs/r/config.json"));
        assert_eq!(last(env::RESUME), Some("/runs/r/checkpoints/step-4"));
    }
}
