//! The guest's own scheduler acting on pvmm's capacities: a Debian 13 (Linux 6.12) guest whose
//! `amd-pstate` driver (passive mode) runs on pvmm's `_CPC` registers, ranks its CPUs by the
//! highest performance pvmm serves ("preferred core"), and hands the ranking to the
//! scheduler's ITMT priorities. Checked from the guest's own sysfs and `/proc`:
//!
//! - the driver runs, preferred core is enabled and ITMT is on;
//! - once the guest is up and idle, each CPU's ranking is a performance pvmm published for that
//!   vCPU (its `--stats` capacities, mapped to the guest's scale) up to the read: each CPU's
//!   ranking is taken when that CPU is notified, so near-equal values that were not worth a
//!   notification leave it at an older one;
//! - when the capacities change, the rankings follow: an outside balancer in L1 (`pvmm ctl
//!   external`, as `pvmm host` does) gives the four vCPUs capacities in one order, then in the
//!   opposite order, switching every [`PATTERN_S`]; each time the guest has read a pattern's
//!   performances for [`FOLLOW_S`], its rankings must follow that pattern: the same order,
//!   each within pvmm's notification threshold of the pattern's performance (a smaller change
//!   that keeps the order is not notified: [`follows`]).
//!
//! pvmm's own placement is not used for the second check: an idle packed guest's effective
//! capacities move by a few per cent every tick, and the order of such near-equal values
//! changes faster than a notification per vCPU per second can follow.
//!
//! L1 runs on an emulated Zen 2 (`EPYC-Rome`), which amd-pstate needs (the rig picks it for
//! a 6.12 guest).

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use pvmm::cppc::guest_perfs;
use pvmm::live::capacity::significant_change;
use pvmm_rig::{GuestKernel, RigOutcome};
use pvmm_tests::scripts;
use pvmm_tests::{
    balanced_pvmm_args, external_assignment, outside_balancer, run_placement_sequence_on,
    run_trace, SharedOutcome, BALANCER_RENEW_S,
};

/// The guest's vCPUs.
const VCPUS: usize = 4;
/// Seconds between the guest's reads of its rankings and performances.
const READ_INTERVAL_S: f64 = 0.5;
/// Seconds (the guest's clock) the guest keeps reading after its first read: six patterns.
/// Bounded by time, not by a count of reads: under load a read takes several times its
/// interval, and a count would make the run outlast its limit.
const READ_FOR_S: u32 = 30;
/// How long (L1's clock, between the guest's marks) the guest must have been reading a
/// pattern's performances before its rankings must show it: pvmm notifies a vCPU at most once
/// a second, and the guest's driver updates the ranking on the notification.
const FOLLOW_S: f64 = 2.0;
/// Seconds each capacity pattern holds.
const PATTERN_S: f64 = 5.0;
/// The two capacity patterns (by vCPU), in opposite orders; none is a tie.
const PATTERNS: [[u32; VCPUS]; 2] = [[1024, 768, 512, 256], [256, 512, 768, 1024]];
/// The socket pvmm serves in L1.
const SOCKET: &str = "/tmp/pvmm-prefcore.sock";
/// Ticks after a read in which pvmm's published capacities are still looked for (the read and
/// pvmm's tick are not synchronized; L1's mark of the read also lags by its console).
const AROUND_TICKS: usize = 3;

/// The guest's command: amd-pstate's state, then its core ranking and `highest_perf` every
/// [`READ_INTERVAL_S`] for [`READ_FOR_S`] (`tests/scripts/prefcore-guest.sh`).
fn guest_command() -> String {
    scripts::guest(
        &[
            ("READ_FOR_S", &READ_FOR_S.to_string()),
            ("READ_INTERVAL_S", &READ_INTERVAL_S.to_string()),
        ],
        scripts::PREFCORE_GUEST,
    )
}

/// An outside balancer's assignment giving vCPU v a CPU of its own (L1 CPU v) and
/// `capacities[v]`.
fn assignment(capacities: &[u32; VCPUS]) -> String {
    let placements: Vec<(String, u32)> = capacities
        .iter()
        .enumerate()
        .map(|(v, &c)| (v.to_string(), c))
        .collect();
    external_assignment(&placements)
}

/// L1 side: once the guest marks `patterns`, the outside balancer renews one pattern every
/// [`BALANCER_RENEW_S`] and switches patterns every [`PATTERN_S`], until pvmm exits.
fn probe_prefix() -> String {
    let per_pattern = (PATTERN_S / BALANCER_RENEW_S).round() as u32;
    let bodies: Vec<String> = PATTERNS.iter().map(assignment).collect();
    outside_balancer(SOCKET, "patterns", &bodies, BALANCER_RENEW_S, per_pattern)
}

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        run_placement_sequence_on(
            "rig_prefcore",
            GuestKernel::Linux6_12,
            &[("prefcore", balanced_pvmm_args(SOCKET), guest_command())],
            &probe_prefix(),
        )
    })
}

/// One `RANK` line.
#[derive(Debug)]
struct RankRead {
    n: u32,
    ranking: Vec<u64>,
    highest: Vec<u64>,
}

fn rank_reads(guest: &[String]) -> Vec<RankRead> {
    guest
        .iter()
        .filter_map(|line| {
            let rest = line.strip_prefix("RANK ")?;
            let (left, highest) = rest.split_once(" HP ")?;
            let mut words = left.split_whitespace();
            let n = words.next()?.parse().ok()?;
            let numbers = |text: &str| -> Option<Vec<u64>> {
                text.split_whitespace().map(|w| w.parse().ok()).collect()
            };
            Some(RankRead {
                n,
                ranking: numbers(&words.collect::<Vec<_>>().join(" "))?,
                highest: numbers(highest)?,
            })
        })
        .filter(|r| r.ranking.len() == VCPUS && r.highest.len() == VCPUS)
        .collect()
}

#[test]
fn amd_pstate_ranks_the_guests_cpus_by_pvmms_capacities() {
    let Some(outcome) = outcome() else { return };
    let (run, trace) = run_trace(outcome, "prefcore");
    let guest = run.guest.join("\n");
    let state = run
        .guest
        .iter()
        .find_map(|l| l.strip_prefix("PREF "))
        .unwrap_or_else(|| panic!("the guest never printed its amd-pstate state:\n{guest}"));
    assert_eq!(
        state.split_whitespace().collect::<Vec<_>>(),
        ["status", "passive", "prefcore", "enabled", "itmt", "1"],
        "amd-pstate should run passive with preferred cores and ITMT on; the guest's console:\n{guest}"
    );
    // A kernel message the console prints into the middle of a line spoils that one read.
    let reads = rank_reads(run.guest);
    let first = reads
        .iter()
        .find(|r| r.n == 0)
        .unwrap_or_else(|| panic!("the guest's first read is missing:\n{guest}"));
    let at = trace
        .mark("rank-0")
        .expect("the guest marks its first read");
    let published = trace.guest_perfs_around(at, trace.ticks.len(), AROUND_TICKS);
    for (v, ranking) in first.ranking.iter().enumerate() {
        assert!(
            published.iter().any(|tick| tick.get(v) == Some(ranking)),
            "at the first read CPU {v}'s ranking {ranking} is no performance pvmm published for vCPU {v} before it (rankings {:?}; the last published {:?})",
            first.ranking,
            published.last()
        );
    }
}

#[test]
fn the_rankings_follow_pvmms_capacities_when_they_change() {
    let Some(outcome) = outcome() else { return };
    let (run, trace) = run_trace(outcome, "prefcore");
    let guest = run.guest.join("\n");
    let reads = rank_reads(run.guest);
    let marks = run
        .guest
        .iter()
        .filter(|l| l.starts_with("pvmm-mark: rank-"))
        .count();
    assert!(
        reads.len() > marks / 2,
        "too few of the guest's {marks} reads parse:\n{guest}"
    );
    let perfs: Vec<Vec<u64>> = PATTERNS
        .iter()
        .map(|p| guest_perfs(p).into_iter().map(u64::from).collect())
        .collect();
    // When the guest made each read (L1 timestamps its marks).
    let at = |r: &RankRead| trace.mark(&format!("rank-{}", r.n));
    let mut followed = [0; 2];
    for (i, read) in reads.iter().enumerate() {
        let Some(p) = perfs.iter().position(|p| *p == read.highest) else {
            continue;
        };
        // The first of the reads just before this one that saw the same pattern: the pattern
        // was published before it.
        let first_seen = reads[..=i]
            .iter()
            .rev()
            .take_while(|r| r.highest == perfs[p])
            .last()
            .unwrap_or(read);
        let seen_for = at(read).zip(at(first_seen)).map(|(now, then)| now - then);
        if seen_for.is_some_and(|s| s >= FOLLOW_S) {
            assert!(
                follows(&read.ranking, &perfs[p]),
                "read {}: the guest has read pattern {p}'s performances for {FOLLOW_S} s or more but ranks its CPUs {:?}; the guest's reads:\n{}",
                read.n,
                read.ranking,
                describe(&reads)
            );
            followed[p] += 1;
        }
    }
    let switches = reads
        .windows(2)
        .filter(|w| w[0].highest != w[1].highest)
        .filter(|w| perfs.contains(&w[0].highest) && perfs.contains(&w[1].highest))
        .count();
    assert!(
        switches >= 2 && followed.iter().all(|&n| n > 0),
        "the guest should have seen both patterns settle and switched between them at least twice ({switches} switches, settled reads per pattern {followed:?}):\n{}",
        describe(&reads)
    );
    eprintln!(
        "rig_prefcore: {switches} pattern switches in {} reads; rankings checked at {followed:?} settled reads",
        reads.len()
    );
}

/// Whether a guest's `ranking` follows the performances pvmm published (`perfs`, by CPU) as
/// far as pvmm notifies them: the same order of the CPUs (any change of order is notified),
/// and each CPU's ranking within pvmm's notification threshold of its performance (a smaller
/// change that keeps the order is not notified, so the guest keeps its earlier ranking: the
/// change is measured from that ranking, as pvmm measures it from what it last told).
fn follows(ranking: &[u64], perfs: &[u64]) -> bool {
    let n = perfs.len();
    ranking.len() == n
        && (0..n).all(|v| (0..n).all(|w| ranking[v].cmp(&ranking[w]) == perfs[v].cmp(&perfs[w])))
        && ranking.iter().zip(perfs).all(|(&r, &p)| {
            let (r, p) = (u32::try_from(r), u32::try_from(p));
            matches!((r, p), (Ok(r), Ok(p)) if !significant_change(r, p))
        })
}

fn describe(reads: &[RankRead]) -> String {
    reads
        .iter()
        .map(|r| {
            format!(
                "  {:>2}: ranking {:?} highest {:?}",
                r.n, r.ranking, r.highest
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_ranking_follows_a_pattern_by_its_order_and_within_the_notification_threshold() {
    let pattern = [254, 191, 127, 64];
    assert!(follows(&pattern, &pattern));
    // 250 for 254: under the threshold, order kept, so never notified.
    assert!(follows(&[250, 191, 127, 64], &pattern));
    assert!(!follows(&[64, 127, 191, 254], &pattern));
    assert!(!follows(&[191, 254, 127, 64], &pattern));
    // Order kept but 200 for 254 is a change pvmm notifies.
    assert!(!follows(&[200, 191, 127, 64], &pattern));
    assert!(!follows(&[254, 191, 127], &pattern));
}
