//! What the guest kernel sees through ACPI CPPC, end to end in the rig:
//! L1 = 2 packages x 2 cores, a 4-vCPU guest under pvmm, read through the guest's own
//! `/sys/devices/system/cpu/cpuN/acpi_cppc/` and `/proc/interrupts`, compared with pvmm's
//! `--stats` capacities (mapped onto the guest's performance scale as pvmm maps them,
//! `pvmm::cppc::guest_perfs`: 1024 -> 254, and equal vCPUs told apart by one step) and with
//! the vCPU threads' placement seen from L1
//! (`Cpus_allowed_list`). Both runs share one L1 boot. The guest prints a `pvmm-mark:` line
//! before each read; L1 timestamps it, which places the read among pvmm's ticks (an idle
//! guest's capacities are not constant: idle vCPUs sharing a CPU get capacities that follow
//! their neighbours' small, noisy utilization).

use pvmm_rig::RigOutcome;
use pvmm_tests::{cppc_reads, run_placement_sequence, run_trace, scripts, CppcRead, SharedOutcome};

/// Ticks after the guest's mark (printed just before it reads sysfs) in which its read may
/// have happened: the read helper forks `cat`, `tr`, `grep` and `awk` in a guest whose other
/// vCPUs are busy, and with L1's KVM shadowing the guest's page tables (the rig's `npt0`
/// default) each fork is slow; in a CI-like loaded run a read landed 3 ticks after its mark.
/// 1 s (10 ticks) still lies well inside each phase (2 s or more after each load change).
const READ_TICKS_AFTER: usize = 10;

/// Ticks before the mark's L1 timestamp in which the read may have happened: the mark reaches
/// L1 through the guest's serial console, pvmm and a busybox `read` loop in L1 that reads a
/// byte per system call under TCG; measured delays were 0.3-0.5 s, so 2 s (20 ticks).
const READ_TICKS_BEFORE: usize = 20;

/// Difference in the average share of a CPU (from L1's placement samples) above which one
/// vCPU clearly got less CPU than another, so its delivered/reference must be lower: a
/// quarter of a CPU, half the gap between sharing a CPU with one other busy vCPU (0.5) and
/// having it alone (1.0); smaller differences drown in the samples' timing noise (the marks
/// that bound the window reach L1 0.3-0.5 s late, both by about as much).
const CLEARLY_LESS_SHARE: f64 = 0.25;

/// A capacity change this large (relative to the larger value; the guest's scale is
/// proportional to pvmm's, up to half a step of rounding) cannot be noise nor a change under
/// the 5 % notification threshold: it comes from a placement change (a busy vCPU now shares
/// its CPU, or stops sharing it). Idle vCPUs packed together get capacities that follow their
/// neighbours' noisy utilization; reads have shown such swings of up to about 20 %.
const PLACEMENT_CHANGE: f64 = 0.25;

/// Live capacities on 3 host CPUs (`--cpus 0-2`): packed idle, vCPUs 2 and 3 busy (reads
/// while busy), all four busy (two must share a CPU, so their capacity halves), then 8 s idle
/// (longer than the 5 s ramp-down) before the final read. Each read comes at least 2 s after
/// its load change: more than the 1 s per-vCPU notification limit plus a tick.
fn live_command() -> String {
    scripts::guest(&[], scripts::CPPC_LIVE_GUEST)
}

/// Four busy vCPUs on three host CPUs: two must share. Reads feedback_ctrs 2 s and 6 s into
/// the load.
fn shared_command() -> String {
    scripts::guest(&[], scripts::CPPC_SHARED_GUEST)
}

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        run_placement_sequence(
            "rig_cppc",
            &[
                (
                    "live",
                    vec!["--vcpus", "4", "--policy", "powersaving", "--cpus", "0-2"],
                    live_command(),
                ),
                (
                    "shared",
                    vec!["--vcpus", "4", "--policy", "performance", "--cpus", "0-2"],
                    shared_command(),
                ),
            ],
        )
    })
}

fn reads(outcome: &RigOutcome) -> (Vec<CppcRead>, pvmm_tests::PlacementTrace) {
    let (run, trace) = run_trace(outcome, "live");
    let reads = cppc_reads(run.guest);
    let labels: Vec<&str> = reads.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        ["boot", "two", "four", "end"],
        "the guest's CPPC reads; its console:\n{}",
        run.guest.join("\n")
    );
    for read in &reads {
        assert_eq!(read.highest_perf.len(), 4, "{read:?}");
    }
    (reads, trace)
}

/// 5.5 a: at the end of a long idle phase, every guest CPU's `highest_perf` equals the
/// capacity pvmm published for vCPU N when the guest read it (the stats lines around the
/// read's L1-timestamped mark), on the guest's scale.
#[test]
fn guest_highest_perf_equals_pvmm_capacity() {
    let Some(outcome) = outcome() else { return };
    let (reads, trace) = reads(outcome);
    let end = &reads[3];
    let published = published_when_read(&trace, end);
    let value_matches: Vec<bool> = (0..4)
        .map(|v| published.iter().any(|c| c[v] == end.highest_perf[v]))
        .collect();
    eprintln!(
        "guest highest_perf {:?} at the end of the idle phase; pvmm's capacities on the guest's scale around the read: {published:?}",
        end.highest_perf
    );
    assert!(
        value_matches.iter().all(|&m| m),
        "guest highest_perf {:?} (cpu0..3) differs from pvmm's stats capacity (vcpu0..3, on the guest's scale) at the time of the read: {published:?}",
        end.highest_perf
    );
}

/// pvmm's capacity vectors on the guest's scale (what its CPPC registers held) from
/// [`READ_TICKS_BEFORE`] ticks before the guest's mark passed L1's console to
/// [`READ_TICKS_AFTER`] ticks after it.
fn published_when_read(trace: &pvmm_tests::PlacementTrace, read: &CppcRead) -> Vec<Vec<u64>> {
    let at = trace
        .mark(&format!("cppc-{}", read.label))
        .unwrap_or_else(|| panic!("no mark for read '{}': {:?}", read.label, trace.marks));
    trace.guest_perfs_around(at, READ_TICKS_BEFORE, READ_TICKS_AFTER)
}

/// 5.5 b: when the load (and so the placement) changes, the guest reads the new capacities
/// (each read is a capacity vector pvmm published, on the guest's scale) and the GED
/// interrupt count grew.
///
/// Only changes of [`PLACEMENT_CHANGE`] or more must come with an interrupt: the registers
/// are live, so a read may catch a small transient value that reverted before pvmm's
/// 1 s-per-vCPU limit let it be notified, and then nothing is owed.
#[test]
fn guest_sees_new_capacities_and_the_ged_interrupt_after_placement_changes() {
    let Some(outcome) = outcome() else { return };
    let (reads, trace) = reads(outcome);
    for read in &reads {
        let published = published_when_read(&trace, read);
        assert!(
            (0..4).all(|v| published.iter().any(|c| c[v] == read.highest_perf[v])),
            "the guest read {:?} at '{}', not what pvmm published then: {published:?}",
            read.highest_perf,
            read.label
        );
    }
    let mut changes = 0;
    for pair in reads.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        eprintln!(
            "{} -> {}: highest_perf {:?} -> {:?}, GED {} -> {}",
            a.label, b.label, a.highest_perf, b.highest_perf, a.ged, b.ged
        );
        let placement_changed = a
            .highest_perf
            .iter()
            .zip(&b.highest_perf)
            .any(|(&x, &y)| x.abs_diff(y) as f64 >= PLACEMENT_CHANGE * x.max(y) as f64);
        if placement_changed {
            changes += 1;
            assert!(
                b.ged > a.ged,
                "capacities changed between '{}' and '{}' but the GED interrupt count did not grow ({} -> {})",
                a.label,
                b.label,
                a.ged,
                b.ged
            );
        }
    }
    assert!(
        changes > 0,
        "the guest's capacities never changed by {PLACEMENT_CHANGE} or more across load changes: {reads:?}"
    );
    let notifications = trace.ticks.last().map_or(0, |k| k.capacity_notifications);
    assert!(notifications > 0, "pvmm reports no capacity notifications");
}

/// 5.5 c: feedback counters advance, and delivered/reference is lower for vCPUs that share
/// a host CPU than for vCPUs with a CPU of their own (4 busy vCPUs on `--cpus 0-2`).
#[test]
fn feedback_counters_show_sharing() {
    let Some(outcome) = outcome() else { return };
    let (run, trace) = run_trace(outcome, "shared");
    // FB <a|b> <cpu> ref:N del:M
    let mut counters = std::collections::BTreeMap::new();
    for line in run.guest {
        let Some(rest) = line.strip_prefix("FB ") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let field = |prefix: &str| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(prefix))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("bad feedback_ctrs line {line:?}"))
        };
        let cpu: u32 = words[1].parse().expect("cpu number");
        counters.insert((words[0].to_string(), cpu), (field("ref:"), field("del:")));
    }
    assert_eq!(
        counters.len(),
        8,
        "feedback_ctrs reads; guest console:\n{}",
        run.guest.join("\n")
    );
    // The placement between the two reads, from L1 (the guest's marks are timestamped by L1
    // as they pass its console).
    let (Some(t0), Some(t1)) = (trace.mark("fb-a"), trace.mark("fb-b")) else {
        panic!(
            "the guest's fb-a / fb-b marks are missing: {:?}",
            trace.marks
        );
    };
    let window: Vec<usize> = (0..trace.samples.len())
        .filter(|&i| (t0..=t1).contains(&trace.samples[i].t))
        .collect();
    assert!(window.len() >= 5, "too few samples in the load window");
    // Each vCPU's expected share of a CPU over the window, from L1's view of the placement:
    // per sample, 1 / (vCPU threads allowed on its CPU) when it may run on one CPU only.
    // pvmm may rotate which vCPUs share, so this is an average, not a class.
    let expected: Vec<f64> = (0..4u32)
        .map(|vcpu| {
            window
                .iter()
                .map(|&i| {
                    let threads = &trace.samples[i].threads;
                    let mine = &threads[vcpu as usize].allowed;
                    if mine.len() != 1 {
                        return 1.0;
                    }
                    let sharers = threads
                        .iter()
                        .filter(|t| t.allowed.contains(&mine[0]))
                        .count();
                    1.0 / sharers.max(1) as f64
                })
                .sum::<f64>()
                / window.len() as f64
        })
        .collect();
    let ratio = |cpu: u32| {
        let (ra, da) = counters[&("a".to_string(), cpu)];
        let (rb, db) = counters[&("b".to_string(), cpu)];
        assert!(
            rb > ra && db > da,
            "vCPU {cpu}: feedback_ctrs did not advance: ref {ra} -> {rb}, del {da} -> {db}"
        );
        (db - da) as f64 / (rb - ra) as f64
    };
    let ratios: Vec<f64> = (0..4).map(ratio).collect();
    eprintln!("expected CPU share {expected:.2?}, delivered/reference {ratios:.2?}");
    let mut compared = 0;
    for a in 0..4 {
        for b in 0..4 {
            if expected[b] - expected[a] >= CLEARLY_LESS_SHARE {
                compared += 1;
                assert!(
                    ratios[a] < ratios[b],
                    "vCPU {a} had less of a CPU than vCPU {b} ({:.2} vs {:.2}) but its delivered/reference is not lower ({:.2} vs {:.2})",
                    expected[a],
                    expected[b],
                    ratios[a],
                    ratios[b]
                );
            }
        }
    }
    assert!(
        compared > 0,
        "no vCPU had clearly less of a CPU than another (4 busy vCPUs on 3 CPUs): {expected:.2?}\n{}",
        trace.describe(window[0], window[window.len() - 1])
    );
}
