//! What pvmm's command-line tools share: where VMs and the host daemon meet, and the exit
//! status and one-line message of a bad command line.

/// The runtime directory pvmm VMs put their control sockets in to join the host daemon.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/pvmm";

/// Exit status for bad input (flags, files, requests a tool refuses before acting): the usual
/// Unix usage-error status, the same for every pvmm tool.
pub const EXIT_BAD_INPUT: u8 = 2;

/// Parses a companion tool's flags (`pvmm-ctl`, `pvmm-host`): help and version are printed
/// (`Err(0)`), a bad flag is one line on stderr (`Err(EXIT_BAD_INPUT)`).
pub fn parse_tool<P: clap::Parser, I, T>(tool: &str, args: I) -> Result<P, u8>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match P::try_parse_from(args) {
        Ok(parsed) => Ok(parsed),
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "{tool}: {} (see {tool} --help)",
                line.trim_start_matches("error: ")
            );
            Err(EXIT_BAD_INPUT)
        }
        Err(e) => {
            print!("{e}");
            Err(0)
        }
    }
}
