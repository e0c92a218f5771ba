//! `pvmm-host`'s command line.

use std::path::PathBuf;

use clap::Parser;
use pvmm_scheduler::{CpuSet, Policy};

use super::discover::Roots;
use super::HostConfig;
use pvmm_scheduler::DEFAULT_POLICY;
use pvmm_tick::settings::{
    DEFAULT_HOST_TOPOLOGY, DEFAULT_TICK_MS, MAX_TICK_MS, MIN_TICK_MS, SHARE_PACKAGE_HELP,
};

/// The runtime directory pvmm VMs put their control sockets in to join the daemon.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/pvmm";
/// Where `--metrics` without an address listens: localhost only, node_exporter's habit of a
/// fixed port (9477 is not one of the well-known exporters').
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9477";

const AFTER_HELP: &str = "\
pvmm VMs join by serving their control socket in the runtime directory
(pvmm --api-socket /run/pvmm/NAME.sock ...). The daemon places their vCPUs through
it (PUT /v1/placement/external, renewed every tick), so their guests still see
their capacity through CPPC; if the daemon dies, each pvmm places itself again
when its lease runs out. With --adopt auto, VMs of other VMMs (any process holding
KVM vCPU file descriptors) are placed too, by thread affinity: vCPU threads from
debugfs (/sys/kernel/debug/kvm/PID-FD/vcpuN/pid), the VMM's thread names (QEMU's
'CPU N/KVM' with -name NAME,debug-threads=on, Firecracker's 'fc_vcpu N', crosvm's
'crosvm_vcpuN', cloud-hypervisor's 'vcpuN'), or a QEMU's QMP socket given with
--qmp; the VMM's other threads pinned to the active packages.

The daemon answers GET /v1/host (JSON) and GET /metrics (Prometheus text) on
DIR/pvmm-host.api; `pvmm-host status` prints it. --metrics serves /metrics over
TCP too (127.0.0.1:9477 when no address is given). Package energy comes from RAPL
where readable (pvmm_package_energy_joules_total); pvmm_package_power_model_watts
is a model, never a measurement.

SIGTERM or SIGINT: placement is handed back (pvmm VMs to their own policy, other
VMs' threads to the affinity they had) and pvmm-host exits 0.

Exit status: 0 stopped by a signal; 1 failure while running; 2 bad flags, or
another pvmm-host already runs on the runtime directory.

Example:
  pvmm-host --policy powersaving --adopt auto --stats /var/log/pvmm-host.jsonl";

/// pvmm-host: places the vCPUs of every VM on the host with one engine.
#[derive(Debug, Parser)]
#[command(name = "pvmm-host", version, about, after_help = AFTER_HELP)]
pub struct HostCli {
    /// Placement policy: performance | balance | powersaving[:1|:2].
    #[arg(long, value_name = "POLICY", default_value_t = DEFAULT_POLICY)]
    pub policy: Policy,

    /// Host topology: auto (read sysfs), a spec SxCxT such as 2x4x2, or a topology file.
    #[arg(long, value_name = "auto|SPEC|FILE", default_value = DEFAULT_HOST_TOPOLOGY)]
    pub host_topology: String,

    /// Host CPUs to place vCPUs on, e.g. 2-15,18 (default: all).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<CpuSet>,

    /// Placement period in milliseconds (10-60000).
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_TICK_MS,
          value_parser = clap::value_parser!(u64).range(MIN_TICK_MS..=MAX_TICK_MS))]
    pub tick_ms: u64,

    /// [`SHARE_PACKAGE_HELP`]
    #[arg(long, help = SHARE_PACKAGE_HELP)]
    pub share_package: bool,

    /// Where pvmm VMs' control sockets are (*.sock), and the daemon's own lock and status
    /// socket.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_RUNTIME_DIR, global = true)]
    pub runtime_dir: PathBuf,

    /// Adopt VMs of other VMMs: auto | none.
    #[arg(long, value_name = "auto|none", default_value = "none",
          value_parser = ["auto", "none"])]
    pub adopt: String,

    /// A QEMU QMP socket to ask for vCPU threads (query-cpus-fast) when neither debugfs
    /// nor thread names tell them; repeat for several QEMUs.
    #[arg(long, value_name = "PATH")]
    pub qmp: Vec<PathBuf>,

    /// Write one JSON object per tick to FILE, or to stdout with '-'.
    #[arg(long, value_name = "FILE|-")]
    pub stats: Option<PathBuf>,

    /// Serve Prometheus metrics (GET /metrics) over TCP at ADDR.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = DEFAULT_METRICS_ADDR)]
    pub metrics: Option<std::net::SocketAddr>,

    /// Log on stderr each VM that joins or leaves, and each decision that moves vCPUs (the
    /// moves and the loads they were decided on).
    #[arg(short, long)]
    pub verbose: bool,

    #[command(subcommand)]
    pub command: Option<HostCommand>,
}

/// Commands other than running the daemon.
#[derive(Debug, clap::Subcommand)]
pub enum HostCommand {
    /// Show what the running daemon does: packages, VMs, and where each vCPU is.
    Status {
        /// Print the JSON snapshot instead of tables.
        #[arg(long)]
        json: bool,
    },
}

impl HostCli {
    /// The configuration these flags ask for; an error is one line for stderr.
    pub fn into_config(self) -> Result<HostConfig, String> {
        let topology = pvmm_scheduler::parse_host_topology_arg(&self.host_topology)
            .map_err(|e| format!("--host-topology {}: {e}", self.host_topology))?;
        let topology = match &self.cpus {
            Some(set) => topology
                .restrict(set)
                .map_err(|e| format!("--cpus {set}: {e}"))?,
            None => topology,
        };
        Ok(HostConfig {
            policy: self.policy,
            topology,
            tick: std::time::Duration::from_millis(self.tick_ms),
            share_package: self.share_package,
            runtime_dir: self.runtime_dir,
            adopt: self.adopt == "auto",
            roots: Roots {
                qmp: self.qmp,
                ..Roots::default()
            },
            verbose: self.verbose,
            metrics: self.metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_their_errors() {
        let ok =
            HostCli::try_parse_from(["pvmm-host", "--host-topology", "2x2x1", "--cpus", "0-2"])
                .unwrap()
                .into_config()
                .unwrap();
        assert_eq!(ok.topology.cpu_set(), CpuSet::range(0, 2));
        assert!(!ok.adopt);
        assert!(ok.roots.qmp.is_empty());
        let qmp = HostCli::try_parse_from(["pvmm-host", "--qmp", "/a", "--qmp", "/b"])
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(qmp.roots.qmp, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert!(HostCli::try_parse_from(["pvmm-host", "--policy", "none"]).is_err());
        assert!(HostCli::try_parse_from(["pvmm-host", "--adopt", "maybe"]).is_err());
        assert!(HostCli::try_parse_from(["pvmm-host", "--tick-ms", "5"]).is_err());
        let bad = HostCli::try_parse_from(["pvmm-host", "--host-topology", "9x"])
            .unwrap()
            .into_config();
        assert!(bad.unwrap_err().starts_with("--host-topology 9x"));
    }
}
