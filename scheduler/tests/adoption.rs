//! A new engine taking over vCPUs another engine placed ([`Engine::assume`]): a restarted host
//! daemon adopting VMs must not move a vCPU that is already where it would put it.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use proptest::prelude::*;
use pvmm_scheduler::{Engine, EngineConfig, HostTopology, Policy, VcpuId, VcpuLoad};

/// Placement tick of the live VMM.
const TICK_MS: u64 = 100;
/// Ticks of varying load first.
const VARYING_TICKS: u64 = 30;
/// Ticks of steady load before the takeover: past the engine's demand average settling (a
/// whole CPU falls to idle in under 3 s) and then the consolidation ramp-down (5 s).
const SETTLE_TICKS: u64 = 120;

fn loads(vms: &[u32], utils: &[u32]) -> Vec<VcpuLoad> {
    let mut out = Vec::new();
    for (vm, &count) in vms.iter().enumerate() {
        for vcpu in 0..count {
            let util = utils[(vm * 5 + vcpu as usize) % utils.len()];
            out.push(VcpuLoad {
                id: VcpuId {
                    vm: vm as u32,
                    vcpu,
                },
                util,
                busy: util >= 512,
                waited: 0,
            });
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// After a varying load and then a steady one, a fresh engine told where every vCPU runs
    /// decides the same placement, with no migration. (From scratch it would often choose
    /// other CPUs: the first engine's placement carries the history of the varying phase.)
    #[test]
    fn a_fresh_engine_keeps_a_settled_placement(
        spec in prop::sample::select(vec!["1x2x1", "2x2x1", "2x2x2", "2x4x1", "4x2x1"]),
        policy in prop::sample::select(Policy::ALL.to_vec()),
        vms in prop::collection::vec(1u32..=4, 1..5),
        utils in prop::collection::vec(prop::sample::select(vec![0u32, 20, 300, 700, 1024]), 8),
        before in prop::collection::vec(prop::sample::select(vec![0u32, 20, 300, 700, 1024]), 8),
    ) {
        let topology = HostTopology::from_spec(spec).unwrap();
        let mut first = Engine::new(topology.clone(), policy, EngineConfig::default());
        for tick in 0..VARYING_TICKS {
            let shifted: Vec<u32> = (0..8).map(|i| before[(i + tick as usize) % 8]).collect();
            first.place(tick * TICK_MS, &loads(&vms, &shifted)).unwrap();
        }
        let loads = loads(&vms, &utils);
        let mut settled = None;
        for tick in VARYING_TICKS..VARYING_TICKS + SETTLE_TICKS {
            settled = Some(first.place(tick * TICK_MS, &loads).unwrap());
        }
        let settled = settled.unwrap();
        let mut second = Engine::new(topology, policy, EngineConfig::default());
        for a in &settled.assignments {
            prop_assert!(second.assume(a.id, a.cpus.first().unwrap()));
        }
        let taken = second.place((VARYING_TICKS + SETTLE_TICKS) * TICK_MS, &loads).unwrap();
        prop_assert!(taken.migrations.is_empty(), "{:?}", taken.migrations);
        prop_assert_eq!(taken.assignments, settled.assignments);
    }
}

#[test]
fn a_cpu_outside_the_topology_is_refused_and_a_known_vcpu_keeps_its_history() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let mut engine = Engine::new(topology, Policy::Performance, EngineConfig::default());
    let id = VcpuId { vm: 0, vcpu: 0 };
    assert!(!engine.assume(id, 99));
    let load = [VcpuLoad {
        id,
        util: 1024,
        busy: true,
        waited: 0,
    }];
    let placed = engine.place(0, &load).unwrap().assignments[0].cpus.first();
    let elsewhere = (0..4).find(|c| Some(*c) != placed).unwrap();
    assert!(engine.assume(id, elsewhere));
    let again = engine.place(TICK_MS, &load).unwrap();
    assert!(again.migrations.is_empty());
    assert_eq!(again.assignments[0].cpus.first(), placed);
}

#[test]
fn a_refused_input_keeps_the_adoptions_for_the_next_decision() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let idle = |vcpu| VcpuLoad {
        id: VcpuId { vm: 0, vcpu },
        util: 0,
        busy: false,
        waited: 0,
    };
    // Both idle vCPUs run on CPU 1 (package 0), where powersaving would keep them.
    assert!(engine.assume(idle(0).id, 1));
    assert!(engine.assume(idle(1).id, 1));
    assert!(engine.place(0, &[idle(0), idle(1), idle(0)]).is_err());
    let d = engine.place(TICK_MS, &[idle(0), idle(1)]).unwrap();
    assert!(d.migrations.is_empty(), "{:?}", d.migrations);
    assert!(d.assignments.iter().all(|a| a.cpus.first() == Some(1)));
}
