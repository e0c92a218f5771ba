//! `cargo xtask bench-placement`: a kernbench-like load in the rig under every placement
//! policy and under `--policy none`, reported as the sched_mc_power_savings kernbench tables
//! were (package idle, energy and power relative to the performance policy; the tables of
//! "Re: [PATCH v7 0/8] Tunable sched_mc_power_savings=n" (Vaidyanathan Srinivasan, LKML, 2008-12-30)).
//!
//! One L1 boot (2 packages x 2 cores by default) runs a 4-vCPU guest under pvmm once per
//! (thread count N, policy) and round, on the benchmark runner ([`crate::runner`]: each round
//! turns the policies' order within each N, and L1 failing by itself costs only the runs it
//! cut off). The guest runs `pvmm-load --threads N` with a kernbench-like
//! duty cycle between two `pvmm-mark:` lines, which L1 timestamps ([`crate::scripts`]). A probe
//! pinned to L1 CPU 0 samples L1's `/proc/stat` per CPU; everything is measured over the load
//! window only:
//!
//! - **Package Idle(%)**: per package, the share of the window in which none of its CPUs was
//!   busy, per sample interval `1 - max(busy share of its CPUs)` (the CPUs' busy time is
//!   assumed to overlap, the same assumption as the simulator's `thread_overlap`);
//! - **Work**: pvmm-load's total iterations;
//! - **Migrations**: pvmm's `migrations_total` over the window, from its `--stats` lines, which
//!   the probe prints whole and the benchmark reads as the stats schema's type, each timed by
//!   its `boot_ms` (L1's clock, the marks' own);
//! - **L1 migrations**: the same window counted by L1's kernel: the sum of the vCPU threads'
//!   `se.nr_migrations` (`/proc/<pid>/task/<tid>/sched`), every move of a vCPU thread from one
//!   L1 CPU to another, whoever made it (pvmm's pinning, or L1's scheduler within a set of
//!   several CPUs or under `--policy none`), read every `KERNEL_COUNT_EVERY` samples; the
//!   window runs from the last read at or before the load's start to the last at or before its
//!   end;
//! - **Pkg1 idle after start(s)**, **after end(s)**: the seconds from the load's start until
//!   package 1 is idle for the rest of the load, and from its end until package 1 is idle for
//!   the rest of an idle tail of [`IDLE_TAIL_SECS`] (the guest idles after the load): idle for
//!   good, every sample interval from then on with each of its CPUs busy at most
//!   [`IDLE_MAX_BUSY`] of the time; 0.0 when it did not wake at all, `-` when it was still awake
//!   in the last interval (or the topology has one package);
//! - **Energy**: the measured per-CPU activity fed, interval by interval, into the
//!   simulator's power model ([`PowerModel`], default constants: Len Brown's SNB-EP
//!   figures), so `Energy` = modelled joules per unit of work relative to `performance`.
//!
//! The probe's own sampling (a few shell builtins every 0.2 s) lands on package 0 under every
//! policy alike. With several rounds, each figure of a table's row is its median over the
//! rounds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use pvmm_scheduler::power::PowerModel;

use crate::activity::Activity;
use crate::figures::{median, table};
use crate::images::L1Images;
use crate::probe::{read_stats, ProbeLine};
use crate::rig::{RigError, RigOutcome, RunLines, Topology};
use crate::runner::{
    clean_run, figures_of, grid_case, grid_section, Benchmark, Boots, Measured, Run,
};
use crate::scripts;
use crate::sequence::{run_pvmm_sequence, PvmmRun, SequenceOptions, L1_BOOT_SECS};
use crate::workspace::Workspace;

/// The kernbench thread busy fraction of the simulator's scenario, 1 - sqrt(0.5086) = 0.287,
/// as a pvmm-load duty in percent (pvmm-sim's `kernbench_busy_fraction`: 50.86 % is the packed
/// package's idle share in the kernbench tables of "Re: [PATCH v7 0/8] Tunable
/// sched_mc_power_savings=n", Vaidyanathan Srinivasan, LKML, 2008-12-30).
pub const KERNBENCH_DUTY_PERCENT: u32 = 29;

/// pvmm-load period (ms) giving the simulator's kernbench scenario's 20 ms mean bursts at 29 %
/// duty (pvmm-sim's `KERNBENCH_BURST_MS`): 20 / 0.287 = 70 ms.
pub const KERNBENCH_PERIOD_MS: u32 = 70;

/// Policies compared, `performance` first (the reference), then `none` (no pinning).
pub const BENCH_POLICIES: [&str; 5] = [
    "performance",
    "balance",
    "powersaving",
    "powersaving:2",
    "none",
];

/// Where pvmm writes its stats in L1.
const STATS_PATH: &str = "/tmp/pvmm-bench-stats.jsonl";

/// Probe sampling interval (s): fine enough for the package-overlap estimate, cheap for L1.
const SAMPLE_INTERVAL: &str = "0.2";

/// The probe reads the vCPU threads' migration counts every this many samples (0.4 s): it
/// starts one `grep` each time, which L1 CPU 0 pays for, and a steady window of 10 s or more
/// loses at most one read's worth at each end.
const KERNEL_COUNT_EVERY: u32 = 2;

/// L1 time allowed per run besides the load: guest boot and power-off (about 12 s on an
/// idle machine), times 5 for shared machines. A run past it is killed (and reported): one
/// hung run must not stall the whole benchmark.
const RUN_OVERHEAD_SECS: u64 = 60;

/// Per-run limit: the load's own time times this, plus [`RUN_OVERHEAD_SECS`].
const LOAD_TIME_FACTOR: u64 = 3;

/// The whole L1 boot may take this many per-run limits per run, plus [`L1_BOOT_SECS`]: the
/// per-run limit is counted on L1's clock from pvmm's start, but each run also pays for L1
/// starting pvmm and the probe: on a shared 2-CPU host 15 runs of 10 s take about 1410 s
/// against 1350 s of per-run limits, so one limit per run would cut the last cases off. A hung
/// run is still cut off by its own limit.
const SEQUENCE_SLACK_FACTOR: u64 = 2;

/// A run's time besides its load on a quiet host (guest boot to init about 16 s, power-off,
/// pvmm and probe start; measured: 3 runs of 10 s in 100 s), for the progress estimate.
const PER_RUN_QUIET_OVERHEAD_SECS: u64 = 25;

/// What to run.
#[derive(Debug, Clone)]
pub struct PlacementBenchOptions {
    /// Busy guest thread counts (N).
    pub threads: Vec<u32>,
    /// Guest vCPUs.
    pub vcpus: u32,
    /// Load duration per run (s).
    pub seconds: u32,
    /// pvmm-load duty cycle (%).
    pub duty_percent: u32,
    /// pvmm-load period (ms).
    pub period_ms: u32,
    /// pvmm policies (`none` included), each maybe with [`SHARE_SUFFIX`] ([`policy_args`]).
    pub policies: Vec<String>,
    /// Rounds: every (N, policy) case once per round.
    pub rounds: u32,
    /// L1 topology.
    pub topology: Topology,
    /// Print every rig line.
    pub echo: bool,
    /// The guests' kernel.
    pub guest_kernel: crate::GuestKernel,
}

/// One measured case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    /// pvmm's `--policy`.
    pub policy: String,
    /// Busy guest threads.
    pub threads: u32,
    /// The load window (s, L1 clock).
    pub window_s: f64,
    /// pvmm-load's total iterations.
    pub work: u64,
    /// Per package (by id), share of the window it was idle.
    pub package_idle: Vec<f64>,
    /// Modelled energy over the window (J).
    pub energy_j: f64,
    /// pvmm's migrations during the window.
    pub migrations: u64,
    /// The vCPU threads' migrations during the window as L1's kernel counted them (None: the
    /// probe read no count before the window's start).
    pub kernel_migrations: Option<u64>,
    /// Seconds from the load's start until package 1 was idle for the rest of the load (None:
    /// awake at its end, or no package 1).
    pub package1_idle_after_start_s: Option<f64>,
    /// Seconds from the load's end until package 1 was idle for the rest of the idle tail.
    pub package1_idle_after_end_s: Option<f64>,
}

impl CaseResult {
    /// Average modelled power (W).
    pub fn power_w(&self) -> f64 {
        if self.window_s > 0.0 {
            self.energy_j / self.window_s
        } else {
            0.0
        }
    }

    /// Modelled energy per iteration (J).
    pub fn energy_per_work(&self) -> f64 {
        if self.work > 0 {
            self.energy_j / self.work as f64
        } else {
            f64::INFINITY
        }
    }
}

/// The L1 probe: pins itself to CPU 0, prints the CPU topology, then samples `/proc/stat`
/// (and every `KERNEL_COUNT_EVERY` samples the vCPU threads' `se.nr_migrations`, a `K` line)
/// until pvmm exits; prints the samples, the guest's marks and pvmm's `--stats` lines whole
/// (read as [`pvmm_api::stats::VmStats`] by [`read_stats`]).
pub fn bench_probe() -> String {
    scripts::assemble(
        &[
            ("SAMPLE_INTERVAL", SAMPLE_INTERVAL),
            ("KERNEL_COUNT_EVERY", &KERNEL_COUNT_EVERY.to_string()),
            ("STATS_PATH", STATS_PATH),
        ],
        &[scripts::CPU_ACTIVITY_LIB, scripts::BENCH_PROBE],
    )
}

/// What a `--policies` entry with this suffix adds to its policy: `--share-package`.
pub const SHARE_SUFFIX: &str = ".share";

/// pvmm's placement flags for one `--policies` entry: `POLICY`, or `POLICY.share` for
/// `--policy POLICY --share-package`.
pub fn policy_args(entry: &str) -> Vec<String> {
    match entry.strip_suffix(SHARE_SUFFIX) {
        Some(policy) => vec!["--policy".into(), policy.into(), "--share-package".into()],
        None => vec!["--policy".into(), entry.into()],
    }
}

/// Seconds the guest idles after its load, between the `load-end` and `idle-end` marks: past
/// pvmm's 5 s consolidation ramp-down plus the decay of the vCPUs' demand (about 1 s), so
/// that a packing policy can put package 1 to sleep within it.
pub const IDLE_TAIL_SECS: u32 = 9;

/// Busy share (per probe sample interval) at or below which an L1 CPU counts as idle for
/// the "Pkg1 idle after" columns: two of the 20 USER_HZ ticks of a 0.2 s interval, room for a timer tick
/// or a kernel worker.
pub const IDLE_MAX_BUSY: f64 = 0.1;

/// Seconds the guest stays idle after init before its load starts: longer than pvmm's 5 s
/// consolidation ramp-down (scheduler's `DEFAULT_RAMP_DOWN_WINDOW_MS`), so every policy starts
/// from its steady idle placement rather than from the spread the guest's own boot caused.
pub const SETTLE_SECS: u32 = 6;

/// The guest command of one case; with no busy thread the guest sleeps through the window
/// (an idle guest's steady state).
pub fn guest_command(options: &PlacementBenchOptions, threads: u32) -> String {
    scripts::guest_command(
        &[
            ("SETTLE_SECS", &SETTLE_SECS.to_string()),
            ("THREADS", &threads.to_string()),
            ("DUTY", &options.duty_percent.to_string()),
            ("PERIOD_MS", &options.period_ms.to_string()),
            ("SECONDS_LOAD", &options.seconds.to_string()),
            ("IDLE_TAIL_SECS", &IDLE_TAIL_SECS.to_string()),
        ],
        &[scripts::PLACEMENT_BENCH_GUEST],
    )
}

/// The benchmark on the runner ([`crate::runner::run`]): one section per N, its cases the
/// policies, every run in one L1 boot.
pub struct PlacementBench<'a> {
    ws: &'a Workspace,
    images: &'a L1Images,
    options: PlacementBenchOptions,
}

impl<'a> PlacementBench<'a> {
    /// The benchmark of `options` on these images.
    pub fn new(ws: &'a Workspace, images: &'a L1Images, options: PlacementBenchOptions) -> Self {
        PlacementBench {
            ws,
            images,
            options,
        }
    }

    /// Case `case`'s busy thread count and policy entry.
    fn case(&self, case: usize) -> (u32, &str) {
        let (section, place) = grid_case(case, self.options.policies.len());
        (self.options.threads[section], &self.options.policies[place])
    }

    /// A run's limit in L1: its load, settling and idle tail, with room.
    fn per_run_secs(&self) -> u64 {
        RUN_OVERHEAD_SECS
            + u64::from(SETTLE_SECS + IDLE_TAIL_SECS)
            + LOAD_TIME_FACTOR * u64::from(self.options.seconds)
    }

    /// The table title of N = `threads`.
    fn title(&self, threads: u32) -> String {
        let o = &self.options;
        let load = match threads {
            0 => format!("idle guest (sleep {})", o.seconds),
            n => format!(
                "pvmm-load --threads {n} --duty {} --period-ms {} --seconds {}",
                o.duty_percent, o.period_ms, o.seconds
            ),
        };
        format!(
            "N = {threads}: {load}, {} vCPUs, L1 {}, guest kernel {}, {} round(s)",
            o.vcpus, o.topology, o.guest_kernel, o.rounds
        )
    }
}

impl Benchmark for PlacementBench<'_> {
    type Figures = CaseResult;

    fn name(&self) -> &str {
        "bench-placement"
    }

    fn sections(&self) -> Vec<usize> {
        vec![self.options.policies.len(); self.options.threads.len()]
    }

    fn rounds(&self) -> u32 {
        self.options.rounds
    }

    fn boots(&self) -> Boots {
        Boots::Shared
    }

    fn label(&self, case: usize, round: u32) -> String {
        let (threads, policy) = self.case(case);
        format!("{policy}-n{threads}-r{round}")
    }

    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError> {
        let o = &self.options;
        let pvmm_runs: Vec<PvmmRun> = runs
            .iter()
            .map(|run| {
                let (threads, policy) = self.case(run.case);
                let mut pvmm_args = vec!["--vcpus".to_string(), o.vcpus.to_string()];
                pvmm_args.extend(policy_args(policy));
                pvmm_args.extend(["--stats".to_string(), STATS_PATH.to_string()]);
                PvmmRun {
                    label: run.label.clone(),
                    pvmm_args,
                    guest_command: guest_command(o, threads),
                }
            })
            .collect();
        let per_run = self.per_run_secs();
        let sequence = SequenceOptions {
            topology: o.topology,
            timeout: Duration::from_secs(
                L1_BOOT_SECS + SEQUENCE_SLACK_FACTOR * per_run * runs.len() as u64,
            ),
            run_limit_secs: per_run,
            echo: o.echo,
            progress: false,
            probe: Some(bench_probe()),
            tuning: crate::tuning::L1Tuning::default(),
            guest_kernel: o.guest_kernel,
        };
        let quiet_secs =
            u64::from(o.seconds + SETTLE_SECS + IDLE_TAIL_SECS) + PER_RUN_QUIET_OVERHEAD_SECS;
        crate::host::progress(&format!(
            "{} pvmm runs of {} s load in one L1 boot: about {} min on a quiet 2-CPU host, at most {} min (--verbose shows every line)",
            runs.len(),
            o.seconds,
            (runs.len() as u64 * quiet_secs).div_ceil(60),
            sequence.timeout.as_secs().div_ceil(60)
        ));
        run_pvmm_sequence(self.ws, self.images, &sequence, &pvmm_runs)
    }

    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<CaseResult, String> {
        let (threads, policy) = self.case(run.case);
        let (work, measured) = measure_case(outcome, &run.label, threads, &PowerModel::default())?;
        Ok(CaseResult {
            policy: policy.to_string(),
            threads,
            window_s: measured.window_s,
            work,
            package_idle: measured.package_idle,
            energy_j: measured.energy_j,
            migrations: measured.migrations,
            kernel_migrations: measured.kernel_migrations,
            package1_idle_after_start_s: measured.package1_idle_after_start_s,
            package1_idle_after_end_s: measured.package1_idle_after_end_s,
        })
    }

    fn summary(&self, r: &CaseResult) -> String {
        format!(
            "window {:.1} s, {} iterations, {:.1} J, {} migrations",
            r.window_s, r.work, r.energy_j, r.migrations
        )
    }

    fn tables(&self, results: &[Measured<CaseResult>]) -> String {
        let policies = self.options.policies.len();
        let mut out = String::new();
        for (index, &threads) in self.options.threads.iter().enumerate() {
            let section = grid_section(index, policies);
            let runs = figures_of(results, |case| section.contains(&case));
            let rows: Vec<CaseResult> = self
                .options
                .policies
                .iter()
                .filter_map(|p| median_case(p, &runs))
                .collect();
            let rows: Vec<&CaseResult> = rows.iter().collect();
            let _ = writeln!(out, "{}", format_bench_table(&self.title(threads), &rows));
        }
        out
    }
}

/// The medians of `policy`'s runs among `runs`, figure by figure; None when it has none.
pub fn median_case(policy: &str, runs: &[&CaseResult]) -> Option<CaseResult> {
    let mine: Vec<&&CaseResult> = runs.iter().filter(|r| r.policy == policy).collect();
    let first = mine.first()?;
    let of = |f: &dyn Fn(&CaseResult) -> Option<f64>| median(mine.iter().map(|r| f(r)));
    // The median of counts is a count again: a median of non-negative whole numbers (below
    // 2^53, exact as f64) is one of them or the mean of two, rounded back into the range.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let count = |f: &dyn Fn(&CaseResult) -> Option<u64>| {
        of(&|r| f(r).map(|n| n as f64)).map(|m| m.round() as u64)
    };
    Some(CaseResult {
        policy: policy.to_string(),
        threads: first.threads,
        window_s: of(&|r| Some(r.window_s))?,
        work: count(&|r| Some(r.work))?,
        package_idle: (0..first.package_idle.len())
            .map(|p| of(&|r| r.package_idle.get(p).copied()).unwrap_or(0.0))
            .collect(),
        energy_j: of(&|r| Some(r.energy_j))?,
        migrations: count(&|r| Some(r.migrations))?,
        kernel_migrations: count(&|r| r.kernel_migrations),
        package1_idle_after_start_s: of(&|r| r.package1_idle_after_start_s),
        package1_idle_after_end_s: of(&|r| r.package1_idle_after_end_s),
    })
}

/// What one run measured over its load window ([`CaseResult`] without the case's name and
/// work).
pub(crate) struct LoadWindow {
    pub(crate) window_s: f64,
    pub(crate) package_idle: Vec<f64>,
    pub(crate) energy_j: f64,
    pub(crate) migrations: u64,
    pub(crate) kernel_migrations: Option<u64>,
    pub(crate) package1_idle_after_start_s: Option<f64>,
    pub(crate) package1_idle_after_end_s: Option<f64>,
}

/// pvmm-load's work in `run`'s guest output (0 with no busy thread).
fn work(run: &RunLines, threads: u32) -> Result<u64, String> {
    let iterations = run
        .guest
        .iter()
        .find_map(|l| l.strip_prefix("pvmm-load: total iterations "))
        .and_then(|n| n.trim().parse().ok());
    match (threads, iterations) {
        (0, _) => Ok(0),
        (_, Some(n)) => Ok(n),
        (_, None) => Err("no 'pvmm-load: total iterations' line from the guest".into()),
    }
}

fn measure_case(
    outcome: &RigOutcome,
    label: &str,
    threads: u32,
    model: &PowerModel,
) -> Result<(u64, LoadWindow), String> {
    let run = clean_run(outcome, label)?;
    Ok((work(&run, threads)?, measure_window(&run, model)?))
}

/// Measures a run of [`bench_probe`] between its guest's `load-begin` and `load-end` marks
/// (and its idle tail up to `idle-end`).
pub(crate) fn measure_window(run: &RunLines, model: &PowerModel) -> Result<LoadWindow, String> {
    let mut activity = Activity::default();
    let mut marks: BTreeMap<String, f64> = BTreeMap::new();
    let mut stats: Vec<(f64, u64)> = Vec::new();
    let mut kernel_counts: Vec<(f64, u64)> = Vec::new();
    for line in run.probe {
        if activity.parse_line(line) {
            continue;
        }
        if let Some(tick) = read_stats(line) {
            // The tick's instant on L1's clock (its boot clock, as the marks' `/proc/uptime`).
            let up = std::time::Duration::from_millis(tick.boot_ms).as_secs_f64();
            stats.push((up, tick.migrations_total));
            continue;
        }
        match ProbeLine::parse(line) {
            Ok(Some(ProbeLine::Mark(t, text))) => {
                marks.insert(text, t);
            }
            Ok(Some(ProbeLine::KernelMigrations { up, total })) => kernel_counts.push((up, total)),
            _ => {}
        }
    }
    let (Some(&begin), Some(&end)) = (marks.get("load-begin"), marks.get("load-end")) else {
        return Err(format!("missing load marks (got {marks:?})"));
    };
    let window = activity.window(begin, end, model)?;
    let at = |t: f64| {
        stats
            .iter()
            .filter(|&&(up, _)| up <= t)
            .map(|&(_, m)| m)
            .next_back()
            .unwrap_or(0)
    };
    let kernel_at = |t: f64| {
        kernel_counts
            .iter()
            .filter(|&&(up, _)| up <= t)
            .map(|&(_, total)| total)
            .next_back()
    };
    let kernel_migrations = kernel_at(begin)
        .zip(kernel_at(end))
        .map(|(from, to)| to.saturating_sub(from));
    let package1_idle_after_end_s = marks
        .get("idle-end")
        .and_then(|&idle_end| activity.idle_for_good_after(1, end, idle_end, IDLE_MAX_BUSY));
    Ok(LoadWindow {
        window_s: window.seconds,
        package_idle: window.package_idle,
        energy_j: window.energy_j,
        migrations: at(end).saturating_sub(at(begin)),
        kernel_migrations,
        package1_idle_after_start_s: activity.idle_for_good_after(1, begin, end, IDLE_MAX_BUSY),
        package1_idle_after_end_s,
    })
}

/// One row of [`format_bench_table`]: `r` with its Energy and Power relative to `reference`.
fn bench_row(r: &CaseResult, reference: &CaseResult) -> [String; 12] {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 && a.is_finite() && b.is_finite() {
            format!("{:.2}", a / b)
        } else {
            "-".to_string()
        }
    };
    let seconds = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.1}"));
    [
        r.policy.clone(),
        r.work.to_string(),
        r.package_idle
            .iter()
            .map(|f| format!("{:6.2}", f * 100.0))
            .collect::<Vec<_>>()
            .join(" "),
        ratio(r.energy_per_work(), reference.energy_per_work()),
        ratio(r.power_w(), reference.power_w()),
        format!("{:.1}", r.energy_j),
        format!("{:.2}", r.power_w()),
        r.migrations.to_string(),
        r.kernel_migrations
            .map_or("-".to_string(), |m| m.to_string()),
        format!("{:.0}", r.work as f64 / r.energy_j.max(f64::MIN_POSITIVE)),
        seconds(r.package1_idle_after_start_s),
        seconds(r.package1_idle_after_end_s),
    ]
}

/// The results for `threads` busy threads as a table in the sched_mc_power_savings kernbench
/// tables' format (pvmm-sim's `format_table` layout): `performance` = 1.00 for Energy (per unit of work) and Power.
pub fn format_bench_table(title: &str, results: &[&CaseResult]) -> String {
    let mut out = format!("{title}\n");
    let Some(reference) = results
        .iter()
        .find(|r| r.policy == "performance")
        .or(results.first())
    else {
        out.push_str("(no runs)\n");
        return out;
    };
    let headers = [
        "Policy",
        "Work(iter)",
        "Package Idle(%)",
        "Energy",
        "Power",
        "Energy(J)",
        "Power(W)",
        "Migrations",
        "L1 migrations",
        "Work/J",
        "Pkg1 idle after start(s)",
        "after end(s)",
    ];
    let rows: Vec<[String; 12]> = results.iter().map(|r| bench_row(r, reference)).collect();
    out.push_str(&table(headers, &rows));
    let _ = writeln!(
        out,
        "(Energy, Power: relative to {} = 1.00; Energy is modelled joules per iteration)",
        reference.policy
    );
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_share_suffix_adds_share_package() {
        assert_eq!(policy_args("balance"), ["--policy", "balance"]);
        assert_eq!(
            policy_args("powersaving:2.share"),
            ["--policy", "powersaving:2", "--share-package"]
        );
    }

    use super::*;

    fn case(policy: &str, work: u64, energy: f64) -> CaseResult {
        CaseResult {
            policy: policy.into(),
            threads: 2,
            window_s: 10.0,
            work,
            package_idle: vec![0.5, 0.9],
            energy_j: energy,
            migrations: 3,
            kernel_migrations: (policy == "powersaving").then_some(4),
            package1_idle_after_start_s: (policy == "powersaving").then_some(1.2),
            package1_idle_after_end_s: (policy == "powersaving").then_some(5.6),
        }
    }

    #[test]
    fn table_is_relative_to_performance() {
        let perf = case("performance", 1000, 2000.0);
        let ps = case("powersaving", 1000, 1500.0);
        let table = format_bench_table("N = 2", &[&perf, &ps]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "N = 2");
        assert!(lines[1].starts_with("Policy"));
        let perf_cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(perf_cells[0], "performance");
        assert_eq!(perf_cells[4], "1.00");
        let ps_cells: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(ps_cells[4], "0.75");
        assert_eq!(ps_cells[5], "0.75");
        assert_eq!(perf_cells[perf_cells.len() - 2..], ["-", "-"]);
        assert_eq!(ps_cells[ps_cells.len() - 2..], ["1.2", "5.6"]);
        assert!(lines[4].contains("relative to performance"));
    }

    /// A whole `--stats` line of one 1-vCPU tick; pvmm's clock started at L1 uptime 9.4 s.
    fn stats_line(t_ms: u64, migrations_total: u64) -> String {
        let boot_ms = 9400 + t_ms;
        format!(
            r#"{{"boot_ms":{boot_ms},"capacity_notifications":0,"cppc_enabled":0,"external":false,"guest_register_errors":0,"migrations":0,"migrations_total":{migrations_total},"packages":[],"policy":"powersaving:1","policy_changes":0,"t_ms":{t_ms},"vcpus":[{{"busy":true,"capacity":1024,"cpus":"1","desired":null,"package":0,"tid":1,"util":0.5,"vcpu":0,"waited":0.0}}]}}"#
        )
    }

    #[test]
    fn the_window_reads_pvmms_migrations_from_whole_stats_lines() {
        let mut probe: Vec<String> = ["PKG 0 0 0", "PKG 1 1 0", "START 9.0"]
            .map(String::from)
            .to_vec();
        for s in 0..6u64 {
            probe.push(format!("T {}", 10 + s));
            probe.push(format!("C cpu0 {} 0 0 {} 0 0 0 0", 50 * s, 50 * s));
            probe.push(format!("C cpu1 0 0 0 {} 0 0 0 0", 100 * s));
        }
        probe.extend(
            [
                "M 10.0 load-begin",
                "M 13.0 load-end",
                "K 9.8 5",
                "K 12.9 9",
            ]
            .map(String::from),
        );
        // pvmm's clock starts 0.4 s after the probe (9.0 s): the window (L1 10.0-13.0 s) is
        // 600-3600 ms on it, read through each line's boot clock, not through START.
        for (t_ms, total) in [(500, 2), (1000, 3), (2500, 7), (4000, 10), (4500, 12)] {
            probe.push(stats_line(t_ms, total));
        }
        let run = RunLines {
            guest: &[],
            vmm: &[],
            probe: &probe,
            status: Some(0),
        };
        let measured = measure_window(&run, &PowerModel::default()).expect("a window");
        assert_eq!(measured.migrations, 5);
        assert_eq!(measured.kernel_migrations, Some(4));
        assert!((measured.window_s - 3.0).abs() < 1e-9);
    }

    #[test]
    fn probe_and_command_mention_what_the_parser_reads() {
        let probe = bench_probe();
        assert!(probe.contains("rig-marks") && probe.contains("nr_migrations"));
        // pvmm's stats come whole, for the typed read; no shell parses them.
        assert!(probe.contains("\ncat \"$STATS_PATH\"\n"), "{probe}");
        assert!(!probe.contains("migrations_total"), "{probe}");
        let options = PlacementBenchOptions {
            threads: vec![2],
            vcpus: 4,
            seconds: 10,
            duty_percent: 29,
            period_ms: 70,
            policies: vec!["none".into()],
            rounds: 1,
            topology: Topology::default(),
            echo: false,
            guest_kernel: crate::GuestKernel::default(),
        };
        // The command run with stubs for sleep and pvmm-load: the marks and the load, in order.
        let run = |threads| {
            let command = guest_command(&options, threads).replace("pvmm-load ", "echo load ");
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("sleep() {{ echo \"sleep $1\"; }}\n{command}"))
                .output()
                .expect("sh runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(
            run(2),
            format!(
                "sleep {SETTLE_SECS}\npvmm-mark: load-begin\n\
                 load --threads 2 --duty 29 --period-ms 70 --seconds 10\n\
                 pvmm-mark: load-end\nsleep {IDLE_TAIL_SECS}\npvmm-mark: idle-end\n"
            )
        );
        assert!(run(0).contains("load-begin\nsleep 10\npvmm-mark: load-end"));
    }
}
