//! The host topology flattened into dense arrays, with the policy's
//! capacities: what every decision reads and none changes.

use crate::capacity::{core_capacity, thread_share, CAPACITY_SCALE, FIT_MARGIN};
use crate::policy::Policy;
use crate::topology::HostTopology;

use super::index::{dense, CpuIndex, PkgIndex};

/// The topology flattened into dense arrays, with the policy's capacities.
/// Dense CPU order is package, core, thread ([`CpuIndex`]), so each
/// package's and each core's CPUs form a contiguous range.
#[derive(Debug, Clone, Default)]
pub(super) struct Layout {
    /// Package id of each dense package.
    pkg_id: Vec<u32>,
    /// First dense CPU of each package, plus the total at the end.
    pub(super) pkg_cpu_start: Vec<u32>,
    /// First core index of each package, plus the total at the end.
    pub(super) pkg_core_start: Vec<u32>,
    /// First dense CPU of each core, plus the total at the end.
    pub(super) core_cpu_start: Vec<u32>,
    /// CPU id of each dense CPU.
    cpu_id: Vec<u32>,
    pub(super) cpu_pkg: Vec<PkgIndex>,
    pub(super) cpu_core: Vec<u32>,
    pub(super) cpu_capacity: Vec<u32>,
    pub(super) cpu_threads: Vec<u32>,
    /// Spread mode's capacities.
    pub(super) spread: SpreadCapacity,
    /// Pack mode's slots.
    pub(super) slots: Slots,
}

/// Spread mode's capacities: every CPU, core and package with all of its
/// threads busy, and which of them are alike (so that loads compare without
/// dividing by capacity).
#[derive(Debug, Clone, Default)]
pub(super) struct SpreadCapacity {
    /// Each CPU's share of its core.
    pub(super) cpu_cap: Vec<u64>,
    pub(super) core_cap: Vec<u64>,
    pub(super) pkg_cap: Vec<u64>,
    /// Whether all cores of a package have the same capacity.
    pub(super) pkg_uniform_cores: Vec<bool>,
    /// Whether all threads of a core have the same capacity.
    pub(super) core_uniform_threads: Vec<bool>,
    /// Whether all packages have the same capacity.
    pub(super) uniform_pkgs: bool,
    /// All of the above: comparing loads relative to capacity is comparing
    /// loads at every level (spread mode's constant-time stay test).
    pub(super) uniform: bool,
    /// Every package, every core and every CPU have the same capacity as
    /// their likes (loads compare across levels' members).
    pub(super) equal_caps: bool,
}

/// Pack mode's slots, in fit units (capacity x 1024): one thread per core
/// for `balance`, every logical CPU for the other policies.
#[derive(Debug, Clone, Default)]
pub(super) struct Slots {
    /// Each CPU's slot; 0 = not a slot.
    pub(super) cpu: Vec<u64>,
    /// Sum of each package's slots.
    pub(super) pkg_total: Vec<u64>,
    /// Largest slot of each package.
    pub(super) pkg_max: Vec<u64>,
    /// Largest slot of the host.
    pub(super) host_max: u64,
    /// Sum of all slots.
    pub(super) total: u64,
    /// Dense CPUs in packing order; package p's are at its `pkg_cpu_start` range.
    pub(super) pack_order: Vec<CpuIndex>,
}

impl Layout {
    pub(super) fn new(topology: &HostTopology, policy: Policy) -> Layout {
        let mut l = Layout::default();
        for package in topology.packages() {
            l.add_package(topology, package, policy);
        }
        l.pkg_cpu_start.push(dense(l.cpu_id.len()));
        l.pkg_core_start.push(dense(l.core_cpu_start.len()));
        l.core_cpu_start.push(dense(l.cpu_id.len()));
        l.spread.core_uniform_threads = (0..l.num_cores())
            .map(|k| {
                let caps = &l.spread.cpu_cap
                    [l.core_cpu_start[k] as usize..l.core_cpu_start[k + 1] as usize];
                caps.iter().all(|c| *c == caps[0])
            })
            .collect();
        l.spread.uniform_pkgs = l.spread.pkg_cap.iter().all(|c| *c == l.spread.pkg_cap[0]);
        let all_equal = |caps: &[u64]| caps.iter().all(|c| *c == caps[0]);
        l.spread.equal_caps = all_equal(&l.spread.pkg_cap)
            && all_equal(&l.spread.core_cap)
            && all_equal(&l.spread.cpu_cap);
        l.spread.uniform = l.spread.uniform_pkgs
            && l.spread.pkg_uniform_cores.iter().all(|u| *u)
            && l.spread.core_uniform_threads.iter().all(|u| *u);
        l
    }

    /// Appends one package: its cores and CPUs, their capacities and slots,
    /// and its CPUs' packing order.
    fn add_package(
        &mut self,
        topology: &HostTopology,
        package: &crate::topology::Package,
        policy: Policy,
    ) {
        let l = self;
        l.pkg_id.push(package.id);
        l.pkg_cpu_start.push(dense(l.cpu_id.len()));
        l.pkg_core_start.push(dense(l.core_cpu_start.len()));
        let pkg_index = PkgIndex(dense(l.pkg_id.len()) - 1);
        let mut pkg_spread = 0u64;
        let mut pkg_fit = 0u64;
        let mut pkg_slot_max = 0u64;
        let first_cpu = l.cpu_id.len();
        for core in package.cores() {
            let core_index = dense(l.core_cpu_start.len());
            l.core_cpu_start.push(dense(l.cpu_id.len()));
            let threads = dense(core.cpus.len());
            let thread_cap = core
                .cpus
                .iter()
                .filter_map(|id| topology.cpu(*id))
                .map(|c| c.capacity)
                .max()
                .unwrap_or(CAPACITY_SCALE);
            let core_cap = u64::from(core_capacity(thread_cap, threads));
            l.spread.core_cap.push(core_cap);
            pkg_spread += core_cap;
            for (thread, id) in core.cpus.iter().enumerate() {
                let capacity = topology.cpu(*id).map_or(thread_cap, |c| c.capacity);
                l.cpu_id.push(*id);
                l.cpu_pkg.push(pkg_index);
                l.cpu_core.push(core_index);
                l.cpu_capacity.push(capacity);
                l.cpu_threads.push(threads);
                let share = u64::from(thread_share(capacity, threads, threads));
                l.spread.cpu_cap.push(share);
                let slot_capacity = match policy {
                    Policy::Balance if thread == 0 => u64::from(capacity),
                    Policy::Balance => 0,
                    Policy::Performance | Policy::Powersaving { .. } => share,
                };
                let slot = slot_capacity * u64::from(CAPACITY_SCALE);
                l.slots.cpu.push(slot);
                pkg_fit += slot;
                pkg_slot_max = pkg_slot_max.max(slot);
            }
        }
        let mut order: Vec<CpuIndex> = (dense(first_cpu)..dense(l.cpu_id.len()))
            .map(CpuIndex)
            .collect();
        if matches!(policy, Policy::Balance) {
            // One thread per core first: every core's thread 0, then thread 1, ...
            let thread_of = |c: CpuIndex| {
                let core = l.cpu_core[c.get()] as usize;
                c.0 - l.core_cpu_start[core]
            };
            order.sort_by_key(|c| (thread_of(*c), *c));
        }
        l.slots.pack_order.extend(order);
        let core_caps = &l.spread.core_cap[l.pkg_core_start[pkg_index.get()] as usize..];
        l.spread
            .pkg_uniform_cores
            .push(core_caps.iter().all(|c| *c == core_caps[0]));
        l.spread.pkg_cap.push(pkg_spread);
        l.slots.pkg_total.push(pkg_fit);
        l.slots.pkg_max.push(pkg_slot_max);
        l.slots.total += pkg_fit;
        l.slots.host_max = l.slots.host_max.max(pkg_slot_max);
    }

    /// The dense index of CPU id `id`, if the topology has it.
    pub(super) fn cpu_index(&self, id: u32) -> Option<CpuIndex> {
        self.cpu_id
            .iter()
            .position(|&c| c == id)
            .map(|i| CpuIndex(dense(i)))
    }

    /// The dense index of package id `id`, if the topology has it.
    pub(super) fn pkg_index(&self, id: u32) -> Option<PkgIndex> {
        self.pkg_id
            .iter()
            .position(|&p| p == id)
            .map(|p| PkgIndex(dense(p)))
    }

    /// The CPU id of dense CPU `c`.
    pub(super) fn cpu_id(&self, c: CpuIndex) -> u32 {
        self.cpu_id[c.get()]
    }

    /// The package id of dense package `p`.
    pub(super) fn pkg_id(&self, p: PkgIndex) -> u32 {
        self.pkg_id[p.get()]
    }

    /// The dense package of dense CPU `c`.
    pub(super) fn pkg_of(&self, c: CpuIndex) -> PkgIndex {
        self.cpu_pkg[c.get()]
    }

    /// Package `p`'s CPUs in packing order.
    pub(super) fn pkg_pack_order(&self, p: PkgIndex) -> &[CpuIndex] {
        let p = p.get();
        &self.slots.pack_order[self.pkg_cpu_start[p] as usize..self.pkg_cpu_start[p + 1] as usize]
    }

    /// Fit demand of weight `w` on dense CPU `c`: against its packing slot, or
    /// its whole capacity on a CPU that is not a slot (balance's sibling threads).
    pub(super) fn cpu_fit_demand(&self, c: CpuIndex, w: u64) -> u64 {
        let slot = self.slots.cpu[c.get()];
        if slot > 0 {
            fit_demand(w, slot)
        } else {
            fit_demand(
                w,
                u64::from(self.cpu_capacity[c.get()]) * u64::from(CAPACITY_SCALE),
            )
        }
    }

    /// Every package, in index order.
    pub(super) fn pkgs(&self) -> impl Iterator<Item = PkgIndex> {
        (0..dense(self.pkg_id.len())).map(PkgIndex)
    }

    pub(super) fn num_pkgs(&self) -> usize {
        self.pkg_id.len()
    }

    pub(super) fn num_cpus(&self) -> usize {
        self.cpu_id.len()
    }

    pub(super) fn num_cores(&self) -> usize {
        self.spread.core_cap.len()
    }
}

/// Fit demand of weight `w` against a slot of `slot` fit units: the weight
/// with the fit rule's 20 % headroom ([`FIT_MARGIN`]), but never more than
/// the slot (an always-busy vCPU fills one slot; it cannot use headroom).
pub(super) fn fit_demand(w: u64, slot: u64) -> u64 {
    (w * FIT_MARGIN).min(slot)
}

/// Whether weight `w` fits a CPU slot of `slot` fit units already filled to
/// `filled` (a slot of 0 takes nothing).
pub(super) fn slot_fits(filled: u64, w: u64, slot: u64) -> bool {
    slot > 0 && filled + fit_demand(w, slot) <= slot
}

/// `a_num / a_den < b_num / b_den` for non-negative values, dens > 0.
pub(super) fn ratio_less(a_num: u64, a_den: u64, b_num: u64, b_den: u64) -> bool {
    match (a_num.checked_mul(b_den), b_num.checked_mul(a_den)) {
        (Some(a), Some(b)) => a < b,
        _ => u128::from(a_num) * u128::from(b_den) < u128::from(b_num) * u128::from(a_den),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_demand_has_headroom_up_to_one_slot() {
        let slot = 1024 * u64::from(CAPACITY_SCALE);
        // 20 % headroom: two vCPUs of 409 fit one CPU's slot, two of 410 do not.
        assert!(slot_fits(fit_demand(409, slot), 409, slot));
        assert!(!slot_fits(fit_demand(410, slot), 410, slot));
        // An always-busy vCPU fills a slot: it fits an empty one, without headroom.
        assert_eq!(fit_demand(1024, slot), slot);
        assert!(slot_fits(0, 1024, slot));
        assert!(!slot_fits(fit_demand(16, slot), 1024, slot));
        assert!(
            !slot_fits(0, 16, 0),
            "a CPU that is not a slot takes nothing"
        );
    }
}
