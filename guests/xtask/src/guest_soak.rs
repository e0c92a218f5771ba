//! `cargo xtask rig-guest-soak`: many guests one after another in one L1, and what each
//! leaves behind in it ([`pvmm_rig::guest_soak`]).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use pvmm_rig::guest_soak::{findings, format_report, run_guest_soak, GuestSoakOptions};
use pvmm_rig::images::L1Needs;
use pvmm_rig::rig::EXIT_RIG_FAILURE;
use pvmm_rig::soak::{outcome_log, BootKind, BusyLoops};
use pvmm_rig::workspace::Workspace;
use pvmm_rig::Topology;

#[derive(Debug, Args)]
pub struct GuestSoakArgs {
    /// Guests, one after another in the one L1.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    guests: u32,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Memory per guest in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(64..=65536))]
    memory: u64,
    /// Seconds each guest runs two busy threads before it powers off.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=600))]
    load_seconds: u32,
    /// Busy loops to run on the host meanwhile (as CI's machine is busy).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    load: u32,
    /// Hard limit per guest in seconds (the L1 boot's limit is this times --guests).
    #[arg(long, default_value_t = 240, value_parser = clap::value_parser!(u64).range(30..=3600))]
    timeout: u64,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// Print every rig line as it arrives.
    #[arg(long)]
    verbose: bool,
    /// Write the whole boot's log to this file.
    #[arg(long, value_name = "FILE")]
    log: Option<std::path::PathBuf>,
}

/// Runs the soak and prints its table and verdict. Exit 0: every guest ran clean (or failed
/// only in the rig's own known ways) and nothing grew; 1: a guest failed otherwise, or
/// something leaked; 2: bad flags.
pub fn run(ws: &Workspace, args: GuestSoakArgs) -> ExitCode {
    let needs = L1Needs {
        pvmm: true,
        qemu: false,
        vmlinux: false,
        ..Default::default()
    };
    let images = match super::build_l1(ws, needs) {
        Ok(images) => images,
        Err(code) => return code,
    };
    let loops = match BusyLoops::start(args.load) {
        Ok(loops) => loops,
        Err(error) => {
            eprintln!("xtask: error: cannot start the busy loops: {error}");
            return ExitCode::from(super::EXIT_BUILD_FAILURE);
        }
    };
    let options = GuestSoakOptions {
        guests: args.guests,
        vcpus: args.vcpus,
        memory_mib: args.memory,
        load_secs: args.load_seconds,
        topology: args.topology,
        timeout_per_guest: Duration::from_secs(args.timeout),
        echo: args.verbose,
    };
    eprintln!(
        "xtask: guest soak: {} guests ({} vCPUs, {} MiB, {} s of load each) one after another in one L1 {}, {} busy loops; a guest takes 15-40 s",
        args.guests, args.vcpus, args.memory, args.load_seconds, args.topology, args.load
    );
    let result = run_guest_soak(ws, &images, &options);
    drop(loops);
    let soak = match result {
        Ok(soak) => soak,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            return ExitCode::from(super::rig_error_exit(&error));
        }
    };
    if let Some(path) = &args.log {
        if let Err(error) = std::fs::write(path, outcome_log(&soak.outcome)) {
            eprintln!("xtask: error: {}: {error}", path.display());
        }
    }
    print!("{}", format_report(&soak));
    let ran = soak.runs.len();
    let clean = soak
        .runs
        .iter()
        .filter(|r| r.kind == BootKind::Clean)
        .count();
    let rig_own = soak
        .runs
        .iter()
        .filter(|r| r.kind.is_known_rig_failure())
        .count();
    let pvmm_failures = ran - clean - rig_own;
    println!(
        "{clean} of {} guests clean, {rig_own} failed in the rig's own ways, {pvmm_failures} failed otherwise; L1: {}",
        args.guests,
        soak.l1_kind.name()
    );
    let leaks = findings(&soak.runs);
    for line in &leaks {
        println!("leak? {line}");
    }
    if leaks.is_empty() {
        println!("no level grew after the warm-up");
    }
    if pvmm_failures == 0 && leaks.is_empty() && ran == args.guests as usize {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(u8::try_from(EXIT_RIG_FAILURE).unwrap_or(u8::MAX))
    }
}
