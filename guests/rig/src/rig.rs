//! Running the QEMU-nested rig: QEMU (TCG, an emulated multi-socket AMD CPU with SVM) boots
//! L1, L1 loads KVM and runs the inner VMM (pvmm, or QEMU with KVM) on the guest images.
//!
//! The host side classifies L1's console lines by the tags the L1 scripts put on them (see
//! [`crate::scripts`]), enforces a hard timeout (it kills QEMU), and detects L1 hanging at
//! power-off after the inner VMM has already reported its exit status.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cpio::{CpioArchive, CpioError};
use crate::images::{inside, progress, ImageError, L1Images, Workspace, QEMU};
use crate::scripts::{base64_encode, shell_join};
use crate::tuning::L1Tuning;

/// Added to the guest's command line unless it is `quiet`: the decompressor and the kernel
/// print on the serial port from their first instructions instead of from the console's
/// registration, so a guest that hangs early shows how far it got (the boot log is no
/// longer: the real console does not repeat what the early one printed).
pub const GUEST_EARLY_CONSOLE: &str = "earlyprintk=ttyS0";

/// pvmm's default guest command line; the rig appends the command.
pub const GUEST_BASE_CMDLINE: &str = pvmm::config::DEFAULT_CMDLINE;

/// L1's kernel command line. `loglevel=4` keeps L1's boot chatter off the console while still
/// showing warnings and errors (RCU stalls, soft lockups) that explain a hung rig.
pub const L1_CMDLINE: &str = "console=ttyS0 panic=-1 loglevel=4";

/// x86's COMMAND_LINE_SIZE including the terminating NUL: longer guest command lines are cut
/// by the guest kernel, so the rig refuses them.
pub const MAX_GUEST_CMDLINE: usize = 2047;

/// pvmm's defaults for `--vcpus` and `--memory`, used to size `--vmm qemu` the same way.
pub const PVMM_DEFAULT_VCPUS: u32 = pvmm::config::DEFAULT_VCPUS;
/// See [`PVMM_DEFAULT_VCPUS`].
pub const PVMM_DEFAULT_MEMORY_MIB: u64 = pvmm::config::DEFAULT_MEMORY_MIB;

/// L1 memory besides the guest and the initramfs: L1's kernel, busybox and the inner VMM's own
/// allocations fit in a few hundred MiB; 512 leaves room for page cache and a probe script.
const L1_BASE_MEMORY_MIB: u64 = 512;

/// L1 memory is rounded up to this granule (keeps the QEMU command line tidy).
const L1_MEMORY_GRANULE_MIB: u64 = 256;

/// How long L1 gets to power off after the inner VMM's exit status arrived. A TCG L1 powers
/// off in well under a second; 30 s is far beyond that and still catches the power-off hangs
/// (RCU stalls) seen in one of three manual runs.
pub const POWEROFF_GRACE: Duration = Duration::from_secs(30);

/// Default hard timeout of a rig run: L1 boots in about 5 s and a 4-vCPU guest in about 10 s
/// more on an idle machine; our machines are shared and noisy, so allow 20x that.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Exit code the xtask uses when the rig timed out (like timeout(1)).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit code the xtask uses when L1 ended without reporting the inner VMM's status, when L1's
/// kernel locked up or panicked ([`RigEnd::L1Lockup`], [`RigEnd::L1Panic`]), or when the rig
/// could not start.
pub const EXIT_RIG_FAILURE: i32 = 125;

/// A run ends as [`RigEnd::L1Lockup`] once L1's kernel reports one of its CPUs stuck for this
/// long (`watchdog: BUG: soft lockup - CPU#0 stuck for 52s!`). Linux first reports a soft
/// lockup after 2 x watchdog_thresh = 20 s and then every ~25 s with the time so far; in the
/// lockups seen in CI (TCG's emulated SVM never leaving guest mode) the count only grew, to
/// 365 s, until the hard timeout killed the run. 45 s waits for the second report, so one
/// stall that L1 survives does not end a run, and gives up minutes before the timeout would.
pub const L1_LOCKUP_LIMIT: Duration = Duration::from_secs(45);

/// A run ends as [`RigEnd::L1Frozen`] when L1 prints nothing this long. L1's init prints an
/// `l1-alive` heartbeat every 10 s, so 90 s is nine missed beats: far beyond a loaded machine's
/// delays, and far less than the minutes a frozen L1 (seen twice under load, once in CI: the
/// guest's console stopped mid-line and neither L1's run limit nor its watchdog fired again)
/// would otherwise cost before the hard timeout.
pub const L1_SILENCE_LIMIT: Duration = Duration::from_secs(90);

/// L1's heartbeat event (not kept in [`RigOutcome::events`]).
const L1_ALIVE_EVENT: &str = "l1-alive";

/// Warnings QEMU prints for every CPUID feature TCG lacks; the rig counts them instead of
/// printing hundreds of lines.
const QEMU_FEATURE_WARNING: &str = "doesn't support requested feature";

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

/// L1's CPU topology: sockets x cores per socket x threads per core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// Packages.
    pub sockets: u32,
    /// Cores per package.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// Most of any one topology dimension accepted: far above what TCG on two host CPUs can run.
const MAX_TOPOLOGY_DIMENSION: u32 = 64;

impl Topology {
    /// Total logical CPUs.
    pub fn cpus(&self) -> u32 {
        self.sockets * self.cores * self.threads
    }
}

impl Default for Topology {
    /// 2 sockets x 2 cores x 1 thread: the smallest host with two packages and a choice of
    /// cores within each.
    fn default() -> Self {
        Topology {
            sockets: 2,
            cores: 2,
            threads: 1,
        }
    }
}

impl FromStr for Topology {
    type Err = RigError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<u32> = text
            .split('x')
            .map(|p| p.parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|_| RigError::BadTopology(text.into()))?;
        match parts[..] {
            [sockets, cores, threads]
                if [sockets, cores, threads]
                    .iter()
                    .all(|&n| (1..=MAX_TOPOLOGY_DIMENSION).contains(&n)) =>
            {
                Ok(Topology {
                    sockets,
                    cores,
                    threads,
                })
            }
            _ => Err(RigError::BadTopology(text.into())),
        }
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.sockets, self.cores, self.threads)
    }
}

/// Which VMM runs the guest inside L1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InnerVmm {
    /// The static pvmm built from this workspace.
    Pvmm,
    /// `qemu-system-x86_64 -enable-kvm`, the baseline.
    Qemu,
}

impl FromStr for InnerVmm {
    type Err = RigError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "pvmm" => Ok(InnerVmm::Pvmm),
            "qemu" => Ok(InnerVmm::Qemu),
            _ => Err(RigError::BadArgs(format!(
                "invalid --vmm '{text}': expected pvmm or qemu"
            ))),
        }
    }
}

impl InnerVmm {
    /// The name used in prefixes and reports.
    pub fn name(&self) -> &'static str {
        match self {
            InnerVmm::Pvmm => "pvmm",
            InnerVmm::Qemu => "qemu-kvm",
        }
    }
}

/// The guest's command line: pvmm's default plus the command, base64-encoded (see
/// [`crate::scripts::GUEST_INIT`]).
///
/// For [`InnerVmm::Qemu`] `pci=off` is left out: QEMU's PC machine has a PCI bus, and with
/// `pci=off` its ACPI PCI-link methods fail with a screenful of errors that slow the guest's
/// serial console and would handicap QEMU in the boot benchmark. `quiet` (used by the
/// benchmark) keeps the kernel's boot log off the emulated UART, whose per-byte exits
/// otherwise dominate boot time in the nested rig.
pub fn guest_cmdline(
    vmm: InnerVmm,
    command: Option<&str>,
    quiet: bool,
) -> Result<String, RigError> {
    let mut cmdline = match vmm {
        InnerVmm::Pvmm => GUEST_BASE_CMDLINE.to_string(),
        InnerVmm::Qemu => GUEST_BASE_CMDLINE.replace(" pci=off", ""),
    };
    if quiet {
        cmdline.push_str(" quiet");
    } else {
        cmdline.push(' ');
        cmdline.push_str(GUEST_EARLY_CONSOLE);
    }
    if let Some(command) = command {
        cmdline.push_str(" pvmm_cmd_b64=");
        cmdline.push_str(&base64_encode(command.as_bytes()));
    }
    if cmdline.len() > MAX_GUEST_CMDLINE {
        return Err(RigError::BadArgs(format!(
            "the guest command is too long: the kernel command line would be {} bytes, the limit is {MAX_GUEST_CMDLINE}",
            cmdline.len()
        )));
    }
    Ok(cmdline)
}

/// vCPUs and memory (MiB) that pvmm arguments ask for, with pvmm's defaults.
pub fn vm_shape(pvmm_args: &[String]) -> Result<(u32, u64), RigError> {
    let mut vcpus = PVMM_DEFAULT_VCPUS;
    let mut memory = PVMM_DEFAULT_MEMORY_MIB;
    let mut args = pvmm_args.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        if name == "--vcpus" || name == "--memory" {
            let value = inline
                .or_else(|| args.next().cloned())
                .ok_or_else(|| RigError::BadArgs(format!("pvmm argument {name} needs a value")))?;
            let bad =
                || RigError::BadArgs(format!("pvmm argument {name} has a bad value '{value}'"));
            if name == "--vcpus" {
                vcpus = value.parse().map_err(|_| bad())?;
            } else {
                memory = value.parse().map_err(|_| bad())?;
            }
        }
    }
    Ok((vcpus, memory))
}

/// The command line that runs `vmm` in L1 on the guest images.
pub fn inner_vmm_command(
    vmm: InnerVmm,
    pvmm_args: &[String],
    cmdline: &str,
) -> Result<Vec<String>, RigError> {
    for reserved in ["--initrd", "--cmdline"] {
        if pvmm_args
            .iter()
            .any(|a| a == reserved || a.starts_with(&format!("{reserved}=")))
        {
            return Err(RigError::BadArgs(format!(
                "pvmm argument {reserved} is set by the rig (use --guest-cmd for the guest's command)"
            )));
        }
    }
    let (vcpus, memory) = vm_shape(pvmm_args)?;
    let words: Vec<String> = match vmm {
        InnerVmm::Pvmm => {
            let mut words = vec![inside::PVMM.to_string()];
            words.extend(pvmm_args.iter().cloned());
            words.extend(
                [
                    "--initrd",
                    inside::GUEST_INITRD,
                    "--cmdline",
                    cmdline,
                    inside::GUEST_KERNEL,
                ]
                .map(String::from),
            );
            words
        }
        InnerVmm::Qemu => {
            let (vcpus, memory) = (vcpus.to_string(), memory.to_string());
            [
                inside::QEMU,
                // Thread names ("CPU 0/KVM") let L1 probes find the vCPU threads.
                "-name",
                "pvmm-baseline,debug-threads=on",
                "-enable-kvm",
                "-cpu",
                "host",
                "-smp",
                &vcpus,
                "-m",
                &memory,
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-serial",
                "stdio",
                "-no-reboot",
                "-kernel",
                inside::GUEST_KERNEL,
                "-initrd",
                inside::GUEST_INITRD,
                "-append",
                cmdline,
            ]
            .map(String::from)
            .to_vec()
        }
    };
    Ok(words)
}

/// What L1 should do: a shell script sourced by L1's init (it may call `rig_run`), an optional
/// probe script run alongside each inner VMM, and the guest memory it needs (for sizing L1).
#[derive(Debug, Clone)]
pub struct L1Job {
    /// Shell code sourced by L1's init after the KVM modules are loaded.
    pub script: String,
    /// Shell script run alongside the inner VMM with `PVMM_PID` set; its output is tagged.
    pub probe: Option<String>,
    /// The most guest memory one inner VMM asks for, in MiB.
    pub guest_memory_mib: u64,
}

/// How to run L1.
#[derive(Debug, Clone)]
pub struct L1Options {
    /// L1's CPU topology.
    pub topology: Topology,
    /// Hard limit for the whole run; QEMU is killed when it passes.
    pub timeout: Duration,
    /// Print classified lines on stdout as they arrive.
    pub echo: bool,
    /// QEMU's and L1's settings.
    pub tuning: L1Tuning,
    /// Prefix for the inner VMM's stderr lines, e.g. "pvmm".
    pub vmm_name: &'static str,
    /// Runs whose lines are shown with their label (`[guest1]`, `[pvmm1]`): (label, VMM name).
    /// Runs not listed are shown as `[guest]`, `[vmm_name]`.
    pub vm_names: Vec<(String, &'static str)>,
}

/// An event the L1 scripts reported: `@@rig@@ KIND LABEL VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct RigEvent {
    /// `l1-init`, `l1-cpus`, `vmm-start`, `guest-init`, `guest-uptime`,
    /// `vmm-exit`, `error`, `l1-poweroff`.
    pub kind: String,
    /// The run label given to `rig_run` (`-` for L1-wide events).
    pub label: String,
    /// Uptime in seconds, exit status, count or error name.
    pub value: String,
}

/// How a rig run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RigEnd {
    /// QEMU exited by itself.
    Completed,
    /// The hard timeout passed before L1 reported the inner VMM's exit; QEMU was killed.
    TimedOut,
    /// The inner VMM's status arrived but L1 did not power off within [`POWEROFF_GRACE`];
    /// QEMU was killed.
    HungAtPowerOff,
    /// L1's kernel reported a CPU stuck for [`L1_LOCKUP_LIMIT`] or longer (a soft lockup:
    /// the emulated machine, not the inner VMM, stopped making progress); QEMU was killed.
    L1Lockup,
    /// L1's kernel panicked (`Kernel panic - not syncing`: seen once under load, a kernel stack
    /// overflow in L1's page-fault entry on the CPU that ran a vCPU thread, i.e. TCG's emulated
    /// SVM left L1's CPU state broken); QEMU was killed.
    L1Panic,
    /// L1 printed nothing, not even its heartbeat, for [`L1_SILENCE_LIMIT`]: the emulated
    /// machine stopped; QEMU was killed.
    L1Frozen,
    /// QEMU exited by itself while an inner VMM run was in progress, before L1's power-off:
    /// L1 reset (QEMU runs with `-no-reboot`), e.g. a triple fault of L1 itself (seen under
    /// load, L1's console silent).
    L1Reset,
    /// Something outside the rig sent QEMU a signal (QEMU says `terminating on signal N from
    /// pid P`, e.g. another user of the machine ending QEMU processes by name).
    /// Neither L1 nor the inner VMM failed.
    KilledOutside,
}

/// What QEMU prints on stderr when a signal ends it.
pub const QEMU_SIGNAL_MARK: &str = "terminating on signal";

/// What L1's kernel prints when it panics.
pub const L1_PANIC_MARK: &str = "Kernel panic - not syncing";

/// Everything a rig run produced.
#[derive(Debug, Clone)]
pub struct RigOutcome {
    /// How it ended.
    pub end: RigEnd,
    /// The inner VMM's exit status (the last `vmm-exit` event), if L1 reported one.
    pub vmm_status: Option<i32>,
    /// QEMU's (L1's) exit status, if it exited by itself.
    pub qemu_status: Option<ExitStatus>,
    /// L1's own console lines (kernel and init).
    pub l1_lines: Vec<String>,
    /// The guest's serial console (the inner VMM's stdout).
    pub guest_lines: Vec<String>,
    /// The inner VMM's stderr.
    pub vmm_lines: Vec<String>,
    /// The probe script's output.
    pub probe_lines: Vec<String>,
    /// QEMU's own stderr (without the repetitive CPUID feature warnings).
    pub qemu_lines: Vec<String>,
    /// Events from L1's scripts, in order.
    pub events: Vec<RigEvent>,
    /// Wall time from starting QEMU to its end.
    pub elapsed: Duration,
    /// The timeout the run had.
    pub timeout: Duration,
    /// Where each inner VMM run (`vmm-start` event) began in the line vectors, in order.
    pub run_starts: Vec<RunStart>,
    /// Each run's own lines, by label, in the order their first line arrived.
    pub runs: Vec<RunOutput>,
    /// When the rig gave up on L1 (frozen, locked up, timed out): QEMU's threads, one line
    /// each, `NAME STATE CPU_MS` with the CPU time it used over [`STALL_SAMPLE`]. Tells a
    /// deadlocked emulator (every thread asleep) from a spinning one.
    pub stall_threads: Vec<String>,
}

/// How long the rig watches QEMU's threads before killing a stalled L1.
pub const STALL_SAMPLE: Duration = Duration::from_secs(1);

/// The lines of one inner VMM run, told apart by their tags, so runs at the same time in one
/// L1 do not mix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOutput {
    /// The run's label.
    pub label: String,
    /// The guest's console.
    pub guest: Vec<String>,
    /// The inner VMM's stderr.
    pub vmm: Vec<String>,
    /// The probe's output.
    pub probe: Vec<String>,
}

/// Where one inner VMM run of an L1 boot begins in [`RigOutcome`]'s line vectors: every line
/// after its `vmm-start` event (and before the next run's) belongs to it, since L1 reports on
/// one console in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStart {
    /// The run's label (`rig_run LABEL ...`).
    pub label: String,
    /// Index of its first line in `guest_lines`.
    pub guest: usize,
    /// Index of its first line in `vmm_lines`.
    pub vmm: usize,
    /// Index of its first line in `probe_lines`.
    pub probe: usize,
}

/// The lines and exit status of one inner VMM run of an L1 boot ([`RigOutcome::run`]).
#[derive(Debug, Clone, Copy)]
pub struct RunLines<'a> {
    /// The guest's console.
    pub guest: &'a [String],
    /// The inner VMM's stderr.
    pub vmm: &'a [String],
    /// The probe's output.
    pub probe: &'a [String],
    /// The VMM's exit status, if L1 reported it.
    pub status: Option<i32>,
}

impl RunLines<'_> {
    /// The guest's output between its "command begin" and "command exit status" markers.
    pub fn command_output(&self) -> Vec<&str> {
        command_output(self.guest)
    }

    /// The guest command's exit status, if the guest reported one.
    pub fn command_status(&self) -> Option<i32> {
        command_status(self.guest)
    }
}

fn command_output(guest: &[String]) -> Vec<&str> {
    guest
        .iter()
        .map(String::as_str)
        .skip_while(|l| !l.starts_with("pvmm-guest: command begin"))
        .skip(1)
        .take_while(|l| !l.starts_with("pvmm-guest: command exit status"))
        .collect()
}

fn command_status(guest: &[String]) -> Option<i32> {
    guest
        .iter()
        .find_map(|l| l.strip_prefix("pvmm-guest: command exit status "))
        .and_then(|s| s.trim().parse().ok())
}

impl RigOutcome {
    /// The lines and exit status of the run labelled `label`, if it started.
    pub fn run(&self, label: &str) -> Option<RunLines<'_>> {
        self.events_of("vmm-start").find(|e| e.label == label)?;
        let empty: &[String] = &[];
        let own = self.runs.iter().find(|r| r.label == label);
        let status = self
            .events_of("vmm-exit")
            .find(|e| e.label == label)
            .and_then(|e| e.value.trim().parse().ok());
        Some(RunLines {
            guest: own.map_or(empty, |r| &r.guest),
            vmm: own.map_or(empty, |r| &r.vmm),
            probe: own.map_or(empty, |r| &r.probe),
            status,
        })
    }

    /// The exit code for the xtask: the inner VMM's status, [`EXIT_TIMEOUT`] on timeout,
    /// [`EXIT_RIG_FAILURE`] when L1 locked up, panicked or ended without reporting a status.
    pub fn exit_code(&self) -> i32 {
        match (self.end, self.vmm_status) {
            (RigEnd::TimedOut, _) => EXIT_TIMEOUT,
            (
                RigEnd::L1Lockup
                | RigEnd::L1Panic
                | RigEnd::L1Frozen
                | RigEnd::L1Reset
                | RigEnd::KilledOutside,
                _,
            ) => EXIT_RIG_FAILURE,
            (_, Some(status)) => status,
            (_, None) => EXIT_RIG_FAILURE,
        }
    }

    /// Every classified line of the boot (`[rig]` events, then L1, guest, VMM and probe
    /// lines, each tagged), for a post-mortem: a failing test or benchmark shows only what it
    /// checked.
    pub fn log_text(&self) -> String {
        let mut text = String::new();
        for event in &self.events {
            text.push_str(&format!(
                "[rig] {} {} {}\n",
                event.kind, event.label, event.value
            ));
        }
        for (tag, lines) in [
            ("L1", &self.l1_lines),
            ("guest", &self.guest_lines),
            ("pvmm", &self.vmm_lines),
            ("probe", &self.probe_lines),
        ] {
            for line in lines {
                text.push_str(&format!("[{tag}] {line}\n"));
            }
        }
        text
    }

    /// One line saying how the run ended.
    pub fn summary(&self, vmm_name: &str) -> String {
        let secs = self.elapsed.as_secs_f64();
        match (self.end, self.vmm_status) {
            (RigEnd::TimedOut, _) => format!(
                "TIMEOUT: killed QEMU after {secs:.1} s (limit {} s) before L1 reported {vmm_name}'s exit status; exit {EXIT_TIMEOUT}",
                self.timeout.as_secs()
            ),
            (RigEnd::L1Lockup, _) => format!(
                "L1 LOCKUP: L1's kernel reports a CPU stuck for {} s or more ({}); killed QEMU after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                L1_LOCKUP_LIMIT.as_secs(),
                self.l1_lines
                    .iter()
                    .rev()
                    .find(|l| soft_lockup_seconds(l).is_some())
                    .map_or("no line kept", |l| l.trim())
            ),
            (RigEnd::L1Panic, _) => format!(
                "L1 PANIC: L1's kernel panicked ({}); killed QEMU after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                self.l1_lines
                    .iter()
                    .rev()
                    .find(|l| l.contains(L1_PANIC_MARK))
                    .map_or("no line kept", |l| l.trim())
            ),
            (RigEnd::KilledOutside, _) => format!(
                "KILLED OUTSIDE: {}; killed after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                self.qemu_lines
                    .iter()
                    .find(|l| l.contains(QEMU_SIGNAL_MARK))
                    .map_or("no line kept", |l| l.trim())
            ),
            (RigEnd::L1Reset, _) => format!(
                "L1 RESET: QEMU ({}) exited while {vmm_name} was running, before L1's power-off, after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                self.qemu_status.map_or("killed".to_string(), |s| s.to_string())
            ),
            (RigEnd::L1Frozen, _) => format!(
                "L1 FROZEN: L1 printed nothing for {} s, not even its heartbeat; killed QEMU after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                L1_SILENCE_LIMIT.as_secs()
            ),
            (RigEnd::HungAtPowerOff, Some(status)) => format!(
                "{vmm_name} exited with status {status}, but L1 hung at power-off ({} s grace); killed QEMU after {secs:.1} s",
                POWEROFF_GRACE.as_secs()
            ),
            (_, Some(status)) => format!("{vmm_name} exited with status {status}; rig took {secs:.1} s"),
            (_, None) => format!(
                "L1 ended (QEMU {}) without reporting {vmm_name}'s exit status after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                self.qemu_status.map_or("killed".to_string(), |s| s.to_string())
            ),
        }
    }

    /// Whether an inner VMM run had started and not reported its exit while L1 had not
    /// announced its power-off.
    pub fn run_in_progress(&self) -> bool {
        self.events_of("l1-poweroff").next().is_none()
            && self.events_of("vmm-exit").count() < self.events_of("vmm-start").count()
    }

    /// Events of one kind, optionally for one label.
    pub fn events_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a RigEvent> + 'a {
        self.events.iter().filter(move |e| e.kind == kind)
    }

    /// Seconds from a run's `vmm-start` to its `guest-init` event (L1's clock).
    pub fn boot_to_init_seconds(&self, label: &str) -> Option<f64> {
        let at = |kind: &str| {
            self.events
                .iter()
                .find(|e| e.kind == kind && e.label == label)
                .and_then(|e| e.value.parse::<f64>().ok())
        };
        Some(at("guest-init")? - at("vmm-start")?)
    }

    /// The guest's output between its "command begin" and "command exit status" markers.
    pub fn guest_command_output(&self) -> Vec<&str> {
        command_output(&self.guest_lines)
    }

    /// The guest command's exit status, if the guest reported one.
    pub fn guest_command_status(&self) -> Option<i32> {
        command_status(&self.guest_lines)
    }
}

/// One VM of a rig run: its VMM, that VMM's arguments and the guest's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    /// The VMM that runs it in L1.
    pub vmm: InnerVmm,
    /// pvmm's arguments (with [`InnerVmm::Qemu`] only `--vcpus` and `--memory` are used).
    pub args: Vec<String>,
    /// Shell command (or script) the guest's init runs before powering off.
    pub guest_command: Option<String>,
}

impl VmSpec {
    /// A VM of `vmm` with pvmm's default shape and no command.
    pub fn new(vmm: InnerVmm) -> VmSpec {
        VmSpec {
            vmm,
            args: Vec::new(),
            guest_command: None,
        }
    }
}

impl FromStr for VmSpec {
    type Err = RigError;
    /// `VMM [ARGS...] [-- COMMAND]`, e.g. `pvmm --vcpus 2 --memory 256 -- nproc`: the VMM
    /// (`pvmm` or `qemu`), its arguments split at white space, and the guest's command (the
    /// rest, verbatim).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (head, command) = match text.split_once(" -- ") {
            Some((head, command)) => (head, Some(command.trim().to_string())),
            None => (text.strip_suffix(" --").unwrap_or(text), None),
        };
        let mut words = head.split_whitespace();
        let vmm: InnerVmm = words
            .next()
            .ok_or_else(|| RigError::BadArgs(format!("invalid VM '{text}': no VMM named")))?
            .parse()?;
        let args: Vec<String> = words.map(String::from).collect();
        vm_shape(&args)?;
        Ok(VmSpec {
            vmm,
            args,
            guest_command: command.filter(|c| !c.is_empty()),
        })
    }
}

/// A rig run of one or more VMs at the same time in one L1 boot: the builder behind
/// `cargo xtask rig`.
///
/// ```no_run
/// use pvmm_rig::{images, Rig, InnerVmm};
/// let ws = images::Workspace::locate()?;
/// let l1 = images::build_l1(&ws, images::L1Needs { pvmm: true, qemu: false })?;
/// let outcome = Rig::new(InnerVmm::Pvmm)
///     .guest_command("nproc")
///     .pvmm_args(["--vcpus", "4"])
///     .run(&ws, &l1)?;
/// assert_eq!(outcome.vmm_status, Some(0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// With several VMs ([`Rig::with_vms`]) run `i` (from 0) is labelled `i`: its lines are in
/// [`RigOutcome::run`]`("i")` and shown as `[guest i]`, `[pvmm i]` (without the space), and
/// [`RigOutcome::vmm_status`] is the first non-zero VM status, 0 when all exited 0, None when
/// one never reported.
#[derive(Debug, Clone)]
pub struct Rig {
    vms: Vec<VmSpec>,
    topology: Topology,
    timeout: Duration,
    probe: Option<String>,
    echo: bool,
    tuning: L1Tuning,
}

/// The label of the only run of a one-VM rig.
pub const SINGLE_RUN_LABEL: &str = "main";

impl Rig {
    /// A rig with the default topology (2x2x1), timeout and tuning, running one VM of `vmm`.
    pub fn new(vmm: InnerVmm) -> Rig {
        Rig::with_vms(vec![VmSpec::new(vmm)])
    }

    /// A rig running `vms` side by side in one L1.
    pub fn with_vms(vms: Vec<VmSpec>) -> Rig {
        Rig {
            vms,
            topology: Topology::default(),
            timeout: DEFAULT_TIMEOUT,
            probe: None,
            echo: false,
            tuning: L1Tuning::default(),
        }
    }

    /// L1's CPU topology.
    pub fn topology(mut self, topology: Topology) -> Rig {
        self.topology = topology;
        self
    }

    /// Hard timeout of the whole run.
    pub fn timeout(mut self, timeout: Duration) -> Rig {
        self.timeout = timeout;
        self
    }

    /// Shell command (or script) every VM's guest runs before powering off.
    pub fn guest_command(mut self, command: impl Into<String>) -> Rig {
        let command = command.into();
        for vm in &mut self.vms {
            vm.guest_command = Some(command.clone());
        }
        self
    }

    /// Arguments for every VM's pvmm (before `--initrd`, `--cmdline` and the kernel, which the
    /// rig adds). With [`InnerVmm::Qemu`] only `--vcpus` and `--memory` are used.
    pub fn pvmm_args<I, S>(mut self, args: I) -> Rig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        for vm in &mut self.vms {
            vm.args = args.clone();
        }
        self
    }

    /// A shell script L1 runs alongside each inner VMM, with `PVMM_PID` set to its pid; its
    /// output lands in [`RigOutcome::probe_lines`]. L1 waits for it after the VMM exits, so
    /// it should end by itself (e.g. loop while `kill -0 $PVMM_PID`).
    pub fn l1_probe(mut self, script: impl Into<String>) -> Rig {
        self.probe = Some(script.into());
        self
    }

    /// Print lines with `[L1] `, `[guest] `, ... prefixes on stdout as they arrive.
    pub fn echo(mut self, echo: bool) -> Rig {
        self.echo = echo;
        self
    }

    /// Use `-accel tcg,thread=multi` (true) or `thread=single` for L1, on top of the tuning.
    pub fn tcg_multi_thread(mut self, multi: bool) -> Rig {
        self.tuning.tcg_multi_thread = multi;
        self
    }

    /// QEMU's and L1's settings (default: [`crate::tuning::DEFAULT_VARIANT`]).
    pub fn tuning(mut self, tuning: L1Tuning) -> Rig {
        self.tuning = tuning;
        self
    }

    /// The run labels, in VM order.
    pub fn labels(&self) -> Vec<String> {
        match self.vms.len() {
            1 => vec![SINGLE_RUN_LABEL.to_string()],
            n => (0..n).map(|i| i.to_string()).collect(),
        }
    }

    /// The L1 job: one `rig_run` per VM, in the background when there are several.
    fn job(&self) -> Result<L1Job, RigError> {
        let labels = self.labels();
        let (mut script, mut waits, mut memory) = (String::new(), String::new(), 0);
        for (vm, label) in self.vms.iter().zip(&labels) {
            let cmdline = guest_cmdline(vm.vmm, vm.guest_command.as_deref(), false)?;
            let mut args = vm.args.clone();
            if vm.vmm == InnerVmm::Pvmm {
                args.extend(self.tuning.pvmm_args.iter().cloned());
            }
            let command = shell_join(&inner_vmm_command(vm.vmm, &args, &cmdline)?);
            memory += vm_shape(&vm.args)?.1;
            if self.vms.len() == 1 {
                script.push_str(&format!("rig_run {label} 0 {command}\n"));
            } else {
                script.push_str(&format!(
                    "rig_run {label} 0 {command} &\nrig_vm_{label}=$!\n"
                ));
                waits.push_str(&format!(" $rig_vm_{label}"));
            }
        }
        if !waits.is_empty() {
            script.push_str(&format!("wait{waits}\n"));
        }
        Ok(L1Job {
            script,
            probe: self.probe.clone(),
            guest_memory_mib: memory,
        })
    }

    /// Runs the rig once; needs L1 images with the layers for this rig's VMMs.
    pub fn run(&self, ws: &Workspace, images: &L1Images) -> Result<RigOutcome, RigError> {
        if self.vms.is_empty() {
            return Err(RigError::BadArgs("a rig run needs at least one VM".into()));
        }
        for vm in &self.vms {
            if vm.vmm == InnerVmm::Pvmm && images.pvmm.is_none() {
                return Err(RigError::BadArgs(
                    "the L1 images were built without pvmm".into(),
                ));
            }
            if vm.vmm == InnerVmm::Qemu && images.qemu.is_none() {
                return Err(RigError::BadArgs(
                    "the L1 images were built without qemu".into(),
                ));
            }
        }
        let labels = self.labels();
        let several = self.vms.len() > 1;
        let options = L1Options {
            topology: self.topology,
            timeout: self.timeout,
            echo: self.echo,
            tuning: self.tuning.clone(),
            vmm_name: self.vms[0].vmm.name(),
            vm_names: if several {
                labels
                    .iter()
                    .zip(&self.vms)
                    .map(|(label, vm)| (label.clone(), vm.vmm.name()))
                    .collect()
            } else {
                Vec::new()
            },
        };
        let mut outcome = run_l1(ws, images, &options, &self.job()?)?;
        if several {
            outcome.vmm_status = combined_status(&outcome, &labels);
        }
        Ok(outcome)
    }
}

/// The first non-zero exit status of the runs `labels`, 0 when all exited 0, None when one did
/// not report.
pub fn combined_status(outcome: &RigOutcome, labels: &[String]) -> Option<i32> {
    let statuses: Option<Vec<i32>> = labels
        .iter()
        .map(|l| outcome.run(l).and_then(|r| r.status))
        .collect();
    statuses.map(|s| s.into_iter().find(|&s| s != 0).unwrap_or(0))
}

/// Kills QEMU if the rig returns early (error or panic), so no L1 outlives its run.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Removes a run's scratch folder when the run ends.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

enum Stream {
    Stdout,
    Stderr,
}

fn spawn_reader<R: Read + Send + 'static>(
    reader: R,
    stream: Stream,
    sender: mpsc::Sender<(Stream, String)>,
) {
    let tag = matches!(stream, Stream::Stdout);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer);
                    let line = line.trim_end_matches(['\n', '\r']).replace('\r', "");
                    let stream = if tag { Stream::Stdout } else { Stream::Stderr };
                    if sender.send((stream, line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RigError + '_ {
    move |source| RigError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A process-unique number for scratch folders.
static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Writes the run's initramfs: the L1 layers followed by a job layer.
fn write_run_initrd(
    dir: &Path,
    images: &L1Images,
    job: &L1Job,
    tuning: &L1Tuning,
) -> Result<(PathBuf, u64), RigError> {
    let mut job_archive = CpioArchive::new(0);
    job_archive.add_file_bytes("rig/job.sh", job.script.as_bytes(), 0o644)?;
    job_archive.add_file_bytes("rig/tuning.sh", tuning.module_script().as_bytes(), 0o644)?;
    if let Some(probe) = &job.probe {
        job_archive.add_file_bytes("rig/probe.sh", probe.as_bytes(), 0o755)?;
    }
    let initrd = dir.join("l1-initrd.cpio");
    let mut out = std::io::BufWriter::new(File::create(&initrd).map_err(io(&initrd))?);
    let mut total = 0u64;
    for layer in images.layers() {
        let mut input = File::open(&layer).map_err(io(&layer))?;
        total += std::io::copy(&mut input, &mut out).map_err(io(&initrd))?;
    }
    total += job_archive.write(&mut out)?;
    out.flush().map_err(io(&initrd))?;
    Ok((initrd, total))
}

/// Kinds of tagged lines: an inner VMM run's guest console, its stderr, its probe, and events.
const TAG_KINDS: [&str; 4] = ["guest", "vmm", "probe", "rig"];

/// A tagged console line: `@@KIND@@ TEXT` or `@@KIND/LABEL@@ TEXT`.
#[derive(Debug, PartialEq)]
struct Tagged<'a> {
    kind: &'a str,
    label: Option<&'a str>,
    text: &'a str,
}

/// The tag and text of a line that starts with a tag.
fn parse_tag(line: &str) -> Option<Tagged<'_>> {
    let (tag, text) = line.strip_prefix("@@")?.split_once("@@ ")?;
    let (kind, label) = match tag.split_once('/') {
        Some((kind, label)) => (kind, Some(label)),
        None => (tag, None),
    };
    let label_ok = label.is_none_or(|l| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    });
    (TAG_KINDS.contains(&kind) && label_ok).then_some(Tagged { kind, label, text })
}

/// The tagged part of a console line. A tag is normally at the start, but the first line of
/// L1's init can follow the firmware's and kernel's terminal-control output on the same line.
fn tagged_tail(line: &str) -> Option<&str> {
    let mut search = 0;
    while let Some(found) = line[search..].find("@@") {
        let tail = &line[search + found..];
        if parse_tag(tail).is_some() {
            return Some(tail);
        }
        search += found + 2;
    }
    None
}

/// Removes ANSI escape sequences (SeaBIOS clears the screen) and other control characters.
fn strip_terminal_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // CSI: parameters and intermediates up to a final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

/// L1's memory: the initramfs twice (the packed image and the unpacked files), the guest, and
/// [`L1_BASE_MEMORY_MIB`], rounded up to [`L1_MEMORY_GRANULE_MIB`].
pub fn l1_memory_mib(initrd_bytes: u64, guest_memory_mib: u64) -> u64 {
    let initrd_mib = initrd_bytes.div_ceil(1 << 20);
    let total = L1_BASE_MEMORY_MIB + 2 * initrd_mib + guest_memory_mib;
    total.div_ceil(L1_MEMORY_GRANULE_MIB) * L1_MEMORY_GRANULE_MIB
}

/// Boots L1 with `job` and collects its output. The building block of [`Rig::run`] and the
/// boot benchmark.
pub fn run_l1(
    ws: &Workspace,
    images: &L1Images,
    options: &L1Options,
    job: &L1Job,
) -> Result<RigOutcome, RigError> {
    let files = RunFiles::write(ws, images, job, &options.tuning)?;
    let memory = l1_memory_mib(files.initrd_bytes, job.guest_memory_mib);
    let mut command = l1_command(images, options, &files.initrd, memory);
    progress(&format!(
        "booting L1: {QEMU} TCG, topology {} ({} CPUs), {memory} MiB, initramfs {} MiB, timeout {} s, variant {}",
        options.topology,
        options.topology.cpus(),
        files.initrd_bytes >> 20,
        options.timeout.as_secs(),
        options.tuning
    ));
    let start = Instant::now();
    let (mut child, receiver) = spawn_l1(&mut command)?;
    let mut collector = Collector::new(options, start);
    collector.watch(&receiver, start + options.timeout);
    let (mut outcome, feature_warnings) = (collector.outcome, collector.feature_warnings);
    settle_end(&mut child, &mut outcome);
    outcome.elapsed = start.elapsed();
    if feature_warnings > 0 {
        progress(&format!(
            "QEMU printed {feature_warnings} \"TCG doesn't support requested feature\" warnings (harmless, hidden)"
        ));
    }
    Ok(outcome)
}

/// A run's scratch folder (removed when the run ends) and the initramfs written into it.
struct RunFiles {
    _scratch: ScratchDir,
    initrd: PathBuf,
    initrd_bytes: u64,
}

impl RunFiles {
    /// Writes the run's initramfs ([`write_run_initrd`]) into a new scratch folder under
    /// `guests/out/runs/`.
    fn write(
        ws: &Workspace,
        images: &L1Images,
        job: &L1Job,
        tuning: &L1Tuning,
    ) -> Result<RunFiles, RigError> {
        let scratch = ws.out.join("runs").join(format!(
            "{}-{}",
            std::process::id(),
            RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&scratch).map_err(io(&scratch))?;
        let scratch = ScratchDir(scratch);
        let (initrd, initrd_bytes) = write_run_initrd(&scratch.0, images, job, tuning)?;
        Ok(RunFiles {
            _scratch: scratch,
            initrd,
            initrd_bytes,
        })
    }
}

/// Starts QEMU for L1; its stdout and stderr lines arrive on the receiver.
fn spawn_l1(
    command: &mut Command,
) -> Result<(KillOnDrop, mpsc::Receiver<(Stream, String)>), RigError> {
    let mut child = KillOnDrop(command.spawn().map_err(RigError::Spawn)?);
    let (sender, receiver) = mpsc::channel();
    if let Some(stdout) = child.0.stdout.take() {
        spawn_reader(stdout, Stream::Stdout, sender.clone());
    }
    if let Some(stderr) = child.0.stderr.take() {
        spawn_reader(stderr, Stream::Stderr, sender);
    }
    Ok((child, receiver))
}

/// Once the collector stopped: a QEMU whose pipes closed is reaped, and its end told apart
/// (killed from outside, L1 reset mid-run); a QEMU still running is sampled when it stalled,
/// then killed.
fn settle_end(child: &mut KillOnDrop, outcome: &mut RigOutcome) {
    if outcome.end == RigEnd::Completed {
        // Both pipes closed: QEMU is exiting; its status follows at once.
        outcome.qemu_status = child.0.wait().ok();
        if outcome
            .qemu_lines
            .iter()
            .any(|l| l.contains(QEMU_SIGNAL_MARK))
        {
            outcome.end = RigEnd::KilledOutside;
        } else if outcome.run_in_progress() {
            outcome.end = RigEnd::L1Reset;
        }
    } else {
        if matches!(
            outcome.end,
            RigEnd::L1Frozen | RigEnd::L1Lockup | RigEnd::TimedOut
        ) {
            outcome.stall_threads = sample_threads(child.0.id());
        }
        let _ = child.0.kill();
        let _ = child.0.wait();
    }
}

/// `NAME STATE CPU_MS` for each thread of process `pid`, CPU_MS being the CPU time it used
/// over [`STALL_SAMPLE`] (from `/proc/PID/task/TID/stat`); empty when /proc cannot tell.
fn sample_threads(pid: u32) -> Vec<String> {
    let read = || -> Vec<(String, String, u64)> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut threads: Vec<(String, String, u64)> = tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            .filter_map(|stat| parse_task_stat(&stat))
            .collect();
        threads.sort();
        threads
    };
    let before = read();
    std::thread::sleep(STALL_SAMPLE);
    // Clock ticks are 10 ms on the Linux hosts the rig runs on (USER_HZ = 100).
    read()
        .into_iter()
        .map(|(name, state, ticks)| {
            let earlier = before
                .iter()
                .find(|(n, _, _)| *n == name)
                .map_or(ticks, |b| b.2);
            format!("{name} {state} {}", ticks.saturating_sub(earlier) * 10)
        })
        .collect()
}

/// (`comm`, state, utime + stime in clock ticks) from a `/proc/PID/task/TID/stat` line. The
/// thread id is kept in front of the name so threads with the same name stay apart.
fn parse_task_stat(stat: &str) -> Option<(String, String, u64)> {
    let (tid, rest) = stat.split_once(" (")?;
    let (name, rest) = rest.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the line, utime 14 and stime 15.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((format!("{tid}:{name}"), fields.first()?.to_string(), ticks))
}

/// QEMU's command line for L1.
fn l1_command(images: &L1Images, options: &L1Options, initrd: &Path, memory: u64) -> Command {
    let topology = options.topology;
    let tuning = &options.tuning;
    let mut cmdline = L1_CMDLINE.to_string();
    for word in &tuning.cmdline_extra {
        cmdline.push(' ');
        cmdline.push_str(word);
    }
    let mut command = Command::new(QEMU);
    command
        .args(["-accel", &tuning.accel(), "-cpu", &tuning.cpu])
        // Thread names ("CPU 0/TCG") for the stall report.
        .args(["-name", "pvmm-rig-l1,debug-threads=on"])
        .arg("-smp")
        .arg(format!(
            "{},sockets={},cores={},threads={}",
            topology.cpus(),
            topology.sockets,
            topology.cores,
            topology.threads
        ))
        .arg("-m")
        .arg(memory.to_string())
        // No NIC: L1 needs none, and it spares SeaBIOS loading iPXE.
        .args(["-nographic", "-no-reboot", "-nic", "none", "-kernel"])
        .arg(&images.guest.kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(cmdline)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Sorts L1's console lines into a [`RigOutcome`] as they arrive and says how to show each.
struct Collector<'a> {
    options: &'a L1Options,
    outcome: RigOutcome,
    feature_warnings: usize,
    poweroff_deadline: Option<Instant>,
    last_output: Instant,
}

impl<'a> Collector<'a> {
    fn new(options: &'a L1Options, start: Instant) -> Collector<'a> {
        Collector {
            options,
            outcome: RigOutcome {
                end: RigEnd::Completed,
                vmm_status: None,
                qemu_status: None,
                l1_lines: Vec::new(),
                guest_lines: Vec::new(),
                vmm_lines: Vec::new(),
                probe_lines: Vec::new(),
                qemu_lines: Vec::new(),
                events: Vec::new(),
                elapsed: Duration::ZERO,
                timeout: options.timeout,
                run_starts: Vec::new(),
                runs: Vec::new(),
                stall_threads: Vec::new(),
            },
            feature_warnings: 0,
            poweroff_deadline: None,
            last_output: start,
        }
    }

    /// Takes QEMU's lines until it exits, a limit passes, or L1 locks up or panics; sets
    /// `outcome.end` for all but a plain exit.
    fn watch(&mut self, receiver: &mpsc::Receiver<(Stream, String)>, deadline: Instant) {
        loop {
            let limit = self.poweroff_deadline.map_or(deadline, |p| p.min(deadline));
            let silent_at = self.last_output + L1_SILENCE_LIMIT;
            let now = Instant::now();
            if now >= limit {
                let hung = self.poweroff_deadline.is_some_and(|p| p <= now)
                    && self.outcome.vmm_status.is_some();
                self.outcome.end = if hung {
                    RigEnd::HungAtPowerOff
                } else {
                    RigEnd::TimedOut
                };
                return;
            }
            if now >= silent_at {
                self.outcome.end = RigEnd::L1Frozen;
                return;
            }
            let (stream, line) = match receiver.recv_timeout(limit.min(silent_at) - now) {
                Ok(item) => item,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let shown = match stream {
                Stream::Stderr => self.stderr_line(line),
                Stream::Stdout => self.stdout_line(&line),
            };
            if let (true, Some(shown)) = (self.options.echo, shown) {
                println!("{shown}");
            }
            if matches!(self.outcome.end, RigEnd::L1Lockup | RigEnd::L1Panic) {
                return;
            }
        }
    }

    /// A line of QEMU's stderr.
    fn stderr_line(&mut self, line: String) -> Option<String> {
        if line.contains(QEMU_FEATURE_WARNING) {
            self.feature_warnings += 1;
            return None;
        }
        let shown = format!("[qemu] {line}");
        self.outcome.qemu_lines.push(line);
        Some(shown)
    }

    /// A line of L1's console (QEMU's stdout).
    fn stdout_line(&mut self, raw: &str) -> Option<String> {
        self.last_output = Instant::now();
        let line = tagged_tail(raw).map_or_else(|| strip_terminal_controls(raw), str::to_string);
        match parse_tag(&line) {
            Some(Tagged {
                kind: "rig", text, ..
            }) => self.event(text),
            Some(tagged) => Some(self.run_line(tagged)),
            None => Some(self.l1_line(line)),
        }
    }

    fn event(&mut self, text: &str) -> Option<String> {
        let mut parts = text.splitn(3, ' ');
        let event = RigEvent {
            kind: parts.next().unwrap_or_default().to_string(),
            label: parts.next().unwrap_or_default().to_string(),
            value: parts.next().unwrap_or_default().to_string(),
        };
        let outcome = &mut self.outcome;
        match event.kind.as_str() {
            "vmm-start" => outcome.run_starts.push(RunStart {
                label: event.label.clone(),
                guest: outcome.guest_lines.len(),
                vmm: outcome.vmm_lines.len(),
                probe: outcome.probe_lines.len(),
            }),
            "vmm-exit" => outcome.vmm_status = event.value.trim().parse().ok(),
            "l1-poweroff" if self.poweroff_deadline.is_none() => {
                self.poweroff_deadline = Some(Instant::now() + POWEROFF_GRACE);
            }
            // Only its arrival counts (last_output).
            L1_ALIVE_EVENT => return None,
            _ => {}
        }
        outcome.events.push(event);
        Some(format!("[rig] {text}"))
    }

    /// A line of an inner VMM run: the guest's console, the VMM's stderr or the probe's.
    fn run_line(&mut self, tagged: Tagged<'_>) -> String {
        let outcome = &mut self.outcome;
        let text = tagged.text.to_string();
        let all = match tagged.kind {
            "guest" => &mut outcome.guest_lines,
            "vmm" => &mut outcome.vmm_lines,
            _ => &mut outcome.probe_lines,
        };
        all.push(text.clone());
        let label = tagged.label.unwrap_or("-");
        let index = match outcome.runs.iter().position(|r| r.label == label) {
            Some(index) => index,
            None => {
                outcome.runs.push(RunOutput {
                    label: label.to_string(),
                    ..RunOutput::default()
                });
                outcome.runs.len() - 1
            }
        };
        let run = &mut outcome.runs[index];
        let own = match tagged.kind {
            "guest" => &mut run.guest,
            "vmm" => &mut run.vmm,
            _ => &mut run.probe,
        };
        own.push(text);
        let labelled = self.options.vm_names.iter().find(|(l, _)| l == label);
        let name = match tagged.kind {
            "vmm" => labelled.map_or(self.options.vmm_name, |(_, name)| name),
            kind => kind,
        };
        match labelled {
            Some(_) => format!("[{name}{label}] {}", tagged.text),
            None => format!("[{name}] {}", tagged.text),
        }
    }

    /// L1's own line (its kernel and init).
    fn l1_line(&mut self, line: String) -> String {
        if soft_lockup_seconds(&line).is_some_and(|s| s >= L1_LOCKUP_LIMIT.as_secs()) {
            self.outcome.end = RigEnd::L1Lockup;
        }
        if line.contains(L1_PANIC_MARK) {
            self.outcome.end = RigEnd::L1Panic;
        }
        let shown = format!("[L1] {line}");
        self.outcome.l1_lines.push(line);
        shown
    }
}

/// The seconds in an L1 kernel soft-lockup report (`watchdog: BUG: soft lockup - CPU#2 stuck
/// for 130s! [vcpu3:120]`), or None for any other line.
pub fn soft_lockup_seconds(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("soft lockup - CPU#")?;
    let (_, rest) = rest.split_once(" stuck for ")?;
    let digits = rest.split_once("s!")?.0;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_lockup_lines_are_recognised() {
        assert_eq!(
            soft_lockup_seconds(
                "[  365.1] watchdog: BUG: soft lockup - CPU#3 stuck for 130s! [vcpu3:120]"
            ),
            Some(130)
        );
        assert_eq!(
            soft_lockup_seconds("watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [CPU 0/KVM:99]"),
            Some(22)
        );
        for other in [
            "rcu: INFO: rcu_sched self-detected stall on CPU",
            "soft lockup - CPU#0 stuck for lots! [x:1]",
            "watchdog: BUG: soft lockup - CPU#1 stuck for",
            "",
        ] {
            assert_eq!(soft_lockup_seconds(other), None, "{other}");
        }
    }

    #[test]
    fn topology_parses_and_rejects() {
        let t: Topology = "2x2x2".parse().unwrap();
        assert_eq!(t.cpus(), 8);
        assert_eq!(t.to_string(), "2x2x2");
        for bad in ["2x2", "0x1x1", "axbxc", "1x1x1x1", "", "65x1x1"] {
            assert!(bad.parse::<Topology>().is_err(), "{bad}");
        }
    }

    #[test]
    fn vm_shape_reads_pvmm_flags() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(vm_shape(&[]).unwrap(), (1, 512));
        assert_eq!(
            vm_shape(&args(&["--vcpus", "4", "--memory=1024", "-v"])).unwrap(),
            (4, 1024)
        );
        assert!(vm_shape(&args(&["--vcpus"])).is_err());
        assert!(vm_shape(&args(&["--vcpus", "x"])).is_err());
    }

    #[test]
    fn inner_commands_carry_images_and_cmdline() {
        let cmdline = guest_cmdline(InnerVmm::Pvmm, Some("nproc"), false).unwrap();
        assert!(cmdline.starts_with(GUEST_BASE_CMDLINE));
        let qemu_cmdline = guest_cmdline(InnerVmm::Qemu, None, true).unwrap();
        assert_eq!(qemu_cmdline, "console=ttyS0 reboot=k panic=-1 quiet");
        assert!(cmdline.ends_with(" pvmm_cmd_b64=bnByb2M="));
        let pvmm =
            inner_vmm_command(InnerVmm::Pvmm, &["--vcpus".into(), "4".into()], &cmdline).unwrap();
        assert_eq!(pvmm.first().map(String::as_str), Some(inside::PVMM));
        assert_eq!(pvmm.last().map(String::as_str), Some(inside::GUEST_KERNEL));
        let qemu = inner_vmm_command(InnerVmm::Qemu, &["--vcpus=4".into()], &cmdline).unwrap();
        assert!(qemu.windows(2).any(|w| w[0] == "-smp" && w[1] == "4"));
        assert!(qemu.windows(2).any(|w| w[0] == "-m" && w[1] == "512"));
        assert!(inner_vmm_command(InnerVmm::Pvmm, &["--cmdline=x".into()], &cmdline).is_err());
        assert!(guest_cmdline(InnerVmm::Pvmm, Some(&"x".repeat(2000)), false).is_err());
    }

    #[test]
    fn finds_tags_after_terminal_noise() {
        assert_eq!(
            tagged_tail("oc\u{1b}[?7l\u{1b}[2J@@rig@@ l1-init - 2.21"),
            Some("@@rig@@ l1-init - 2.21")
        );
        assert_eq!(
            tagged_tail("@@guest@@ hello @@rig@@ x"),
            Some("@@guest@@ hello @@rig@@ x")
        );
        assert_eq!(tagged_tail("email@@host"), None);
        assert_eq!(
            strip_terminal_controls("\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS"),
            "SeaBIOS"
        );
    }

    #[test]
    fn vm_specs_parse_and_refuse() {
        let vm: VmSpec = "pvmm --vcpus 2 --memory 256 -- echo a -- b"
            .parse()
            .unwrap();
        assert_eq!(vm.vmm, InnerVmm::Pvmm);
        assert_eq!(vm.args, ["--vcpus", "2", "--memory", "256"]);
        assert_eq!(vm.guest_command.as_deref(), Some("echo a -- b"));
        let bare: VmSpec = "qemu".parse().unwrap();
        assert_eq!(bare, VmSpec::new(InnerVmm::Qemu));
        for bad in ["", "kvmtool", "pvmm --vcpus", "pvmm --memory x -- nproc"] {
            assert!(bad.parse::<VmSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn several_vms_start_together_with_their_own_labels_and_memory() {
        let vm = |text: &str| text.parse::<VmSpec>().unwrap();
        let rig = Rig::with_vms(vec![
            vm("pvmm --vcpus 2 --memory 256 -- nproc"),
            vm("qemu --vcpus 1 --memory 300 -- uname"),
        ])
        .tuning("policy-none".parse().unwrap());
        assert_eq!(rig.labels(), ["0", "1"]);
        let job = rig.job().unwrap();
        assert_eq!(job.guest_memory_mib, 556);
        let lines: Vec<&str> = job.script.lines().collect();
        assert_eq!(lines.len(), 5, "{}", job.script);
        assert!(lines[0].starts_with("rig_run 0 0 /bin/pvmm --vcpus 2 --memory 256 --policy none"));
        assert!(lines[0].ends_with(" &"));
        assert_eq!(lines[1], "rig_vm_0=$!");
        assert!(lines[2].starts_with(&format!("rig_run 1 0 {} ", inside::QEMU)));
        assert!(!lines[2].contains("--policy"));
        assert_eq!(lines[4], "wait $rig_vm_0 $rig_vm_1");
        let one = Rig::new(InnerVmm::Pvmm)
            .guest_command("nproc")
            .job()
            .unwrap();
        assert!(one.script.starts_with("rig_run main 0 /bin/pvmm --initrd"));
        assert_eq!(one.script.lines().count(), 1);
    }

    #[test]
    fn labelled_tags_split_runs_apart() {
        assert_eq!(
            parse_tag("@@guest/1@@ hello"),
            Some(Tagged {
                kind: "guest",
                label: Some("1"),
                text: "hello"
            })
        );
        assert_eq!(
            parse_tag("@@rig@@ vmm-exit 0 4").map(|t| t.kind),
            Some("rig")
        );
        for other in [
            "@@guest/a b@@ x",
            "@@other@@ x",
            "@@guest/@@ x",
            "guest@@ x",
        ] {
            assert_eq!(parse_tag(other), None, "{other}");
        }
        let options = L1Options {
            topology: Topology::default(),
            timeout: Duration::from_secs(1),
            echo: false,
            tuning: L1Tuning::base(),
            vmm_name: "pvmm",
            vm_names: vec![("0".into(), "pvmm"), ("1".into(), "qemu-kvm")],
        };
        let mut collector = Collector::new(&options, Instant::now());
        let shown: Vec<Option<String>> = [
            "@@rig@@ vmm-start 0 1.0",
            "@@rig@@ vmm-start 1 1.1",
            "@@guest/1@@ from one",
            "@@guest/0@@ from zero",
            "@@vmm/1@@ qemu says",
            "@@rig@@ l1-alive - 2.0",
            "@@rig@@ vmm-exit 1 0",
            "plain L1 line",
        ]
        .iter()
        .map(|l| collector.stdout_line(l))
        .collect();
        assert_eq!(shown[2].as_deref(), Some("[guest1] from one"));
        assert_eq!(shown[4].as_deref(), Some("[qemu-kvm1] qemu says"));
        assert_eq!(shown[5], None);
        assert_eq!(shown[7].as_deref(), Some("[L1] plain L1 line"));
        let outcome = collector.outcome;
        let one = outcome.run("1").unwrap();
        assert_eq!(
            (one.guest, one.vmm, one.status),
            (
                &["from one".to_string()][..],
                &["qemu says".to_string()][..],
                Some(0)
            )
        );
        let zero = outcome.run("0").unwrap();
        assert_eq!((zero.guest.len(), zero.status), (1, None));
        assert!(outcome.run_in_progress());
        assert_eq!(combined_status(&outcome, &["1".into()]), Some(0));
        assert_eq!(combined_status(&outcome, &["0".into(), "1".into()]), None);
        assert_eq!(outcome.guest_lines.len(), 2);
    }

    #[test]
    fn task_stat_lines_parse() {
        let line = "4321 (CPU 1/TCG) R 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 1";
        assert_eq!(
            parse_task_stat(line),
            Some(("4321:CPU 1/TCG".into(), "R".into(), 290))
        );
        assert_eq!(parse_task_stat("garbage"), None);
        let own = sample_threads(std::process::id());
        assert!(
            !own.is_empty() && own.iter().all(|l| l.split(' ').count() >= 3),
            "{own:?}"
        );
    }

    #[test]
    fn l1_memory_covers_initrd_and_guest() {
        assert_eq!(l1_memory_mib(100 << 20, 512), 1280);
        assert_eq!(l1_memory_mib(0, 0), 512);
    }

    #[test]
    fn outcome_helpers() {
        let mut outcome = RigOutcome {
            end: RigEnd::Completed,
            vmm_status: Some(0),
            qemu_status: None,
            l1_lines: vec![],
            guest_lines: [
                "pvmm-guest: command begin",
                "4",
                "pvmm-guest: command exit status 0",
            ]
            .map(String::from)
            .to_vec(),
            vmm_lines: vec![],
            probe_lines: vec![],
            qemu_lines: vec![],
            events: vec![
                RigEvent {
                    kind: "vmm-start".into(),
                    label: "a".into(),
                    value: "5.00".into(),
                },
                RigEvent {
                    kind: "guest-init".into(),
                    label: "a".into(),
                    value: "7.50".into(),
                },
            ],
            elapsed: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            run_starts: vec![],
            runs: vec![],
            stall_threads: vec![],
        };
        assert_eq!(outcome.guest_command_output(), ["4"]);
        assert_eq!(outcome.guest_command_status(), Some(0));
        assert_eq!(outcome.boot_to_init_seconds("a"), Some(2.5));
        assert_eq!(outcome.boot_to_init_seconds("b"), None);
        assert_eq!(outcome.exit_code(), 0);
        outcome.end = RigEnd::TimedOut;
        assert_eq!(outcome.exit_code(), EXIT_TIMEOUT);
        outcome.end = RigEnd::L1Lockup;
        outcome.l1_lines =
            vec!["watchdog: BUG: soft lockup - CPU#1 stuck for 48s! [vcpu1:7]".into()];
        assert_eq!(outcome.exit_code(), EXIT_RIG_FAILURE);
        assert!(outcome.summary("pvmm").contains("CPU#1 stuck for 48s"));
        outcome.end = RigEnd::L1Frozen;
        assert_eq!(outcome.exit_code(), EXIT_RIG_FAILURE);
        assert!(outcome.summary("pvmm").starts_with("L1 FROZEN"));
        let event = |kind: &str, label: &str| RigEvent {
            kind: kind.into(),
            label: label.into(),
            value: "0".into(),
        };
        // Run "a" started and has not reported its exit.
        assert!(outcome.run_in_progress());
        outcome.events.push(event("vmm-exit", "a"));
        assert!(!outcome.run_in_progress());
        outcome.events.push(event("vmm-start", "x"));
        assert!(outcome.run_in_progress());
        outcome.events.push(event("l1-poweroff", "-"));
        assert!(!outcome.run_in_progress());
        outcome.end = RigEnd::L1Reset;
        assert_eq!(outcome.exit_code(), EXIT_RIG_FAILURE);
        assert!(outcome.summary("pvmm").starts_with("L1 RESET"));
        outcome.end = RigEnd::KilledOutside;
        outcome.qemu_lines =
            vec!["qemu-system-x86_64: terminating on signal 15 from pid 27815 (bash)".into()];
        assert_eq!(outcome.exit_code(), EXIT_RIG_FAILURE);
        assert!(outcome.summary("pvmm").contains("signal 15 from pid 27815"));
        outcome.end = RigEnd::L1Panic;
        outcome.l1_lines.push(
            "[  204.228331] Kernel panic - not syncing: corrupted stack end detected inside scheduler"
                .into(),
        );
        assert_eq!(outcome.exit_code(), EXIT_RIG_FAILURE);
        assert!(outcome.summary("pvmm").starts_with("L1 PANIC"));
        assert!(outcome.summary("pvmm").contains("corrupted stack end"));
        outcome.end = RigEnd::Completed;
        outcome.vmm_status = None;
        assert_eq!(outcome.exit_code(), EXIT_RIG_FAILURE);
    }
}
