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
/// From the seeds (`000_*`, `002_*`): kernbench under sched_mc=2, which kept
/// a build's threads on one package, ran "+7.5 %" faster (Ingo Molnar's
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
/// enough that, over seconds, busy threads visit every package, as in the
/// rig (`shared/notes/environment.md`: two busy vCPU threads left to L1's
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
    let host = Host::new(topology);
    let num_pkgs = host.package_ids.len();
    let num_cpus = host.num_cpus();
    let mut vcpus: Vec<Vcpu> = Vec::new();
    let mut vm_state: Vec<Vm> = Vec::new();
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
        let total_ns = vm.work_s.map_or(0.0, |w| w * 1e9);
        vm_state.push(Vm {
            remaining_ns: vm.work_s.map(|w| w * 1e9),
            done_s: None,
            first,
            count: vm.vcpus.len(),
            total_ns,
        });
    }
    if vcpus.is_empty() {
        return Err(SimError::NoVcpus);
    }
    let has_jobs = vm_state.iter().any(|v| v.remaining_ns.is_some());
    let total_job_ns: f64 = vm_state.iter().map(|v| v.total_ns).sum();

    let mut engine = match placement {
        Placement::Engine(policy) => Some(Engine::new(topology.clone(), policy, config.engine)),
        Placement::Unpinned => None,
    };
    let mut executor = RecordingExecutor::new();
    let mut host_rng = Rng::stream(config.seed, u64::MAX, 0);
    let mut timeline = config.timeline.then(|| Timeline {
        tick_ms: config.tick_ms,
        vcpus: vcpus.iter().map(|v| v.id).collect(),
        cells: vec![Vec::new(); vcpus.len()],
    });

    let step_ns = config.step_us * 1000;
    let dt = step_ns as f64;
    let tick_ns = config.tick_ms * NS_PER_MS;
    let limit_ns = config.duration_ms * NS_PER_MS;
    let mut loads: Vec<VcpuLoad> = Vec::with_capacity(vcpus.len());
    let mut runq: Vec<Vec<usize>> = vec![Vec::new(); num_cpus];
    let mut cpu_busy = vec![0.0f64; num_cpus];
    let mut core_busy_threads = vec![0u32; host.core_cpus.len()];
    let mut speed = vec![1.0f64; vcpus.len()];
    let mut vm_pkg_count = vec![0u32; vm_state.len() * num_pkgs];
    let mut vm_placed = vec![0u32; vm_state.len()];
    let mut pkg_idle_ns = vec![0.0f64; num_pkgs];
    let mut fill: Vec<(f64, usize)> = Vec::new();
    let mut overlap: Vec<f64> = Vec::new();
    let mut thread_busy: Vec<f64> = Vec::new();
    let mut idle_cpus: Vec<usize> = Vec::new();
    let mut energy_j = 0.0f64;
    let mut work_done_ns = 0.0f64;
    let mut migrations = 0u64;
    let mut ticks = 0u64;
    let mut next_progress_ns = 1_000 * NS_PER_MS;
    let mut t: u64 = 0;
    let same_cost = config.migration_cost_same_package_us * 1e3;
    let cross_cost = config.migration_cost_cross_package_us * 1e3;
    let residency_ns = config.unpinned_mean_residency_ms * 1e6;

    loop {
        if t.is_multiple_of(tick_ns) {
            if t > 0 {
                record_tick(&mut timeline, &mut vcpus, &host, tick_ns as f64);
            }
            if let Some(engine) = engine.as_mut() {
                loads.clear();
                for v in &mut vcpus {
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
                let decision = engine.place(t / NS_PER_MS, &loads)?;
                migrations += decision.moves() as u64;
                for (i, assignment) in decision.assignments.iter().enumerate() {
                    let tid = i as i32 + 1;
                    if executor.current().get(&tid) != Some(&assignment.cpus) {
                        executor.apply(tid, &assignment.cpus)?;
                    }
                    let cpu = host.dense(&executor.read(tid)?)?;
                    let v = &mut vcpus[i];
                    if v.cpu != NO_CPU && v.cpu != cpu {
                        v.warmup_ns += if host.cpu_pkg[v.cpu] == host.cpu_pkg[cpu] {
                            same_cost
                        } else {
                            cross_cost
                        };
                    }
                    v.cpu = cpu;
                }
            }
            ticks += 1;
        }

        // 1. Arrivals.
        for v in &mut vcpus {
            let vm = &mut vm_state[v.vm];
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
            } else if !was && engine.is_none() {
                // 2. Unpinned wake-up: a random idle CPU anywhere.
                v.displace_at_ns = f64::NAN; // marks "just woke", placed below
            }
        }

        // 2. Run queues.
        for q in &mut runq {
            q.clear();
        }
        if engine.is_none() {
            unpinned_place(
                &mut vcpus,
                &host,
                &mut runq,
                &mut idle_cpus,
                &mut host_rng,
                t as f64,
                residency_ns,
                same_cost,
                cross_cost,
                &mut migrations,
            );
        } else {
            for (i, v) in vcpus.iter().enumerate() {
                if v.runnable && v.cpu != NO_CPU {
                    runq[v.cpu].push(i);
                }
            }
        }

        // Cache factor per vCPU: the share of its VM's other vCPUs elsewhere.
        vm_pkg_count.iter_mut().for_each(|c| *c = 0);
        vm_placed.iter_mut().for_each(|c| *c = 0);
        for v in &vcpus {
            if v.cpu != NO_CPU {
                vm_pkg_count[v.vm * num_pkgs + host.cpu_pkg[v.cpu]] += 1;
                vm_placed[v.vm] += 1;
            }
        }
        for (i, v) in vcpus.iter().enumerate() {
            speed[i] = if v.cpu == NO_CPU || vm_placed[v.vm] <= 1 {
                1.0
            } else {
                let others = f64::from(vm_placed[v.vm] - 1);
                let same = f64::from(vm_pkg_count[v.vm * num_pkgs + host.cpu_pkg[v.cpu]] - 1);
                1.0 / (1.0 + config.cache_sharing_speedup * (others - same) / others)
            };
        }

        // 3. Service: SMT sharing per core, time slicing per CPU.
        core_busy_threads.iter_mut().for_each(|c| *c = 0);
        for (c, q) in runq.iter().enumerate() {
            if !q.is_empty() {
                core_busy_threads[host.cpu_core[c]] += 1;
            }
        }
        for (c, q) in runq.iter().enumerate() {
            cpu_busy[c] = 0.0;
            if q.is_empty() {
                continue;
            }
            let share = f64::from(thread_share(
                host.cpu_capacity[c],
                host.cpu_threads[c],
                core_busy_threads[host.cpu_core[c]],
            )) / f64::from(CAPACITY_SCALE);
            fill.clear();
            for &i in q {
                let v = &vcpus[i];
                let rate = share * speed[i];
                fill.push((v.warmup_ns + v.backlog_ns / rate, i));
            }
            fill.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut left = dt;
            let mut count = fill.len();
            let mut used = 0.0;
            for &(need, i) in &fill {
                let slice = (left / count as f64).min(need);
                left -= slice;
                count -= 1;
                used += slice;
                let v = &mut vcpus[i];
                let warm = slice.min(v.warmup_ns);
                v.warmup_ns -= warm;
                let work = ((slice - warm) * share * speed[i]).min(v.backlog_ns);
                v.backlog_ns -= work;
                work_done_ns += work;
                v.busy_ns += slice;
                v.tick_busy_ns += slice;
                v.tick_pkg_ns[host.cpu_pkg[c]] += slice;
                if v.backlog_ns < EMPTY_BACKLOG_NS {
                    // Done within the step: halted for the rest of it.
                    v.idle_ns += dt - slice;
                }
            }
            cpu_busy[c] = (used / dt).min(1.0);
        }
        for v in &mut vcpus {
            if !v.runnable {
                v.idle_ns += dt;
            }
        }

        // 5. Power and package idle time.
        let mut power = config.power.platform_w;
        for (p, cores) in host.pkg_cores.iter().enumerate() {
            let mut awake = 0.0f64;
            let mut cores_w = 0.0;
            for &core in cores {
                thread_busy.clear();
                thread_busy.extend(host.core_cpus[core].iter().map(|&c| cpu_busy[c]));
                thread_overlap(&thread_busy, &mut overlap);
                awake = awake.max(overlap.first().copied().unwrap_or(0.0));
                cores_w += config.power.core_power(&overlap);
            }
            power += config.power.package_base_power(awake) + cores_w;
            pkg_idle_ns[p] += (1.0 - awake) * dt;
        }
        energy_j += power * dt * 1e-9;

        t += step_ns;

        // Jobs done?
        for vm in &mut vm_state {
            if vm.done_s.is_none() && vm.remaining_ns.is_some_and(|r| r < EMPTY_BACKLOG_NS) {
                let drained = vcpus[vm.first..vm.first + vm.count]
                    .iter()
                    .all(|v| v.backlog_ns < EMPTY_BACKLOG_NS);
                if drained {
                    vm.done_s = Some(t as f64 * 1e-9);
                }
            }
        }
        let jobs_done = has_jobs
            && vm_state
                .iter()
                .all(|vm| vm.remaining_ns.is_none() || vm.done_s.is_some());
        if t >= next_progress_ns {
            next_progress_ns += 1_000 * NS_PER_MS;
            progress(Progress {
                simulated_s: t as f64 * 1e-9,
                limit_s: limit_ns as f64 * 1e-9,
                work_fraction: has_jobs.then(|| (work_done_ns / total_job_ns).min(1.0)),
            });
        }
        if jobs_done || t >= limit_ns {
            break;
        }
    }
    let partial = t % tick_ns;
    record_tick(
        &mut timeline,
        &mut vcpus,
        &host,
        if partial == 0 { tick_ns } else { partial } as f64,
    );
    let elapsed_ns = t as f64;
    Ok(RunResult {
        placement,
        package_ids: host.package_ids.clone(),
        elapsed_s: elapsed_ns * 1e-9,
        has_jobs,
        finished: vm_state
            .iter()
            .all(|vm| vm.remaining_ns.is_none() || vm.done_s.is_some()),
        vm_done_s: vm_state.iter().map(|vm| vm.done_s).collect(),
        work_done_s: work_done_ns * 1e-9,
        backlog_s: vcpus.iter().map(|v| v.backlog_ns).sum::<f64>() * 1e-9,
        package_idle: pkg_idle_ns.iter().map(|ns| ns / elapsed_ns).collect(),
        energy_j,
        migrations,
        ticks,
        timeline,
    })
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

/// The unpinned baseline's host scheduler for one step (module docs): fills
/// `runq` with every runnable vCPU, moving woken, stacked and displaced ones.
#[allow(clippy::too_many_arguments)]
fn unpinned_place(
    vcpus: &mut [Vcpu],
    host: &Host,
    runq: &mut [Vec<usize>],
    idle_cpus: &mut Vec<usize>,
    rng: &mut Rng,
    now_ns: f64,
    residency_ns: f64,
    same_cost: f64,
    cross_cost: f64,
    migrations: &mut u64,
) {
    let move_to = |v: &mut Vcpu, cpu: usize, rng: &mut Rng, migrations: &mut u64| {
        if v.cpu != NO_CPU && v.cpu != cpu {
            *migrations += 1;
            v.warmup_ns += if host.cpu_pkg[v.cpu] == host.cpu_pkg[cpu] {
                same_cost
            } else {
                cross_cost
            };
        }
        v.cpu = cpu;
        v.displace_at_ns = now_ns + rng.exponential(residency_ns);
    };
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
        move_to(v, cpu, rng, migrations);
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
                    move_to(&mut vcpus[i], target, rng, migrations);
                    runq[target].push(i);
                    continue;
                }
                vcpus[i].displace_at_ns = now_ns + rng.exponential(residency_ns);
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
                move_to(&mut vcpus[i], target, rng, migrations);
                runq[target].push(i);
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
