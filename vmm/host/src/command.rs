//! `pvmm-host` (also `pvmm host`): parsing the command line, then running the daemon or
//! `status`.

use std::io::Write;

use super::cli::{HostCli, HostCommand};
use pvmm_api::stats::HostStatus;

use super::metrics::format_status;
use super::{HostDaemon, STATUS_SOCKET};

/// Exit status for failures while running.
const EXIT_FAILURE: u8 = 1;
/// Exit status for bad flags: pvmm's own.
use pvmm_api::tool::EXIT_BAD_INPUT;

/// Runs `pvmm-host` with `args` (the program name first); returns its exit status.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli: HostCli = match pvmm_api::tool::parse_tool("pvmm-host", args) {
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
    raise_open_file_limit();
    match daemon.run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pvmm-host: {e}");
            daemon.release();
            EXIT_FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard one. The daemon keeps one `/proc` file open
/// per adopted vCPU and one per adopted VM ([`pvmm_tick::procfs::ProcFile`]), which at thousands of
/// vCPUs is more than the usual soft limit of 1,024; the hard limit is what the operator
/// allows. Where it stays too low, the files that cannot be opened are tried again at their
/// next reading.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct we pass, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit up to the hard
        // one needs no privilege and changes nothing else.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
}

/// `pvmm-host status`: the running daemon's latest tick.
fn status(socket: &std::path::Path, json: bool) -> u8 {
    match pvmm_api::client::request(socket, "GET", "/v1/host", None) {
        Ok(answer) if answer.status == 200 => {
            if json {
                println!("{}", answer.body);
                return 0;
            }
            match serde_json::from_value::<HostStatus>(answer.body) {
                Ok(status) => {
                    print!("{}", format_status(&status));
                    0
                }
                Err(e) => {
                    eprintln!("pvmm-host: {}: not a status: {e}", socket.display());
                    EXIT_FAILURE
                }
            }
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
