//! Counting the rig's outcomes by kind over many boots (`cargo xtask rig-soak`): each round
//! boots every arm (a variant with a guest kernel) once, in turn, so load that comes and goes
//! on a shared machine falls on all arms alike.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pvmm_scheduler::table::{piped, Align};

use crate::guest_kernel::GuestKernel;
use crate::images::L1Images;
use crate::rig::{InnerVmm, KernelForm, Rig, RigEnd, RigError, RigOutcome, Topology, VmSpec};
use crate::tuning::L1Tuning;
use crate::workspace::Workspace;
// pvmm's exit statuses for a guest triple fault and a guest reboot. The rig's guests boot with
// `panic=-1`, so a guest kernel panic ends as a reboot.
use pvmm::exit::{EXIT_GUEST_RESET, EXIT_TRIPLE_FAULT};

/// What L1 reports for an inner VMM it killed at the run's time limit (`timeout -s KILL`:
/// 128 + SIGKILL).
pub const RUN_LIMIT_STATUS: i32 = 128 + 9;

/// What a guest kernel prints when it panics.
pub const GUEST_PANIC_MARK: &str = "Kernel panic - not syncing";
/// What a guest kernel prints when it finds itself stalled: a soft lockup, an RCU stall, a
/// hung task. A run killed at its time limit after such a line is taken as stalled, not as
/// merely slow; the last such line is the one reported.
const GUEST_STALL_MARKS: [&str; 3] = ["BUG: soft lockup", "rcu: INFO:", "INFO: task "];

/// How one rig boot ended, by the first thing that went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BootKind {
    /// Every VM ran its command, exited 0, and L1 powered off.
    Clean,
    /// L1's kernel reported a CPU stuck ([`RigEnd::L1Lockup`]).
    L1Lockup,
    /// L1's kernel panicked ([`RigEnd::L1Panic`]).
    L1Panic,
    /// L1 printed nothing, its heartbeat included ([`RigEnd::L1Frozen`]).
    L1Frozen,
    /// QEMU exited while a VM was running ([`RigEnd::L1Reset`]).
    L1Reset,
    /// QEMU, L1's emulator, died of a fault of its own ([`RigEnd::EmulatorCrash`]).
    EmulatorCrash,
    /// pvmm exited 4: its guest triple-faulted.
    TripleFault,
    /// QEMU (the inner VMM) exited 0 without its guest reporting the command's status: a
    /// guest reset under `-no-reboot`, QEMU's view of a triple fault.
    GuestReset,
    /// The guest kernel panicked ([`GUEST_PANIC_MARK`] on its console) and, under the rig's
    /// `panic=-1`, rebooted: pvmm exits 3, QEMU exits 0 under `-no-reboot`.
    GuestPanic,
    /// The hard timeout passed ([`RigEnd::TimedOut`]).
    Timeout,
    /// L1 killed the inner VMM at the run's own time limit ([`RUN_LIMIT_STATUS`]) after its
    /// guest reported a stall (`GUEST_STALL_MARKS`): the guest stopped making progress, the
    /// way the stalled guest of a timed-out boot does.
    GuestStall,
    /// L1 killed the inner VMM at the run's own time limit before its guest reached init,
    /// with no stall report: a guest that hung silently in early boot, which QEMU's guests do
    /// in the rig as pvmm's do.
    GuestBootHang,
    /// Every VM reported, but L1 did not power off ([`RigEnd::HungAtPowerOff`]).
    PowerOffHang,
    /// Something outside the rig ended QEMU with a signal ([`RigEnd::KilledOutside`]): not a
    /// failure of the rig, left out of its failure rate.
    KilledOutside,
    /// Anything else: a VM exiting with another status, a guest command failing, L1 ending
    /// without a status. Not a known rig failure: a test must not run it again.
    Other,
}

impl BootKind {
    /// Every kind, in table order.
    pub const ALL: [BootKind; 15] = [
        BootKind::Clean,
        BootKind::L1Lockup,
        BootKind::L1Panic,
        BootKind::L1Frozen,
        BootKind::L1Reset,
        BootKind::EmulatorCrash,
        BootKind::TripleFault,
        BootKind::GuestReset,
        BootKind::GuestPanic,
        BootKind::Timeout,
        BootKind::GuestStall,
        BootKind::GuestBootHang,
        BootKind::PowerOffHang,
        BootKind::KilledOutside,
        BootKind::Other,
    ];

    /// Its name in progress lines and tables.
    pub fn name(self) -> &'static str {
        match self {
            BootKind::Clean => "clean",
            BootKind::L1Lockup => "L1 lockup",
            BootKind::L1Panic => "L1 panic",
            BootKind::L1Frozen => "L1 frozen",
            BootKind::L1Reset => "L1 reset",
            BootKind::EmulatorCrash => "emulator crash",
            BootKind::TripleFault => "triple fault",
            BootKind::GuestReset => "guest reset",
            BootKind::GuestPanic => "guest panic",
            BootKind::Timeout => "timeout",
            BootKind::GuestStall => "guest stall",
            BootKind::GuestBootHang => "guest boot hang",
            BootKind::PowerOffHang => "poweroff hang",
            BootKind::KilledOutside => "killed outside",
            BootKind::Other => "other",
        }
    }

    /// A failure the rig's soaks see under pvmm and QEMU alike (L1's own, or a guest's triple
    /// fault, reset, panic, stall or early-boot hang), or QEMU killed from outside: a rig test may run it
    /// again, and a failure that repeats reaches the test's checks at its last try.
    /// [`BootKind::Clean`] and [`BootKind::Other`] are not.
    pub fn is_known_rig_failure(self) -> bool {
        !matches!(self, BootKind::Clean | BootKind::Other)
    }
}

/// The kind of a rig that ended as `end` before its VMs could end it: L1's own failures, the
/// rig's timeout and QEMU killed from outside; None when L1 ran to its end.
pub fn l1_kind(end: RigEnd) -> Option<BootKind> {
    match end {
        RigEnd::L1Lockup => Some(BootKind::L1Lockup),
        RigEnd::L1Panic => Some(BootKind::L1Panic),
        RigEnd::L1Frozen => Some(BootKind::L1Frozen),
        RigEnd::L1Reset => Some(BootKind::L1Reset),
        RigEnd::EmulatorCrash => Some(BootKind::EmulatorCrash),
        RigEnd::TimedOut => Some(BootKind::Timeout),
        RigEnd::KilledOutside => Some(BootKind::KilledOutside),
        RigEnd::Completed | RigEnd::HungAtPowerOff => None,
    }
}

/// The kind of a boot of `vms` labelled `labels`, and a line saying what happened.
pub fn classify(outcome: &RigOutcome, vms: &[VmSpec], labels: &[String]) -> (BootKind, String) {
    if let Some(kind) = l1_kind(outcome.end) {
        return (kind, outcome.summary(vms[0].vmm.name()));
    }
    let mut worst = (BootKind::Clean, String::new());
    for (vm, label) in vms.iter().zip(labels) {
        let kind = vm_kind(outcome, vm.vmm, label);
        if kind != BootKind::Clean && (worst.0 == BootKind::Clean || kind < worst.0) {
            // pvmm's own report of the failure, else its last line, and what the guest's
            // kernel said of its end.
            let run = outcome.run(label);
            let detail = run
                .and_then(|r| {
                    let reported = r.vmm.iter().rev().find(|l| l.contains("pvmm: guest"));
                    reported.or(r.vmm.last()).cloned()
                })
                .unwrap_or_default();
            let mut what = format!("VM {label} ({}): {detail}", vm.vmm.name());
            if let Some(report) = run.and_then(|r| guest_end_report(r.guest)) {
                let _ = write!(what, "; the guest: {report}");
            }
            worst = (kind, what);
        }
    }
    if worst.0 == BootKind::Clean && outcome.end == RigEnd::HungAtPowerOff {
        worst = (BootKind::PowerOffHang, outcome.summary(vms[0].vmm.name()));
    }
    worst
}

/// How the one VM `label` of a boot ended, by its own exit alone (L1's end aside).
pub fn vm_kind(outcome: &RigOutcome, vmm: InnerVmm, label: &str) -> BootKind {
    let Some(run) = outcome.run(label) else {
        return BootKind::Other;
    };
    let panicked = run.guest.iter().any(|l| l.contains(GUEST_PANIC_MARK));
    let reached_init = outcome
        .events_of("guest-init")
        .any(|event| event.label == label);
    match (vmm, run.status, run.command_status()) {
        (_, Some(0), Some(0)) => BootKind::Clean,
        (InnerVmm::Pvmm, Some(EXIT_TRIPLE_FAULT), _) => BootKind::TripleFault,
        (InnerVmm::Pvmm, Some(EXIT_GUEST_RESET), None) if panicked => BootKind::GuestPanic,
        (InnerVmm::Qemu, Some(0), None) if panicked => BootKind::GuestPanic,
        (InnerVmm::Qemu, Some(0), None) => BootKind::GuestReset,
        (_, Some(RUN_LIMIT_STATUS), None) if last_stall_report(run.guest).is_some() => {
            BootKind::GuestStall
        }
        (_, Some(RUN_LIMIT_STATUS), None) if !reached_init => BootKind::GuestBootHang,
        _ => BootKind::Other,
    }
}

/// Where the guest kernel's last stall report ([`GUEST_STALL_MARKS`]) is on its console.
fn last_stall_report(guest: &[String]) -> Option<usize> {
    guest
        .iter()
        .rposition(|l| GUEST_STALL_MARKS.iter().any(|m| l.contains(m)))
}

/// What the guest's kernel said of how it ended: its panic line with the last `RIP:` line
/// before it (where the CPU that failed was: tells a fault in the guest's own code from one in
/// a driver of pvmm's devices), else its last stall report with the `RIP:` after it.
pub fn guest_end_report(guest: &[String]) -> Option<String> {
    if let Some(at) = guest.iter().position(|l| l.contains(GUEST_PANIC_MARK)) {
        let at_rip = first_rip(guest[..at].iter().rev());
        return Some(format!("{}{at_rip}", guest[at].trim()));
    }
    let at = last_stall_report(guest)?;
    let at_rip = first_rip(guest[at..].iter());
    Some(format!("{}{at_rip}", guest[at].trim()))
}

/// ` (at RIP: ...)` for the first `RIP:` line of `lines`, else nothing.
fn first_rip<'a>(mut lines: impl Iterator<Item = &'a String>) -> String {
    lines
        .find(|l| l.contains("RIP: "))
        .map(|l| format!(" (at {})", l.trim()))
        .unwrap_or_default()
}

/// What a soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The variants, booted in turn.
    pub variants: Vec<L1Tuning>,
    /// The guest kernels, booted in turn with every variant (6.1 alone by default).
    pub guest_kernels: Vec<GuestKernel>,
    /// The guest kernel's forms, booted in turn with every kernel (the bzImage alone by
    /// default; PVH needs L1's vmlinux layer).
    pub kernel_forms: Vec<KernelForm>,
    /// Boots per arm.
    pub boots: u32,
    /// The VMs of every boot, side by side in one L1.
    pub vms: Vec<VmSpec>,
    /// L1's topology.
    pub topology: Topology,
    /// Hard limit of one boot.
    pub timeout: Duration,
    /// Where each boot's full log goes (`NNN-ARM.log`, [`SoakArm::name`]).
    pub log_dir: PathBuf,
}

/// One thing a soak compares: a variant whose guests boot one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakArm {
    /// L1's settings as given (the rig adds the CPU model a kernel needs when it boots).
    pub tuning: L1Tuning,
    /// The guests' kernel.
    pub guest_kernel: GuestKernel,
    /// The form the guests boot it in.
    pub form: KernelForm,
    /// The arm's name in the table and the log files: L1's settings as the boot runs them
    /// ([`L1Tuning::for_guest_kernel`]), with `@KERNEL` when the soak's kernels are other than
    /// 6.1 alone (`npt0+epyc-rome@6.12`) and `@FORM` when its forms are other than the bzImage
    /// alone (`npt0@pvh`).
    pub name: String,
}

impl SoakOptions {
    /// The arms in the order each round boots them: every variant with every guest kernel in
    /// every form, the forms taking turns within a kernel and the kernels within a variant.
    pub fn arms(&self) -> Vec<SoakArm> {
        let default_kernel = self
            .guest_kernels
            .iter()
            .all(|&k| k == GuestKernel::default());
        let default_form = self
            .kernel_forms
            .iter()
            .all(|&f| f == KernelForm::default());
        let mut arms = Vec::new();
        for tuning in &self.variants {
            for &guest_kernel in &self.guest_kernels {
                for &form in &self.kernel_forms {
                    let mut name = tuning.for_guest_kernel(guest_kernel).name;
                    if !default_kernel {
                        name = format!("{name}@{guest_kernel}");
                    }
                    if !default_form {
                        name = format!("{name}@{}", form.name());
                    }
                    arms.push(SoakArm {
                        tuning: tuning.clone(),
                        guest_kernel,
                        form,
                        name,
                    });
                }
            }
        }
        arms
    }
}

/// One arm's counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// The arm's name ([`SoakArm::name`]).
    pub variant: String,
    /// Boots made.
    pub boots: u32,
    /// Boots by kind.
    pub counts: BTreeMap<BootKind, u32>,
    /// Boot to guest init (s, L1's clock) of every VM of every clean boot.
    pub boot_seconds: Vec<f64>,
    /// Wall time of every clean boot, QEMU's start to its exit (s).
    pub rig_seconds: Vec<f64>,
}

impl Tally {
    /// Boots of `kind`.
    pub fn count(&self, kind: BootKind) -> u32 {
        self.counts.get(&kind).copied().unwrap_or(0)
    }
}

/// The median of `values` (None when empty).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// Runs the soak, calling `progress` with one line per boot; returns one tally per arm
/// ([`SoakOptions::arms`]). `images(kernel)` gives the L1 images for guests booting `kernel`.
pub fn run_soak<'a>(
    ws: &Workspace,
    images: impl Fn(GuestKernel) -> &'a L1Images,
    options: &SoakOptions,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Tally>, RigError> {
    std::fs::create_dir_all(&options.log_dir).map_err(|source| RigError::Io {
        path: options.log_dir.clone(),
        source,
    })?;
    let arms = options.arms();
    let mut tallies: Vec<Tally> = arms
        .iter()
        .map(|arm| Tally {
            variant: arm.name.clone(),
            ..Tally::default()
        })
        .collect();
    let total = options.boots as usize * arms.len();
    for round in 0..options.boots as usize {
        for (index, arm) in arms.iter().enumerate() {
            let boot = round * arms.len() + index + 1;
            let rig = Rig::with_vms(options.vms.clone())
                .topology(options.topology)
                .timeout(options.timeout)
                .tuning(arm.tuning.clone())
                .guest_kernel(arm.guest_kernel)
                .kernel(arm.form);
            let labels = rig.labels();
            let outcome = rig.run(ws, images(arm.guest_kernel))?;
            let (kind, detail) = classify(&outcome, &options.vms, &labels);
            let log = options.log_dir.join(format!("{boot:03}-{}.log", arm.name));
            let text = format!("{}\nkind: {}\n", outcome_log(&outcome), kind.name());
            std::fs::write(&log, text).map_err(|source| RigError::Io { path: log, source })?;
            let tally = &mut tallies[index];
            tally.boots += 1;
            *tally.counts.entry(kind).or_default() += 1;
            let boot_times: Vec<f64> = labels
                .iter()
                .filter_map(|l| outcome.boot_to_init_seconds(l))
                .collect();
            if kind == BootKind::Clean {
                tally.boot_seconds.extend(&boot_times);
                tally.rig_seconds.push(outcome.elapsed.as_secs_f64());
            }
            let times = boot_times
                .iter()
                .map(|t| format!("{t:.1}"))
                .collect::<Vec<_>>()
                .join("/");
            progress(&format!(
                "boot {boot}/{total} {}: {} (boot-to-init {times} s, rig {:.1} s){}",
                arm.name,
                kind.name(),
                outcome.elapsed.as_secs_f64(),
                if kind == BootKind::Clean {
                    String::new()
                } else {
                    format!(": {detail}")
                }
            ));
        }
    }
    Ok(tallies)
}

/// Every classified line of a boot, tagged, for post-mortems: events, L1's console, each run's
/// guest console and VMM stderr, QEMU's stderr, and the summary.
pub fn outcome_log(outcome: &RigOutcome) -> String {
    let mut text = String::new();
    for event in &outcome.events {
        let _ = writeln!(text, "[rig] {} {} {}", event.kind, event.label, event.value);
    }
    for line in &outcome.l1_lines {
        let _ = writeln!(text, "[L1] {line}");
    }
    for run in &outcome.runs {
        for (tag, lines) in [
            ("guest", &run.guest),
            ("vmm", &run.vmm),
            ("probe", &run.probe),
        ] {
            for line in lines {
                let _ = writeln!(text, "[{tag} {}] {line}", run.label);
            }
        }
    }
    for line in &outcome.qemu_lines {
        let _ = writeln!(text, "[qemu] {line}");
    }
    for line in &outcome.stall_threads {
        let _ = writeln!(text, "[stall] {line}");
    }
    let _ = writeln!(text, "summary: {}", outcome.summary("vmm"));
    text
}

/// A table of tallies: boots, counts by kind, median boot-to-init and rig wall time.
pub fn format_tallies(tallies: &[Tally]) -> String {
    let mut header = vec!["variant".to_string(), "boots".to_string()];
    header.extend(BootKind::ALL.iter().map(|k| k.name().to_string()));
    header.extend(["boot-to-init s".to_string(), "rig s".to_string()]);
    let mut rows = Vec::new();
    for tally in tallies {
        let mut row = vec![tally.variant.clone(), tally.boots.to_string()];
        row.extend(BootKind::ALL.iter().map(|&k| tally.count(k).to_string()));
        for values in [&tally.boot_seconds, &tally.rig_seconds] {
            row.push(median(values).map_or("-".into(), |m| format!("{m:.1}")));
        }
        rows.push(row);
    }
    piped(&[Align::Right], &header, &rows)
}

/// Busy loops on the host (`sh -c 'while ...; do :; done'`), the load under which the rig
/// fails more often; they end when this is dropped, or by themselves when this process dies.
pub struct BusyLoops(Vec<Child>);

impl BusyLoops {
    /// Starts `count` busy loops.
    pub fn start(count: u32) -> Result<BusyLoops, RigError> {
        let script = format!(
            "while kill -0 {} 2> /dev/null; do :; done",
            std::process::id()
        );
        let mut loops = BusyLoops(Vec::new());
        for _ in 0..count {
            let child = Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .spawn()
                .map_err(|source| RigError::Io {
                    path: PathBuf::from("sh"),
                    source,
                })?;
            loops.0.push(child);
        }
        Ok(loops)
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rig::{RigEvent, RunOutput};

    fn event(kind: &str, label: &str, value: &str) -> RigEvent {
        RigEvent {
            kind: kind.into(),
            label: label.into(),
            value: value.into(),
        }
    }

    /// A completed boot whose runs `labels` exited with `statuses`, each guest reporting its
    /// command's status when `reported`.
    fn boot(labels: &[&str], statuses: &[i32], reported: &[bool]) -> RigOutcome {
        let mut events = Vec::new();
        let mut runs = Vec::new();
        for ((label, status), &reported) in labels.iter().zip(statuses).zip(reported) {
            events.push(event("vmm-start", label, "3.0"));
            events.push(event("guest-init", label, "9.0"));
            events.push(event("vmm-exit", label, &status.to_string()));
            let mut guest = vec!["pvmm-guest: command begin".to_string()];
            if reported {
                guest.push("pvmm-guest: command exit status 0".into());
            }
            runs.push(RunOutput {
                label: label.to_string(),
                guest,
                vmm: vec![format!("exit {status}")],
                probe: vec![],
            });
        }
        RigOutcome {
            vmm_status: statuses.last().copied(),
            events,
            elapsed: Duration::from_secs(20),
            timeout: Duration::from_secs(300),
            runs,
            ..RigOutcome::empty(RigEnd::Completed)
        }
    }

    #[test]
    fn boots_are_classified_by_their_first_failure() {
        let vms = [VmSpec::new(InnerVmm::Pvmm), VmSpec::new(InnerVmm::Qemu)];
        let labels = ["0".to_string(), "1".to_string()];
        let kind = |o: &RigOutcome| classify(o, &vms, &labels).0;
        assert_eq!(
            kind(&boot(&["0", "1"], &[0, 0], &[true, true])),
            BootKind::Clean
        );
        let fault = boot(&["0", "1"], &[4, 0], &[false, true]);
        assert_eq!(kind(&fault), BootKind::TripleFault);
        assert!(classify(&fault, &vms, &labels).1.contains("exit 4"));
        let reset = boot(&["0", "1"], &[0, 0], &[true, false]);
        assert_eq!(kind(&reset), BootKind::GuestReset);
        // Both: the earlier kind in table order is reported.
        assert_eq!(
            kind(&boot(&["0", "1"], &[4, 0], &[false, false])),
            BootKind::TripleFault
        );
        assert_eq!(
            kind(&boot(&["0", "1"], &[1, 0], &[true, true])),
            BootKind::Other
        );
        // A VM that never started.
        assert_eq!(kind(&boot(&["0"], &[0], &[true])), BootKind::Other);
        let mut hung = boot(&["0", "1"], &[0, 0], &[true, true]);
        hung.end = RigEnd::HungAtPowerOff;
        assert_eq!(kind(&hung), BootKind::PowerOffHang);
        let mut lockup = boot(&["0", "1"], &[4, 0], &[false, true]);
        lockup.end = RigEnd::L1Lockup;
        assert_eq!(kind(&lockup), BootKind::L1Lockup);
        assert!(BootKind::L1Lockup.is_known_rig_failure());
        assert!(BootKind::GuestPanic.is_known_rig_failure());
        assert!(BootKind::GuestStall.is_known_rig_failure());
        assert!(!BootKind::Other.is_known_rig_failure());
        assert!(!BootKind::Clean.is_known_rig_failure());
    }

    #[test]
    fn a_guest_panic_or_stall_is_known_only_with_the_guests_own_report() {
        let vms = [VmSpec::new(InnerVmm::Pvmm), VmSpec::new(InnerVmm::Qemu)];
        let labels = ["0".to_string(), "1".to_string()];
        let with_guest_line = |statuses: &[i32], vm: usize, line: &str| {
            let mut outcome = boot(&["0", "1"], statuses, &[vm != 0, vm != 1]);
            outcome.runs[vm].guest.push(line.to_string());
            outcome
        };
        let panic = "[   41.2] Kernel panic - not syncing: Attempted to kill init!";
        let pvmm_panic = with_guest_line(&[3, 0], 0, panic);
        let (kind, what) = classify(&pvmm_panic, &vms, &labels);
        assert_eq!(kind, BootKind::GuestPanic);
        assert!(
            what.ends_with(
                "the guest: [   41.2] Kernel panic - not syncing: Attempted to kill init!"
            ),
            "{what}"
        );
        let mut oops = with_guest_line(&[3, 0], 0, "[   40.9] RIP: 0010:acpi_ged_irq_handler+0x1c");
        oops.runs[0].guest.push(panic.to_string());
        let (_, what) = classify(&oops, &vms, &labels);
        assert!(
            what.ends_with("(at [   40.9] RIP: 0010:acpi_ged_irq_handler+0x1c)"),
            "{what}"
        );
        assert_eq!(
            classify(&with_guest_line(&[0, 0], 1, panic), &vms, &labels).0,
            BootKind::GuestPanic
        );
        // A reboot without a panic is not the rig's.
        let reboot = with_guest_line(&[3, 0], 0, "reboot: Restarting system");
        assert_eq!(classify(&reboot, &vms, &labels).0, BootKind::Other);
        let stall =
            "[  205.7] watchdog: BUG: soft lockup - CPU#2 stuck for 23s! [cryptomgr_test:97]";
        let stalled = with_guest_line(&[RUN_LIMIT_STATUS, 0], 0, stall);
        let (kind, what) = classify(&stalled, &vms, &labels);
        assert_eq!(kind, BootKind::GuestStall);
        assert!(what.contains("cryptomgr_test"), "{what}");
        let mut at = stalled.clone();
        at.runs[0]
            .guest
            .push("[  205.7] RIP: 0010:alg_test+0x4f/0x540".into());
        let (_, what) = classify(&at, &vms, &labels);
        assert!(
            what.ends_with("(at [  205.7] RIP: 0010:alg_test+0x4f/0x540)"),
            "{what}"
        );
        // Killed at the limit after init with no stall reported: a slow or hung VMM, not the
        // rig's.
        let killed = with_guest_line(&[RUN_LIMIT_STATUS, 0], 0, "[   12.0] Run /init");
        assert_eq!(classify(&killed, &vms, &labels).0, BootKind::Other);
        // Killed at the limit before init, silent: the guest hung in early boot.
        let mut early = with_guest_line(&[RUN_LIMIT_STATUS, 0], 0, "[    3.1] LSM: Security");
        early.runs[0].guest.retain(|l| l.starts_with('['));
        early
            .events
            .retain(|e| !(e.kind == "guest-init" && e.label == "0"));
        assert_eq!(classify(&early, &vms, &labels).0, BootKind::GuestBootHang);
        assert!(BootKind::GuestBootHang.is_known_rig_failure());
    }

    #[test]
    fn arms_alternate_the_kernels_within_each_variant() {
        let options = |kernels: Vec<GuestKernel>| SoakOptions {
            variants: vec![L1Tuning::default(), "base".parse().unwrap()],
            guest_kernels: kernels,
            kernel_forms: vec![KernelForm::BzImage],
            boots: 1,
            vms: vec![VmSpec::new(InnerVmm::Pvmm)],
            topology: Topology::default(),
            timeout: Duration::from_secs(300),
            log_dir: PathBuf::new(),
        };
        let names = |arms: Vec<SoakArm>| arms.into_iter().map(|a| a.name).collect::<Vec<_>>();
        assert_eq!(
            names(options(vec![GuestKernel::Linux6_1]).arms()),
            ["npt0", "base"]
        );
        let both = options(vec![GuestKernel::Linux6_1, GuestKernel::Linux6_12]).arms();
        assert_eq!(
            names(both.clone()),
            [
                "npt0@6.1",
                "npt0+epyc-rome@6.12",
                "base@6.1",
                "base+epyc-rome@6.12"
            ]
        );
        // The arm keeps the variant as given; the rig adds the CPU model when it boots.
        assert_eq!(both[1].tuning, L1Tuning::default());
        assert_eq!(both[1].guest_kernel, GuestKernel::Linux6_12);
        let forms = SoakOptions {
            kernel_forms: vec![KernelForm::BzImage, KernelForm::Pvh],
            ..options(vec![GuestKernel::Linux6_1])
        }
        .arms();
        assert_eq!(
            names(forms.clone()),
            ["npt0@bzImage", "npt0@pvh", "base@bzImage", "base@pvh"]
        );
        assert_eq!(forms[1].form, KernelForm::Pvh);
        assert_eq!(forms[0].form, KernelForm::BzImage);
    }

    #[test]
    fn medians_and_tables() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let mut tally = Tally {
            variant: "single".into(),
            boots: 3,
            boot_seconds: vec![8.0, 9.0],
            rig_seconds: vec![20.0],
            ..Tally::default()
        };
        tally.counts.insert(BootKind::Clean, 2);
        tally.counts.insert(BootKind::TripleFault, 1);
        let table = format_tallies(&[tally]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("triple fault"));
        let cells: Vec<&str> = lines[1].split('|').map(str::trim).collect();
        assert_eq!(&cells[1..4], ["single", "3", "2"]);
        assert_eq!(cells[9], "1");
        assert_eq!(cells[cells.len() - 3..cells.len() - 1], ["8.5", "20.0"]);
    }
}
