//! `pvmm-ctl`: the control socket's client. See `pvmm-ctl --help`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(pvmm::api::ctl::run(std::env::args_os()))
}
