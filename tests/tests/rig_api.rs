//! The control socket end to end in the rig (L1 = 2 packages x 2 cores, a 4-vCPU guest under
//! pvmm with `--api-socket`), everything read where it really is: thread affinity from L1's
//! `/proc`, capacities from the guest's own sysfs.
//!
//! 1. An outside balancer (a loop in L1 calling `pvmm ctl ... external`, renewing every
//!    0.5 s) puts vCPUs 0 and 1 on L1 CPU 3 with capacity 300: L1 shows their threads allowed
//!    only CPU 3, and the guest reads 300 on its performance scale (74) as their
//!    `highest_perf`.
//! 2. The balancer stops renewing: after the lease pvmm places the vCPUs itself again (the
//!    guest's `highest_perf` leaves 74, the threads leave CPU 3), and says so once.
//! 3. The guest idles, consolidated on package 0, for 25 s: none of pvmm's own threads may run
//!    on package 1 (their `Cpus_allowed_list` and last CPU in L1, sampled every 0.5 s).
//! 4. Under the default `--seccomp kill`, every pvmm thread L1 showed (the placement probe
//!    reads each one's `Seccomp:` every 0.1 s) ran under a seccomp filter.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use pvmm::cppc::perf_of_capacity;
use pvmm_rig::RigOutcome;
use pvmm_tests::scripts;
use pvmm_tests::{
    balanced_pvmm_args, run_placement_sequence_with_probe, run_trace, CpuSet, SharedOutcome,
    BALANCER_RENEW_S,
};
use std::collections::HashMap;

/// The socket pvmm serves in L1.
const SOCKET: &str = "/tmp/pvmm-api.sock";
/// The capacity the outside balancer gives vCPUs 0 and 1: not a value pvmm's own placement
/// gives on this host (1024, or a share of a CPU near 512 or 1024 for idle packed vCPUs).
const EXTERNAL_CAPACITY: u64 = 300;
/// What the guest reads for it: [`EXTERNAL_CAPACITY`] on the guest's performance scale. Only
/// vCPUs 0 and 1 get it, so the vCPUs are not all equal and none is moved by the tie-break.
const EXTERNAL_PERF: u64 = perf_of_capacity(EXTERNAL_CAPACITY as u32) as u64;
/// The L1 CPU the outside balancer puts vCPUs 0 and 1 on (package 1).
const EXTERNAL_CPU: u32 = 3;
/// Seconds the guest idles at the end; the own-thread check covers its last 22 s.
const IDLE_SECS: u32 = 30;
/// Seconds at the start of the idle window left out of the check: pvmm places the vCPUs
/// afresh when the lease ends (the guest's polling loop made them look busy), and packs them
/// only after its 5 s ramp-down; 3 s more for the guest's polling to fade.
const IDLE_SETTLE_SECS: f64 = 8.0;

/// Guest side: announce readiness, wait (up to 2 min) until vCPU 0's `highest_perf` is the
/// outside capacity (on the guest's scale) and read all, ask the balancer to stop, wait until it changes and read
/// again, then idle.
fn guest_command() -> String {
    scripts::guest(
        &[
            ("EXTERNAL_PERF", &EXTERNAL_PERF.to_string()),
            ("IDLE_SECS", &IDLE_SECS.to_string()),
        ],
        scripts::API_GUEST,
    )
}

/// L1 side, before the placement probe: the outside balancer's renewal loop, and a sampler of
/// pvmm's non-vCPU threads (`O <L1 uptime> <comm> <Cpus_allowed_list> <last CPU> <ns run>
/// <tid>`, the time run from the thread's `schedstat`). Both write
/// to files that an exit trap prints after the placement probe's own output (two writers on
/// the probe's pipe could split each other's lines).
fn probe_prefix() -> String {
    pvmm_rig::scripts::assemble(
        &[
            ("EXTERNAL_CPU", &EXTERNAL_CPU.to_string()),
            ("EXTERNAL_CAPACITY", &EXTERNAL_CAPACITY.to_string()),
            ("SOCKET", SOCKET),
            ("BALANCER_RENEW_S", &BALANCER_RENEW_S.to_string()),
        ],
        &[scripts::API_PROBE],
    )
}

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        run_placement_sequence_with_probe(
            "rig_api",
            &[("api", balanced_pvmm_args(SOCKET), guest_command())],
            &probe_prefix(),
        )
    })
}

/// The guest's `CPPC LABEL v0 v1 v2 v3 GED n` line for `label`.
fn cppc_line(guest: &[String], label: &str) -> Vec<u64> {
    let prefix = format!("CPPC {label} ");
    let line = guest
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| {
            panic!(
                "no {prefix:?} line; the guest printed:\n{}",
                guest.join("\n")
            )
        });
    line.split_whitespace()
        .take_while(|w| *w != "GED")
        .map(|w| w.parse().expect("a highest_perf value"))
        .collect()
}

#[test]
fn external_placement_reaches_l1_and_the_guest_and_lapses_with_its_lease() {
    let Some(outcome) = outcome() else {
        return;
    };
    let (run, trace) = run_trace(outcome, "api");
    let ext = cppc_line(run.guest, "ext");
    assert_eq!(
        &ext[..2],
        &[EXTERNAL_PERF; 2],
        "guest's highest_perf under external placement"
    );
    let renewals = run.probe.iter().find_map(|l| l.strip_prefix("RENEWALS "));
    assert!(
        renewals
            .and_then(|n| n.trim().parse::<u32>().ok())
            .is_some_and(|n| n > 0),
        "the balancer loop never succeeded: {renewals:?}"
    );
    // L1's view while the guest read the outside capacity: vCPUs 0 and 1 allowed only CPU 3.
    let read_at = trace.mark("cppc-ext").expect("the guest's cppc-ext mark");
    let pinned = trace.samples.iter().filter(|s| s.t <= read_at).any(|s| {
        s.threads
            .iter()
            .filter(|t| t.vcpu < 2)
            .all(|t| t.allowed == [EXTERNAL_CPU])
    });
    assert!(pinned, "L1 never showed vCPUs 0-1 allowed only CPU {EXTERNAL_CPU} before the guest read {EXTERNAL_PERF}:\n{}", trace.describe(0, trace.samples.len()));
    // The lease lapses: pvmm places vCPUs 0 and 1 itself again. Its own policy may use any
    // CPU, CPU 3 included; what must go is the balancer's pinning of both to CPU 3. pvmm logs
    // the expiry once.
    let own = cppc_line(run.guest, "own");
    assert_ne!(own[0], EXTERNAL_PERF);
    let released_at = trace.mark("cppc-own").expect("the guest's cppc-own mark");
    let back = trace
        .samples
        .iter()
        .filter(|s| s.t >= released_at)
        .any(|s| {
            !s.threads
                .iter()
                .filter(|t| t.vcpu < 2)
                .all(|t| t.allowed == [EXTERNAL_CPU])
        });
    assert!(
        back,
        "vCPUs 0 and 1 stayed on CPU {EXTERNAL_CPU} after the lease"
    );
    let expired = run
        .vmm
        .iter()
        .filter(|l| l.contains("external placement lease expired"))
        .count();
    assert_eq!(expired, 1, "pvmm's stderr:\n{}", run.vmm.join("\n"));
}

#[test]
fn pvmm_own_threads_stay_off_the_idle_package() {
    let Some(outcome) = outcome() else {
        return;
    };
    let (run, trace) = run_trace(outcome, "api");
    let begin = trace.mark("idle-begin").expect("idle-begin mark") + IDLE_SETTLE_SECS;
    let end = trace.mark("idle-end").expect("idle-end mark");
    assert!(end - begin >= 20.0, "idle window only {:.1} s", end - begin);
    let package0 = trace.package_cpus(0);
    // The premise: the idle guest is consolidated on package 0 in that window.
    for s in trace.samples.iter().filter(|s| s.t >= begin && s.t <= end) {
        for t in &s.threads {
            assert!(
                t.allowed.iter().all(|c| package0.contains(c)),
                "vCPU {} allowed {:?} at {:.1}: the idle guest is not consolidated",
                t.vcpu,
                t.allowed,
                s.t
            );
        }
    }
    // Each thread's run time at its previous sample, by tid: where a thread last ran counts
    // only if it has run since (one asleep since before the window, `pvmm-api` waiting for a
    // client, still shows the CPU it ran on then, and wakes within its affinity).
    let mut ran_before: HashMap<&str, u64> = HashMap::new();
    let mut checked = 0;
    for line in run.probe.iter().filter(|l| l.starts_with("O ")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let t: f64 = w[1].parse().expect("uptime");
        let ran: u64 = w[5].parse().expect("ns run");
        let ran_since = ran_before
            .insert(w[6], ran)
            .is_none_or(|before| ran > before);
        if t < begin || t > end {
            continue;
        }
        let allowed: Vec<u32> = w[3].parse::<CpuSet>().expect("a CPU list").iter().collect();
        let last: u32 = w[4].parse().expect("a CPU");
        assert!(
            allowed.iter().all(|c| package0.contains(c)) && (!ran_since || package0.contains(&last)),
            "pvmm thread {} may run on {:?} (last ran on {last}{}) at {t:.1}, outside package 0 {package0:?}",
            w[2],
            allowed,
            if ran_since { ", since its previous sample" } else { "" }
        );
        checked += 1;
    }
    assert!(
        checked >= 20,
        "only {checked} own-thread samples in the idle window"
    );
}

/// pvmm's threads in this run, by name: the main thread (named after the binary), the vCPUs,
/// the scheduler, the signal thread and the control socket's.
const PVMM_THREADS: [&str; 8] = [
    "pvmm",
    "pvmm-api",
    "pvmm-sched",
    "pvmm-signals",
    "vcpu0",
    "vcpu1",
    "vcpu2",
    "vcpu3",
];

#[test]
fn every_pvmm_thread_runs_under_a_seccomp_filter() {
    let Some(outcome) = outcome() else {
        return;
    };
    let (_, trace) = run_trace(outcome, "api");
    let names = trace.thread_names();
    for name in PVMM_THREADS {
        assert!(
            names.iter().any(|n| n == name),
            "the probe never saw pvmm's {name} thread; it saw {names:?}"
        );
    }
    assert_eq!(
        trace.threads_without_filter(),
        Vec::<String>::new(),
        "pvmm threads never seen under a seccomp filter (Seccomp: 2); every line seen: {:?}",
        trace.seccomp
    );
}
