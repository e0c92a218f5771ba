//! The `pvmm` command. See `pvmm --help`.

use pvmm::cli::{parse, ParseOutcome};
use pvmm::exit::{VmExit, EXIT_BAD_INPUT};

fn main() {
    let cli = match parse(std::env::args_os()) {
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
        let tables = match pvmm::acpi::build_tables(cli.vcpus) {
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
    let vm = match pvmm::vmm::start(&config) {
        Ok(vm) => vm,
        Err(e) => {
            eprintln!("pvmm: {e}");
            std::process::exit(e.status());
        }
    };
    let exit = vm.wait();
    if exit != VmExit::PowerOff || config.verbose {
        eprintln!("pvmm: {}", exit.reason());
    }
    eprintln!("pvmm: {}", vm.placement_summary());
    // Ends every vCPU thread with the process: a powered-off guest has nothing left to run.
    std::process::exit(exit.status());
}
