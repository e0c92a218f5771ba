//! `pvmm-host`: host-wide vCPU placement for every VM. See `pvmm-host --help`.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use pvmm::host::cli::{HostCli, HostCommand};
use pvmm::host::metrics::format_status;
use pvmm::host::{HostDaemon, HostError, STATUS_SOCKET};

/// Exit status for failures while running.
const EXIT_FAILURE: u8 = 1;
/// Exit status for bad flags and a runtime directory another daemon holds.
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = match HostCli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "pvmm-host: {} (see pvmm-host --help)",
                line.trim_start_matches("error: ")
            );
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Err(e) => {
            print!("{e}");
            return ExitCode::SUCCESS;
        }
    };
    if let Some(HostCommand::Status { json }) = &cli.command {
        return status(&cli.runtime_dir.join(STATUS_SOCKET), *json);
    }
    let stats_path = cli.stats.clone();
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(line) => {
            eprintln!("pvmm-host: {line}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let stats: Option<Box<dyn Write>> = match stats_path {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(p) => match std::fs::File::create(&p) {
            Ok(f) => Some(Box::new(std::io::LineWriter::new(f))),
            Err(e) => {
                eprintln!("pvmm-host: --stats {}: {e}", p.display());
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        },
    };
    let mut daemon = match HostDaemon::new(config, stats) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pvmm-host: {e}");
            return ExitCode::from(match e {
                HostError::AlreadyRunning(_) => EXIT_BAD_INPUT,
                HostError::Io { .. } => EXIT_BAD_INPUT,
            });
        }
    };
    match daemon.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvmm-host: {e}");
            daemon.release();
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// `pvmm-host status`: the running daemon's latest tick.
fn status(socket: &std::path::Path, json: bool) -> ExitCode {
    match pvmm::api::client::request(socket, "GET", "/v1/host", None) {
        Ok(answer) if answer.status == 200 => {
            if json {
                println!("{}", answer.body);
            } else {
                print!("{}", format_status(&answer.body));
            }
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            eprintln!(
                "pvmm-host: {}: {} {}",
                socket.display(),
                answer.status,
                answer.body
            );
            ExitCode::from(EXIT_FAILURE)
        }
        Err(e) => {
            eprintln!("pvmm-host: no daemon answers ({e})");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
