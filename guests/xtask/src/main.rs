//! `cargo xtask`: pvmm's guest images, the QEMU-nested rig and the boot benchmark.
//!
//! - `cargo xtask guest`: builds the guest kernel and initramfs into `guests/out/`.
//! - `cargo xtask rig [--topology SxCxT] [--timeout SECS] [--guest-cmd CMD] [--vmm pvmm|qemu]
//!   -- [PVMM ARGS]`: boots L1 under QEMU TCG and runs pvmm (or QEMU with KVM) in it; exits
//!   with pvmm's exit status, 124 on timeout, 125 when L1 ended without reporting a status.
//! - `cargo xtask bench-boot [--vcpus N] [--memory MIB] [--runs N] [--qemu-only]`: boot time to
//!   guest init, pvmm vs QEMU, in one L1 boot.
//!
//! Exit codes of the xtask itself: 2 bad flags, 1 build failure.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use pvmm_rig::bench::{run_bench, BenchOptions};
use pvmm_rig::images::{self, L1Needs, Workspace};
use pvmm_rig::rig::EXIT_RIG_FAILURE;
use pvmm_rig::{InnerVmm, Rig, RigError, Topology};

/// The guest command when none is given: the README's demo prints the guest's CPU count.
const DEFAULT_GUEST_CMD: &str =
    "echo \"guest online CPUs: $(cat /sys/devices/system/cpu/online) (nproc $(nproc))\"";

/// Exit code for a failed build or an unusable setup.
const EXIT_BUILD_FAILURE: u8 = 1;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "pvmm guest images, QEMU-nested rig and boot benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Build the guest kernel (Debian cloud kernel) and busybox initramfs into guests/out/.
    Guest,
    /// Boot the QEMU-nested rig and run pvmm (or QEMU) on the guest inside it.
    ///
    /// Exits with pvmm's exit status; 124 when the timeout killed QEMU; 125 when L1 ended
    /// without reporting pvmm's status. Console lines are prefixed [L1], [guest], [pvmm]
    /// (pvmm's stderr), [rig] (events), [qemu] (QEMU's stderr).
    Rig {
        /// L1 CPU topology: sockets x cores x threads.
        #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
        topology: Topology,
        /// Hard timeout in seconds for the whole run; QEMU is killed when it passes.
        #[arg(long, default_value_t = 300, value_name = "SECS")]
        timeout: u64,
        /// Shell command the guest runs before powering off.
        #[arg(long, value_name = "CMD", default_value = DEFAULT_GUEST_CMD)]
        guest_cmd: String,
        /// The VMM inside L1: pvmm, or qemu (-enable-kvm, same kernel, initrd, vCPUs, memory).
        #[arg(long, default_value = "pvmm", value_name = "pvmm|qemu")]
        vmm: InnerVmm,
        /// Shell script file L1 runs alongside the VMM (PVMM_PID is set); output tagged [probe].
        #[arg(long, value_name = "FILE")]
        l1_probe: Option<PathBuf>,
        /// Run L1 with -accel tcg,thread=single (slower; a fallback if L1 hangs).
        #[arg(long)]
        tcg_single: bool,
        /// Arguments for pvmm, after `--` (e.g. -- --vcpus 4). The rig adds --initrd, --cmdline
        /// and the kernel.
        #[arg(last = true, value_name = "PVMM ARGS")]
        pvmm_args: Vec<String>,
    },
    /// Boot time to guest init: pvmm vs qemu -enable-kvm, alternating in one L1 boot.
    BenchBoot {
        /// Guest vCPUs (both VMMs).
        #[arg(long, default_value_t = 4)]
        vcpus: u32,
        /// Guest memory in MiB (both VMMs).
        #[arg(long, default_value_t = 512)]
        memory: u64,
        /// Boots per VMM.
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// L1 CPU topology.
        #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
        topology: Topology,
        /// Measure only QEMU (while pvmm cannot boot yet).
        #[arg(long)]
        qemu_only: bool,
        /// Print every rig line.
        #[arg(long)]
        verbose: bool,
        /// Leave `quiet` off the guest command line (measures the serial console too).
        #[arg(long)]
        boot_log: bool,
    },
}

/// Exit code for a rig that could not run: 2 for bad arguments, else [`EXIT_RIG_FAILURE`].
fn rig_error_exit(error: &RigError) -> u8 {
    match error {
        RigError::BadArgs(_) | RigError::BadTopology(_) => 2,
        _ => EXIT_RIG_FAILURE as u8,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ws = match Workspace::locate() {
        Ok(ws) => ws,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            return ExitCode::from(EXIT_BUILD_FAILURE);
        }
    };
    let started = Instant::now();
    match cli.command {
        Task::Guest => match images::build_guest(&ws) {
            Ok(guest) => {
                eprintln!(
                    "xtask: guest images ready in {:.1} s: kernel {} ({}), initramfs {}",
                    started.elapsed().as_secs_f64(),
                    guest.kernel.display(),
                    guest.kernel_package,
                    guest.initrd.display()
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("xtask: error: {error}");
                ExitCode::from(EXIT_BUILD_FAILURE)
            }
        },
        Task::Rig {
            topology,
            timeout,
            guest_cmd,
            vmm,
            l1_probe,
            tcg_single,
            pvmm_args,
        } => {
            let needs = L1Needs {
                pvmm: vmm == InnerVmm::Pvmm,
                qemu: vmm == InnerVmm::Qemu,
            };
            let probe = match l1_probe.map(std::fs::read_to_string).transpose() {
                Ok(probe) => probe,
                Err(error) => {
                    eprintln!("xtask: error: cannot read --l1-probe: {error}");
                    return ExitCode::from(2);
                }
            };
            let images = match images::build_l1(&ws, needs) {
                Ok(images) => images,
                Err(error) => {
                    eprintln!("xtask: error: {error}");
                    return ExitCode::from(EXIT_BUILD_FAILURE);
                }
            };
            eprintln!(
                "xtask: images ready in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            let mut rig = Rig::new(vmm)
                .topology(topology)
                .timeout(Duration::from_secs(timeout))
                .guest_command(guest_cmd)
                .pvmm_args(pvmm_args)
                .tcg_multi_thread(!tcg_single)
                .echo(true);
            if let Some(probe) = probe {
                rig = rig.l1_probe(probe);
            }
            match rig.run(&ws, &images) {
                Ok(outcome) => {
                    eprintln!("xtask: {}", outcome.summary(vmm.name()));
                    ExitCode::from(outcome.exit_code().clamp(0, 255) as u8)
                }
                Err(error) => {
                    eprintln!("xtask: error: {error}");
                    ExitCode::from(rig_error_exit(&error))
                }
            }
        }
        Task::BenchBoot {
            vcpus,
            memory,
            runs,
            topology,
            qemu_only,
            verbose,
            boot_log,
        } => {
            let needs = L1Needs {
                pvmm: !qemu_only,
                qemu: true,
            };
            let images = match images::build_l1(&ws, needs) {
                Ok(images) => images,
                Err(error) => {
                    eprintln!("xtask: error: {error}");
                    return ExitCode::from(EXIT_BUILD_FAILURE);
                }
            };
            let options = BenchOptions {
                vcpus,
                memory_mib: memory,
                runs: runs.max(1),
                topology,
                with_pvmm: !qemu_only,
                echo: verbose,
                quiet: !boot_log,
            };
            match run_bench(&ws, &images, &options) {
                Ok(report) => {
                    println!("{}", report.table(&options));
                    eprintln!("xtask: {}", report.outcome.summary("last VMM"));
                    if report.qemu.median().is_some()
                        && (qemu_only || report.pvmm.median().is_some())
                    {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(EXIT_RIG_FAILURE as u8)
                    }
                }
                Err(error) => {
                    eprintln!("xtask: error: {error}");
                    ExitCode::from(EXIT_RIG_FAILURE as u8)
                }
            }
        }
    }
}
