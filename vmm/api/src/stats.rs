//! The stats schema: what a tick reports, as one type per document that every writer and every
//! reader uses.
//!
//! - [`VmStats`]: a pvmm VM's tick: its `--stats` line and its `GET /v1/placement` answer.
//!   pvmm writes it, `pvmm-ctl placement` prints it, the host daemon reads it to place the VM,
//!   and the rig's probes read it from inside L1.
//! - [`HostStatus`]: the host daemon's tick: its `--stats` line, `GET /v1/host`, what
//!   `pvmm-host status` prints, and what its metrics are made from.
//!
//! Members are declared in byte order, the order in which `serde_json` writes the keys of a
//! map, so a line reads the same whether it was written from these types or from a parsed
//! `Value`. Shares of a CPU (`util`, `waited`) are fractions of one CPU, rounded to 3 places.
//!
//! [`VmStats`] is generic over its lists, and [`VcpuStats`] over its CPU set, so that pvmm's
//! tick can write its line through borrowing views that stream the elements (the warm tick
//! allocates nothing), while readers get plain `Vec`s: the element types are the same.

use pvmm_scheduler::{CpuSet, PlacementPolicy, Policy};
use serde::{Deserialize, Serialize};

/// One pvmm VM's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmStats<P = Vec<PackageStats>, V = Vec<VcpuStats>> {
    /// The tick's instant on the host's boot clock (`CLOCK_BOOTTIME`, the clock of
    /// `/proc/uptime`), in milliseconds: lines of several VMs, and what host tools sampled,
    /// line up on it. 0 when a line lacks it.
    #[serde(default)]
    pub boot_ms: u64,
    /// Capacity changes the guest was notified of (None without CPPC).
    pub capacity_notifications: Option<u64>,
    /// The guest's CPPC enable register summed over vCPUs (None without CPPC).
    pub cppc_enabled: Option<u32>,
    /// Whether an outside balancer (the host daemon) places the vCPUs.
    pub external: bool,
    /// When an outside balancer last sent assignments, on this line's `t_ms` clock: its lease
    /// runs from there (None before the first; kept after the lease ends).
    #[serde(default)]
    pub external_renewed_ms: Option<u64>,
    /// Guest register accesses that were refused (None when nothing counts them).
    pub guest_register_errors: Option<u64>,
    /// CPU time pvmm's own threads (the virtio devices', console, API and scheduler threads)
    /// used over the last tick, in CPUs (more than 1 when several are busy); pvmm's engine
    /// counts its average as load on the package they are kept on. 0 when a line lacks it.
    #[serde(default)]
    pub housekeeping: f64,
    /// vCPUs moved this tick.
    pub migrations: u64,
    /// vCPUs moved since start.
    pub migrations_total: u64,
    /// Every package of the host topology.
    pub packages: P,
    /// The policy in force.
    #[serde(with = "crate::text")]
    pub policy: PlacementPolicy,
    /// Policy switches since start.
    pub policy_changes: u64,
    /// Milliseconds since pvmm's scheduler started, at the tick.
    pub t_ms: u64,
    /// Every vCPU.
    pub vcpus: V,
}

/// One package in a VM's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageStats {
    /// Whether it holds vCPUs of this VM.
    pub active: bool,
    /// Package id.
    pub id: u32,
    /// The VM's vCPU demand on it over its capacity.
    pub util: f64,
}

/// One vCPU in a VM's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "C: std::fmt::Display",
    deserialize = "C: std::str::FromStr, C::Err: std::fmt::Display"
))]
pub struct VcpuStats<C = CpuSet> {
    /// Whether its utilization is over the busy threshold.
    pub busy: bool,
    /// The capacity published to the guest (1..1024).
    pub capacity: u32,
    /// The host CPUs its thread may run on.
    #[serde(with = "crate::text")]
    pub cpus: C,
    /// The guest's CPPC desired performance (None without CPPC).
    pub desired: Option<u32>,
    /// The package it is placed on (None before its first placement).
    pub package: Option<u32>,
    /// Its thread id.
    pub tid: i32,
    /// Its utilization, in CPUs.
    pub util: f64,
    /// vCPU index.
    pub vcpu: u32,
    /// Time it was runnable but waited for a CPU, in CPUs.
    pub waited: f64,
}

/// Where the daemon's energy figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnergySource {
    /// The packages' RAPL counters: measured.
    Rapl,
    /// The package power model applied to the placement: modelled.
    #[default]
    Model,
}

/// The host daemon's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    /// Affinity changes that failed since start.
    pub apply_errors: u64,
    /// Where the energy figures come from.
    #[serde(default)]
    pub energy_source: EnergySource,
    /// vCPUs moved this tick.
    pub migrations: u64,
    /// vCPUs moved since start.
    pub migrations_total: u64,
    /// Every package of the host topology.
    pub packages: Vec<HostPackage>,
    /// The daemon's policy.
    #[serde(with = "crate::text")]
    pub policy: Policy,
    /// Milliseconds since the daemon started.
    pub t_ms: u64,
    /// What this tick's phases cost.
    pub tick_us: TickUs,
    /// Every VM placed.
    pub vms: Vec<HostVm>,
}

impl HostStatus {
    /// The VM named `name`, if the daemon places one.
    pub fn vm(&self, name: &str) -> Option<&HostVm> {
        self.vms.iter().find(|vm| vm.name == name)
    }
}

/// One package in the daemon's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostPackage {
    /// Whether it holds vCPUs.
    pub active: bool,
    /// Its energy since the daemon started, in joules.
    #[serde(default)]
    pub energy_joules: f64,
    /// Package id.
    pub id: u32,
    /// The part of `energy_joules` no VM's vCPUs used.
    #[serde(default)]
    pub idle_energy_joules: f64,
    /// The package power model's watts at this load (rounded to 0.1 W).
    pub power_w_model: f64,
    /// Mean load of its CPUs.
    pub util: f64,
    /// vCPUs placed on it.
    pub vcpus: u32,
}

/// Which kind of VMM runs a VM the daemon places.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmKind {
    /// A pvmm VM, placed through its control socket.
    Pvmm,
    /// Another VMM's VM, placed by thread affinity.
    Foreign,
}

impl VmKind {
    /// Its name in the schema.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pvmm => "pvmm",
            Self::Foreign => "foreign",
        }
    }
}

/// One VM in the daemon's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostVm {
    /// Its share of the packages' energy since the daemon started placing it, in joules.
    #[serde(default)]
    pub energy_joules: f64,
    /// The daemon's id for it.
    pub id: u32,
    /// Who runs it.
    pub kind: VmKind,
    /// Its stable name (the VMM's own name for it, else the pid).
    pub name: String,
    /// The VMM's pid.
    pub pid: i32,
    /// Every vCPU.
    pub vcpus: Vec<HostVcpu>,
}

impl HostVm {
    /// Its vCPU of index `vcpu`, if it has one.
    pub fn vcpu(&self, vcpu: u32) -> Option<&HostVcpu> {
        self.vcpus.iter().find(|v| v.vcpu == vcpu)
    }
}

/// One vCPU in the daemon's tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostVcpu {
    /// Whether its utilization is over the busy threshold.
    pub busy: bool,
    /// The capacity given to it (None while unplaced).
    pub capacity: Option<u32>,
    /// The host CPUs it was given (None while unplaced).
    #[serde(with = "crate::text::option")]
    pub cpus: Option<CpuSet>,
    /// The package it was given (None while unplaced).
    pub package: Option<u32>,
    /// An operator pinned its thread: the daemon does not move it.
    #[serde(default)]
    pub pinned: bool,
    /// Its thread id.
    pub tid: i32,
    /// Its utilization, in CPUs.
    pub util: f64,
    /// vCPU index within its VM.
    pub vcpu: u32,
    /// Time it was runnable but waited for a CPU, in CPUs.
    pub waited: f64,
}

/// A daemon tick's cost per phase, in microseconds (wall clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TickUs {
    /// Applying: pvmm sockets, affinity, the daemon's own threads.
    pub apply: u64,
    /// The engine's decision.
    pub decide: u64,
    /// Discovery: the runtime directory and, with adoption, `/proc/*/fd`.
    pub discover: u64,
    /// Reading utilization: pvmm sockets and foreign threads' schedstat.
    pub read: u64,
}

/// A share of one CPU on the 1024 scale as the schema writes it: a fraction, 3 places.
pub fn share(of_1024: u32) -> f64 {
    round3(f64::from(of_1024) / 1024.0)
}

/// A share as the schema writes it back on the 1024 scale, clamped to one CPU.
// Clamped to 0..=1024 first; a float-to-integer cast gives 0 for NaN.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn share_of_1024(share: f64) -> u32 {
    (share * 1024.0).round().clamp(0.0, 1024.0) as u32
}

/// Watts as the schema writes them: 1 decimal place.
pub fn round_watts(w: f64) -> f64 {
    (w * 10.0).round() / 10.0
}

/// `v` rounded to 3 decimal places, the schema's precision for shares.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm_line() -> &'static str {
        r#"{"boot_ms":5200,"capacity_notifications":3,"cppc_enabled":2,"external":false,"external_renewed_ms":null,"guest_register_errors":0,"housekeeping":0.25,"migrations":1,"migrations_total":7,"packages":[{"active":true,"id":0,"util":0.5}],"policy":"powersaving:2","policy_changes":0,"t_ms":1200,"vcpus":[{"busy":true,"capacity":1024,"cpus":"0-1,3","desired":null,"package":0,"tid":41,"util":0.75,"vcpu":0,"waited":0.0}]}"#
    }

    #[test]
    fn a_vm_line_reads_back_and_writes_the_same_bytes() {
        let stats: VmStats = serde_json::from_str(vm_line()).unwrap();
        assert_eq!(stats.policy.to_string(), "powersaving:2");
        assert_eq!(stats.vcpus[0].cpus.to_string(), "0-1,3");
        assert_eq!(serde_json::to_string(&stats).unwrap(), vm_line());
        // The same order as a parsed Value's (sorted) keys.
        let value: serde_json::Value = serde_json::from_str(vm_line()).unwrap();
        assert_eq!(value.to_string(), vm_line());
    }

    #[test]
    fn a_vm_line_without_housekeeping_reads_as_none_used() {
        let old = vm_line().replace(r#""housekeeping":0.25,"#, "");
        let stats: VmStats = serde_json::from_str(&old).unwrap();
        assert_eq!(stats.housekeeping, 0.0);
        let mut with = stats.clone();
        with.housekeeping = 1.5;
        let line = serde_json::to_string(&with).unwrap();
        assert!(line.contains(r#""guest_register_errors":0,"housekeeping":1.5,"migrations":1"#));
        assert_eq!(serde_json::from_str::<VmStats>(&line).unwrap(), with);
    }

    #[test]
    fn a_host_status_reads_back_and_bad_text_is_refused() {
        let line = r#"{"apply_errors":0,"energy_source":"model","migrations":0,"migrations_total":2,"packages":[{"active":false,"energy_joules":3.5,"id":1,"idle_energy_joules":3.5,"power_w_model":12.5,"util":0.0,"vcpus":0}],"policy":"balance","t_ms":5,"tick_us":{"apply":1,"decide":2,"discover":3,"read":4},"vms":[{"energy_joules":0.0,"id":0,"kind":"foreign","name":"qemu","pid":9,"vcpus":[{"busy":false,"capacity":null,"cpus":null,"package":null,"pinned":false,"tid":10,"util":0.0,"vcpu":0,"waited":0.0}]}]}"#;
        let status: HostStatus = serde_json::from_str(line).unwrap();
        assert_eq!(status.vms[0].kind, VmKind::Foreign);
        assert_eq!(serde_json::to_string(&status).unwrap(), line);
        let bad = line.replace(r#""policy":"balance""#, r#""policy":"fastest""#);
        assert!(serde_json::from_str::<HostStatus>(&bad).is_err());
        let bad = vm_line().replace(r#""cpus":"0-1,3""#, r#""cpus":"3-1""#);
        assert!(serde_json::from_str::<VmStats>(&bad).is_err());
    }

    #[test]
    fn shares_round_trip_on_the_1024_scale() {
        for v in [0, 1, 512, 1000, 1024] {
            assert!(share_of_1024(share(v)).abs_diff(v) <= 1);
        }
        assert_eq!(share_of_1024(2.0), 1024);
        assert_eq!(share_of_1024(-1.0), 0);
    }
}
