//! The VMs a host daemon manages, and how each kind is read and placed.
//!
//! - A pvmm VM is read through its control socket (`GET /v1/vcpus`: each vCPU's utilization
//!   from pvmm's own idle signal, which includes KVM's halt statistics) and placed through it
//!   (`PUT /v1/placement/external`, which also publishes the capacities to the guest through
//!   CPPC and renews the lease). pvmm keeps its own threads with its vCPUs.
//! - A foreign VM is read from `/proc` (each vCPU thread's schedstat: time wanted on a CPU;
//!   the rest is time blocked in the guest's halts) and placed by thread affinity; its other
//!   threads are housekeeping, pinned to the active packages. Affinity is all such a VM gets:
//!   it has no CPPC registers pvmm could serve.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pvmm_scheduler::{CpuSet, IdleSample, UtilConfig, UtilTracker};
use serde_json::{json, Value};

use super::discover::{thread_ids, thread_wanted_ns, ForeignVm};
use crate::api::client::request;

/// One vCPU of a managed VM, as read at this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberVcpu {
    /// vCPU index.
    pub vcpu: u32,
    /// Its thread.
    pub tid: i32,
    /// Decayed utilization, 0..=1024.
    pub util: u32,
    /// Ran at least half of the last tick.
    pub busy: bool,
}

/// Errors reading or placing a member.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The pvmm's control socket could not be used (the VM may have ended).
    #[error("{socket}: {why}")]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// What failed.
        why: String,
    },
}

/// A pvmm VM joined through its control socket.
#[derive(Debug, Clone)]
pub struct PvmmMember {
    /// Its control socket.
    pub socket: PathBuf,
    /// Its pid.
    pub pid: i32,
}

fn call(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Result<Value, MemberError> {
    let err = |why: String| MemberError::Socket {
        socket: socket.to_path_buf(),
        why,
    };
    let answer = request(socket, method, path, body).map_err(|e| err(e.to_string()))?;
    if answer.status >= 300 {
        return Err(err(format!(
            "{method} {path}: {} {}",
            answer.status, answer.body
        )));
    }
    Ok(answer.body)
}

impl PvmmMember {
    /// Joins the pvmm serving `socket`.
    pub fn join(socket: &Path) -> Result<Self, MemberError> {
        let vm = call(socket, "GET", "/v1/vm", None)?;
        let pid = vm["pid"].as_i64().and_then(|p| i32::try_from(p).ok());
        let pid = pid.ok_or_else(|| MemberError::Socket {
            socket: socket.to_path_buf(),
            why: format!("GET /v1/vm has no pid: {vm}"),
        })?;
        Ok(Self {
            socket: socket.to_path_buf(),
            pid,
        })
    }

    /// Its vCPUs now.
    pub fn read(&self) -> Result<Vec<MemberVcpu>, MemberError> {
        let body = call(&self.socket, "GET", "/v1/vcpus", None)?;
        let empty = Vec::new();
        let vcpus = body["vcpus"].as_array().unwrap_or(&empty);
        Ok(vcpus
            .iter()
            .filter_map(|v| {
                Some(MemberVcpu {
                    vcpu: u32::try_from(v["vcpu"].as_u64()?).ok()?,
                    tid: i32::try_from(v["tid"].as_i64()?).ok()?,
                    // Before pvmm's first tick a vCPU has no utilization yet: idle.
                    util: (v["util"].as_f64().unwrap_or(0.0) * 1024.0)
                        .round()
                        .clamp(0.0, 1024.0) as u32,
                    busy: v["busy"].as_bool().unwrap_or(false),
                })
            })
            .collect())
    }

    /// Places its vCPUs (and renews the lease): (vCPU, CPUs, capacity) each.
    pub fn place(&self, assignments: &[(u32, CpuSet, u32)]) -> Result<(), MemberError> {
        let list: Vec<Value> = assignments
            .iter()
            .map(|(vcpu, cpus, capacity)| {
                json!({ "vcpu": vcpu, "cpus": cpus.to_string(), "capacity": capacity })
            })
            .collect();
        let body = json!({ "assignments": list }).to_string();
        call(&self.socket, "PUT", "/v1/placement/external", Some(&body)).map(|_| ())
    }

    /// Hands placement back to the pvmm's own policy.
    pub fn release(&self) -> Result<(), MemberError> {
        call(&self.socket, "DELETE", "/v1/placement/external", None).map(|_| ())
    }
}

/// Per-vCPU utilization tracking of a foreign VM.
#[derive(Debug)]
struct ForeignVcpu {
    tid: i32,
    tracker: UtilTracker,
    /// Demand and time at adoption: the counters' origin.
    origin: Option<(u64, u64)>,
}

/// A VM of another VMM, adopted from `/proc`.
#[derive(Debug)]
pub struct ForeignMember {
    /// What discovery found.
    pub found: ForeignVm,
    vcpus: BTreeMap<u32, ForeignVcpu>,
}

impl ForeignMember {
    /// Adopts `found`.
    pub fn adopt(found: ForeignVm) -> Self {
        let mut m = Self {
            found: ForeignVm {
                vcpu_tids: BTreeMap::new(),
                ..found.clone()
            },
            vcpus: BTreeMap::new(),
        };
        m.update(found);
        m
    }

    /// Takes a fresh discovery of the same process (vCPU threads may come and go).
    pub fn update(&mut self, found: ForeignVm) {
        self.vcpus
            .retain(|n, v| found.vcpu_tids.get(n) == Some(&v.tid));
        for (&n, &tid) in &found.vcpu_tids {
            self.vcpus.entry(n).or_insert_with(|| ForeignVcpu {
                tid,
                tracker: UtilTracker::new(UtilConfig::default()),
                origin: None,
            });
        }
        self.found = found;
    }

    /// Samples each vCPU thread's demand at `now_ns` and returns the vCPUs.
    pub fn read(&mut self, proc: &Path, now_ns: u64) -> Vec<MemberVcpu> {
        let mut out = Vec::with_capacity(self.vcpus.len());
        for (&vcpu, v) in &mut self.vcpus {
            if let Some(wanted) = thread_wanted_ns(proc, self.found.pid, v.tid) {
                let (w0, t0) = *v.origin.get_or_insert((wanted, now_ns));
                let busy = wanted.saturating_sub(w0);
                let elapsed = now_ns.saturating_sub(t0);
                v.tracker.update(IdleSample {
                    t_ns: now_ns,
                    busy_ns: busy.min(elapsed),
                    idle_ns: elapsed.saturating_sub(busy),
                });
            }
            out.push(MemberVcpu {
                vcpu,
                tid: v.tid,
                util: v.tracker.util(),
                busy: v.tracker.is_busy(),
            });
        }
        out
    }

    /// Its threads that are not vCPUs (the VMM's main loop, I/O and worker threads).
    pub fn housekeeping(&self, proc: &Path) -> Vec<i32> {
        thread_ids(proc, self.found.pid)
            .into_iter()
            .filter(|tid| !self.found.vcpu_tids.values().any(|t| t == tid))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::discover::fake::FakeHost;
    use super::*;

    #[test]
    fn a_foreign_vm_follows_its_threads_and_reads_their_demand() {
        let host = FakeHost::new("members");
        host.process(
            50,
            &[(50, "qemu"), (51, "CPU 0/KVM"), (52, "CPU 1/KVM")],
            &[
                (3, "anon_inode:kvm-vm"),
                (4, "anon_inode:kvm-vcpu:0"),
                (5, "anon_inode:kvm-vcpu:1"),
            ],
        );
        let schedstat = |tid: i32, ns: u64| {
            let d = host.roots.proc.join("50/task").join(tid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("schedstat"), format!("{ns} 0 1\n")).unwrap();
        };
        let found = super::super::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone());
        assert_eq!(m.housekeeping(&host.roots.proc), vec![50]);
        // vCPU 0 runs all the time, vCPU 1 never.
        let tick = 100_000_000u64;
        for i in 0..20u64 {
            schedstat(51, i * tick);
            schedstat(52, 0);
            m.read(&host.roots.proc, i * tick);
        }
        schedstat(51, 20 * tick);
        let v = m.read(&host.roots.proc, 20 * tick);
        assert!(v[0].util > 900 && v[0].busy, "{v:?}");
        assert!(v[1].util < 50 && !v[1].busy, "{v:?}");
        // vCPU 1's thread went away: it is dropped.
        let mut again = m.found.clone();
        again.vcpu_tids.remove(&1);
        m.update(again);
        assert_eq!(m.read(&host.roots.proc, 21 * tick).len(), 1);
    }
}
