//! What a run measured, and its progress while it runs.

use pvmm_scheduler::placement::VcpuId;

use super::Placement;

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
