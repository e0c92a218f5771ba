//! The guest's scheduler moving work to the vCPUs pvmm says are faster: a Linux 6.12 guest
//! (Debian 13's kernel, `amd_pstate=passive`, L1 on `EPYC-Rome`) ranks its CPUs by the CPPC
//! highest performance pvmm publishes (`tests/tests/rig_prefcore.rs` checks the ranking), and
//! its scheduler's ITMT priorities make it pack running work onto the best-ranked CPUs
//! (`SD_ASYM_PACKING`). Checked from the guest's own `/proc`:
//!
//! - pvmm runs a 4-vCPU guest with `--cpus 0-2 --policy powersaving` in a 2x2 L1, and an
//!   outside balancer in L1 (`pvmm ctl external`, as `pvmm host` does) places the vCPUs on
//!   L1 CPUs {0}, {1}, {2}, {2} with capacities 1024, 1024, 512, 512 ([`PLACEMENT`]): vCPUs 2
//!   and 3 share a CPU, vCPUs 0 and 1 have one each. The L1 probe confirms that placement from
//!   the vCPU threads' `Cpus_allowed_list` while the busy thread is confined;
//! - in the guest, one busy thread (pvmm-load) is confined by the guest (`taskset`) to vCPU 2
//!   for [`CONFINED_SAMPLES`] samples, then let go (`taskset -a -p -c 0-3`);
//! - the guest reads the thread's CPU (`/proc/PID/task/TID/stat` field 39) every
//!   [`SAMPLE_S`], each read marked (`pvmm-mark:`, timestamped by L1), and within
//!   [`MOVE_WITHIN_S`] of being let go the thread must run on a vCPU that has a CPU of its own
//!   (by the L1 probe's sample at that read).
//!
//! Why an outside balancer and not pvmm's own powersaving placement: powersaving gives a vCPU
//! that turns busy a CPU of its own within two ticks (`rig_placement` checks it), so under it
//! the busy thread's vCPU never shares a CPU and the guest has nothing to move; the condition
//! "two share a CPU, two have one each" would not hold while the thread runs. The test still
//! runs the thread for [`OWN_PHASE_S`] under powersaving alone first and prints the placement
//! pvmm chose then (from `--stats`), so the difference is visible in every run.
//!
//! The same scenario on the 6.1 guest (Debian 12's kernel: its amd-pstate has no preferred-core
//! ranking, so no ITMT) is the baseline: where the thread went is printed, not asserted.

use pvmm_rig::GuestKernel;
use pvmm_tests::scripts;
use pvmm_tests::{
    balanced_pvmm_args, external_assignment, outside_balancer, run_placement_sequence_on,
    run_trace, PlacementTrace, BALANCER_RENEW_S, BUSY_SHARE,
};

/// The outside balancer's placement: per vCPU, the L1 CPUs and the capacity.
const PLACEMENT: [(&str, u32); 4] = [("0", 1024), ("1", 1024), ("2", 512), ("2", 512)];
/// The vCPU the guest first confines the busy thread to: one that shares its CPU.
const CONFINED_VCPU: u32 = 2;
/// Seconds between the guest's reads of the thread's CPU.
const SAMPLE_S: f64 = 0.25;
/// Reads while the thread is confined, and after it is let go.
const CONFINED_SAMPLES: u32 = 8;
const RELEASED_SAMPLES: u32 = 16;
/// How soon after being let go the 6.12 guest must run the thread on a vCPU with a CPU of
/// its own: asymmetric packing lets an idle higher-priority CPU pull a running task at its next
/// load balance, which a busy lower-priority CPU's tick requests; the bound allows for the
/// rig's slowness and the reads' spacing.
const MOVE_WITHIN_S: f64 = 3.0;
/// Seconds the thread runs under pvmm's own powersaving placement before the balancer starts.
const OWN_PHASE_S: u32 = 2;
/// Seconds the guest waits after the balancer starts: pvmm notifies a vCPU's new performance
/// at most once a second, and the guest re-ranks the CPU on the notification.
const SETTLE_S: u32 = 3;
/// How many times (0.1 s apart) the guest looks for the busy thread (`load0`) after starting
/// pvmm-load: under a loaded host starting it takes the guest from a fraction of a second to
/// several seconds.
const THREAD_WAIT_POLLS: u32 = 100;
/// The socket pvmm serves in L1.
const SOCKET: &str = "/tmp/pvmm-asym.sock";

fn guest_command() -> String {
    scripts::guest(
        &[
            ("CONFINED_VCPU", &CONFINED_VCPU.to_string()),
            ("OWN_PHASE_S", &OWN_PHASE_S.to_string()),
            ("SETTLE_S", &SETTLE_S.to_string()),
            ("THREAD_WAIT_POLLS", &THREAD_WAIT_POLLS.to_string()),
            ("CONFINED_SAMPLES", &CONFINED_SAMPLES.to_string()),
            ("RELEASED_SAMPLES", &RELEASED_SAMPLES.to_string()),
            ("SAMPLE_S", &SAMPLE_S.to_string()),
        ],
        scripts::ASYM_GUEST,
    )
}

fn run_scenario(kernel: GuestKernel) -> Option<pvmm_rig::RigOutcome> {
    let placements: Vec<(String, u32)> = PLACEMENT
        .iter()
        .map(|&(cpus, capacity)| (cpus.to_string(), capacity))
        .collect();
    let balancer = outside_balancer(
        SOCKET,
        "asym-external",
        &[external_assignment(&placements)],
        BALANCER_RENEW_S,
        1,
    );
    let mut args = balanced_pvmm_args(SOCKET);
    args.extend(["--cpus", "0-2"]);
    run_placement_sequence_on(
        &format!("rig_asym_packing_{}", kernel.name()),
        kernel,
        &[("asym", args, guest_command())],
        &balancer,
    )
}

/// One read of the busy thread's CPU.
#[derive(Debug)]
struct Read {
    label: String,
    /// The guest CPU (= vCPU) the thread last ran on.
    cpu: u32,
    /// L1 uptime of the read's mark.
    t: f64,
    /// Whether that vCPU had a CPU of its own at the L1 probe's last sample before the read.
    own: bool,
}

fn reads(guest: &[String], trace: &PlacementTrace) -> Vec<Read> {
    guest
        .iter()
        .filter_map(|line| {
            let mut words = line.strip_prefix("ASYM ")?.split_whitespace();
            let label = words.next()?.to_string();
            let cpu: u32 = words.next()?.parse().ok()?;
            let t = trace.mark(&format!("asym-{label}"))?;
            let i = trace.samples.iter().rposition(|s| s.t <= t)?;
            Some(Read {
                own: trace.has_own_cpu(i, cpu),
                label,
                cpu,
                t,
            })
        })
        .collect()
}

/// What one kernel's run showed.
struct Scenario {
    kernel: &'static str,
    /// The guest's preferred-core ranking per CPU when the thread started (empty without one).
    ranking: Vec<u64>,
    /// L1 uptime of the release.
    released_at: f64,
    confined: Vec<Read>,
    released: Vec<Read>,
}

impl Scenario {
    /// Seconds after the release of the first read on a vCPU with a CPU of its own.
    fn reached_own(&self) -> Option<(f64, u32)> {
        self.released
            .iter()
            .find(|r| r.own)
            .map(|r| (r.t - self.released_at, r.cpu))
    }

    fn describe(&self) -> String {
        let line = |reads: &[Read]| -> String {
            reads
                .iter()
                .map(|r| {
                    let own = if r.own { "own" } else { "shared" };
                    format!(
                        "{}@{:+.2}s:vcpu{}({own})",
                        r.label,
                        r.t - self.released_at,
                        r.cpu
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "  ranking {:?}\n  confined: {}\n  released: {}",
            self.ranking,
            line(&self.confined),
            line(&self.released)
        )
    }
}

/// Boots `kernel`'s guest through the scenario and checks that it ran as designed: the outside
/// balancer's placement held while the thread was confined, the thread was busy on
/// [`CONFINED_VCPU`], and the reads parse. None when the rig is unavailable.
fn scenario(kernel: GuestKernel) -> Option<Scenario> {
    let outcome = run_scenario(kernel)?;
    let (run, trace) = run_trace(&outcome, "asym");
    let guest = run.guest.join("\n");
    let mark = |m: &str| {
        trace
            .mark(m)
            .unwrap_or_else(|| panic!("the guest never marked {m}:\n{guest}"))
    };
    report_own_placement(&trace, mark("asym-own"), mark("asym-external"));
    let (first, released_at) = (mark("asym-c1"), mark("asym-release"));
    check_confined_placement(&trace, first, released_at);
    let ranking = run
        .guest
        .iter()
        .find_map(|l| l.strip_prefix("RANKING"))
        .map(|r| {
            r.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let (confined, released): (Vec<Read>, Vec<Read>) = reads(run.guest, &trace)
        .into_iter()
        .partition(|r| r.label.starts_with('c'));
    let scenario = Scenario {
        kernel: kernel.name(),
        ranking,
        released_at,
        confined,
        released,
    };
    assert!(
        scenario.confined.len() * 2 > CONFINED_SAMPLES as usize
            && scenario.released.len() * 4 > RELEASED_SAMPLES as usize * 3,
        "{}: too few of the guest's reads parse:\n{}\nthe guest's console:\n{guest}",
        scenario.kernel,
        scenario.describe()
    );
    assert!(
        scenario.confined.iter().all(|r| r.cpu == CONFINED_VCPU),
        "{}: the confined thread ran off vCPU {CONFINED_VCPU}:\n{}",
        scenario.kernel,
        scenario.describe()
    );
    Some(scenario)
}

/// Prints where pvmm's own powersaving placement put the vCPUs while the thread ran on
/// [`CONFINED_VCPU`] before the outside balancer took over (L1 uptimes `from`..`to`).
fn report_own_placement(trace: &PlacementTrace, from: f64, to: f64) {
    let busy_tick = trace
        .ticks_in(from, to)
        .rev()
        .find(|k| !k.external && k.vcpus.get(CONFINED_VCPU as usize).is_some_and(|v| v.busy));
    match busy_tick {
        Some(k) => {
            let cpus: Vec<String> = k
                .vcpus
                .iter()
                .map(|v| format!("vcpu{}:{{{}}}@{}", v.vcpu, v.cpus, v.capacity))
                .collect();
            eprintln!(
                "rig_asym_packing: powersaving alone, vCPU {CONFINED_VCPU} busy (pvmm {} ms): {}",
                k.t_ms,
                cpus.join(" ")
            );
        }
        None => eprintln!(
            "rig_asym_packing: no pvmm tick showed vCPU {CONFINED_VCPU} busy under powersaving alone"
        ),
    }
}

/// While the thread was confined (L1 uptimes `from`..`to`), the L1 probe saw the outside
/// balancer's placement at every sample (vCPUs 0 and 1 on CPUs of their own, vCPUs 2 and 3
/// sharing one) and vCPU [`CONFINED_VCPU`]'s thread busy over the window: its mean share of
/// a CPU at least [`BUSY_SHARE`]. A single interval may dip below, since the thread shares its
/// CPU with vCPU 3's.
fn check_confined_placement(trace: &PlacementTrace, from: f64, to: f64) {
    let inside: Vec<usize> = (1..trace.samples.len())
        .filter(|&i| trace.samples[i - 1].t >= from && trace.samples[i].t <= to)
        .collect();
    assert!(
        inside.len() >= 5,
        "only {} probe intervals while the thread was confined",
        inside.len()
    );
    let (first, last) = (inside[0], inside[inside.len() - 1]);
    for &i in &inside {
        let threads = &trace.samples[i].threads;
        let shared = threads.len() == 4
            && threads[2].allowed.len() == 1
            && threads[2].allowed == threads[3].allowed;
        assert!(
            shared && trace.has_own_cpu(i, 0) && trace.has_own_cpu(i, 1),
            "the outside balancer's placement (vCPUs 0 and 1 on CPUs of their own, 2 and 3 sharing one) did not hold at t={:.2}:\n{}",
            trace.samples[i].t,
            trace.describe(first, last)
        );
    }
    let busy: f64 = inside
        .iter()
        .map(|&i| trace.busy_share(i, CONFINED_VCPU))
        .sum::<f64>()
        / inside.len() as f64;
    assert!(
        busy >= BUSY_SHARE,
        "vCPU {CONFINED_VCPU} was busy {busy:.2} of a CPU while the thread was confined to it:\n{}",
        trace.describe(first, last)
    );
}

#[test]
fn linux_6_12_moves_a_busy_thread_to_a_vcpu_with_a_cpu_of_its_own() {
    let Some(s) = scenario(GuestKernel::Linux6_12) else {
        return;
    };
    let shared: Vec<u64> = [2, 3]
        .iter()
        .filter_map(|&c| s.ranking.get(c))
        .copied()
        .collect();
    let own: Vec<u64> = [0, 1]
        .iter()
        .filter_map(|&c| s.ranking.get(c))
        .copied()
        .collect();
    assert!(
        s.ranking.len() == 4 && own.iter().min() > shared.iter().max(),
        "6.12: the guest should rank the vCPUs that share a CPU below the others when the thread starts:\n{}",
        s.describe()
    );
    let reached = s.reached_own();
    match reached {
        Some((after, cpu)) => eprintln!(
            "rig_asym_packing 6.12: the thread reached vCPU {cpu} (a CPU of its own) {after:.2} s after being let go"
        ),
        None => eprintln!("rig_asym_packing 6.12: the thread never reached a vCPU with a CPU of its own"),
    }
    eprintln!("{}", s.describe());
    assert!(
        reached.is_some_and(|(after, _)| after <= MOVE_WITHIN_S),
        "6.12: the busy thread should run on a vCPU with a CPU of its own within {MOVE_WITHIN_S} s of being let go:\n{}",
        s.describe()
    );
}

/// The baseline: reported, not asserted.
#[test]
fn linux_6_1_baseline_where_the_busy_thread_stays() {
    let Some(s) = scenario(GuestKernel::Linux6_1) else {
        return;
    };
    let stayed = s.released.iter().filter(|r| r.cpu == CONFINED_VCPU).count();
    let span = s.released.last().map_or(0.0, |r| r.t - s.released_at);
    match s.reached_own() {
        Some((after, cpu)) => eprintln!(
            "rig_asym_packing 6.1 baseline: the thread reached vCPU {cpu} (a CPU of its own) {after:.2} s after being let go; on vCPU {CONFINED_VCPU} at {stayed} of {} reads over {span:.2} s",
            s.released.len()
        ),
        None => eprintln!(
            "rig_asym_packing 6.1 baseline: the thread never reached a vCPU with a CPU of its own in {span:.2} s; on vCPU {CONFINED_VCPU} at {stayed} of {} reads",
            s.released.len()
        ),
    }
    eprintln!("{}", s.describe());
}
