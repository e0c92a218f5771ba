//! The command line: flags, help text, and turning clap's errors into pvmm's one-line errors.

use std::path::PathBuf;

use clap::Parser;

use crate::acpi::MAX_VCPUS;
use crate::config::{
    DiskConfig, NetConfig, PlacementConfig, PlacementPolicy, StatsTarget, VirtioConfig, VmConfig,
    DEFAULT_CMDLINE, DEFAULT_EXTERNAL_LEASE_MS, DEFAULT_HOST_TOPOLOGY, DEFAULT_KVM_DEVICE,
    DEFAULT_MEMORY_MIB, DEFAULT_SHUTDOWN_TIMEOUT_SECS, DEFAULT_TICK_MS, DEFAULT_VCPUS,
    SHARE_PACKAGE_HELP,
};
use crate::seccomp::SeccompMode;

/// Help text after the options: exit statuses and an example.
const AFTER_HELP: &str = "\
Exit status:
  0  the guest powered off
  1  host failure after start (KVM or the OS refused something)
  2  bad input: flags, kernel/initrd files, /dev/kvm missing or unusable
  3  the guest asked to reboot (pvmm does not restart guests)
  4  the guest triple-faulted
  5  KVM could not run the guest (internal error, failed VM entry)
  6  stopped by pvmm (control socket, SIGTERM, SIGINT): the guest did not power
     off in time
  159  a pvmm thread made a system call its seccomp filter forbids (--seccomp
     kill); one line on stderr names the thread and the call

SIGTERM and SIGINT press the guest's ACPI power button and stop the VM after
--shutdown-timeout; a second SIGINT stops it at once. SIGHUP is ignored unless
stdin is a terminal (then it is SIGTERM).

The guest's serial console (COM1) is pvmm's stdin/stdout; --stats - writes to
stderr, so the console stays clean.

Control socket (--api-socket PATH, or --host auto to join pvmm-host; HTTP/1.1 + JSON, e.g.
curl --unix-socket PATH http://localhost/v1/vm, or pvmm-ctl):
  GET /v1/vm, /v1/vcpus, /v1/placement     state, threads, latest tick
  PUT /v1/policy {\"policy\":\"balance\"}      change the policy at run time
  PUT|DELETE /v1/placement/external        hand placement to an outside balancer
  PUT /v1/vm/pause, /v1/vm/resume
  PUT /v1/vm/shutdown {\"timeout_ms\":N}     power button, hard stop after N ms

Companion commands in the same binary:
  pvmm ctl --socket PATH ...   the control socket's client (also pvmm-ctl)
  pvmm host ...                host-wide placement of every VM (also pvmm-host)

Placement policies (--policy):
  performance      spread vCPUs across packages, then cores; never share a core
  balance          pack into the fewest packages, one vCPU per core, while capacity lasts
  powersaving[:1]  pack into the fewest packages using every logical CPU (default)
  powersaving:2    also steer waking vCPUs to a preferred package
  none             never pin: the host scheduler decides
Every policy keeps 20 % headroom per CPU and spreads at once when load grows;
consolidation waits for the load to stay low (ramp-down, 5 s).

Example:
  pvmm --vcpus 4 --memory 512 --initrd initrd.cpio.gz bzImage";

/// pvmm: a power-aware KVM virtual machine monitor.
///
/// Boots an x86-64 Linux kernel (a bzImage, or an ELF vmlinux through its PVH entry) with an
/// in-kernel irqchip, ACPI tables describing every vCPU, and a serial console on stdio.
#[derive(Debug, Parser)]
#[command(name = "pvmm", version, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    /// Kernel image: bzImage, or ELF vmlinux with a PVH entry note.
    #[arg(value_name = "KERNEL", required_unless_present = "dump_acpi")]
    pub kernel: Option<PathBuf>,

    /// Write every ACPI table for this configuration into DIR (one .dat file each) and exit.
    #[arg(long, value_name = "DIR")]
    pub dump_acpi: Option<PathBuf>,

    /// Number of vCPUs (1-255).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_VCPUS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_VCPUS)))]
    pub vcpus: u32,

    /// Guest RAM in MiB (64 or more).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MEMORY_MIB)]
    pub memory: u64,

    /// Initial ramdisk (e.g. a gzipped cpio archive).
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,

    /// Kernel command line.
    #[arg(long, value_name = "STR", default_value = DEFAULT_CMDLINE)]
    pub cmdline: String,

    /// The KVM device to use.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_KVM_DEVICE)]
    pub kvm: PathBuf,

    /// Print progress and each vCPU's thread id on stderr.
    #[arg(short, long)]
    pub verbose: bool,

    /// vCPU placement policy: performance | balance | powersaving[:1|:2] | none.
    #[arg(long, value_name = "POLICY", default_value_t = PlacementPolicy::default(),
          value_parser = clap::value_parser!(PlacementPolicy))]
    pub policy: PlacementPolicy,

    /// Host topology: auto (read sysfs), a spec SxCxT such as 2x4x2, or a topology file.
    #[arg(long, value_name = "auto|SPEC|FILE", default_value = DEFAULT_HOST_TOPOLOGY)]
    pub host_topology: String,

    /// Host CPUs pvmm may place vCPUs on, e.g. 2-15,18 (default: all).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,

    /// Placement period in milliseconds (10-60000).
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_TICK_MS)]
    pub tick_ms: u64,

    /// [`SHARE_PACKAGE_HELP`]
    #[arg(long, help = SHARE_PACKAGE_HELP)]
    pub share_package: bool,

    /// Write one JSON object per tick to FILE, or to stderr with '-' (stdout is the guest's
    /// console).
    #[arg(long, value_name = "FILE|-")]
    pub stats: Option<PathBuf>,

    /// Serve the control API (HTTP/1.1, JSON) on a Unix socket at PATH (mode 0600).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// Join a pvmm-host daemon: serve the control API in its runtime directory as
    /// pvmm-PID.sock (auto: /run/pvmm), where the daemon finds it.
    #[arg(long, value_name = "auto|DIR", conflicts_with = "api_socket")]
    pub host: Option<PathBuf>,

    /// How long an outside balancer's placement (PUT /v1/placement/external) holds without
    /// renewal before pvmm places its vCPUs itself again (100-600000).
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_EXTERNAL_LEASE_MS,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub external_lease_ms: u64,

    /// Seconds a shutdown (SIGTERM, SIGINT, PUT /v1/vm/shutdown without a timeout) waits for
    /// the guest to power off after the ACPI power button before pvmm stops it (0-600).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_SHUTDOWN_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(0..=600))]
    pub shutdown_timeout: u64,

    /// Seccomp filters on every pvmm thread: kill (a forbidden system call ends pvmm with
    /// status 159 and one line on stderr), log (it runs, and the kernel logs it: dmesg or
    /// journalctl -k), or off.
    #[arg(long, value_name = "off|log|kill", default_value_t = SeccompMode::default(),
          value_parser = clap::value_parser!(SeccompMode))]
    pub seccomp: SeccompMode,

    /// A virtio disk on a raw image file; repeat for more (the first is the guest's
    /// /dev/vda). readonly=on makes the guest's writes fail. pvmm locks the image: one
    /// that another running VM holds writable is refused.
    #[arg(long = "disk", value_name = "PATH[,readonly=on]")]
    pub disks: Vec<DiskConfig>,

    /// A virtio network card on an existing tap device (ip tuntap add NAME mode tap); repeat
    /// for more. Without mac=, the card's address is derived from the tap's name, so it stays
    /// the same for that tap. The tap does the checksum and TCP segmentation offloads the
    /// guest's driver accepts.
    #[arg(long = "net", value_name = "tap=NAME[,mac=MAC]")]
    pub nets: Vec<NetConfig>,

    /// The VM's name: how pvmm-host's status and metrics call it (default: the control
    /// socket's file name without .sock).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// A virtio entropy device fed from the host's getrandom, so that the guest does not
    /// wait for entropy (the guest needs the virtio_mmio and virtio_rng drivers).
    #[arg(long)]
    pub rng: bool,
}

impl Cli {
    /// The VM configuration these flags ask for.
    pub fn into_config(self) -> VmConfig {
        VmConfig {
            kernel: self.kernel.unwrap_or_default(),
            initrd: self.initrd,
            cmdline: self.cmdline,
            vcpus: self.vcpus,
            memory_mib: self.memory,
            kvm_device: self.kvm,
            verbose: self.verbose,
            placement: PlacementConfig {
                policy: self.policy,
                host_topology: self.host_topology,
                cpus: self.cpus,
                tick_ms: self.tick_ms,
                share_package: self.share_package,
                stats: self.stats.map(|p| {
                    if p.as_os_str() == "-" {
                        StatsTarget::Stderr
                    } else {
                        StatsTarget::File(p)
                    }
                }),
            },
            api_socket: self.api_socket.or_else(|| {
                self.host.map(|dir| {
                    let dir = if dir.as_os_str() == "auto" {
                        PathBuf::from(pvmm_api::tool::DEFAULT_RUNTIME_DIR)
                    } else {
                        dir
                    };
                    dir.join(format!("pvmm-{}.sock", std::process::id()))
                })
            }),
            external_lease_ms: self.external_lease_ms,
            shutdown_timeout_secs: self.shutdown_timeout,
            seccomp: self.seccomp,
            name: self.name,
            virtio: VirtioConfig {
                disks: self.disks,
                nets: self.nets,
                rng: self.rng,
            },
        }
    }
}

/// What parsing the command line came to.
#[derive(Debug)]
pub enum ParseOutcome {
    /// Run with these flags.
    Run(Box<Cli>),
    /// Print this (help or version) on stdout and exit 0.
    Print(String),
    /// Print this one-line error and exit 2.
    Error(String),
}

/// Parses `args`; clap's multi-line errors become one line.
pub fn parse<I, T>(args: I) -> ParseOutcome
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => ParseOutcome::Run(Box::new(cli)),
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                ParseOutcome::Print(e.render().to_string())
            }
            _ => ParseOutcome::Error(one_line(&e.render().to_string())),
        },
    }
}

/// The first meaningful line of a clap error, without its "error: " prefix.
fn one_line(rendered: &str) -> String {
    let line = rendered
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid arguments");
    let line = line.strip_prefix("error: ").unwrap_or(line);
    let mut out = line.to_string();
    if rendered.contains("required arguments were not provided") {
        if let Some(missing) = rendered.lines().map(str::trim).find(|l| l.starts_with('<')) {
            out = format!("missing argument {missing}");
        }
    }
    format!("{out} (see pvmm --help)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(args: &[&str]) -> String {
        match parse(args) {
            ParseOutcome::Error(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let ParseOutcome::Run(cli) = parse(["pvmm", "k"]) else {
            panic!()
        };
        let c = cli.into_config();
        assert_eq!(c.vcpus, 1);
        assert_eq!(c.memory_mib, DEFAULT_MEMORY_MIB);
        assert_eq!(c.cmdline, DEFAULT_CMDLINE);
        assert_eq!(c.placement.policy, PlacementPolicy::default());
    }

    #[test]
    fn joining_a_host_daemon_names_the_socket_in_its_runtime_directory() {
        let socket = |args: &[&str]| match parse(args) {
            ParseOutcome::Run(cli) => cli.into_config().api_socket,
            other => panic!("{other:?}"),
        };
        let mine = format!("pvmm-{}.sock", std::process::id());
        assert_eq!(
            socket(&["pvmm", "--host", "auto", "k"]),
            Some(PathBuf::from(pvmm_api::tool::DEFAULT_RUNTIME_DIR).join(&mine))
        );
        assert_eq!(
            socket(&["pvmm", "--host", "/tmp/vms", "k"]),
            Some(PathBuf::from("/tmp/vms").join(&mine))
        );
        assert_eq!(socket(&["pvmm", "k"]), None);
        assert!(
            err(&["pvmm", "--host", "auto", "--api-socket", "/a.sock", "k"])
                .contains("--api-socket")
        );
    }

    /// The help text spells out the limits and defaults that clap takes from constants.
    #[test]
    fn help_matches_the_constants() {
        let ParseOutcome::Print(help) = parse(["pvmm", "--help"]) else {
            panic!()
        };
        assert!(
            help.contains(&format!("Number of vCPUs (1-{MAX_VCPUS})")),
            "{help}"
        );
        assert!(help.contains(&format!("[default: {}]", PlacementPolicy::default())));
        let ParseOutcome::Run(_) = parse(["pvmm", "--vcpus", &MAX_VCPUS.to_string(), "k"]) else {
            panic!()
        };
        assert!(err(&["pvmm", "--vcpus", &(MAX_VCPUS + 1).to_string(), "k"]).contains("--vcpus"));
    }

    #[test]
    fn errors_are_one_line() {
        for args in [
            &["pvmm", "--vcpus", "0", "k"][..],
            &["pvmm", "--vcpus", "256", "k"],
            &["pvmm", "--vcpus", "x", "k"],
            &["pvmm", "--bogus", "k"],
            &["pvmm"],
            &["pvmm", "--memory", "-5", "k"],
            &["pvmm", "--policy", "fastest", "k"],
            &["pvmm", "--policy", "powersaving:7", "k"],
        ] {
            let e = err(args);
            assert!(!e.contains('\n'), "{e}");
            assert!(!e.is_empty());
        }
        assert!(err(&["pvmm", "--vcpus", "0", "k"]).contains("--vcpus"));
        assert!(err(&["pvmm"]).contains("KERNEL"));
    }

    #[test]
    fn seccomp_defaults_to_kill_and_help_documents_it() {
        let ParseOutcome::Run(cli) = parse(["pvmm", "k"]) else {
            panic!()
        };
        assert_eq!(cli.into_config().seccomp, SeccompMode::Kill);
        let ParseOutcome::Run(cli) = parse(["pvmm", "--seccomp", "log", "k"]) else {
            panic!()
        };
        assert_eq!(cli.seccomp, SeccompMode::Log);
        let ParseOutcome::Print(help) = parse(["pvmm", "--help"]) else {
            panic!()
        };
        assert!(help.contains("--seccomp <off|log|kill>"), "{help}");
        assert!(help.contains("159"), "{help}");
        assert!(!help.contains("SELFTEST"), "{help}");
        assert!(err(&["pvmm", "--seccomp", "strict", "k"]).contains("--seccomp"));
    }

    #[test]
    fn help_is_printed_not_an_error() {
        match parse(["pvmm", "--help"]) {
            ParseOutcome::Print(text) => {
                assert!(text.contains("--vcpus"));
                assert!(text.contains("Exit status"));
            }
            other => panic!("{other:?}"),
        }
    }
}
