//! Placement engine gathering: a VM's vCPUs together, busy vCPUs in one package with a CPU or
//! core each.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;

use pvmm_scheduler::{Decision, Engine, EngineConfig, HostTopology, Policy, VcpuId, VcpuLoad};

use common::{check_decision, one_vm_with_busy, run_steady};

/// A VM's vCPUs share a package when capacity allows.
#[test]
fn vm_vcpus_stay_together() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    for policy in [
        Policy::Balance,
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
    ] {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        // Two VMs of 3 busy vCPUs, listed interleaved.
        let loads: Vec<VcpuLoad> = (0..6u32)
            .map(|i| VcpuLoad {
                id: VcpuId {
                    vm: i % 2,
                    vcpu: i / 2,
                },
                util: 600,
                busy: true,
                waited: 0,
            })
            .collect();
        let d = run_steady(&mut engine, 0, 20, &loads);
        for vm in 0..2 {
            let pkgs: Vec<u32> = d
                .assignments
                .iter()
                .filter(|a| a.id.vm == vm)
                .map(|a| a.package)
                .collect();
            assert!(
                pkgs.windows(2).all(|w| w[0] == w[1]),
                "{policy}: VM {vm} split over {pkgs:?}"
            );
        }
        assert_eq!(d.used_packages().len(), 2);
    }
}

/// powersaving:2 pulls a waking vCPU into the preferred package at once,
/// where level 1 leaves it on its other package.
#[test]
fn level_two_pulls_waking_vcpus_into_preferred_package() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let mut results = Vec::new();
    for level in [1u8, 2] {
        let config = EngineConfig {
            ramp_down_window_ms: 60_000,
            max_migrations_per_vcpu_per_s: 10,
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(topology.clone(), Policy::Powersaving { level }, config);
        // Phase 1: eight busy single-vCPU VMs need both packages.
        let mut loads: Vec<VcpuLoad> = (0..8u32)
            .map(|i| VcpuLoad {
                id: VcpuId { vm: i, vcpu: 0 },
                util: 1024,
                busy: true,
                waited: 0,
            })
            .collect();
        engine.place(0, &loads).unwrap();
        // Phase 2: all but two go idle; the ramp (60 s) keeps both packages open.
        for (i, l) in loads.iter_mut().enumerate() {
            if i != 0 && i != 7 {
                l.util = 16;
                l.busy = false;
            }
        }
        let d = run_steady(&mut engine, 100, 5, &loads);
        results.push(d.used_packages().len());
        let pkgs: Vec<u32> = d
            .assignments
            .iter()
            .filter(|a| a.id.vm == 0 || a.id.vm == 7)
            .map(|a| a.package)
            .collect();
        if level == 2 {
            assert_eq!(pkgs[0], pkgs[1], "busy vCPUs pulled into one package");
            assert_eq!(d.preferred_package, Some(pkgs[0]));
        }
    }
    assert_eq!(results[0], 2, "level 1 waits for the ramp");
}

/// Two busy vCPUs share one package (on different CPUs) under the
/// packing policies, whichever packages idle vCPUs happened to sit on. Here
/// vCPU 2 turns busy on package 1 while vCPU 0 is busy on package 0 and the
/// ramp still holds both packages: vCPU 2 joins vCPU 0, the idle vCPU on
/// package 0 makes room.
#[test]
fn busy_vcpus_gather_in_one_package_whatever_idle_ones_hold() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    for policy in [Policy::Balance, Policy::Powersaving { level: 1 }] {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let with_busy = |busy: &[u32]| one_vm_with_busy(4, busy);
        let d = run_steady(&mut engine, 0, 10, &with_busy(&[0, 1, 2, 3]));
        assert_eq!(d.used_packages().len(), 2, "{policy}");
        let d = run_steady(&mut engine, 1000, 10, &with_busy(&[0]));
        let pkg_of = |d: &Decision, v: usize| d.assignments[v].package;
        let zero = pkg_of(&d, 0);
        assert_eq!(d.used_packages().len(), 2, "{policy}: the ramp holds");
        let other = d
            .assignments
            .iter()
            .position(|a| a.package != zero)
            .expect("an idle vCPU on the other package") as u32;
        let d = run_steady(&mut engine, 2000, 2, &with_busy(&[0, other]));
        check_decision(&topology, &with_busy(&[0, other]), &d);
        let (a, b) = (&d.assignments[0], &d.assignments[other as usize]);
        assert_eq!(a.package, b.package, "{policy}: busy vCPUs on one package");
        assert_ne!(a.cpus, b.cpus, "{policy}: busy vCPUs share a CPU");
    }
}

/// Busy vCPUs gathering as a nested rig shows it: the ramp holds both
/// packages with idle vCPUs on each, then two vCPUs on different packages turn
/// busy at once with (nearly) equal loads, the one on package 1 a little
/// heavier. They gather on package 0: load differences below a quarter CPU do
/// not pick the package.
#[test]
fn two_vcpus_turning_busy_on_different_packages_gather_on_package_0() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    for policy in [Policy::Balance, Policy::Powersaving { level: 1 }] {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let d = run_steady(&mut engine, 0, 10, &one_vm_with_busy(4, &[0, 1, 2, 3]));
        let idle = one_vm_with_busy(4, &[]);
        let d2 = run_steady(&mut engine, 1000, 5, &idle);
        assert_eq!(d2.used_packages().len(), 2, "{policy}: the ramp holds");
        // One vCPU on each package.
        let on = |pkg: u32| {
            d.assignments
                .iter()
                .position(|a| a.package == pkg)
                .expect("a vCPU on each package") as u32
        };
        let (x, y) = (on(0), on(1));
        let mut loads = one_vm_with_busy(4, &[x, y]);
        loads[x as usize].util = 1000;
        loads[y as usize].util = 1024;
        let d = run_steady(&mut engine, 2000, 3, &loads);
        let (a, b) = (&d.assignments[x as usize], &d.assignments[y as usize]);
        assert_eq!(
            (a.package, b.package),
            (0, 0),
            "{policy}: {:?}",
            d.assignments
        );
        assert_ne!(a.cpus, b.cpus, "{policy}");
    }
}

/// Two busy vCPUs that sat idle on one CPU get a CPU each in their package,
/// even though an idle vCPU holds the package's other CPU.
#[test]
fn busy_vcpus_sharing_a_cpu_split_within_their_package() {
    let topology = HostTopology::from_spec("1x2x1").unwrap();
    let mut engine = Engine::new(
        topology.clone(),
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let loads = |busy: &[u32]| one_vm_with_busy(3, busy);
    let d = run_steady(&mut engine, 0, 10, &loads(&[]));
    // Two idle vCPUs sharing a CPU; make exactly those busy.
    let shared = (0..3usize)
        .flat_map(|a| (a + 1..3).map(move |b| (a, b)))
        .find(|&(a, b)| d.assignments[a].cpus == d.assignments[b].cpus)
        .expect("3 idle vCPUs on 2 CPUs: two share");
    let busy = [shared.0 as u32, shared.1 as u32];
    let d = run_steady(&mut engine, 1000, 2, &loads(&busy));
    assert_ne!(
        d.assignments[shared.0].cpus, d.assignments[shared.1].cpus,
        "{:?}",
        d.assignments
    );
}

/// Spread mode on packages of 20 cores, loads changing every tick (debug
/// builds check every stay-test shortcut against the full search): whenever
/// the busy vCPUs fit one per core, no two of them share a core.
#[test]
fn spread_on_many_core_packages_gives_busy_vcpus_a_core_each() {
    let topology = HostTopology::from_spec("2x20x2").unwrap();
    let mut engine = Engine::new(
        topology.clone(),
        Policy::Performance,
        EngineConfig::default(),
    );
    let core_of = |cpu: u32| {
        let c = topology.cpu(cpu).unwrap();
        (c.package, c.core)
    };
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for tick in 0..60u64 {
        let busy_count = 10 + (tick % 4) as u32 * 10; // 10..=40 busy of 80
        let loads: Vec<VcpuLoad> = (0..80u32)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let busy = i < busy_count;
                VcpuLoad {
                    id: VcpuId {
                        vm: i / 8,
                        vcpu: i % 8,
                    },
                    util: if busy {
                        900 + (x % 124) as u32
                    } else {
                        (x % 60) as u32
                    },
                    busy,
                    waited: 0,
                }
            })
            .collect();
        // A few ticks per load level: migrations are rate limited.
        let d = run_steady(&mut engine, tick * 10_000, 20, &loads);
        let mut cores: Vec<_> = d.assignments[..busy_count as usize]
            .iter()
            .map(|a| core_of(a.cpus.first().unwrap()))
            .collect();
        cores.sort_unstable();
        cores.dedup();
        assert_eq!(cores.len(), busy_count as usize, "tick {tick}");
    }
}
