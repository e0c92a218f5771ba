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
mod priority;
mod spec;
mod stall;

pub use crate::error::RigError;
pub use crate::guest_kernel::KernelForm;

pub use builder::{
    combined_status, root_disk_path, tap_network, Rig, TapNetwork, DEFAULT_TIMEOUT,
    SINGLE_RUN_LABEL,
};
pub use console::soft_lockup_seconds;
pub use l1::{l1_memory_mib, run_l1, L1Job, L1Options, L1_CMDLINE};
pub use outcome::{
    RigEnd, RigEvent, RigOutcome, RunLines, RunOutput, RunStart, EXIT_RIG_FAILURE, EXIT_TIMEOUT,
    L1_LOCKUP_LIMIT, L1_PANIC_MARK, L1_SILENCE_LIMIT, POWEROFF_GRACE, QEMU_SIGNAL_MARK,
};
pub use spec::{
    guest_cmdline, inner_vmm_command, qemu_virtio_args, vm_shape, with_params, InnerVmm, Topology,
    VmSpec, GUEST_BASE_CMDLINE, GUEST_EARLY_CONSOLE, MAX_GUEST_CMDLINE, PVMM_DEFAULT_MEMORY_MIB,
    PVMM_DEFAULT_VCPUS,
};
pub use stall::STALL_SAMPLE;
