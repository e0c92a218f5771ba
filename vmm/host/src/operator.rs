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

/// The operators' pins the daemon has seen, and the limits the engine has been told.
#[derive(Debug, Default)]
pub struct OperatorPins {
    /// Pinned threads, with the CPUs the operator left them.
    pinned: HashMap<i32, CpuSet>,
    /// The limit the engine holds for each vCPU that has one.
    told: HashMap<VcpuId, CpuSet>,
    /// Each thread's bound when first seen: every CPU it may use while nobody pins it.
    home: HashMap<i32, CpuSet>,
    /// Each thread's bound at the last look.
    last_bound: HashMap<i32, CpuSet>,
}

impl OperatorPins {
    /// Looks at foreign vCPU thread `tid` as it is now: `affinity`, within `bound` (its
    /// cpuset within the daemon's CPUs). A pin is an affinity other than the one the daemon
    /// last set (`applied`), or a cpuset narrowed from what the thread had when first seen
    /// (`virsh vcpupin` narrows both, and may pin to the CPU the daemon chose). A pin forgets
    /// `applied`, so that the daemon's next setting is compared afresh after an unpin; it
    /// ends when both the affinity and the cpuset cover the first-seen bound again.
    pub fn observe(
        &mut self,
        tid: i32,
        affinity: Option<&CpuSet>,
        bound: &CpuSet,
        applied: &mut HashMap<i32, CpuSet>,
    ) {
        let Some(affinity) = affinity else {
            return;
        };
        let home = self
            .home
            .entry(tid)
            .or_insert_with(|| bound.clone())
            .clone();
        let last = self.last_bound.insert(tid, bound.clone());
        let widened = home.is_subset(affinity) && home.is_subset(bound);
        let moved_by_others = applied.get(&tid).is_some_and(|set| set != affinity);
        let narrowed = last.is_some_and(|l| l != *bound) && !home.is_subset(bound);
        if widened {
            self.pinned.remove(&tid);
        } else if self.pinned.contains_key(&tid) || moved_by_others || narrowed {
            applied.remove(&tid);
            self.pinned.insert(tid, affinity.intersection(bound));
        }
    }

    /// Whether an operator has pinned thread `tid`.
    pub fn is_pinned(&self, tid: i32) -> bool {
        self.pinned.contains_key(&tid)
    }

    /// The CPUs the engine must keep vCPU thread `tid` to: its pin, or `bound` where that is
    /// narrower than `all`, the daemon's CPUs.
    pub fn limit(&self, tid: i32, bound: &CpuSet, all: &CpuSet) -> Option<CpuSet> {
        match self.pinned.get(&tid) {
            Some(pin) if !pin.is_empty() => Some(pin.clone()),
            _ => (bound != all).then(|| bound.clone()),
        }
    }

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

    /// Forgets threads that are gone.
    pub fn retain(&mut self, live: impl Fn(i32) -> bool) {
        self.pinned.retain(|tid, _| live(*tid));
        self.home.retain(|tid, _| live(*tid));
        self.last_bound.retain(|tid, _| live(*tid));
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
        let mut pins = OperatorPins::default();
        let mut applied = HashMap::from([(7, set(&[0]))]);
        // As the daemon left it: nothing to see.
        pins.observe(7, Some(&set(&[0])), &all, &mut applied);
        assert!(!pins.is_pinned(7));
        // virsh vcpupin ... 0 2
        pins.observe(7, Some(&set(&[2])), &all, &mut applied);
        assert!(pins.is_pinned(7));
        assert_eq!(pins.limit(7, &all, &all), Some(set(&[2])));
        assert!(applied.is_empty(), "the daemon's setting is forgotten");
        // Pinned again, elsewhere.
        pins.observe(7, Some(&set(&[1, 2])), &all, &mut applied);
        assert_eq!(pins.limit(7, &all, &all), Some(set(&[1, 2])));
        // Widened to every CPU: taken back.
        pins.observe(7, Some(&all), &all, &mut applied);
        assert!(!pins.is_pinned(7));
        assert_eq!(pins.limit(7, &all, &all), None);
        // A thread the daemon never set is nobody's pin.
        pins.observe(8, Some(&set(&[3])), &all, &mut applied);
        assert!(!pins.is_pinned(8));
    }

    #[test]
    fn a_cpuset_bounds_without_pinning() {
        let all = set(&[0, 1, 2, 3]);
        let bound = set(&[2, 3]);
        let mut pins = OperatorPins::default();
        let mut applied = HashMap::from([(7, set(&[2]))]);
        pins.observe(7, Some(&bound), &bound, &mut applied);
        assert!(!pins.is_pinned(7), "widened to its whole cpuset");
        assert_eq!(pins.limit(7, &bound, &all), Some(bound));
    }

    #[test]
    fn a_narrowed_cpuset_is_a_pin_even_onto_the_daemons_own_choice() {
        let all = set(&[0, 1]);
        let mut pins = OperatorPins::default();
        let mut applied = HashMap::from([(7, set(&[1]))]);
        pins.observe(7, Some(&set(&[1])), &all, &mut applied);
        assert!(!pins.is_pinned(7));
        // virsh vcpupin ... 0 1: the cgroup's cpuset becomes {1}, the affinity stays {1}.
        pins.observe(7, Some(&set(&[1])), &set(&[1]), &mut applied);
        assert!(pins.is_pinned(7));
        assert_eq!(pins.limit(7, &set(&[1]), &all), Some(set(&[1])));
        // virsh vcpupin ... 0 0-1: both widen again.
        pins.observe(7, Some(&all), &all, &mut applied);
        assert!(!pins.is_pinned(7));
    }

    #[test]
    fn the_engine_is_told_each_change_once_and_everything_when_fresh() {
        let id = |vcpu| VcpuId { vm: 0, vcpu };
        let mut pins = OperatorPins::default();
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
