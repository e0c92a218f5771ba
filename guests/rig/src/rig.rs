//! Running the QEMU-nested rig: QEMU (TCG, an emulated multi-socket AMD CPU with SVM) boots
//! L1, L1 loads KVM and runs the inner VMM (pvmm, or QEMU with KVM) on the guest images.
//!
//! The host side classifies L1's console lines by the tags the L1 scripts put on them (see
//! [`crate::scripts`]), enforces a hard timeout (it kills QEMU), and detects L1 hanging at
//! power-off after the inner VMM has already reported its exit status.

mod builder;
mod console;
mod l1;
mod outcome;
mod spec;
mod stall;

use std::path::PathBuf;

use crate::cpio::CpioError;
use crate::images::{ImageError, QEMU};

pub use builder::{combined_status, Rig, DEFAULT_TIMEOUT, SINGLE_RUN_LABEL};
pub use console::soft_lockup_seconds;
pub use l1::{l1_memory_mib, run_l1, L1Job, L1Options, L1_CMDLINE};
pub use outcome::{
    RigEnd, RigEvent, RigOutcome, RunLines, RunOutput, RunStart, EXIT_RIG_FAILURE, EXIT_TIMEOUT,
    L1_LOCKUP_LIMIT, L1_PANIC_MARK, L1_SILENCE_LIMIT, POWEROFF_GRACE, QEMU_SIGNAL_MARK,
};
pub use spec::{
    guest_cmdline, inner_vmm_command, vm_shape, InnerVmm, KernelForm, Topology, VmSpec,
    GUEST_BASE_CMDLINE, GUEST_EARLY_CONSOLE, MAX_GUEST_CMDLINE, PVMM_DEFAULT_MEMORY_MIB,
    PVMM_DEFAULT_VCPUS,
};
pub use stall::STALL_SAMPLE;

/// Errors that keep a rig run from starting or finishing.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("invalid topology '{0}': expected SxCxT, e.g. 2x2x1, each 1-64")]
    BadTopology(String),
    #[error("{0}")]
    BadArgs(String),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Cpio(#[from] CpioError),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {QEMU}: {0} (install the Debian package qemu-system-x86)")]
    Spawn(std::io::Error),
}
