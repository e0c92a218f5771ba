//! The simulation loop: discrete time, a fine *work step* for accounting and a
//! coarser *placement tick* at which the placement engine decides.
//!
//! # What happens each placement tick (default every 100 ms, as the live VMM)
//!
//! Each vCPU's cumulative busy and idle time (simulated) is fed as an
//! [`IdleSample`] to its own [`UtilTracker`], the tracker's utilization and
//! busy flag go into [`Engine::place`] for all vCPUs of all VMs, and the
//! decision is applied through a [`RecordingExecutor`] and read back: exactly
//! the live VMM's tick, with simulated threads. The simulator has no placement
//! logic of its own. Migrations are the decision's moves.
//!
//! # What happens each work step (default 1 ms)
//!
//! 1. Work arrives at each vCPU from its generator ([`crate::load`]),
//!    limited by what is left of its VM's job (`work=`).
//! 2. A vCPU with undone work is runnable. Under [`Placement::Unpinned`] the
//!    host's own scheduler places it (below); otherwise it runs on the one CPU
//!    the engine gave it.
//! 3. Each host CPU serves its runnable vCPUs by time slicing (water-filling:
//!    equal shares, a vCPU that needs less leaves the rest to the others). A
//!    vCPU's speed while it runs is its thread's share of the core
//!    ([`thread_share`]: 1024 alone, 589 when an SMT sibling is also busy,
//!    the capacity model the engine uses) times its cache factor: a vCPU whose
//!    VM's other vCPUs sit on other packages runs up to
//!    [`CACHE_SHARING_SPEEDUP`] slower than one whose VM shares its package.
//!    A vCPU that moved first spends a migration cost refilling caches
//!    ([`MIGRATION_COST_SAME_PACKAGE_US`], [`MIGRATION_COST_CROSS_PACKAGE_US`]).
//! 4. Time a vCPU runs counts as busy, time it has nothing to do as idle
//!    (time it waits for a shared CPU is neither, as steal time is for a real
//!    vCPU), which is what its tracker sees at the next tick.
//! 5. The power model ([`PowerModel`]) turns the step's busy fractions per
//!    CPU into package, core and SMT activity; energy is power x time.
//!
//! Within a step, work on different CPUs is taken to start at the start of
//! the step, so a package is awake for the largest busy fraction of its CPUs
//! (an approximation finer than the 1 ms step only).
//!
//! # The unpinned baseline: no packing at all
//!
//! [`Placement::Unpinned`] models vCPU threads left to a host scheduler that
//! knows nothing of packages, as on symmetric x86 servers today (EAS does not
//! run there): a vCPU that wakes goes to an idle CPU chosen uniformly at
//! random among all idle CPUs of the host (the CPU with the fewest runnable
//! vCPUs when none is idle); a CPU left with two runnable vCPUs while another
//! CPU idles has one pulled to a random idle CPU at once (newly idle
//! balancing); and a running vCPU is displaced to a random idle CPU after a
//! random residency of mean [`UNPINNED_MEAN_RESIDENCY_MS`] (host threads and
//! interrupts preempt it and the balancer moves it). Linux prefers a waking
//! thread's previous CPU when that is idle, so this is the upper bound of
//! wandering: real unpinned threads sit between it and `performance`. Every
//! change of CPU is a migration and pays the migration cost.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use pvmm_scheduler::capacity::{thread_share, CAPACITY_SCALE};
use pvmm_scheduler::cpuset::CpuSet;
use pvmm_scheduler::executor::{Executor, ExecutorError, RecordingExecutor};
use pvmm_scheduler::placement::{Engine, EngineConfig, PlaceError, VcpuId, VcpuLoad};
use pvmm_scheduler::policy::Policy;
use pvmm_scheduler::topology::HostTopology;
use pvmm_scheduler::util::{IdleSample, UtilConfig, UtilTracker};

use super::load::{LoadState, Rng, EMPTY_BACKLOG_NS, NS_PER_MS};
use super::spec::VmSpec;
use pvmm_scheduler::power::{thread_overlap, PowerModel};

/// Default placement tick (ms): the live VMM's default (`DEFAULT_TICK_MS` in
/// `vmm/src/live/scheduler.rs`), so the simulator decides as often as pvmm does.
pub const DEFAULT_TICK_MS: u64 = 100;

/// Default work step (µs). 1 ms resolves the bursts of a build job (tens of
/// ms) and SMT/package overlap well while keeping a 200 s run at 200,000
/// steps; Linux's time slices are of the same order (sched_min_granularity
/// 0.75-3 ms).
pub const DEFAULT_STEP_US: u64 = 1000;

/// How much faster a vCPU runs when all of its VM's other vCPUs share its
/// package than when all of them are on other packages (7.5 %); linear in
/// between, by the fraction of the VM's other vCPUs that are elsewhere.
/// From "Re: [PATCH v7 0/8] Tunable sched_mc_power_savings=n"
/// (Vaidyanathan Srinivasan, LKML, 2008-12-30): kernbench under sched_mc=2, which
/// kept a build's threads on one package, ran "+7.5 %" faster (Ingo Molnar's
/// figure for 80.04 s vs 74.95 s at make -j4), attributed to cache sharing.
pub const CACHE_SHARING_SPEEDUP: f64 = 0.075;

/// Cost of a migration within a package (µs of running without progress): the
/// vCPU refills its private L1/L2 (256 KiB to 2 MiB, thousands of lines) from
/// the shared L3 at around 10 ns a line: tens of microseconds.
pub const MIGRATION_COST_SAME_PACKAGE_US: f64 = 50.0;

/// Cost of a migration to another package (µs): the working set comes from
/// DRAM or the other package's cache instead (a few MiB at around 100 ns a
/// line, partly overlapped): hundreds of microseconds. The engine's own
/// migration budget assumes "a few hundred microseconds to milliseconds".
pub const MIGRATION_COST_CROSS_PACKAGE_US: f64 = 500.0;

/// Unpinned baseline: mean time a running vCPU thread stays on one CPU before
/// host activity displaces it (ms). A modelling choice, not a measurement:
/// long enough that a thread keeps its cache for many time slices (Linux
/// treats a task as cache-hot for 0.5 ms, `sched_migration_cost_ns`), short
/// enough that, over seconds, busy threads visit every package, as in
/// pvmm's nested rig (two busy vCPU threads left to L1's
/// scheduler kept both packages about half busy).
pub const UNPINNED_MEAN_RESIDENCY_MS: f64 = 100.0;

/// Longest simulation accepted (ms): one simulated day.
pub const MAX_DURATION_MS: u64 = 86_400_000;

/// Simulation errors.
#[derive(Debug, Error)]
pub enum SimError {
    /// No vCPUs to simulate.
    #[error("nothing to simulate: no VM has a vCPU")]
    NoVcpus,
    /// A configuration value out of range.
    #[error("{0}")]
    BadConfig(String),
    /// The engine refused the input.
    #[error("placement engine: {0}")]
    Place(#[from] PlaceError),
    /// The recording executor failed.
    #[error("executor: {0}")]
    Executor(#[from] ExecutorError),
    /// The engine placed a vCPU on a CPU the topology does not have.
    #[error("the engine placed a vCPU on CPU {0}, which is not in the topology")]
    UnknownCpu(u32),
}

/// Who decides where vCPUs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// pvmm's engine with this policy.
    Engine(Policy),
    /// No packing: the host scheduler's own wandering (module docs).
    Unpinned,
}

impl Placement {
    /// Every placement the reports compare: the engine's four policies and the
    /// unpinned baseline, `performance` first (the reference).
    pub const ALL: [Placement; 5] = [
        Placement::Engine(Policy::Performance),
        Placement::Engine(Policy::Balance),
        Placement::Engine(Policy::Powersaving { level: 1 }),
        Placement::Engine(Policy::Powersaving { level: 2 }),
        Placement::Unpinned,
    ];
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Engine(policy) => write!(f, "{policy}"),
            Placement::Unpinned => f.write_str("unpinned"),
        }
    }
}

impl FromStr for Placement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "unpinned" {
            return Ok(Placement::Unpinned);
        }
        s.parse::<Policy>().map(Placement::Engine).map_err(|_| {
            format!(
                "unknown policy '{s}' (expected performance, balance, powersaving, \
                 powersaving:1, powersaving:2 or unpinned)"
            )
        })
    }
}

/// Simulation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Placement tick (ms), > 0.
    pub tick_ms: u64,
    /// Work step (µs), > 0, at most one tick; a tick is a whole number of steps.
    pub step_us: u64,
    /// Simulated time (ms): the run length when no VM has a job (`work=`), else
    /// a cap after which unfinished jobs are reported as such.
    pub duration_ms: u64,
    /// Seed for the load generators and the unpinned baseline.
    pub seed: u64,
    /// The power model.
    pub power: PowerModel,
    /// Engine tuning (same defaults as the live VMM).
    pub engine: EngineConfig,
    /// Utilization tracking (same defaults as the live VMM).
    pub util: UtilConfig,
    /// [`CACHE_SHARING_SPEEDUP`].
    pub cache_sharing_speedup: f64,
    /// [`MIGRATION_COST_SAME_PACKAGE_US`].
    pub migration_cost_same_package_us: f64,
    /// [`MIGRATION_COST_CROSS_PACKAGE_US`].
    pub migration_cost_cross_package_us: f64,
    /// [`UNPINNED_MEAN_RESIDENCY_MS`].
    pub unpinned_mean_residency_ms: f64,
    /// Record a per-tick timeline of packages (for the SVG).
    pub timeline: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            tick_ms: DEFAULT_TICK_MS,
            step_us: DEFAULT_STEP_US,
            duration_ms: 60_000,
            seed: 1,
            power: PowerModel::default(),
            engine: EngineConfig::default(),
            util: UtilConfig::default(),
            cache_sharing_speedup: CACHE_SHARING_SPEEDUP,
            migration_cost_same_package_us: MIGRATION_COST_SAME_PACKAGE_US,
            migration_cost_cross_package_us: MIGRATION_COST_CROSS_PACKAGE_US,
            unpinned_mean_residency_ms: UNPINNED_MEAN_RESIDENCY_MS,
            timeline: true,
        }
    }
}

impl SimConfig {
    /// Checks ranges and the tick/step relation.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::BadConfig(m));
        if self.tick_ms == 0 || self.tick_ms > 60_000 {
            return bad(format!(
                "tick {} ms is not from 1 to 60000 ms",
                self.tick_ms
            ));
        }
        if self.step_us == 0 || self.step_us > self.tick_ms * 1000 {
            return bad(format!(
                "work step {} µs is not from 1 µs to one tick ({} ms)",
                self.step_us, self.tick_ms
            ));
        }
        if !(self.tick_ms * 1000).is_multiple_of(self.step_us) {
            return bad(format!(
                "the tick ({} ms) is not a whole number of work steps ({} µs)",
                self.tick_ms, self.step_us
            ));
        }
        if self.duration_ms == 0 || self.duration_ms > MAX_DURATION_MS {
            return bad(format!(
                "duration {} ms is not from 1 ms to {MAX_DURATION_MS} ms",
                self.duration_ms
            ));
        }
        let fractions = [
            ("cache sharing speedup", self.cache_sharing_speedup),
            ("migration cost", self.migration_cost_same_package_us),
            ("migration cost", self.migration_cost_cross_package_us),
            ("unpinned residency", self.unpinned_mean_residency_ms),
        ];
        for (what, v) in fractions {
            if !v.is_finite() || v < 0.0 {
                return bad(format!("{what} {v} is not a non-negative number"));
            }
        }
        self.power
            .validate()
            .map_err(|e| SimError::BadConfig(e.to_string()))
    }
}

/// Simulated progress, for long runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Simulated time so far (s).
    pub simulated_s: f64,
    /// The run's length or cap (s).
    pub limit_s: f64,
    /// Fraction of all jobs' work done (0..1), when there are jobs.
    pub work_fraction: Option<f64>,
}

/// One vCPU's package over one tick, for the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimelineCell {
    /// Index (into [`RunResult::package_ids`]) of the package the vCPU was on,
    /// or ran on most, during the tick; `None` before its first placement.
    pub package: Option<u16>,
    /// Fraction of the tick it ran (0..1).
    pub busy: f32,
}

/// Per-tick packages of every vCPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    /// Tick length (ms); the last cell of a row may cover less.
    pub tick_ms: u64,
    /// vCPUs, in simulation order.
    pub vcpus: Vec<VcpuId>,
    /// `cells[v][tick]`.
    pub cells: Vec<Vec<TimelineCell>>,
}

/// What one simulated run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// Who placed the vCPUs.
    pub placement: Placement,
    /// Package ids of the host, in topology order.
    pub package_ids: Vec<u32>,
    /// Simulated time (s): the run time when every job finished.
    pub elapsed_s: f64,
    /// At least one VM had a job (`work=`).
    pub has_jobs: bool,
    /// Every job finished before the duration cap.
    pub finished: bool,
    /// Per VM: when its job finished (s), `None` without a job or unfinished.
    pub vm_done_s: Vec<Option<f64>>,
    /// Work done (CPU-seconds at full speed).
    pub work_done_s: f64,
    /// Work that arrived but was not done by the end (CPU-seconds).
    pub backlog_s: f64,
    /// Per package: fraction of the time all its CPUs were idle.
    pub package_idle: Vec<f64>,
    /// Energy (J).
    pub energy_j: f64,
    /// vCPU moves from one CPU to another.
    pub migrations: u64,
    /// Placement ticks run.
    pub ticks: u64,
    /// Per-tick packages, when recorded.
    pub timeline: Option<Timeline>,
}

impl RunResult {
    /// Average power (W).
    pub fn avg_power_w(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.energy_j / self.elapsed_s
        } else {
            0.0
        }
    }

    /// Energy per CPU-second of work done (J), infinite when nothing was done.
    pub fn energy_per_work(&self) -> f64 {
        if self.work_done_s > 0.0 {
            self.energy_j / self.work_done_s
        } else {
            f64::INFINITY
        }
    }
}

/// The host flattened for the step loop.
struct Host {
    package_ids: Vec<u32>,
    cpu_ids: Vec<u32>,
    cpu_pkg: Vec<usize>,
    cpu_core: Vec<usize>,
    cpu_capacity: Vec<u32>,
    cpu_threads: Vec<u32>,
    core_cpus: Vec<Vec<usize>>,
    pkg_cores: Vec<Vec<usize>>,
    /// Dense index by CPU id.
    index_of: Vec<Option<usize>>,
}

impl Host {
    fn new(topology: &HostTopology) -> Host {
        let mut host = Host {
            package_ids: Vec::new(),
            cpu_ids: Vec::new(),
            cpu_pkg: Vec::new(),
            cpu_core: Vec::new(),
            cpu_capacity: Vec::new(),
            cpu_threads: Vec::new(),
            core_cpus: Vec::new(),
            pkg_cores: Vec::new(),
            index_of: Vec::new(),
        };
        for (p, package) in topology.packages().iter().enumerate() {
            host.package_ids.push(package.id);
            let mut cores = Vec::new();
            for core in package.cores() {
                let core_index = host.core_cpus.len();
                let mut cpus = Vec::new();
                for &id in &core.cpus {
                    let dense = host.cpu_ids.len();
                    host.cpu_ids.push(id);
                    host.cpu_pkg.push(p);
                    host.cpu_core.push(core_index);
                    host.cpu_capacity
                        .push(topology.cpu(id).map_or(CAPACITY_SCALE, |c| c.capacity));
                    host.cpu_threads.push(core.cpus.len() as u32);
                    let slot = id as usize;
                    if host.index_of.len() <= slot {
                        host.index_of.resize(slot + 1, None);
                    }
                    host.index_of[slot] = Some(dense);
                    cpus.push(dense);
                }
                host.core_cpus.push(cpus);
                cores.push(core_index);
            }
            host.pkg_cores.push(cores);
        }
        host
    }

    fn num_cpus(&self) -> usize {
        self.cpu_ids.len()
    }

    fn dense(&self, cpus: &CpuSet) -> Result<usize, SimError> {
        let id = cpus.first().ok_or(SimError::UnknownCpu(u32::MAX))?;
        self.index_of
            .get(id as usize)
            .copied()
            .flatten()
            .ok_or(SimError::UnknownCpu(id))
    }
}

/// Marks a vCPU not placed yet.
const NO_CPU: usize = usize::MAX;

struct Vcpu {
    id: VcpuId,
    vm: usize,
    load: LoadState,
    backlog_ns: f64,
    /// Migration cost still to pay (ns of running without progress).
    warmup_ns: f64,
    cpu: usize,
    runnable: bool,
    busy_ns: f64,
    idle_ns: f64,
    tracker: UtilTracker,
    /// Unpinned: when host activity next displaces it while running (ns).
    displace_at_ns: f64,
    /// This tick: running time (ns) and running time per package.
    tick_busy_ns: f64,
    tick_pkg_ns: Vec<f64>,
}

struct Vm {
    /// Work left to arrive (ns); `None` for an endless load.
    remaining_ns: Option<f64>,
    done_s: Option<f64>,
    first: usize,
    count: usize,
    total_ns: f64,
}

impl Vm {
    /// Whether the VM has a job that is not finished yet.
    fn job_pending(&self) -> bool {
        self.remaining_ns.is_some() && self.done_s.is_none()
    }
}

/// What a migration costs a vCPU (ns of running without progress).
#[derive(Debug, Clone, Copy)]
struct MigrationCost {
    same_package_ns: f64,
    cross_package_ns: f64,
}

impl MigrationCost {
    /// The cost of moving from dense CPU `from` to dense CPU `to`.
    fn between(&self, host: &Host, from: usize, to: usize) -> f64 {
        if host.cpu_pkg[from] == host.cpu_pkg[to] {
            self.same_package_ns
        } else {
            self.cross_package_ns
        }
    }
}

/// The simulated time base: work steps inside placement ticks, up to a limit.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// Now (ns since the start).
    t: u64,
    step_ns: u64,
    tick_ns: u64,
    limit_ns: u64,
    next_progress_ns: u64,
}

/// Per-step buffers, reused so that a step allocates nothing.
#[derive(Default)]
struct StepBuffers {
    loads: Vec<VcpuLoad>,
    /// Runnable vCPUs of each dense CPU this step.
    runq: Vec<Vec<usize>>,
    /// Fraction of the step each CPU ran.
    cpu_busy: Vec<f64>,
    core_busy_threads: Vec<u32>,
    /// Each vCPU's speed factor from cache sharing (1 = its VM on its package).
    speed: Vec<f64>,
    /// `vm_pkg_count[vm * packages + p]`: the VM's placed vCPUs on package `p`.
    vm_pkg_count: Vec<u32>,
    vm_placed: Vec<u32>,
    /// Water-filling order of one CPU: (time the vCPU needs, vCPU).
    fill: Vec<(f64, usize)>,
    overlap: Vec<f64>,
    thread_busy: Vec<f64>,
}

/// What a run has measured so far.
#[derive(Default)]
struct Totals {
    energy_j: f64,
    work_done_ns: f64,
    migrations: u64,
    ticks: u64,
    pkg_idle_ns: Vec<f64>,
}

/// One run's whole state: [`simulate`] is `Sim::new`, then [`Sim::step`]
/// until every job is done or the limit is reached, then [`Sim::finish`].
struct Sim<'a> {
    config: &'a SimConfig,
    placement: Placement,
    host: Host,
    vcpus: Vec<Vcpu>,
    vms: Vec<Vm>,
    has_jobs: bool,
    total_job_ns: f64,
    /// The engine; `None` for [`Placement::Unpinned`].
    engine: Option<Engine>,
    executor: RecordingExecutor,
    unpinned: UnpinnedHost,
    cost: MigrationCost,
    clock: Clock,
    timeline: Option<Timeline>,
    buffers: StepBuffers,
    totals: Totals,
}

/// Simulates `vms` on `topology` under `placement`. `progress` is called about
/// every simulated second.
pub fn simulate(
    topology: &HostTopology,
    vms: &[VmSpec],
    placement: Placement,
    config: &SimConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunResult, SimError> {
    config.validate()?;
    let mut sim = Sim::new(topology, vms, placement, config)?;
    loop {
        sim.step()?;
        if let Some(p) = sim.progress_due() {
            progress(p);
        }
        if sim.all_jobs_done() || sim.clock.t >= sim.clock.limit_ns {
            break;
        }
    }
    Ok(sim.finish())
}

impl<'a> Sim<'a> {
    fn new(
        topology: &HostTopology,
        vms: &[VmSpec],
        placement: Placement,
        config: &'a SimConfig,
    ) -> Result<Self, SimError> {
        let host = Host::new(topology);
        let (vcpus, vm_state) = Self::build_vms(vms, &host, config);
        if vcpus.is_empty() {
            return Err(SimError::NoVcpus);
        }
        let num_pkgs = host.package_ids.len();
        let num_cpus = host.num_cpus();
        let has_jobs = vm_state.iter().any(|v| v.remaining_ns.is_some());
        let total_job_ns: f64 = vm_state.iter().map(|v| v.total_ns).sum();
        let engine = match placement {
            Placement::Engine(policy) => Some(Engine::new(topology.clone(), policy, config.engine)),
            Placement::Unpinned => None,
        };
        let timeline = config.timeline.then(|| Timeline {
            tick_ms: config.tick_ms,
            vcpus: vcpus.iter().map(|v| v.id).collect(),
            cells: vec![Vec::new(); vcpus.len()],
        });
        let buffers = StepBuffers {
            loads: Vec::with_capacity(vcpus.len()),
            runq: vec![Vec::new(); num_cpus],
            cpu_busy: vec![0.0; num_cpus],
            core_busy_threads: vec![0; host.core_cpus.len()],
            speed: vec![1.0; vcpus.len()],
            vm_pkg_count: vec![0; vm_state.len() * num_pkgs],
            vm_placed: vec![0; vm_state.len()],
            ..StepBuffers::default()
        };
        Ok(Sim {
            config,
            placement,
            has_jobs,
            total_job_ns,
            engine,
            executor: RecordingExecutor::new(),
            unpinned: UnpinnedHost {
                rng: Rng::stream(config.seed, u64::MAX, 0),
                idle_cpus: Vec::new(),
                residency_ns: config.unpinned_mean_residency_ms * 1e6,
            },
            cost: MigrationCost {
                same_package_ns: config.migration_cost_same_package_us * 1e3,
                cross_package_ns: config.migration_cost_cross_package_us * 1e3,
            },
            clock: Clock {
                t: 0,
                step_ns: config.step_us * 1000,
                tick_ns: config.tick_ms * NS_PER_MS,
                limit_ns: config.duration_ms * NS_PER_MS,
                next_progress_ns: 1_000 * NS_PER_MS,
            },
            timeline,
            buffers,
            totals: Totals {
                pkg_idle_ns: vec![0.0; num_pkgs],
                ..Totals::default()
            },
            host,
            vcpus,
            vms: vm_state,
        })
    }

    /// The simulated vCPUs and VMs of `vms`, each vCPU with its own load
    /// stream and utilization tracker.
    fn build_vms(vms: &[VmSpec], host: &Host, config: &SimConfig) -> (Vec<Vcpu>, Vec<Vm>) {
        let num_pkgs = host.package_ids.len();
        let mut vcpus = Vec::new();
        let mut vm_state = Vec::new();
        for (vm_index, vm) in vms.iter().enumerate() {
            let first = vcpus.len();
            for (i, spec) in vm.vcpus.iter().enumerate() {
                let rng = Rng::stream(config.seed, vm_index as u64, i as u64);
                vcpus.push(Vcpu {
                    id: VcpuId {
                        vm: vm_index as u32,
                        vcpu: i as u32,
                    },
                    vm: vm_index,
                    load: LoadState::new(spec.clone(), rng),
                    backlog_ns: 0.0,
                    warmup_ns: 0.0,
                    cpu: NO_CPU,
                    runnable: false,
                    busy_ns: 0.0,
                    idle_ns: 0.0,
                    tracker: UtilTracker::new(config.util),
                    displace_at_ns: f64::INFINITY,
                    tick_busy_ns: 0.0,
                    tick_pkg_ns: vec![0.0; num_pkgs],
                });
            }
            vm_state.push(Vm {
                remaining_ns: vm.work_s.map(|w| w * 1e9),
                done_s: None,
                first,
                count: vm.vcpus.len(),
                total_ns: vm.work_s.map_or(0.0, |w| w * 1e9),
            });
        }
        (vcpus, vm_state)
    }

    /// One work step, preceded by a placement tick when one is due.
    fn step(&mut self) -> Result<(), SimError> {
        if self.clock.t.is_multiple_of(self.clock.tick_ns) {
            if self.clock.t > 0 {
                let tick_ns = self.clock.tick_ns as f64;
                record_tick(&mut self.timeline, &mut self.vcpus, &self.host, tick_ns);
            }
            self.placement_tick()?;
            self.totals.ticks += 1;
        }
        self.arrivals();
        self.fill_run_queues();
        self.cache_factors();
        self.serve();
        self.account_power();
        self.clock.t += self.clock.step_ns;
        self.mark_finished_jobs();
        Ok(())
    }

    /// The live VMM's tick with simulated threads: utilization from the
    /// simulated busy/idle time, one engine decision, applied through the
    /// executor and read back. Moved vCPUs owe the migration cost.
    fn placement_tick(&mut self) -> Result<(), SimError> {
        let Some(engine) = self.engine.as_mut() else {
            return Ok(());
        };
        let t = self.clock.t;
        let loads = &mut self.buffers.loads;
        loads.clear();
        for v in &mut self.vcpus {
            v.tracker.update(IdleSample {
                t_ns: t,
                busy_ns: v.busy_ns.round() as u64,
                idle_ns: v.idle_ns.round() as u64,
            });
            loads.push(VcpuLoad {
                id: v.id,
                util: v.tracker.util(),
                busy: v.tracker.is_busy(),
            });
        }
        let decision = engine.place(t / NS_PER_MS, loads)?;
        self.totals.migrations += decision.moves() as u64;
        for (i, assignment) in decision.assignments.iter().enumerate() {
            let tid = i as i32 + 1;
            if self.executor.current().get(&tid) != Some(&assignment.cpus) {
                self.executor.apply(tid, &assignment.cpus)?;
            }
            let cpu = self.host.dense(&self.executor.read(tid)?)?;
            let v = &mut self.vcpus[i];
            if v.cpu != NO_CPU && v.cpu != cpu {
                v.warmup_ns += self.cost.between(&self.host, v.cpu, cpu);
            }
            v.cpu = cpu;
        }
        Ok(())
    }

    /// Step 1: work arrives from each vCPU's generator, limited by what is
    /// left of its VM's job; a vCPU with work is runnable.
    fn arrivals(&mut self) {
        let (t, step_ns) = (self.clock.t, self.clock.step_ns);
        let unpinned = self.engine.is_none();
        for v in &mut self.vcpus {
            let vm = &mut self.vms[v.vm];
            let mut work = v.load.arrivals(t, step_ns, v.backlog_ns);
            if let Some(remaining) = vm.remaining_ns.as_mut() {
                work = work.min(*remaining);
                *remaining -= work;
            }
            v.backlog_ns += work;
            let was = v.runnable;
            v.runnable = v.backlog_ns >= EMPTY_BACKLOG_NS;
            if !v.runnable {
                v.displace_at_ns = f64::INFINITY;
            } else if !was && unpinned {
                // Step 2 places a vCPU that just woke on a random idle CPU.
                v.displace_at_ns = f64::NAN;
            }
        }
    }

    /// Step 2: the runnable vCPUs of each CPU, on the engine's CPUs or, for
    /// the unpinned baseline, where the modelled host scheduler puts them.
    fn fill_run_queues(&mut self) {
        let runq = &mut self.buffers.runq;
        for q in runq.iter_mut() {
            q.clear();
        }
        if self.engine.is_none() {
            self.unpinned.place(
                &mut self.vcpus,
                &self.host,
                runq,
                self.cost,
                self.clock.t as f64,
                &mut self.totals.migrations,
            );
        } else {
            for (i, v) in self.vcpus.iter().enumerate() {
                if v.runnable && v.cpu != NO_CPU {
                    runq[v.cpu].push(i);
                }
            }
        }
    }

    /// Each vCPU's cache factor: slower by the share of its VM's other
    /// vCPUs that sit on other packages ([`SimConfig::cache_sharing_speedup`]).
    fn cache_factors(&mut self) {
        let num_pkgs = self.host.package_ids.len();
        let b = &mut self.buffers;
        b.vm_pkg_count.iter_mut().for_each(|c| *c = 0);
        b.vm_placed.iter_mut().for_each(|c| *c = 0);
        for v in &self.vcpus {
            if v.cpu != NO_CPU {
                b.vm_pkg_count[v.vm * num_pkgs + self.host.cpu_pkg[v.cpu]] += 1;
                b.vm_placed[v.vm] += 1;
            }
        }
        for (i, v) in self.vcpus.iter().enumerate() {
            b.speed[i] = if v.cpu == NO_CPU || b.vm_placed[v.vm] <= 1 {
                1.0
            } else {
                let others = f64::from(b.vm_placed[v.vm] - 1);
                let same =
                    f64::from(b.vm_pkg_count[v.vm * num_pkgs + self.host.cpu_pkg[v.cpu]] - 1);
                1.0 / (1.0 + self.config.cache_sharing_speedup * (others - same) / others)
            };
        }
    }

    /// Steps 3 and 4: SMT sharing per core, time slicing per CPU; running
    /// time counts as busy, time without work as idle.
    fn serve(&mut self) {
        let b = &mut self.buffers;
        b.core_busy_threads.iter_mut().for_each(|c| *c = 0);
        for (c, q) in b.runq.iter().enumerate() {
            if !q.is_empty() {
                b.core_busy_threads[self.host.cpu_core[c]] += 1;
            }
        }
        for c in 0..self.host.num_cpus() {
            self.buffers.cpu_busy[c] = self.serve_cpu(c);
        }
        let dt = self.clock.step_ns as f64;
        for v in &mut self.vcpus {
            if !v.runnable {
                v.idle_ns += dt;
            }
        }
    }

    /// Serves CPU `c`'s run queue for one step by water-filling (equal
    /// shares; a vCPU that needs less leaves the rest to the others) and
    /// returns the fraction of the step the CPU ran.
    fn serve_cpu(&mut self, c: usize) -> f64 {
        let host = &self.host;
        let b = &mut self.buffers;
        if b.runq[c].is_empty() {
            return 0.0;
        }
        let dt = self.clock.step_ns as f64;
        let share = f64::from(thread_share(
            host.cpu_capacity[c],
            host.cpu_threads[c],
            b.core_busy_threads[host.cpu_core[c]],
        )) / f64::from(CAPACITY_SCALE);
        b.fill.clear();
        for &i in &b.runq[c] {
            let v = &self.vcpus[i];
            let rate = share * b.speed[i];
            b.fill.push((v.warmup_ns + v.backlog_ns / rate, i));
        }
        b.fill.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut left = dt;
        let mut count = b.fill.len();
        let mut used = 0.0;
        for &(need, i) in &b.fill {
            let slice = (left / count as f64).min(need);
            left -= slice;
            count -= 1;
            used += slice;
            let v = &mut self.vcpus[i];
            let warm = slice.min(v.warmup_ns);
            v.warmup_ns -= warm;
            let work = ((slice - warm) * share * b.speed[i]).min(v.backlog_ns);
            v.backlog_ns -= work;
            self.totals.work_done_ns += work;
            v.busy_ns += slice;
            v.tick_busy_ns += slice;
            v.tick_pkg_ns[host.cpu_pkg[c]] += slice;
            if v.backlog_ns < EMPTY_BACKLOG_NS {
                // Done within the step: halted for the rest of it.
                v.idle_ns += dt - slice;
            }
        }
        (used / dt).min(1.0)
    }

    /// Step 5: the step's power from package, core and SMT activity, and
    /// each package's idle time.
    fn account_power(&mut self) {
        let dt = self.clock.step_ns as f64;
        let model = &self.config.power;
        let b = &mut self.buffers;
        let mut power = model.platform_w;
        for (p, cores) in self.host.pkg_cores.iter().enumerate() {
            let mut awake = 0.0f64;
            let mut cores_w = 0.0;
            for &core in cores {
                b.thread_busy.clear();
                b.thread_busy
                    .extend(self.host.core_cpus[core].iter().map(|&c| b.cpu_busy[c]));
                thread_overlap(&b.thread_busy, &mut b.overlap);
                awake = awake.max(b.overlap.first().copied().unwrap_or(0.0));
                cores_w += model.core_power(&b.overlap);
            }
            power += model.package_base_power(awake) + cores_w;
            self.totals.pkg_idle_ns[p] += (1.0 - awake) * dt;
        }
        self.totals.energy_j += power * dt * 1e-9;
    }

    /// Records when each VM's job finished: all its work arrived and done.
    fn mark_finished_jobs(&mut self) {
        let now_s = self.clock.t as f64 * 1e-9;
        for vm in &mut self.vms {
            if vm.done_s.is_none() && vm.remaining_ns.is_some_and(|r| r < EMPTY_BACKLOG_NS) {
                let drained = self.vcpus[vm.first..vm.first + vm.count]
                    .iter()
                    .all(|v| v.backlog_ns < EMPTY_BACKLOG_NS);
                if drained {
                    vm.done_s = Some(now_s);
                }
            }
        }
    }

    /// Whether there are jobs and every one of them finished.
    fn all_jobs_done(&self) -> bool {
        self.has_jobs && !self.vms.iter().any(Vm::job_pending)
    }

    /// The progress report, once per simulated second.
    fn progress_due(&mut self) -> Option<Progress> {
        let clock = &mut self.clock;
        if clock.t < clock.next_progress_ns {
            return None;
        }
        clock.next_progress_ns += 1_000 * NS_PER_MS;
        Some(Progress {
            simulated_s: clock.t as f64 * 1e-9,
            limit_s: clock.limit_ns as f64 * 1e-9,
            work_fraction: self
                .has_jobs
                .then(|| (self.totals.work_done_ns / self.total_job_ns).min(1.0)),
        })
    }

    /// Closes the last (maybe partial) tick and reports the run.
    fn finish(mut self) -> RunResult {
        let t = self.clock.t;
        let partial = t % self.clock.tick_ns;
        let last_tick_ns = if partial == 0 {
            self.clock.tick_ns
        } else {
            partial
        };
        record_tick(
            &mut self.timeline,
            &mut self.vcpus,
            &self.host,
            last_tick_ns as f64,
        );
        let elapsed_ns = t as f64;
        RunResult {
            placement: self.placement,
            elapsed_s: elapsed_ns * 1e-9,
            has_jobs: self.has_jobs,
            finished: !self.vms.iter().any(Vm::job_pending),
            vm_done_s: self.vms.iter().map(|vm| vm.done_s).collect(),
            work_done_s: self.totals.work_done_ns * 1e-9,
            backlog_s: self.vcpus.iter().map(|v| v.backlog_ns).sum::<f64>() * 1e-9,
            package_idle: self
                .totals
                .pkg_idle_ns
                .iter()
                .map(|ns| ns / elapsed_ns)
                .collect(),
            energy_j: self.totals.energy_j,
            migrations: self.totals.migrations,
            ticks: self.totals.ticks,
            timeline: self.timeline,
            package_ids: self.host.package_ids,
        }
    }
}

/// Appends one timeline cell per vCPU and clears the tick accumulators.
fn record_tick(timeline: &mut Option<Timeline>, vcpus: &mut [Vcpu], host: &Host, tick_ns: f64) {
    for (i, v) in vcpus.iter_mut().enumerate() {
        if let Some(tl) = timeline.as_mut() {
            let ran_most = v
                .tick_pkg_ns
                .iter()
                .enumerate()
                .filter(|(_, ns)| **ns > 0.0)
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(p, _)| p);
            let package = ran_most
                .or((v.cpu != NO_CPU).then(|| host.cpu_pkg[v.cpu]))
                .map(|p| p as u16);
            tl.cells[i].push(TimelineCell {
                package,
                busy: (v.tick_busy_ns / tick_ns).clamp(0.0, 1.0) as f32,
            });
        }
        v.tick_busy_ns = 0.0;
        v.tick_pkg_ns.iter_mut().for_each(|ns| *ns = 0.0);
    }
}

/// The unpinned baseline's host scheduler (module docs): where a scheduler
/// that knows nothing of packages runs each runnable vCPU.
struct UnpinnedHost {
    rng: Rng,
    /// Scratch list of candidate CPUs.
    idle_cpus: Vec<usize>,
    /// [`SimConfig::unpinned_mean_residency_ms`] in ns.
    residency_ns: f64,
}

impl UnpinnedHost {
    /// One step: fills `runq` with every runnable vCPU, moving woken, stacked
    /// and displaced ones, and counts the moves in `migrations`.
    fn place(
        &mut self,
        vcpus: &mut [Vcpu],
        host: &Host,
        runq: &mut [Vec<usize>],
        cost: MigrationCost,
        now_ns: f64,
        migrations: &mut u64,
    ) {
        let mut move_to = |v: &mut Vcpu, cpu: usize, rng: &mut Rng| {
            if v.cpu != NO_CPU && v.cpu != cpu {
                *migrations += 1;
                v.warmup_ns += cost.between(host, v.cpu, cpu);
            }
            v.cpu = cpu;
            v.displace_at_ns = now_ns + rng.exponential(self.residency_ns);
        };
        let (rng, idle_cpus) = (&mut self.rng, &mut self.idle_cpus);
        // Running vCPUs keep their CPU, unless displaced (handled after wake-ups).
        for (i, v) in vcpus.iter().enumerate() {
            if v.runnable && !v.displace_at_ns.is_nan() && v.cpu != NO_CPU {
                runq[v.cpu].push(i);
            }
        }
        // Wake-ups: a random idle CPU anywhere, else the least loaded.
        for (i, v) in vcpus.iter_mut().enumerate() {
            if !(v.runnable && (v.displace_at_ns.is_nan() || v.cpu == NO_CPU)) {
                continue;
            }
            let cpu = pick_cpu(runq, idle_cpus, rng, None);
            move_to(v, cpu, rng);
            runq[cpu].push(i);
        }
        // Displacement of long-running vCPUs, to a random other idle CPU.
        for c in 0..runq.len() {
            let mut k = 0;
            while k < runq[c].len() {
                let i = runq[c][k];
                if vcpus[i].displace_at_ns <= now_ns {
                    let target = pick_cpu(runq, idle_cpus, rng, Some(c));
                    if runq[target].is_empty() && target != c {
                        runq[c].swap_remove(k);
                        move_to(&mut vcpus[i], target, rng);
                        runq[target].push(i);
                        continue;
                    }
                    vcpus[i].displace_at_ns = now_ns + rng.exponential(self.residency_ns);
                }
                k += 1;
            }
        }
        // Newly idle balancing: stacked vCPUs go to idle CPUs.
        for c in 0..runq.len() {
            while runq[c].len() > 1 {
                idle_cpus.clear();
                idle_cpus.extend((0..runq.len()).filter(|&d| runq[d].is_empty()));
                if idle_cpus.is_empty() {
                    return;
                }
                let target = idle_cpus[rng.below(idle_cpus.len())];
                if let Some(i) = runq[c].pop() {
                    move_to(&mut vcpus[i], target, rng);
                    runq[target].push(i);
                }
            }
        }
    }
}

/// A uniformly random idle CPU (not `except`), else a random one among the
/// least loaded.
fn pick_cpu(
    runq: &[Vec<usize>],
    candidates: &mut Vec<usize>,
    rng: &mut Rng,
    except: Option<usize>,
) -> usize {
    candidates.clear();
    candidates.extend((0..runq.len()).filter(|&c| runq[c].is_empty() && Some(c) != except));
    if candidates.is_empty() {
        let least = runq.iter().map(Vec::len).min().unwrap_or(0);
        candidates.extend((0..runq.len()).filter(|&c| runq[c].len() == least));
    }
    candidates[rng.below(candidates.len())]
}
