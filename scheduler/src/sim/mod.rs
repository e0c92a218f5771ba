//! Trace-driven simulator: runs the placement engine over synthetic or
//! recorded vCPU load and reports time, package idle, energy and power per
//! policy, as the seeds' tables do (`pvmm-sim`).
//!
//! The simulator has no placement logic: every placement tick it feeds
//! simulated busy/idle counters through the same [`crate::UtilTracker`] the
//! live VMM uses, calls [`crate::Engine::place`] for all vCPUs and applies the
//! decision through a [`crate::RecordingExecutor`] ([`run`] describes the
//! loop). Only the `unpinned` baseline, which stands for "no pvmm at all",
//! models a host scheduler instead.
//!
//! - [`load`]: per-vCPU load generators (constant, duty cycle, bursty, ramp);
//! - [`trace`]: trace files (format documented there);
//! - [`spec`]: VM descriptions (`--vm vcpus=4,load=bursty:20/50,work=60`);
//! - [`power`]: the package power model and where its defaults come from;
//! - [`run`]: the simulation loop, work accounting, cache sharing, migration
//!   cost and the unpinned baseline;
//! - [`report`]: tables in the seeds' format;
//! - [`svg`]: timelines of which package each vCPU ran on;
//! - [`scenario`]: the seeds' kernbench scenario;
//! - [`cli`]: the `pvmm-sim` command line.

pub mod cli;
pub mod load;
pub mod power;
pub mod report;
pub mod run;
pub mod scenario;
pub mod spec;
pub mod svg;
pub mod trace;

#[cfg(test)]
mod tests;

pub use load::LoadSpec;
pub use power::PowerModel;
pub use report::format_table;
pub use run::{simulate, Placement, Progress, RunResult, SimConfig, SimError, Timeline};
pub use spec::VmSpec;
pub use trace::Trace;
