//! Helpers the placement engine tests share: loads, steady runs, decision checks, strategies.

// Each test file uses some of them; every cast is on a value the tests choose or bound.
#![allow(dead_code, clippy::cast_possible_truncation)]

use proptest::prelude::*;
use pvmm_scheduler::capacity::{group_capacity, CAPACITY_SCALE};
use pvmm_scheduler::{Decision, Engine, EngineConfig, HostTopology, Policy, VcpuId, VcpuLoad};

/// Placement tick of the live VMM.
pub const TICK_MS: u64 = pvmm_scheduler::placement::DEFAULT_TICK_MS;

pub fn loads_for(vms: &[(u32, u32)], util: impl Fn(u32, u32) -> u32) -> Vec<VcpuLoad> {
    let mut loads = Vec::new();
    for (vm, count) in vms {
        for vcpu in 0..*count {
            let u = util(*vm, vcpu);
            loads.push(VcpuLoad {
                id: VcpuId { vm: *vm, vcpu },
                util: u,
                busy: u >= 512,
                waited: 0,
            });
        }
    }
    loads
}

pub fn busy_vcpus(n: u32) -> Vec<VcpuLoad> {
    (0..n)
        .map(|i| VcpuLoad {
            id: VcpuId { vm: 0, vcpu: i },
            util: 1024,
            busy: true,
            waited: 0,
        })
        .collect()
}

/// One VM of `n` vCPUs: those in `busy` always busy, the others idle (20 of
/// 1024: timer noise).
pub fn one_vm_with_busy(n: u32, busy: &[u32]) -> Vec<VcpuLoad> {
    (0..n)
        .map(|v| {
            let b = busy.contains(&v);
            VcpuLoad {
                id: VcpuId { vm: 0, vcpu: v },
                util: if b { 1024 } else { 20 },
                busy: b,
                waited: 0,
            }
        })
        .collect()
}

/// Knuth's MMIX linear congruential step; returns the state's high bits
/// (deterministic noise for the tests, no dependency).
pub fn lcg_next(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

/// Runs `ticks` decisions with the same loads; returns the last one.
pub fn run_steady(engine: &mut Engine, start_ms: u64, ticks: u64, loads: &[VcpuLoad]) -> Decision {
    let mut last = Decision::default();
    for t in 0..ticks {
        last = engine.place(start_ms + t * TICK_MS, loads).unwrap();
    }
    last
}

pub fn check_decision(topology: &HostTopology, loads: &[VcpuLoad], d: &Decision) {
    assert_eq!(d.assignments.len(), loads.len());
    let allowed = topology.cpu_set();
    for (a, l) in d.assignments.iter().zip(loads) {
        assert_eq!(a.id, l.id, "assignments follow input order");
        assert!(!a.cpus.is_empty());
        assert!(a.cpus.is_subset(&allowed), "{:?} outside {allowed}", a.cpus);
        for cpu in &a.cpus {
            assert_eq!(topology.package_of(cpu), Some(a.package));
        }
        assert!(
            a.cpus.contains(a.cpu),
            "its own CPU {} is in {:?}",
            a.cpu,
            a.cpus
        );
        assert!((1..=CAPACITY_SCALE).contains(&a.capacity));
    }
}

pub fn spec_strategy() -> impl Strategy<Value = (u32, u32, u32)> {
    (1u32..=4, 1u32..=4, 1u32..=2)
}

pub fn policy_strategy() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::ALL.to_vec())
}

/// Places 12 vCPUs whose load jumps between them every tick, for `ticks`
/// ticks, and returns when (ms) each vCPU moved.
pub fn provoke_moves(policy: Policy, limit: u32, ticks: u64) -> Vec<Vec<u64>> {
    let topology = HostTopology::from_spec("2x4x2").unwrap();
    let config = EngineConfig {
        ramp_down_window_ms: 0,
        max_migrations_per_vcpu_per_s: limit,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(topology, policy, config);
    let mut move_ms = vec![Vec::new(); 12];
    for tick in 0..ticks {
        let loads: Vec<VcpuLoad> = (0..12u32)
            .map(|i| {
                let hot = (i + tick as u32).is_multiple_of(3);
                VcpuLoad {
                    id: VcpuId { vm: i % 3, vcpu: i },
                    util: if hot { 1000 } else { 20 },
                    busy: hot,
                    waited: 0,
                }
            })
            .collect();
        let d = engine.place(tick * TICK_MS, &loads).unwrap();
        for m in &d.migrations {
            move_ms[m.id.vcpu as usize].push(tick * TICK_MS);
        }
    }
    move_ms
}

/// Capacity one package offers a packing policy (balance: one thread per core;
/// powersaving: every thread, SMT shared) and the size of one slot.
pub fn packing_capacity(topology: &HostTopology, policy: Policy) -> (u64, u64) {
    let group = group_capacity(topology, &topology.package_cpus(topology.packages()[0].id));
    match policy {
        Policy::Balance => (u64::from(group.cores) * 1024, 1024),
        _ => (
            u64::from(group.capacity),
            u64::from(group.capacity / group.cpus),
        ),
    }
}
