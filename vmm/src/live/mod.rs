//! Live vCPU placement: the guest's idleness drives where pvmm's vCPU threads may run.
//!
//! - [`idle`]: the idle signal per vCPU, from KVM stats or, as a fallback, /proc run time.
//! - [`scheduler`]: the tick loop running the scheduler crate's engine and applying affinity.
//! - [`capacity`]: publishing each vCPU's capacity to the guest (CPPC) and notifying it.
//! - [`hoststat`]: host per-CPU idle from /proc/stat for the exit summary.
//! - [`hotplug`]: following host CPUs that go offline and come back.
//! - [`control`]: policy changes and outside placement from the control socket.
//! - [`own_threads`]: keeping pvmm's own threads on the package that holds vCPUs.

pub mod capacity;
pub mod control;
pub mod hoststat;
pub mod hotplug;
pub mod idle;
pub mod own_threads;
pub mod scheduler;
