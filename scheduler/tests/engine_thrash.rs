//! Placement engine thrash control: spreading at once, consolidating only after the ramp-down
//! window.

mod common;

use pvmm_scheduler::placement::{DEFAULT_DEMAND_HALF_LIFE_MS, DEFAULT_RAMP_DOWN_WINDOW_MS};
use pvmm_scheduler::{Engine, EngineConfig, HostTopology, Policy, VcpuId, VcpuLoad};

use common::{busy_vcpus, check_decision, one_vm_with_busy, run_steady, TICK_MS};

/// Spread at once on overload; consolidate only after the ramp-down window;
/// any rise restarts it.
#[test]
fn thrash_control_spreads_at_once_and_consolidates_slowly() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig {
            ramp_down_window_ms: 5000,
            max_migrations_per_vcpu_per_s: 100,
            ..EngineConfig::default()
        },
    );
    let low = busy_vcpus(2);
    let high = busy_vcpus(6);
    let d = engine.place(0, &low).unwrap();
    assert_eq!(d.used_packages().len(), 1);
    // Rise: two packages at once.
    let d = engine.place(100, &high).unwrap();
    assert_eq!(d.used_packages().len(), 2);
    assert_eq!(d.target_packages, 2);
    // Fall at 200 ms: still two packages until the window has passed.
    let mut now = 200;
    while now < 200 + 5000 {
        let d = engine.place(now, &low).unwrap();
        assert_eq!(d.target_packages, 2, "at {now} ms");
        now += TICK_MS;
        // A brief rise at 2 s restarts the ramp.
        if now == 2000 {
            let d = engine.place(now, &high).unwrap();
            assert_eq!(d.target_packages, 2);
            now += TICK_MS;
            break;
        }
    }
    let restart = now;
    let mut consolidated_at = None;
    while now < restart + 8000 {
        let d = engine.place(now, &low).unwrap();
        if d.target_packages == 1 {
            assert_eq!(d.used_packages().len(), 1);
            consolidated_at.get_or_insert(now);
        } else {
            assert!(consolidated_at.is_none(), "never back up while low");
        }
        now += TICK_MS;
    }
    let at = consolidated_at.expect("consolidates eventually");
    assert!(
        at >= restart + 5000,
        "consolidated at {at}, ramp restarted at {restart}"
    );
    assert!(at <= restart + 5000 + TICK_MS);
}

/// When the vCPUs already placed grow and their package no longer holds them
/// at 80 %, the second decision of the rise spreads to another package: one
/// busy tick only moves the demand average, a second one lifts it.
#[test]
fn growing_load_spreads_within_two_ticks() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    for policy in [
        Policy::Balance,
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
    ] {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let light: Vec<VcpuLoad> = (0..5u32)
            .map(|i| VcpuLoad {
                id: VcpuId { vm: i, vcpu: 0 },
                util: 300,
                busy: false,
                waited: 0,
            })
            .collect();
        let d = run_steady(&mut engine, 0, 10, &light);
        assert_eq!(d.used_packages().len(), 1, "{policy}");
        // 5 x 700 x 1.25 = 4375 > 4096: one package no longer fits. (Above
        // 819 a vCPU would count as one whole slot: 4 of them fill 4 cores.)
        let heavy: Vec<VcpuLoad> = light
            .iter()
            .map(|l| VcpuLoad {
                util: 700,
                busy: true,
                ..*l
            })
            .collect();
        let d = engine.place(1000, &heavy).unwrap();
        assert_eq!(d.used_packages().len(), 1, "{policy}: one busy tick");
        let d = engine.place(1100, &heavy).unwrap();
        assert_eq!(d.used_packages().len(), 2, "{policy}");
        assert!(d.moves() >= 1);
    }
}

/// The quadratic ramp releases packages gradually when many are surplus.
#[test]
fn ramp_down_is_quadratic() {
    let topology = HostTopology::from_spec("8x2x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Balance,
        EngineConfig {
            ramp_down_window_ms: 4000,
            max_migrations_per_vcpu_per_s: 100,
            ..EngineConfig::default()
        },
    );
    engine.place(0, &busy_vcpus(16)).unwrap();
    let low = busy_vcpus(1);
    // Ramp from 8 packages to 1 starts at t=1000: after e ms, 7 * e^2/4000^2 packages go.
    let mut targets = Vec::new();
    for e in [0u64, 1000, 2000, 3000, 4000] {
        targets.push(engine.place(1000 + e, &low).unwrap().target_packages);
    }
    assert_eq!(targets, vec![8, 8, 7, 5, 1]);
}

#[test]
fn switching_policy_at_run_time_consolidates() {
    let topology = HostTopology::from_spec("2x4x2").unwrap();
    let config = EngineConfig {
        ramp_down_window_ms: 1000,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(topology, Policy::Performance, config);
    // Four single-vCPU VMs (one 4-vCPU VM split over two packages would rejoin
    // its home package at once: that is cache sharing, not consolidation).
    let loads: Vec<VcpuLoad> = busy_vcpus(4)
        .into_iter()
        .map(|mut l| {
            l.id.vm = l.id.vcpu;
            l
        })
        .collect();
    let d = run_steady(&mut engine, 0, 5, &loads);
    assert_eq!(d.used_packages().len(), 2);
    engine.set_policy(Policy::Powersaving { level: 1 });
    assert_eq!(engine.policy(), Policy::Powersaving { level: 1 });
    // Coming from spreading, consolidation waits for the ramp (1 s), then happens.
    let d = engine.place(600, &loads).unwrap();
    assert_eq!(d.used_packages().len(), 2);
    let d = run_steady(&mut engine, 700, 20, &loads);
    assert_eq!(d.used_packages().len(), 1);
}

/// When one VM's load falls from 4 busy vCPUs to idle on a 2x2
/// host, powersaving keeps using both packages until the ramp-down window has
/// passed; the idle vCPUs fitting at their VM's home package must not bypass
/// the ramp.
#[test]
fn falling_load_of_one_vm_consolidates_after_the_ramp_not_before() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    for (policy, reversed) in [
        (Policy::Balance, false),
        (Policy::Powersaving { level: 1 }, false),
        (Policy::Powersaving { level: 1 }, true),
    ] {
        let mut engine = Engine::new(
            topology.clone(),
            policy,
            EngineConfig {
                ramp_down_window_ms: 5000,
                max_migrations_per_vcpu_per_s: 100,
                ..EngineConfig::default()
            },
        );
        let d = run_steady(&mut engine, 0, 10, &busy_vcpus(4));
        assert_eq!(d.used_packages().len(), 2, "{policy}");
        let idle: Vec<VcpuLoad> = busy_vcpus(4)
            .into_iter()
            .map(|l| VcpuLoad {
                // Timer noise, uneven so that one package holds a little more.
                util: 5 + 40 * if reversed { 3 - l.id.vcpu } else { l.id.vcpu },
                busy: false,
                ..l
            })
            .collect();
        let fall = 1000;
        let mut consolidated_at = None;
        let mut now = fall;
        while now < fall + 8000 {
            let d = engine.place(now, &idle).unwrap();
            check_decision(&topology, &idle, &d);
            if d.used_packages().len() == 1 {
                consolidated_at.get_or_insert(now);
            } else {
                assert!(consolidated_at.is_none(), "{policy}: back up while idle");
            }
            now += TICK_MS;
        }
        let at = consolidated_at.unwrap_or_else(|| panic!("{policy}: never consolidated"));
        // Idle loads tie, whatever their noise: the lower package wins.
        let d = engine.place(now, &idle).unwrap();
        assert_eq!(d.used_packages(), vec![0], "{policy}");
        // The ramp starts once the demand average says one package is enough: within two
        // half-lives of the fall (from a whole CPU to a quarter, under the 0.4 of a CPU at
        // which four vCPUs fit one package of two CPUs with the fit rule's headroom).
        let demand_decay = 2 * u64::from(DEFAULT_DEMAND_HALF_LIFE_MS);
        assert!(
            at >= fall + 5000 && at <= fall + 5000 + demand_decay + TICK_MS,
            "{policy}: consolidated at {at} ms, load fell at {fall} ms"
        );
    }
}

/// A fall as a slow nested rig shows it: right after 4 busy vCPUs go idle, the
/// guest's own housekeeping (reaping the finished jobs) makes the vCPUs of
/// package 1 busy for a tick each, one after the other. Each one alone fits
/// at home, but going home would empty package 1 before the ramp-down window
/// has passed: busy or not, nobody leaves a package the ramp still holds.
#[test]
fn bursts_after_a_fall_do_not_consolidate_before_the_ramp() {
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    for policy in [Policy::Balance, Policy::Powersaving { level: 1 }] {
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let d = run_steady(&mut engine, 0, 10, &one_vm_with_busy(4, &[0, 1, 2, 3]));
        let on_1: Vec<u32> = (0..4)
            .filter(|&v| d.assignments[v as usize].package == 1)
            .collect();
        assert_eq!(on_1.len(), 2, "{policy}: spread over both packages");
        let fall = 1000;
        let mut now = fall;
        let mut tick = 0usize;
        while now < fall + DEFAULT_RAMP_DOWN_WINDOW_MS {
            // One vCPU of package 1 busy in each of the first ticks, then idle.
            let busy: Vec<u32> = on_1.get(tick).copied().into_iter().collect();
            let loads = one_vm_with_busy(4, &busy);
            let d = engine.place(now, &loads).unwrap();
            check_decision(&topology, &loads, &d);
            assert_eq!(
                d.used_packages().len(),
                2,
                "{policy}: consolidated {} ms after the fall (vCPUs busy: {busy:?})",
                now - fall
            );
            now += TICK_MS;
            tick += 1;
        }
        // After the ramp and the demand average's decay (as in the test above).
        let ticks = 3 + 2 * u64::from(DEFAULT_DEMAND_HALF_LIFE_MS) / TICK_MS;
        let d = run_steady(&mut engine, now, ticks, &one_vm_with_busy(4, &[]));
        assert_eq!(d.used_packages(), vec![0], "{policy}: after the ramp");
    }
}

/// Four VMs, each with one vCPU running short bursts (29 % of a CPU in 70 ms periods) and one
/// idle vCPU, on two packages of two CPUs. Sampled every 100 ms such a vCPU reads 22-40 %,
/// depending on how many bursts fell into the tick; at the highest readings the four no
/// longer fit one package with the fit rule's headroom, at the lowest they fit easily. The
/// engine packs on the demand average: one package, and no move once settled. Packing on each
/// tick's reading instead keeps a second package open (every highest reading needs it again
/// before the ramp-down has passed).
#[test]
fn bursty_vcpus_stay_put_on_one_package() {
    // One vCPU's readings over seven ticks (its 70 ms period against the 100 ms tick), as the
    // simulator measures them; the four VMs' bursts in phase, the worst case.
    const READINGS: [u32; 7] = [402, 230, 399, 231, 385, 245, 330];
    let topology = HostTopology::from_spec("2x2x1").unwrap();
    let loads_at = |tick: usize| -> Vec<VcpuLoad> {
        (0..4u32)
            .flat_map(|vm| {
                let bursty = READINGS[tick % READINGS.len()];
                [(0, bursty), (1, 20)].map(|(vcpu, util)| VcpuLoad {
                    id: VcpuId { vm, vcpu },
                    util,
                    busy: false,
                    waited: 0,
                })
            })
            .collect()
    };
    let run = |config: EngineConfig| {
        let mut engine = Engine::new(topology.clone(), Policy::Powersaving { level: 1 }, config);
        let (mut moves, mut packages) = (0, Vec::new());
        for tick in 0..300usize {
            let loads = loads_at(tick);
            let d = engine.place(tick as u64 * TICK_MS, &loads).unwrap();
            check_decision(&topology, &loads, &d);
            // After the first ramp-down window and the average's settling.
            if tick >= 100 {
                moves += d.moves();
                packages.push(d.used_packages().len());
            }
        }
        (moves, packages)
    };
    let (moves, packages) = run(EngineConfig::default());
    assert_eq!(moves, 0);
    assert!(packages.iter().all(|&p| p == 1), "{packages:?}");
    let (_, raw_packages) = run(EngineConfig {
        demand_half_life_ms: 0,
        ..EngineConfig::default()
    });
    assert!(raw_packages.iter().all(|&p| p == 2), "{raw_packages:?}");
}

/// Two vCPUs placed together on one CPU (their demands fit it with the fit rule's headroom)
/// stay together when their demands grow a little past that (a CPU is relieved only when its
/// vCPUs use more than 90 % of it), and are parted when they grow clearly past it.
#[test]
fn a_cpu_a_little_over_its_slot_keeps_its_vcpus() {
    let topology = HostTopology::from_spec("1x2x1").unwrap();
    let mut engine = Engine::new(
        topology,
        Policy::Powersaving { level: 1 },
        EngineConfig::default(),
    );
    let pair = |util: u32| -> Vec<VcpuLoad> {
        (0..2)
            .map(|vcpu| VcpuLoad {
                id: VcpuId { vm: 0, vcpu },
                util,
                busy: false,
                waited: 0,
            })
            .collect()
    };
    let cpus = |d: &pvmm_scheduler::Decision| -> Vec<u32> {
        d.assignments
            .iter()
            .map(|a| a.cpus.first().unwrap())
            .collect()
    };
    // 2 x 400 x 1.25 = 1000 of 1024: one CPU.
    let d = run_steady(&mut engine, 0, 30, &pair(400));
    assert_eq!(cpus(&d), vec![0, 0]);
    // 2 x 440 x 1.25 = 1100: over the slot, under 1152 (90 % of it used).
    let mut now = 30 * TICK_MS;
    for _ in 0..50 {
        let d = engine.place(now, &pair(440)).unwrap();
        assert_eq!(cpus(&d), vec![0, 0], "at {now} ms");
        now += TICK_MS;
    }
    // 2 x 480 x 1.25 = 1200: relieved.
    let d = run_steady(&mut engine, now, 30, &pair(480));
    assert_eq!(cpus(&d), vec![0, 1]);
}
