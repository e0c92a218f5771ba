//! Model-specific registers KVM does not know. pvmm asks KVM to hand accesses to them to the
//! VMM (`KVM_CAP_X86_USER_SPACE_MSR`, reason "unknown") instead of faulting the guest at once,
//! and answers the one a power-aware guest touches:
//!
//! - [`MSR_AMD_PERF_CTL`], AMD's P-state control. Linux's amd-pstate driver writes P0 to it on
//!   each CPU as it starts (`amd_perf_ctl_reset`), in its shared-memory CPPC mode too, which is
//!   the mode a KVM guest runs on pvmm's `_CPC`. KVM emulates no P-state registers; unanswered,
//!   the write faults and the guest logs an "unchecked MSR access error" stack trace each boot.
//!   A vCPU's performance is the share of a host CPU pvmm's placement gives it, published
//!   through CPPC; a P-state request has nothing to act on, so writes are accepted and dropped
//!   and reads give P0 (0).
//!
//! Every other unknown MSR gets the #GP it would get without the exits.

/// AMD's P-state control register (Linux's `MSR_AMD_PERF_CTL`).
pub const MSR_AMD_PERF_CTL: u32 = 0xc001_0062;

/// The value a guest reads from unknown MSR `index`, or `None` to fault the read.
pub fn read(index: u32) -> Option<u64> {
    (index == MSR_AMD_PERF_CTL).then_some(0)
}

/// Whether a guest's write to unknown MSR `index` is taken (and dropped); `false` faults it.
pub fn write(index: u32) -> bool {
    index == MSR_AMD_PERF_CTL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_p_state_control_is_answered() {
        assert_eq!(read(MSR_AMD_PERF_CTL), Some(0));
        assert!(write(MSR_AMD_PERF_CTL));
        assert_eq!(read(MSR_AMD_PERF_CTL + 1), None);
        assert!(!write(MSR_AMD_PERF_CTL + 1));
    }
}
