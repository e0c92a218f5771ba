//! Where a vCPU may run at all: a set of host CPUs outside the engine's say (an operator's
//! pin, `virsh vcpupin` or `taskset`; the cgroup cpuset of the VM's thread, as libvirt and
//! Kubernetes' static CPU manager set it). The host refuses an affinity outside a thread's
//! cpuset, and an operator's pin must not be undone, so the engine keeps to the set: after
//! either mode has placed every vCPU, a vCPU on a CPU outside its set moves to the least
//! loaded CPU within it, and under package sharing its CPUs are its package's within the set.
//! Its load then counts where it runs, for the other vCPUs' decisions.
//!
//! vCPUs without a set are placed exactly as before, and an engine given no set does no work
//! here. A set with no CPU of the topology cannot be kept: the vCPU is placed as if it had no
//! set, and the caller, who knows the set, must not apply that placement.

use crate::cpuset::CpuSet;

use super::index::{dense, CpuIndex};
use super::{Engine, VcpuId, VcpuLoad};

impl Engine {
    /// Limits vCPU `id` to host CPUs `cpus` from the next decision on, until changed; `None`
    /// lifts the limit.
    pub fn set_allowed(&mut self, id: VcpuId, cpus: Option<CpuSet>) {
        match cpus {
            Some(cpus) => {
                self.allowed.insert(id, cpus);
            }
            None => {
                self.allowed.remove(&id);
            }
        }
    }

    /// Moves each vCPU placed outside its set to the least loaded CPU within it (ties: the
    /// CPU it ran on, then the lowest).
    pub(super) fn keep_allowed(&mut self, loads: &[VcpuLoad]) {
        if self.allowed.is_empty() {
            return;
        }
        for (i, load) in loads.iter().enumerate() {
            let Some(set) = self.allowed.get(&load.id) else {
                continue;
            };
            let l = &self.layout;
            let d = &mut self.draft;
            let chosen = d.new_cpu[i];
            if !chosen.is_none() && set.contains(l.cpu_id(chosen)) {
                continue;
            }
            let prev = self.vcpus[i].cpu;
            d.unassign(l, i);
            let best = (0..dense(l.num_cpus()))
                .map(CpuIndex)
                .filter(|c| set.contains(l.cpu_id(*c)))
                .min_by_key(|c| (d.cpu_load[c.get()], *c != prev, *c));
            match best {
                Some(c) => d.assign(l, i, c, load.busy),
                None if !chosen.is_none() => d.assign(l, i, chosen, load.busy),
                None => {}
            }
        }
    }
}
