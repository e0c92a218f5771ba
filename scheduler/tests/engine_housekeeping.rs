//! The placing process's own threads as load ([`Engine::set_housekeeping`]): none changes no
//! decision, and busy ones on a package make room there.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;

use proptest::prelude::*;
use pvmm_scheduler::placement::MIN_HOUSEKEEPING_UTIL;
use pvmm_scheduler::{Decision, Engine, EngineConfig, HostTopology, Policy, VcpuLoad};

use common::{
    busy_vcpus, check_decision, loads_for, policy_strategy, run_steady, spec_strategy, TICK_MS,
};

/// vCPUs per package of `decision`, in package id order (two packages).
fn per_package(decision: &Decision) -> [usize; 2] {
    let mut count = [0; 2];
    for a in &decision.assignments {
        count[a.package as usize] += 1;
    }
    count
}

/// Decisions with `loads` from tick `from` to `to`, the engine told each time that its own
/// threads used `util` on package 0; returns the last.
fn run_with_housekeeping(
    engine: &mut Engine,
    (from, to): (u64, u64),
    util: u32,
    loads: &[VcpuLoad],
) -> Decision {
    let mut last = Decision::default();
    for t in from..to {
        assert!(engine.set_housekeeping(Some(0), util));
        last = engine.place(t * TICK_MS, loads).unwrap();
    }
    last
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// An engine told every tick that its own threads used nothing, or less than the floor
    /// that tells a load from a VMM's bookkeeping, on any package or none, decides exactly as
    /// one never told of them, under every policy, topology and load.
    #[test]
    fn no_housekeeping_load_changes_no_decision(
        (s, c, t) in spec_strategy(),
        policy in policy_strategy(),
        vms in prop::collection::vec(1u32..=4, 1..6),
        utils in prop::collection::vec(0u32..=1100, 40),
        packages in prop::collection::vec(prop::option::of(0u32..4), 16),
        own in prop::collection::vec(0u32..MIN_HOUSEKEEPING_UTIL, 16),
        share_package in any::<bool>(),
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let config = EngineConfig { share_package, ..EngineConfig::default() };
        let mut plain = Engine::new(topology.clone(), policy, config);
        let mut told = Engine::new(topology, policy, config);
        let vm_list: Vec<(u32, u32)> = vms.iter().enumerate().map(|(i, n)| (i as u32, *n)).collect();
        for (tick, package) in packages.iter().enumerate() {
            let tick = tick as u32;
            let loads = loads_for(&vm_list, |vm, vcpu| utils[((vm * 7 + vcpu + tick * 3) % 40) as usize]);
            let package = package.filter(|p| *p < s);
            prop_assert!(told.set_housekeeping(package, own[tick as usize]));
            let now = u64::from(tick) * TICK_MS;
            prop_assert_eq!(plain.place(now, &loads).unwrap(), told.place(now, &loads).unwrap());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any housekeeping load, on any package, leaves every decision well formed (each vCPU
    /// placed once, on the topology, capacities 1..=1024), and debug builds check spread
    /// mode's shortcuts against its search with the load in the package loads.
    #[test]
    fn any_housekeeping_load_gives_well_formed_decisions(
        (s, c, t) in spec_strategy(),
        policy in policy_strategy(),
        vms in prop::collection::vec(1u32..=4, 1..6),
        utils in prop::collection::vec(0u32..=1100, 40),
        own in prop::collection::vec((prop::option::of(0u32..4), 0u32..5000), 16),
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let vm_list: Vec<(u32, u32)> = vms.iter().enumerate().map(|(i, n)| (i as u32, *n)).collect();
        for (tick, (package, util)) in own.iter().enumerate() {
            let tick = tick as u32;
            let loads = loads_for(&vm_list, |vm, vcpu| utils[((vm * 5 + vcpu + tick) % 40) as usize]);
            prop_assert!(engine.set_housekeeping(package.filter(|p| *p < s), *util));
            let d = engine.place(u64::from(tick) * TICK_MS, &loads).unwrap();
            check_decision(&topology, &loads, &d);
        }
    }
}

/// Three busy vCPUs fit a four-CPU package; once pvmm's device threads use a fourth CPU
/// there too, they do not: powersaving opens the second package for one vCPU, at once.
#[test]
fn busy_device_threads_make_powersaving_open_a_package() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let loads = busy_vcpus(3);
    for level in [1, 2] {
        let policy = Policy::Powersaving { level };
        let mut without = Engine::new(topology.clone(), policy, EngineConfig::default());
        let d = run_steady(&mut without, 0, 20, &loads);
        assert_eq!(per_package(&d), [3, 0], "{policy}: no device load");
        assert_eq!(d.target_packages, 1);

        let mut with = Engine::new(topology.clone(), policy, EngineConfig::default());
        let d = run_with_housekeeping(&mut with, (0, 10), 0, &loads);
        assert_eq!(per_package(&d), [3, 0], "{policy}: no device load yet");
        let d = run_with_housekeeping(&mut with, (10, 11), 1024, &loads);
        assert_eq!(per_package(&d), [2, 1], "{policy}: a CPU of device work");
        assert_eq!(d.target_packages, 2);
        assert!(!d.overutilized);
        let d = run_with_housekeeping(&mut with, (11, 40), 1024, &loads);
        assert_eq!(per_package(&d), [2, 1], "{policy}: steady");
        assert!(d.migrations.is_empty());
    }
}

/// A VM placed for the first time beside busy device threads goes whole to the package with
/// room for it.
#[test]
fn a_new_vm_goes_whole_where_device_threads_leave_room() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let policy = Policy::Powersaving { level: 1 };
    let mut engine = Engine::new(topology, policy, EngineConfig::default());
    let d = run_with_housekeeping(&mut engine, (0, 1), 1024, &busy_vcpus(3));
    assert_eq!(per_package(&d), [0, 3]);
}

/// A light device load leaves room: three busy vCPUs and a fifth of a CPU of device work fit
/// one package.
#[test]
fn light_device_threads_fit_beside_the_vcpus() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let d = run_with_housekeeping(&mut engine, (0, 20), 200, &busy_vcpus(3));
    assert_eq!(per_package(&d), [3, 0]);
}

/// When the device work ends, its room is given back: the average decays within the demand
/// half-life's few multiples, and the ramp then consolidates onto one package again.
#[test]
fn the_package_closes_again_once_device_work_ends() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let config = EngineConfig {
        ramp_down_window_ms: 0,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(topology, Policy::Powersaving { level: 1 }, config);
    let loads = busy_vcpus(3);
    run_with_housekeeping(&mut engine, (0, 5), 0, &loads);
    let d = run_with_housekeeping(&mut engine, (5, 10), 1024, &loads);
    assert_eq!(per_package(&d), [2, 1]);
    let mut last = d;
    for t in 10..60u64 {
        assert!(engine.set_housekeeping(Some(0), 0));
        last = engine.place(t * TICK_MS, &loads).unwrap();
    }
    assert_eq!(per_package(&last), [3, 0]);
}

/// Spreading (performance) counts the device threads in their package's load: four busy
/// vCPUs split 2/2 alone, but 1/3 beside two CPUs of device work on package 0.
#[test]
fn performance_spreads_vcpus_away_from_busy_device_threads() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let loads = busy_vcpus(4);
    let mut without = Engine::new(
        topology.clone(),
        Policy::Performance,
        EngineConfig::default(),
    );
    assert_eq!(per_package(&run_steady(&mut without, 0, 5, &loads)), [2, 2]);
    let mut with = Engine::new(topology, Policy::Performance, EngineConfig::default());
    let d = run_with_housekeeping(&mut with, (0, 5), 2048, &loads);
    assert_eq!(per_package(&d), [1, 3]);
}

/// Device work that, with the vCPUs, exceeds the whole host makes every policy spread.
#[test]
fn device_work_counts_toward_overutilization() {
    let topology = HostTopology::from_spec("1x4x1").unwrap();
    let loads = busy_vcpus(3);
    let mut engine = Engine::new(topology, Policy::Balance, EngineConfig::default());
    assert!(!run_with_housekeeping(&mut engine, (0, 3), 0, &loads).overutilized);
    assert!(run_with_housekeeping(&mut engine, (3, 6), 1024, &loads).overutilized);
}

#[test]
fn an_unknown_package_is_refused() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let mut engine = Engine::new(topology, Policy::Balance, EngineConfig::default());
    assert!(!engine.set_housekeeping(Some(7), 512));
    assert!(engine.set_housekeeping(Some(1), 512));
    assert!(engine.set_housekeeping(None, 512));
}

/// Where the package cannot hold the vCPUs and the device threads (the whole host is full),
/// the threads' excess is taken off the package's vCPUs' capacities, evenly: 4 busy vCPUs
/// on 4 CPUs and a CPU of device work leave each vCPU 3/4 of its CPU.
#[test]
fn device_work_beyond_the_room_lowers_the_capacities() {
    let topology = HostTopology::from_spec("1x4x1").unwrap();
    let loads = busy_vcpus(4);
    for policy in Policy::ALL {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let d = run_with_housekeeping(&mut engine, (0, 3), 0, &loads);
        assert!(d.assignments.iter().all(|a| a.capacity == 1024), "{policy}");
        let d = run_with_housekeeping(&mut engine, (3, 6), 1024, &loads);
        assert!(
            d.assignments.iter().all(|a| a.capacity == 768),
            "{policy}: {d:?}"
        );
    }
}

/// Device work the package has room for takes nothing from the vCPUs' capacities.
#[test]
fn device_work_with_room_leaves_the_capacities() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let loads = busy_vcpus(3);
    run_with_housekeeping(&mut engine, (0, 10), 0, &loads);
    let d = run_with_housekeeping(&mut engine, (10, 20), 1024, &loads);
    assert_eq!(per_package(&d), [2, 1]);
    assert!(d.assignments.iter().all(|a| a.capacity == 1024), "{d:?}");
}

/// The engine names the package it counted a housekeeping load on, and none while the load is
/// under the floor.
#[test]
fn the_package_counted_on_is_named_while_it_has_a_load() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let mut engine = Engine::new(topology, Policy::Balance, EngineConfig::default());
    let loads = busy_vcpus(1);
    assert_eq!(engine.housekeeping_package(), None);
    run_with_housekeeping(&mut engine, (0, 1), MIN_HOUSEKEEPING_UTIL - 1, &loads);
    assert_eq!(engine.housekeeping_package(), None);
    assert!(engine.set_housekeeping(Some(1), 300));
    engine.place(TICK_MS, &loads).unwrap();
    assert_eq!(engine.housekeeping_package(), Some(1));
}
