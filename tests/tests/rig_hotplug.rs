//! A host CPU going offline under a running VM, and coming back, checked from L1's `/proc`
//! (L1 = 2 packages x 2 cores; a 4-vCPU guest under `--policy performance` with all four
//! vCPUs busy, so each has a CPU of its own, CPU 3 included).
//!
//! When the guest prints `pvmm-mark: cpu-off`, L1 takes CPU 3 offline (`echo 0 >
//! /sys/devices/system/cpu/cpu3/online`); at `pvmm-mark: cpu-on` it brings it back. The kernel
//! moves a thread pinned to an offline CPU itself, widening its affinity to every CPU left, so
//! "no vCPU on CPU 3" alone would not show pvmm at work: what is checked is that pvmm pins
//! every vCPU to one online CPU again within two ticks, and uses CPU 3 again within two ticks
//! of its return. One tick of slack on each bound, and the time L1's watcher takes to see the
//! mark ([`MARK_POLL_S`]), as in `rig_placement`.

use std::sync::OnceLock;

use pvmm_rig::RigOutcome;
use pvmm_tests::{run_placement_sequence_with_probe, run_trace, PlacementTrace, GUEST_HELPERS};

/// The L1 CPU taken offline (package 1).
const OFFLINE_CPU: u32 = 3;
/// How often L1's watcher looks for the guest's marks (s).
const MARK_POLL_S: f64 = 0.2;
/// Two ticks plus one of slack, in ticks.
const SETTLE_TICKS: usize = 3;

/// Four busy vCPUs for 16 s; CPU 3 goes offline 5 s in and comes back 5 s later.
fn guest_command() -> String {
    format!(
        "{GUEST_HELPERS}for c in 0 1 2 3; do l $c 16; done\nsleep 5\necho pvmm-mark: cpu-off\nsleep 5\necho pvmm-mark: cpu-on\nwait\n"
    )
}

/// L1 side, before the placement probe: takes CPU 3 offline and back at the guest's marks.
fn probe_prefix() -> String {
    format!(
        r#"( until grep -q cpu-off /tmp/rig-marks 2>/dev/null; do kill -0 $PVMM_PID 2>/dev/null || exit 0; sleep {MARK_POLL_S}; done
  echo 0 > /sys/devices/system/cpu/cpu{OFFLINE_CPU}/online
  until grep -q cpu-on /tmp/rig-marks; do kill -0 $PVMM_PID 2>/dev/null || break; sleep {MARK_POLL_S}; done
  echo 1 > /sys/devices/system/cpu/cpu{OFFLINE_CPU}/online ) > /dev/null 2>&1 &
"#
    )
}

fn outcome() -> Option<&'static RigOutcome> {
    static OUTCOME: OnceLock<Option<RigOutcome>> = OnceLock::new();
    OUTCOME
        .get_or_init(|| {
            run_placement_sequence_with_probe(
                "rig_hotplug",
                &[(
                    "hotplug",
                    vec!["--vcpus", "4", "--policy", "performance"],
                    guest_command(),
                )],
                &probe_prefix(),
            )
        })
        .as_ref()
}

/// Samples taken from `SETTLE_TICKS` ticks (and one mark poll) after L1 time `from` until
/// L1 time `to`.
fn settled_between(trace: &PlacementTrace, from: f64, to: f64) -> Vec<usize> {
    (0..trace.samples.len())
        .filter(|&i| {
            let t = trace.samples[i].t;
            t < to && trace.ticks_between(from + MARK_POLL_S, t) >= SETTLE_TICKS
        })
        .collect()
}

#[test]
fn vcpus_leave_an_offline_cpu_and_use_it_again_when_it_returns() {
    let Some(outcome) = outcome() else { return };
    let (run, trace) = run_trace(outcome, "hotplug");
    let off = trace.mark("cpu-off").expect("the guest marks cpu-off");
    let on = trace.mark("cpu-on").expect("the guest marks cpu-on");
    let end = trace.samples.last().map_or(on, |s| s.t);
    let describe = || trace.describe(0, trace.samples.len() - 1);

    let before: Vec<usize> = (0..trace.samples.len())
        .filter(|&i| trace.samples[i].t < off)
        .collect();
    assert!(
        before
            .iter()
            .any(|&i| (0..4).all(|v| trace.has_own_cpu(i, v))),
        "before CPU {OFFLINE_CPU} goes offline, every busy vCPU should have a CPU of its own at some sample:\n{}",
        describe()
    );

    let offline = settled_between(&trace, off, on);
    assert!(
        offline.len() >= 3,
        "too few samples while CPU {OFFLINE_CPU} is offline:\n{}",
        describe()
    );
    for &i in &offline {
        for t in &trace.samples[i].threads {
            assert!(
                t.allowed.len() == 1 && t.allowed[0] != OFFLINE_CPU,
                "vCPU {} is allowed {:?} at t={:.2}, with CPU {OFFLINE_CPU} offline since the mark at {off:.2}: pvmm should pin it to one online CPU:\n{}",
                t.vcpu,
                t.allowed,
                trace.samples[i].t,
                describe()
            );
        }
    }

    let online = settled_between(&trace, on, end + 1.0);
    assert!(
        online
            .iter()
            .any(|&i| trace.samples[i].threads.iter().any(|t| t.allowed == [OFFLINE_CPU])),
        "CPU {OFFLINE_CPU} came back at the mark at {on:.2} but no vCPU was placed on it again:\n{}",
        describe()
    );
    assert!(
        run.vmm
            .iter()
            .any(|l| l.contains("host CPUs online changed: placing on 0-2")),
        "pvmm should say that it places on CPUs 0-2; its stderr:\n{}",
        run.vmm.join("\n")
    );
}
