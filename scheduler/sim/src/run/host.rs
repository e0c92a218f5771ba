//! The host topology flattened for the step loop.

use pvmm_scheduler::capacity::CAPACITY_SCALE;
use pvmm_scheduler::cpuset::CpuSet;
use pvmm_scheduler::topology::HostTopology;

use super::SimError;

/// The host flattened for the step loop.
pub(crate) struct Host {
    pub(crate) package_ids: Vec<u32>,
    pub(super) cpu_ids: Vec<u32>,
    pub(super) cpu_pkg: Vec<usize>,
    pub(super) cpu_core: Vec<usize>,
    pub(crate) cpu_capacity: Vec<u32>,
    pub(crate) cpu_threads: Vec<u32>,
    pub(crate) core_cpus: Vec<Vec<usize>>,
    pub(crate) pkg_cores: Vec<Vec<usize>>,
    /// Dense index by CPU id.
    index_of: Vec<Option<usize>>,
}

impl Host {
    pub(crate) fn new(topology: &HostTopology) -> Host {
        let mut host = Host {
            package_ids: Vec::new(),
            cpu_ids: Vec::new(),
            cpu_pkg: Vec::new(),
            cpu_core: Vec::new(),
            cpu_capacity: Vec::new(),
            cpu_threads: Vec::new(),
            core_cpus: Vec::new(),
            pkg_cores: Vec::new(),
            index_of: Vec::new(),
        };
        for (p, package) in topology.packages().iter().enumerate() {
            host.package_ids.push(package.id);
            let mut cores = Vec::new();
            for core in package.cores() {
                let core_index = host.core_cpus.len();
                let mut cpus = Vec::new();
                for &id in &core.cpus {
                    let dense = host.cpu_ids.len();
                    host.cpu_ids.push(id);
                    host.cpu_pkg.push(p);
                    host.cpu_core.push(core_index);
                    host.cpu_capacity
                        .push(topology.cpu(id).map_or(CAPACITY_SCALE, |c| c.capacity));
                    // A core's threads are distinct u32 CPU ids.
                    #[allow(clippy::cast_possible_truncation)]
                    host.cpu_threads.push(core.cpus.len() as u32);
                    let slot = id as usize;
                    if host.index_of.len() <= slot {
                        host.index_of.resize(slot + 1, None);
                    }
                    host.index_of[slot] = Some(dense);
                    cpus.push(dense);
                }
                host.core_cpus.push(cpus);
                cores.push(core_index);
            }
            host.pkg_cores.push(cores);
        }
        host
    }

    pub(super) fn num_cpus(&self) -> usize {
        self.cpu_ids.len()
    }

    /// The dense index of CPU id `id`.
    pub(super) fn dense(&self, id: u32) -> Result<usize, SimError> {
        self.index_of
            .get(id as usize)
            .copied()
            .flatten()
            .ok_or(SimError::UnknownCpu(id))
    }

    /// The dense indices of `cpus` into `out` (cleared first); an empty set is
    /// an error, as a CPU outside the topology is.
    pub(super) fn dense_set(&self, cpus: &CpuSet, out: &mut Vec<usize>) -> Result<(), SimError> {
        out.clear();
        for id in cpus {
            out.push(self.dense(id)?);
        }
        if out.is_empty() {
            return Err(SimError::UnknownCpu(u32::MAX));
        }
        Ok(())
    }
}

/// Marks a vCPU not placed yet.
pub(super) const NO_CPU: usize = usize::MAX;
