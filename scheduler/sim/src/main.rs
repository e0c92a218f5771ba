//! `pvmm-sim`: trace-driven simulator for pvmm's placement engine.
//!
//! Runs the same engine code as the live VMM over simulated vCPU load and
//! prints, per policy, run time or work done, package idle, energy, power,
//! migrations and perf/W, and optionally an SVG timeline. `pvmm-sim --help`
//! documents every option; the implementation is [`pvmm_sim::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr();
    ExitCode::from(pvmm_sim::cli::main_with_args(
        std::env::args_os(),
        &mut out,
        &mut err,
    ))
}
