//! The step loop's own rules, on a hand-set state.

use pvmm_scheduler::policy::Policy;
use pvmm_scheduler::topology::HostTopology;

use super::{Placement, Sim, SimConfig};
use crate::load::LoadSpec;
use crate::spec::VmSpec;

/// Two vCPUs whose threads may run on both CPUs of a package, both last on CPU 0: the one that
/// was running keeps CPU 0, and the one that just woke, the lower index though it is, runs on
/// the idle CPU 1 (one move).
#[test]
fn a_waking_vcpu_does_not_evict_a_running_one() {
    let config = SimConfig::default();
    let topology = HostTopology::from_spec("1x2x1").unwrap();
    let vms = [VmSpec::uniform(2, LoadSpec::Constant { demand: 1.0 }, None)];
    let placement = Placement::Engine(Policy::Balance);
    let mut sim = Sim::new(&topology, &vms, placement, &config).unwrap();
    for (i, v) in sim.vcpus.iter_mut().enumerate() {
        v.allowed = vec![0, 1];
        v.cpu = 0;
        v.runnable = true;
        v.woke = i == 0;
    }
    sim.wake_within_affinity();
    assert_eq!(sim.buffers.runq[0], [1]);
    assert_eq!(sim.buffers.runq[1], [0]);
    assert_eq!(sim.vcpus[0].cpu, 1);
    assert_eq!(sim.totals.migrations, 1);
}
