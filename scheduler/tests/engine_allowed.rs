//! vCPUs limited to some CPUs (an operator's pin, a cgroup cpuset): the engine never places one
//! outside its set, counts its load where it runs, and places every other vCPU as it would
//! have, over random topologies, policies, loads and sets.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;

use proptest::prelude::*;
use pvmm_scheduler::{CpuSet, Engine, EngineConfig, HostTopology, Policy, VcpuId};

use common::{busy_vcpus, check_decision, loads_for, policy_strategy, spec_strategy, TICK_MS};

/// A CPU set from the low bits of `mask` over `n` CPUs (None for no bit).
fn set_from(mask: u64, n: u32) -> Option<CpuSet> {
    let set: CpuSet = (0..n).filter(|i| mask & (1 << i) != 0).collect();
    (!set.is_empty()).then_some(set)
}

#[test]
fn a_pinned_vcpu_stays_in_its_set_and_its_load_counts_there() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let loads = busy_vcpus(2);
    let pinned = VcpuId { vm: 0, vcpu: 0 };
    engine.set_allowed(pinned, Some(CpuSet::single(3)));
    let d = engine.place(0, &loads).unwrap();
    assert_eq!(d.assignments[0].cpus, CpuSet::single(3));
    assert_eq!(d.assignments[0].package, 1);
    // The other busy vCPU does not share CPU 3 with it.
    assert_ne!(d.assignments[1].cpu, 3);
    // Lifted, the vCPU goes where the policy wants it: packed on package 0.
    engine.set_allowed(pinned, None);
    let mut last = d;
    for tick in 1..50 {
        last = engine.place(tick * TICK_MS, &loads).unwrap();
    }
    assert!(last.assignments.iter().all(|a| a.package == 0), "{last:?}");
}

#[test]
fn under_package_sharing_a_limited_vcpu_shares_only_its_set() {
    let topology = HostTopology::from_spec("1x4x1").unwrap();
    let config = EngineConfig {
        share_package: true,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(topology, Policy::Balance, config);
    let loads = busy_vcpus(3);
    engine.set_allowed(VcpuId { vm: 0, vcpu: 1 }, Some(CpuSet::range(2, 3)));
    let d = engine.place(0, &loads).unwrap();
    assert!(
        d.assignments[1].cpus.is_subset(&CpuSet::range(2, 3)),
        "{d:?}"
    );
    assert!(
        d.assignments[0].cpus.len() > 1,
        "the others share the package: {d:?}"
    );
}

#[test]
fn a_set_outside_the_topology_cannot_be_kept_and_is_ignored() {
    let topology = HostTopology::from_spec("1x2x1").unwrap();
    let mut engine = Engine::new(
        topology.clone(),
        Policy::Performance,
        EngineConfig::default(),
    );
    let loads = busy_vcpus(1);
    engine.set_allowed(VcpuId { vm: 0, vcpu: 0 }, Some(CpuSet::single(40)));
    let d = engine.place(0, &loads).unwrap();
    check_decision(&topology, &loads, &d);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the sets, every limited vCPU runs within its set, every decision is
    /// well-formed, and vCPUs whose set is every CPU are placed exactly as with no set.
    #[test]
    fn limited_vcpus_never_leave_their_sets(
        (s, c, t) in spec_strategy(),
        policy in policy_strategy(),
        share in any::<bool>(),
        vms in prop::collection::vec(1u32..=4, 1..6),
        utils in prop::collection::vec(0u32..=1100, 40),
        masks in prop::collection::vec(prop_oneof![Just(0u64), any::<u64>()], 24),
        ticks in 1u64..10,
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let n = topology.cpus().len() as u32;
        let config = EngineConfig { share_package: share, ..EngineConfig::default() };
        let mut limited = Engine::new(topology.clone(), policy, config);
        let mut free = Engine::new(topology.clone(), policy, config);
        let mut everything = Engine::new(topology.clone(), policy, config);
        let vm_list: Vec<(u32, u32)> =
            vms.iter().enumerate().map(|(i, n)| (i as u32, *n)).collect();
        let mut sets = Vec::new();
        for (k, (vm, count)) in vm_list.iter().enumerate() {
            for vcpu in 0..*count {
                let id = VcpuId { vm: *vm, vcpu };
                let set = set_from(masks[(k * 4 + vcpu as usize) % masks.len()], n);
                limited.set_allowed(id, set.clone());
                everything.set_allowed(id, Some(topology.cpu_set()));
                sets.push((id, set));
            }
        }
        for tick in 0..ticks {
            let loads = loads_for(&vm_list, |vm, vcpu| {
                utils[((vm * 3 + vcpu + tick as u32 * 7) % 40) as usize]
            });
            let d = limited.place(tick * TICK_MS, &loads).unwrap();
            check_decision(&topology, &loads, &d);
            for (a, (id, set)) in d.assignments.iter().zip(&sets) {
                prop_assert_eq!(a.id, *id);
                if let Some(set) = set {
                    prop_assert!(set.contains(a.cpu), "{:?} on {} outside {}", id, a.cpu, set);
                    prop_assert!(a.cpus.is_subset(set), "{:?}: {} outside {}", id, a.cpus, set);
                }
            }
            let plain = free.place(tick * TICK_MS, &loads).unwrap();
            let all = everything.place(tick * TICK_MS, &loads).unwrap();
            prop_assert_eq!(plain, all);
        }
    }
}
