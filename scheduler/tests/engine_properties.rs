//! Placement engine properties over random topologies, policies and loads: allowed CPUs,
//! package counts, convergence, determinism, migration bounds.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;

use proptest::prelude::*;
use pvmm_scheduler::capacity::FIT_MARGIN;
use pvmm_scheduler::{CpuSet, Decision, Engine, EngineConfig, HostTopology, Policy};

use common::{
    check_decision, loads_for, packing_capacity, policy_strategy, provoke_moves, run_steady,
    spec_strategy, TICK_MS,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// No vCPU is ever placed outside the allowed CPUs, under any policy and load.
    #[test]
    fn never_outside_allowed_cpus(
        (s, c, t) in spec_strategy(),
        mask in any::<u64>(),
        policy in policy_strategy(),
        vms in prop::collection::vec(1u32..=4, 1..8),
        utils in prop::collection::vec(0u32..=1100, 40),
        ticks in 1u64..12,
    ) {
        let full = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let n = full.cpus().len() as u32;
        let mut allowed: CpuSet = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        if allowed.is_empty() {
            allowed.insert(n - 1);
        }
        let topology = full.restrict(&allowed).unwrap();
        let mut engine = Engine::new(topology.clone(), policy, EngineConfig::default());
        let vm_list: Vec<(u32, u32)> = vms.iter().enumerate().map(|(i, n)| (i as u32 * 7, *n)).collect();
        for tick in 0..ticks {
            let loads = loads_for(&vm_list, |vm, vcpu| utils[((vm + vcpu + tick as u32 * 3) % 40) as usize]);
            let d = engine.place(tick * TICK_MS, &loads).unwrap();
            check_decision(&topology, &loads, &d);
            for a in &d.assignments {
                prop_assert!(a.cpus.is_subset(&allowed));
            }
        }
    }

    /// Powersaving never uses more packages than performance for the same loads.
    #[test]
    fn powersaving_never_uses_more_packages_than_performance(
        (s, c, t) in spec_strategy(),
        vms in prop::collection::vec(1u32..=4, 1..8),
        utils in prop::collection::vec(0u32..=1024, 40),
        level in 1u8..=2,
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let mut perf = Engine::new(topology.clone(), Policy::Performance, EngineConfig::default());
        let mut save = Engine::new(topology, Policy::Powersaving { level }, EngineConfig::default());
        let vm_list: Vec<(u32, u32)> = vms.iter().enumerate().map(|(i, n)| (i as u32, *n)).collect();
        for tick in 0..8u64 {
            let loads = loads_for(&vm_list, |vm, vcpu| utils[((vm * 5 + vcpu + tick as u32) % 40) as usize]);
            let p = perf.place(tick * TICK_MS, &loads).unwrap();
            let q = save.place(tick * TICK_MS, &loads).unwrap();
            prop_assert!(q.used_packages().len() <= p.used_packages().len(),
                "powersaving {:?} vs performance {:?}", q.used_packages(), p.used_packages());
        }
    }

    /// With equal-sized loads, powersaving and balance use the fewest packages
    /// that can hold them at 80 %: ceil(n / floor(0.8 C / u)) for n vCPUs of
    /// utilization u (a vCPU cannot be split over packages). That is
    /// ceil(U / (0.8 C)) whenever u divides 0.8 C (see
    /// `equal_loads_match_the_fluid_formula`) and never fewer. Loads are below
    /// 80 % of one slot: a saturated vCPU fills exactly one slot instead (see the
    /// LTP oracle test).
    #[test]
    fn equal_loads_use_the_fewest_packages_at_eighty_percent(
        (s, c, t) in spec_strategy(),
        per_vm in 1u32..=3,
        vm_count in 1u32..=12,
        frac in 3u32..=100,
        policy in prop::sample::select(vec![Policy::Balance, Policy::Powersaving { level: 1 }, Policy::Powersaving { level: 2 }]),
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let (pkg_cap, slot) = packing_capacity(&topology, policy);
        // util below 80 % of a slot: uncapped fit demand.
        let util = ((slot * 1024 / FIT_MARGIN) * u64::from(frac) / 100).max(16) as u32;
        let loads = loads_for(&(0..vm_count).map(|v| (v, per_vm)).collect::<Vec<_>>(), |_, _| util);
        let n = loads.len() as u64;
        let per_package = (pkg_cap * 1024) / (u64::from(util) * FIT_MARGIN);
        let expected = n.div_ceil(per_package).max(1);
        let fluid = (u64::from(util) * n * FIT_MARGIN).div_ceil(pkg_cap * 1024).max(1);
        prop_assert!(expected >= fluid);
        prop_assume!(expected <= topology.num_packages() as u64);
        let config = EngineConfig { ramp_down_window_ms: 0, ..EngineConfig::default() };
        let mut engine = Engine::new(topology.clone(), policy, config);
        let d = run_steady(&mut engine, 0, 30, &loads);
        check_decision(&topology, &loads, &d);
        prop_assert!(!d.overutilized);
        prop_assert_eq!(d.used_packages().len() as u64, expected, "n={} C={} util={}", n, pkg_cap, util);
    }

    /// Once a steady load has converged, no more migrations.
    #[test]
    fn no_migrations_once_converged(
        (s, c, t) in spec_strategy(),
        policy in policy_strategy(),
        vms in prop::collection::vec(1u32..=4, 1..8),
        utils in prop::collection::vec(0u32..=1024, 40),
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let vm_list: Vec<(u32, u32)> = vms.iter().enumerate().map(|(i, n)| (i as u32, *n)).collect();
        let loads = loads_for(&vm_list, |vm, vcpu| utils[((vm * 3 + vcpu) % 40) as usize]);
        let mut engine = Engine::new(topology, policy, EngineConfig::default());
        // 10 s: two ramp-down windows and plenty of migration tokens.
        run_steady(&mut engine, 0, 100, &loads);
        for tick in 100..130u64 {
            let d = engine.place(tick * TICK_MS, &loads).unwrap();
            prop_assert_eq!(d.moves(), 0, "tick {}: {:?}", tick, d.migrations);
        }
    }

    /// Same inputs, same outputs.
    #[test]
    fn deterministic(
        (s, c, t) in spec_strategy(),
        policy in policy_strategy(),
        vms in prop::collection::vec(1u32..=4, 1..6),
        utils in prop::collection::vec(0u32..=1024, 40),
    ) {
        let topology = HostTopology::from_spec(&format!("{s}x{c}x{t}")).unwrap();
        let vm_list: Vec<(u32, u32)> = vms.iter().enumerate().map(|(i, n)| (i as u32, *n)).collect();
        let mut a = Engine::new(topology.clone(), policy, EngineConfig::default());
        let mut b = Engine::new(topology, policy, EngineConfig::default());
        // b reuses one Decision through place_into: same results.
        let mut out = Decision::default();
        for tick in 0..20u64 {
            let loads = loads_for(&vm_list, |vm, vcpu| utils[((vm + vcpu * 7 + tick as u32) % 40) as usize]);
            b.place_into(tick * 37, &loads, &mut out).unwrap();
            prop_assert_eq!(a.place(tick * 37, &loads).unwrap(), out.clone());
        }
    }

    /// The token bucket: between any two of a vCPU's moves `T` ms apart,
    /// counting both, it moves at most `limit` times (a full bucket) plus
    /// `limit` per second of `T`.
    #[test]
    fn migrations_per_vcpu_are_bounded(
        limit in 0u32..=3,
        policy in policy_strategy(),
    ) {
        let move_ms = provoke_moves(policy, limit, 50);
        for (i, times) in move_ms.iter().enumerate() {
            for (a, first) in times.iter().enumerate() {
                for (b, last) in times.iter().enumerate().skip(a) {
                    let moves = (b - a + 1) as u64;
                    let allowed_x1000 = u64::from(limit) * (1000 + (last - first));
                    prop_assert!(
                        moves * 1000 <= allowed_x1000,
                        "vCPU {} moved {} times from {} to {} ms", i, moves, first, last
                    );
                }
            }
        }
    }
}
