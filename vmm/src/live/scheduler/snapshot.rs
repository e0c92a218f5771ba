//! The `--stats` line of a tick (also the control socket's `GET /v1/placement`), serialized by
//! `serde_json` straight into a buffer the scheduler reuses every tick, so that reporting
//! allocates nothing once warm: the line's objects are borrowing views of the scheduler, and
//! lists and text (CPU lists, the policy) are written element by element and through
//! `collect_str`, never collected first.
//!
//! The members are declared in byte order, the order `serde_json` gives a map's keys, so the
//! line reads the same as the schema's documented `Value` form.

use std::fmt::Display;

use pvmm_scheduler::capacity::CAPACITY_SCALE;
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

use pvmm_scheduler::PlacementPolicy;
use pvmm_tick::TickReport;

use super::{round3, LiveVcpu, VmMembers};

#[derive(Serialize)]
struct Line<'a> {
    capacity_notifications: Option<u64>,
    cppc_enabled: Option<u32>,
    external: bool,
    guest_register_errors: Option<u64>,
    migrations: u64,
    migrations_total: u64,
    packages: Packages<'a>,
    #[serde(serialize_with = "as_text")]
    policy: PlacementPolicy,
    policy_changes: u64,
    t_ms: u64,
    vcpus: Vcpus<'a>,
}

#[derive(Serialize)]
struct Package {
    active: bool,
    id: u32,
    util: f64,
}

#[derive(Serialize)]
struct Vcpu<'a> {
    busy: bool,
    capacity: u32,
    #[serde(serialize_with = "as_text")]
    cpus: &'a pvmm_scheduler::CpuSet,
    desired: Option<u32>,
    package: Option<u32>,
    tid: i32,
    util: f64,
    vcpu: u32,
    waited: f64,
}

/// Per package: whether it holds vCPUs, and their utilization over its capacity.
struct Packages<'a>(&'a VmMembers, &'a TickReport<'a>);

/// Per vCPU: its tracker's readings and where it is placed.
struct Vcpus<'a>(&'a VmMembers, &'a TickReport<'a>);

/// `v`'s text as a JSON string, escaped as it is written.
fn as_text<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn fraction(v: u32) -> f64 {
    round3(f64::from(v) / f64::from(CAPACITY_SCALE))
}

impl Serialize for Packages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (sched, tick) = (self.0, self.1);
        let packages = tick.topology.packages();
        let mut seq = s.serialize_seq(Some(packages.len()))?;
        for (p, &capacity) in packages.iter().zip(tick.package_capacity) {
            let on = || sched.vcpus.iter().filter(|v| v.package == Some(p.id));
            let demand: u32 = on().map(|v| v.tracker.util().util()).sum();
            seq.serialize_element(&Package {
                active: on().next().is_some(),
                id: p.id,
                util: round3(f64::from(demand) / f64::from(capacity.max(1))),
            })?;
        }
        seq.end()
    }
}

impl Serialize for Vcpus<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (sched, tick) = (self.0, self.1);
        let mut seq = s.serialize_seq(Some(sched.vcpus.len()))?;
        for v in &sched.vcpus {
            seq.serialize_element(&sched.vcpu_view(v, tick.all_cpus))?;
        }
        seq.end()
    }
}

impl VmMembers {
    fn vcpu_view<'a>(&'a self, v: &'a LiveVcpu, all_cpus: &'a pvmm_scheduler::CpuSet) -> Vcpu<'a> {
        Vcpu {
            busy: v.tracker.util().is_busy(),
            capacity: v.capacity,
            cpus: v.last_cpus.as_ref().unwrap_or(all_cpus),
            desired: self.capacity.as_ref().map(|r| r.guest_desired(v.index)),
            package: v.package,
            tid: v.tid,
            util: fraction(v.tracker.util().util()),
            vcpu: v.index,
            waited: fraction(v.tracker.waited()),
        }
    }

    /// Writes this tick's `--stats` line (without its newline) into `out`, replacing what it
    /// held.
    pub(super) fn write_snapshot(&self, out: &mut Vec<u8>, tick: &TickReport<'_>) {
        out.clear();
        let capacity = self.capacity.as_ref();
        let line = Line {
            capacity_notifications: capacity.map(|r| r.notifications()),
            cppc_enabled: capacity.map(|r| r.guest_enabled()),
            external: tick.outside,
            guest_register_errors: self.guest_errors.as_ref().map(|e| e.total()),
            migrations: tick.moved,
            migrations_total: tick.totals.migrations,
            packages: Packages(self, tick),
            policy: tick.policy,
            policy_changes: tick.totals.policy_changes,
            t_ms: tick.now_ns / 1_000_000,
            vcpus: Vcpus(self, tick),
        };
        // Serializing these types into a `Vec` cannot fail: no map keys, no I/O.
        let _ = serde_json::to_writer(&mut *out, &line);
    }
}
