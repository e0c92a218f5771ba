//! `cargo xtask`: pvmm's guest images, the QEMU-nested rig and the boot benchmark.
//!
//! - `cargo xtask guest`: builds the guest kernel and initramfs into `guests/out/`.
//! - `cargo xtask rig [--topology SxCxT] [--timeout SECS] [--guest-cmd CMD] [--vmm pvmm|qemu]
//!   -- [PVMM ARGS]`: boots L1 under QEMU TCG and runs pvmm (or QEMU with KVM) in it; exits
//!   with pvmm's exit status, 124 on timeout, 125 when L1 ended without reporting a status.
//! - `cargo xtask bench-boot [--vcpus N] [--memory MIB] [--runs N] [--qemu-only]`: boot time to
//!   guest init, pvmm vs QEMU, in one L1 boot.
//! - `cargo xtask bench-placement [--threads 1,2,4] [--seconds S] [--duty PCT] [--period-ms P]
//!   [--policies LIST]`: the seeds' kernbench-like scenario under every placement policy and
//!   `none`, one table per thread count (package idle, work, migrations, modelled energy).
//!
//! Exit codes of the xtask itself: 2 bad flags, 1 build failure.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use pvmm_rig::bench::{run_bench, BenchOptions};
use pvmm_rig::images::{self, L1Needs, Workspace};
use pvmm_rig::placement_bench::{
    format_bench_table, run_placement_bench, PlacementBenchOptions, BENCH_POLICIES,
    KERNBENCH_DUTY_PERCENT, KERNBENCH_PERIOD_MS,
};
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
    /// Placement benchmark: the seeds' kernbench-like load (N busy guest threads with a
    /// kernbench duty cycle) under every policy and `none`, in one L1 boot; one table per N
    /// with package idle, work done, migrations and modelled energy (performance = 1.00).
    BenchPlacement {
        /// Busy guest thread counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        threads: Vec<u32>,
        /// Guest vCPUs.
        #[arg(long, default_value_t = 4)]
        vcpus: u32,
        /// Seconds of load per case.
        #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=3600))]
        seconds: u32,
        /// pvmm-load duty cycle in percent (default: the seeds' kernbench busy fraction, 29 %).
        #[arg(long, default_value_t = KERNBENCH_DUTY_PERCENT, value_parser = clap::value_parser!(u32).range(0..=100))]
        duty: u32,
        /// pvmm-load period in ms (default 70: 20 ms bursts at 29 %, as the seeds' scenario).
        #[arg(long, default_value_t = KERNBENCH_PERIOD_MS, value_parser = clap::value_parser!(u32).range(1..=60000))]
        period_ms: u32,
        /// Policies, comma-separated (pvmm --policy values; `none` = no pinning).
        #[arg(long, value_delimiter = ',', default_values_t = BENCH_POLICIES.map(String::from))]
        policies: Vec<String>,
        /// L1 CPU topology.
        #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
        topology: Topology,
        /// Print every rig line.
        #[arg(long)]
        verbose: bool,
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
        Task::BenchPlacement {
            threads,
            vcpus,
            seconds,
            duty,
            period_ms,
            policies,
            topology,
            verbose,
        } => {
            if let Some(bad) = threads.iter().find(|&&n| n == 0 || n > 1024) {
                eprintln!("xtask: error: invalid --threads value {bad}: expected 1-1024");
                return ExitCode::from(2);
            }
            let images = match images::build_l1(
                &ws,
                L1Needs {
                    pvmm: true,
                    qemu: false,
                },
            ) {
                Ok(images) => images,
                Err(error) => {
                    eprintln!("xtask: error: {error}");
                    return ExitCode::from(EXIT_BUILD_FAILURE);
                }
            };
            let options = PlacementBenchOptions {
                threads,
                vcpus,
                seconds,
                duty_percent: duty,
                period_ms,
                policies,
                topology,
                echo: verbose,
            };
            match run_placement_bench(&ws, &images, &options) {
                Ok((results, failures, outcome)) => {
                    if let Some(path) = std::env::var_os("PVMM_RIG_DUMP") {
                        // Debugging aid: every classified line, for a failed case's post-mortem.
                        let mut text = String::new();
                        for (tag, lines) in [
                            ("guest", &outcome.guest_lines),
                            ("pvmm", &outcome.vmm_lines),
                            ("probe", &outcome.probe_lines),
                        ] {
                            for line in lines {
                                text.push_str(&format!("[{tag}] {line}\n"));
                            }
                        }
                        if let Err(error) = std::fs::write(&path, text) {
                            eprintln!(
                                "xtask: cannot write {}: {error}",
                                PathBuf::from(&path).display()
                            );
                        }
                    }
                    for &n in &options.threads {
                        let rows: Vec<_> = results.iter().filter(|r| r.threads == n).collect();
                        let title = format!(
                            "N = {n}: pvmm-load --threads {n} --duty {duty} --period-ms {period_ms} --seconds {seconds}, {vcpus} vCPUs, L1 {topology}",
                        );
                        println!("{}", format_bench_table(&title, &rows));
                    }
                    for failure in &failures {
                        eprintln!(
                            "xtask: {} with N = {} not measured: {}",
                            failure.policy, failure.threads, failure.reason
                        );
                    }
                    eprintln!(
                        "xtask: {} (bench took {:.0} s)",
                        outcome.summary("last pvmm"),
                        started.elapsed().as_secs_f64()
                    );
                    if failures.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(EXIT_RIG_FAILURE as u8)
                    }
                }
                Err(error) => {
                    eprintln!("xtask: error: {error}");
                    ExitCode::from(rig_error_exit(&error))
                }
            }
        }
    }
}
