//! `cargo xtask bench-kernbench`: a real compile in a pvmm guest under each placement policy,
//! reported as the sched_mc_power_savings kernbench tables were (run time, package idle,
//! energy and power relative to the performance policy; "Re: [PATCH v7 0/8] Tunable
//! sched_mc_power_savings=n", Vaidyanathan Srinivasan, LKML, 2008-12-30).
//!
//! One L1 boot runs, for each round, job count N and policy, a guest that mounts the
//! kernbench disk ([`crate::kernbench_disk`]) read-only, warms its page cache with the
//! toolchain, and builds the pinned tree with `make -jN` between its `load-begin` and
//! `load-end` marks ([`scripts::KERNBENCH_GUEST`]). The L1 probe and the window measurements
//! are the placement benchmark's ([`crate::placement_bench::bench_probe`]): package idle from L1's
//! `/proc/stat`, modelled energy, pvmm's and L1's migration counts. The run time is the
//! guest's own (its uptime around `make`); the window is L1's view of the same span.
//!
//! The benchmark runs on the runner ([`crate::runner`]), one section per N: each case once per
//! round, the rounds one after another, each round turning the policies' order by one place,
//! so that over as many rounds as policies each policy runs in each place of an N's builds
//! once (a place can matter: the first build after another N's starts from that N's placement
//! and page cache). Where L1 fails by itself mid-way, the cases left run in a fresh boot and
//! the finished ones keep their results. The table gives each figure's median over the
//! rounds.

use std::fmt::Write as _;
use std::time::Duration;

use pvmm_scheduler::power::PowerModel;

use crate::figures::{median, table};
use crate::images::L1Images;
use crate::inside;
use crate::kernbench_disk::TREE;
use crate::placement_bench::{
    bench_probe, measure_window, policy_args, IDLE_TAIL_SECS, SETTLE_SECS,
};
use crate::rig::{RigError, RigOutcome, RunLines, Topology};
use crate::runner::{
    self, clean_run, figures_of, grid_case, grid_section, Benchmark, Boots, Measured, Run,
};
use crate::scripts;
use crate::sequence::{run_pvmm_sequence, PvmmRun, SequenceOptions, L1_BOOT_SECS};
use crate::workspace::Workspace;

/// The policies compared by default: `performance` first (the reference), the two
/// power-saving levels, and `none` (L1's scheduler places the unpinned vCPU threads).
pub const DEFAULT_POLICIES: [&str; 4] = ["performance", "powersaving:1", "powersaving:2", "none"];

/// `make -jN` values by default: below, at and above the 4 vCPUs of the guest (and the CPUs
/// of one package of the 2x2 L1 at N = 2).
pub const DEFAULT_JOBS: [u32; 3] = [2, 4, 8];

/// Guest memory (MiB): the page cache of the toolchain (171 MiB read), eight `cc1`
/// processes, and the build's tmpfs.
pub const DEFAULT_MEMORY_MIB: u64 = 768;

/// Where pvmm writes its stats in L1 (read by [`bench_probe`]).
const STATS_PATH: &str = "/tmp/pvmm-bench-stats.jsonl";

/// L1 seconds allowed per run: the build (a few minutes at -j2 on a quiet machine), the
/// guest's boot and warm-up, times the slowdown of a machine busy with other work. A run past
/// it is killed and reported.
const RUN_LIMIT_SECS: u64 = 1200;

/// Host seconds of the whole boot per run: a run's limit counts on L1's clock from pvmm's
/// start; this covers the rest of each run (starting pvmm and the probe) with room.
const RUN_BOOT_SECS: u64 = RUN_LIMIT_SECS + 60;

/// What to run.
#[derive(Debug, Clone)]
pub struct KernbenchOptions {
    /// `make -jN` values.
    pub jobs: Vec<u32>,
    /// pvmm policies (`none` included), as bench-placement's `--policies` entries.
    pub policies: Vec<String>,
    /// Rounds: every case once per round.
    pub rounds: u32,
    /// Compiler flags after the tree's own (`-O2 -Wall -Wextra ...`), as its Makefile's
    /// `MYCFLAGS`: empty for the tree's own build, `-O0` for a quicker one.
    pub mycflags: String,
    /// Guest vCPUs.
    pub vcpus: u32,
    /// Guest memory (MiB).
    pub memory_mib: u64,
    /// L1 topology.
    pub topology: Topology,
    /// Print every rig line.
    pub echo: bool,
    /// How each build is paced around its marks.
    pub pace: Pace,
}

/// How a build is paced around its marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// The guest reads the toolchain once before its build, so that every case builds from a
    /// warm page cache (a case's figures then do not depend on which case ran first).
    pub warm: bool,
    /// Seconds idle before the build.
    pub settle_secs: u32,
    /// Seconds idle after it.
    pub idle_tail_secs: u32,
}

impl Pace {
    /// The benchmark's: a warm page cache, [`SETTLE_SECS`] before the build and
    /// [`IDLE_TAIL_SECS`] after it, so that every policy starts from its steady idle placement
    /// and may put a package to sleep after the build.
    pub const BENCH: Pace = Pace {
        warm: true,
        settle_secs: SETTLE_SECS,
        idle_tail_secs: IDLE_TAIL_SECS,
    };
    /// The build alone, with nothing around it: the toolchain is read as the build needs it.
    /// A real build, measured the same way, whose figures do not compare with the
    /// benchmark's: the rig test's check that a build runs and is measured.
    pub const BUILD_ONLY: Pace = Pace {
        warm: false,
        settle_secs: 0,
        idle_tail_secs: 0,
    };
}

/// One measured build.
#[derive(Debug, Clone, PartialEq)]
pub struct Build {
    /// pvmm's `--policy` entry.
    pub policy: String,
    /// N of `make -jN`.
    pub jobs: u32,
    /// The build's time on the guest's clock (s).
    pub build_s: f64,
    /// The same span on L1's clock (s).
    pub window_s: f64,
    /// Per package (by id), share of the window it was idle.
    pub package_idle: Vec<f64>,
    /// Modelled energy over the window (J).
    pub energy_j: f64,
    /// pvmm's migrations during the window.
    pub migrations: u64,
    /// The vCPU threads' migrations during the window as L1's kernel counted them.
    pub kernel_migrations: Option<u64>,
}

/// A case of a round that produced no measurement, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The run's label.
    pub label: String,
    /// Why.
    pub reason: String,
}

/// The run label of one case of one round.
fn label(policy: &str, jobs: u32, round: u32) -> String {
    format!("{policy}-j{jobs}-r{round}")
}

/// How a table's title names a build's extra compiler flags: nothing for the tree's own build,
/// else ` MYCFLAGS='FLAGS'`.
pub fn mycflags_note(mycflags: &str) -> String {
    match mycflags {
        "" => String::new(),
        flags => format!(" MYCFLAGS='{flags}'"),
    }
}

/// The guest command of a build with `make -jJOBS` and `mycflags` after the tree's own
/// CFLAGS, paced by `pace`, that suffixes its marks with `mark` (several VMs' marks in one
/// L1).
pub fn guest_command_with(jobs: u32, mycflags: &str, pace: Pace, mark: &str) -> String {
    scripts::guest_command(
        &[
            ("TREE", TREE),
            ("JOBS", &jobs.to_string()),
            ("MYCFLAGS", mycflags),
            ("WARM", if pace.warm { "1" } else { "0" }),
            ("SETTLE_SECS", &pace.settle_secs.to_string()),
            ("IDLE_TAIL_SECS", &pace.idle_tail_secs.to_string()),
            ("MARK", mark),
        ],
        &[scripts::KERNBENCH_GUEST],
    )
}

/// The guest command of a build with `make -jJOBS` and `mycflags`, alone in its L1.
pub fn guest_command(jobs: u32, mycflags: &str, pace: Pace) -> String {
    guest_command_with(jobs, mycflags, pace, "")
}

/// The kernbench disk as a `--disk` argument, shared read-only by every VM.
pub fn disk_arg() -> String {
    format!("{},readonly=on", inside::KERNBENCH_DISK)
}

/// pvmm's arguments for one case.
fn pvmm_args(options: &KernbenchOptions, policy: &str) -> Vec<String> {
    let mut args = vec![
        "--vcpus".to_string(),
        options.vcpus.to_string(),
        "--memory".to_string(),
        options.memory_mib.to_string(),
        "--disk".to_string(),
        disk_arg(),
    ];
    args.extend(policy_args(policy));
    args.extend(["--stats".to_string(), STATS_PATH.to_string()]);
    args
}

/// The build's span on the guest's clock from its `KB built BEGIN END` line, or why there is
/// none.
pub fn build_seconds(run: &RunLines) -> Result<f64, String> {
    if let Some(step) = run.guest.iter().find_map(|l| l.strip_prefix("KB error ")) {
        return Err(format!("the guest's {} step failed", step.trim()));
    }
    let rest = run
        .guest
        .iter()
        .find_map(|l| l.strip_prefix("KB built "))
        .ok_or("no 'KB built' line from the guest")?;
    let mut words = rest.split_whitespace().map(str::parse::<f64>);
    match (words.next(), words.next()) {
        (Some(Ok(begin)), Some(Ok(end))) if end > begin => Ok(end - begin),
        _ => Err(format!("unreadable 'KB built {rest}'")),
    }
}

/// The benchmark on the runner ([`crate::runner::run`]): one section per N, its cases the
/// policies, every build in one L1 boot.
pub struct Kernbench<'a> {
    ws: &'a Workspace,
    images: &'a L1Images,
    options: KernbenchOptions,
}

impl<'a> Kernbench<'a> {
    /// The benchmark of `options` on these images (which must hold the kernbench disk).
    pub fn new(
        ws: &'a Workspace,
        images: &'a L1Images,
        options: KernbenchOptions,
    ) -> Result<Self, RigError> {
        if images.kernbench.is_none() {
            return Err(RigError::BadArgs(
                "the L1 images were built without the kernbench disk".into(),
            ));
        }
        Ok(Kernbench {
            ws,
            images,
            options,
        })
    }

    /// Case `case`'s N and policy entry.
    fn case(&self, case: usize) -> (u32, &str) {
        case_of(&self.options, case)
    }
}

/// Case `case`'s N and policy entry: the cases are every N's policies, N by N.
fn case_of(options: &KernbenchOptions, case: usize) -> (u32, &str) {
    let (section, place) = grid_case(case, options.policies.len());
    (options.jobs[section], &options.policies[place])
}

impl Benchmark for Kernbench<'_> {
    type Figures = Build;

    fn name(&self) -> &str {
        "bench-kernbench"
    }

    fn sections(&self) -> Vec<usize> {
        vec![self.options.policies.len(); self.options.jobs.len()]
    }

    fn rounds(&self) -> u32 {
        self.options.rounds
    }

    fn boots(&self) -> Boots {
        Boots::Shared
    }

    fn label(&self, case: usize, round: u32) -> String {
        let (jobs, policy) = self.case(case);
        label(policy, jobs, round)
    }

    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError> {
        let o = &self.options;
        crate::host::progress(&format!(
            "{} builds of {TREE} in one L1 boot, a few minutes each (--verbose shows every line)",
            runs.len()
        ));
        let sequence = SequenceOptions {
            topology: o.topology,
            timeout: Duration::from_secs(L1_BOOT_SECS + RUN_BOOT_SECS * runs.len() as u64),
            run_limit_secs: RUN_LIMIT_SECS,
            echo: o.echo,
            progress: true,
            probe: Some(bench_probe()),
            tuning: crate::tuning::L1Tuning::default(),
            guest_kernel: crate::GuestKernel::default(),
        };
        let pvmm_runs: Vec<PvmmRun> = runs
            .iter()
            .map(|run| {
                let (jobs, policy) = self.case(run.case);
                PvmmRun {
                    label: run.label.clone(),
                    pvmm_args: pvmm_args(o, policy),
                    guest_command: guest_command(jobs, &o.mycflags, o.pace),
                }
            })
            .collect();
        run_pvmm_sequence(self.ws, self.images, &sequence, &pvmm_runs)
    }

    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<Build, String> {
        let (jobs, policy) = self.case(run.case);
        let lines = clean_run(outcome, &run.label)?;
        let build_s = build_seconds(&lines)?;
        let measured = measure_window(&lines, &PowerModel::default())?;
        Ok(Build {
            policy: policy.to_string(),
            jobs,
            build_s,
            window_s: measured.window_s,
            package_idle: measured.package_idle,
            energy_j: measured.energy_j,
            migrations: measured.migrations,
            kernel_migrations: measured.kernel_migrations,
        })
    }

    fn summary(&self, b: &Build) -> String {
        format!(
            "build {:.1} s, window {:.1} s, {:.0} J, {} migrations",
            b.build_s, b.window_s, b.energy_j, b.migrations
        )
    }

    fn tables(&self, results: &[Measured<Build>]) -> String {
        let policies = self.options.policies.len();
        let mut out = String::new();
        for (index, &jobs) in self.options.jobs.iter().enumerate() {
            let section = grid_section(index, policies);
            let builds = figures_of(results, |case| section.contains(&case));
            let title = format!("N = {jobs}: make -j{jobs}");
            let _ = writeln!(
                out,
                "{}",
                format_table(&title, &self.options.policies, &builds)
            );
        }
        out
    }
}

/// What a kernbench run measured.
#[derive(Debug)]
pub struct KernbenchResults {
    /// The builds measured.
    pub builds: Vec<Build>,
    /// The cases that gave no measurement.
    pub failures: Vec<Failure>,
    /// Every L1 boot it took, in order: one, or more where L1 failed by itself.
    pub outcomes: Vec<RigOutcome>,
}

/// Runs every case in one L1 boot on the runner ([`Kernbench`]), booting again for the cases
/// left where L1 fails by itself mid-way, and measures each case in the boot where it ran.
pub fn run_kernbench(
    ws: &Workspace,
    images: &L1Images,
    options: &KernbenchOptions,
) -> Result<KernbenchResults, RigError> {
    let report = runner::run(&Kernbench::new(ws, images, options.clone())?)?;
    let failures = report
        .failures()
        .map(|(run, why)| Failure {
            label: run.label.clone(),
            reason: why.to_string(),
        })
        .collect();
    Ok(KernbenchResults {
        builds: report
            .results
            .into_iter()
            .filter_map(|m| m.figures.ok())
            .collect(),
        failures,
        outcomes: report.boots,
    })
}

/// One policy's medians over its rounds.
struct Row {
    policy: String,
    rounds: usize,
    build_s: f64,
    package_idle: Vec<f64>,
    energy_j: f64,
    power_w: f64,
    migrations: f64,
    kernel_migrations: Option<f64>,
}

fn row(policy: &str, builds: &[&Build]) -> Option<Row> {
    let mine: Vec<&&Build> = builds.iter().filter(|b| b.policy == policy).collect();
    let of = |f: &dyn Fn(&Build) -> f64| median(mine.iter().map(|b| Some(f(b))));
    let packages = mine.first()?.package_idle.len();
    Some(Row {
        policy: policy.to_string(),
        rounds: mine.len(),
        build_s: of(&|b| b.build_s)?,
        package_idle: (0..packages)
            .map(|p| of(&|b| b.package_idle.get(p).copied().unwrap_or(0.0)).unwrap_or(0.0))
            .collect(),
        energy_j: of(&|b| b.energy_j)?,
        power_w: of(&|b| b.energy_j / b.window_s.max(f64::MIN_POSITIVE))?,
        migrations: of(&|b| b.migrations as f64)?,
        kernel_migrations: median(mine.iter().map(|b| b.kernel_migrations.map(|m| m as f64))),
    })
}

/// The builds of one N as a table in the kernbench tables' format: run time, energy and power
/// relative to the first of `policies` (performance) = 1.00, medians over the rounds.
pub fn format_table(title: &str, policies: &[String], builds: &[&Build]) -> String {
    let mut out = format!("{title}\n");
    let rows: Vec<Row> = policies.iter().filter_map(|p| row(p, builds)).collect();
    let Some(reference) = rows.first() else {
        out.push_str("(no builds)\n");
        return out;
    };
    let ratio = |a: f64, b: f64| {
        if b > 0.0 && a.is_finite() {
            format!("{:.2}", a / b)
        } else {
            "-".to_string()
        }
    };
    let headers = [
        "Policy",
        "Runs",
        "Time(s)",
        "Time",
        "Package Idle(%)",
        "Energy",
        "Power",
        "Energy(J)",
        "Migrations",
        "L1 migrations",
    ];
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                r.policy.clone(),
                r.rounds.to_string(),
                format!("{:.1}", r.build_s),
                ratio(r.build_s, reference.build_s),
                r.package_idle
                    .iter()
                    .map(|f| format!("{:6.2}", f * 100.0))
                    .collect::<Vec<_>>()
                    .join(" "),
                ratio(r.energy_j, reference.energy_j),
                ratio(r.power_w, reference.power_w),
                format!("{:.0}", r.energy_j),
                format!("{:.0}", r.migrations),
                r.kernel_migrations
                    .map_or("-".to_string(), |m| format!("{m:.0}")),
            ]
        })
        .collect();
    out.push_str(&table(headers, &cells));
    let _ = writeln!(
        out,
        "(Time, Energy, Power: relative to {} = 1.00, medians over the runs; Energy is modelled \
         joules per build)",
        reference.policy
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(policy: &str, build_s: f64, energy_j: f64) -> Build {
        Build {
            policy: policy.into(),
            jobs: 2,
            build_s,
            window_s: build_s,
            package_idle: vec![0.1, 0.8],
            energy_j,
            migrations: 4,
            kernel_migrations: Some(6),
        }
    }

    #[test]
    fn the_table_is_relative_to_the_first_policy_with_medians() {
        let builds = [
            build("performance", 100.0, 2000.0),
            build("performance", 120.0, 2200.0),
            build("performance", 110.0, 2100.0),
            build("powersaving:1", 121.0, 1890.0),
        ];
        let refs: Vec<&Build> = builds.iter().collect();
        let policies = ["performance".to_string(), "powersaving:1".to_string()];
        let table = format_table("N = 2", &policies, &refs);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "N = 2");
        assert!(lines[1].starts_with("Policy"));
        let perf: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(perf[..4], ["performance", "3", "110.0", "1.00"]);
        let ps: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(ps[..4], ["powersaving:1", "1", "121.0", "1.10"]);
        // Energy 1890 / 2100.
        assert_eq!(ps[6], "0.90");
        assert!(lines[4].contains("relative to performance"));
        assert!(format_table("x", &policies, &[]).contains("(no builds)"));
    }

    #[test]
    fn the_build_time_comes_from_the_guest_line() {
        let guest = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        let ok = guest(&["pvmm-mark: load-begin", "KB built 20.50 150.75"]);
        let run = RunLines {
            guest: &ok,
            vmm: &[],
            probe: &[],
            status: Some(0),
        };
        assert_eq!(build_seconds(&run), Ok(130.25));
        let failed = guest(&["KB error make", "KB built 1 2"]);
        let run = RunLines {
            guest: &failed,
            ..run
        };
        assert!(build_seconds(&run).unwrap_err().contains("make"));
        let none = guest(&["pvmm-guest: powering off"]);
        let run = RunLines {
            guest: &none,
            ..run
        };
        assert!(build_seconds(&run).is_err());
    }

    #[test]
    fn every_case_of_every_round_runs_with_the_disk_and_its_policy() {
        let options = KernbenchOptions {
            jobs: vec![2, 8],
            policies: vec!["performance".into(), "none".into()],
            rounds: 2,
            mycflags: String::new(),
            vcpus: 4,
            memory_mib: DEFAULT_MEMORY_MIB,
            topology: Topology::default(),
            echo: false,
            pace: Pace::BENCH,
        };
        let sections = vec![options.policies.len(); options.jobs.len()];
        let runs: Vec<_> = runner::plan(&sections, options.rounds)
            .into_iter()
            .map(|(case, round)| {
                let (jobs, policy) = case_of(&options, case);
                (
                    label(policy, jobs, round),
                    pvmm_args(&options, policy),
                    jobs,
                )
            })
            .collect();
        assert_eq!(runs.len(), 8);
        assert_eq!(runs[0].0, "performance-j2-r0");
        assert_eq!(runs[4].0, "none-j2-r1");
        assert_eq!(runs[7].0, "performance-j8-r1");
        let args = runs[4].1.join(" ");
        assert!(args.contains("--disk /guest/kernbench.ext4,readonly=on"));
        assert!(args.contains("--policy none"));
        assert!(guest_command(runs[2].2, "", Pace::BENCH).contains("JOBS=8"));
    }

    /// The guest command fits the kernel command line and, with stubs for the programs it
    /// runs, marks the build's span and reports it.
    #[test]
    fn the_guest_command_marks_and_reports_the_build() {
        let command = guest_command(4, "-O0", Pace::BENCH);
        assert!(command.contains("\nMYCFLAGS=-O0\n"), "{command}");
        assert!(command.len() < 1400, "{} bytes", command.len());
        let stubs = "mount() { :; }\nfind() { :; }\ncp() { :; }\nsleep() { :; }\n\
                     chroot() { shift; echo \"ran $*\"; }\nmkdir() { :; }\n";
        let script = command.replace("[ ! -b /dev/vda ]", "false");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{stubs}{script}"))
            .output()
            .expect("sh runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "pvmm-mark: load-begin");
        assert_eq!(lines[1], "pvmm-mark: load-end");
        assert!(lines[2].starts_with("ran /tmp/build/src/lua"));
        assert!(lines[3].starts_with("KB built "));
        assert_eq!(lines[4], "pvmm-mark: idle-end");
    }
}
