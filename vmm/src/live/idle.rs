//! Where a vCPU's busy/idle time comes from: KVM's halt counters (preferred: the guest's own
//! idleness), or, when the stats fd is unavailable, the vCPU thread's run time from /proc.

use pvmm_scheduler::IdleSample;

use pvmm_devices::cppc::{DemandCounters, ProcSchedstat};

use super::kvm_stats::VcpuHaltStats;

/// Errors reading an idle signal.
#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    /// KVM stats could not be read.
    #[error(transparent)]
    Stats(#[from] super::kvm_stats::StatsError),
    /// /proc could not be read or parsed.
    #[error("reading {path}: {why}")]
    Proc {
        /// The file.
        path: String,
        /// What went wrong.
        why: String,
    },
}

/// Turns a cumulative idle estimate, which may jump (KVM credits a halt only when it ends),
/// into the monotonic busy/idle counters the utilization tracker expects: each interval gets
/// at most its own length of idle time, the rest is busy, and both counters only grow.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdleAccumulator {
    last: Option<(u64, u64)>,
    busy: u64,
    idle: u64,
}

impl IdleAccumulator {
    /// Folds in the idle estimate `idle_estimate_ns` read at `now_ns`.
    pub fn update(&mut self, now_ns: u64, idle_estimate_ns: u64) -> IdleSample {
        if let Some((t, est)) = self.last {
            let dt = now_ns.saturating_sub(t);
            let didle = idle_estimate_ns.saturating_sub(est).min(dt);
            self.idle += didle;
            self.busy += dt - didle;
        }
        self.last = Some(match self.last {
            // Time and the estimate only move forward.
            Some((t, est)) => (now_ns.max(t), idle_estimate_ns.max(est)),
            None => (now_ns, idle_estimate_ns),
        });
        IdleSample {
            t_ns: now_ns,
            busy_ns: self.busy,
            idle_ns: self.idle,
        }
    }
}

/// A cumulative busy/idle signal for one vCPU.
pub trait IdleSource: Send {
    /// Reads the counters at `now_ns` (monotonic) given the vCPU started at `start_ns`.
    fn sample(&mut self, now_ns: u64, start_ns: u64) -> Result<IdleSample, IdleError>;
    /// A short name for logs and stats.
    fn kind(&self) -> &'static str;
}

/// The guest's halted time from KVM, corrected by the thread's blocked time.
///
/// KVM adds to `halt_wait_ns` when a halt *ends*, so a vCPU that has been halted for seconds
/// (a tickless idle guest) still shows its old total. The thread's schedstat closes that gap:
/// time the thread was neither on a CPU nor waiting for one is time it was blocked, which for
/// a vCPU thread means halted. Both are lower bounds of the guest's idle time, so pvmm takes
/// the larger; halt polling (on CPU, but the guest is idle) is covered by KVM's counters.
/// Busy is the rest of wall time: the guest's demand, including time it waited for a host CPU.
pub struct KvmHaltIdle {
    halt: VcpuHaltStats,
    sched: ThreadRunTime,
    acc: IdleAccumulator,
}

impl KvmHaltIdle {
    /// For the vCPU whose stats are `halt`, running on thread `tid`.
    pub fn new(halt: VcpuHaltStats, tid: i32) -> Self {
        Self {
            halt,
            sched: ThreadRunTime::new(tid),
            acc: IdleAccumulator::default(),
        }
    }
}

impl IdleSource for KvmHaltIdle {
    fn sample(&mut self, now_ns: u64, start_ns: u64) -> Result<IdleSample, IdleError> {
        let elapsed = now_ns.saturating_sub(start_ns);
        let halted = self.halt.halted_ns()?;
        // Without /proc the halt counters alone still give a (delayed) signal.
        let blocked = self.sched.blocked_ns(elapsed).unwrap_or(0);
        Ok(self.acc.update(now_ns, halted.max(blocked)))
    }
    fn kind(&self) -> &'static str {
        "kvm-halt-stats"
    }
}

/// The vCPU thread's demand from `/proc/self/task/<tid>/schedstat`: time on a CPU plus time
/// runnable but waiting for one (fields 1 and 2, ns). It cannot see halt polling (the thread
/// spins on a CPU while the guest is idle), so it is only the fallback.
pub struct ThreadRunTime {
    tid: i32,
    acc: IdleAccumulator,
}

impl ThreadRunTime {
    /// For thread `tid` of this process.
    pub fn new(tid: i32) -> Self {
        Self {
            tid,
            acc: IdleAccumulator::default(),
        }
    }

    /// Time the thread was blocked (neither running nor runnable) out of `elapsed_ns`.
    fn blocked_ns(&self, elapsed_ns: u64) -> Result<u64, IdleError> {
        let (wanted, _ran) = ProcSchedstat
            .read(self.tid)
            .ok_or_else(|| IdleError::Proc {
                path: format!("/proc/self/task/{}/schedstat", self.tid),
                why: "unreadable or in an unexpected format".into(),
            })?;
        Ok(elapsed_ns.saturating_sub(wanted))
    }
}

impl IdleSource for ThreadRunTime {
    fn sample(&mut self, now_ns: u64, start_ns: u64) -> Result<IdleSample, IdleError> {
        let blocked = self.blocked_ns(now_ns.saturating_sub(start_ns))?;
        Ok(self.acc.update(now_ns, blocked))
    }
    fn kind(&self) -> &'static str {
        "thread-run-time"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_run_time_is_readable() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let mut src = ThreadRunTime::new(tid);
        src.sample(10_000_000_000, 0).unwrap();
        let s = src.sample(20_000_000_000, 0).unwrap();
        assert_eq!(s.busy_ns + s.idle_ns, 10_000_000_000);
    }

    #[test]
    fn accumulator_is_monotonic_and_caps_idle_per_interval() {
        let mut a = IdleAccumulator::default();
        assert_eq!(a.update(0, 0), IdleSample::default());
        // 100 ms, 30 ms idle.
        let s = a.update(100, 30);
        assert_eq!((s.busy_ns, s.idle_ns), (70, 30));
        // A late halt credit of 500 ms in a 100 ms interval counts as 100 ms idle.
        let s = a.update(200, 530);
        assert_eq!((s.busy_ns, s.idle_ns), (70, 130));
        // An estimate that goes backwards adds no idle, and nothing goes backwards.
        let s = a.update(300, 400);
        assert_eq!((s.busy_ns, s.idle_ns), (170, 130));
        let s = a.update(400, 570);
        assert_eq!((s.busy_ns, s.idle_ns), (230, 170));
    }
}
