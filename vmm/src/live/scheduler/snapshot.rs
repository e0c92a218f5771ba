//! The `--stats` line of a tick (also the control socket's `GET /v1/placement`), serialized by
//! `serde_json` straight into a buffer the scheduler reuses every tick, so that reporting
//! allocates nothing once warm: the line's objects are borrowing views of the scheduler, and
//! lists and text (CPU lists, the policy) are written element by element and through
//! `collect_str`, never collected first.
//!
//! The line is [`VmStats`], the schema's one type, written through views ([`Packages`],
//! [`Vcpus`]) that stream its lists' elements.

use std::time::Instant;

use pvmm_api::stats::{round3, share, PackageStats, VcpuStats, VmStats};
use pvmm_scheduler::CpuSet;
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

use pvmm_tick::TickReport;

use super::{LiveVcpu, VmMembers};

/// Per package: whether it holds vCPUs, and their utilization over its capacity.
struct Packages<'a>(&'a VmMembers, &'a TickReport<'a>);

/// Per vCPU: its tracker's readings and where it is placed.
struct Vcpus<'a>(&'a VmMembers, &'a TickReport<'a>);

impl Serialize for Packages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (sched, tick) = (self.0, self.1);
        let packages = tick.topology.packages();
        let mut seq = s.serialize_seq(Some(packages.len()))?;
        for (p, &capacity) in packages.iter().zip(tick.package_capacity) {
            let on = || sched.vcpus.iter().filter(|v| v.package == Some(p.id));
            let demand: u32 = on().map(|v| v.tracker.util().util()).sum();
            seq.serialize_element(&PackageStats {
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
    /// `at` on the loop's clock: ns since its start (0 for an instant before it).
    pub(super) fn since_start_ns(&self, at: Instant) -> u64 {
        // u64 nanoseconds last 584 years: saturating is never reached in a VM's lifetime.
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    fn vcpu_view<'a>(&'a self, v: &'a LiveVcpu, all_cpus: &'a CpuSet) -> VcpuStats<&'a CpuSet> {
        VcpuStats {
            busy: v.tracker.util().is_busy(),
            capacity: v.capacity,
            cpus: v.last_cpus.as_ref().unwrap_or(all_cpus),
            desired: self.capacity.as_ref().map(|r| r.guest_desired(v.index)),
            package: v.package,
            tid: v.tid,
            util: share(v.tracker.util().util()),
            vcpu: v.index,
            waited: share(v.tracker.waited()),
        }
    }

    /// Writes this tick's `--stats` line (without its newline) into `out`, replacing what it
    /// held.
    pub(super) fn write_snapshot(&self, out: &mut Vec<u8>, tick: &TickReport<'_>) {
        out.clear();
        let capacity = self.capacity.as_ref();
        let line = VmStats {
            boot_ms: (self.boot_at_start_ns + tick.now_ns) / 1_000_000,
            capacity_notifications: capacity.map(|r| r.notifications()),
            cppc_enabled: capacity.map(|r| r.guest_enabled()),
            external: tick.outside,
            external_renewed_ms: self
                .external_copy
                .renewed
                .map(|at| self.since_start_ns(at) / 1_000_000),
            guest_register_errors: self.guest_errors.as_ref().map(|e| e.total()),
            housekeeping: share(self.housekeeping_util),
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
