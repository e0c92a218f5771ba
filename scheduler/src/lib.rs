//! pvmm's placement engine: which host CPUs each vCPU thread may run on.
//!
//! This crate has no KVM, CLI or JSON dependency. The live VMM (`pvmm`), the
//! host daemon (`pvmm-host`) and the trace-driven simulator (`pvmm-sim`, crate
//! `scheduler/sim`) run the same placement code:
//!
//! - [`topology`]: the host's packages, dies, cores and threads (sysfs, spec, file);
//! - [`capacity`]: the 1024 capacity scale, SMT sharing, the fit rule's margins;
//! - [`util`]: PELT-style vCPU utilization from idle counters;
//! - [`policy`]: `performance`, `balance`, `powersaving[:1|2]`;
//! - [`placement`]: the [`Engine`] that turns loads into a [`Decision`];
//! - [`executor`]: applying a decision with `sched_setaffinity`;
//! - [`power`]: the package power model that turns package, core and thread
//!   activity into watts (the simulator's and the rig benchmark's energy);
//! - [`table`]: the text tables every program built on the engine prints.

pub mod capacity;
pub mod cpuset;
pub mod executor;
pub mod placement;
pub mod policy;
pub mod power;
pub mod table;
pub mod topology;
pub mod util;

pub use cpuset::CpuSet;
pub use executor::{Executor, ExecutorError, LinuxExecutor, RecordingExecutor};
pub use placement::{
    Assignment, Decision, Engine, EngineConfig, Migration, PlaceError, VcpuId, VcpuLoad,
};
pub use policy::{PlacementPolicy, Policy, DEFAULT_POLICY};
pub use topology::{
    parse_host_topology_arg, parse_spec, HostCpu, HostTopology, SpecCounts, TopologyError,
};
pub use util::{IdleAccumulator, IdleSample, LoadTracker, UtilConfig, UtilTracker};
