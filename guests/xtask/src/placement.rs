//! `cargo xtask bench-placement`: the kernbench-like load under every placement policy in one
//! L1 boot ([`pvmm_rig::placement_bench`]).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use pvmm_rig::images::L1Needs;
use pvmm_rig::placement_bench::{
    format_bench_table, run_placement_bench, PlacementBenchOptions, BENCH_POLICIES,
    KERNBENCH_DUTY_PERCENT, KERNBENCH_PERIOD_MS,
};
use pvmm_rig::rig::EXIT_RIG_FAILURE;
use pvmm_rig::workspace::Workspace;
use pvmm_rig::{GuestKernel, Topology};

use pvmm_rig::retry::{dump_outcome, l1_failure_kind, retry_boots};

use super::{build_l1, rig_error_exit};

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
        topology: args.topology,
        echo: args.verbose,
        guest_kernel: args.guest_kernel,
    };
    let measured = retry_boots(
        "bench-placement",
        || run_placement_bench(ws, &images, &options),
        |(_, _, outcome)| l1_failure_kind(outcome),
    );
    let (results, failures, outcome) = match measured {
        Ok(measured) => measured,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            return ExitCode::from(rig_error_exit(&error));
        }
    };
    dump_outcome("bench-placement", &outcome);
    for &n in &options.threads {
        let rows: Vec<_> = results.iter().filter(|r| r.threads == n).collect();
        let load = match n {
            0 => format!("idle guest (sleep {})", options.seconds),
            _ => format!(
                "pvmm-load --threads {n} --duty {} --period-ms {} --seconds {}",
                options.duty_percent, options.period_ms, options.seconds
            ),
        };
        let title = format!(
            "N = {n}: {load}, {} vCPUs, L1 {}, guest kernel {}",
            options.vcpus, options.topology, options.guest_kernel
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
        ExitCode::from(u8::try_from(EXIT_RIG_FAILURE).unwrap_or(u8::MAX))
    }
}
