//! Sharing a package's CPUs (`EngineConfig::share_package`): the same packing decision, with
//! each packed vCPU allowed every CPU its package uses.

mod common;

use pvmm_scheduler::{CpuSet, Engine, EngineConfig, HostTopology, Policy, VcpuId, VcpuLoad};

use common::{check_decision, run_steady};

/// One VM of `n` vCPUs, each at `util`.
fn vm(n: u32, util: u32, busy: bool) -> Vec<VcpuLoad> {
    (0..n)
        .map(|vcpu| VcpuLoad {
            id: VcpuId { vm: 0, vcpu },
            util,
            busy,
            waited: 0,
        })
        .collect()
}

fn engine(policy: Policy, share_package: bool) -> Engine {
    let config = EngineConfig {
        share_package,
        ..EngineConfig::default()
    };
    Engine::new(HostTopology::from_spec("2x4x1").unwrap(), policy, config)
}

#[test]
fn packed_vcpus_may_run_on_every_cpu_their_package_uses() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    // Six vCPUs a quarter busy fit package 0, several to a CPU.
    let loads = vm(6, 256, false);
    for policy in [
        Policy::Balance,
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
    ] {
        let pinned = run_steady(&mut engine(policy, false), 0, 20, &loads);
        let shared = run_steady(&mut engine(policy, true), 0, 20, &loads);
        check_decision(&topology, &loads, &pinned);
        check_decision(&topology, &loads, &shared);
        // The same decision: each vCPU's own CPU, package and capacity.
        for (p, s) in pinned.assignments.iter().zip(&shared.assignments) {
            assert_eq!(
                (p.cpu, p.package, p.capacity),
                (s.cpu, s.package, s.capacity)
            );
            assert_eq!(
                p.cpus,
                CpuSet::single(p.cpu),
                "{policy}: pinned to its own CPU"
            );
        }
        let used: CpuSet = shared.assignments.iter().map(|a| a.cpu).collect();
        assert!(used.len() >= 2, "{policy}: the vCPUs share one CPU: {used}");
        assert_eq!(shared.used_packages(), vec![0]);
        for a in &shared.assignments {
            assert_eq!(a.cpus, used, "{policy}: vCPU {}", a.id.vcpu);
        }
    }
}

#[test]
fn spreading_keeps_one_cpu_per_vcpu() {
    // performance spreads, and so does any policy on a host too full to pack: no sharing.
    for (policy, util) in [(Policy::Performance, 256), (Policy::Balance, 1024)] {
        let loads = vm(10, util, util == 1024);
        let d = run_steady(&mut engine(policy, true), 0, 20, &loads);
        for a in &d.assignments {
            assert_eq!(
                a.cpus,
                CpuSet::single(a.cpu),
                "{policy}: vCPU {}",
                a.id.vcpu
            );
        }
    }
}

#[test]
fn a_move_is_a_change_of_the_vcpus_own_cpu() {
    // Two vCPUs idle on one CPU, then one turns busy: the two get a CPU each, which is one
    // move from one CPU to another, though the shared set of the vCPU that stayed changed too.
    let mut e = engine(Policy::Balance, true);
    let mut loads = vm(2, 16, false);
    run_steady(&mut e, 0, 20, &loads);
    loads[1].util = 1024;
    loads[1].busy = true;
    let mut moves = Vec::new();
    let mut last = None;
    for t in 0..3 {
        let d = e.place(2_000 + t * 100, &loads).unwrap();
        moves.extend(d.migrations.clone());
        last = Some(d);
    }
    let d = last.unwrap();
    assert_ne!(d.assignments[0].cpu, d.assignments[1].cpu, "{d:?}");
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].from.len(), 1);
    assert_eq!(moves[0].to.len(), 1);
}
