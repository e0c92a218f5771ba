//! The placement loop's settings that pvmm and `pvmm-host` both take on their command lines,
//! with their defaults and bounds, so that the two tools accept and document them alike.

/// `--share-package`'s help, pvmm's and `pvmm-host`'s.
pub const SHARE_PACKAGE_HELP: &str = "Under balance and powersaving, let each vCPU run on every \
CPU its package uses, not only on its own, so that a vCPU waking while its CPU is busy runs on \
an idle one beside it";

/// `--host-topology`'s default: read the host's topology from sysfs.
pub const DEFAULT_HOST_TOPOLOGY: &str = "auto";

/// Default placement tick: the engine's ([`pvmm_scheduler::placement::DEFAULT_TICK_MS`]).
pub const DEFAULT_TICK_MS: u64 = pvmm_scheduler::placement::DEFAULT_TICK_MS;
/// Shortest tick accepted: below 10 ms the decayed utilization (32 ms half-life) barely moves
/// between decisions and affinity changes would outpace the host scheduler.
pub const MIN_TICK_MS: u64 = 10;
/// Longest tick accepted: one minute.
pub const MAX_TICK_MS: u64 = 60_000;
