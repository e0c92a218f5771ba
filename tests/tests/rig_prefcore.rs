//! The guest's own scheduler acting on pvmm's capacities: a Debian 13 (Linux 6.12) guest whose
//! `amd-pstate` driver (passive mode) runs on pvmm's `_CPC` registers, ranks its CPUs by the
//! highest performance pvmm serves ("preferred core"), and hands the ranking to the
//! scheduler's ITMT priorities. Checked from the guest's own sysfs and `/proc`:
//!
//! - the driver runs, preferred core is enabled and ITMT is on;
//! - once the guest is up and idle, the rankings equal the performances pvmm published then
//!   (its `--stats` capacities, mapped to the guest's scale, around the read);
//! - while a busy thread moves pvmm's placement (one vCPU gets a CPU of its own, the others
//!   pack), the ORDER of the rankings follows the order of the highest performances the guest
//!   reads: a performance order that has held for [`FOLLOW_S`] is the rankings' order. (Only
//!   the order: pvmm notifies order changes and changes of 5 % or more; a smaller change that
//!   keeps the order is not notified, and the ranking keeps the older value.)
//!
//! L1 runs on an emulated Zen 2 (`EPYC-Rome`), which amd-pstate needs (the rig picks it for
//! a 6.12 guest).

use std::sync::OnceLock;

use pvmm_rig::{GuestKernel, RigOutcome};
use pvmm_tests::{run_placement_sequence_on, run_trace, GUEST_HELPERS};

/// The guest's vCPUs.
const VCPUS: usize = 4;
/// Seconds between the guest's reads of its rankings and performances.
const READ_INTERVAL_S: f64 = 0.5;
/// Reads after the first.
const READS: u32 = 40;
/// Seconds the busy thread runs (from the first read on): the placement changes when it starts
/// and when it ends.
const BUSY_S: u32 = 8;
/// How long a performance order must have held before the rankings must show it: pvmm
/// notifies a vCPU at most once a second, the guest's driver updates the ranking on the
/// notification, and the guest's reads are [`READ_INTERVAL_S`] apart.
const FOLLOW_S: f64 = 2.5;
/// Ticks around a read in which pvmm's published capacities are looked for (the read and
/// pvmm's tick are not synchronized; L1's mark of the read also lags by its console).
const AROUND_TICKS: usize = 3;

/// `rd N`: the mark `pvmm-mark: rank-N`, then `RANK N <ranking per CPU> HP <highest_perf per
/// CPU>` from the guest's sysfs.
const READ_HELPER: &str = "rd(){ echo pvmm-mark: rank-$1; c=/sys/devices/system/cpu; echo \"RANK $1 $(cat $c/cpu[0-9]*/cpufreq/amd_pstate_prefcore_ranking | tr '\\n' ' ')HP $(cat $c/cpu[0-9]*/acpi_cppc/highest_perf | tr '\\n' ' ')\"; }\n";

fn guest_command() -> String {
    format!(
        "{GUEST_HELPERS}{READ_HELPER}\
         echo \"PREF status $(cat /sys/devices/system/cpu/amd_pstate/status) prefcore $(cat /sys/devices/system/cpu/amd_pstate/prefcore) itmt $(cat /proc/sys/kernel/sched_itmt_enabled)\"\n\
         sleep 3\nrd 0\nl 0 {BUSY_S}\ni=0\n\
         while [ $i -lt {READS} ]; do sleep {READ_INTERVAL_S}; i=$((i + 1)); rd $i; done\n"
    )
}

fn outcome() -> Option<&'static RigOutcome> {
    static OUTCOME: OnceLock<Option<RigOutcome>> = OnceLock::new();
    OUTCOME
        .get_or_init(|| {
            run_placement_sequence_on(
                "rig_prefcore",
                GuestKernel::Linux6_12,
                &[(
                    "prefcore",
                    vec!["--vcpus", "4", "--policy", "powersaving"],
                    guest_command(),
                )],
                "",
            )
        })
        .as_ref()
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

/// The order of `values`: for every pair, how the first compares with the second.
fn order(values: &[u64]) -> Vec<std::cmp::Ordering> {
    let mut pairs = Vec::new();
    for (i, a) in values.iter().enumerate() {
        for b in &values[i + 1..] {
            pairs.push(a.cmp(b));
        }
    }
    pairs
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
    let reads = rank_reads(run.guest);
    assert_eq!(
        reads.len(),
        READS as usize + 1,
        "the guest's reads:\n{guest}"
    );
    let first = &reads[0];
    let at = trace.mark("rank-0").expect("the guest marks its first read");
    let published = trace.guest_perfs_around(at, AROUND_TICKS, AROUND_TICKS);
    assert!(
        published.contains(&first.ranking),
        "at the first read the rankings {:?} should be what pvmm published around it {published:?}",
        first.ranking
    );
}

#[test]
fn the_rankings_follow_the_order_of_pvmms_capacities() {
    let Some(outcome) = outcome() else { return };
    let (run, _) = run_trace(outcome, "prefcore");
    let guest = run.guest.join("\n");
    let reads = rank_reads(run.guest);
    assert!(reads.len() > 10, "the guest's reads:\n{guest}");
    let held = (FOLLOW_S / READ_INTERVAL_S).ceil() as usize;
    let mut checked = 0;
    for (i, read) in reads.iter().enumerate().skip(held) {
        let now = order(&read.highest);
        if reads[i - held..i].iter().all(|r| order(&r.highest) == now) {
            checked += 1;
            assert_eq!(
                order(&read.ranking),
                now,
                "read {}: the highest performances' order {:?} has held for {FOLLOW_S} s but the rankings are {:?}; the guest's reads:\n{}",
                read.n,
                read.highest,
                read.ranking,
                describe(&reads)
            );
        }
    }
    let changes = reads
        .windows(2)
        .filter(|w| order(&w[0].highest) != order(&w[1].highest))
        .count();
    assert!(
        changes > 0 && checked > 0,
        "the busy thread should change the order of the vCPUs' performances at least once ({changes} changes, {checked} settled reads checked):\n{}",
        describe(&reads)
    );
    eprintln!(
        "rig_prefcore: {changes} changes of the performance order in {} reads, {checked} settled reads checked",
        reads.len()
    );
}

fn describe(reads: &[RankRead]) -> String {
    reads
        .iter()
        .map(|r| format!("  {:>2}: ranking {:?} highest {:?}", r.n, r.ranking, r.highest))
        .collect::<Vec<_>>()
        .join("\n")
}
