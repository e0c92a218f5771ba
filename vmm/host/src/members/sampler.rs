//! Sampling a VM's vCPU threads from `/proc`, whoever places them.
//!
//! Each vCPU thread's `schedstat` gives the time it wanted a CPU (running or waiting for
//! one); the rest of the elapsed time it was blocked, which for a vCPU is the guest halting.
//! That demand feeds a [`LoadTracker`] per vCPU, as pvmm's own idle signal feeds its own.
//!
//! Reading every thread every tick costs a system call per vCPU, most of them idle: a vCPU is
//! watched (read every tick) while it is busy, and otherwise read when its process's CPU time
//! shows running that the watched vCPUs do not explain, or in its turn
//! (`IDLE_REREAD_TICKS`).
//!
//! The sampler knows nothing of the VMM: it is given the process and its vCPU threads
//! ([`ThreadSampler::follow`]), so any member that knows them can be sampled here.

use std::collections::BTreeMap;
use std::path::Path;

use pvmm_scheduler::{IdleAccumulator, LoadTracker, UtilConfig};
use pvmm_tick::procfs::{parse_schedstat, ProcFile};

use super::MemberVcpu;
use crate::discover::{parse_process_ran_ns, process_stat_path, schedstat_path};

/// A vCPU whose decayed utilization is at least this (of 1024) is read every tick: it may be
/// running or just stopped, and its utilization must follow it. Below it the vCPU is idle and
/// read only when its process's CPU time says that something other than the watched vCPUs
/// ran, or every [`IDLE_REREAD_TICKS`]. 32 is 3 % of a CPU: a value the engine treats as idle.
pub(super) const WATCH_UTIL: u32 = 32;
/// An idle vCPU is read at least every this many ticks (1 s at the default tick), so that its
/// utilization keeps decaying and a wake-up too small to show in the process's CPU time is
/// still seen. The reads are staggered over vCPU indices, to spread their cost over ticks.
const IDLE_REREAD_TICKS: u64 = 10;
/// The idle vCPUs of a process are all read at once when it ran, since the last read, at
/// least this share of the elapsed time beyond what its watched vCPUs ran: a quarter of a
/// CPU is more than its housekeeping threads take, and a vCPU that wakes to run takes more.
/// `/proc/<pid>/stat` counts in clock ticks (10 ms), so one stray tick never triggers it at
/// the default 100 ms tick.
const WAKE_SHARE_DIVISOR: u64 = 4;

/// One vCPU thread's utilization tracking.
#[derive(Debug)]
struct SampledVcpu {
    tid: i32,
    /// Its thread's `schedstat`, kept open.
    schedstat: ProcFile,
    /// Its blocked time as the monotonic busy/idle counters the tracker takes.
    counters: IdleAccumulator,
    tracker: LoadTracker,
    /// The counters when first read.
    origin: Option<Origin>,
    /// Its last reading.
    last: Option<LastRead>,
}

/// A vCPU thread's counters when first read: its readings count from them.
#[derive(Debug, Clone, Copy)]
struct Origin {
    /// Time wanted on a CPU (running or waiting).
    wanted: u64,
    /// Time waiting for one.
    waited: u64,
    /// When.
    t_ns: u64,
}

/// What a vCPU's last reading found.
#[derive(Debug, Clone, Copy)]
struct LastRead {
    /// The member's read count then.
    read: u64,
    /// When.
    t_ns: u64,
    /// Time wanted since the origin.
    wanted_ns: u64,
    /// The part of it spent waiting for a CPU.
    waited_ns: u64,
    /// Run time (schedstat's first field).
    ran_ns: u64,
}

impl SampledVcpu {
    /// Reads the thread at `now_ns` (the member's read number `read`); its run time since the
    /// previous read when that was the member's read `read - 1`.
    ///
    /// What the tracker is fed is the thread's blocked time (elapsed time it did not want a
    /// CPU) through an [`IdleAccumulator`], as pvmm feeds its own: a thread running on another
    /// CPU has its `schedstat` brought up to date only at that CPU's scheduler events, so a
    /// reading can lag and the next catch up. Taken as cumulative totals, the lag would read
    /// as idle time that the catch-up then takes back, which the tracker can only treat as
    /// counters that restarted, losing the interval's busy time, and a busy vCPU on a loaded
    /// host would read well under what it runs. The accumulator counts each interval's idle
    /// time at most once and lets no counter go back.
    ///
    /// After reads it was skipped in, the vCPU was idle as far as its process's CPU time could
    /// tell, so the demand it shows now is placed at the end of the interval: idle first, then
    /// busy. Spread over the whole interval, a vCPU that just woke would read as a fraction of
    /// what it now runs.
    fn read(&mut self, now_ns: u64, read: u64) -> Option<u64> {
        let (wanted, ran_ns) = parse_schedstat(self.schedstat.read()?)?;
        let waiting = wanted.saturating_sub(ran_ns);
        let origin = *self.origin.get_or_insert(Origin {
            wanted,
            waited: waiting,
            t_ns: now_ns,
        });
        let elapsed = now_ns.saturating_sub(origin.t_ns);
        let wanted_ns = wanted.saturating_sub(origin.wanted);
        let blocked = elapsed.saturating_sub(wanted_ns);
        let waited_ns = waiting.saturating_sub(origin.waited);
        if let Some(last) = self.last.filter(|l| l.read + 1 < read && l.t_ns < now_ns) {
            let recent = wanted_ns
                .saturating_sub(last.wanted_ns)
                .min(now_ns - last.t_ns);
            let idle_until = self.counters.update(now_ns - recent, blocked);
            self.tracker.update(idle_until, last.waited_ns);
        }
        let sample = self.counters.update(now_ns, blocked);
        self.tracker.update(sample, waited_ns);
        let previous = self.last.replace(LastRead {
            read,
            t_ns: now_ns,
            wanted_ns,
            waited_ns,
            ran_ns,
        });
        previous
            .filter(|l| l.read + 1 == read)
            .map(|l| ran_ns.saturating_sub(l.ran_ns))
    }

    fn watched(&self) -> bool {
        self.origin.is_none()
            || self.tracker.util().util() >= WATCH_UTIL
            || self.tracker.util().is_busy()
    }
}

/// The vCPU threads of one process, sampled from `/proc`.
#[derive(Debug)]
pub struct ThreadSampler {
    /// The process.
    pid: i32,
    /// By vCPU index.
    vcpus: BTreeMap<u32, SampledVcpu>,
    /// Reads so far.
    reads: u64,
    /// The process's CPU time at the last read, and when.
    process_ran: Option<(u64, u64)>,
    /// Its `stat`, kept open.
    stat: ProcFile,
}

impl ThreadSampler {
    /// A sampler of process `pid`'s threads under `proc`, following none yet.
    pub fn new(proc: &Path, pid: i32) -> Self {
        Self {
            pid,
            vcpus: BTreeMap::new(),
            reads: 0,
            process_ran: None,
            stat: ProcFile::new(process_stat_path(proc, pid)),
        }
    }

    /// Follows the vCPU threads `vcpu_tids` (vCPU index -> thread id) from now: a vCPU whose
    /// thread changed starts afresh, one gone is forgotten.
    pub fn follow(&mut self, vcpu_tids: &BTreeMap<u32, i32>, proc: &Path) {
        self.vcpus.retain(|n, v| vcpu_tids.get(n) == Some(&v.tid));
        for (&n, &tid) in vcpu_tids {
            self.vcpus.entry(n).or_insert_with(|| SampledVcpu {
                tid,
                schedstat: ProcFile::new(schedstat_path(proc, self.pid, tid)),
                counters: IdleAccumulator::default(),
                tracker: LoadTracker::new(UtilConfig::default()),
                origin: None,
                last: None,
            });
        }
    }

    /// Samples the vCPU threads' demand at `now_ns` and returns the vCPUs. Watched vCPUs are
    /// read every time; idle ones when the process's CPU time shows unexplained running, or
    /// in their turn every `IDLE_REREAD_TICKS`.
    pub fn sample(&mut self, now_ns: u64) -> Vec<MemberVcpu> {
        self.reads += 1;
        let read = self.reads;
        let mut explained = 0u64;
        let mut deferred = Vec::new();
        for (&vcpu, v) in &mut self.vcpus {
            if v.watched() || (read + u64::from(vcpu)).is_multiple_of(IDLE_REREAD_TICKS) {
                explained += v.read(now_ns, read).unwrap_or(0);
            } else {
                deferred.push(vcpu);
            }
        }
        // With every vCPU read already, the process's CPU time has nothing to decide (and the
        // next tick that defers one reads everything once, for want of a baseline).
        let process = if deferred.is_empty() {
            None
        } else {
            self.stat
                .read()
                .and_then(parse_process_ran_ns)
                .map(|ran| (ran, now_ns))
        };
        let woke = match (self.process_ran, process) {
            (Some((ran0, t0)), Some((ran1, t1))) => {
                let unexplained = ran1.saturating_sub(ran0).saturating_sub(explained);
                unexplained >= t1.saturating_sub(t0) / WAKE_SHARE_DIVISOR
            }
            // No reading to compare with: read everything.
            _ => true,
        };
        self.process_ran = process;
        if woke {
            for vcpu in deferred {
                if let Some(v) = self.vcpus.get_mut(&vcpu) {
                    v.read(now_ns, read);
                }
            }
        }
        self.vcpus
            .iter()
            .map(|(&vcpu, v)| MemberVcpu {
                vcpu,
                tid: v.tid,
                util: v.tracker.util().util(),
                busy: v.tracker.util().is_busy(),
                waited: v.tracker.waited(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy thread whose `schedstat` lags one reading and catches up at the next (what a
    /// remote CPU's late accounting looks like on a loaded host) still reads as busy.
    #[test]
    fn a_busy_vcpu_whose_accounting_lags_reads_busy() {
        let proc = std::env::temp_dir().join(format!("pvmm-sampler-{}", std::process::id()));
        let (pid, tid) = (7, 8);
        let task = proc.join("7/task/8");
        std::fs::create_dir_all(&task).unwrap();
        let schedstat = task.join("schedstat");
        std::fs::write(&schedstat, "0 0 0\n").unwrap();
        let mut sampler = ThreadSampler::new(&proc, pid);
        sampler.follow(&BTreeMap::from([(0, tid)]), &proc);
        let tick = 100_000_000u64;
        let mut ran = 0u64;
        let mut util = 0;
        for k in 0..40u64 {
            // Wall time advances a tick each reading; the run time shows 60 % of it, then the
            // other 140 %: busy throughout.
            ran += if k % 2 == 1 {
                tick * 6 / 10
            } else {
                tick * 14 / 10
            };
            if k == 0 {
                ran = 0;
            }
            std::fs::write(&schedstat, format!("{ran} 0 1\n")).unwrap();
            let vcpus = sampler.sample(k * tick);
            util = vcpus[0].util;
        }
        std::fs::remove_dir_all(&proc).unwrap();
        assert!(util >= 900, "a busy vCPU read as {util} of 1024");
    }
}
