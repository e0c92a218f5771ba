//! The `pvmm` command. See `pvmm --help`.

use pvmm::cli::{parse, ParseOutcome};
use pvmm::exit::{printable, VmExit, EXIT_BAD_INPUT};

fn main() {
    // `pvmm ctl ...` is `pvmm-ctl ...` and `pvmm host ...` is `pvmm-host ...`: one static
    // binary carries all three (the nested rig's L1 gets only `pvmm`).
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let tool: Option<fn(Vec<std::ffi::OsString>) -> u8> = match args.get(1).and_then(|a| a.to_str())
    {
        Some("ctl") => Some(pvmm::api::ctl::run),
        Some("host") => Some(pvmm_host::command::run),
        _ => None,
    };
    if let Some(run) = tool {
        args.remove(0);
        args[0] = format!("pvmm {}", args[0].to_string_lossy()).into();
        std::process::exit(i32::from(run(args)));
    }
    let cli = match parse(args) {
        ParseOutcome::Run(cli) => cli,
        ParseOutcome::Print(text) => {
            print!("{text}");
            std::process::exit(0);
        }
        ParseOutcome::Error(line) => {
            eprintln!("pvmm: {line}");
            std::process::exit(EXIT_BAD_INPUT);
        }
    };
    if let Some(dir) = cli.dump_acpi.clone() {
        let devices = cli.disks.len() + cli.nets.len() + usize::from(cli.rng);
        let virtio = pvmm::layout::virtio_slots(devices);
        let tables = match pvmm::acpi::build_tables(
            cli.vcpus,
            &pvmm::cppc::CppcFrequencies::host(std::path::Path::new(pvmm::cppc::SYSFS_CPUFREQ)),
            &virtio,
        ) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("pvmm: {e}");
                std::process::exit(EXIT_BAD_INPUT);
            }
        };
        match pvmm::acpi::dump_tables(&tables, &dir) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("pvmm: --dump-acpi {}: {e}", dir.display());
                std::process::exit(EXIT_BAD_INPUT);
            }
        }
    }
    let config = cli.into_config();
    let mut vm = match pvmm::vmm::start(&config) {
        Ok(vm) => vm,
        Err(e) => {
            eprintln!("pvmm: {}", printable(&e.to_string()));
            std::process::exit(e.status());
        }
    };
    if let Some(path) = &config.api_socket {
        if config.verbose {
            eprintln!("pvmm: control socket {}", path.display());
        }
    }
    let exit = vm.wait();
    // Every vCPU thread and the scheduler are joined, and the socket file removed, before the
    // summary: nothing of the VM runs past this line.
    vm.stop();
    if exit != VmExit::PowerOff || config.verbose {
        eprintln!("pvmm: {}", exit.reason());
    }
    eprintln!("pvmm: {}", vm.placement_summary());
    if config.verbose {
        eprintln!("pvmm: {}", vm.tick_cost());
    }
    std::process::exit(exit.status());
}
