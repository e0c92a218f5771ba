//! A decision allocates nothing once warm, even the first time it takes a path the earlier
//! ones did not: spread mode after minutes of packing, a first migration after none. The
//! live tick runs a decision every few milliseconds for the VM's whole life, and a path first
//! taken under a rare load (the host overloaded, a stall that made every vCPU look busy)
//! must not allocate then either.
//!
//! The counter ([`pvmm_testutil::alloc_count`]) is per thread, so the test harness's other
//! threads do not disturb it.

mod common;

use pvmm_scheduler::{Decision, Engine, EngineConfig, HostTopology, Policy};
use pvmm_testutil::alloc_count::{thread_allocations, CountingAllocator};

use common::{one_vm_with_busy, TICK_MS};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Decisions the engine makes on the light load before the counted ones: enough for the
/// consolidation ramp to settle, so that the warm decisions move no vCPU.
const WARM_DECISIONS: u64 = 200;

#[test]
fn a_first_spread_decision_and_first_migration_allocate_nothing() {
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    for policy in [
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
        Policy::Balance,
    ] {
        let mut engine = Engine::new(
            topology.clone(),
            policy,
            EngineConfig {
                demand_half_life_ms: 0,
                ..EngineConfig::default()
            },
        );
        let light = one_vm_with_busy(8, &[0, 1]);
        let heavy = one_vm_with_busy(8, &[0, 1, 2, 3, 4, 5, 6, 7]);
        let mut out = Decision::default();
        let mut t = 0;
        let mut migrations = 0;
        for _ in 0..WARM_DECISIONS {
            engine.place_into(t * TICK_MS, &light, &mut out).unwrap();
            migrations += out.migrations.len();
            t += 1;
        }
        assert!(
            !out.overutilized && out.migrations.is_empty(),
            "{policy}: the warm decisions should pack and settle"
        );
        assert_eq!(
            migrations, 0,
            "{policy}: the light load packs where placed first"
        );

        // Every vCPU busy and the placing process's threads busy too: more than the host
        // holds, so the engine spreads, for the first time, and moves vCPUs.
        let before = thread_allocations();
        let mut spread = false;
        let mut moved = 0;
        for _ in 0..10 {
            engine.set_housekeeping(Some(0), 2048);
            engine.place_into(t * TICK_MS, &heavy, &mut out).unwrap();
            spread |= out.overutilized;
            moved += out.migrations.len();
            t += 1;
        }
        let allocations = thread_allocations() - before;
        assert!(spread, "{policy}: the heavy load should overload the host");
        assert!(moved > 0, "{policy}: the heavy load should move vCPUs");
        assert_eq!(
            allocations, 0,
            "{policy}: the first spread decisions allocated {allocations} times"
        );
    }
}
