//! Booting L1 under QEMU: the job and options of one boot, its initramfs, QEMU's command line,
//! and how the boot ends.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::console::{spawn_reader, Collector, Stream};
use super::priority;
use super::stall::sample_threads;
use super::{RigEnd, RigError, RigOutcome, Topology, QEMU_SIGNAL_MARK};
use crate::cpio::CpioArchive;
use crate::guest_kernel::GuestKernel;
use crate::host::progress;
use crate::images::L1Images;
use crate::l1_qemu::{self, QemuBinary};
use crate::tuning::L1Tuning;
use crate::workspace::Workspace;

/// L1's kernel command line. `loglevel=4` keeps L1's boot chatter off the console while still
/// showing warnings and errors (RCU stalls, soft lockups) that explain a hung rig.
pub const L1_CMDLINE: &str = "console=ttyS0 panic=-1 loglevel=4";

/// L1 memory besides the guest and the initramfs: L1's kernel, busybox and the inner VMM's own
/// allocations fit in a few hundred MiB; 512 leaves room for page cache and a probe script.
const L1_BASE_MEMORY_MIB: u64 = 512;

/// L1 memory is rounded up to this granule (keeps the QEMU command line tidy).
const L1_MEMORY_GRANULE_MIB: u64 = 256;

/// What L1 should do: a shell script sourced by L1's init (it may call `rig_run`), an optional
/// probe script run alongside each inner VMM, the guest memory it needs (for sizing L1), and
/// the guest kernel its VMs boot (which the L1 images must hold, and which may need another
/// L1 CPU: [`L1Tuning::for_guest_kernel`]).
#[derive(Debug, Clone)]
pub struct L1Job {
    /// Shell code sourced by L1's init after the KVM modules are loaded.
    pub script: String,
    /// Shell script run alongside the inner VMM with `PVMM_PID` set; its output is tagged.
    pub probe: Option<String>,
    /// The most guest memory one inner VMM asks for, in MiB.
    pub guest_memory_mib: u64,
    /// The kernel the script's VMs boot.
    pub guest_kernel: GuestKernel,
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
    /// Print the rig's events (`[rig] vmm-start LABEL ...`, `guest-init`, `vmm-exit`) on
    /// stderr as they arrive, without the rest: progress for long runs.
    pub progress: bool,
    /// QEMU's and L1's settings.
    pub tuning: L1Tuning,
    /// Prefix for the inner VMM's stderr lines, e.g. "pvmm".
    pub vmm_name: &'static str,
    /// Runs whose lines are shown with their label (`[guest1]`, `[pvmm1]`): (label, VMM name).
    /// Runs not listed are shown as `[guest]`, `[vmm_name]`.
    pub vm_names: Vec<(String, &'static str)>,
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

/// L1's memory: the initramfs twice (the packed image and the unpacked files), the guest, and
/// `L1_BASE_MEMORY_MIB`, rounded up to `L1_MEMORY_GRANULE_MIB`.
pub fn l1_memory_mib(initrd_bytes: u64, guest_memory_mib: u64) -> u64 {
    let initrd_mib = initrd_bytes.div_ceil(1 << 20);
    let total = L1_BASE_MEMORY_MIB + 2 * initrd_mib + guest_memory_mib;
    total.div_ceil(L1_MEMORY_GRANULE_MIB) * L1_MEMORY_GRANULE_MIB
}

/// Boots L1 with `job` and collects its output. The building block of [`Rig::run`](super::Rig::run) and the
/// boot benchmark.
pub fn run_l1(
    ws: &Workspace,
    images: &L1Images,
    options: &L1Options,
    job: &L1Job,
) -> Result<RigOutcome, RigError> {
    if !images.has_guest_kernel(job.guest_kernel) {
        return Err(RigError::BadArgs(format!(
            "the L1 images were built without guest kernel {}",
            job.guest_kernel
        )));
    }
    let options = &L1Options {
        tuning: options.tuning.for_guest_kernel(job.guest_kernel),
        ..options.clone()
    };
    let files = RunFiles::write(ws, images, job, &options.tuning)?;
    let memory = l1_memory_mib(files.initrd_bytes, job.guest_memory_mib);
    let qemu = l1_qemu::resolve(ws, options.tuning.qemu)?;
    let mut command = l1_command(&qemu, images, options, &files.initrd, memory);
    progress(&format!(
        "booting L1: {} TCG, topology {} ({} CPUs), {memory} MiB, initramfs {} MiB, timeout {} s, variant {}",
        qemu.version,
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
    if let Some(line) = priority::report(child.0.id()) {
        progress(&line);
    }
    let (sender, receiver) = mpsc::channel();
    if let Some(stdout) = child.0.stdout.take() {
        spawn_reader(stdout, Stream::Stdout, sender.clone());
    }
    if let Some(stderr) = child.0.stderr.take() {
        spawn_reader(stderr, Stream::Stderr, sender);
    }
    Ok((child, receiver))
}

/// Signals that end a process for a fault of its own (a bad access, an illegal instruction, an
/// arithmetic fault, its own abort).
const FAULT_SIGNALS: [i32; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];

/// Whether a process that ended with `status` died of one of [`FAULT_SIGNALS`].
fn died_of_own_fault(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal().is_some_and(|s| FAULT_SIGNALS.contains(&s))
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
        } else if outcome.qemu_status.is_some_and(died_of_own_fault) {
            outcome.end = RigEnd::EmulatorCrash;
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

/// QEMU's command line for L1.
fn l1_command(
    qemu: &QemuBinary,
    images: &L1Images,
    options: &L1Options,
    initrd: &Path,
    memory: u64,
) -> Command {
    let topology = options.topology;
    let tuning = &options.tuning;
    let mut cmdline = L1_CMDLINE.to_string();
    for word in &tuning.cmdline_extra {
        cmdline.push(' ');
        cmdline.push_str(word);
    }
    let mut command = qemu.command();
    priority::raise(&mut command);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l1_memory_covers_initrd_and_guest() {
        assert_eq!(l1_memory_mib(100 << 20, 512), 1280);
        assert_eq!(l1_memory_mib(0, 0), 512);
    }

    #[test]
    fn a_fault_signal_is_the_emulators_own_crash() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;
        // A wait status's low 7 bits are the signal that ended the process; exit codes sit
        // above them.
        assert!(died_of_own_fault(ExitStatus::from_raw(libc::SIGSEGV)));
        assert!(died_of_own_fault(ExitStatus::from_raw(libc::SIGABRT)));
        assert!(!died_of_own_fault(ExitStatus::from_raw(libc::SIGTERM)));
        assert!(!died_of_own_fault(ExitStatus::from_raw(libc::SIGKILL)));
        assert!(!died_of_own_fault(ExitStatus::from_raw(1 << 8)));
    }
}
