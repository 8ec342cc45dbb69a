//! Where this process sits in a job of several machines, read from the launcher that started
//! it: Slurm's `srun`, Open MPI's or MPICH's `mpirun`, or torchrun.
//!
//! trainbook runs one *driver* per node, never one process per worker under the launcher: the
//! driver starts its node's workers itself (exec, own process group, death signal), captures
//! their output, assigns their devices, and on node 0 gathers every rank's events into one
//! dashboard. So a launcher starts one task per node (`srun --ntasks-per-node=1`, `mpirun
//! --map-by ppr:1:node`, `torchrun --nproc-per-node 1`), and its task rank is the node rank.
//! A launcher that started one task per device is refused with the line that fixes it, since
//! the drivers would otherwise start `workers` workers each on top.

use anyhow::{bail, Result};

/// The port node 0's rendezvous store listens on when nodes must agree on it beforehand
/// (torch.distributed's customary default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// A node's place in a job of several machines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: usize,
    pub node_rank: usize,
    /// Node 0's address, when the launcher tells it (Slurm's first host, torchrun's
    /// MASTER_ADDR, or MASTER_ADDR exported by hand).
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    /// Which launcher's variables these came from, for messages ("slurm", "open mpi", ...).
    pub source: &'static str,
}

impl Topology {
    /// Reads this process's environment; `Ok(None)` when no launcher started it. Slurm node
    /// lists are expanded with `scontrol show hostnames` where it is installed.
    pub fn from_env() -> Result<Option<Self>> {
        Self::detect(&|k| std::env::var(k).ok(), &scontrol_first_host)
    }

    /// [`Topology::from_env`] with the environment and the host-list expansion as parameters.
    pub fn detect(
        var: &dyn Fn(&str) -> Option<String>,
        first_host: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>> {
        let env = Launch::read(var)?;
        if let Some(t) = env.slurm(first_host)? {
            return Ok(Some(t));
        }
        if let Some(t) = env.open_mpi()? {
            return Ok(Some(t));
        }
        if let Some(t) = env.mpich()? {
            return Ok(Some(t));
        }
        env.torchrun()
    }
}

/// The environment a launcher gave this process, read one launcher at a time.
struct Launch<'a> {
    var: &'a dyn Fn(&str) -> Option<String>,
    master_port: Option<u16>,
    master_addr: Option<String>,
}

impl<'a> Launch<'a> {
    fn read(var: &'a dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let master_port = match var("MASTER_PORT") {
            None => None,
            Some(p) => match p.trim().parse() {
                Ok(p) => Some(p),
                Err(_) => bail!("MASTER_PORT={p:?} is not a port number"),
            },
        };
        Ok(Launch {
            var,
            master_port,
            master_addr: var("MASTER_ADDR").filter(|a| !a.is_empty()),
        })
    }

    fn num(&self, name: &str) -> Result<Option<usize>> {
        match (self.var)(name) {
            None => Ok(None),
            Some(v) => match v.trim().parse() {
                Ok(n) => Ok(Some(n)),
                Err(_) => bail!("{name}={v:?} is not a number"),
            },
        }
    }

    fn first_of(&self, names: &[&str]) -> Result<Option<usize>> {
        for n in names {
            if let Some(v) = self.num(n)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// Slurm: srun sets SLURM_PROCID and SLURM_NTASKS for every task of a step.
    fn slurm(&self, first_host: &dyn Fn(&str) -> Option<String>) -> Result<Option<Topology>> {
        let (Some(rank), Some(tasks)) = (self.num("SLURM_PROCID")?, self.num("SLURM_NTASKS")?)
        else {
            return Ok(None);
        };
        let nodes = self
            .first_of(&[
                "SLURM_STEP_NUM_NODES",
                "SLURM_NNODES",
                "SLURM_JOB_NUM_NODES",
            ])?
            .unwrap_or(tasks);
        one_per_node(
            "srun",
            tasks,
            nodes,
            "launch with `srun --ntasks-per-node=1 trainbook train ... --workers <devices per node>`",
        )?;
        let list = [
            "SLURM_STEP_NODELIST",
            "SLURM_JOB_NODELIST",
            "SLURM_NODELIST",
        ]
        .iter()
        .find_map(|k| (self.var)(k));
        Ok(Some(Topology {
            nodes,
            node_rank: rank,
            master_addr: self
                .master_addr
                .clone()
                .or_else(|| list.and_then(|l| first_host(&l))),
            master_port: self.master_port,
            source: "slurm",
        }))
    }

    /// Open MPI's mpirun.
    fn open_mpi(&self) -> Result<Option<Topology>> {
        let (Some(rank), Some(size)) = (
            self.num("OMPI_COMM_WORLD_RANK")?,
            self.num("OMPI_COMM_WORLD_SIZE")?,
        ) else {
            return Ok(None);
        };
        if let Some(local) = self.num("OMPI_COMM_WORLD_LOCAL_SIZE")? {
            one_per_node(
                "mpirun",
                local,
                1,
                "launch with `mpirun --map-by ppr:1:node trainbook train ...`",
            )?;
        }
        Ok(Some(self.mpi(size, rank, "open mpi")))
    }

    /// MPICH and Intel MPI (the Hydra process manager).
    fn mpich(&self) -> Result<Option<Topology>> {
        let (Some(rank), Some(size)) = (self.num("PMI_RANK")?, self.num("PMI_SIZE")?) else {
            return Ok(None);
        };
        if let Some(local) = self.num("MPI_LOCALNRANKS")? {
            one_per_node(
                "mpirun",
                local,
                1,
                "launch with `mpirun -ppn 1 trainbook train ...`",
            )?;
        }
        Ok(Some(self.mpi(size, rank, "mpich")))
    }

    fn mpi(&self, nodes: usize, node_rank: usize, source: &'static str) -> Topology {
        Topology {
            nodes,
            node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            source,
        }
    }

    /// torchrun: GROUP_RANK is the node's rank; one process per node means the world size
    /// counts nodes.
    fn torchrun(&self) -> Result<Option<Topology>> {
        let (Some(group), Some(world)) = (self.num("GROUP_RANK")?, self.num("WORLD_SIZE")?) else {
            return Ok(None);
        };
        let local = self.num("LOCAL_WORLD_SIZE")?.unwrap_or(1);
        one_per_node(
            "torchrun",
            local,
            1,
            "launch with `torchrun --nproc-per-node 1 --no-python trainbook train ...`",
        )?;
        Ok(Some(Topology {
            nodes: world,
            node_rank: group,
            master_addr: self.master_addr.clone(),
            // torchrun's own store listens on MASTER_PORT: trainbook's takes the next one.
            master_port: self.master_port.map(|p| p.wrapping_add(1)),
            source: "torchrun",
        }))
    }
}

/// trainbook runs one driver per node, which starts that node's workers itself.
fn one_per_node(source: &str, tasks: usize, nodes: usize, fix: &str) -> Result<()> {
    if tasks != nodes {
        bail!(
            "{source} started {tasks} tasks on {nodes} node(s), but trainbook runs one driver per node, which starts that node's workers itself: {fix}"
        );
    }
    Ok(())
}

/// The first host of a Slurm host list, by `scontrol show hostnames` where Slurm is installed,
/// else by reading the list's syntax ([`first_hostlist_entry`]).
fn scontrol_first_host(list: &str) -> Option<String> {
    std::process::Command::new("scontrol")
        .args(["show", "hostnames", list])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .or_else(|| first_hostlist_entry(list))
}

/// The first host of a Slurm host list such as `gpu[07-10,12],login1`: `gpu07` (leading zeros
/// kept, every bracket group taken at its first value).
pub fn first_hostlist_entry(list: &str) -> Option<String> {
    let mut depth = 0i32;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let mut host = list[..end].trim().to_string();
    while let Some(open) = host.find('[') {
        let close = open + host[open..].find(']')?;
        let first = host[open + 1..close].split([',', '-']).next()?.to_string();
        host = format!("{}{first}{}", &host[..open], &host[close + 1..]);
    }
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect(vars: &[(&str, &str)]) -> Result<Option<Topology>> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Topology::detect(&|k| env.get(k).cloned(), &first_hostlist_entry)
    }

    #[test]
    fn no_launcher_means_no_topology() {
        assert_eq!(detect(&[("HOME", "/root")]).unwrap(), None);
    }

    #[test]
    fn srun_one_task_per_node_gives_node_rank_and_the_first_host() {
        let t = detect(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "gaudi[07-08]"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            t,
            Topology {
                nodes: 2,
                node_rank: 1,
                master_addr: Some("gaudi07".into()),
                master_port: None,
                source: "slurm",
            }
        );
    }

    #[test]
    fn master_addr_and_port_in_the_environment_win_over_the_node_list() {
        let t = detect(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NNODES", "2"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29999"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.master_addr.as_deref(), Some("10.0.0.5"));
        assert_eq!(t.master_port, Some(29999));
    }

    #[test]
    fn srun_with_a_task_per_device_is_refused_with_the_fix() {
        let e = detect(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_NNODES", "2"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("16 tasks on 2 node(s)"), "{e}");
        assert!(e.contains("--ntasks-per-node=1"), "{e}");
    }

    #[test]
    fn open_mpi_ranks_are_node_ranks() {
        let t = detect(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
            ("MASTER_ADDR", "head"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((t.nodes, t.node_rank, t.source), (4, 2, "open mpi"));
        assert_eq!(t.master_addr.as_deref(), Some("head"));
        let e = detect(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("ppr:1:node"), "{e}");
    }

    #[test]
    fn mpich_hydra_ranks_are_node_ranks() {
        let t = detect(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALNRANKS", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((t.nodes, t.node_rank, t.source), (3, 1, "mpich"));
        assert_eq!(t.master_addr, None);
    }

    #[test]
    fn torchrun_group_rank_is_the_node_rank_and_its_port_stays_torchruns() {
        let t = detect(&[
            ("GROUP_RANK", "1"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "10.1.1.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((t.nodes, t.node_rank), (2, 1));
        assert_eq!(t.master_port, Some(29501));
        assert!(detect(&[
            ("GROUP_RANK", "0"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "4")
        ])
        .unwrap_err()
        .to_string()
        .contains("--nproc-per-node 1"));
    }

    #[test]
    fn a_garbled_variable_is_named() {
        let e = detect(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_PROCID"), "{e}");
    }

    #[test]
    fn host_lists_expand_to_their_first_host() {
        for (list, first) in [
            ("node1", "node1"),
            ("node1,node2", "node1"),
            ("gpu[07-10,12],login1", "gpu07"),
            ("rack[2-3]-n[001-004]", "rack2-n001"),
            ("127.0.0.[2-3]", "127.0.0.2"),
            ("a[5]", "a5"),
        ] {
            assert_eq!(first_hostlist_entry(list).as_deref(), Some(first), "{list}");
        }
        assert_eq!(first_hostlist_entry(""), None);
        assert_eq!(first_hostlist_entry("bad[1-2"), None);
    }
}
