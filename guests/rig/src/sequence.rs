//! Several pvmm runs in one L1 boot: the placement tests and `cargo xtask bench-placement`
//! compare policies on the same L1, and booting L1 once (about 5-10 s of TCG) instead of once
//! per run keeps them short.
//!
//! Each run gets its own guest command and pvmm arguments; the probe (if any) runs alongside
//! each pvmm with `PVMM_PID` and `PVMM_RUN_LABEL` set. [`crate::RigOutcome::run`] splits the
//! output by run.

use std::time::Duration;

use crate::guest_kernel::GuestKernel;
use crate::images::L1Images;
use crate::rig::{
    guest_cmdline, inner_vmm_command, run_l1, vm_shape, InnerVmm, KernelForm, L1Job, L1Options,
    RigError, RigOutcome, Topology,
};
use crate::scripts::{shell_join, shell_quote};
use crate::tuning::L1Tuning;
use crate::workspace::Workspace;

/// One pvmm run of a sequence.
#[derive(Debug, Clone)]
pub struct PvmmRun {
    /// Label (letters, digits, `-`, `_`, `.`, `:`): the `rig_run` label and `PVMM_RUN_LABEL`.
    pub label: String,
    /// pvmm's arguments (without `--initrd`, `--cmdline` and the kernel).
    pub pvmm_args: Vec<String>,
    /// The guest's command.
    pub guest_command: String,
}

/// Host seconds an L1 boot may take before its first run starts (L1's kernel and init, and
/// starting the first inner VMM and probe), on top of its runs' own limits: each run's limit
/// is counted on L1's clock from the inner VMM's start, so a boot limit of the runs' limits
/// alone would cut a slow boot's last run short of its own limit.
pub const L1_BOOT_SECS: u64 = 120;

/// How to run a sequence.
#[derive(Debug, Clone)]
pub struct SequenceOptions {
    /// L1's topology.
    pub topology: Topology,
    /// Hard limit for the whole L1 boot.
    pub timeout: Duration,
    /// Per-run limit in L1 (pvmm is killed after it; 0: none).
    pub run_limit_secs: u64,
    /// Print classified lines as they arrive.
    pub echo: bool,
    /// Print the rig's events as they arrive (see [`L1Options::progress`]).
    pub progress: bool,
    /// The L1 probe script run alongside each pvmm.
    pub probe: Option<String>,
    /// QEMU's and L1's settings.
    pub tuning: L1Tuning,
    /// The kernel every run's guest boots (the L1 images must hold it).
    pub guest_kernel: GuestKernel,
}

/// Whether `label` may label a run in L1: letters, digits, `-`, `_`, `.`, `:` (it names files
/// and tags lines there).
pub(crate) fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// Boots L1 once and runs pvmm for each of `runs`, in order.
pub fn run_pvmm_sequence(
    ws: &Workspace,
    images: &L1Images,
    options: &SequenceOptions,
    runs: &[PvmmRun],
) -> Result<RigOutcome, RigError> {
    if images.pvmm.is_none() {
        return Err(RigError::BadArgs(
            "the L1 images were built without pvmm".into(),
        ));
    }
    let mut script = String::new();
    let mut memory = 0;
    for run in runs {
        if !valid_label(&run.label) {
            return Err(RigError::BadArgs(format!(
                "invalid run label '{}': use letters, digits, '-', '_', '.', ':'",
                run.label
            )));
        }
        let cmdline = guest_cmdline(
            InnerVmm::Pvmm,
            options.guest_kernel,
            Some(&run.guest_command),
            false,
        )?;
        let command = inner_vmm_command(
            InnerVmm::Pvmm,
            options.guest_kernel,
            KernelForm::BzImage,
            &run.pvmm_args,
            &cmdline,
        )?;
        memory = memory.max(vm_shape(&run.pvmm_args)?.1);
        script.push_str(&format!(
            "export PVMM_RUN_LABEL={label}\nrig_run {label} {limit} {command}\n",
            label = shell_quote(&run.label),
            limit = options.run_limit_secs,
            command = shell_join(&command)
        ));
    }
    let job = L1Job {
        script,
        probe: options.probe.clone(),
        guest_memory_mib: memory,
        guest_kernel: options.guest_kernel,
    };
    let l1 = L1Options {
        topology: options.topology,
        timeout: options.timeout,
        echo: options.echo,
        progress: options.progress,
        tuning: options.tuning.clone(),
        vmm_name: "pvmm",
        vm_names: Vec::new(),
    };
    run_l1(ws, images, &l1, &job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(valid_label("performance-n2"));
        assert!(valid_label("powersaving:2"));
        assert!(!valid_label("a b"));
        assert!(!valid_label(""));
        assert!(!valid_label("x;y"));
    }
}
