//! Live placement, checked from outside pvmm: L1 = 2 packages x 2 cores
//! (CPUs 0-1 = package 0, 2-3 = package 1), a 4-vCPU guest running pvmm-load threads pinned
//! to chosen guest CPUs (so the test knows which vCPU is busy; the L1 probe confirms it from
//! the vCPU threads' CPU time).
//!
//! What is checked comes from L1's `/proc/<pid>/task/<tid>/status` (`Cpus_allowed_list`),
//! `/proc/<pid>/task/<tid>/stat` (CPU time) and `/proc/stat` (per-CPU idle), sampled every
//! 0.1 s by a probe pinned to CPU 0. pvmm's `--stats` lines only turn L1 times into pvmm
//! ticks, which they time by L1's own clock (each line's `boot_ms`, the clock of the probe's
//! `/proc/uptime`). All four policies run in one L1 boot; the tests share it.
//!
//! Bounds are the engine's own: the 5 s ramp-down window
//! (`DEFAULT_RAMP_DOWN_WINDOW_MS`) and two placement ticks. Slack, stated where used: the
//! engine packs on a demand average of pvmm's utilization, so a vCPU's demand falls below the
//! fit threshold up to [`DEMAND_DECAY_S`] after the guest goes idle; the probe only sees a change at
//! its next sample, and the probe's clock and CPU times count in 10 ms steps, so one tick of
//! slack ([`TICK_SLACK`]) is allowed on "two ticks".

use pvmm_rig::RigOutcome;
use pvmm_tests::{run_placement_sequence, run_trace, scripts, PlacementTrace, SharedOutcome};

/// pvmm's consolidation ramp-down window (s): scheduler's `DEFAULT_RAMP_DOWN_WINDOW_MS`.
const RAMP_DOWN_S: f64 = 5.0;

/// How long after the guest goes idle a vCPU's demand needs to fall from a whole CPU below the
/// 0.4 of a CPU at which four vCPUs fit one package of two CPUs: pvmm's utilization (PELT,
/// 32 ms half-life) falls in about 0.2 s, the engine's demand average of it
/// (`DEFAULT_DEMAND_HALF_LIFE_MS`, 0.5 s) in 1.3 half-lives more, about 0.7 s.
const DEMAND_DECAY_S: f64 = 1.0;

/// Ticks of slack on "within two ticks": the probe samples once per tick, and the instants it
/// gives (a sample's `/proc/uptime`, a busy start from CPU time in USER_HZ steps) are 10 ms
/// steps, which may put a tick on the wrong side of one.
const TICK_SLACK: usize = 1;

/// How long after a load change the placement is given to settle before "keeps" checks start:
/// two ticks plus slack, in ticks.
const SETTLE_TICKS: usize = 2 + TICK_SLACK;

/// Package 1's CPUs must be at least this idle once the idle guest is consolidated.
const IDLE_PACKAGE_MIN_IDLE: f64 = 0.95;

/// The powersaving run: 4 busy vCPUs for 4-5 s (c), idle for 9 s (a, d: ramp-down 5 s), vCPU
/// 3 busy alone for 3 s while packed (e), 1 s idle, vCPUs 2 and 3 busy for 4-5 s (b). The
/// threads of a phase end together (`e`, `u`): the engine's ramp-down starts when the load
/// fits one package, so a thread that outlived the others would start it before the guest went
/// idle, and would look like phase e.
fn powersaving_command() -> String {
    scripts::guest(&[], scripts::PLACEMENT_POWERSAVING_GUEST)
}

/// Other policies: vCPUs 2 and 3 busy for 4-5 s (b), 1 s idle, all 4 busy for 4-5 s (c).
fn spread_command() -> String {
    scripts::guest(&[], scripts::PLACEMENT_SPREAD_GUEST)
}

const POLICIES: [(&str, &str); 4] = [
    ("powersaving", "powersaving"),
    ("performance", "performance"),
    ("balance", "balance"),
    ("powersaving2", "powersaving:2"),
];

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        let runs: Vec<(&str, Vec<&str>, String)> = POLICIES
            .iter()
            .map(|&(label, policy)| {
                let command = if label == "powersaving" {
                    powersaving_command()
                } else {
                    spread_command()
                };
                (label, vec!["--vcpus", "4", "--policy", policy], command)
            })
            .collect();
        run_placement_sequence("rig_placement", &runs)
    })
}

/// Fewest samples an episode must have left after settling for its placement to be checked.
const MIN_SETTLED_SAMPLES: usize = 3;

/// The first episode (sample intervals) after interval `after` in which exactly `vcpus` are
/// busy, that lasts at least 1 s and has [`MIN_SETTLED_SAMPLES`] samples after settling. A
/// phase of the guest's load can show as several episodes: on a loaded L1 a busy vCPU that
/// shares its CPU with the probe (or, in L1, with anything else that runs there) can fall
/// below [`pvmm_tests::BUSY_SHARE`] for one interval, and the piece before such a dip may be
/// too short to check; the next piece of the same phase is checked instead, from its own start.
fn episode(trace: &PlacementTrace, vcpus: &[u32], after: usize) -> (usize, usize) {
    trace
        .episodes(vcpus)
        .into_iter()
        .find(|&(a, b)| {
            a > after
                && trace.samples[b].t - trace.samples[a - 1].t >= 1.0
                && settled_samples(trace, (a, b)).len() >= MIN_SETTLED_SAMPLES
        })
        .unwrap_or_else(|| {
            panic!(
                "no episode with exactly vCPUs {vcpus:?} busy for 1 s and {MIN_SETTLED_SAMPLES} settled samples after sample {after}; trace:\n{}",
                trace.describe(after, trace.samples.len())
            )
        })
}

/// Samples of an episode from `SETTLE_TICKS` pvmm ticks after its start to the one before its
/// last. The last sample closes an interval in which the load may already have ended: a vCPU
/// that ran most of it still counts as busy there, while pvmm, ticking inside the interval, may
/// already have moved it as the idle vCPU it now is. The affinity read at any earlier sample is
/// followed by another busy interval, so it holds a busy vCPU's placement.
fn settled(trace: &PlacementTrace, (first, last): (usize, usize)) -> Vec<usize> {
    let settled = settled_samples(trace, (first, last));
    assert!(
        settled.len() >= MIN_SETTLED_SAMPLES,
        "episode {first}..{last} is too short to check after settling"
    );
    settled
}

/// [`settled`] without its check of the count.
fn settled_samples(trace: &PlacementTrace, (first, last): (usize, usize)) -> Vec<usize> {
    let start = trace.samples[first - 1].t;
    (first..last)
        .filter(|&i| trace.ticks_between(start, trace.samples[i - 1].t) >= SETTLE_TICKS)
        .collect()
}

fn all_on_package(trace: &PlacementTrace, i: usize, package: u32) -> bool {
    trace.samples[i]
        .threads
        .iter()
        .all(|t| trace.packages_allowed(i, t.vcpu) == [package])
}

/// The one package every vCPU thread is confined to at sample `i`, if there is one.
fn single_package(trace: &PlacementTrace, i: usize) -> Option<u32> {
    (0..2).find(|&p| all_on_package(trace, i, p))
}

/// The package an idle or lightly loaded guest is packed onto under the packing policies: the
/// lowest-numbered one.
const PACKED_PACKAGE: u32 = 0;

/// With 4 busy vCPUs, every policy gives each vCPU its own CPU.
#[test]
fn four_busy_vcpus_get_a_cpu_each_under_every_policy() {
    let Some(outcome) = outcome() else { return };
    for (label, _) in POLICIES {
        let (_, trace) = run_trace(outcome, label);
        let busy4 = episode(&trace, &[0, 1, 2, 3], 0);
        for i in settled(&trace, busy4) {
            for vcpu in 0..4 {
                assert!(
                    trace.has_own_cpu(i, vcpu),
                    "{label}: vCPU {vcpu} has no CPU of its own at t={:.2} with 4 busy vCPUs:\n{}",
                    trace.samples[i].t,
                    trace.describe(busy4.0, busy4.1)
                );
            }
        }
    }
}

/// With 2 busy vCPUs, powersaving keeps both on package 0 on different CPUs, and
/// performance puts them on different packages.
#[test]
fn two_busy_vcpus_packed_by_powersaving_spread_by_performance() {
    let Some(outcome) = outcome() else { return };
    // powersaving: the 2-busy phase comes after the single-busy one.
    let (_, trace) = run_trace(outcome, "powersaving");
    let busy4 = episode(&trace, &[0, 1, 2, 3], 0);
    let one = episode(&trace, &[3], busy4.1);
    let two = episode(&trace, &[2, 3], one.1);
    let mut packages = Vec::new();
    for i in settled(&trace, two) {
        let t = &trace.samples[i].threads;
        let (a, b) = (&t[2].allowed, &t[3].allowed);
        let (p2, p3) = (trace.packages_allowed(i, 2), trace.packages_allowed(i, 3));
        assert!(
            p2.len() == 1 && p2 == p3 && a.len() == 1 && b.len() == 1 && a != b,
            "powersaving: busy vCPUs 2 and 3 are not on different CPUs of one package at t={:.2}:\n{}",
            trace.samples[i].t,
            trace.describe(two.0 - 1, two.1)
        );
        packages.push(p2[0]);
    }
    assert!(
        packages.iter().all(|&p| p == PACKED_PACKAGE),
        "powersaving must keep the busy vCPUs on package {PACKED_PACKAGE}; they were on packages {packages:?}:\n{}",
        trace.describe(two.0 - 1, two.1)
    );
    let (_, trace) = run_trace(outcome, "performance");
    let two = episode(&trace, &[2, 3], 0);
    for i in settled(&trace, two) {
        let (p2, p3) = (trace.packages_allowed(i, 2), trace.packages_allowed(i, 3));
        assert!(
            p2.len() == 1 && p3.len() == 1 && p2 != p3,
            "performance: busy vCPUs 2 and 3 are not on different packages at t={:.2}:\n{}",
            trace.samples[i].t,
            trace.describe(two.0 - 1, two.1)
        );
    }
}

/// The first run of idle intervals from sample `from` on that lasts at least [`RAMP_DOWN_S`],
/// else the first run of all.
fn idle_phase(trace: &PlacementTrace, from: usize) -> (usize, usize) {
    let mut first_run = None;
    let mut i = from;
    while i < trace.samples.len() {
        if !trace.busy_vcpus(i).is_empty() {
            i += 1;
            continue;
        }
        let run = trace.idle_run_after(i - 1);
        if trace.samples[run.1].t - trace.samples[run.0].t >= RAMP_DOWN_S {
            return run;
        }
        first_run.get_or_insert(run);
        i = run.1 + 1;
    }
    first_run.expect("an idle interval after the 4-busy phase")
}

/// When the guest falls from 4 busy vCPUs to idle, powersaving consolidates
/// every vCPU thread onto package 0 not before the 5 s ramp-down and within it plus two ticks
/// (plus the demand's decay and a tick of slack), and package 1's CPUs are then at least 95 % idle.
#[test]
fn idle_guest_consolidates_after_the_ramp_down_and_package_1_sleeps() {
    let Some(outcome) = outcome() else { return };
    let (_, trace) = run_trace(outcome, "powersaving");
    let busy4 = episode(&trace, &[0, 1, 2, 3], 0);
    // The guest goes idle for good: the first run of intervals with no busy vCPU after the
    // 4-busy episode that outlasts the ramp-down (on a loaded L1 a load thread can end an
    // interval or two after the others, leaving a short idle run before it).
    let (idle_first, idle_last) = idle_phase(&trace, busy4.1 + 1);
    assert!(
        idle_last > idle_first,
        "no idle phase after the 4-busy phase:\n{}",
        trace.describe(busy4.1, busy4.1 + 20)
    );
    // The guest went idle after the start of the last interval with a busy vCPU and before
    // the end of the first idle one.
    let went_idle_after = trace.samples[idle_first - 2].t;
    let went_idle_before = trace.samples[idle_first].t;
    let consolidated = (idle_first..=idle_last)
        .find(|&i| single_package(&trace, i).is_some())
        .unwrap_or_else(|| {
            panic!(
                "powersaving never confined the idle guest to one package in {:.1} s of idleness:\n{}",
                trace.samples[idle_last].t - went_idle_before,
                trace.describe(idle_first, idle_last)
            )
        });
    let package = single_package(&trace, consolidated).unwrap_or(u32::MAX);
    let seen_at = trace.samples[consolidated].t;
    let not_yet_at = trace.samples[consolidated - 1].t;
    eprintln!(
        "powersaving consolidated the idle guest onto package {package} {:.2}-{:.2} s after it went idle (ramp-down {RAMP_DOWN_S} s)",
        not_yet_at - went_idle_before,
        seen_at - went_idle_after
    );
    // d: not before the ramp-down (L1's clock times both; pvmm's ramp-down runs on the same
    // kernel's clock).
    assert!(
        seen_at >= went_idle_after + RAMP_DOWN_S,
        "consolidated {:.2} s after the guest went idle (at most), before the {RAMP_DOWN_S} s ramp-down:\n{}",
        seen_at - went_idle_after,
        trace.describe(busy4.1, consolidated)
    );
    // a: within the ramp-down plus two ticks (+ the demand's decay, + slack).
    let ticks_late =
        trace.ticks_between(went_idle_before + RAMP_DOWN_S + DEMAND_DECAY_S, not_yet_at);
    assert!(
        ticks_late <= 2 + TICK_SLACK,
        "still spread {ticks_late} pvmm ticks after the ramp-down (+{DEMAND_DECAY_S} s demand decay) ended; allowed 2 + {TICK_SLACK}:\n{}",
        trace.describe(busy4.1, consolidated)
    );
    // Stays consolidated, and the other package sleeps, for the rest of the idle phase but its
    // last sample: that one closes an interval in which the next load may already have begun
    // (too little of it to count as busy), and pvmm, ticking inside it, may have reacted.
    let idle_last = idle_last - 1;
    for i in consolidated..=idle_last {
        assert!(
            all_on_package(&trace, i, package),
            "the idle guest left package {package} at t={:.2}:\n{}",
            trace.samples[i].t,
            trace.describe(consolidated, idle_last)
        );
    }
    assert!(
        trace.samples[idle_last].t - seen_at >= 1.0,
        "less than 1 s of consolidated idleness to measure the other package's idleness"
    );
    let other = 1 - package.min(1);
    let mut too_busy = Vec::new();
    for cpu in trace.package_cpus(other) {
        let idle = trace.cpu_idle_share(cpu, consolidated, idle_last);
        eprintln!(
            "L1 CPU {cpu} (package {other}) idle {:.1} % over {:.1} s of consolidated idleness",
            idle * 100.0,
            trace.samples[idle_last].t - seen_at
        );
        if idle < IDLE_PACKAGE_MIN_IDLE {
            too_busy.push((cpu, idle));
        }
    }
    assert!(
        too_busy.is_empty(),
        "CPUs of the unused package {other} less than {:.0} % idle: {too_busy:?}",
        IDLE_PACKAGE_MIN_IDLE * 100.0
    );
    assert_eq!(
        package, PACKED_PACKAGE,
        "the idle guest must be confined to package {PACKED_PACKAGE} (and package 1 sleep); pvmm chose package {package}"
    );
}

/// A vCPU that turns busy while the guest is packed gets a CPU of its own within two
/// ticks (+ a tick of slack).
#[test]
fn vcpu_turning_busy_while_packed_gets_its_own_cpu_within_two_ticks() {
    let Some(outcome) = outcome() else { return };
    let (_, trace) = run_trace(outcome, "powersaving");
    let busy4 = episode(&trace, &[0, 1, 2, 3], 0);
    let one = episode(&trace, &[3], busy4.1);
    // vCPU 3 turned busy during interval one.0 - 1 (too little of it to count as busy there)
    // or as interval one.0 began. The guest must have been packed at the sample before both;
    // vCPU 3's busy time is taken to begin where its CPU time in interval one.0 - 1 would
    // have begun had it run on to that interval's end.
    let before = one.0 - 2;
    assert!(
        single_package(&trace, before).is_some(),
        "precondition: the guest was not packed on one package when vCPU 3 turned busy:\n{}",
        trace.describe(before.saturating_sub(5), one.0)
    );
    let lead_in = one.0 - 1;
    let busy_from = trace.samples[lead_in].t
        - trace.busy_share(lead_in, 3) * (trace.samples[lead_in].t - trace.samples[before].t);
    if trace.has_own_cpu(before, 3) {
        eprintln!("vCPU 3 already had a CPU of its own while packed");
        return;
    }
    let own = (lead_in..=one.1)
        .find(|&i| trace.has_own_cpu(i, 3))
        .unwrap_or_else(|| {
            panic!(
                "busy vCPU 3 never got a CPU of its own:\n{}",
                trace.describe(before, one.1)
            )
        });
    // Ticks that passed while vCPU 3 was busy and still sharing, plus the tick that moved it.
    let ticks = trace.ticks_between(busy_from, trace.samples[own - 1].t.max(busy_from)) + 1;
    eprintln!("vCPU 3 got its own CPU at most {ticks} ticks after turning busy");
    assert!(
        ticks <= 2 + TICK_SLACK,
        "vCPU 3 got a CPU of its own only after {ticks} ticks (allowed 2 + {TICK_SLACK}):\n{}",
        trace.describe(before, own)
    );
}
