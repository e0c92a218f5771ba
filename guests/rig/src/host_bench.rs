//! `cargo xtask bench-host`: several VMs side by side in one L1, each guest running one
//! kernbench-like thread (or, with `--build`, a real compile: [`crate::kernbench`]), under
//! three regimes, one L1 boot per (regime, VM count):
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
use pvmm_scheduler::table::aligned_columns;

use crate::activity::Activity;
use crate::figures::median;
use crate::images::L1Images;
use crate::probe::L1_USER_HZ;
use crate::rig::{InnerVmm, Rig, RigError, RigOutcome, Topology, VmSpec};
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
        return crate::kernbench::guest_command_with(
            jobs,
            &options.mycflags,
            LEAD_SECS,
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

/// Runs one case (one L1 boot) and measures it.
pub fn run_case(
    ws: &Workspace,
    images: &L1Images,
    options: &HostBenchOptions,
    regime: Regime,
    vms: usize,
) -> Result<(Result<HostCase, String>, RigOutcome), RigError> {
    let specs: Vec<VmSpec> = (0..vms).map(|n| vm(regime, options, n)).collect();
    let load_secs = match options.build_jobs {
        Some(_) => BUILD_SECS_PER_VM * vms as u64,
        None => u64::from(2 * options.seconds),
    };
    let rig = Rig::with_vms(specs)
        .topology(options.topology)
        .timeout(Duration::from_secs(
            CASE_OVERHEAD_SECS + u64::from(LEAD_SECS) + load_secs,
        ))
        .l1_probe(probe(regime))
        .echo(options.echo)
        .progress(true);
    let labels = rig.labels();
    let outcome = rig.run(ws, images)?;
    let builds = options.build_jobs.is_some();
    let measured = measure(&outcome, &labels, regime, builds, &PowerModel::default());
    Ok((measured, outcome))
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
        let run = outcome
            .run(label)
            .ok_or_else(|| format!("VM {label} never started"))?;
        if run.status != Some(0) {
            return Err(format!("VM {label} exited with status {:?}", run.status));
        }
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

/// Every run of one VM count, in order: round by round, the regimes' order turned by one
/// place each round, so that over as many rounds as regimes each regime runs in each position
/// (the machine's load drifts over a long benchmark).
pub fn run_order(regimes: &[Regime], rounds: u32) -> Vec<Regime> {
    let count = regimes.len().max(1);
    (0..rounds as usize)
        .flat_map(|round| {
            regimes
                .iter()
                .cycle()
                .skip(round % count)
                .take(regimes.len())
        })
        .copied()
        .collect()
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
    ]
    .map(String::from);
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
    out.push_str(&aligned_columns(&headers, &cells));
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
mod tests {
    use super::*;

    fn options(build_jobs: Option<u32>) -> HostBenchOptions {
        HostBenchOptions {
            vms: vec![2],
            regimes: Regime::ALL.to_vec(),
            seconds: 20,
            duty_percent: 29,
            period_ms: 70,
            build_jobs,
            mycflags: "-O0".into(),
            rounds: 1,
            topology: Topology::default(),
            echo: false,
        }
    }

    #[test]
    fn a_vms_samples_end_where_a_vcpu_thread_exited() {
        let sample = |t, migrations, process_ticks, vcpu_ticks| VmSample {
            t,
            migrations,
            process_ticks,
            vcpu_ticks,
        };
        let live = [sample(1.0, 2, 100, 90), sample(2.0, 3, 200, 180)];
        assert_eq!(while_all_vcpus_live(&live), live.to_vec());
        // One of two vCPU threads gone: the sums fall, and the sample is left out with the rest.
        let ending = [
            live[0],
            live[1],
            sample(3.0, 2, 210, 95),
            sample(4.0, 3, 400, 200),
        ];
        assert_eq!(while_all_vcpus_live(&ending), live.to_vec());
        assert_eq!(while_all_vcpus_live(&[]), Vec::new());
    }

    #[test]
    fn regimes_parse_and_the_probe_and_guest_say_what_the_parser_reads() {
        assert_eq!("pvmm-host".parse::<Regime>(), Ok(Regime::Daemon));
        assert!("numad".parse::<Regime>().is_err());
        assert!(probe(Regime::Daemon).contains("\nSTART_DAEMON=1\nRUNTIME_DIR=/tmp\n"));
        assert!(
            probe(Regime::Daemon).contains("pvmm host --runtime-dir \"$RUNTIME_DIR\" --adopt auto")
        );
        assert!(probe(Regime::PerVm).contains("\nSTART_DAEMON=0\n"));
        assert!(probe(Regime::Qemu).contains("nr_migrations"));
        let options = options(None);
        let guest = guest_command(&options, 1);
        assert!(guest.starts_with("VM=1\n"));
        assert!(guest.contains("pvmm-mark: load-begin-$VM"));
        assert!(guest.contains("pvmm-mark: work-$VM $c"));
        assert!(guest.contains("\nDUTY=29\nPERIOD_MS=70\nSECONDS_LOAD=20\n"));
        assert!(guest.contains("--seconds \"$SECONDS_LOAD\" \\\n--progress-ms 1000"));
        // Both scripts are valid shell for L1's and the guest's busybox.
        if std::path::Path::new(crate::host::BUSYBOX).is_file() {
            for script in [probe(Regime::Daemon), guest.clone()] {
                let check = std::process::Command::new(crate::host::BUSYBOX)
                    .args(["sh", "-n", "-c", &script])
                    .output()
                    .expect("busybox runs");
                assert!(check.status.success(), "{check:?}\n{script}");
            }
        }
        let spec = vm(Regime::Daemon, &options, 1);
        assert!(spec.args.contains(&"/tmp/vm1.sock".to_string()));
        assert_eq!(vm(Regime::Qemu, &options, 0).vmm, InnerVmm::Qemu);
    }

    fn case(regime: Regime, work: u64, energy_j: f64, build_s: Vec<f64>) -> HostCase {
        HostCase {
            regime,
            vms: 2,
            window_s: 20.0,
            work,
            package_idle: vec![0.5, 0.9],
            energy_j,
            migrations: 4,
            vmm_other_cpu: 0.01,
            daemon_cpu: (regime == Regime::Daemon).then_some(0.2),
            build_s,
        }
    }

    fn cells(table: &str, row: usize) -> Vec<String> {
        let line = table.lines().nth(row).unwrap_or_default();
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_table_is_relative_to_its_first_regime() {
        let q = case(Regime::Qemu, 1000, 100.0, Vec::new());
        let d = case(Regime::Daemon, 1000, 80.0, Vec::new());
        let table = format_table(2, &Regime::ALL, &[&d, &q]);
        let (q, d) = (cells(&table, 2), cells(&table, 3));
        assert_eq!((q[0].as_str(), q[11].as_str()), ("qemu", "1.00"), "{table}");
        assert_eq!(
            (d[0].as_str(), d[11].as_str()),
            ("pvmm-host", "0.80"),
            "{table}"
        );
        assert_eq!((d[12].as_str(), d[13].as_str()), ("1.0", "20.0"), "{table}");
        assert_eq!(
            table.lines().count(),
            5,
            "no row for a regime not run: {table}"
        );
    }

    #[test]
    fn several_runs_give_each_regime_its_medians() {
        let runs = [
            case(Regime::Qemu, 1, 100.0, vec![100.0, 110.0]),
            case(Regime::Qemu, 1, 300.0, vec![300.0, 310.0]),
            case(Regime::Qemu, 1, 200.0, vec![200.0, 210.0]),
            case(Regime::PerVm, 1, 150.0, vec![150.0, 150.0]),
            case(Regime::PerVm, 1, 170.0, vec![170.0, 190.0]),
        ];
        let refs: Vec<&HostCase> = runs.iter().collect();
        let table = format_table(2, &[Regime::Qemu, Regime::PerVm], &refs);
        let (q, p) = (cells(&table, 2), cells(&table, 3));
        assert_eq!(
            q[..6],
            ["qemu", "3", "20.0", "205.0", "210.0", "1.00"],
            "{table}"
        );
        assert_eq!(
            p[..6],
            ["pvmm", "2", "20.0", "165.0", "170.0", "0.80"],
            "{table}"
        );
        assert_eq!(p[11], "0.80", "{table}");
    }

    #[test]
    fn each_round_turns_the_regimes_order() {
        let regimes = Regime::ALL;
        assert_eq!(run_order(&regimes, 1), regimes.to_vec());
        let order = run_order(&regimes, 3);
        assert_eq!(order.len(), 9);
        assert_eq!(order[3..6], [Regime::PerVm, Regime::Daemon, Regime::Qemu]);
        for (position, _) in regimes.iter().enumerate() {
            let mut seen: Vec<Regime> = (0..3).map(|r| order[r * 3 + position]).collect();
            seen.sort_by_key(|r| r.name());
            seen.dedup();
            assert_eq!(seen.len(), 3, "each regime once in position {position}");
        }
        assert!(run_order(&[], 2).is_empty());
    }

    #[test]
    fn builds_get_their_times_and_the_disk() {
        let options = options(Some(2));
        let guest = guest_command(&options, 1);
        assert!(
            guest.contains("\nJOBS=2\n")
                && guest.contains("\nMARK=-1\n")
                && guest.contains("\nMYCFLAGS=-O0\n"),
            "{guest}"
        );
        for regime in Regime::ALL {
            let spec = vm(regime, &options, 1);
            assert!(
                spec.args.contains(&crate::kernbench::disk_arg()),
                "{spec:?}"
            );
        }
        let q = case(Regime::Qemu, 2, 1000.0, vec![200.0, 240.0]);
        let p = case(Regime::PerVm, 2, 900.0, vec![230.0, 230.0]);
        let table = format_table(2, &Regime::ALL, &[&q, &p]);
        assert!(
            table.starts_with("2 VM(s) of 2 vCPUs, one build each:"),
            "{table}"
        );
        let cells = cells(&table, 3);
        assert_eq!(
            cells[..7],
            ["pvmm", "1", "20.0", "230.0", "230.0", "1.05", "2"],
            "{table}"
        );
        assert_eq!(cells[11], "0.90", "{table}");
    }
}
