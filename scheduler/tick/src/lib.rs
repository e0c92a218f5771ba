//! pvmm's live placement loop, and what it reads of the host.
//!
//! - [`tick`]: the loop itself: sample, decide, apply, publish, report, over any
//!   [`Members`] (one pvmm VM, every VM on a host, or the simulator's threads);
//! - [`phase`]: the loop's totals and its per-phase timer;
//! - [`procfs`]: a thread's scheduler accounting (schedstat) and last CPU (stat), read from
//!   files kept open;
//! - [`cpustat`]: each host CPU's idle time from `/proc/stat`, for how idle a package really was;
//! - [`hotplug`]: following host CPUs that go offline and come back;
//! - [`settings`]: the loop's command-line settings, their defaults and bounds;
//! - [`own_threads`]: keeping a process's housekeeping threads on the package that holds vCPUs.

pub mod cpustat;
pub mod hotplug;
pub mod own_threads;
pub mod phase;
pub mod procfs;
pub mod settings;
pub mod tick;

pub use phase::{boot_clock_ns, PhaseClock, PhaseTimer, PhaseTimes, Totals};
pub use tick::{Applied, Control, Members, Outside, Tick, TickReport};
