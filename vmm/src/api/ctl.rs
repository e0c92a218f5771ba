//! `pvmm-ctl` (also `pvmm ctl`): talks to a running pvmm through its control socket
//! (`pvmm --api-socket PATH`). See `pvmm-ctl --help`.

use std::io::Read;
use std::path::PathBuf;

use super::client::{format_object, format_placement, format_vcpus, request, Answer};
use clap::{Parser, Subcommand};
use pvmm_api::messages::{PolicyBody, ShutdownBody, VcpusAnswer};
use pvmm_api::stats::VmStats;

/// Exit status when pvmm refused the request (a 4xx or 5xx answer) or could not be reached.
const EXIT_REFUSED: u8 = 1;
/// Exit status for bad flags: pvmm's own.
use pvmm_api::tool::EXIT_BAD_INPUT;

/// Talk to a running pvmm through its control socket.
#[derive(Debug, Parser)]
#[command(
    name = "pvmm-ctl",
    version,
    about,
    after_help = "\
Exit status: 0 the request succeeded; 1 pvmm refused it or could not be reached
(the error is printed); 2 bad flags or an unreadable file.

Examples:
  pvmm-ctl --socket /run/pvmm/vm0.sock vcpus
  pvmm-ctl --socket /run/pvmm/vm0.sock policy balance
  echo '{\"assignments\":[{\"vcpu\":0,\"cpus\":\"2-3\",\"capacity\":512}]}' |
    pvmm-ctl --socket /run/pvmm/vm0.sock external -"
)]
struct Cli {
    /// The control socket (pvmm --api-socket PATH).
    #[arg(long, short, value_name = "PATH")]
    socket: PathBuf,
    /// Print the JSON answer as it came, instead of tables.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The VM: pid, vCPUs, memory, kernel, policy, uptime, state.
    Vm,
    /// Each vCPU's thread, state, utilization, CPUs, package and capacity; pvmm's own threads.
    Vcpus,
    /// The latest placement tick.
    Placement,
    /// Change the placement policy (performance, balance, powersaving[:1|:2], none).
    Policy {
        /// The new policy.
        policy: String,
    },
    /// Hand placement to an outside balancer: a JSON body {"assignments":[...]} from FILE or -.
    External {
        /// File holding the JSON body, or - for stdin.
        file: PathBuf,
    },
    /// Give placement back to pvmm's own policy.
    Release,
    /// Stop running guest code.
    Pause,
    /// Run guest code again.
    Resume,
    /// Press the power button; stop the VM if it has not powered off after the timeout.
    Shutdown {
        /// Milliseconds to wait for the guest to power off.
        #[arg(long, value_name = "MS")]
        timeout_ms: Option<u64>,
    },
}

fn read_body(file: &PathBuf) -> Result<String, String> {
    let mut body = String::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut body)
    } else {
        std::fs::File::open(file).and_then(|mut f| f.read_to_string(&mut body))
    };
    read.map(|_| body)
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// `body` as a request's JSON.
fn to_json<T: serde::Serialize>(body: &T) -> Result<String, String> {
    serde_json::to_string(body).map_err(|e| format!("request body: {e}"))
}

/// The request a command makes: method, path, body.
fn plan(command: &Command) -> Result<(&'static str, &'static str, Option<String>), String> {
    Ok(match command {
        Command::Vm => ("GET", "/v1/vm", None),
        Command::Vcpus => ("GET", "/v1/vcpus", None),
        Command::Placement => ("GET", "/v1/placement", None),
        Command::Policy { policy } => (
            "PUT",
            "/v1/policy",
            Some(to_json(&PolicyBody {
                policy: policy.clone(),
            })?),
        ),
        Command::External { file } => ("PUT", "/v1/placement/external", Some(read_body(file)?)),
        Command::Release => ("DELETE", "/v1/placement/external", None),
        Command::Pause => ("PUT", "/v1/vm/pause", None),
        Command::Resume => ("PUT", "/v1/vm/resume", None),
        Command::Shutdown { timeout_ms } => (
            "PUT",
            "/v1/vm/shutdown",
            match timeout_ms {
                Some(ms) => Some(to_json(&ShutdownBody {
                    timeout_ms: Some(*ms),
                })?),
                None => None,
            },
        ),
    })
}

fn show(command: &Command, answer: &Answer, json: bool) -> String {
    if json || answer.status >= 400 {
        return format!("{}\n", answer.body);
    }
    match command {
        Command::Vcpus => typed::<VcpusAnswer>(&answer.body, "vcpus", format_vcpus),
        Command::Placement => typed::<VmStats>(&answer.body, "placement", format_placement),
        _ => format_object(&answer.body),
    }
}

/// `body` read as the `T` that `what` answers, then formatted; else the body as it came
/// after one line saying why it is not one.
fn typed<T: serde::de::DeserializeOwned>(
    body: &serde_json::Value,
    what: &str,
    format: fn(&T) -> String,
) -> String {
    match T::deserialize(body) {
        Ok(answer) => format(&answer),
        Err(e) => format!("not a {what} answer ({e}): {body}\n"),
    }
}

/// Runs the client with `args` (the program name first); returns its exit status.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli: Cli = match pvmm_api::tool::parse_tool("pvmm-ctl", args) {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    let (method, path, body) = match plan(&cli.command) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pvmm-ctl: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    match request(&cli.socket, method, path, body.as_deref()) {
        Ok(answer) => {
            let text = show(&cli.command, &answer, cli.json);
            if answer.status >= 400 {
                let error = answer.body["error"].as_str().map(str::to_string);
                eprintln!(
                    "pvmm-ctl: {} {path}: {} {}",
                    method,
                    answer.status,
                    error.unwrap_or(text.trim().to_string())
                );
                return EXIT_REFUSED;
            }
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("pvmm-ctl: {e}");
            EXIT_REFUSED
        }
    }
}
