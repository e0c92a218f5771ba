//! How a pvmm run ends, and the exit status each ending maps to.
//!
//! | status | meaning |
//! |---|---|
//! | 0 | the guest powered off |
//! | 1 | a host-side failure after start (KVM or the OS refused something) |
//! | 2 | bad input: flags, files, /dev/kvm missing or unusable |
//! | 3 | the guest asked for a reboot (pvmm does not restart guests) |
//! | 4 | the guest triple-faulted (a crash before its exception handlers work) |
//! | 5 | KVM could not run the guest (internal error, failed VM entry, crash event) |
//! | 6 | stopped through the control socket: the guest did not power off in time |
//! | 159 | a pvmm thread made a system call its seccomp filter forbids ([`crate::seccomp`]) |

/// Exit status: the guest powered off.
pub const EXIT_POWER_OFF: i32 = 0;
/// Exit status: a host failure after the VM started, or during setup for reasons not the
/// user's input.
pub const EXIT_HOST_ERROR: i32 = 1;
/// Exit status: bad input (the clap convention for usage errors).
pub const EXIT_BAD_INPUT: i32 = pvmm_api::tool::EXIT_BAD_INPUT as i32;
/// Exit status: the guest rebooted.
pub const EXIT_GUEST_RESET: i32 = 3;
/// Exit status: triple fault.
pub const EXIT_TRIPLE_FAULT: i32 = 4;
/// Exit status: KVM internal error.
pub const EXIT_KVM_ERROR: i32 = 5;
/// Exit status: the VMM stopped the VM on request because the guest did not power off.
pub const EXIT_STOPPED: i32 = 6;
/// Exit status: a thread made a system call that its seccomp filter forbids (`--seccomp kill`).
/// 128 + 31 (`SIGSYS`): what a shell reports for a process killed by `SIGSYS`, which is what
/// happens where pvmm's handler cannot run.
pub const EXIT_SECCOMP: i32 = 128 + libc::SIGSYS;

/// `text` with its control characters escaped (a newline in a flag's value or a file name
/// becomes `\n`), so that an error line pvmm prints stays one line.
pub fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Why the VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest entered S5.
    PowerOff,
    /// The guest asked for a reset.
    Reset,
    /// A vCPU triple-faulted.
    TripleFault {
        /// Which vCPU.
        vcpu: u32,
        /// Its registers when KVM reported the shutdown (`rip`, control registers, IDT),
        /// for the bug report; empty when they could not be read.
        state: String,
    },
    /// KVM refused or failed to run the guest.
    KvmError(String),
    /// The host failed (ioctl, thread).
    HostError(String),
    /// A shutdown request's time ran out (or the guest does not listen for the power
    /// button), and pvmm stopped the VM.
    Stopped,
}

impl VmExit {
    /// The process exit status for this ending.
    pub fn status(&self) -> i32 {
        match self {
            VmExit::PowerOff => EXIT_POWER_OFF,
            VmExit::Reset => EXIT_GUEST_RESET,
            VmExit::TripleFault { .. } => EXIT_TRIPLE_FAULT,
            VmExit::KvmError(_) => EXIT_KVM_ERROR,
            VmExit::HostError(_) => EXIT_HOST_ERROR,
            VmExit::Stopped => EXIT_STOPPED,
        }
    }

    /// One line saying why, for stderr.
    pub fn reason(&self) -> String {
        match self {
            VmExit::PowerOff => "guest powered off".into(),
            VmExit::Reset => "guest requested a reboot; pvmm does not restart guests".into(),
            VmExit::TripleFault { vcpu, state } if state.is_empty() => {
                format!("guest triple fault on vCPU {vcpu}")
            }
            VmExit::TripleFault { vcpu, state } => {
                format!("guest triple fault on vCPU {vcpu} ({state})")
            }
            VmExit::KvmError(s) => s.clone(),
            VmExit::HostError(s) => s.clone(),
            VmExit::Stopped => {
                "stopped on request: the guest did not power off within the shutdown timeout".into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_is_one_line() {
        assert_eq!(printable("2-3"), "2-3");
        assert_eq!(printable("a\nb\tc\u{7}"), "a\\nb\\tc\\u{7}");
        assert_eq!(printable("größe"), "größe");
    }

    #[test]
    fn statuses_are_distinct() {
        let all = [
            VmExit::PowerOff,
            VmExit::Reset,
            VmExit::TripleFault {
                vcpu: 0,
                state: String::new(),
            },
            VmExit::KvmError(String::new()),
            VmExit::HostError(String::new()),
            VmExit::Stopped,
        ];
        let mut s: Vec<i32> = all.iter().map(VmExit::status).collect();
        s.push(EXIT_BAD_INPUT);
        s.push(EXIT_SECCOMP);
        let n = s.len();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), n);
        assert_eq!(VmExit::PowerOff.status(), 0);
    }
}
