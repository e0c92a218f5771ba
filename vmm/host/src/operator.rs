//! Never fight an operator. A foreign vCPU thread's affinity that changes to something the
//! daemon did not set (`virsh vcpupin`, `taskset`, a cgroup write that narrowed its cpuset)
//! is an operator's pin: the daemon stops moving that vCPU, counts it as load on the CPUs it is
//! pinned to (the engine places it within them: [`pvmm_scheduler::Engine::set_allowed`]),
//! and shows it as pinned. Once the pin is widened again to every CPU the vCPU may use, the
//! daemon takes it back.
//!
//! Every other foreign vCPU is bounded by its cgroup's cpuset within the CPUs the daemon
//! places on, which the engine keeps to as well.

use std::collections::HashMap;

use pvmm_scheduler::{CpuSet, VcpuId};

/// What the daemon knows of one foreign vCPU thread's pinning (kept in its
/// [`crate::threads::ThreadRecord`]).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OperatorPin {
    /// The CPUs the operator left it, while pinned.
    pinned: Option<CpuSet>,
    /// Its bound when first seen: every CPU it may use while nobody pins it.
    home: Option<CpuSet>,
    /// Its bound at the last look.
    last_bound: Option<CpuSet>,
}

impl OperatorPin {
    /// Looks at the thread as it is now: `affinity`, within `bound` (its cpuset within the
    /// daemon's CPUs). A pin is an affinity other than the one the daemon last set
    /// (`applied`), or a cpuset narrowed from what the thread had when first seen (`virsh
    /// vcpupin` narrows both, and may pin to the CPU the daemon chose). A pin forgets
    /// `applied`, so that the daemon's next setting is compared afresh after an unpin; it ends
    /// when both the affinity and the cpuset cover the first-seen bound again.
    pub fn observe(
        &mut self,
        affinity: Option<&CpuSet>,
        bound: &CpuSet,
        applied: &mut Option<CpuSet>,
    ) {
        let Some(affinity) = affinity else {
            return;
        };
        let home = self.home.get_or_insert_with(|| bound.clone()).clone();
        let last = self.last_bound.replace(bound.clone());
        let widened = home.is_subset(affinity) && home.is_subset(bound);
        let moved_by_others = applied.as_ref().is_some_and(|set| set != affinity);
        let narrowed = last.is_some_and(|l| l != *bound) && !home.is_subset(bound);
        if widened {
            self.pinned = None;
        } else if self.pinned.is_some() || moved_by_others || narrowed {
            *applied = None;
            self.pinned = Some(affinity.intersection(bound));
        }
    }

    /// Whether an operator has pinned the thread.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// The CPUs the engine must keep the thread to: its pin, or `bound` where that is
    /// narrower than `all`, the daemon's CPUs.
    pub fn limit(&self, bound: &CpuSet, all: &CpuSet) -> Option<CpuSet> {
        match &self.pinned {
            Some(pin) if !pin.is_empty() => Some(pin.clone()),
            _ => (bound != all).then(|| bound.clone()),
        }
    }
}

/// The limits (pins, cpusets) the engine has been told, by vCPU.
#[derive(Debug, Default)]
pub struct EngineLimits {
    /// The limit the engine holds for each vCPU that has one.
    told: HashMap<VcpuId, CpuSet>,
}

impl EngineLimits {
    /// Tells the engine (through `tell`) the limits in `wanted` that it does not hold yet, and
    /// lifts those it holds that are no longer wanted; with `fresh`, the engine holds none.
    pub fn tell(
        &mut self,
        fresh: bool,
        wanted: HashMap<VcpuId, CpuSet>,
        tell: &mut dyn FnMut(VcpuId, Option<CpuSet>),
    ) {
        if fresh {
            self.told.clear();
        }
        for id in self.told.keys() {
            if !wanted.contains_key(id) {
                tell(*id, None);
            }
        }
        for (id, set) in &wanted {
            if self.told.get(id) != Some(set) {
                tell(*id, Some(set.clone()));
            }
        }
        self.told = wanted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[u32]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    #[test]
    fn a_change_the_daemon_did_not_make_is_a_pin_until_widened() {
        let all = set(&[0, 1, 2, 3]);
        let mut pins = OperatorPin::default();
        let mut applied = Some(set(&[0]));
        // As the daemon left it: nothing to see.
        pins.observe(Some(&set(&[0])), &all, &mut applied);
        assert!(!pins.is_pinned());
        // virsh vcpupin ... 0 2
        pins.observe(Some(&set(&[2])), &all, &mut applied);
        assert!(pins.is_pinned());
        assert_eq!(pins.limit(&all, &all), Some(set(&[2])));
        assert!(applied.is_none(), "the daemon's setting is forgotten");
        // Pinned again, elsewhere.
        pins.observe(Some(&set(&[1, 2])), &all, &mut applied);
        assert_eq!(pins.limit(&all, &all), Some(set(&[1, 2])));
        // Widened to every CPU: taken back.
        pins.observe(Some(&all), &all, &mut applied);
        assert!(!pins.is_pinned());
        assert_eq!(pins.limit(&all, &all), None);
        // A thread the daemon never set is nobody's pin.
        let mut other = OperatorPin::default();
        other.observe(Some(&set(&[3])), &all, &mut None);
        assert!(!other.is_pinned());
    }

    #[test]
    fn a_cpuset_bounds_without_pinning() {
        let all = set(&[0, 1, 2, 3]);
        let bound = set(&[2, 3]);
        let mut pins = OperatorPin::default();
        let mut applied = Some(set(&[2]));
        pins.observe(Some(&bound), &bound, &mut applied);
        assert!(!pins.is_pinned(), "widened to its whole cpuset");
        assert_eq!(pins.limit(&bound, &all), Some(bound));
    }

    #[test]
    fn a_narrowed_cpuset_is_a_pin_even_onto_the_daemons_own_choice() {
        let all = set(&[0, 1]);
        let mut pins = OperatorPin::default();
        let mut applied = Some(set(&[1]));
        pins.observe(Some(&set(&[1])), &all, &mut applied);
        assert!(!pins.is_pinned());
        // virsh vcpupin ... 0 1: the cgroup's cpuset becomes {1}, the affinity stays {1}.
        pins.observe(Some(&set(&[1])), &set(&[1]), &mut applied);
        assert!(pins.is_pinned());
        assert_eq!(pins.limit(&set(&[1]), &all), Some(set(&[1])));
        // virsh vcpupin ... 0 0-1: both widen again.
        pins.observe(Some(&all), &all, &mut applied);
        assert!(!pins.is_pinned());
    }

    #[test]
    fn the_engine_is_told_each_change_once_and_everything_when_fresh() {
        let id = |vcpu| VcpuId { vm: 0, vcpu };
        let mut pins = EngineLimits::default();
        let mut told = Vec::new();
        let mut tell = |id: VcpuId, set: Option<CpuSet>| told.push((id.vcpu, set));
        pins.tell(false, HashMap::from([(id(0), set(&[1]))]), &mut tell);
        pins.tell(false, HashMap::from([(id(0), set(&[1]))]), &mut tell);
        pins.tell(true, HashMap::from([(id(0), set(&[1]))]), &mut tell);
        pins.tell(false, HashMap::new(), &mut tell);
        assert_eq!(
            told,
            vec![(0, Some(set(&[1]))), (0, Some(set(&[1]))), (0, None)]
        );
    }
}
