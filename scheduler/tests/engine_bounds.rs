//! Placement engine bounds: the migration rate, the fluid package count, the LTP sched_mc
//! oracle, effective capacities.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use pvmm_scheduler::{CpuSet, Engine, EngineConfig, HostTopology, Policy, VcpuLoad};

use common::{
    busy_vcpus, check_decision, loads_for, packing_capacity, provoke_moves, run_steady, TICK_MS,
};

/// The default bound as the README states it: 2 moves per second on
/// average, never more than 3 within one second, and the bucket does let 3
/// through when a vCPU keeps wanting to move.
#[test]
fn default_migration_bound_is_two_per_second_with_bursts_of_three() {
    let limit = EngineConfig::default().max_migrations_per_vcpu_per_s;
    assert_eq!(limit, 2);
    let ticks = 100;
    let move_ms = provoke_moves(Policy::Performance, limit, ticks);
    let mut most_within_a_second = 0;
    for times in &move_ms {
        assert!(times.len() as u64 <= 2 + 2 * (ticks - 1) * TICK_MS / 1000);
        for (a, first) in times.iter().enumerate() {
            let within = times[a..].iter().take_while(|t| **t < first + 1000).count();
            assert!(within <= 3, "{within} moves from {first} ms on: {times:?}");
            most_within_a_second = most_within_a_second.max(within);
        }
    }
    assert_eq!(most_within_a_second, 3, "{move_ms:?}");
}

/// The fluid bound: with equal loads whose size divides 80 % of a package,
/// the active package count is ceil(U / (0.8 x package capacity)).
#[test]
fn equal_loads_match_the_fluid_formula() {
    // 5 cores x 1024 = 5120; 0.8 x 5120 = 4096 = 8 x 512 = 16 x 256 = 32 x 128.
    for (spec, policy) in [
        ("4x5x1", Policy::Powersaving { level: 1 }),
        ("4x5x1", Policy::Powersaving { level: 2 }),
        ("4x5x2", Policy::Balance),
        ("3x10x1", Policy::Balance),
    ] {
        let topology = HostTopology::from_spec(spec).unwrap();
        let (pkg_cap, _) = packing_capacity(&topology, policy);
        for util in [128u32, 256, 512] {
            for n in 1..=(topology.num_packages() as u64 * pkg_cap * 4 / 5 / u64::from(util)) {
                let loads = loads_for(&[(0, n as u32)], |_, _| util);
                let u_total = n as f64 * f64::from(util);
                let expected = (u_total / (0.8 * pkg_cap as f64)).ceil() as usize;
                let mut engine = Engine::new(
                    topology.clone(),
                    policy,
                    EngineConfig {
                        ramp_down_window_ms: 0,
                        ..EngineConfig::default()
                    },
                );
                let d = run_steady(&mut engine, 0, 5, &loads);
                assert_eq!(
                    d.used_packages().len(),
                    expected,
                    "{spec} {policy} util={util} n={n}"
                );
            }
        }
    }
}

/// LTP sched_mc oracle: N busy vCPUs, N <= cores per package: the packing
/// policies put them all in one package, performance spreads them.
#[test]
fn ltp_sched_mc_oracle() {
    for spec in ["2x4x1", "2x4x2", "4x2x1", "2x8x2", "3x6x2"] {
        let topology = HostTopology::from_spec(spec).unwrap();
        let packages = topology.num_packages();
        let cores = topology.num_cores() / packages;
        for n in 1..=cores as u32 {
            for as_one_vm in [true, false] {
                let loads: Vec<VcpuLoad> = busy_vcpus(n)
                    .into_iter()
                    .map(|mut l| {
                        if !as_one_vm {
                            l.id.vm = l.id.vcpu;
                        }
                        l
                    })
                    .collect();
                for policy in Policy::ALL {
                    let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
                    let d = run_steady(&mut engine, 0, 80, &loads);
                    check_decision(&topology, &loads, &d);
                    let used = d.used_packages().len();
                    if policy == Policy::Performance {
                        assert_eq!(used, (n as usize).min(packages), "{spec} n={n} {policy}");
                    } else {
                        assert_eq!(used, 1, "{spec} n={n} {policy}: {:?}", d.assignments);
                    }
                    // Every busy vCPU has a CPU of its own.
                    let cpus: CpuSet = d
                        .assignments
                        .iter()
                        .filter_map(|a| a.cpus.first())
                        .collect();
                    assert_eq!(cpus.len(), n as usize, "{spec} n={n} {policy}");
                    if matches!(policy, Policy::Performance | Policy::Balance) {
                        // One per core: no busy SMT siblings.
                        for a in &d.assignments {
                            assert_eq!(a.capacity, 1024, "{spec} n={n} {policy}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn effective_capacity_reflects_sharing() {
    let topology = HostTopology::from_spec("1x1x2").unwrap();
    let mut engine = Engine::new(topology, Policy::Performance, EngineConfig::default());
    let d = engine.place(0, &busy_vcpus(2)).unwrap();
    assert!(
        d.assignments.iter().all(|a| a.capacity == 589),
        "{:?}",
        d.assignments
    );
    let d = engine.place(100, &busy_vcpus(4)).unwrap();
    assert!(
        d.assignments.iter().all(|a| a.capacity == 294),
        "{:?}",
        d.assignments
    );
    assert!(d.overutilized);
    // One busy vCPU sharing a CPU with idle ones keeps most of it.
    let topology = HostTopology::from_spec("1x1x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let mut loads = busy_vcpus(4);
    for l in &mut loads[1..] {
        l.util = 0;
        l.busy = false;
    }
    let d = engine.place(0, &loads).unwrap();
    assert!(d.assignments.iter().all(|a| a.cpus == CpuSet::single(0)));
    // Idle vCPUs count for MIN_VCPU_WEIGHT (16) each.
    assert_eq!(d.assignments[0].capacity, 1024 - 3 * 16);
    assert_eq!(d.assignments[1].capacity, 256);
}

#[test]
fn heterogeneous_capacities_are_placed_within_bounds() {
    let dir = std::env::temp_dir().join(format!("pvmm-hetero-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("hetero.topo");
    let mut text = String::new();
    for cpu in 0..4 {
        text += &format!("cpu={cpu} package=0 core={cpu} capacity=1024\n");
    }
    for cpu in 4..8 {
        text += &format!("cpu={cpu} package=1 core={cpu} capacity=512\n");
    }
    std::fs::write(&file, text).unwrap();
    let topology = HostTopology::from_file(&file).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    for policy in Policy::ALL {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        for n in [1u32, 3, 6, 12] {
            let d = run_steady(&mut engine, u64::from(n) * 10_000, 30, &busy_vcpus(n));
            check_decision(&topology, &busy_vcpus(n), &d);
            for a in &d.assignments {
                let cpu = a.cpus.first().unwrap();
                assert!(a.capacity <= topology.cpu(cpu).unwrap().capacity);
            }
        }
    }
}
