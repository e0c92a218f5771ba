//! `cargo xtask`: pvmm's guest images, the QEMU-nested rig and the boot benchmark.
//!
//! - `cargo xtask guest [--guest-kernel 6.1|6.12]`: builds the guest kernel and initramfs into
//!   `guests/out/` (with 6.12, Debian 13's kernel too).
//! - `cargo xtask rig [--topology SxCxT] [--timeout SECS] [--guest-cmd CMD] [--vmm pvmm|qemu]
//!   -- [PVMM ARGS]`: boots L1 under QEMU TCG and runs pvmm (or QEMU with KVM) in it; exits
//!   with pvmm's exit status, 124 on timeout, 125 when L1 ended without reporting a status.
//!   `--vm "VMM [ARGS] [-- CMD]"` (repeatable) runs several VMs side by side instead;
//!   `--variant` picks L1's settings; `--guest-kernel 6.12` boots the guests on Debian 13's
//!   kernel (L1 stays on 6.1).
//! - `cargo xtask rig-soak [--boots N] [--variant A,B] [--guest-kernel 6.1,6.12] [--vms K]
//!   [--load N]`: boots the rig many times, the variants (each with each guest kernel) taking
//!   turns, and counts the outcomes by kind.
//! - `cargo xtask rig-guest-soak [--guests N] [--load N]`: N guests one after another in one
//!   L1, and L1's levels after each (what pvmm leaves behind).
//! - `cargo xtask bench-boot [--vcpus N] [--memory MIB] [--rounds K] [--kernels bzimage,pvh]
//!   [--qemu-only] [--guest-kernel 6.1|6.12]`: boot time to guest init, pvmm vs QEMU, each on
//!   the bzImage and through PVH, in one L1 boot.
//! - `cargo xtask bench-placement [--threads 1,2,4] [--seconds S] [--duty PCT] [--period-ms P]
//!   [--policies LIST] [--rounds K]`: a kernbench-like load (the simulator's scenario of the
//!   sched_mc_power_savings kernbench tables) under every placement policy and `none`, one table per thread count (package idle, work, migrations, modelled energy).
//! - `cargo xtask bench-host [--vms 1,2,4] [--regimes qemu,pvmm,pvmm-host] [--seconds S] [--build N]
//!   [--rounds K]`:
//!   several VMs under `pvmm host`, each pvmm on its own, and QEMU unpinned, one table per VM
//!   count.
//! - `cargo xtask bench-io [--rounds K] [--disk-mib M] [--net-mib M] [--random-secs S]`: pvmm's
//!   virtio disk and network against QEMU's in one L1 boot, as ratios.
//! - `cargo xtask bench-kernbench [--jobs 2,4,8] [--policies LIST] [--rounds K]`: a real
//!   compile in a pvmm guest under each policy in one L1 boot, one table per N (run time,
//!   package idle, modelled energy and power), with the simulator's rows beside.
//!
//! Every benchmark runs on `pvmm_rig::runner`: `--rounds K` runs each case K times, the order
//! of each table's cases turned by one place each round; a run's progress line as it is
//! measured, then the tables; L1 failing by itself costs only the runs it cut off.
//! Exit codes of the xtask itself: 2 bad flags, 1 build failure.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod guest_soak;
mod io;
mod kernbench;
mod placement;
mod soak;

use clap::{Args, Parser, Subcommand};
use pvmm_rig::bench::{BenchOptions, BootBench};
use pvmm_rig::host_bench::{HostBench, HostBenchOptions, Regime};
use pvmm_rig::images::{self, L1Needs};
use pvmm_rig::placement_bench::{KERNBENCH_DUTY_PERCENT, KERNBENCH_PERIOD_MS};
use pvmm_rig::rig::EXIT_RIG_FAILURE;
use pvmm_rig::runner::{self, Benchmark, Report};
use pvmm_rig::tuning::DEFAULT_VARIANT;
use pvmm_rig::workspace::Workspace;
use pvmm_rig::{GuestKernel, InnerVmm, KernelForm, L1Tuning, Rig, RigError, Topology, VmSpec};

/// The guest command when none is given: the README's demo prints the guest's CPU count.
const DEFAULT_GUEST_CMD: &str =
    "echo \"guest online CPUs: $(cat /sys/devices/system/cpu/online) (nproc $(nproc))\"";

/// Exit code for a failed build or an unusable setup.
const EXIT_BUILD_FAILURE: u8 = 1;

/// The most `--rounds` a benchmark takes: 20 rounds of the shortest one (bench-placement's
/// defaults, 15 runs of about 40 s each) are already over three hours of L1 time on this rig;
/// more is more likely a typo than a plan.
const ROUNDS_MAX: i64 = 20;

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
    Guest(GuestArgs),
    /// Boot the QEMU-nested rig and run pvmm (or QEMU) on the guest inside it.
    ///
    /// Exits with pvmm's exit status; 124 when the timeout killed QEMU; 125 when L1 ended
    /// without reporting pvmm's status. Console lines are prefixed with their source in
    /// brackets: L1, guest, pvmm (pvmm's stderr), rig (events), qemu (QEMU's stderr).
    Rig(RigArgs),
    /// Boot the rig many times and count the outcomes by kind, per variant (variants take
    /// turns, one boot each per round). Presets: base, qemu10, single, tb256, cpu-max,
    /// epyc-rome, no-x2apic, svm-lean, npt0, hpoll0, nothp, quiet-clock, policy-none (see
    /// guests/README.md); join them with '+'.
    RigSoak(soak::SoakArgs),
    /// Run many guests one after another in one L1 and read L1 after each (memory, kernel
    /// memory, processes, threads, open files, KVM VMs, /tmp): what pvmm leaves behind.
    RigGuestSoak(guest_soak::GuestSoakArgs),
    /// Boot time to guest init: pvmm vs qemu -enable-kvm, each on the bzImage and on the
    /// vmlinux through PVH, taking turns in one L1 boot.
    BenchBoot(BootBenchArgs),
    /// Placement benchmark: the simulator's kernbench-like load (N busy guest threads with a
    /// kernbench duty cycle) under every policy and `none`, in one L1 boot; one table per N
    /// with package idle, work done, migrations and modelled energy (performance = 1.00).
    BenchPlacement(placement::PlacementBenchArgs),
    /// Host-wide placement benchmark: 1, 2 and 4 VMs side by side in one L1, each guest with
    /// one kernbench-like thread, under `pvmm host` (pvmm-host), each pvmm on its own (pvmm)
    /// and QEMU unpinned (qemu); one L1 boot per run, one table per VM count (package idle,
    /// work, migrations, modelled energy per unit of work relative to qemu).
    BenchHost(HostBenchArgs),
    /// I/O benchmark: pvmm's virtio disk and network against QEMU's (same root disk, scratch
    /// disk and tap network), taking turns in one L1 boot: sequential O_DIRECT write and read,
    /// 4 KiB random reads, TCP each way; medians and pvmm/QEMU ratios.
    BenchIo(io::IoBenchArgs),
    /// Kernbench: a real compile (`make -jN` of a pinned C tree, with a Debian 12 toolchain
    /// on a read-only disk) in a pvmm guest under each policy, in one L1 boot; one table per
    /// N with run time, package idle, modelled energy and power (performance = 1.00), and the
    /// simulator's kernbench rows for the same N.
    BenchKernbench(kernbench::KernbenchArgs),
}

#[derive(Debug, Args)]
struct GuestArgs {
    /// Also fetch this guest kernel: 6.1 (Debian 12's cloud kernel, L1's own, always built)
    /// or 6.12 (Debian 13's, from trixie through a private apt).
    #[arg(long, default_value = "6.1", value_name = "6.1|6.12")]
    guest_kernel: GuestKernel,
}

#[derive(Debug, Args)]
struct BootBenchArgs {
    /// Guest vCPUs (both VMMs).
    #[arg(long, default_value_t = 4)]
    vcpus: u32,
    /// Guest memory in MiB (both VMMs).
    #[arg(long, default_value_t = 512)]
    memory: u64,
    /// Rounds: boots per VMM and kernel form, all in one L1 boot, the contenders' order
    /// turned by one place each round (`--runs` is the same flag).
    #[arg(long, visible_alias = "runs", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=ROUNDS_MAX))]
    rounds: u32,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// Measure only QEMU.
    #[arg(long)]
    qemu_only: bool,
    /// Kernel forms each VMM boots, comma-separated: bzimage (the Debian bzImage), pvh (the
    /// same kernel uncompressed, an ELF vmlinux entered through PVH).
    #[arg(long, value_delimiter = ',', default_value = "bzimage,pvh", value_parser = parse_kernel_form)]
    kernels: Vec<KernelForm>,
    /// Print every rig line.
    #[arg(long)]
    verbose: bool,
    /// Leave `quiet` off the guest command line (measures the serial console too).
    #[arg(long)]
    boot_log: bool,
    /// The guests' kernel: 6.1 (L1's own) or 6.12 (Debian 13's; bzimage only).
    #[arg(long, default_value = "6.1", value_name = "6.1|6.12")]
    guest_kernel: GuestKernel,
}

#[derive(Debug, Args)]
struct HostBenchArgs {
    /// VM counts, comma-separated (2 vCPUs each).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4", value_parser = clap::value_parser!(u32).range(1..=4))]
    vms: Vec<u32>,
    /// Regimes, comma-separated: qemu, pvmm, pvmm-host (the first is the tables' reference).
    #[arg(long, value_delimiter = ',', default_value = "qemu,pvmm,pvmm-host")]
    regimes: Vec<Regime>,
    /// One-second load rounds per guest (the VMs' loads must overlap: several VMs booting
    /// at once in L1 reach their load tens of seconds apart).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(5..=3600))]
    seconds: u32,
    /// pvmm-load duty cycle in percent (default: the simulator's kernbench busy fraction, 29 %).
    #[arg(long, default_value_t = KERNBENCH_DUTY_PERCENT, value_parser = clap::value_parser!(u32).range(0..=100))]
    duty: u32,
    /// pvmm-load period in ms.
    #[arg(long, default_value_t = KERNBENCH_PERIOD_MS, value_parser = clap::value_parser!(u32).range(1..=60000))]
    period_ms: u32,
    /// Instead of pvmm-load, each guest builds the kernbench tree with `make -jN` (N = this
    /// value) from the shared read-only kernbench disk, as bench-kernbench does; the table
    /// then gives each VM's build time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    build: Option<u32>,
    /// With `--build`: compiler flags after the tree's own `-O2 -Wall -Wextra` (its
    /// Makefile's MYCFLAGS); `-O0` builds in about half the time.
    #[arg(long, default_value = "", value_name = "FLAGS", requires = "build")]
    mycflags: String,
    /// Rounds: every case once per round, one L1 boot each, the regimes' order turned by one
    /// place each round; the tables give each regime's medians, and each run is printed as it
    /// ends.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=ROUNDS_MAX))]
    rounds: u32,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// Print every rig line.
    #[arg(long)]
    verbose: bool,
}

/// `--kernels` values.
fn parse_kernel_form(text: &str) -> Result<KernelForm, String> {
    match text {
        "bzimage" => Ok(KernelForm::BzImage),
        "pvh" => Ok(KernelForm::Pvh),
        other => Err(format!("unknown kernel form '{other}' (bzimage, pvh)")),
    }
}

/// `cargo xtask bench-host`: every (VM count, regime) case once per round, one L1 boot each
/// (booted again, up to three times, when L1 fails by itself before its VMs ended), then the
/// tables.
fn bench_host(ws: &Workspace, started: Instant, args: HostBenchArgs) -> ExitCode {
    if args.regimes.is_empty() || args.vms.is_empty() {
        eprintln!("xtask: error: --regimes and --vms need at least one value each");
        return ExitCode::from(2);
    }
    let needs = L1Needs {
        pvmm: true,
        qemu: args.regimes.contains(&Regime::Qemu),
        vmlinux: false,
        kernbench: args.build.is_some(),
        ..Default::default()
    };
    let images = match build_l1(ws, needs) {
        Ok(images) => images,
        Err(code) => return code,
    };
    let options = HostBenchOptions {
        vms: args.vms.iter().map(|&n| n as usize).collect(),
        regimes: args.regimes,
        seconds: args.seconds,
        duty_percent: args.duty,
        period_ms: args.period_ms,
        build_jobs: args.build,
        mycflags: args.mycflags,
        rounds: args.rounds,
        topology: args.topology,
        echo: args.verbose,
    };
    let bench = HostBench::new(ws, &images, options);
    let report = match run_benchmark(&bench) {
        Ok(report) => report,
        Err(code) => return code,
    };
    print!("{}", bench.tables(&report.results));
    finish_benchmark(&report, started)
}

#[derive(Debug, Args)]
struct RigArgs {
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
    /// Shell script file L1 runs alongside the VMM (PVMM_PID is set); its output tagged "probe".
    #[arg(long, value_name = "FILE")]
    l1_probe: Option<PathBuf>,
    /// Run L1 with -accel tcg,thread=single (slower; a fallback if L1 hangs).
    #[arg(long)]
    tcg_single: bool,
    /// L1's settings: presets joined with '+' (see `cargo xtask rig-soak --help`).
    #[arg(long, default_value = DEFAULT_VARIANT, value_name = "NAME[+NAME...]")]
    variant: L1Tuning,
    /// The guest kernel's form: bzimage (the Debian bzImage), pvh (the same kernel
    /// uncompressed, an ELF vmlinux entered through PVH).
    #[arg(long, default_value = "bzimage", value_parser = parse_kernel_form)]
    kernel: KernelForm,
    /// The guests' kernel: 6.1 (Debian 12's, L1's own) or 6.12 (Debian 13's, from trixie: the
    /// guests get amd_pstate=passive and L1 a Zen 2 CPU, EPYC-Rome; bzimage only). L1 keeps
    /// running 6.1.
    #[arg(long, default_value = "6.1", value_name = "6.1|6.12")]
    guest_kernel: GuestKernel,
    /// Boot the guest with `quiet` (warnings and errors only on its console) instead of the
    /// early console.
    #[arg(long)]
    quiet: bool,
    /// Boot each VM from a root disk, an ext4 image of the guest's userland (its first disk,
    /// /dev/vda, with root=/dev/vda), copied to /tmp/rig-root-LABEL.ext4 in L1. 6.1 guests only.
    #[arg(long)]
    root_disk: bool,
    /// Give each VM a tap-backed network to L1: VM i gets tap rigtapI, L1 is 10.0.I.1 on it and
    /// the guest's default gateway, the guest's eth0 is 10.0.I.2/24. 6.1 guests only.
    #[arg(long)]
    tap: bool,
    /// A VM to run, side by side with the other --vm ones in one L1, instead of the one VM
    /// that --vmm, --guest-cmd and PVMM ARGS describe: "VMM [ARGS...] [-- CMD]", e.g.
    /// "pvmm --vcpus 2 --memory 256 -- nproc" (CMD defaults to --guest-cmd). Repeatable.
    #[arg(long = "vm", value_name = "SPEC")]
    vms: Vec<VmSpec>,
    /// Arguments for pvmm, after `--` (e.g. -- --vcpus 4). The rig adds --initrd, --cmdline
    /// and the kernel.
    #[arg(last = true, value_name = "PVMM ARGS")]
    pvmm_args: Vec<String>,
}

/// Exit code for a rig that could not run: 2 for bad arguments, else [`EXIT_RIG_FAILURE`].
fn rig_error_exit(error: &RigError) -> u8 {
    match error {
        RigError::BadArgs(_) | RigError::BadTopology(_) => 2,
        _ => exit_byte(EXIT_RIG_FAILURE),
    }
}

/// A rig exit status as the byte a process exits with: clamped to 0..=255, so that no status
/// wraps round to another (a negative one, or one above 255, exits 0 or 255).
fn exit_byte(code: i32) -> u8 {
    u8::try_from(code.clamp(0, 255)).unwrap_or(u8::MAX)
}

/// Runs `bench` on the benchmark runner; the xtask's exit code (after saying why) when the rig
/// could not run.
fn run_benchmark<B: Benchmark>(bench: &B) -> Result<Report<B::Figures>, ExitCode> {
    runner::run(bench).map_err(|error| {
        eprintln!("xtask: error: {error}");
        ExitCode::from(rig_error_exit(&error))
    })
}

/// The end of a benchmark whose tables are printed: each run it could not measure and how its
/// last L1 boot ended, on stderr; the xtask's exit code (a run not measured fails it).
fn finish_benchmark<F>(report: &Report<F>, started: Instant) -> ExitCode {
    for (run, why) in report.failures() {
        eprintln!("xtask: {} not measured: {why}", run.label);
    }
    if let Some(last) = report.boots.last() {
        eprintln!(
            "xtask: {} L1 boot(s), the last: {} (bench took {:.0} s)",
            report.boots.len(),
            last.summary("last VMM"),
            started.elapsed().as_secs_f64()
        );
    }
    if report.all_measured() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit_byte(EXIT_RIG_FAILURE))
    }
}

/// Builds the L1 layers `needs` asks for; the xtask's exit code (after saying why) when that
/// fails.
fn build_l1(ws: &Workspace, needs: L1Needs) -> Result<images::L1Images, ExitCode> {
    images::build_l1(ws, needs).map_err(|error| {
        eprintln!("xtask: error: {error}");
        ExitCode::from(EXIT_BUILD_FAILURE)
    })
}

/// Builds the L1 images the VMs need to boot `guest` in `form`; the xtask's exit code (after
/// saying why) when that fails.
fn l1_images(
    ws: &Workspace,
    vms: &[VmSpec],
    guest: GuestKernel,
    form: KernelForm,
    root_disk: bool,
) -> Result<images::L1Images, ExitCode> {
    let needs = L1Needs {
        pvmm: vms.iter().any(|vm| vm.vmm == InnerVmm::Pvmm),
        qemu: vms.iter().any(|vm| vm.vmm == InnerVmm::Qemu),
        vmlinux: form == KernelForm::Pvh,
        guest_kernel: guest,
        root_disk,
        kernbench: false,
    };
    check_guest_forms(guest, &[form])?;
    build_l1(ws, needs)
}

/// Refuses (exit 2, after saying why) a guest kernel in a form the rig does not build for it,
/// before any image is built.
fn check_guest_forms(guest: GuestKernel, forms: &[KernelForm]) -> Result<(), ExitCode> {
    for &form in forms {
        if let Err(error) = guest.l1_path(form) {
            eprintln!("xtask: error: {error}");
            return Err(ExitCode::from(2));
        }
    }
    Ok(())
}

/// Runs `cargo xtask rig`'s rig and reports how it ended (each VM apart when several).
fn run_rig(ws: &Workspace, images: &images::L1Images, rig: &Rig, vms: &[VmSpec]) -> ExitCode {
    let outcome = match rig.run(ws, images) {
        Ok(outcome) => outcome,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            return ExitCode::from(rig_error_exit(&error));
        }
    };
    if vms.len() > 1 {
        for (vm, label) in vms.iter().zip(rig.labels()) {
            let run = outcome.run(&label);
            let status = |s: Option<i32>| s.map_or("none".to_string(), |s| s.to_string());
            eprintln!(
                "xtask: VM {label} ({}): exit status {}, guest command status {}, boot to init {}",
                vm.vmm.name(),
                status(run.and_then(|r| r.status)),
                status(run.and_then(|r| r.command_status())),
                outcome
                    .boot_to_init_seconds(&label)
                    .map_or("-".to_string(), |t| format!("{t:.1} s"))
            );
        }
    }
    for line in &outcome.stall_threads {
        eprintln!("xtask: QEMU thread when the rig gave up (tid:name state CPU-ms/s): {line}");
    }
    eprintln!("xtask: {}", outcome.summary(vms[0].vmm.name()));
    ExitCode::from(exit_byte(outcome.exit_code()))
}

/// `cargo xtask rig`.
fn rig_task(ws: &Workspace, started: Instant, args: RigArgs) -> ExitCode {
    let RigArgs {
        topology,
        timeout,
        guest_cmd,
        vmm,
        l1_probe,
        tcg_single,
        variant,
        kernel,
        guest_kernel,
        quiet,
        root_disk,
        tap,
        vms,
        pvmm_args,
    } = args;
    let probe = match l1_probe.map(std::fs::read_to_string).transpose() {
        Ok(probe) => probe,
        Err(error) => {
            eprintln!("xtask: error: cannot read --l1-probe: {error}");
            return ExitCode::from(2);
        }
    };
    let vms = if vms.is_empty() {
        vec![VmSpec {
            vmm,
            args: pvmm_args,
            guest_command: None,
        }]
    } else if !pvmm_args.is_empty() {
        eprintln!("xtask: error: give pvmm arguments inside each --vm, not after --");
        return ExitCode::from(2);
    } else {
        vms
    };
    let vms: Vec<VmSpec> = vms
        .into_iter()
        .map(|vm| VmSpec {
            guest_command: vm.guest_command.or_else(|| Some(guest_cmd.clone())),
            ..vm
        })
        .collect();
    let images = match l1_images(ws, &vms, guest_kernel, kernel, root_disk) {
        Ok(images) => images,
        Err(code) => return code,
    };
    eprintln!(
        "xtask: images ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut rig = Rig::with_vms(vms.clone())
        .kernel(kernel)
        .guest_kernel(guest_kernel)
        .quiet(quiet)
        .root_disk(root_disk)
        .tap(tap)
        .topology(topology)
        .timeout(Duration::from_secs(timeout))
        .tuning(variant)
        .echo(true);
    if tcg_single {
        rig = rig.tcg_multi_thread(false);
    }
    if let Some(probe) = probe {
        rig = rig.l1_probe(probe);
    }
    run_rig(ws, &images, &rig, &vms)
}

/// `cargo xtask guest`.
fn guest_task(ws: &Workspace, started: Instant, args: GuestArgs) -> ExitCode {
    match images::build_guest(ws, args.guest_kernel) {
        Ok(guest) => {
            eprintln!(
                "xtask: guest images ready in {:.1} s: kernel {} ({}), initramfs {}",
                started.elapsed().as_secs_f64(),
                guest.kernel.display(),
                guest.kernel_package,
                guest.initrd.display()
            );
            if let Some(image) = &guest.kernel_612 {
                eprintln!(
                    "xtask: guest kernel 6.12: {} ({}, configuration {})",
                    image.kernel.display(),
                    image.package,
                    image.config.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("xtask: error: {error}");
            ExitCode::from(EXIT_BUILD_FAILURE)
        }
    }
}

/// `cargo xtask bench-boot`.
fn bench_boot(ws: &Workspace, started: Instant, args: BootBenchArgs) -> ExitCode {
    if let Err(code) = check_guest_forms(args.guest_kernel, &args.kernels) {
        return code;
    }
    let needs = L1Needs {
        pvmm: !args.qemu_only,
        qemu: true,
        vmlinux: args.kernels.contains(&KernelForm::Pvh),
        guest_kernel: args.guest_kernel,
        root_disk: false,
        kernbench: false,
    };
    let images = match build_l1(ws, needs) {
        Ok(images) => images,
        Err(code) => return code,
    };
    let options = BenchOptions {
        vcpus: args.vcpus,
        memory_mib: args.memory,
        rounds: args.rounds,
        topology: args.topology,
        with_pvmm: !args.qemu_only,
        kernels: args.kernels,
        echo: args.verbose,
        quiet: !args.boot_log,
        guest_kernel: args.guest_kernel,
    };
    let bench = match BootBench::new(ws, &images, options) {
        Ok(bench) => bench,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            return ExitCode::from(rig_error_exit(&error));
        }
    };
    let report = match run_benchmark(&bench) {
        Ok(report) => report,
        Err(code) => return code,
    };
    println!("{}", bench.tables(&report.results));
    finish_benchmark(&report, started)
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
        Task::Guest(args) => guest_task(&ws, started, args),
        Task::Rig(args) => rig_task(&ws, started, args),
        Task::RigSoak(args) => soak::run(&ws, args),
        Task::RigGuestSoak(args) => guest_soak::run(&ws, args),
        Task::BenchBoot(args) => bench_boot(&ws, started, args),
        Task::BenchHost(args) => bench_host(&ws, started, args),
        Task::BenchPlacement(args) => placement::run(&ws, started, args),
        Task::BenchIo(args) => io::run(&ws, started, args),
        Task::BenchKernbench(args) => kernbench::run(&ws, started, args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Task, clap::Error> {
        Cli::try_parse_from(["cargo xtask"].iter().chain(args)).map(|cli| cli.command)
    }

    #[test]
    fn guest_kernel_is_chosen_on_guest_rig_and_bench_boot() {
        let Ok(Task::Guest(guest)) = parse(&["guest"]) else {
            panic!("guest");
        };
        assert_eq!(guest.guest_kernel, GuestKernel::Linux6_1);
        let Ok(Task::Guest(guest)) = parse(&["guest", "--guest-kernel", "6.12"]) else {
            panic!("guest 6.12");
        };
        assert_eq!(guest.guest_kernel, GuestKernel::Linux6_12);
        let Ok(Task::Rig(rig)) = parse(&["rig", "--guest-kernel", "6.12", "--", "--vcpus", "4"])
        else {
            panic!("rig 6.12");
        };
        assert_eq!(rig.guest_kernel, GuestKernel::Linux6_12);
        assert_eq!(rig.pvmm_args, ["--vcpus", "4"]);
        let Ok(Task::Rig(rig)) = parse(&["rig"]) else {
            panic!("rig");
        };
        assert_eq!(rig.guest_kernel, GuestKernel::Linux6_1);
        let Ok(Task::BenchBoot(bench)) = parse(&["bench-boot", "--guest-kernel=6.12"]) else {
            panic!("bench-boot 6.12");
        };
        assert_eq!(bench.guest_kernel, GuestKernel::Linux6_12);
        for bad in [
            &["rig", "--guest-kernel", "6.2"][..],
            &["guest", "--guest-kernel"],
            &["bench-boot", "--guest-kernel", "trixie"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_benchmark_takes_rounds() {
        let rounds = |args: &[&str]| match parse(args) {
            Ok(Task::BenchBoot(a)) => a.rounds,
            Ok(Task::BenchHost(a)) => a.rounds,
            Ok(Task::BenchPlacement(a)) => a.rounds,
            Ok(Task::BenchIo(a)) => a.rounds,
            Ok(Task::BenchKernbench(a)) => a.rounds,
            other => panic!("{args:?}: {other:?}"),
        };
        for bench in [
            "bench-boot",
            "bench-host",
            "bench-placement",
            "bench-io",
            "bench-kernbench",
        ] {
            assert_eq!(rounds(&[bench, "--rounds", "3"]), 3, "{bench}");
            assert!(parse(&[bench, "--rounds", "0"]).is_err(), "{bench}");
            assert!(parse(&[bench, "--rounds", "21"]).is_err(), "{bench}");
        }
        // bench-boot's own name for its rounds stays.
        assert_eq!(rounds(&["bench-boot", "--runs", "2"]), 2);
        assert_eq!(rounds(&["bench-boot"]), 5);
        assert_eq!(rounds(&["bench-placement"]), 1);
    }

    #[test]
    fn a_612_guest_in_pvh_form_is_refused_before_building() {
        let both = [KernelForm::BzImage, KernelForm::Pvh];
        assert!(check_guest_forms(GuestKernel::Linux6_1, &both).is_ok());
        assert!(check_guest_forms(GuestKernel::Linux6_12, &[KernelForm::BzImage]).is_ok());
        assert!(check_guest_forms(GuestKernel::Linux6_12, &both).is_err());
    }
}
