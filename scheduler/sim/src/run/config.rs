//! What a run is given: who places the vCPUs, the simulation settings and
//! their defaults, and the errors a run can end with.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use pvmm_scheduler::executor::ExecutorError;
use pvmm_scheduler::placement::{EngineConfig, PlaceError};
use pvmm_scheduler::policy::Policy;
use pvmm_scheduler::power::PowerModel;
use pvmm_scheduler::util::UtilConfig;

/// Default placement tick (ms): the engine's, which pvmm uses too, so the simulator decides as
/// often as pvmm does.
pub const DEFAULT_TICK_MS: u64 = pvmm_scheduler::placement::DEFAULT_TICK_MS;

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
    /// Packing at every work step with instant knowledge of the load and free
    /// migrations (module `oracle`).
    Oracle,
}

impl Placement {
    /// Every placement the reports compare: the engine's four policies, the
    /// unpinned baseline and the oracle, `performance` first (the reference).
    pub const ALL: [Placement; 6] = [
        Placement::Engine(Policy::Performance),
        Placement::Engine(Policy::Balance),
        Placement::Engine(Policy::Powersaving { level: 1 }),
        Placement::Engine(Policy::Powersaving { level: 2 }),
        Placement::Unpinned,
        Placement::Oracle,
    ];
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Engine(policy) => write!(f, "{policy}"),
            Placement::Unpinned => f.write_str("unpinned"),
            Placement::Oracle => f.write_str("oracle"),
        }
    }
}

impl FromStr for Placement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s {
            "unpinned" => return Ok(Placement::Unpinned),
            "oracle" => return Ok(Placement::Oracle),
            _ => {}
        }
        s.parse::<Policy>().map(Placement::Engine).map_err(|_| {
            format!(
                "unknown policy '{s}' (expected performance, balance, powersaving, \
                 powersaving:1, powersaving:2, unpinned or oracle)"
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
