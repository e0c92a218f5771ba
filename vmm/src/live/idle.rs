//! Where a vCPU's busy/idle time comes from: KVM's halt counters (preferred: the guest's own
//! idleness), or, when the stats fd is unavailable, the vCPU thread's run time from /proc.

use pvmm_scheduler::{IdleAccumulator, IdleSample};

use pvmm_tick::procfs::{parse_schedstat, schedstat_path, ProcFile};

use crate::vstate::stats::VcpuHaltStats;

/// Errors reading an idle signal.
#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    /// KVM stats could not be read.
    #[error(transparent)]
    Stats(#[from] crate::vstate::stats::StatsError),
    /// The thread's schedstat could not be read or parsed.
    #[error("reading {path}: unreadable or in an unexpected format")]
    Proc {
        /// The file.
        path: String,
    },
}

/// A cumulative busy/idle signal for one vCPU.
pub trait IdleSource: Send {
    /// Reads the counters at `now_ns` on the caller's monotonic clock, which starts at 0 when
    /// the vCPU's placement starts.
    fn sample(&mut self, now_ns: u64) -> Result<IdleSample, IdleError>;

    /// The cumulative time the vCPU was runnable but waiting for a host CPU, as of the last
    /// [`sample`](Self::sample), counted from the same origin (part of its busy time); 0 where
    /// the source cannot tell.
    fn waited_ns(&self) -> u64 {
        0
    }
}

/// The guest's idle time: when the vCPU thread sleeps in a halt, from the thread's scheduler
/// accounting, plus the time KVM polled for a wake-up (on a CPU, but the guest idle), from
/// KVM's halt counters.
///
/// Why not KVM's `halt_wait_ns` alone: KVM adds a halt's time when the halt *ends*, so a vCPU
/// halted for seconds (a tickless idle guest) shows none of it until it wakes, and pvmm, which
/// gives each tick at most its own length of idle time, would see that vCPU busy for the whole
/// halt. Nor the larger of the two cumulative totals: `halt_wait_ns` also counts the wait for a
/// host CPU after each wake-up and halts from before pvmm's scheduler started, so it runs ahead
/// of the thread's blocked time; the larger total would then always be KVM's, with its late
/// credits, and an idle vCPU would read as busy for as long as its halt lasts. The thread's
/// blocked time is the time the guest was halted, counted as it passes; KVM's counters add the
/// polling it cannot see. When the thread's `/proc` entry is unreadable at the start, KVM's
/// counters are the whole signal (late, but never wrong in total).
///
/// Busy is the rest of wall time: the guest's demand, including time it waited for a host CPU.
pub struct KvmHaltIdle {
    halt: VcpuHaltStats,
    blocked: ThreadBlocked,
    /// Whether the thread's blocked time is readable (decided once: mixing the two cumulative
    /// series tick by tick would turn their offset into idle or busy time).
    use_sched: bool,
    acc: IdleAccumulator,
}

impl KvmHaltIdle {
    /// For the vCPU whose stats are `halt`, running on thread `tid`.
    pub fn new(halt: VcpuHaltStats, tid: i32) -> Self {
        let mut blocked = ThreadBlocked::new(tid);
        Self {
            halt,
            use_sched: blocked.read(0).is_ok(),
            blocked,
            acc: IdleAccumulator::default(),
        }
    }
}

impl IdleSource for KvmHaltIdle {
    fn sample(&mut self, now_ns: u64) -> Result<IdleSample, IdleError> {
        let idle = if self.use_sched {
            let blocked = self.blocked.read(now_ns)?;
            blocked.saturating_add(self.halt.polled_ns()?)
        } else {
            self.halt.halted_ns()?
        };
        Ok(self.acc.update(now_ns, idle))
    }

    fn waited_ns(&self) -> u64 {
        self.blocked.waited_ns
    }
}

/// The vCPU thread's demand from `/proc/self/task/<tid>/schedstat`: time on a CPU plus time
/// runnable but waiting for one (fields 1 and 2, ns). It cannot see halt polling (the thread
/// spins on a CPU while the guest is idle), so it is only the fallback.
pub struct ThreadRunTime {
    blocked: ThreadBlocked,
    acc: IdleAccumulator,
}

impl ThreadRunTime {
    /// For thread `tid` of this process.
    pub fn new(tid: i32) -> Self {
        Self {
            blocked: ThreadBlocked::new(tid),
            acc: IdleAccumulator::default(),
        }
    }
}

/// Time a thread of this process was blocked (neither running nor runnable) since its first
/// reading. Its demand is counted from that reading, not from the thread's creation: a thread
/// that waited for a CPU before the scheduler's clock started would otherwise have that wait
/// subtracted from its first interval's idle time. Its schedstat file is kept open (one
/// `pread` a tick instead of a path walk, an open, a read and a close: at 255 vCPUs the path
/// walks were half of a tick's cost).
#[derive(Debug)]
struct ThreadBlocked {
    schedstat: ProcFile,
    /// Time wanted (on a CPU or waiting for one) and time waiting, at the first reading.
    origin: Option<(u64, u64)>,
    /// Time waiting for a CPU since the first reading, as of the last.
    waited_ns: u64,
}

impl ThreadBlocked {
    /// For thread `tid` of this process.
    fn new(tid: i32) -> Self {
        Self {
            schedstat: ProcFile::new(schedstat_path(tid).into()),
            origin: None,
            waited_ns: 0,
        }
    }

    /// Blocked time of the thread out of the `elapsed_ns` since the first reading.
    fn read(&mut self, elapsed_ns: u64) -> Result<u64, IdleError> {
        let (wanted, ran) = self
            .schedstat
            .read()
            .and_then(parse_schedstat)
            .ok_or_else(|| IdleError::Proc {
                path: self.schedstat.path().display().to_string(),
            })?;
        let waited = wanted.saturating_sub(ran);
        let (wanted0, waited0) = *self.origin.get_or_insert((wanted, waited));
        self.waited_ns = waited.saturating_sub(waited0);
        Ok(elapsed_ns.saturating_sub(wanted.saturating_sub(wanted0)))
    }
}

impl IdleSource for ThreadRunTime {
    fn sample(&mut self, now_ns: u64) -> Result<IdleSample, IdleError> {
        let blocked = self.blocked.read(now_ns)?;
        Ok(self.acc.update(now_ns, blocked))
    }

    fn waited_ns(&self) -> u64 {
        self.blocked.waited_ns
    }
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_run_time_is_readable() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let mut src = ThreadRunTime::new(tid);
        src.sample(10_000_000_000).unwrap();
        let s = src.sample(20_000_000_000).unwrap();
        assert_eq!(s.busy_ns + s.idle_ns, 10_000_000_000);
    }

    /// A thread spinning beside another on one CPU runs about half the time and waits the
    /// other half: the wait is reported apart, and within its busy time.
    #[test]
    fn a_thread_sharing_its_cpu_reports_its_wait() {
        use pvmm_scheduler::{CpuSet, Executor, LinuxExecutor};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let mut executor = LinuxExecutor;
        let first_cpu = executor.read(me).unwrap().iter().next().unwrap();
        let one: CpuSet = first_cpu.to_string().parse().unwrap();
        executor.apply(me, &one).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let spinner = {
            let (stop, one) = (stop.clone(), one.clone());
            std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                LinuxExecutor.apply(tid, &one).unwrap();
                while !stop.load(Ordering::Relaxed) {}
            })
        };
        let mut src = ThreadRunTime::new(me);
        let start = std::time::Instant::now();
        src.sample(0).unwrap();
        while start.elapsed() < std::time::Duration::from_millis(300) {}
        let s = src.sample(start.elapsed().as_nanos() as u64).unwrap();
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        let waited = src.waited_ns();
        assert!(waited > 10_000_000, "waited {waited} ns of {s:?}");
        assert!(waited <= s.busy_ns, "waited {waited} ns of {s:?}");
    }

    /// A vCPU thread asleep in a halt reads as idle while it sleeps, even when KVM's halt
    /// counter is far ahead of the thread's blocked time and credits nothing until the halt
    /// ends (a tickless idle guest).
    #[test]
    fn a_long_halt_is_idle_while_it_lasts() {
        use crate::vstate::stats::fake::{file_with, image};
        use crate::vstate::stats::{HALT_POLL_SUCCESS_NS, HALT_WAIT_NS};
        use kvm_bindings::KVM_STATS_UNIT_SECONDS;
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        // 100 s of halts already credited, 1 ms of polling; nothing more while it sleeps.
        let secs = KVM_STATS_UNIT_SECONDS;
        let img = image(&[
            (HALT_WAIT_NS, secs, -9, 100_000_000_000),
            (HALT_POLL_SUCCESS_NS, secs, -9, 1_000_000),
        ]);
        let halt = VcpuHaltStats::from_file(file_with(&img)).unwrap();
        // The sleeper must be asleep before the first reading: on a loaded machine it may wait
        // for a CPU between sending its id and blocking, and wanting a CPU is busy time.
        let asleep = || {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
            stat.rsplit(')').next().unwrap().split_whitespace().next() == Some("S")
        };
        while !asleep() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut src = KvmHaltIdle::new(halt, tid);
        let start = std::time::Instant::now();
        let first = src.sample(0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = start.elapsed().as_nanos() as u64;
        let s = src.sample(now).unwrap();
        stop_tx.send(()).unwrap();
        sleeper.join().unwrap();
        let (busy, idle) = (s.busy_ns - first.busy_ns, s.idle_ns - first.idle_ns);
        assert_eq!(busy + idle, now);
        assert!(
            idle > busy,
            "a sleeping vCPU thread read as busy: {busy} ns busy, {idle} ns idle"
        );
    }
}
