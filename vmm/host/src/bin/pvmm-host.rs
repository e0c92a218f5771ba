//! `pvmm-host`: host-wide vCPU placement for every VM. See `pvmm-host --help`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(pvmm_host::command::run(std::env::args_os()))
}
