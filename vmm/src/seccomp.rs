//! Seccomp filters: one for each kind of thread in a pvmm VM process, written as Rust rules
//! and compiled to BPF by rust-vmm's `seccompiler`.
//!
//! Each thread installs its own filter as the first thing it does, before it handles anything
//! a guest or a client sends: a vCPU thread before its first `KVM_RUN`, the console thread
//! before it reads stdin, the control socket's thread before it accepts (its connection
//! threads inherit its filter), the scheduler and the signal thread before their first tick or
//! signal, and the main thread as the last step of [`crate::vmm::start`], once every other
//! thread exists (a filter is inherited by the threads a thread creates later).
//!
//! `--seccomp` chooses what a forbidden system call does:
//! - `kill` (the default): the call does not run; a `SIGSYS` handler prints one line
//!   (`pvmm: seccomp: thread vcpu0 (vcpu filter) made forbidden system call 110; stopping`)
//!   and ends the process with [`EXIT_SECCOMP`] (159, what a shell reports for a process
//!   killed by `SIGSYS`, which is also what happens should the handler be unable to run);
//! - `log`: the call runs and the kernel logs it (`SECCOMP_RET_LOG`: `dmesg` or
//!   `journalctl -k` show `audit: type=1326 ... comm="vcpu0" ... syscall=N`), to tune the
//!   filters;
//! - `off`: no filter.
//!
//! What every filter allows is in `common_rules`; what each kind adds is in `rules_for`.
//! Memory may be mapped and protected but never executable (`PROT_EXEC` is refused), no
//! thread may execute a program or create a process (only the control socket's thread may
//! create threads), `ioctl` is allowed only with the KVM requests each kind uses (and the
//! terminal query that Rust's standard library makes on stdin), and files may be opened for
//! reading only, except by the scheduler (its `--stats` file is open already) and the main
//! thread, which open nothing for writing either.
//!
//! The test hook `PVMM_SECCOMP_SELFTEST=<kind>` (one of [`ThreadKind::name`]) makes threads of
//! that kind call a forbidden system call (`getppid`) right after installing their filter, so
//! that tests can see what a violation does. It is not a flag and `--help` does not show it.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::str::FromStr;

use pvmm_devices::virtio::tap::TUNSETOFFLOAD;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iowr_nr};

use crate::exit::EXIT_SECCOMP;

/// The environment variable of the test hook (see the module documentation).
pub const SELFTEST_ENV: &str = "PVMM_SECCOMP_SELFTEST";
/// The system call the test hook makes: harmless, and allowed by no filter.
pub const SELFTEST_SYSCALL: i64 = libc::SYS_getppid;

const KVMIO: u32 = 0xAE;
ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_bindings::kvm_regs);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_bindings::kvm_sregs);
ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_bindings::kvm_irqchip);

/// What a forbidden system call does (`--seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeccompMode {
    /// No filters.
    Off,
    /// Forbidden calls run, and the kernel logs them.
    Log,
    /// A forbidden call ends pvmm with a one-line message and status [`EXIT_SECCOMP`].
    #[default]
    Kill,
}

impl FromStr for SeccompMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(SeccompMode::Off),
            "log" => Ok(SeccompMode::Log),
            "kill" => Ok(SeccompMode::Kill),
            other => Err(format!(
                "unknown seccomp mode {other:?}: use off, log or kill"
            )),
        }
    }
}

impl std::fmt::Display for SeccompMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SeccompMode::Off => "off",
            SeccompMode::Log => "log",
            SeccompMode::Kill => "kill",
        })
    }
}

/// The kinds of thread in a pvmm VM process, each with its own filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadKind {
    /// `vcpu<N>`: runs the guest and its device exits.
    Vcpu,
    /// `console-in`: copies stdin to the serial console.
    ConsoleInput,
    /// `pvmm-sched`: the placement ticks.
    Scheduler,
    /// `pvmm-api` and `pvmm-api-conn`: the control socket and its connections.
    Api,
    /// `pvmm-signals`: SIGTERM, SIGINT, SIGHUP.
    Signals,
    /// The main thread once the VM runs: waits for the end, stops the threads, exits.
    Main,
    /// `pvmm-blk<N>`, `pvmm-rng<N>`: a virtio device's worker.
    Device,
}

impl ThreadKind {
    /// Every kind.
    pub const ALL: [ThreadKind; 7] = [
        ThreadKind::Vcpu,
        ThreadKind::ConsoleInput,
        ThreadKind::Scheduler,
        ThreadKind::Api,
        ThreadKind::Signals,
        ThreadKind::Main,
        ThreadKind::Device,
    ];

    /// The filter's name, as messages and the test hook spell it.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::ConsoleInput => "console",
            ThreadKind::Scheduler => "scheduler",
            ThreadKind::Api => "api",
            ThreadKind::Signals => "signals",
            ThreadKind::Main => "main",
            ThreadKind::Device => "device",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl FromStr for ThreadKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        ThreadKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or(())
    }
}

/// Errors building or installing filters.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A filter could not be compiled (a bug in its rules).
    #[error("seccomp: cannot build the {kind} filter: {source}")]
    Build {
        /// The filter.
        kind: &'static str,
        /// Error.
        source: seccompiler::BackendError,
    },
    /// The kernel refused a filter.
    #[error(
        "seccomp: cannot install the {kind} filter: {source} (--seccomp off runs without filters)"
    )]
    Install {
        /// The filter.
        kind: &'static str,
        /// Error.
        source: seccompiler::Error,
    },
    /// The `SIGSYS` handler could not be installed.
    #[error("seccomp: cannot install the SIGSYS handler: {0}")]
    Handler(std::io::Error),
    /// `PVMM_SECCOMP_SELFTEST` names no filter.
    #[error("seccomp: {SELFTEST_ENV}={0:?} names no filter (vcpu, console, scheduler, api, signals, main)")]
    SelfTest(String),
}

/// Every thread kind's compiled filter, and the mode they were compiled for.
#[derive(Debug)]
pub struct SeccompFilters {
    mode: SeccompMode,
    /// Indexed by [`ThreadKind::index`]; empty when the mode is off.
    programs: Vec<BpfProgram>,
    selftest: Option<ThreadKind>,
}

impl SeccompFilters {
    /// Compiles every filter for `mode`; in kill mode also installs the process's `SIGSYS`
    /// handler. Reads the test hook's variable.
    pub fn new(mode: SeccompMode) -> Result<Self, SeccompError> {
        let selftest = match std::env::var(SELFTEST_ENV) {
            Ok(v) if !v.is_empty() => Some(
                v.parse::<ThreadKind>()
                    .map_err(|()| SeccompError::SelfTest(v))?,
            ),
            _ => None,
        };
        let mismatch = match mode {
            SeccompMode::Off => {
                return Ok(Self {
                    mode,
                    programs: Vec::new(),
                    selftest,
                })
            }
            SeccompMode::Log => SeccompAction::Log,
            SeccompMode::Kill => SeccompAction::Trap,
        };
        let programs = ThreadKind::ALL
            .into_iter()
            .map(|kind| compile(kind, mismatch.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        if mode == SeccompMode::Kill {
            install_sigsys_handler()?;
        }
        Ok(Self {
            mode,
            programs,
            selftest,
        })
    }

    /// No filters at all (`--seccomp off`).
    pub fn off() -> Self {
        Self {
            mode: SeccompMode::Off,
            programs: Vec::new(),
            selftest: None,
        }
    }

    /// The mode the filters were built for.
    pub fn mode(&self) -> SeccompMode {
        self.mode
    }

    /// Installs `kind`'s filter on the calling thread (nothing when the mode is off).
    pub fn apply(&self, kind: ThreadKind) -> Result<(), SeccompError> {
        let Some(program) = self.programs.get(kind.index()) else {
            return Ok(());
        };
        remember_thread(kind);
        seccompiler::apply_filter(program).map_err(|source| SeccompError::Install {
            kind: kind.name(),
            source,
        })?;
        if self.selftest == Some(kind) {
            // SAFETY: getppid has no preconditions; the filter forbids it, which is the test.
            unsafe { libc::syscall(SELFTEST_SYSCALL) };
        }
        Ok(())
    }

    /// [`apply`](Self::apply), or end pvmm with one line and status 1: a thread must not run
    /// unfiltered when filters were asked for.
    pub fn confine(&self, kind: ThreadKind) {
        if let Err(e) = self.apply(kind) {
            eprintln!("pvmm: {e}");
            std::process::exit(crate::exit::EXIT_HOST_ERROR);
        }
    }
}

/// The conditions of one rule, all of which must hold.
fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("a rule has at least one condition")
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
        .expect("argument index within 0..6")
}

/// `arg` is exactly `value` (compared as the 32-bit value the kernel reads, as for `ioctl`
/// requests and flags).
fn eq32(arg: u8, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .expect("argument index within 0..6")
}

/// `arg` has none of the bits of `mask`.
fn none_of(arg: u8, mask: u64) -> SeccompCondition {
    cond(arg, SeccompCmpOp::MaskedEq(mask), 0)
}

/// The rules of one filter: system call number to the rules any one of which allows it (an
/// empty list allows it whatever its arguments).
#[derive(Default)]
struct Rules(BTreeMap<i64, Vec<SeccompRule>>);

impl Rules {
    /// Allows each of `syscalls` whatever the arguments.
    fn allow(&mut self, syscalls: &[i64]) -> &mut Self {
        for s in syscalls {
            self.0.insert(*s, Vec::new());
        }
        self
    }

    /// Allows `syscall` when `rule` holds (unless it is allowed unconditionally already).
    fn allow_if(&mut self, syscall: i64, rule: SeccompRule) -> &mut Self {
        match self.0.get_mut(&syscall) {
            Some(rules) if rules.is_empty() => {}
            Some(rules) => rules.push(rule),
            None => {
                self.0.insert(syscall, vec![rule]);
            }
        }
        self
    }

    /// Allows `ioctl` with these requests only.
    fn ioctls(&mut self, requests: &[u64]) -> &mut Self {
        for r in requests {
            self.allow_if(libc::SYS_ioctl, rule(vec![eq32(1, *r)]));
        }
        self
    }

    /// Allows opening files for reading only (`/proc`, `/sys`), and reading them.
    fn open_read_only(&mut self) -> &mut Self {
        let writing = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;
        self.allow_if(libc::SYS_openat, rule(vec![none_of(2, writing)]))
            .allow(&[
                libc::SYS_read,
                libc::SYS_pread64,
                libc::SYS_lseek,
                libc::SYS_fstat,
                libc::SYS_newfstatat,
                libc::SYS_statx,
                libc::SYS_getdents64,
            ])
    }
}

/// What every thread of pvmm needs: memory (never executable), locks and waits, time, signal
/// handlers (signal-hook's runs on whichever thread the signal lands and writes to its
/// self-pipe), writing what is open already (stderr above all), and ending.
fn common_rules() -> Rules {
    let mut r = Rules::default();
    let exec = libc::PROT_EXEC as u64;
    r.allow(&[
        // Locks, channels, condition variables, joins.
        libc::SYS_futex,
        libc::SYS_sched_yield,
        // Time (normally the vDSO, without a system call) and sleeping.
        libc::SYS_clock_gettime,
        libc::SYS_clock_nanosleep,
        libc::SYS_nanosleep,
        libc::SYS_restart_syscall,
        // The allocator, and a thread's signal stack when it ends.
        libc::SYS_brk,
        libc::SYS_munmap,
        libc::SYS_madvise,
        libc::SYS_mremap,
        // Writing to what is open: stderr, stdout, eventfds, signal-hook's self-pipe.
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_sendto,
        libc::SYS_close,
        // Signals: handlers' return, masks, the handler stack of a thread's start and end.
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigprocmask,
        libc::SYS_sigaltstack,
        // Who am I (the tid for /proc paths; the pid for GET /v1/vm and signal-hook).
        libc::SYS_gettid,
        libc::SYS_getpid,
        // Randomness for hash maps.
        libc::SYS_getrandom,
        // Ending: a thread, or the process.
        libc::SYS_exit,
        libc::SYS_exit_group,
    ])
    .allow_if(libc::SYS_mmap, rule(vec![none_of(2, exec)]))
    .allow_if(libc::SYS_mprotect, rule(vec![none_of(2, exec)]));
    // Rust's standard library checks that a file descriptor is open before closing it.
    for op in [libc::F_GETFD, libc::F_GETFL] {
        r.allow_if(
            libc::SYS_fcntl,
            rule(vec![eq32(1, u64::from(op.unsigned_abs()))]),
        );
    }
    r
}

/// What each kind of thread needs beyond [`common_rules`].
fn rules_for(kind: ThreadKind) -> Rules {
    let mut r = common_rules();
    match kind {
        ThreadKind::Vcpu => {
            // KVM_RUN, and the registers a triple fault's report reads. The CPPC device reads
            // this thread's /proc/self/task/<tid>/schedstat for the guest's feedback counters.
            // A network card's driver, accepting its features or resetting it, sets the
            // offloads of its tap (TUNSETOFFLOAD) from this thread.
            r.ioctls(&[KVM_RUN(), KVM_GET_REGS(), KVM_GET_SREGS(), TUNSETOFFLOAD])
                .open_read_only();
        }
        ThreadKind::Device => {
            // Waits on its queues' notify eventfds and its stop eventfd, reads them; moves a
            // disk's sectors with positioned reads and writes, flushes with fdatasync; writes
            // its interrupt's eventfd. Entropy is getrandom, which every filter allows.
            r.allow(&[
                libc::SYS_epoll_wait,
                libc::SYS_epoll_pwait,
                libc::SYS_read,
                libc::SYS_pread64,
                libc::SYS_pwrite64,
                libc::SYS_fdatasync,
            ]);
        }
        ThreadKind::ConsoleInput => {
            // Waits for stdin (a terminal, a pipe, /dev/null) or the VM's stop eventfd, reads
            // stdin; writes the serial interrupt's eventfd.
            r.allow(&[libc::SYS_read, libc::SYS_poll, libc::SYS_ppoll]);
        }
        ThreadKind::Scheduler => {
            // Reads /proc, sysfs and the KVM statistics files; pins vCPU and pvmm threads;
            // reads whether the guest listens to the GED before announcing capacity changes.
            r.open_read_only()
                .allow(&[libc::SYS_sched_setaffinity, libc::SYS_sched_getaffinity])
                .ioctls(&[KVM_GET_IRQCHIP()]);
        }
        ThreadKind::Api => {
            // Accepts connections and serves each on a thread of its own (the only kind
            // allowed to create threads); kicks vCPU threads to pause and resume them; lists
            // the process's threads from /proc; reads whether the guest listens to the power
            // button.
            let thread_flags = (libc::CLONE_VM
                | libc::CLONE_FS
                | libc::CLONE_FILES
                | libc::CLONE_SIGHAND
                | libc::CLONE_THREAD
                | libc::CLONE_SYSVSEM) as u64;
            r.open_read_only()
                .allow(&[
                    libc::SYS_accept4,
                    libc::SYS_recvfrom,
                    libc::SYS_setsockopt,
                    libc::SYS_shutdown,
                    libc::SYS_tgkill,
                    // Starting a connection thread: clone3's flags are in memory, out of a
                    // filter's reach; clone's (glibc's fallback) must be a thread's.
                    libc::SYS_clone3,
                    libc::SYS_set_robust_list,
                    libc::SYS_rseq,
                    libc::SYS_sched_getaffinity,
                ])
                .allow_if(
                    libc::SYS_clone,
                    rule(vec![cond(
                        0,
                        SeccompCmpOp::MaskedEq(thread_flags),
                        thread_flags,
                    )]),
                )
                .allow_if(
                    libc::SYS_prctl,
                    rule(vec![eq32(0, libc::PR_SET_NAME as u64)]),
                )
                .ioctls(&[KVM_GET_IRQCHIP()]);
        }
        ThreadKind::Signals => {
            // Reads signal-hook's self-pipe; presses the power button and resumes paused
            // vCPUs (kicks); reads whether the guest listens to it.
            r.allow(&[libc::SYS_recvfrom, libc::SYS_tgkill])
                .ioctls(&[KVM_GET_IRQCHIP()]);
        }
        ThreadKind::Main => {
            // Waits for the end; stops the control socket (connecting to it to wake its
            // accept, then removing the file), the signal thread and the vCPUs (kicks); reads
            // /proc/stat for the summary line.
            r.open_read_only()
                .allow(&[
                    libc::SYS_connect,
                    libc::SYS_unlink,
                    libc::SYS_unlinkat,
                    libc::SYS_tgkill,
                ])
                .allow_if(libc::SYS_socket, rule(vec![eq32(0, libc::AF_UNIX as u64)]));
        }
    }
    r
}

fn compile(kind: ThreadKind, mismatch: SeccompAction) -> Result<BpfProgram, SeccompError> {
    let build = |source| SeccompError::Build {
        kind: kind.name(),
        source,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(build)?;
    let filter = SeccompFilter::new(rules_for(kind).0, mismatch, SeccompAction::Allow, arch)
        .map_err(build)?;
    BpfProgram::try_from(filter).map_err(build)
}

/// The bytes of the message the `SIGSYS` handler prints, up to the thread's name.
const MESSAGE_HEAD: &[u8] = b"pvmm: seccomp: thread ";

thread_local! {
    /// This thread's name and filter, for the `SIGSYS` handler (which may not allocate).
    static THREAD: Cell<([u8; 16], ThreadKind)> =
        const { Cell::new(([0; 16], ThreadKind::Main)) };
}

fn remember_thread(kind: ThreadKind) {
    let mut name = [0u8; 16];
    let current = std::thread::current();
    let given = current.name().unwrap_or("main").as_bytes();
    let n = given.len().min(name.len());
    name[..n].copy_from_slice(&given[..n]);
    THREAD.with(|t| t.set((name, kind)));
}

/// The `SIGSYS` information the kernel fills in for a seccomp trap (`siginfo_t._sigsys`).
#[repr(C)]
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

/// A fixed buffer that the handler formats into without allocating.
struct Line {
    buf: [u8; 160],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        for b in bytes {
            if self.len < self.buf.len() {
                self.buf[self.len] = *b;
                self.len += 1;
            }
        }
    }

    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// Formats the one-line report of a forbidden call (without its newline's terminal exit).
fn violation_line(name: &[u8], kind: ThreadKind, syscall: i64) -> Line {
    let mut line = Line {
        buf: [0; 160],
        len: 0,
    };
    let name_len = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    line.push(MESSAGE_HEAD);
    line.push(&name[..name_len]);
    line.push(b" (");
    line.push(kind.name().as_bytes());
    line.push(b" filter) made forbidden system call ");
    line.push_number(u64::try_from(syscall).unwrap_or(0));
    line.push(b"; stopping (exit 159)\n");
    line
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler; for SIGSYS with
    // SYS_SECCOMP its union holds `_sigsys`, laid out as `SigsysInfo`.
    let syscall = unsafe { (*(info as *const SigsysInfo)).syscall };
    let (name, kind) = THREAD.with(Cell::get);
    let line = violation_line(&name, kind, i64::from(syscall));
    // SAFETY: write and _exit are async-signal-safe; the buffer lives for the call. Every
    // filter allows both.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(EXIT_SECCOMP);
    }
}

fn install_sigsys_handler() -> Result<(), SeccompError> {
    // SAFETY: a zeroed sigaction is valid; the handler only formats into a stack buffer,
    // writes it and exits.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
            return Err(SeccompError::Handler(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [SeccompMode::Off, SeccompMode::Log, SeccompMode::Kill] {
            assert_eq!(m.to_string().parse::<SeccompMode>(), Ok(m));
        }
        assert!("strict".parse::<SeccompMode>().is_err());
        assert_eq!(SeccompMode::default(), SeccompMode::Kill);
    }

    #[test]
    fn every_filter_compiles_in_every_mode() {
        for kind in ThreadKind::ALL {
            for action in [SeccompAction::Log, SeccompAction::Trap] {
                let program = compile(kind, action).unwrap();
                assert!(program.len() > 20, "{kind:?}");
            }
            assert_eq!(kind.name().parse::<ThreadKind>(), Ok(kind));
        }
    }

    #[test]
    fn the_selftest_call_is_forbidden_everywhere() {
        for kind in ThreadKind::ALL {
            assert!(
                !rules_for(kind).0.contains_key(&SELFTEST_SYSCALL),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn no_thread_may_run_programs_or_create_processes() {
        for kind in ThreadKind::ALL {
            let rules = rules_for(kind).0;
            for s in [
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_fork,
                libc::SYS_vfork,
                libc::SYS_ptrace,
                libc::SYS_rt_sigaction,
                libc::SYS_mount,
                libc::SYS_setuid,
            ] {
                assert!(!rules.contains_key(&s), "{kind:?} allows {s}");
            }
            // ioctl is never unconditional.
            assert!(
                !matches!(rules.get(&libc::SYS_ioctl), Some(r) if r.is_empty()),
                "{kind:?}"
            );
        }
        assert!(!rules_for(ThreadKind::Vcpu)
            .0
            .contains_key(&libc::SYS_clone3));
    }

    #[test]
    fn the_violation_line_names_the_thread_and_the_call() {
        let mut name = [0u8; 16];
        name[..5].copy_from_slice(b"vcpu1");
        let line = violation_line(&name, ThreadKind::Vcpu, 110);
        assert_eq!(
            std::str::from_utf8(&line.buf[..line.len]).unwrap(),
            "pvmm: seccomp: thread vcpu1 (vcpu filter) made forbidden system call 110; stopping (exit 159)\n"
        );
    }
}
