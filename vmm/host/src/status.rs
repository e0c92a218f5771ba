//! The daemon's status: each tick's snapshot of every VM and package, and where it goes.
//!
//! A snapshot ([`HostStatus`]) is built from the tick's decision and what each VM showed of
//! itself ([`VmView`]), so that it does not depend on how a VM is read or placed. Energy is
//! added by the ledger ([`crate::energy`]), then the line is written to `--stats` and becomes
//! the latest status, which the servers ([`crate::metrics`]) answer with: `GET /v1/host` on the
//! status socket (what `pvmm-host status` reads) and `GET /metrics`.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use pvmm_api::stats::{
    round3, round_watts, share, EnergySource, HostPackage, HostStatus, HostVcpu, HostVm, TickUs,
    VmKind,
};
use pvmm_scheduler::{Assignment, Decision, VcpuId};
use pvmm_tick::{PhaseTimes, TickReport};

use crate::energy::{EnergyLedger, POWERCAP_ROOT};
use crate::members::MemberVcpu;
use crate::metrics::{self, Latest};
use crate::{HostConfig, STATUS_SOCKET};

/// One VM as the status shows it.
#[derive(Debug, Clone, Copy)]
pub struct VmView<'a> {
    /// Its process.
    pub pid: i32,
    /// The engine's VM number.
    pub id: u32,
    /// Whose VM it is.
    pub kind: VmKind,
    /// Its stable name ([`crate::names`]).
    pub name: &'a str,
    /// Its vCPUs as read at this tick.
    pub vcpus: &'a [MemberVcpu],
}

/// Where one tick's time went, in microseconds (the stats schema's `tick_us`): finding VMs,
/// reading their vCPUs' utilization, deciding, applying (sockets and affinity).
pub fn tick_us(t: &PhaseTimes) -> TickUs {
    let us = |ns: u64| ns / 1000;
    TickUs {
        discover: us(t.discover_ns),
        read: us(t.read_ns),
        decide: us(t.decide_ns),
        apply: us(t.apply_ns),
    }
}

/// This tick's status: every VM's vCPUs (utilization, placement, capacity, whether an
/// operator pinned its thread: `pinned`) and every package (vCPUs, utilization, modelled
/// power). Energy is left at zero for the ledger.
pub fn snapshot<'a>(
    vms: impl IntoIterator<Item = VmView<'a>>,
    pinned: &dyn Fn(i32) -> bool,
    config: &HostConfig,
    tick: &TickReport<'_>,
    decision: &Decision,
) -> HostStatus {
    let by_id: HashMap<VcpuId, &Assignment> =
        decision.assignments.iter().map(|a| (a.id, a)).collect();
    let mut cpu_load: HashMap<u32, f64> = HashMap::new();
    let vms = vms
        .into_iter()
        .map(|vm| HostVm {
            energy_joules: 0.0,
            id: vm.id,
            kind: vm.kind,
            name: vm.name.to_string(),
            pid: vm.pid,
            vcpus: vm
                .vcpus
                .iter()
                .map(|v| {
                    let a = by_id.get(&VcpuId {
                        vm: vm.id,
                        vcpu: v.vcpu,
                    });
                    if let Some(a) = a {
                        *cpu_load.entry(a.cpu).or_default() += f64::from(v.util) / 1024.0;
                    }
                    vcpu_status(v, a.copied(), pinned(v.tid))
                })
                .collect(),
        })
        .collect();
    HostStatus {
        apply_errors: tick.totals.apply_errors,
        energy_source: EnergySource::Model,
        migrations: decision.migrations.len() as u64,
        migrations_total: tick.totals.migrations,
        packages: packages(config, decision, &cpu_load),
        policy: config.policy,
        t_ms: tick.now_ns / 1_000_000,
        tick_us: tick_us(&tick.totals.last),
        vms,
    }
}

/// A vCPU's status: as read, and where the engine put it (`a`).
fn vcpu_status(v: &MemberVcpu, a: Option<&Assignment>, pinned: bool) -> HostVcpu {
    HostVcpu {
        busy: v.busy,
        capacity: a.map(|a| a.capacity),
        cpus: a.map(|a| a.cpus.clone()),
        package: a.map(|a| a.package),
        pinned,
        tid: v.tid,
        util: share(v.util),
        vcpu: v.vcpu,
        waited: share(v.waited),
    }
}

/// Every package's status: the vCPUs `decision` put there, its CPUs' load (`cpu_load`, the
/// vCPUs' utilization on each CPU) and the power model's watts for it.
fn packages(
    config: &HostConfig,
    decision: &Decision,
    cpu_load: &HashMap<u32, f64>,
) -> Vec<HostPackage> {
    let topology = &config.topology;
    let load = |cpu: u32| cpu_load.get(&cpu).copied().unwrap_or(0.0).min(1.0);
    let power: HashMap<u32, f64> = metrics::package_power_model(topology, &load)
        .into_iter()
        .collect();
    topology
        .packages()
        .iter()
        .map(|p| {
            let cpus = p.cpus();
            let on = decision
                .assignments
                .iter()
                .filter(|a| a.package == p.id)
                .count();
            let util: f64 = cpus.iter().map(load).sum::<f64>() / cpus.len().max(1) as f64;
            HostPackage {
                active: on > 0,
                energy_joules: 0.0,
                id: p.id,
                idle_energy_joules: 0.0,
                power_w_model: round_watts(power.get(&p.id).copied().unwrap_or(0.0)),
                util: round3(util),
                vcpus: u32::try_from(on).unwrap_or(u32::MAX),
            }
        })
        .collect()
}

/// Where each snapshot goes: the energy ledger, the `--stats` lines, the servers' latest.
pub struct StatusOutput {
    /// The `--stats` output, until a write to it fails.
    stats: Option<Box<dyn Write>>,
    /// The latest snapshot, which the servers answer with.
    latest: Latest,
    /// Energy by VM and package since start.
    energy: EnergyLedger,
}

impl StatusOutput {
    /// Output writing a JSON line per snapshot to `stats`, with energy from the host's RAPL.
    pub fn new(stats: Option<Box<dyn Write>>) -> Self {
        Self {
            stats,
            latest: Latest::default(),
            energy: EnergyLedger::new(PathBuf::from(POWERCAP_ROOT)),
        }
    }

    /// The latest snapshot.
    pub fn latest(&self) -> &Latest {
        &self.latest
    }

    /// Accounts `line`'s energy at `now_ns`, writes it to `--stats` and makes it the latest.
    pub fn publish(&mut self, now_ns: u64, config: &HostConfig, mut line: HostStatus) {
        self.energy.account(now_ns, &config.topology, &mut line);
        if let Some(out) = self.stats.as_mut() {
            let written = serde_json::to_writer(&mut *out, &line)
                .map_err(std::io::Error::from)
                .and_then(|_| writeln!(out))
                .and_then(|_| out.flush());
            if written.is_err() {
                self.stats = None;
            }
        }
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(line);
    }

    /// Starts the status socket in `runtime_dir` and, at `metrics` (`--metrics`), the TCP
    /// metrics endpoint.
    pub fn serve(
        &self,
        runtime_dir: &Path,
        metrics: Option<std::net::SocketAddr>,
    ) -> Result<(), String> {
        let path = runtime_dir.join(STATUS_SOCKET);
        // The lock is held: a socket file left here is a dead daemon's.
        let _ = std::fs::remove_file(&path);
        let unix = std::os::unix::net::UnixListener::bind(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        metrics::spawn_server("pvmm-host-api", unix, self.latest.clone())
            .map_err(|e| format!("status thread: {e}"))?;
        if let Some(addr) = metrics {
            let tcp =
                std::net::TcpListener::bind(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
            metrics::spawn_server("pvmm-host-metrics", tcp, self.latest.clone())
                .map_err(|e| format!("metrics thread: {e}"))?;
        }
        Ok(())
    }
}
