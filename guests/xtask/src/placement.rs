//! `cargo xtask bench-placement`: the kernbench-like load under every placement policy in one
//! L1 boot ([`pvmm_rig::placement_bench`]), on the benchmark runner ([`pvmm_rig::runner`]).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use pvmm_rig::images::L1Needs;
use pvmm_rig::placement_bench::{
    PlacementBench, PlacementBenchOptions, BENCH_POLICIES, KERNBENCH_DUTY_PERCENT,
    KERNBENCH_PERIOD_MS,
};
use pvmm_rig::runner::Benchmark;
use pvmm_rig::workspace::Workspace;
use pvmm_rig::{GuestKernel, Topology};

use super::{build_l1, finish_benchmark, run_benchmark, ROUNDS_MAX};

#[derive(Debug, Args)]
pub struct PlacementBenchArgs {
    /// Busy guest thread counts, comma-separated (0: the guest idles through the window).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    threads: Vec<u32>,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 4)]
    vcpus: u32,
    /// Seconds of load per case.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=3600))]
    seconds: u32,
    /// pvmm-load duty cycle in percent (default: the simulator's kernbench busy fraction, 29 %).
    #[arg(long, default_value_t = KERNBENCH_DUTY_PERCENT, value_parser = clap::value_parser!(u32).range(0..=100))]
    duty: u32,
    /// pvmm-load period in ms (default 70: 20 ms bursts at 29 %, as the simulator's kernbench).
    #[arg(long, default_value_t = KERNBENCH_PERIOD_MS, value_parser = clap::value_parser!(u32).range(1..=60000))]
    period_ms: u32,
    /// Policies, comma-separated (pvmm --policy values; `none` = no pinning; POLICY.share adds
    /// --share-package).
    #[arg(long, value_delimiter = ',', default_values_t = BENCH_POLICIES.map(String::from))]
    policies: Vec<String>,
    /// Rounds: every (N, policy) case once per round, in one L1 boot, the policies' order
    /// turned by one place each round; the tables give medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=ROUNDS_MAX))]
    pub(crate) rounds: u32,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// The guests' kernel: 6.1 (Debian 12's) or 6.12 (Debian 13's, whose amd-pstate ranks
    /// its CPUs by pvmm's CPPC values).
    #[arg(long, default_value = "6.1", value_name = "6.1|6.12")]
    guest_kernel: GuestKernel,
    /// Print every rig line.
    #[arg(long)]
    verbose: bool,
}

/// `cargo xtask bench-placement`.
pub fn run(ws: &Workspace, started: Instant, args: PlacementBenchArgs) -> ExitCode {
    if let Some(bad) = args.threads.iter().find(|&&n| n > 1024) {
        eprintln!("xtask: error: invalid --threads value {bad}: expected 0-1024");
        return ExitCode::from(2);
    }
    if args.policies.is_empty() || args.threads.is_empty() {
        eprintln!("xtask: error: --policies and --threads need at least one value each");
        return ExitCode::from(2);
    }
    let needs = L1Needs {
        pvmm: true,
        qemu: false,
        vmlinux: false,
        guest_kernel: args.guest_kernel,
        root_disk: false,
        kernbench: false,
    };
    let images = match build_l1(ws, needs) {
        Ok(images) => images,
        Err(code) => return code,
    };
    let options = PlacementBenchOptions {
        threads: args.threads,
        vcpus: args.vcpus,
        seconds: args.seconds,
        duty_percent: args.duty,
        period_ms: args.period_ms,
        policies: args.policies,
        rounds: args.rounds,
        topology: args.topology,
        echo: args.verbose,
        guest_kernel: args.guest_kernel,
    };
    let bench = PlacementBench::new(ws, &images, options);
    let report = match run_benchmark(&bench) {
        Ok(report) => report,
        Err(code) => return code,
    };
    print!("{}", bench.tables(&report.results));
    finish_benchmark(&report, started)
}
