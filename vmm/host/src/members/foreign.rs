//! A VM of another VMM (QEMU, Firecracker, Cloud Hypervisor...), adopted from `/proc`.
//!
//! Discovery ([`crate::discover`]) finds it by its KVM file descriptors and maps its vCPUs to
//! threads; the member follows that mapping as discovery refreshes it, samples the vCPU
//! threads ([`ThreadSampler`]), and leaves their placement to the daemon ([`Placer::Daemon`]),
//! which sets each thread's affinity and puts the VMM's other threads (housekeeping) on the
//! active packages.

use std::collections::BTreeMap;
use std::path::Path;

use pvmm_api::stats::VmKind;

use super::{Member, MemberError, MemberVcpu, Placer, ThreadSampler};
use crate::discover::{thread_ids, ForeignVm};

/// A VM of another VMM, adopted from `/proc`.
#[derive(Debug)]
pub struct ForeignMember {
    /// What discovery found.
    pub found: ForeignVm,
    /// Its vCPU threads' sampling.
    sampler: ThreadSampler,
    /// Every thread of the process at the last discovery, sorted.
    threads: Vec<i32>,
}

impl ForeignMember {
    /// Adopts `found`, whose threads are read from `proc`.
    pub fn adopt(found: ForeignVm, proc: &Path) -> Self {
        let mut m = Self {
            found: ForeignVm {
                vcpu_tids: BTreeMap::new(),
                ..found.clone()
            },
            sampler: ThreadSampler::new(proc, found.pid),
            threads: Vec::new(),
        };
        m.update(found, proc);
        m
    }

    /// Takes a fresh discovery of the same process (vCPU threads may come and go).
    pub fn update(&mut self, found: ForeignVm, proc: &Path) {
        self.sampler.follow(&found.vcpu_tids, proc);
        self.threads = sorted_thread_ids(proc, found.pid);
        self.found = found;
    }

    /// Whether the process's threads are still those of the last discovery: then its vCPU
    /// mapping holds, and discovery need not examine its file descriptors again.
    pub fn unchanged(&self, proc: &Path) -> bool {
        sorted_thread_ids(proc, self.found.pid) == self.threads
    }

    /// Samples its vCPU threads' demand at `now_ns` ([`ThreadSampler::sample`]).
    pub fn sample(&mut self, now_ns: u64) -> Vec<MemberVcpu> {
        self.sampler.sample(now_ns)
    }
}

impl Member for ForeignMember {
    fn kind(&self) -> VmKind {
        VmKind::Foreign
    }

    fn name(&self) -> &str {
        &self.found.name
    }

    fn describe(&self, pid: i32) -> String {
        let f = &self.found;
        let unmapped = if f.unmapped.is_empty() {
            String::new()
        } else {
            format!(", vCPUs {:?} without a known thread", f.unmapped)
        };
        let vcpus = f.vcpu_tids.len();
        format!(
            "{} VM {} pid {pid} ({vcpus} vCPUs{unmapped})",
            f.comm, f.name
        )
    }

    fn as_foreign_mut(&mut self) -> Option<&mut ForeignMember> {
        Some(self)
    }

    fn read(&mut self, now_ns: u64) -> Result<Vec<MemberVcpu>, MemberError> {
        Ok(self.sample(now_ns))
    }

    fn placer(&self) -> Placer {
        Placer::Daemon
    }

    /// Its threads that are not vCPUs (the VMM's main loop, I/O and worker threads), as of
    /// the last discovery.
    fn housekeeping(&self) -> Vec<i32> {
        self.threads
            .iter()
            .copied()
            .filter(|tid| !self.found.vcpu_tids.values().any(|t| t == tid))
            .collect()
    }
}

fn sorted_thread_ids(proc: &Path, pid: i32) -> Vec<i32> {
    let mut tids = thread_ids(proc, pid);
    tids.sort_unstable();
    tids
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::super::sampler::WATCH_UTIL;
    use super::*;
    use crate::discover::fake::FakeHost;

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
        let found = crate::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone(), &host.roots.proc);
        assert_eq!(m.housekeeping(), vec![50]);
        // vCPU 0 runs all the time, vCPU 1 never.
        let tick = 100_000_000u64;
        for i in 0..20u64 {
            schedstat(51, i * tick);
            schedstat(52, 0);
            m.sample(i * tick);
        }
        schedstat(51, 20 * tick);
        let v = m.sample(20 * tick);
        assert!(v[0].util > 900 && v[0].busy, "{v:?}");
        assert!(v[1].util < 50 && !v[1].busy, "{v:?}");
        // vCPU 1's thread went away: it is dropped.
        let mut again = m.found.clone();
        again.vcpu_tids.remove(&1);
        m.update(again, &host.roots.proc);
        assert_eq!(m.sample(21 * tick).len(), 1);
    }

    #[test]
    fn a_foreign_vcpu_waiting_for_a_cpu_reports_the_wait_apart() {
        let host = FakeHost::new("members-wait");
        host.process(
            70,
            &[(70, "qemu"), (71, "CPU 0/KVM")],
            &[(3, "anon_inode:kvm-vm"), (4, "anon_inode:kvm-vcpu:0")],
        );
        let found = crate::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone(), &host.roots.proc);
        let stat = host.roots.proc.join("70/task/71/schedstat");
        // Each 100 ms tick it ran 30 ms and waited 30 ms for a CPU.
        let tick = 100_000_000u64;
        let mut v = Vec::new();
        for i in 0..20u64 {
            std::fs::write(
                &stat,
                format!("{} {} 1\n", i * 3 * tick / 10, i * 3 * tick / 10),
            )
            .unwrap();
            v = m.sample(i * tick);
        }
        assert!((v[0].util as i64 - 614).abs() < 10, "{v:?}");
        assert!((v[0].waited as i64 - 307).abs() < 10, "{v:?}");
    }

    #[test]
    fn idle_vcpus_are_read_when_their_process_ran_or_in_their_turn() {
        let host = FakeHost::new("members-idle");
        host.process(
            60,
            &[(60, "qemu"), (61, "CPU 0/KVM"), (62, "CPU 1/KVM")],
            &[
                (3, "anon_inode:kvm-vm"),
                (4, "anon_inode:kvm-vcpu:0"),
                (5, "anon_inode:kvm-vcpu:1"),
            ],
        );
        let proc = host.roots.proc.clone();
        let schedstat = |tid: i32, ns: u64| {
            let d = proc.join("60/task").join(tid.to_string());
            std::fs::write(d.join("schedstat"), format!("{ns} 0 1\n")).unwrap();
        };
        // `comm` with a space and parentheses: fields count from the last ')'.
        let stat = |ns: u64| {
            let ticks = ns * crate::discover::test_clock_ticks_per_s() / 1_000_000_000;
            let line = format!("60 (qemu (x) y) S 1 60 60 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 4\n");
            std::fs::write(proc.join("60/stat"), line).unwrap();
        };
        let tick = 100_000_000u64;
        schedstat(61, 0);
        schedstat(62, 0);
        stat(0);
        let found = crate::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone(), &proc);
        for i in 0..5 {
            m.sample(i * tick);
        }
        // vCPU 1 runs, but the process's CPU time does not show it yet, and it is not vCPU 1's
        // turn: it is not read, and still idle.
        schedstat(62, tick);
        let v = m.sample(5 * tick);
        assert!(v[1].util < WATCH_UTIL, "{v:?}");
        // The process ran a whole tick that vCPU 0 (watched or not) does not explain: every
        // vCPU is read, and vCPU 1's two ticks of running show.
        schedstat(62, 2 * tick);
        stat(2 * tick);
        let v = m.sample(6 * tick);
        assert!(v[1].util > 900 && v[1].busy, "{v:?}");
        assert!(v[0].util < WATCH_UTIL && !v[0].busy, "{v:?}");
        // It stops: watched, it is read every tick and its utilization falls at once.
        let busy = v[1].util;
        let v = m.sample(7 * tick);
        assert!(v[1].util < busy / 2 && !v[1].busy, "{v:?}");
        // vCPU 0 runs a little, too little for the process's CPU time to tell: read in its
        // turn only, at the member's read 10 (reads count from 1; vCPU 0's turn is every 10th).
        schedstat(61, tick / 50);
        assert_eq!(m.sample(8 * tick)[0].util, 0, "read 9");
        schedstat(61, 2 * tick / 50);
        assert!(m.sample(9 * tick)[0].util > 0, "read 10");
    }
}
