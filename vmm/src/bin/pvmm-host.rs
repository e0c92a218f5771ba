//! `pvmm-host`: host-wide vCPU placement for every VM. See `pvmm-host --help`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(pvmm::host::main::run(std::env::args_os()))
}
