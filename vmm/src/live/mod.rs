//! Live vCPU placement: the guest's idleness drives where pvmm's vCPU threads may run.
//!
//! - [`idle`]: the idle signal per vCPU, from KVM stats or, as a fallback, /proc run time.
//! - [`scheduler`]: the tick loop running the scheduler crate's engine and applying affinity.
//! - [`capacity`]: publishing each vCPU's capacity to the guest (CPPC) and notifying it.
//! - [`control`]: policy changes and outside placement from the control socket.

pub mod capacity;
pub mod control;
pub mod idle;
pub mod scheduler;
