//! What a rig run produced: how it ended ([`RigEnd`]), L1's events, each inner VMM run's lines
//! ([`RunLines`]), and the exit codes and summaries the xtask reports.

use std::process::ExitStatus;
use std::time::Duration;

use super::soft_lockup_seconds;

/// How long L1 gets to power off after the inner VMM's exit status arrived. A TCG L1 powers
/// off in well under a second; 30 s is far beyond that and still catches the power-off hangs
/// (RCU stalls) seen in one of three manual runs.
pub const POWEROFF_GRACE: Duration = Duration::from_secs(30);

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
    /// QEMU (L1's emulator) died of a fault of its own (SIGSEGV, SIGBUS, SIGILL, SIGFPE or
    /// SIGABRT, with no `terminating on signal` line: nobody sent it), seen once 5 s into L1's
    /// boot, before any inner VMM ran. Whatever L1 ran, the emulator's crash is the emulator's
    /// defect.
    EmulatorCrash,
}

impl RigEnd {
    /// L1's own kernel failed: it reported one of its CPUs stuck (`BUG: soft lockup - CPU#n
    /// stuck for 130s! [vcpu3:120]`, seen in CI with pvmm's vCPU threads and with QEMU's)
    /// because TCG's emulated SVM stopped returning from guest mode, or it panicked (seen once
    /// under load: a stack overflow in L1's page-fault entry on the CPU running a vCPU thread),
    /// froze (no output at all, its heartbeat included: seen in CI and twice under load, the
    /// guest's console stopping mid-line), or reset (QEMU exited in the middle of a run, L1
    /// silent: seen under load). No user-space VMM can cause any of these: its threads are
    /// preemptible, KVM's run loop gives the CPU up when L1's scheduler asks, and a broken
    /// kernel stack in L1 is L1's CPU state, which only the emulator keeps.
    pub fn is_l1_failure(self) -> bool {
        matches!(
            self,
            RigEnd::L1Lockup
                | RigEnd::L1Panic
                | RigEnd::L1Frozen
                | RigEnd::L1Reset
                | RigEnd::EmulatorCrash
        )
    }
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
    /// each, `NAME STATE CPU_MS` with the CPU time it used over
    /// [`STALL_SAMPLE`](super::STALL_SAMPLE). Tells a deadlocked emulator (every thread asleep)
    /// from a spinning one.
    pub stall_threads: Vec<String>,
}

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

/// The guest command's lines: between its markers, less the guest kernel's own messages, which
/// the console interleaves with them (a warning the kernel prints while the command runs,
/// such as its clocksource watchdog's under a loaded host, is not the command's output).
fn command_output(guest: &[String]) -> Vec<&str> {
    guest
        .iter()
        .map(String::as_str)
        .skip_while(|l| !l.starts_with("pvmm-guest: command begin"))
        .skip(1)
        .take_while(|l| !l.starts_with("pvmm-guest: command exit status"))
        .filter(|l| !is_kernel_message(l))
        .collect()
}

/// Whether `line` is a kernel log line: `[<seconds since boot>] ...`.
fn is_kernel_message(line: &str) -> bool {
    line.strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .is_some_and(|(stamp, _)| stamp.trim().parse::<f64>().is_ok())
}

fn command_status(guest: &[String]) -> Option<i32> {
    guest
        .iter()
        .find_map(|l| l.strip_prefix("pvmm-guest: command exit status "))
        .and_then(|s| s.trim().parse().ok())
}

impl RigOutcome {
    /// An outcome that ended as `end` with nothing reported: no lines, events or runs (what a
    /// test builds on).
    pub fn empty(end: RigEnd) -> RigOutcome {
        RigOutcome {
            end,
            vmm_status: None,
            qemu_status: None,
            l1_lines: vec![],
            guest_lines: vec![],
            vmm_lines: vec![],
            probe_lines: vec![],
            qemu_lines: vec![],
            events: vec![],
            elapsed: Duration::ZERO,
            timeout: Duration::ZERO,
            run_starts: vec![],
            runs: vec![],
            stall_threads: vec![],
        }
    }

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
                | RigEnd::KilledOutside
                | RigEnd::EmulatorCrash,
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
            (RigEnd::EmulatorCrash, _) => format!(
                "EMULATOR CRASH: QEMU running L1 died ({}) after {secs:.1} s; exit {EXIT_RIG_FAILURE}",
                self.qemu_status.map_or("no status".to_string(), |s| s.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_helpers() {
        let mut outcome = RigOutcome {
            end: RigEnd::Completed,
            vmm_status: Some(0),
            qemu_status: None,
            l1_lines: vec![],
            guest_lines: [
                "pvmm-guest: command begin",
                "[   15.657831] tsc: Marking TSC unstable due to clocksource watchdog",
                "4",
                "[not a time] 5",
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
        // The kernel's message is not the command's; a line merely in brackets is.
        assert_eq!(outcome.guest_command_output(), ["4", "[not a time] 5"]);
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
