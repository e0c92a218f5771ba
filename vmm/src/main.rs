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
