//! Where a vCPU's busy/idle time comes from: KVM's halt counters (preferred: the guest's own
//! idleness), or, when the stats fd is unavailable, the vCPU thread's run time from /proc.

use pvmm_scheduler::IdleSample;

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

/// A cumulative busy/idle signal for one vCPU.
pub trait IdleSource: Send {
    /// Reads the counters at `now_ns` (monotonic) given the vCPU started at `start_ns`.
    fn sample(&mut self, now_ns: u64, start_ns: u64) -> Result<IdleSample, IdleError>;
    /// A short name for logs and stats.
    fn kind(&self) -> &'static str;
}

/// The guest's halted time from KVM: idle = halted, busy = the rest of wall time. This counts
/// time the guest wanted to run even while the host did not run it, which is the demand the
/// placement must serve.
pub struct KvmHaltIdle(pub VcpuHaltStats);

impl IdleSource for KvmHaltIdle {
    fn sample(&mut self, now_ns: u64, start_ns: u64) -> Result<IdleSample, IdleError> {
        let elapsed = now_ns.saturating_sub(start_ns);
        let idle = self.0.halted_ns()?.min(elapsed);
        Ok(IdleSample {
            t_ns: now_ns,
            busy_ns: elapsed - idle,
            idle_ns: idle,
        })
    }
    fn kind(&self) -> &'static str {
        "kvm-halt-stats"
    }
}

/// The vCPU thread's CPU time from `/proc/self/task/<tid>/schedstat` (first field, ns on
/// CPU). It cannot tell a guest that wants to run but waits for a host CPU from an idle one,
/// so it is only the fallback.
pub struct ThreadRunTime {
    path: String,
}

impl ThreadRunTime {
    /// For thread `tid` of this process.
    pub fn new(tid: i32) -> Self {
        Self {
            path: format!("/proc/self/task/{tid}/schedstat"),
        }
    }
}

/// Parses the first field of a schedstat line (time on CPU, ns).
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

impl IdleSource for ThreadRunTime {
    fn sample(&mut self, now_ns: u64, start_ns: u64) -> Result<IdleSample, IdleError> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| IdleError::Proc {
            path: self.path.clone(),
            why: e.to_string(),
        })?;
        let ran = parse_schedstat(&text).ok_or_else(|| IdleError::Proc {
            path: self.path.clone(),
            why: "unexpected format".into(),
        })?;
        let elapsed = now_ns.saturating_sub(start_ns);
        let busy = ran.min(elapsed);
        Ok(IdleSample {
            t_ns: now_ns,
            busy_ns: busy,
            idle_ns: elapsed - busy,
        })
    }
    fn kind(&self) -> &'static str {
        "thread-run-time"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_parsing() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123456));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn own_thread_run_time_is_readable() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let mut src = ThreadRunTime::new(tid);
        let s = src.sample(10_000_000_000, 0).unwrap();
        assert_eq!(s.busy_ns + s.idle_ns, 10_000_000_000);
    }
}
