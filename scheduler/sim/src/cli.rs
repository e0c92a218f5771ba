//! The `pvmm-sim` command line, as a library function so that it can be
//! tested without spawning the binary (`src/bin/pvmm-sim.rs` only calls
//! [`main_with_args`]). `pvmm-sim --help` documents every option.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::error::ErrorKind;
use clap::Parser;

use super::bound::{clairvoyant, Bound};
use super::run::MAX_DURATION_MS;
use super::scenario::{
    busy_loop_topology, busy_loop_vms, format_busy_loop_measured, format_measured_rows,
    kernbench_description, kernbench_topology, kernbench_vm, BUSY_LOOP_TASKS, BUSY_LOOP_TOPOLOGY,
    KERNBENCH_THREADS, KERNBENCH_TOPOLOGY,
};
use super::spec::MAX_VCPUS_PER_VM;
use super::{
    format_table, simulate, svg, Placement, PowerModel, Progress, RunResult, SimConfig, SimError,
    VmSpec,
};
use pvmm_scheduler::placement::EngineConfig;
use pvmm_scheduler::topology::{parse_host_topology_arg, HostTopology};

/// Exit status for bad command lines and bad input files.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for failures while running (engine error, unwritable SVG).
pub const EXIT_FAILURE: u8 = 1;

/// Default simulated time without jobs (s): long enough for the engine's 5 s
/// consolidation ramp to play out many times.
const DEFAULT_DURATION_S: f64 = 60.0;
/// Default cap with jobs (s): about ten times the longest measured kernbench
/// run ([`crate::scenario::KERNBENCH_2008`]: 217 s).
const DEFAULT_JOB_CAP_S: f64 = 3600.0;
/// Wall-clock interval between progress lines on stderr.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

const ABOUT: &str = "Trace-driven simulator for pvmm's vCPU placement engine";

const LONG_ABOUT: &str = "\
Trace-driven simulator for pvmm's vCPU placement engine.

Simulates VMs with per-vCPU load on a host topology, in discrete time: every
placement tick (default 100 ms, as the live VMM) each vCPU's simulated busy/idle
time goes through the live VMM's utilization tracker into the placement engine
(the same Engine::place code as pvmm), and the decision is applied; every work
step (default 1 ms) each vCPU's work is served by the capacity its placement
gives it (time slicing on a shared CPU, SMT sharing, a cache-sharing bonus when
a VM's vCPUs share a package, a migration cost). A power model turns package,
core and thread activity into watts.

Prints one table per case, one row per policy, in the format of the kernbench
tables of the sched_mc_power_savings series (LKML, 2008; performance = 1.00):
  Run Time(s)      when every VM's job finished ('>' = not by the cap);
                   'Work Done(s)' (CPU-seconds) when no VM has a job
  Package Idle(%)  per package, share of the time all its CPUs were idle
  Energy, Power    energy for the same work and average power, relative
  Energy(J), Power(W), Migrations (vCPU moves between CPUs)
  Perf/W           1e6 / run time / watts (Alex Shi's scale); without jobs,
                   1e6 x CPU-seconds done / joules
  Energy/bound     energy over the clairvoyant bound for the same work
A 'bound' row closes each table: the least energy any placement could use
for the load (it knows the whole load in advance, migrates for free, pays no
cache penalty; the same host, power model and one CPU's work per CPU per
step), with its shortest possible run time.

Policies: performance, balance, powersaving:1, powersaving:2 (the engine's);
unpinned: no packing at all, vCPU threads left to a host scheduler that
puts a waking vCPU on a random idle CPU anywhere and moves running ones now and
then (threads wander between packages); and oracle: packing that no real VMM
can do, redone every work step with the step's load known as it arrives and
free migrations (runnable vCPUs one to a core on the fewest packages). The
best placement lies between the bound and the oracle.

MODES
  pvmm-sim --scenario kernbench [--vcpus 2,4,6,8] [--scale F] [--svg FILE]
      The measured 2008 case: host 2x4x1, one VM with N vCPUs running a
      make -jN-like load (bursts of work and idle gaps, a fixed build shared
      by the vCPUs), one table per N.
  pvmm-sim --scenario busyloop [--vcpus 2,8] [--duration S] [--svg FILE]
      Len Brown's busy loops (LKML, 2013): host 2x8x2 (SNB-EP), N always-busy
      one-vCPU VMs for a fixed time (default 60 s), one table per N with his
      measured powersaving/performance watts.
  pvmm-sim --topology SPEC --vm SPEC [--vm SPEC...] [--policy LIST]
           [--duration S] [--svg FILE]
      Any host and VMs; one table.

VM SPEC (--vm), comma-separated KEY=VALUE:
  vcpus=N            vCPUs (1-1024; default: number of loads, trace columns, 1)
  load=GEN[+GEN...]  one generator for all vCPUs, or one per vCPU:
                       constant:D        D (0..1) of one CPU, all the time
                       duty:B/P[@S]      busy B ms of every P ms (windows from S ms)
                       bursty:B/I        closed loop: bursts of mean B ms of work,
                                         idle gaps of mean I ms after each burst
                       ramp:F/T/O        demand F -> T (0..1) linearly over O ms
                     default constant:1
  trace=FILE         per-vCPU demand from a trace file (instead of load=)
  work=S             the VM's job: S CPU-seconds of work shared by its vCPUs;
                     the run ends when every job is done
  e.g. --vm vcpus=4,load=bursty:20/50,work=60  --vm load=constant:1+constant:0.1

TRACE FILE: lines 'TIME_MS D0 D1 ...', one demand (0..1 of one CPU) per vCPU;
first line at time 0, times increasing, values hold until the next line (the
last line's until the end); '#' comments. Demand that is not served queues.

POWER MODEL (--power KEY=VALUE,...; watts unless noted), defaults fitted to Len
Brown's SNB-EP measurements (2 x 8 cores x 2 threads, busy loops):
  platform=117  everything outside the packages
  idle=10       a package with all CPUs idle (assumed; only platform + 2 x idle
                = 137 W is measured, the split changes no result)
  active=35.21  an awake package before its cores' power
  core=11.79    each busy core
  smt=0.1008    each further busy thread of a core adds this x core

EXIT STATUS: 0 success; 2 bad command line or input (spec, topology, trace);
1 failure while running (e.g. the SVG cannot be written).";

#[derive(Parser, Debug)]
#[command(name = "pvmm-sim", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Args {
    /// Built-in scenario: kernbench (the 2008 sched_mc_power_savings dual-socket quad-core case)
    /// or busyloop (Len Brown's SNB-EP busy loops).
    #[arg(long, value_name = "NAME")]
    scenario: Option<String>,

    /// Host topology: SxCxT or SxDxCxT (e.g. 2x4x2), a topology file, or auto
    /// (this machine). Default: 2x4x1 (busyloop: 2x8x2).
    #[arg(long, value_name = "SPEC|FILE|auto")]
    topology: Option<String>,

    /// A VM (repeatable), e.g. vcpus=4,load=bursty:20/50,work=60. See --help.
    #[arg(long = "vm", value_name = "SPEC")]
    vms: Vec<String>,

    /// Comma-separated policies, or all: performance, balance, powersaving:1,
    /// powersaving:2, unpinned, oracle.
    #[arg(long, value_name = "LIST", default_value = "all")]
    policy: String,

    /// Simulated seconds: the run length when no VM has work=, else a cap
    /// (defaults 60 and 3600).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    duration: Option<f64>,

    /// Scenario only: comma-separated vCPU (kernbench) or task (busyloop) counts N (default
    /// 2,4,6,8 and 2,8).
    #[arg(long, value_name = "LIST")]
    vcpus: Option<String>,

    /// Scenario only: scale the build's work (1 = full; 0.1 = ten times shorter runs).
    #[arg(
        long,
        value_name = "FACTOR",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    scale: f64,

    /// Placement tick in milliseconds (the live VMM's default: 100).
    #[arg(long, value_name = "MS", default_value_t = 100)]
    tick_ms: u64,

    /// Work accounting step in microseconds (must divide the tick).
    #[arg(long, value_name = "US", default_value_t = 1000)]
    step_us: u64,

    /// Seed for the load generators and the unpinned baseline.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,

    /// Power model overrides, e.g. idle=5,core=10 (see --help).
    #[arg(long, value_name = "KEY=VALUE,...")]
    power: Option<String>,

    /// Engine: consolidation ramp-down window in ms (default 5000).
    #[arg(long, value_name = "MS")]
    ramp_down_ms: Option<u64>,

    /// Engine: migrations per vCPU per second on average, in bursts of up to N (default 2).
    #[arg(long, value_name = "N")]
    max_migrations: Option<u32>,

    /// Engine: half-life in ms of the demand average it packs on (default 500; 0 packs on
    /// each tick's utilization).
    #[arg(long, value_name = "MS")]
    demand_half_life_ms: Option<u32>,

    /// Engine, packing policies: each vCPU may run on every CPU its package uses, not only
    /// its own; the host's wake-up path picks a free one (pvmm --share-package).
    #[arg(long)]
    share_package: bool,

    /// Write an SVG timeline (which package each vCPU ran on) to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,

    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

/// A failure with its exit status; the message is one line.
struct Failure {
    status: u8,
    message: String,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure {
        status: EXIT_BAD_INPUT,
        message: message.into(),
    }
}

fn failed(message: impl Into<String>) -> Failure {
    Failure {
        status: EXIT_FAILURE,
        message: message.into(),
    }
}

/// Runs `pvmm-sim` with `args` (the first is the program name), printing
/// tables to `out` and progress and errors to `err`. Returns the exit status:
/// 0, [`EXIT_BAD_INPUT`] or [`EXIT_FAILURE`].
pub fn main_with_args<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                // A closed pipe is not an error for help output.
                let _ = write!(out, "{}", e.render());
                return 0;
            }
            _ => {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or("bad command line");
                let first = first.strip_prefix("error: ").unwrap_or(first);
                let _ = writeln!(err, "pvmm-sim: {first} (see --help)");
                return EXIT_BAD_INPUT;
            }
        },
    };
    match run(&args, out, err) {
        Ok(()) => 0,
        Err(f) => {
            let _ = writeln!(err, "pvmm-sim: {}", f.message);
            f.status
        }
    }
}

fn parse_placements(list: &str) -> Result<Vec<Placement>, Failure> {
    if list.trim() == "all" {
        return Ok(Placement::ALL.to_vec());
    }
    let mut out: Vec<Placement> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let p: Placement = item.parse().map_err(bad)?;
        if out.contains(&p) {
            return Err(bad(format!("policy '{item}' listed twice")));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(bad("--policy lists no policy"));
    }
    Ok(out)
}

fn parse_vcpu_counts(list: &str) -> Result<Vec<usize>, Failure> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        let n = item
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_VCPUS_PER_VM).contains(n))
            .ok_or_else(|| {
                bad(format!(
                    "--vcpus: '{item}' is not a vCPU count from 1 to 1024"
                ))
            })?;
        out.push(n);
    }
    Ok(out)
}

fn duration_ms(seconds: f64) -> Result<u64, Failure> {
    let max_s = MAX_DURATION_MS as f64 / 1000.0;
    if !seconds.is_finite() || seconds <= 0.0 || seconds > max_s {
        return Err(bad(format!(
            "--duration {seconds} is not a number of seconds above 0 and up to {max_s}"
        )));
    }
    // Checked above: finite, positive and at most MAX_DURATION_MS.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ms = (seconds * 1000.0).round() as u64;
    Ok(ms.max(1))
}

fn topology_summary(t: &HostTopology) -> String {
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let threads = t.cpus().len() / t.num_cores().max(1);
    format!(
        "{}, {}, {}, {} per core",
        plural(t.num_packages(), "package"),
        plural(t.num_cores(), "core"),
        plural(t.cpus().len(), "CPU"),
        plural(threads, "thread")
    )
}

/// Prints progress lines (stderr) at most every [`PROGRESS_INTERVAL`].
struct Reporter<'a> {
    quiet: bool,
    started: Instant,
    last: Instant,
    err: &'a mut dyn Write,
}

impl<'a> Reporter<'a> {
    fn new(quiet: bool, err: &'a mut dyn Write) -> Self {
        Reporter {
            quiet,
            started: Instant::now(),
            last: Instant::now(),
            err,
        }
    }

    fn start(&mut self, what: &str) {
        self.last = Instant::now();
        if !self.quiet {
            let _ = writeln!(self.err, "pvmm-sim: simulating {what} ...");
        }
    }

    fn tick(&mut self, p: Progress) {
        if self.quiet || self.last.elapsed() < PROGRESS_INTERVAL {
            return;
        }
        self.last = Instant::now();
        let _ = match p.work_fraction {
            Some(f) => writeln!(
                self.err,
                "pvmm-sim:   {:.0} s simulated, {:.0} % of the work done",
                p.simulated_s,
                f * 100.0
            ),
            None => writeln!(
                self.err,
                "pvmm-sim:   {:.0} of {:.0} s simulated",
                p.simulated_s, p.limit_s
            ),
        };
    }

    fn done(&mut self, r: &RunResult) {
        if !self.quiet {
            let _ = writeln!(
                self.err,
                "pvmm-sim:   {}: {:.1} s simulated, {} migrations ({:.1} s elapsed in total)",
                r.placement,
                r.elapsed_s,
                r.migrations,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// SVG panels: a title and the run it shows.
type Panels = Vec<(String, RunResult)>;

fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), Failure> {
    let placements = parse_placements(&args.policy)?;
    let config = sim_config(args)?;
    let busy_loop = args.scenario.as_deref() == Some("busyloop");
    let topology = match &args.topology {
        Some(arg) => parse_host_topology_arg(arg).map_err(|e| bad(e.to_string()))?,
        None if busy_loop => busy_loop_topology().map_err(|e| failed(e.to_string()))?,
        None => kernbench_topology().map_err(|e| failed(e.to_string()))?,
    };
    let mut reporter = Reporter::new(args.quiet, err);
    let mut cases = Cases {
        topology: &topology,
        placements: &placements,
        reporter: &mut reporter,
        out,
    };
    let (heading, panels) = match args.scenario.as_deref() {
        Some("kernbench") => cases.kernbench(args, config)?,
        Some("busyloop") => cases.busy_loop(args, config)?,
        Some(other) => {
            return Err(bad(format!(
                "unknown scenario '{other}' (expected kernbench or busyloop)"
            )))
        }
        None => cases.vms(args, config)?,
    };
    if let Some(path) = &args.svg {
        let refs: Vec<(String, &RunResult)> = panels.iter().map(|(t, r)| (t.clone(), r)).collect();
        let text = svg::render(&heading, &refs);
        std::fs::write(path, text)
            .map_err(|e| failed(format!("cannot write SVG {}: {e}", path.display())))?;
        if !args.quiet {
            let _ = writeln!(reporter.err, "pvmm-sim: wrote {}", path.display());
        }
    }
    Ok(())
}

/// The simulation settings of the command line, but for the duration (which
/// depends on the mode).
fn sim_config(args: &Args) -> Result<SimConfig, Failure> {
    let power = match &args.power {
        Some(spec) => PowerModel::parse_overrides(spec).map_err(|e| bad(e.to_string()))?,
        None => PowerModel::default(),
    };
    let mut engine = EngineConfig::default();
    if let Some(ms) = args.ramp_down_ms {
        engine.ramp_down_window_ms = ms;
    }
    if let Some(n) = args.max_migrations {
        engine.max_migrations_per_vcpu_per_s = n;
    }
    if let Some(ms) = args.demand_half_life_ms {
        engine.demand_half_life_ms = ms;
    }
    engine.share_package = args.share_package;
    Ok(SimConfig {
        tick_ms: args.tick_ms,
        step_us: args.step_us,
        seed: args.seed,
        power,
        engine,
        timeline: args.svg.is_some(),
        ..SimConfig::default()
    })
}

/// What every mode runs its cases with: the host, the policies, progress
/// lines and the tables' output.
struct Cases<'a, 'e> {
    topology: &'a HostTopology,
    placements: &'a [Placement],
    reporter: &'a mut Reporter<'e>,
    out: &'a mut dyn Write,
}

/// One case of a built-in scenario.
struct ScenarioCase {
    vms: Vec<VmSpec>,
    title: String,
    /// The measured results printed under its table.
    measured: String,
}

impl Cases<'_, '_> {
    /// `--scenario kernbench`: one table per vCPU count, each followed by the
    /// measured 2008 rows. Returns the SVG heading and panels.
    fn kernbench(
        &mut self,
        args: &Args,
        mut config: SimConfig,
    ) -> Result<(String, Panels), Failure> {
        if !args.vms.is_empty() {
            return Err(bad("--scenario and --vm cannot be combined"));
        }
        if !args.scale.is_finite() || args.scale <= 0.0 || args.scale > 100.0 {
            return Err(bad(format!(
                "--scale {} is not a factor above 0 and up to 100",
                args.scale
            )));
        }
        let counts = match &args.vcpus {
            Some(list) => parse_vcpu_counts(list)?,
            None => KERNBENCH_THREADS.to_vec(),
        };
        config.duration_ms = duration_ms(args.duration.unwrap_or(DEFAULT_JOB_CAP_S))?;
        config.validate().map_err(|e| bad(e.to_string()))?;
        let topology = self.topology;
        let _ = writeln!(
            self.out,
            "pvmm-sim kernbench scenario\n  host: {} ({})\n  load: {}\n  \
             simulation: placement tick {} ms, work step {} us, seed {}\n",
            args.topology.as_deref().unwrap_or(KERNBENCH_TOPOLOGY),
            topology_summary(topology),
            kernbench_description(args.scale),
            config.tick_ms,
            config.step_us,
            config.seed
        );
        let panels = self.scenario_tables("kernbench", &counts, &config, |n| ScenarioCase {
            vms: vec![kernbench_vm(n, args.scale)],
            title: format!("Kernbench-like load, {n} busy vCPUs (1 VM)"),
            measured: format_measured_rows(n),
        })?;
        let heading = format!("pvmm-sim kernbench on {}", topology_summary(topology));
        Ok((heading, panels))
    }

    /// `--scenario busyloop`: one table per task count, each followed by Len
    /// Brown's measured watts. Returns the SVG heading and panels.
    fn busy_loop(
        &mut self,
        args: &Args,
        mut config: SimConfig,
    ) -> Result<(String, Panels), Failure> {
        if !args.vms.is_empty() {
            return Err(bad("--scenario and --vm cannot be combined"));
        }
        if args.scale != 1.0 {
            return Err(bad("--scale is for --scenario kernbench"));
        }
        let counts = match &args.vcpus {
            Some(list) => parse_vcpu_counts(list)?,
            None => BUSY_LOOP_TASKS.to_vec(),
        };
        config.duration_ms = duration_ms(args.duration.unwrap_or(DEFAULT_DURATION_S))?;
        config.validate().map_err(|e| bad(e.to_string()))?;
        let topology = self.topology;
        let _ = writeln!(
            self.out,
            "pvmm-sim busyloop scenario\n  host: {} ({})\n  load: N always-busy tasks, one \
             one-vCPU VM each, for {} s\n  simulation: placement tick {} ms, work step {} us, \
             seed {}\n",
            args.topology.as_deref().unwrap_or(BUSY_LOOP_TOPOLOGY),
            topology_summary(topology),
            config.duration_ms as f64 / 1000.0,
            config.tick_ms,
            config.step_us,
            config.seed
        );
        let panels = self.scenario_tables("busyloop", &counts, &config, |n| {
            let plural = if n == 1 { "" } else { "s" };
            ScenarioCase {
                vms: busy_loop_vms(n),
                title: format!("Busy loops: {n} always-busy task{plural}, one one-vCPU VM each"),
                measured: format_busy_loop_measured(n),
            }
        })?;
        let heading = format!("pvmm-sim busyloop on {}", topology_summary(topology));
        Ok((heading, panels))
    }

    /// `--vm SPEC...`: one table. Returns the SVG heading and panels.
    fn vms(&mut self, args: &Args, mut config: SimConfig) -> Result<(String, Panels), Failure> {
        if args.vms.is_empty() {
            return Err(bad(
                "give --scenario kernbench or busyloop, or at least one --vm SPEC",
            ));
        }
        if args.vcpus.is_some() {
            return Err(bad("--vcpus is for --scenario; use --vm vcpus=N"));
        }
        let vms = args
            .vms
            .iter()
            .map(|s| VmSpec::parse(s).map_err(|e| bad(format!("--vm {s}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let has_jobs = vms.iter().any(|v| v.work_s.is_some());
        let default_s = if has_jobs {
            DEFAULT_JOB_CAP_S
        } else {
            DEFAULT_DURATION_S
        };
        config.duration_ms = duration_ms(args.duration.unwrap_or(default_s))?;
        config.validate().map_err(|e| bad(e.to_string()))?;
        let total_vcpus: usize = vms.iter().map(|v| v.vcpus.len()).sum();
        let _ = writeln!(
            self.out,
            "pvmm-sim\n  host: {}\n  load: {} VM{}, {} vCPUs\n  \
             simulation: {}, placement tick {} ms, work step {} us, seed {}\n",
            topology_summary(self.topology),
            vms.len(),
            if vms.len() == 1 { "" } else { "s" },
            total_vcpus,
            if has_jobs {
                format!(
                    "until every job is done (cap {} s)",
                    config.duration_ms / 1000
                )
            } else {
                format!("{} s", config.duration_ms as f64 / 1000.0)
            },
            config.tick_ms,
            config.step_us,
            config.seed
        );
        let (results, bound) = self.run_case(&vms, &config, "")?;
        let _ = writeln!(self.out, "{}", format_table("", &results, Some(&bound)));
        let panels = results
            .into_iter()
            .map(|r| (r.placement.to_string(), r))
            .collect();
        let heading = format!("pvmm-sim on {}", topology_summary(self.topology));
        Ok((heading, panels))
    }

    /// Simulates `vms` under every placement, with progress lines, and
    /// computes their clairvoyant bound.
    /// A scenario's tables: for each count `n`, `case(n)`'s VMs under every placement, its
    /// table and the measurements printed under it. Returns the SVG panels.
    fn scenario_tables(
        &mut self,
        name: &str,
        counts: &[usize],
        config: &SimConfig,
        case: impl Fn(usize) -> ScenarioCase,
    ) -> Result<Panels, Failure> {
        let mut panels = Panels::new();
        for &n in counts {
            let ScenarioCase {
                vms,
                title,
                measured,
            } = case(n);
            let (results, bound) = self.run_case(&vms, config, &format!("{name} N={n}: "))?;
            let _ = write!(self.out, "{}", format_table(&title, &results, Some(&bound)));
            let _ = writeln!(self.out, "{measured}");
            let _ = self.out.flush();
            for r in results {
                panels.push((format!("N={n}, {}", r.placement), r));
            }
        }
        Ok(panels)
    }

    fn run_case(
        &mut self,
        vms: &[VmSpec],
        config: &SimConfig,
        label: &str,
    ) -> Result<(Vec<RunResult>, Bound), Failure> {
        let sim_failure = |e: SimError| match e {
            SimError::BadConfig(m) => bad(m),
            other => failed(other.to_string()),
        };
        let bound = clairvoyant(self.topology, vms, config).map_err(sim_failure)?;
        let mut results = Vec::new();
        for &placement in self.placements {
            self.reporter.start(&format!("{label}{placement}"));
            let reporter = &mut *self.reporter;
            let result = simulate(self.topology, vms, placement, config, &mut |p| {
                reporter.tick(p)
            })
            .map_err(sim_failure)?;
            self.reporter.done(&result);
            results.push(result);
        }
        Ok((results, bound))
    }
}
