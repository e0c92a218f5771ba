//! `pvmm-host` (also `pvmm host`): parsing the command line, then running the daemon or
//! `status`.

use std::io::Write;

use super::cli::{HostCli, HostCommand};
use super::metrics::format_status;
use super::{HostDaemon, STATUS_SOCKET};

/// Exit status for failures while running.
const EXIT_FAILURE: u8 = 1;
/// Exit status for bad flags: pvmm's own.
const EXIT_BAD_INPUT: u8 = crate::exit::EXIT_BAD_INPUT as u8;

/// Runs `pvmm-host` with `args` (the program name first); returns its exit status.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli: HostCli = match crate::cli::parse_tool("pvmm-host", args) {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    if let Some(HostCommand::Status { json }) = &cli.command {
        return status(&cli.runtime_dir.join(STATUS_SOCKET), *json);
    }
    let stats_path = cli.stats.clone();
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(line) => {
            eprintln!("pvmm-host: {line}");
            return EXIT_BAD_INPUT;
        }
    };
    let stats: Option<Box<dyn Write>> = match stats_path {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(p) => match std::fs::File::create(&p) {
            Ok(f) => Some(Box::new(std::io::LineWriter::new(f))),
            Err(e) => {
                eprintln!("pvmm-host: --stats {}: {e}", p.display());
                return EXIT_BAD_INPUT;
            }
        },
    };
    let mut daemon = match HostDaemon::new(config, stats) {
        Ok(d) => d,
        Err(e) => {
            // Another daemon on the directory, or a directory that cannot be used: both are
            // the operator's input.
            eprintln!("pvmm-host: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    match daemon.run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pvmm-host: {e}");
            daemon.release();
            EXIT_FAILURE
        }
    }
}

/// `pvmm-host status`: the running daemon's latest tick.
fn status(socket: &std::path::Path, json: bool) -> u8 {
    match crate::api::client::request(socket, "GET", "/v1/host", None) {
        Ok(answer) if answer.status == 200 => {
            if json {
                println!("{}", answer.body);
            } else {
                print!("{}", format_status(&answer.body));
            }
            0
        }
        Ok(answer) => {
            eprintln!(
                "pvmm-host: {}: {} {}",
                socket.display(),
                answer.status,
                answer.body
            );
            EXIT_FAILURE
        }
        Err(e) => {
            eprintln!("pvmm-host: no daemon answers ({e})");
            EXIT_FAILURE
        }
    }
}
