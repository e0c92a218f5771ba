//! Trace-driven simulator for pvmm's placement engine (`pvmm-sim`): runs the
//! engine over synthetic or recorded vCPU load and reports time, package idle,
//! energy and power per policy, in the format of the kernbench tables of
//! "Re: [PATCH v7 0/8] Tunable sched_mc_power_savings=n" (Vaidyanathan
//! Srinivasan, LKML, 2008-12-30).
//!
//! The simulator has no placement logic: every placement tick it feeds
//! simulated busy/idle counters through the same
//! [`pvmm_scheduler::UtilTracker`] the live VMM uses, calls
//! [`pvmm_scheduler::Engine::place`] for all vCPUs and applies the decision
//! through a [`pvmm_scheduler::RecordingExecutor`] ([`run`] describes the
//! loop). Only the `unpinned` baseline, which stands for "no pvmm at all",
//! models a host scheduler instead.
//!
//! - [`load`]: per-vCPU load generators (constant, duty cycle, bursty, ramp);
//! - [`trace`]: trace files (format documented there);
//! - [`spec`]: VM descriptions (`--vm vcpus=4,load=bursty:20/50,work=60`);
//! - [`run`]: the simulation loop, work accounting, cache sharing, migration
//!   cost and the unpinned baseline, with the power model of
//!   [`pvmm_scheduler::power`];
//! - [`report`]: the result tables;
//! - [`svg`]: timelines of which package each vCPU ran on;
//! - [`bound`]: the clairvoyant bound, the least energy any placement could use;
//! - [`scenario`]: the kernbench scenario of the sched_mc_power_savings thread
//!   and Len Brown's busy loops;
//! - [`cli`]: the `pvmm-sim` command line.

pub mod bound;
pub mod cli;
pub mod load;
pub mod report;
pub mod run;
pub mod scenario;
pub mod spec;
pub mod svg;
pub mod trace;

#[cfg(test)]
mod tests;

pub use bound::{clairvoyant, Bound};
pub use load::LoadSpec;
pub use pvmm_scheduler::power::PowerModel;
pub use report::format_table;
pub use run::{simulate, Placement, Progress, RunResult, SimConfig, SimError, Timeline};
pub use spec::VmSpec;
pub use trace::Trace;
