//! `cargo xtask bench-kernbench`: a real `make -jN` in a pvmm guest under each policy, one L1
//! boot for all cases, more where L1 fails by itself ([`pvmm_rig::kernbench`], on the
//! benchmark runner), with the
//! simulator's kernbench rows for the same N beside each table.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use pvmm_rig::images::L1Needs;
use pvmm_rig::kernbench::{
    Kernbench, KernbenchOptions, DEFAULT_JOBS, DEFAULT_MEMORY_MIB, DEFAULT_POLICIES,
};
use pvmm_rig::kernbench_disk::TREE;
use pvmm_rig::runner::Benchmark;
use pvmm_rig::workspace::Workspace;
use pvmm_rig::Topology;

use super::{build_l1, finish_benchmark, rig_error_exit, run_benchmark, ROUNDS_MAX};

#[derive(Debug, Args)]
pub struct KernbenchArgs {
    /// N of `make -jN`, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_JOBS,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    jobs: Vec<u32>,
    /// Policies, comma-separated (pvmm --policy values; `none` = no pinning; POLICY.share adds
    /// --share-package). The first is the tables' reference (1.00).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_POLICIES.map(String::from))]
    policies: Vec<String>,
    /// Rounds: every (N, policy) case once per round; the tables give medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=ROUNDS_MAX))]
    pub(crate) rounds: u32,
    /// Compiler flags after the tree's own `-O2 -Wall -Wextra` (its Makefile's MYCFLAGS):
    /// `-O0` builds in about half the time.
    #[arg(long, default_value = "", value_name = "FLAGS")]
    mycflags: String,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = DEFAULT_MEMORY_MIB,
          value_parser = clap::value_parser!(u64).range(384..=8192))]
    memory: u64,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// Leave out the simulator's rows.
    #[arg(long)]
    no_sim: bool,
    /// Print every rig line.
    #[arg(long)]
    verbose: bool,
}

/// pvmm-sim's kernbench tables for `jobs` busy vCPUs on `topology` (its own policies), or why
/// they are missing.
fn simulator_tables(jobs: &[u32], topology: Topology) -> String {
    let counts = jobs
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let args = [
        "pvmm-sim".to_string(),
        "--scenario".into(),
        "kernbench".into(),
        "--vcpus".into(),
        counts,
        "--topology".into(),
        topology.to_string(),
    ];
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = pvmm_sim::cli::main_with_args(args, &mut out, &mut err);
    if code == 0 {
        String::from_utf8_lossy(&out).into_owned()
    } else {
        format!(
            "(pvmm-sim failed: {})\n",
            String::from_utf8_lossy(&err).trim()
        )
    }
}

/// `cargo xtask bench-kernbench`.
pub fn run(ws: &Workspace, started: Instant, args: KernbenchArgs) -> ExitCode {
    if args.policies.is_empty() || args.jobs.is_empty() {
        eprintln!("xtask: error: --policies and --jobs need at least one value each");
        return ExitCode::from(2);
    }
    let needs = L1Needs {
        pvmm: true,
        kernbench: true,
        ..Default::default()
    };
    let images = match build_l1(ws, needs) {
        Ok(images) => images,
        Err(code) => return code,
    };
    let options = KernbenchOptions {
        jobs: args.jobs,
        policies: args.policies,
        rounds: args.rounds,
        mycflags: args.mycflags,
        vcpus: args.vcpus,
        memory_mib: args.memory,
        topology: args.topology,
        echo: args.verbose,
        pace: pvmm_rig::kernbench::Pace::BENCH,
    };
    let bench = match Kernbench::new(ws, &images, options.clone()) {
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
    println!(
        "\nKernbench: make -jN{} of {TREE} in a {}-vCPU pvmm guest ({} MiB), L1 {}, {} round(s) in {} L1 boot(s), {:.0} s in all\n",
        pvmm_rig::kernbench::mycflags_note(&options.mycflags),
        options.vcpus,
        options.memory_mib,
        options.topology,
        options.rounds,
        report.boots.len(),
        started.elapsed().as_secs_f64()
    );
    print!("{}", bench.tables(&report.results));
    if !args.no_sim {
        println!("The simulator's kernbench-like load for the same N (N busy vCPUs, one VM):\n");
        println!("{}", simulator_tables(&options.jobs, options.topology));
    }
    finish_benchmark(&report, started)
}
