//! What the loop counts: its totals, and where each tick's time went, phase by phase.
//!
//! One timer serves every member kind. pvmm's scheduler thread counts its own CPU time (what a
//! tick costs the host, whatever else the machine is doing); the host daemon counts wall time,
//! because most of its tick is waiting on pvmm VMs' sockets and reading `/proc`, which its CPU
//! clock would not show.

use std::time::Instant;

/// The clock a [`PhaseTimer`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseClock {
    /// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
    ThreadCpu,
    /// Elapsed wall time.
    Wall,
}

/// Time of one tick or of many, by phase, in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Finding the members (the daemon's discovery of VMs).
    pub discover_ns: u64,
    /// Reading each vCPU's idle signal and the host's online CPUs.
    pub read_ns: u64,
    /// Control requests and the engine's decision.
    pub decide_ns: u64,
    /// Affinity of vCPUs and housekeeping threads, and publishing capacities.
    pub apply_ns: u64,
    /// Reporting: `--stats`, the control socket's copy, the daemon's status.
    pub report_ns: u64,
}

impl PhaseTimes {
    /// All phases.
    pub fn total_ns(&self) -> u64 {
        self.discover_ns + self.read_ns + self.decide_ns + self.apply_ns + self.report_ns
    }

    /// Adds `other` phase by phase.
    pub fn add(&mut self, other: &PhaseTimes) {
        self.discover_ns += other.discover_ns;
        self.read_ns += other.read_ns;
        self.decide_ns += other.decide_ns;
        self.apply_ns += other.apply_ns;
        self.report_ns += other.report_ns;
    }
}

/// Reads its clock phase by phase.
#[derive(Debug)]
pub struct PhaseTimer {
    clock: PhaseClock,
    wall: Instant,
    last: u64,
}

impl PhaseTimer {
    /// A timer on `clock`, started now.
    pub fn start(clock: PhaseClock) -> Self {
        let mut t = Self {
            clock,
            wall: Instant::now(),
            last: 0,
        };
        t.last = t.now_ns();
        t
    }

    fn now_ns(&self) -> u64 {
        match self.clock {
            PhaseClock::ThreadCpu => thread_cpu_ns(),
            // u64 nanoseconds last 584 years.
            #[allow(clippy::cast_possible_truncation)]
            PhaseClock::Wall => self.wall.elapsed().as_nanos() as u64,
        }
    }

    /// The time since the last lap (or the start).
    pub fn lap(&mut self) -> u64 {
        let now = self.now_ns();
        now.saturating_sub(std::mem::replace(&mut self.last, now))
    }
}

/// CPU time of the calling thread, in ns (0 if the clock cannot be read).
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The host's boot clock (`CLOCK_BOOTTIME`, the clock of `/proc/uptime`), in ns (0 if it
/// cannot be read): the one clock that a VM's stats and what other tools sample on the host
/// share.
pub fn boot_clock_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// `clock` read now, in ns (0 if it cannot be read).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only to it.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    // A clock that was read is never negative: both fields are at least 0.
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// The loop's running totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Ticks run.
    pub ticks: u64,
    /// Moves of vCPUs, as the members count them ([`crate::Applied::moved`]).
    pub migrations: u64,
    /// Affinity changes (or placements sent) that the host or a member refused.
    pub apply_errors: u64,
    /// Policy changes taken at run time.
    pub policy_changes: u64,
    /// The ticks' time, by phase.
    pub time: PhaseTimes,
    /// The last tick's time, by phase.
    pub last: PhaseTimes,
}

impl Totals {
    /// The `-v` exit line of a loop on [`PhaseClock::ThreadCpu`]: CPU time per tick, by phase.
    pub fn cost_line(&self) -> String {
        let t = &self.time;
        let per_tick = |ns: u64| ns as f64 / self.ticks.max(1) as f64 / 1000.0;
        format!(
            "scheduler tick: {:.1} us of CPU per tick over {} ticks (read {:.1}, decide {:.1}, \
             apply {:.1}, report {:.1} us)",
            per_tick(t.total_ns()),
            self.ticks,
            per_tick(t.read_ns),
            per_tick(t.decide_ns),
            per_tick(t.apply_ns),
            per_tick(t.report_ns),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_and_never_go_back() {
        for clock in [PhaseClock::ThreadCpu, PhaseClock::Wall] {
            let mut t = PhaseTimer::start(clock);
            let mut sum = 0u64;
            for _ in 0..3 {
                let mut x = 0u64;
                for i in 0..100_000u64 {
                    x = x.wrapping_add(std::hint::black_box(i));
                }
                std::hint::black_box(x);
                sum += t.lap();
            }
            assert!(sum > 0, "{clock:?} measured nothing");
        }
    }

    #[test]
    fn times_add_phase_by_phase() {
        let mut a = PhaseTimes {
            read_ns: 1,
            report_ns: 2,
            ..PhaseTimes::default()
        };
        a.add(&PhaseTimes {
            discover_ns: 3,
            read_ns: 4,
            ..PhaseTimes::default()
        });
        assert_eq!((a.discover_ns, a.read_ns, a.report_ns), (3, 5, 2));
        assert_eq!(a.total_ns(), 10);
    }
}
