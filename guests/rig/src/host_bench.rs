//! `cargo xtask bench-host`: several VMs side by side in one L1, each guest running one
//! kernbench-like thread (or, with `--build`, a real compile: [`crate::kernbench`]), under
//! three regimes, one L1 boot per (regime, VM count) and round, on the benchmark runner
//! ([`crate::runner`]: one section per VM count, each round turning the regimes' order):
//!
//! - `pvmm-host`: pvmm VMs joined to the host daemon (`pvmm host --adopt auto`), which places
//!   every VM's vCPUs with one engine under `powersaving`;
//! - `pvmm`: the same pvmm VMs each placing only its own vCPUs under `powersaving`;
//! - `qemu`: QEMU VMs with KVM, unpinned (L1's scheduler decides).
//!
//! Measured from L1 over the window in which every VM runs its load (from the last VM's load
//! start to the first VM's load end; with builds, from the first build's start to the last
//! one's end, so the window holds every build whole):
//!
//! - **Package Idle(%)** and **Energy** from L1's `/proc/stat` ([`crate::activity`]; the rig
//!   has no RAPL, so energy is the simulator's power model applied to measured activity);
//! - **Work**: the guests' `pvmm-load` iterations in the window (each guest's `pvmm-load`
//!   reports its iterations so far every second through a `pvmm-mark:` line, which L1
//!   timestamps); with builds, the builds, and each VM's build time on its own clock;
//! - **Migrations**: the vCPU threads' `se.nr_migrations` (L1 kernel, `/proc/<pid>/task/*/
//!   sched`), every move of any regime counted alike, whether pvmm, the daemon or L1's
//!   scheduler made it;
//! - **VMM(%)** and **Daemon(%)**: the CPU time of the VMMs' threads other than vCPUs and of
//!   `pvmm host` (`/proc/<pid>/stat`): what placement itself costs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use pvmm_scheduler::power::PowerModel;

use crate::activity::Activity;
use crate::figures::{median, table};
use crate::images::L1Images;
use crate::probe::L1_USER_HZ;
use crate::rig::{InnerVmm, Rig, RigError, RigOutcome, Topology, VmSpec};
use crate::runner::{
    clean_run, figures_of, grid_case, grid_section, run_ended, Benchmark, Boots, Measured, Run,
};
use crate::scripts;
use crate::workspace::Workspace;

/// How the VMs of a case are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// pvmm VMs placed by `pvmm host`.
    Daemon,
    /// pvmm VMs, each placing itself.
    PerVm,
    /// QEMU VMs, unpinned.
    Qemu,
}

impl Regime {
    /// Every regime, the reference (`qemu`) first.
    pub const ALL: [Regime; 3] = [Regime::Qemu, Regime::PerVm, Regime::Daemon];

    /// Its name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Regime::Daemon => "pvmm-host",
            Regime::PerVm => "pvmm",
            Regime::Qemu => "qemu",
        }
    }
}

impl std::str::FromStr for Regime {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Regime::ALL
            .into_iter()
            .find(|r| r.name() == text)
            .ok_or_else(|| format!("unknown regime {text:?}: expected pvmm-host, pvmm or qemu"))
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct HostBenchOptions {
    /// VM counts, one table each.
    pub vms: Vec<usize>,
    /// Regimes compared.
    pub regimes: Vec<Regime>,
    /// Seconds of load per guest.
    pub seconds: u32,
    /// pvmm-load duty cycle (%).
    pub duty_percent: u32,
    /// pvmm-load period (ms).
    pub period_ms: u32,
    /// Each guest builds the kernbench tree with `make -jN` instead of running pvmm-load.
    pub build_jobs: Option<u32>,
    /// Compiler flags after the tree's own, with builds (its Makefile's MYCFLAGS).
    pub mycflags: String,
    /// Runs of each (VM count, regime) case; the tables give medians.
    pub rounds: u32,
    /// L1 topology.
    pub topology: Topology,
    /// Print every rig line.
    pub echo: bool,
}

/// vCPUs of each VM.
const VCPUS: u32 = 2;
/// Memory of each VM (MiB): four fit in the rig's L1 with room for the page cache.
const MEMORY_MIB: u32 = 192;
/// Memory of each VM that builds (MiB): the toolchain's page cache and two `cc1`s.
const BUILD_MEMORY_MIB: u32 = 512;
/// L1 time per VM and case for a build: a build at -j2 takes about 4 minutes of a quiet
/// machine alone; the VMs share L1's CPUs, and the machine may be busy.
const BUILD_SECS_PER_VM: u64 = 900;
/// Seconds each guest idles after init before its load: past pvmm's 5 s ramp-down, so every
/// regime starts from its idle placement, not from the spread the guests' boots caused.
const LEAD_SECS: u32 = 8;
/// The probe's sampling interval (s).
const SAMPLE_INTERVAL: &str = "0.2";
/// Samples between two readings of the vCPU threads' migration counts (1 s).
const MIGRATION_EVERY: u32 = 5;
/// L1 time per case besides the load: L1's boot, the guests' boots (slower when several
/// boot at once under TCG) and power-off, on a shared machine.
const CASE_OVERHEAD_SECS: u64 = 300;
/// Where the VMs' sockets and the daemon's lock live in L1.
const RUNTIME_DIR: &str = "/tmp";

/// One measured case.
#[derive(Debug, Clone, PartialEq)]
pub struct HostCase {
    /// Its regime.
    pub regime: Regime,
    /// VMs side by side.
    pub vms: usize,
    /// The window in which every VM ran its load (s).
    pub window_s: f64,
    /// pvmm-load iterations of all guests in the window.
    pub work: u64,
    /// Per package, the share of the window it was idle.
    pub package_idle: Vec<f64>,
    /// Modelled energy over the window (J).
    pub energy_j: f64,
    /// Migrations of all vCPU threads in the window.
    pub migrations: u64,
    /// CPU the VMMs' threads other than vCPUs used in the window, in CPUs (all VMs).
    pub vmm_other_cpu: f64,
    /// CPU the daemon used in the window, in CPUs (regime `pvmm-host` only).
    pub daemon_cpu: Option<f64>,
    /// Each VM's build time on its own clock (s), with builds.
    pub build_s: Vec<f64>,
}

impl HostCase {
    /// Modelled joules per thousand iterations.
    pub fn energy_per_kwork(&self) -> f64 {
        self.energy_j / (self.work as f64 / 1000.0).max(f64::MIN_POSITIVE)
    }

    /// The VMs' mean build time (s), with builds.
    pub fn mean_build_s(&self) -> Option<f64> {
        (!self.build_s.is_empty())
            .then(|| self.build_s.iter().sum::<f64>() / self.build_s.len() as f64)
    }
}

/// The guest command of VM `n`: idle, then the load, its progress (iterations so far) each
/// second through a `pvmm-mark:` line that L1 timestamps.
pub fn guest_command(options: &HostBenchOptions, n: usize) -> String {
    if let Some(jobs) = options.build_jobs {
        let pace = crate::kernbench::Pace {
            settle_secs: LEAD_SECS,
            ..crate::kernbench::Pace::BENCH
        };
        return crate::kernbench::guest_command_with(
            jobs,
            &options.mycflags,
            pace,
            &format!("-{n}"),
        );
    }
    scripts::guest_command(
        &[
            ("VM", &n.to_string()),
            ("LEAD_SECS", &LEAD_SECS.to_string()),
            ("DUTY", &options.duty_percent.to_string()),
            ("PERIOD_MS", &options.period_ms.to_string()),
            ("SECONDS_LOAD", &options.seconds.to_string()),
        ],
        &[scripts::HOST_BENCH_GUEST],
    )
}

/// The L1 probe of every VM of a case. The first to start is the leader: it starts the daemon
/// (regime `pvmm-host`), prints the topology and samples `/proc/stat`. Each probe counts its
/// own VM's vCPU-thread migrations. The leader, after every VM has ended, prints the guests'
/// marks and stops the daemon.
pub fn probe(regime: Regime) -> String {
    let daemon = if regime == Regime::Daemon { "1" } else { "0" };
    scripts::assemble(
        &[
            ("START_DAEMON", daemon),
            ("RUNTIME_DIR", RUNTIME_DIR),
            ("SAMPLE_INTERVAL", SAMPLE_INTERVAL),
            ("MIGRATION_EVERY", &MIGRATION_EVERY.to_string()),
        ],
        &[scripts::CPU_ACTIVITY_LIB, scripts::HOST_BENCH_PROBE],
    )
}

fn vm(regime: Regime, options: &HostBenchOptions, n: usize) -> VmSpec {
    let vmm = if regime == Regime::Qemu {
        InnerVmm::Qemu
    } else {
        InnerVmm::Pvmm
    };
    let memory = match options.build_jobs {
        Some(_) => BUILD_MEMORY_MIB,
        None => MEMORY_MIB,
    };
    let mut args: Vec<String> = [
        "--vcpus",
        &VCPUS.to_string(),
        "--memory",
        &memory.to_string(),
    ]
    .map(String::from)
    .to_vec();
    if options.build_jobs.is_some() {
        args.extend(["--disk".into(), crate::kernbench::disk_arg()]);
    }
    if vmm == InnerVmm::Pvmm {
        args.extend(["--policy".into(), "powersaving".into()]);
    }
    if regime == Regime::Daemon {
        args.extend(["--api-socket".into(), format!("{RUNTIME_DIR}/vm{n}.sock")]);
    }
    VmSpec {
        vmm,
        args,
        guest_command: Some(guest_command(options, n)),
    }
}

/// The rig of one case: its VMs side by side, with the probe of its regime.
fn case_rig(options: &HostBenchOptions, regime: Regime, vms: usize) -> Rig {
    let specs: Vec<VmSpec> = (0..vms).map(|n| vm(regime, options, n)).collect();
    let load_secs = match options.build_jobs {
        Some(_) => BUILD_SECS_PER_VM * vms as u64,
        None => u64::from(2 * options.seconds),
    };
    Rig::with_vms(specs)
        .topology(options.topology)
        .timeout(Duration::from_secs(
            CASE_OVERHEAD_SECS + u64::from(LEAD_SECS) + load_secs,
        ))
        .l1_probe(probe(regime))
        .echo(options.echo)
        .progress(true)
}

/// The benchmark on the runner ([`crate::runner::run`]): one section per VM count, its cases
/// the regimes, each run in an L1 boot of its own.
pub struct HostBench<'a> {
    ws: &'a Workspace,
    images: &'a L1Images,
    options: HostBenchOptions,
}

impl<'a> HostBench<'a> {
    /// The benchmark of `options` on these images.
    pub fn new(ws: &'a Workspace, images: &'a L1Images, options: HostBenchOptions) -> Self {
        HostBench {
            ws,
            images,
            options,
        }
    }

    /// Case `case`'s regime and VM count.
    fn case(&self, case: usize) -> (Regime, usize) {
        let (section, place) = grid_case(case, self.options.regimes.len());
        (self.options.regimes[place], self.options.vms[section])
    }

    /// The rig of `run`'s case.
    fn rig(&self, run: &Run) -> Rig {
        let (regime, vms) = self.case(run.case);
        case_rig(&self.options, regime, vms)
    }

    /// What every guest runs, for the tables' titles.
    fn load(&self) -> String {
        let o = &self.options;
        match o.build_jobs {
            Some(jobs) => format!(
                "make -j{jobs}{} of {}",
                crate::kernbench::mycflags_note(&o.mycflags),
                crate::kernbench_disk::TREE
            ),
            None => format!(
                "pvmm-load --duty {} --period-ms {}",
                o.duty_percent, o.period_ms
            ),
        }
    }
}

impl Benchmark for HostBench<'_> {
    type Figures = HostCase;

    fn name(&self) -> &str {
        "bench-host"
    }

    fn sections(&self) -> Vec<usize> {
        vec![self.options.regimes.len(); self.options.vms.len()]
    }

    fn rounds(&self) -> u32 {
        self.options.rounds
    }

    fn boots(&self) -> Boots {
        Boots::PerRun
    }

    fn label(&self, case: usize, round: u32) -> String {
        let (regime, vms) = self.case(case);
        format!("{}-{vms}-run{}", regime.name(), round + 1)
    }

    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError> {
        let [run] = runs else {
            return Err(RigError::BadArgs(format!(
                "bench-host boots one case at a time, not {}",
                runs.len()
            )));
        };
        self.rig(run).run(self.ws, self.images)
    }

    /// A case ended when every one of its VMs did.
    fn ended(&self, outcome: &RigOutcome, run: &Run) -> bool {
        self.rig(run)
            .labels()
            .iter()
            .all(|label| run_ended(outcome, label))
    }

    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<HostCase, String> {
        let (regime, _) = self.case(run.case);
        let labels = self.rig(run).labels();
        let builds = self.options.build_jobs.is_some();
        measure(outcome, &labels, regime, builds, &PowerModel::default())
            .map_err(|why| format!("{why} ({})", outcome.summary(regime.name())))
    }

    fn summary(&self, case: &HostCase) -> String {
        run_summary(case)
    }

    fn tables(&self, results: &[Measured<HostCase>]) -> String {
        let regimes = &self.options.regimes;
        let title = format!(" ({}, L1 {}):\n", self.load(), self.options.topology);
        let mut out = String::new();
        for (index, &vms) in self.options.vms.iter().enumerate() {
            let section = grid_section(index, regimes.len());
            let cases = figures_of(results, |case| section.contains(&case));
            let table = format_table(vms, regimes, &cases).replacen(":\n", &title, 1);
            let _ = writeln!(out, "{table}");
        }
        out
    }
}

/// What every probe of a case printed, merged.
#[derive(Default)]
struct Lines {
    activity: Activity,
    /// Mark text -> L1 time.
    marks: BTreeMap<String, f64>,
    /// Per VM: (L1 time, migrations so far).
    migrations: Vec<Vec<(f64, u64)>>,
    /// Per VM: (L1 time, iterations so far).
    progress: BTreeMap<usize, Vec<(f64, u64)>>,
    /// Per VM: (L1 time, CPU ticks of the VMM's threads other than its vCPUs).
    other_cpu: Vec<Vec<(f64, u64)>>,
    /// (L1 time, CPU ticks of the daemon).
    daemon: Vec<(f64, u64)>,
    /// Per VM: its build's time on its clock, or why there is none (with builds).
    build_s: Vec<Result<f64, String>>,
}

fn parse(outcome: &RigOutcome, labels: &[String]) -> Result<Lines, String> {
    let mut lines = Lines::default();
    for label in labels {
        let run = clean_run(outcome, label)?;
        lines.build_s.push(crate::kernbench::build_seconds(&run));
        let mut samples = Vec::new();
        for line in run.probe {
            if lines.activity.parse_line(line) {
                continue;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["N", up, moved, all, vcpus] => {
                    if let (Ok(t), Ok(m), Ok(a), Ok(v)) =
                        (up.parse(), moved.parse(), all.parse(), vcpus.parse())
                    {
                        samples.push(VmSample {
                            t,
                            migrations: m,
                            process_ticks: a,
                            vcpu_ticks: v,
                        });
                    }
                }
                ["D", up, ticks] => {
                    if let (Ok(t), Ok(d)) = (up.parse(), ticks.parse()) {
                        lines.daemon.push((t, d));
                    }
                }
                ["M", up, text] => {
                    if let Ok(t) = up.parse() {
                        lines.marks.insert(text.to_string(), t);
                    }
                }
                ["M", up, text, n] => {
                    let vm = text.strip_prefix("work-").and_then(|v| v.parse().ok());
                    if let (Ok(t), Some(vm), Ok(n)) = (up.parse(), vm, n.parse()) {
                        lines.progress.entry(vm).or_default().push((t, n));
                    }
                }
                _ => {}
            }
        }
        let samples = while_all_vcpus_live(&samples);
        lines
            .migrations
            .push(samples.iter().map(|s| (s.t, s.migrations)).collect());
        lines.other_cpu.push(
            samples
                .iter()
                .map(|s| (s.t, s.process_ticks.saturating_sub(s.vcpu_ticks)))
                .collect(),
        );
    }
    Ok(lines)
}

/// One `N` line of a VM's probe: counters summed over its vCPU threads, and its process's
/// CPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct VmSample {
    /// L1 uptime (s).
    t: f64,
    /// The vCPU threads' migrations so far.
    migrations: u64,
    /// The process's CPU ticks so far, every thread's.
    process_ticks: u64,
    /// The vCPU threads' CPU ticks so far.
    vcpu_ticks: u64,
}

/// A VM's samples up to the first in which a vCPU-thread counter fell. The counters only grow
/// while every vCPU thread lives; once one has exited (its VM shutting down), the sums lose its
/// share, which would count its CPU time as the VMM's own and take its migrations back.
fn while_all_vcpus_live(samples: &[VmSample]) -> Vec<VmSample> {
    let fell = samples.windows(2).position(|pair| {
        pair[1].vcpu_ticks < pair[0].vcpu_ticks || pair[1].migrations < pair[0].migrations
    });
    match fell {
        Some(i) => samples[..=i].to_vec(),
        None => samples.to_vec(),
    }
}

/// Measures a case over the window every VM ran its load in (with `builds`, the window that
/// holds every build).
fn measure(
    outcome: &RigOutcome,
    labels: &[String],
    regime: Regime,
    builds: bool,
    model: &PowerModel,
) -> Result<HostCase, String> {
    let lines = parse(outcome, labels)?;
    let mark = |text: String| {
        lines
            .marks
            .get(&text)
            .copied()
            .ok_or_else(|| format!("no mark {text} (marks: {:?})", lines.marks.keys()))
    };
    let (mut begin, mut end) = (Vec::new(), Vec::new());
    for n in 0..labels.len() {
        begin.push(mark(format!("load-begin-{n}"))?);
        end.push(mark(format!("load-end-{n}"))?);
    }
    let first = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    let last = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
    let (begin, end) = if builds {
        (first(&begin), last(&end))
    } else {
        (last(&begin), first(&end))
    };
    if end <= begin {
        return Err(format!(
            "the VMs' loads did not overlap (the last began at {begin:.1} s, the first ended at {end:.1} s); raise --seconds"
        ));
    }
    let activity = lines.activity.window(begin, end, model)?;
    let build_s = match builds {
        true => lines
            .build_s
            .iter()
            .cloned()
            .collect::<Result<Vec<f64>, String>>()?,
        false => Vec::new(),
    };
    // Each VM's iterations between its last progress reports before the window's ends: off
    // by at most a second of work per VM at each end, alike for every regime.
    let work = match builds {
        true => build_s.len() as u64,
        false => lines
            .progress
            .values()
            .map(|reports| last_before(reports, end).saturating_sub(last_before(reports, begin)))
            .sum(),
    };
    let migrations = lines
        .migrations
        .iter()
        .map(|counts| last_before(counts, end).saturating_sub(last_before(counts, begin)))
        .sum();
    let over_window = |series: &[(f64, u64)]| {
        last_before(series, end).saturating_sub(last_before(series, begin)) as f64
            / L1_USER_HZ
            / (end - begin)
    };
    let vmm_other_cpu = lines.other_cpu.iter().map(|s| over_window(s)).sum();
    let daemon_cpu = (!lines.daemon.is_empty()).then(|| over_window(&lines.daemon));
    Ok(HostCase {
        regime,
        vms: labels.len(),
        vmm_other_cpu,
        daemon_cpu,
        window_s: activity.seconds,
        work,
        package_idle: activity.package_idle,
        energy_j: activity.energy_j,
        migrations,
        build_s,
    })
}

/// The value of the last of `series` (L1 time, cumulative count) at or before `t`; 0 before
/// the first.
fn last_before(series: &[(f64, u64)], t: f64) -> u64 {
    series
        .iter()
        .filter(|&&(at, _)| at <= t)
        .map(|&(_, n)| n)
        .next_back()
        .unwrap_or(0)
}

/// One run as a progress line: its window, work or build times, energy and placement costs.
pub fn run_summary(case: &HostCase) -> String {
    let work = match case.mean_build_s() {
        Some(mean) => format!("mean build {mean:.1} s"),
        None => format!("{} iterations", case.work),
    };
    format!(
        "{} x{}: window {:.1} s, {work}, {:.0} J, {} migrations, daemon {}",
        case.regime.name(),
        case.vms,
        case.window_s,
        case.energy_j,
        case.migrations,
        case.daemon_cpu
            .map_or("-".to_string(), |d| format!("{:.1} %", d * 100.0))
    )
}

/// One regime's medians over its runs.
struct Row {
    regime: Regime,
    runs: usize,
    window_s: f64,
    build_s: Option<f64>,
    longest_build_s: Option<f64>,
    work: f64,
    package_idle: Vec<f64>,
    migrations: f64,
    energy_j: f64,
    energy_per_kwork: f64,
    vmm_other_cpu: f64,
    daemon_cpu: Option<f64>,
}

fn row(regime: Regime, cases: &[&HostCase]) -> Option<Row> {
    let mine: Vec<&&HostCase> = cases.iter().filter(|c| c.regime == regime).collect();
    let of = |f: &dyn Fn(&HostCase) -> Option<f64>| median(mine.iter().map(|c| f(c)));
    let packages = mine.first()?.package_idle.len();
    Some(Row {
        regime,
        runs: mine.len(),
        window_s: of(&|c| Some(c.window_s))?,
        build_s: of(&|c| c.mean_build_s()),
        longest_build_s: of(&|c| c.build_s.iter().copied().reduce(f64::max)),
        work: of(&|c| Some(c.work as f64))?,
        package_idle: (0..packages)
            .map(|p| of(&|c| c.package_idle.get(p).copied()).unwrap_or(0.0))
            .collect(),
        migrations: of(&|c| Some(c.migrations as f64))?,
        energy_j: of(&|c| Some(c.energy_j))?,
        energy_per_kwork: of(&|c| Some(c.energy_per_kwork()))?,
        vmm_other_cpu: of(&|c| Some(c.vmm_other_cpu))?,
        daemon_cpu: of(&|c| c.daemon_cpu),
    })
}

/// The runs of one VM count as a table, one row per regime (in `regimes`' order) with the
/// medians over its runs; Energy/work relative to the first regime's (`qemu` when it ran).
/// With builds, work is builds, and each VM's build time (mean, longest, and the mean
/// relative to the first regime's) comes after the window.
pub fn format_table(vms: usize, regimes: &[Regime], cases: &[&HostCase]) -> String {
    let builds = cases.first().is_some_and(|c| !c.build_s.is_empty());
    let load = if builds {
        "one build"
    } else {
        "one busy thread"
    };
    let mut out = format!("{vms} VM(s) of {VCPUS} vCPUs, {load} each:\n");
    let rows: Vec<Row> = regimes.iter().filter_map(|&r| row(r, cases)).collect();
    let Some(reference) = rows.first() else {
        out.push_str("(no case measured)\n");
        return out;
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".to_string(),
    };
    let seconds = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.1}"));
    let headers = [
        "Regime",
        "Runs",
        "Window(s)",
        "Build(s)",
        "Max(s)",
        "Time",
        if builds { "Builds" } else { "Work(iter)" },
        "Package Idle(%)",
        "Migrations",
        "Energy(J)",
        "Energy/work",
        "VMM(%)",
        "Daemon(%)",
    ];
    let cells: Vec<[String; 13]> = rows
        .iter()
        .map(|r| {
            [
                r.regime.name().to_string(),
                r.runs.to_string(),
                format!("{:.1}", r.window_s),
                seconds(r.build_s),
                seconds(r.longest_build_s),
                ratio(r.build_s, reference.build_s),
                format!("{:.0}", r.work),
                r.package_idle
                    .iter()
                    .map(|f| format!("{:5.1}", f * 100.0))
                    .collect::<Vec<_>>()
                    .join(" "),
                format!("{:.0}", r.migrations),
                format!("{:.1}", r.energy_j),
                ratio(Some(r.energy_per_kwork), Some(reference.energy_per_kwork)),
                format!("{:.1}", r.vmm_other_cpu * 100.0),
                r.daemon_cpu
                    .map_or("-".to_string(), |d| format!("{:.1}", d * 100.0)),
            ]
        })
        .collect();
    out.push_str(&table(headers, &cells));
    let unit = if builds { "build" } else { "iteration" };
    let _ = writeln!(
        out,
        "(medians over each regime's runs; Energy/work: modelled joules per {unit}, relative to \
         {} = 1.00; VMM(%): the VMMs' threads other than vCPUs, Daemon(%): pvmm-host, in % of \
         one L1 CPU)",
        reference.regime.name()
    );
    out
}

#[cfg(test)]
mod tests;
