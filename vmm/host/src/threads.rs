//! What the daemon keeps for each thread it looks at or places, in one record by thread id.
//!
//! A foreign VM's threads are the daemon's to place: it sets their affinity, so it remembers
//! what each had before (restored when it hands placement back), what it last set (a thread
//! already there costs nothing, and an affinity that differs is an operator's doing:
//! [`crate::operator`]), and whether the host refused it (reported once, never tried again).
//! Every vCPU thread, a pvmm VM's too, is bounded by its cgroup's cpuset, read again every tick.
//!
//! A record lives while it holds anything: one that is all defaults is dropped, so that the
//! threads of a pvmm VM, which the daemon never touches, leave nothing behind.

use std::collections::HashMap;

use pvmm_scheduler::{CpuSet, Executor, VcpuId};

use crate::operator::{EngineLimits, OperatorPin};

/// One thread's bookkeeping.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ThreadRecord {
    /// Its affinity before the daemon first set it, restored at release.
    pub original: Option<CpuSet>,
    /// What the daemon last applied to it.
    pub applied: Option<CpuSet>,
    /// The host refused the daemon's affinity for it.
    pub refused: bool,
    /// Its cgroup cpuset within the daemon's CPUs, where narrower, as read at this tick.
    pub bound: Option<CpuSet>,
    /// An operator's pin on it (foreign vCPU threads).
    pub pin: OperatorPin,
}

/// Every thread's record, and the limits the engine has been told from them.
#[derive(Debug, Default)]
pub struct Threads {
    records: HashMap<i32, ThreadRecord>,
    limits: EngineLimits,
}

impl Threads {
    /// Thread `tid`'s record, if it has one.
    pub fn get(&self, tid: i32) -> Option<&ThreadRecord> {
        self.records.get(&tid)
    }

    /// What the daemon last applied to thread `tid`.
    pub fn applied(&self, tid: i32) -> Option<&CpuSet> {
        self.get(tid).and_then(|r| r.applied.as_ref())
    }

    /// Whether an operator has pinned thread `tid`.
    pub fn is_pinned(&self, tid: i32) -> bool {
        self.get(tid).is_some_and(|r| r.pin.is_pinned())
    }

    /// Whether `cpus` leaves thread `tid`'s cpuset.
    pub fn outside_bound(&self, tid: i32, cpus: &CpuSet) -> bool {
        self.get(tid)
            .and_then(|r| r.bound.as_ref())
            .is_some_and(|b| !cpus.is_subset(b))
    }

    /// Starts this tick's look at the threads: every bound is read again.
    pub fn clear_bounds(&mut self) {
        self.records.retain(|_, r| {
            r.bound = None;
            *r != ThreadRecord::default()
        });
    }

    /// Thread `tid`'s cpuset within the daemon's CPUs, where narrower.
    pub fn set_bound(&mut self, tid: i32, bound: CpuSet) {
        self.records.entry(tid).or_default().bound = Some(bound);
    }

    /// Looks at foreign vCPU thread `tid`'s `affinity` within `bound` for an operator's pin
    /// ([`OperatorPin::observe`]).
    pub fn observe_pin(&mut self, tid: i32, affinity: Option<&CpuSet>, bound: &CpuSet) {
        let record = self.records.entry(tid).or_default();
        record.pin.observe(affinity, bound, &mut record.applied);
    }

    /// Forgets the pins of threads that are no longer foreign vCPU threads.
    pub fn retain_pins(&mut self, live: impl Fn(i32) -> bool) {
        for (tid, record) in &mut self.records {
            if !live(*tid) {
                record.pin = OperatorPin::default();
            }
        }
    }

    /// The CPUs the engine must keep vCPU thread `tid` to, within `all` (the daemon's CPUs):
    /// its pin, or its cpuset.
    pub fn limit(&self, tid: i32, all: &CpuSet) -> Option<CpuSet> {
        let r = self.get(tid)?;
        r.pin.limit(r.bound.as_ref().unwrap_or(all), all)
    }

    /// Tells the engine the limits `wanted` now ([`EngineLimits::tell`]).
    pub fn tell_limits(
        &mut self,
        fresh: bool,
        wanted: HashMap<VcpuId, CpuSet>,
        limit: &mut dyn FnMut(VcpuId, Option<CpuSet>),
    ) {
        self.limits.tell(fresh, wanted, limit);
    }

    /// Restricts thread `tid` to `cpus` through `executor` if it is not there, remembering its
    /// original affinity (`inherited` when the thread was created while its VM was placed,
    /// else what it has now). Returns false when the host refused, which is reported once:
    /// the thread is not tried again.
    pub fn place(
        &mut self,
        tid: i32,
        cpus: &CpuSet,
        inherited: Option<CpuSet>,
        executor: &mut dyn Executor,
    ) -> bool {
        let record = self.records.entry(tid).or_default();
        if record.applied.as_ref() == Some(cpus) || record.refused {
            return true;
        }
        if record.original.is_none() {
            record.original = inherited.or_else(|| executor.read(tid).ok());
        }
        match executor.apply(tid, cpus) {
            Ok(()) => {
                record.applied = Some(cpus.clone());
                true
            }
            Err(e) => {
                eprintln!("pvmm-host: cannot place thread {tid}: {e} (not tried again)");
                record.refused = true;
                false
            }
        }
    }

    /// Gives every thread the daemon placed its original affinity back.
    pub fn restore(&mut self, executor: &mut dyn Executor) {
        for (tid, record) in &mut self.records {
            if let Some(cpus) = record.original.take() {
                // A thread that has ended needs nothing.
                let _ = executor.apply(*tid, &cpus);
            }
        }
    }
}
