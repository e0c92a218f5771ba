//! Placement engine inputs: duplicate vCPUs, extreme times and utilizations, new vCPUs.

mod common;

use pvmm_scheduler::{Engine, EngineConfig, HostTopology, PlaceError, Policy, VcpuId, VcpuLoad};

use common::{busy_vcpus, check_decision};

#[test]
fn duplicate_vcpus_are_an_error_and_leave_state_intact() {
    let topology = HostTopology::from_spec("1x2x1").unwrap();
    let mut engine = Engine::new(topology, Policy::Performance, EngineConfig::default());
    let first = engine.place(0, &busy_vcpus(2)).unwrap();
    let mut dup = busy_vcpus(2);
    dup.push(dup[0]);
    assert_eq!(
        engine.place(100, &dup),
        Err(PlaceError::DuplicateVcpu(VcpuId { vm: 0, vcpu: 0 }))
    );
    let again = engine.place(200, &busy_vcpus(2)).unwrap();
    assert_eq!(again.assignments, first.assignments);
    assert_eq!(again.moves(), 0);
    assert!(engine.place(300, &[]).unwrap().assignments.is_empty());
}

/// Duplicates are found whatever the vCPU numbers (small ones are checked in a
/// bitmap per VM, large ones in a map) and however the VMs interleave; equal
/// vCPU numbers in different VMs, and 255 next to 256, are not duplicates.
#[test]
fn duplicates_are_found_for_any_vcpu_number_and_vm_order() {
    let topology = HostTopology::from_spec("1x4x1").unwrap();
    let mut engine = Engine::new(topology, Policy::Performance, EngineConfig::default());
    let load = |vm: u32, vcpu: u32| VcpuLoad {
        id: VcpuId { vm, vcpu },
        util: 100,
        busy: false,
        waited: 0,
    };
    let distinct = [
        load(7, 0),
        load(9, 0),
        load(7, 255),
        load(7, 256),
        load(9, u32::MAX),
        load(7, u32::MAX),
        load(u32::MAX, 63),
        load(u32::MAX, 64),
    ];
    assert_eq!(engine.place(0, &distinct).unwrap().assignments.len(), 8);
    for dup in [
        load(7, 0),
        load(9, 0),
        load(7, 256),
        load(7, u32::MAX),
        load(u32::MAX, 64),
    ] {
        let mut loads = distinct.to_vec();
        loads.insert(3, dup);
        assert_eq!(
            engine.place(100, &loads),
            Err(PlaceError::DuplicateVcpu(dup.id)),
            "{dup:?}"
        );
    }
    // After the errors, the next decision runs on the state before them.
    assert_eq!(engine.place(200, &distinct).unwrap().moves(), 0);
}

#[test]
fn extreme_times_and_utils_do_not_panic() {
    let topology = HostTopology::from_spec("2x2x2").unwrap();
    for (policy, share_package) in Policy::ALL
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
    {
        let config = EngineConfig {
            ramp_down_window_ms: u64::MAX,
            max_migrations_per_vcpu_per_s: u32::MAX,
            demand_half_life_ms: u32::MAX,
            share_package,
        };
        let mut engine = Engine::new(topology.clone(), policy, config);
        let mut loads = busy_vcpus(5);
        loads[0].util = u32::MAX;
        // Load first high (all packages), then low: the ramp runs at huge times.
        engine.place(0, &busy_vcpus(16)).unwrap();
        for now in [0, u64::MAX / 2, u64::MAX / 2 + 1, u64::MAX, 5, 0] {
            let d = engine.place(now, &loads).unwrap();
            check_decision(&topology, &loads, &d);
        }
    }
}

#[test]
fn new_vcpus_are_initial_placements_not_moves() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let mut engine = Engine::new(topology, Policy::Balance, EngineConfig::default());
    let d = engine.place(0, &busy_vcpus(3)).unwrap();
    assert_eq!(d.assignments.len(), 3);
    assert!(d.migrations.is_empty());
    assert_eq!(d.moves(), 0);
    // A fourth vCPU joining is placed, not moved; the others stay.
    let d = engine.place(100, &busy_vcpus(4)).unwrap();
    assert_eq!(d.assignments.len(), 4);
    assert!(d.migrations.is_empty(), "{:?}", d.migrations);
}
