//! Capacity on the kernel's 1024 scale: how much work a CPU, a core, a group of
//! CPUs or a vCPU's share of a CPU can do, and the constants of the fit rule
//! and of "clearly greater" that the placement engine applies.

use crate::cpuset::CpuSet;
use crate::topology::HostTopology;
pub use crate::topology::CAPACITY_SCALE;

/// Capacity of a whole SMT core when its threads are all busy: the kernel's
/// `smt_gain` (1178, i.e. SMT adds about 15 % throughput; each of two busy
/// siblings gets about 589).
pub const SMT_GAIN: u32 = 1178;

/// The fit rule's multiplier, after the kernel's `fits_capacity`
/// (`util * 1280 < capacity * 1024`, i.e. under 80 %): 20 % headroom absorbs
/// PELT's lag and bursts before a CPU saturates. The packing policies count a
/// vCPU's *fit demand* as `util * FIT_MARGIN`, capped at one CPU slot
/// (`capacity * CAPACITY_SCALE`): an always-busy vCPU fills a slot and cannot
/// use headroom (`placement`'s module documentation).
pub const FIT_MARGIN: u64 = 1280;

/// `capacity_greater(a, b)` multiplier: `a` is meaningfully greater than `b`
/// when `a * 1024 > b * 1078`, about 5 % (the kernel's `capacity_greater`);
/// smaller differences are noise and must not trigger moves.
pub const CAPACITY_GREATER_MARGIN: u64 = 1078;

/// True when `a` is more than about 5 % greater than `b` ([`CAPACITY_GREATER_MARGIN`]).
pub fn capacity_greater(a: u64, b: u64) -> bool {
    a * u64::from(CAPACITY_SCALE) > b * CAPACITY_GREATER_MARGIN
}

/// Capacity of a core with `threads` hardware threads each of capacity
/// `thread_capacity` (alone), when all of them are busy: SMT adds
/// [`SMT_GAIN`]/1024, it does not multiply by the thread count.
pub fn core_capacity(thread_capacity: u32, threads: u32) -> u32 {
    if threads <= 1 {
        thread_capacity
    } else {
        let core = (u64::from(thread_capacity) * u64::from(SMT_GAIN)) / u64::from(CAPACITY_SCALE);
        u32::try_from(core).unwrap_or(u32::MAX)
    }
}

/// Capacity one thread gets when `busy_threads` of its core's `threads` are
/// busy: the whole thread capacity when it runs alone, else an equal share of
/// [`core_capacity`].
pub fn thread_share(thread_capacity: u32, threads: u32, busy_threads: u32) -> u32 {
    if busy_threads <= 1 || threads <= 1 {
        thread_capacity
    } else {
        (core_capacity(thread_capacity, threads) / busy_threads.min(threads)).max(1)
    }
}

/// What a host CPU offers the vCPUs on it: the effective capacity of a vCPU
/// from its placement, what it can get if it runs flat out now. The CPU
/// offers [`thread_share`] (less when an SMT sibling is busy); the other vCPUs
/// there use some of it; the vCPU gets what they leave, but never less than an
/// equal share (the host scheduler's fairness when all of them run). So a busy
/// vCPU sharing a CPU with idle ones keeps nearly all of it, and k busy vCPUs
/// get 1/k each. Always at least 1.
///
/// The part that depends on the CPU only is computed once per CPU
/// ([`CpuOffer::new`]) rather than once per vCPU (two integer divisions each,
/// 7 % of a 10,000-vCPU decision); [`CpuOffer::for_vcpu`] adds the vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuOffer {
    /// The CPU's [`thread_share`].
    share: u32,
    /// An equal share of it among the vCPUs on it.
    fair: u32,
}

impl CpuOffer {
    /// What a CPU of `thread_capacity`, on a core of `threads` threads of
    /// which `busy_threads` are busy, offers the `vcpus_on_cpu` vCPUs on it.
    pub fn new(thread_capacity: u32, threads: u32, busy_threads: u32, vcpus_on_cpu: u32) -> Self {
        let share = thread_share(thread_capacity, threads, busy_threads);
        CpuOffer {
            share,
            fair: share / vcpus_on_cpu.max(1),
        }
    }

    /// What the CPU offers its `vcpus_on_cpu` vCPUs (the count it was made
    /// for) when work that is no vCPU's takes `taken` of it: the share less
    /// `taken` (at least 1), and an equal share of that. With `taken` 0, the
    /// same offer.
    pub fn less(self, taken: u32, vcpus_on_cpu: u32) -> Self {
        let share = self.share.saturating_sub(taken).max(1);
        CpuOffer {
            share,
            fair: share / vcpus_on_cpu.max(1),
        }
    }

    /// The effective capacity of one of its vCPUs when the others use
    /// `others_util`.
    pub fn for_vcpu(&self, others_util: u64) -> u32 {
        let left = u32::try_from(others_util).map_or(0, |others| self.share.saturating_sub(others));
        self.fair.max(left).max(1)
    }
}

/// Capacity of a group of CPUs (a package, a die, an allowed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupCapacity {
    /// Throughput with every thread busy: sum over cores of [`core_capacity`].
    pub capacity: u32,
    /// Physical cores with at least one CPU in the group.
    pub cores: u32,
    /// Logical CPUs in the group.
    pub cpus: u32,
}

/// Capacity of the CPUs of `cpus` that exist in `topology`.
pub fn group_capacity(topology: &HostTopology, cpus: &CpuSet) -> GroupCapacity {
    let mut group = GroupCapacity::default();
    for package in topology.packages() {
        for core in package.cores() {
            let mut in_group = 0u32;
            let mut thread_capacity = 0u32;
            for id in core.cpus.iter().filter(|c| cpus.contains(**c)) {
                in_group += 1;
                if let Some(cpu) = topology.cpu(*id) {
                    thread_capacity = thread_capacity.max(cpu.capacity);
                }
            }
            if in_group > 0 {
                group.cores += 1;
                group.cpus += in_group;
                group.capacity += core_capacity(thread_capacity, in_group);
            }
        }
    }
    group
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearly_greater_is_about_five_percent() {
        assert!(capacity_greater(1100, 1024));
        assert!(!capacity_greater(1070, 1024));
        assert!(capacity_greater(1079, 1024)); // 1079 * 1024 > 1024 * 1078
        assert!(!capacity_greater(1078, 1024));
    }

    #[test]
    fn smt_sharing() {
        assert_eq!(core_capacity(1024, 2), 1178);
        assert_eq!(thread_share(1024, 2, 1), 1024);
        assert_eq!(thread_share(1024, 2, 2), 589);
        let offer = |cap, threads, busy, vcpus, others| {
            CpuOffer::new(cap, threads, busy, vcpus).for_vcpu(others)
        };
        assert_eq!(offer(1024, 2, 2, 2, 1024), 294);
        assert_eq!(offer(1024, 1, 1, 4, 3 * 1024), 256);
        assert_eq!(offer(1024, 1, 1, 4, 3 * 16), 976, "idle sharers leave most");
        assert_eq!(offer(1024, 1, 1, 1, 0), 1024);
        assert_eq!(offer(1, 1, 1, 8, 7), 1);
        let less = |vcpus, taken, others| {
            CpuOffer::new(1024, 1, 1, vcpus)
                .less(taken, vcpus)
                .for_vcpu(others)
        };
        assert_eq!(less(1, 0, 0), 1024);
        assert_eq!(less(4, 0, 3 * 1024), 256);
        assert_eq!(less(1, 256, 0), 768);
        assert_eq!(less(2, 256, 1024), 384, "the rest is shared");
        assert_eq!(less(1, 2000, 0), 1);
    }

    #[test]
    fn group_capacity_shares_smt_cores() {
        let topo = HostTopology::from_spec("1x4x2").unwrap();
        let group = group_capacity(&topo, &topo.cpu_set());
        assert_eq!(group.capacity, 4 * 1178, "SMT adds 15 %, not a core");
        assert_eq!(group.cores, 4);
        assert_eq!(group.cpus, 8);
        let one_thread_each = group_capacity(&topo, &"0-3".parse().unwrap());
        assert_eq!(one_thread_each.capacity, 4096);
        assert_eq!(one_thread_each.cores, 4);
    }
}
