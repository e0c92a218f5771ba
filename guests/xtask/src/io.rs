//! `cargo xtask bench-io`: pvmm's virtio disk and network against QEMU's in one L1 boot
//! ([`pvmm_rig::io_bench`], on the benchmark runner).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use pvmm_rig::images::L1Needs;
use pvmm_rig::io_bench::{IoBench, IoBenchOptions, IoBenchReport};
use pvmm_rig::rig::EXIT_RIG_FAILURE;
use pvmm_rig::runner::Benchmark;
use pvmm_rig::workspace::Workspace;
use pvmm_rig::Topology;

use super::{build_l1, finish_benchmark, run_benchmark, ROUNDS_MAX};

#[derive(Debug, Args)]
pub struct IoBenchArgs {
    /// Guest vCPUs, for both VMMs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Guest memory in MiB, for both VMMs.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(128..=4096))]
    memory: u64,
    /// MiB of each sequential transfer (the scratch disk's size; it lives in L1's RAM).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1024))]
    disk_mib: u64,
    /// Seconds of 4 KiB random reads.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=600))]
    random_secs: u32,
    /// MiB sent over TCP each way.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    net_mib: u64,
    /// Rounds: one pvmm and one QEMU VM each, their order swapped from round to round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=ROUNDS_MAX))]
    pub(crate) rounds: u32,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// Print every rig line.
    #[arg(long)]
    verbose: bool,
}

/// `cargo xtask bench-io`.
pub fn run(ws: &Workspace, started: Instant, args: IoBenchArgs) -> ExitCode {
    let needs = L1Needs {
        pvmm: true,
        qemu: true,
        root_disk: true,
        ..Default::default()
    };
    let images = match build_l1(ws, needs) {
        Ok(images) => images,
        Err(code) => return code,
    };
    let options = IoBenchOptions {
        vcpus: args.vcpus,
        memory_mib: args.memory,
        disk_mib: args.disk_mib,
        random_secs: args.random_secs,
        net_mib: args.net_mib,
        rounds: args.rounds,
        topology: args.topology,
        echo: args.verbose,
    };
    let bench = IoBench::new(ws, &images, options);
    let report = match run_benchmark(&bench) {
        Ok(report) => report,
        Err(code) => return code,
    };
    let o = bench.options();
    println!(
        "\nI/O benchmark: pvmm vs qemu-system-x86_64 -enable-kvm in {} L1 boot(s) \
         ({} vCPUs, {} MiB, L1 {}), {:.0} s in all:\n",
        report.boots.len(),
        o.vcpus,
        o.memory_mib,
        o.topology,
        started.elapsed().as_secs_f64()
    );
    print!("{}", bench.tables(&report.results));
    let code = finish_benchmark(&report, started);
    if report.all_measured() && !IoBenchReport::of(&report.results).all_measured() {
        eprintln!("xtask: some figures were not measured (see the rig's lines with --verbose)");
        return ExitCode::from(crate::exit_byte(EXIT_RIG_FAILURE));
    }
    code
}
