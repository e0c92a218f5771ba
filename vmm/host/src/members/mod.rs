//! The VMs a host daemon manages, and how each kind is read and placed.
//!
//! Every VM is a [`Member`]: the daemon reads its vCPUs each tick, gives the engine their
//! loads, and places what the engine decided, without knowing whose VM it is. What differs is
//! who sets the threads' affinity ([`Placer`]):
//!
//! - A pvmm VM ([`PvmmMember`]) is read from `/proc` ([`ThreadSampler`], its vCPU threads
//!   learnt once at join from `GET /v1/vcpus`), with no request per tick, and placed through
//!   its control socket (`PUT /v1/placement/external`, which also publishes the capacities to
//!   the guest through CPPC and renews the lease), sent when the assignments change and,
//!   unchanged, once a third of the lease has passed. pvmm keeps its own threads with its
//!   vCPUs.
//! - A foreign VM ([`ForeignMember`]) is read from `/proc` ([`ThreadSampler`]: each vCPU
//!   thread's schedstat, time wanted on a CPU; the rest is time blocked in the guest's halts)
//!   and placed by thread affinity, which the daemon sets and restores itself; its other
//!   threads are housekeeping, pinned to the active packages. Affinity is all such a VM gets:
//!   it has no CPPC registers pvmm could serve.
//!
//! Reading is kept apart from placing: [`ThreadSampler`] reads any process's vCPU threads
//! from `/proc`, given their ids, so every member is sampled there whoever places it.

mod foreign;
mod pvmm;
mod sampler;

use std::path::{Path, PathBuf};

use pvmm_api::stats::VmKind;
use pvmm_scheduler::CpuSet;

pub use foreign::ForeignMember;
pub use pvmm::{PvmmMember, RENEWALS_PER_LEASE};
pub use sampler::ThreadSampler;

/// One vCPU of a managed VM, as read at this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberVcpu {
    /// vCPU index.
    pub vcpu: u32,
    /// Its thread.
    pub tid: i32,
    /// Decayed utilization, 0..=1024.
    pub util: u32,
    /// Ran at least half of the last tick.
    pub busy: bool,
    /// The part of `util` spent waiting for a host CPU, 0..=1024.
    pub waited: u32,
}

/// One vCPU's placement as sent: (vCPU, CPUs, capacity).
pub type VcpuPlacement = (u32, CpuSet, u32);

/// Errors reading or placing a member.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The pvmm's control socket could not be used (the VM may have ended).
    #[error("{socket}: {why}")]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// What failed.
        why: String,
    },
    /// The pvmm answered but did not do what was asked (an error status, or a placement it
    /// did not take): it is still there, and is asked again at the next tick.
    #[error("{socket}: refused: {why}")]
    Refused {
        /// The socket.
        socket: PathBuf,
        /// What was refused, and pvmm's answer.
        why: String,
    },
    /// The VM's process (or its vCPU thread) is gone.
    #[error("process {pid} is gone")]
    Gone {
        /// Its pid.
        pid: i32,
    },
}

/// Who sets a member's threads' affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placer {
    /// Its VMM, as the daemon asks ([`Member::place`]); it also keeps its other threads.
    Vmm,
    /// The daemon: the engine's CPUs on its vCPU threads, the active packages on its
    /// housekeeping threads ([`Member::housekeeping`]), each thread's affinity before restored
    /// at release. An affinity the daemon did not set is an operator's pin
    /// ([`crate::operator`]).
    Daemon,
}

/// A VM the daemon manages.
pub trait Member: std::fmt::Debug {
    /// Whose VM it is, as the status shows.
    fn kind(&self) -> VmKind;

    /// Its stable name ([`crate::names`]).
    fn name(&self) -> &str;

    /// What the log says of it when it joins, as process `pid`.
    fn describe(&self, pid: i32) -> String;

    /// The control socket it was joined through, by which discovery knows it again; None for
    /// a VM found in `/proc`.
    fn socket(&self) -> Option<&Path> {
        None
    }

    /// The foreign VM it is, for discovery to follow its process; None for others.
    fn as_foreign_mut(&mut self) -> Option<&mut ForeignMember> {
        None
    }

    /// Reads its vCPUs at `now_ns` (the daemon's clock). An error is a VM that cannot be read
    /// (a pvmm VM whose process is gone): the daemon drops it until discovery finds it again.
    fn read(&mut self, now_ns: u64) -> Result<Vec<MemberVcpu>, MemberError>;

    /// Who sets its threads' affinity.
    fn placer(&self) -> Placer;

    /// Hands the engine's `assignments` for its vCPUs to its VMM ([`Placer::Vmm`]); a member
    /// the daemon places by affinity has nothing to send. [`MemberError::Refused`] leaves the
    /// member in place; any other error drops it until discovery joins it again.
    fn place(&mut self, _assignments: &[VcpuPlacement]) -> Result<(), MemberError> {
        Ok(())
    }

    /// Its threads other than vCPUs that the daemon keeps on the active packages
    /// ([`Placer::Daemon`]).
    fn housekeeping(&self) -> Vec<i32> {
        Vec::new()
    }

    /// Hands its placement back to its VMM ([`Placer::Vmm`]); the threads the daemon placed
    /// itself get their affinity back from the daemon.
    fn release(&mut self) -> Result<(), MemberError> {
        Ok(())
    }
}
