//! Host CPUs going offline under a running VM, and coming back, checked from L1's `/proc`
//! (L1 = 2 packages x 2 cores; a 4-vCPU guest under `performance` with all four vCPUs busy,
//! so each has a CPU of its own, package 1's included). One L1 boot, two pvmm runs:
//!
//! - `hotplug`: pvmm places itself. CPU 3 goes offline and comes back, then the whole of
//!   package 1 (CPUs 2 and 3) does;
//! - `host-hotplug`: `pvmm host` places the VM (pvmm joins it with `--host`), and package 1
//!   goes offline and comes back.
//!
//! The guest prints `pvmm-mark: cpus-off LIST` and `pvmm-mark: cpus-on LIST`; L1 takes those
//! CPUs offline (`echo 0 > /sys/devices/system/cpu/cpuN/online`) or back at each mark, and
//! marks when it has done so (`cpus-off-done LIST`, `cpus-on-done LIST`). The
//! kernel moves a thread pinned to an offline CPU itself, widening its affinity to every CPU
//! left, so "no vCPU on an offline CPU" alone would not show the placer at work: what is
//! checked is that every vCPU is pinned to one online CPU again within two ticks, and that a
//! returning CPU is used again within two ticks of its return, both counted from the watcher's
//! marks (offlining a CPU can take half a second on a loaded L1). One tick of slack on each
//! bound.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use pvmm_rig::RigOutcome;
use pvmm_tests::{
    run_placement_sequence_with_probe, run_trace, scripts, PlacementTrace, SharedOutcome,
};

/// How often L1's watcher looks for the guest's marks (s).
const MARK_POLL_S: f64 = 0.2;
/// Two ticks plus one of slack, in ticks.
const SETTLE_TICKS: usize = 3;
/// Seconds between the guest's marks: long enough for several settled samples in each phase.
const PHASE_SECS: u32 = 5;
/// Where `pvmm host` and the VMs joining it keep their sockets in L1 (L1's tmpfs root).
const RUNTIME_DIR: &str = "/tmp";

/// How many times, 0.2 s apart, L1 looks whether the daemon has exited after its SIGTERM before
/// printing its log anyway: it hands placement back and exits within a tick or two.
const DAEMON_EXIT_POLLS: u32 = 10;

/// The run whose pvmm joins `pvmm host`.
const HOST_RUN: &str = "host-hotplug";

/// What starts each line of the daemon's log among the probe's lines.
const DAEMON_LOG_PREFIX: &str = "H ";

/// Longest the guest's load runs (s). The guest stops it itself once its marks are done
/// ([`guest_command`]); this only ends a run whose stop failed.
const LOAD_CAP_SECS: u32 = 120;

/// The guest's command: four busy vCPUs while L1 takes `phases` (CPU lists) offline and back
/// one after another, [`PHASE_SECS`] apart, then a phase's worth of load after the last mark.
/// The load is stopped after that, not timed from its start: on a loaded machine the guest's
/// marks drift later than its clock would have them, and a load timed from the start could end
/// before the last phase has begun.
fn guest_command(phases: &[&str]) -> String {
    scripts::guest(
        &[
            ("LOAD_CAP_SECS", &LOAD_CAP_SECS.to_string()),
            ("PHASE_SECS", &PHASE_SECS.to_string()),
            ("PHASES", &phases.join(" ")),
        ],
        scripts::HOTPLUG_GUEST,
    )
}

/// L1 side, before the placement probe (so for each run, with its `$PVMM_PID`):
///
/// - a watcher that carries out the guest's `cpus-off`/`cpus-on` marks in order;
/// - in the run [`HOST_RUN`] (its pvmm is started with `--host`; told by the run's label, not
///   by the pid's command line), the daemon (`pvmm host -v`, pinned to CPU 0, which never goes
///   offline), ended once that pvmm has exited, when its log is printed, each line after
///   [`DAEMON_LOG_PREFIX`] (the probe's parser skips such lines; the test shows them when it
///   fails).
///
/// The other background jobs write nowhere: the rig reads the probe's output until every
/// writer has closed it. The marks end in the guest console's `\r`.
fn probe_prefix() -> String {
    pvmm_rig::scripts::assemble(
        &[
            ("MARK_POLL_S", &MARK_POLL_S.to_string()),
            ("HOST_RUN", HOST_RUN),
            ("RUNTIME_DIR", RUNTIME_DIR),
            ("DAEMON_EXIT_POLLS", &DAEMON_EXIT_POLLS.to_string()),
            ("DAEMON_LOG_PREFIX", DAEMON_LOG_PREFIX),
        ],
        &[scripts::HOTPLUG_PROBE],
    )
}

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        run_placement_sequence_with_probe(
            "rig_hotplug",
            &[
                (
                    "hotplug",
                    vec!["--vcpus", "4", "--policy", "performance"],
                    guest_command(&["3", "2,3"]),
                ),
                (
                    HOST_RUN,
                    vec!["--vcpus", "4", "--host", RUNTIME_DIR],
                    guest_command(&["2,3"]),
                ),
            ],
            &probe_prefix(),
        )
    })
}

/// Samples taken from `SETTLE_TICKS` ticks after L1 time `from` until L1 time `to`.
fn settled_between(trace: &PlacementTrace, from: f64, to: f64) -> Vec<usize> {
    (0..trace.samples.len())
        .filter(|&i| {
            let t = trace.samples[i].t;
            t < to && trace.ticks_between(from, t) >= SETTLE_TICKS
        })
        .collect()
}

/// One offline phase in L1 times: when L1's watcher had taken `cpus` offline (`cpus-off-done`:
/// a write to a CPU's `online` file returns once the CPU is offline, which on a loaded L1 can be
/// half a second after the guest's mark), when the guest asked for them back (`cpus-on`: the
/// first may be online before the watcher has written the last), and when all were back
/// (`cpus-on-done`).
#[derive(Clone, Copy)]
struct Phase {
    off: f64,
    returning: f64,
    on: f64,
}

fn phase(trace: &PlacementTrace, cpus: &str) -> Phase {
    let mark = |what: &str| {
        let text = format!("{what} {cpus}");
        trace
            .mark(&text)
            .unwrap_or_else(|| panic!("the guest marks {text}"))
    };
    Phase {
        off: mark("cpus-off-done"),
        returning: mark("cpus-on"),
        on: mark("cpus-on-done"),
    }
}

/// Checks one offline phase of `trace`: `gone` (L1 CPUs) offline from `off` until they start
/// to return, back from `on` until `until`. While they are offline every vCPU is pinned to one
/// CPU that is online; once they are back one of them holds a vCPU again. Returns the samples
/// of both settled windows (for the caller's own checks).
fn check_phase(
    trace: &PlacementTrace,
    gone: &[u32],
    phase: &Phase,
    until: f64,
) -> (Vec<usize>, Vec<usize>) {
    let Phase { off, returning, on } = *phase;
    let describe = || trace.describe(0, trace.samples.len() - 1);
    let offline = settled_between(trace, off, returning);
    assert!(
        offline.len() >= 3,
        "too few samples while CPUs {gone:?} are offline:\n{}",
        describe()
    );
    for &i in &offline {
        for t in &trace.samples[i].threads {
            assert!(
                t.allowed.len() == 1 && !gone.contains(&t.allowed[0]),
                "vCPU {} is allowed {:?} at t={:.2}, with CPUs {gone:?} offline since {off:.2}: it should be pinned to one online CPU:\n{}",
                t.vcpu,
                t.allowed,
                trace.samples[i].t,
                describe()
            );
        }
    }
    let online = settled_between(trace, on, until);
    assert!(
        online.iter().any(|&i| trace.samples[i]
            .threads
            .iter()
            .any(|t| t.allowed.len() == 1 && gone.contains(&t.allowed[0]))),
        "CPUs {gone:?} came back at {on:.2} but no vCPU was placed on one of them again:\n{}",
        describe()
    );
    (offline, online)
}

#[test]
fn vcpus_leave_offline_cpus_and_use_them_again_when_they_return() {
    let Some(outcome) = outcome() else { return };
    let (run, trace) = run_trace(outcome, "hotplug");
    let cpu = phase(&trace, "3");
    let package = phase(&trace, "2,3");
    let end = trace.samples.last().map_or(package.on, |s| s.t);

    let before: Vec<usize> = (0..trace.samples.len())
        .filter(|&i| trace.samples[i].t < cpu.off)
        .collect();
    assert!(
        before
            .iter()
            .any(|&i| (0..4).all(|v| trace.has_own_cpu(i, v))),
        "before CPU 3 goes offline, every busy vCPU should have a CPU of its own at some sample:\n{}",
        trace.describe(0, trace.samples.len() - 1)
    );
    check_phase(&trace, &[3], &cpu, package.off);
    check_phase(&trace, &[2, 3], &package, end + 1.0);
    for cpus in ["0-2", "0-1"] {
        assert!(
            run.vmm
                .iter()
                .any(|l| l.contains(&format!("host CPUs online changed: placing on {cpus}"))),
            "pvmm should say that it places on CPUs {cpus}; its stderr:\n{}",
            run.vmm.join("\n")
        );
    }
}

#[test]
fn pvmm_host_moves_vcpus_off_an_offline_package_and_back() {
    let Some(outcome) = outcome() else { return };
    let (run, trace) = run_trace(outcome, HOST_RUN);
    let daemon_log: Vec<&str> = run
        .probe
        .iter()
        .filter_map(|l| l.strip_prefix(DAEMON_LOG_PREFIX))
        .collect();
    let package = phase(&trace, "2,3");
    let end = trace.samples.last().map_or(package.on, |s| s.t);
    let (offline, online) = check_phase(&trace, &[2, 3], &package, end + 1.0);
    // The daemon placed the vCPUs throughout (pvmm's own placement would pass the checks
    // above too, had the daemon's lease lapsed).
    let window = |samples: &[usize]| {
        let t = |i: usize| trace.samples[i].t;
        samples
            .first()
            .zip(samples.last())
            .map(|(&a, &b)| (t(a), t(b)))
    };
    for (a, b) in [window(&offline), window(&online)].into_iter().flatten() {
        let ticks: Vec<_> = trace.ticks_in(a, b).collect();
        assert!(
            !ticks.is_empty() && ticks.iter().all(|k| k.external),
            "pvmm host should place the VM from L1 {a:.2} s to {b:.2} s (pvmm's stats say external = {:?});\npvmm's stderr:\n{}\nthe daemon's log:\n{}",
            ticks.iter().map(|k| k.external).collect::<Vec<_>>(),
            run.vmm.join("\n"),
            daemon_log.join("\n")
        );
    }
}
