//! Where concurrent trials run, without overlap. On HPU and CUDA each trial takes whole
//! devices (as many as it has workers), given to its workers through the job's visible devices;
//! on CPU each trial takes an equal share of the cores, its workers' thread count set so the
//! trials together use the cores once. A trial that does not fit waits for one to end.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use trainbook_api::DeviceKind;
use trainbook_api::JobSpec;
use trainbook_api::SweepSpec;

/// The machine's room for trials and who holds it.
pub(crate) struct Slots {
    /// Trials at once.
    capacity: usize,
    /// Devices not held by a trial (empty on CPU).
    free: Vec<usize>,
    /// Each running trial's devices.
    held: BTreeMap<usize, Vec<usize>>,
    /// Intra-op threads per worker on CPU.
    threads: Option<usize>,
    accelerator: bool,
    describe: String,
}

/// Devices (or nothing, on CPU) taken for a trial that has not started yet.
pub(crate) struct Lease(Vec<usize>);

impl Slots {
    pub(crate) fn new(spec: &SweepSpec, device: DeviceKind) -> Result<Slots> {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let devices = match device {
            DeviceKind::Cpu => None,
            DeviceKind::Cuda => Some(crate::driver::placement::cuda_device_count()),
            DeviceKind::Hpu => crate::driver::placement::probe_hpu().device_count,
        };
        Self::plan(spec, device, cores, devices)
    }

    /// The slots for `spec` on a machine of `cores` cores and `devices` accelerators of kind
    /// `device` (`None`: not known, taken to be the workers of one trial).
    fn plan(
        spec: &SweepSpec,
        device: DeviceKind,
        cores: usize,
        devices: Option<usize>,
    ) -> Result<Slots> {
        let workers = spec.base.workers.max(1);
        let asked = spec.concurrent.max(1);
        if device == DeviceKind::Cpu {
            let fit = (cores / workers).max(1);
            let capacity = asked.min(fit);
            let threads = spec
                .base
                .threads_per_worker
                .unwrap_or_else(|| (cores / (capacity * workers)).max(1));
            let describe = if capacity < asked {
                format!(
                    "{capacity} at a time ({asked} asked; {cores} cores, {workers} worker(s) each)"
                )
            } else {
                format!("{capacity} at a time")
            };
            return Ok(Slots {
                capacity,
                free: Vec::new(),
                held: BTreeMap::new(),
                threads: Some(threads),
                accelerator: false,
                describe,
            });
        }
        let pool: Vec<usize> = match &spec.base.visible_devices {
            Some(ids) => ids.clone(),
            None => (0..devices.unwrap_or(workers)).collect(),
        };
        if pool.len() < workers {
            bail!(
                "each trial needs {workers} {} devices, but {} are available: use fewer workers per trial",
                device.name(),
                pool.len()
            );
        }
        let capacity = asked.min(pool.len() / workers);
        let describe = if capacity < asked {
            format!(
                "{capacity} at a time ({asked} asked; {} {} devices, {workers} per trial)",
                pool.len(),
                device.name()
            )
        } else {
            format!("{capacity} at a time")
        };
        Ok(Slots {
            capacity,
            free: pool,
            held: BTreeMap::new(),
            threads: None,
            accelerator: true,
            describe,
        })
    }

    /// "2 at a time", with why fewer than asked when so.
    pub(crate) fn describe(&self) -> String {
        self.describe.clone()
    }

    /// Whether another trial fits now.
    pub(crate) fn free(&self) -> bool {
        self.held.len() < self.capacity
    }

    /// Takes the room of one trial and sets `spec` to use it (devices or threads).
    pub(crate) fn take(&mut self, spec: &mut JobSpec) -> Lease {
        if let Some(t) = self.threads {
            spec.threads_per_worker = Some(t);
        }
        if !self.accelerator {
            return Lease(Vec::new());
        }
        let n = spec.workers.max(1).min(self.free.len());
        let ids: Vec<usize> = self.free.drain(..n).collect();
        spec.visible_devices = Some(ids.clone());
        Lease(ids)
    }

    /// Records that trial `id` holds `lease` (it started).
    pub(crate) fn bind(&mut self, lease: Lease, id: usize) {
        self.held.insert(id, lease.0);
    }

    /// A lease of a trial that did not start.
    pub(crate) fn give_back(&mut self, lease: Lease) {
        self.free.extend(lease.0);
        self.free.sort_unstable();
    }

    /// Trial `id` ended: its room is free.
    pub(crate) fn release(&mut self, id: usize) {
        if let Some(ids) = self.held.remove(&id) {
            self.give_back(Lease(ids));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::Configure;
    use trainbook_api::Sweep;

    fn sweep(workers: usize, concurrent: usize) -> SweepSpec {
        Sweep::new(JobSpec::new("bert").workers(workers))
            .grid("lr", [1e-3])
            .concurrent(concurrent)
            .spec()
            .clone()
    }

    #[test]
    fn cpu_trials_share_the_cores_and_never_oversubscribe() {
        let mut s = Slots::plan(&sweep(1, 2), DeviceKind::Cpu, 8, None).unwrap();
        assert_eq!(s.describe(), "2 at a time");
        let mut spec = JobSpec::new("bert");
        let a = s.take(&mut spec);
        assert_eq!(
            spec.threads_per_worker,
            Some(4),
            "8 cores, 2 trials of 1 worker"
        );
        s.bind(a, 1);
        let b = s.take(&mut spec);
        s.bind(b, 2);
        assert!(!s.free(), "two trials fill the slots");
        s.release(1);
        assert!(s.free());
        let s = Slots::plan(&sweep(2, 4), DeviceKind::Cpu, 2, None).unwrap();
        assert_eq!(s.capacity, 1);
        assert_eq!(
            s.describe(),
            "1 at a time (4 asked; 2 cores, 2 worker(s) each)"
        );
    }

    #[test]
    fn accelerator_trials_get_disjoint_whole_devices_and_wait_for_them() {
        let mut s = Slots::plan(&sweep(2, 8), DeviceKind::Cuda, 16, Some(5)).unwrap();
        assert_eq!(s.capacity, 2, "5 devices hold two trials of 2");
        let mut one = JobSpec::new("bert").workers(2);
        let mut two = one.clone();
        let a = s.take(&mut one);
        s.bind(a, 1);
        let b = s.take(&mut two);
        s.bind(b, 2);
        assert_eq!(one.visible_devices, Some(vec![0, 1]));
        assert_eq!(two.visible_devices, Some(vec![2, 3]));
        assert_eq!(one.threads_per_worker, None);
        assert!(!s.free());
        s.release(1);
        let mut three = JobSpec::new("bert").workers(2);
        let c = s.take(&mut three);
        assert_eq!(
            three.visible_devices,
            Some(vec![0, 1]),
            "trial 1's devices again"
        );
        s.give_back(c);
        assert_eq!(s.free, [0, 1, 4]);
        let e = Slots::plan(&sweep(4, 1), DeviceKind::Hpu, 16, Some(2))
            .err()
            .unwrap();
        assert!(e.to_string().contains("needs 4 hpu devices, but 2"), "{e}");
    }
}
