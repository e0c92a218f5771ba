//! Per-vCPU utilization from idle signals, PELT-style.
//!
//! The VMM samples, per vCPU, cumulative counters of time spent running guest
//! code (`busy_ns`) and halted (`idle_ns`) with a timestamp. [`UtilTracker`]
//! turns that stream into a decayed utilization on the 1024 scale, as the
//! kernel's PELT does for tasks (half-life 32 ms by default), and a "busy now"
//! flag. Samples can arrive duplicated, out of order, after gaps, with counters
//! that restarted from zero, or with a clock that jumped; none of these make the
//! utilization leave 0..=1024 or panic.

use crate::capacity::CAPACITY_SCALE;

/// PELT's half-life: the weight of a period halves every 32 ms (y^32 = 0.5).
/// Short enough to follow a vCPU that starts a burst within a few 100 ms
/// placement ticks, long enough to smooth out individual halts.
pub const DEFAULT_HALF_LIFE_MS: u32 = 32;

/// A vCPU is "busy now" when it ran at least half of the last sampled interval.
/// LTP's sched_mc tests count a CPU as utilized above 50-70 %; the low end is
/// used so that a waking vCPU counts as busy as early as possible.
pub const DEFAULT_BUSY_THRESHOLD: u32 = 512;

/// One reading of a vCPU's cumulative counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IdleSample {
    /// When the counters were read (any monotonic-ish clock, nanoseconds).
    pub t_ns: u64,
    /// Cumulative time the vCPU ran guest code.
    pub busy_ns: u64,
    /// Cumulative time the vCPU was halted (idle).
    pub idle_ns: u64,
}

/// Tuning of a [`UtilTracker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtilConfig {
    /// Half-life of past utilization in milliseconds ([`DEFAULT_HALF_LIFE_MS`]).
    /// 0 disables smoothing: utilization is the last interval's busy fraction.
    pub half_life_ms: u32,
    /// Busy fraction (of 1024) of the last interval at or above which the vCPU
    /// counts as busy now ([`DEFAULT_BUSY_THRESHOLD`]).
    pub busy_threshold: u32,
}

impl Default for UtilConfig {
    fn default() -> Self {
        UtilConfig {
            half_life_ms: DEFAULT_HALF_LIFE_MS,
            busy_threshold: DEFAULT_BUSY_THRESHOLD,
        }
    }
}

/// What [`UtilTracker::update`] did with a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleOutcome {
    /// First sample: it only sets the baseline.
    Baseline,
    /// A normal sample: utilization updated.
    Accepted,
    /// Same reading as the previous one, or an older one arriving late: ignored.
    Stale,
    /// A counter went backwards (the counters restarted): the new reading
    /// becomes the baseline; its counts are used when they fit the elapsed time.
    CounterReset,
    /// The clock went backwards while the counters advanced: the interval is
    /// measured by the counters alone.
    ClockJump,
    /// Neither counter moved while time passed: no information, baseline moved.
    NoAccounting,
}

/// Decayed utilization of one vCPU.
#[derive(Debug, Clone, PartialEq)]
pub struct UtilTracker {
    config: UtilConfig,
    last: Option<IdleSample>,
    /// Utilization on the 1024 scale, kept fractional between updates.
    util: f64,
    busy: bool,
}

impl UtilTracker {
    /// A tracker with no history (utilization 0, not busy).
    pub fn new(config: UtilConfig) -> Self {
        UtilTracker {
            config,
            last: None,
            util: 0.0,
            busy: false,
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> UtilConfig {
        self.config
    }

    /// Utilization, 0..=1024.
    // A float-to-integer cast saturates (NaN gives 0), and the result is clamped to the scale.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn util(&self) -> u32 {
        (self.util.round() as u32).min(CAPACITY_SCALE)
    }

    /// Whether the vCPU ran at least [`UtilConfig::busy_threshold`] of the last interval.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Forgets all history (e.g. when the vCPU is reset).
    pub fn reset(&mut self) {
        self.last = None;
        self.util = 0.0;
        self.busy = false;
    }

    /// Feeds one sample.
    pub fn update(&mut self, sample: IdleSample) -> SampleOutcome {
        let Some(last) = self.last else {
            self.last = Some(sample);
            return SampleOutcome::Baseline;
        };
        let busy_back = sample.busy_ns < last.busy_ns;
        let idle_back = sample.idle_ns < last.idle_ns;
        if sample.t_ns <= last.t_ns && !busy_back && !idle_back {
            let busy = sample.busy_ns - last.busy_ns;
            let idle = sample.idle_ns - last.idle_ns;
            if busy == 0 && idle == 0 {
                // A duplicate, or an older reading equal to the last one.
                return SampleOutcome::Stale;
            }
            // Counters advanced but the clock did not: the clock jumped back.
            self.apply(busy, idle, None);
            self.last = Some(sample);
            return SampleOutcome::ClockJump;
        }
        if sample.t_ns < last.t_ns
            && (busy_back || idle_back)
            && sample.busy_ns <= last.busy_ns
            && sample.idle_ns <= last.idle_ns
        {
            // An older sample arriving late: everything in it is already counted.
            return SampleOutcome::Stale;
        }
        if busy_back || idle_back {
            // Counters restarted. Their new values count time since the restart,
            // which lies inside the elapsed interval when the clock is sane.
            let elapsed = sample.t_ns.saturating_sub(last.t_ns);
            let counted = sample.busy_ns.saturating_add(sample.idle_ns);
            if elapsed > 0 && counted > 0 && counted <= elapsed {
                self.apply(sample.busy_ns, sample.idle_ns, Some(elapsed));
            }
            self.last = Some(sample);
            return SampleOutcome::CounterReset;
        }
        let busy = sample.busy_ns - last.busy_ns;
        let idle = sample.idle_ns - last.idle_ns;
        self.last = Some(sample);
        if busy == 0 && idle == 0 {
            return SampleOutcome::NoAccounting;
        }
        self.apply(busy, idle, Some(sample.t_ns - last.t_ns));
        SampleOutcome::Accepted
    }

    /// Folds an interval with `busy` and `idle` nanoseconds into the average.
    /// The interval's length for decay is the counters' own account of time,
    /// capped by the wall-clock interval when there is one: a clock that jumps
    /// forward, or a gap, cannot age the history more than the time the vCPU
    /// was actually accounted.
    fn apply(&mut self, busy: u64, idle: u64, wall_ns: Option<u64>) {
        let counted = u128::from(busy) + u128::from(idle);
        if counted == 0 {
            return;
        }
        let fraction = (u128::from(busy) as f64) / (counted as f64);
        let sample_util = fraction * f64::from(CAPACITY_SCALE);
        self.busy = sample_util >= f64::from(self.config.busy_threshold);
        let decay_ns = match wall_ns {
            Some(w) => (counted.min(u128::from(w))) as f64,
            None => counted as f64,
        };
        if self.config.half_life_ms == 0 {
            self.util = sample_util;
            return;
        }
        let half_life_ns = f64::from(self.config.half_life_ms) * 1e6;
        let keep = (-decay_ns / half_life_ns).exp2();
        self.util =
            (self.util * keep + sample_util * (1.0 - keep)).clamp(0.0, f64::from(CAPACITY_SCALE));
    }
}

impl Default for UtilTracker {
    fn default() -> Self {
        UtilTracker::new(UtilConfig::default())
    }
}

/// A vCPU's utilization and the part of it spent waiting for a host CPU
/// ([`crate::VcpuLoad::waited`]): two trackers fed the same intervals, the
/// second with the wait as its busy time, so both decay alike.
#[derive(Debug, Clone, Default)]
pub struct LoadTracker {
    util: UtilTracker,
    wait: UtilTracker,
}

impl LoadTracker {
    /// Trackers with no history.
    pub fn new(config: UtilConfig) -> Self {
        LoadTracker {
            util: UtilTracker::new(config),
            wait: UtilTracker::new(config),
        }
    }

    /// Feeds one sample and `waited_ns`, the cumulative time the vCPU was
    /// runnable but not running, on the same origin as the sample's counters
    /// and counted in its busy time.
    pub fn update(&mut self, sample: IdleSample, waited_ns: u64) -> SampleOutcome {
        let counted = sample.busy_ns.saturating_add(sample.idle_ns);
        let waited = waited_ns.min(counted);
        self.wait.update(IdleSample {
            t_ns: sample.t_ns,
            busy_ns: waited,
            idle_ns: counted - waited,
        });
        self.util.update(sample)
    }

    /// The utilization tracker.
    pub fn util(&self) -> &UtilTracker {
        &self.util
    }

    /// The decayed share of time spent waiting, 0..=1024, at most the utilization.
    pub fn waited(&self) -> u32 {
        self.wait.util().min(self.util.util())
    }

    /// The engine's input for vCPU `id`.
    pub fn load(&self, id: crate::VcpuId) -> crate::VcpuLoad {
        crate::VcpuLoad {
            id,
            util: self.util.util(),
            busy: self.util.is_busy(),
            waited: self.waited(),
        }
    }
}

/// Turns a cumulative idle estimate, which may jump (KVM credits a halt only when it ends),
/// into the monotonic busy/idle counters [`UtilTracker`] expects: each interval gets
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_tracked_as_a_share_of_the_same_intervals() {
        let mut t = LoadTracker::new(UtilConfig::default());
        let (mut busy, mut idle, mut waited) = (0, 0, 0);
        for k in 1..=20u64 {
            // Each 100 ms: 60 ms wanted a CPU, 20 ms of it waiting for one.
            busy += 60 * MS;
            idle += 40 * MS;
            waited += 20 * MS;
            t.update(
                IdleSample {
                    t_ns: k * 100 * MS,
                    busy_ns: busy,
                    idle_ns: idle,
                },
                waited,
            );
        }
        let id = crate::VcpuId { vm: 1, vcpu: 2 };
        let load = t.load(id);
        assert!((load.util as i64 - 614).abs() <= 2, "{load:?}");
        assert!((load.waited as i64 - 205).abs() <= 2, "{load:?}");
        assert!(load.busy);
        assert_eq!(load.id, id);
    }

    const MS: u64 = 1_000_000;

    fn feed(
        tracker: &mut UtilTracker,
        start: IdleSample,
        steps: u64,
        step_ms: u64,
        busy_permille: u64,
    ) -> IdleSample {
        let mut s = start;
        for _ in 0..steps {
            let busy = step_ms * MS * busy_permille / 1000;
            s = IdleSample {
                t_ns: s.t_ns + step_ms * MS,
                busy_ns: s.busy_ns + busy,
                idle_ns: s.idle_ns + step_ms * MS - busy,
            };
            tracker.update(s);
        }
        s
    }

    #[test]
    fn converges_to_busy_fraction_with_half_life() {
        let mut t = UtilTracker::default();
        assert_eq!(t.update(IdleSample::default()), SampleOutcome::Baseline);
        let s = feed(&mut t, IdleSample::default(), 32, 1, 1000);
        // One half-life of full busy from 0: half of 1024.
        assert!((t.util() as i64 - 512).abs() <= 1, "{}", t.util());
        feed(&mut t, s, 1000, 1, 250);
        assert!((t.util() as i64 - 256).abs() <= 1);
        assert!(!t.is_busy());
    }

    #[test]
    fn zero_half_life_is_instantaneous() {
        let mut t = UtilTracker::new(UtilConfig {
            half_life_ms: 0,
            ..UtilConfig::default()
        });
        t.update(IdleSample::default());
        feed(&mut t, IdleSample::default(), 1, 10, 750);
        assert_eq!(t.util(), 768);
        assert!(t.is_busy());
    }

    #[test]
    fn duplicates_and_late_samples_are_ignored() {
        let mut t = UtilTracker::default();
        t.update(IdleSample::default());
        let s = feed(&mut t, IdleSample::default(), 10, 10, 600);
        let before = t.clone();
        assert_eq!(t.update(s), SampleOutcome::Stale);
        let old = IdleSample {
            t_ns: s.t_ns - 5 * MS,
            busy_ns: s.busy_ns - 3 * MS,
            idle_ns: s.idle_ns - 2 * MS,
        };
        assert_eq!(t.update(old), SampleOutcome::Stale);
        assert_eq!(t, before);
    }

    #[test]
    fn counter_reset_rebases() {
        let mut t = UtilTracker::default();
        t.update(IdleSample::default());
        let s = feed(&mut t, IdleSample::default(), 100, 10, 1000);
        let reset = IdleSample {
            t_ns: s.t_ns + 10 * MS,
            busy_ns: 0,
            idle_ns: 5 * MS,
        };
        assert_eq!(t.update(reset), SampleOutcome::CounterReset);
        assert!(t.util() <= 1024);
        feed(&mut t, reset, 200, 10, 0);
        assert_eq!(
            t.util(),
            0,
            "after the reset, idle intervals decay it normally"
        );
    }

    #[test]
    fn clock_jumps_do_not_age_history_beyond_accounted_time() {
        let mut t = UtilTracker::default();
        t.update(IdleSample::default());
        let s = feed(&mut t, IdleSample::default(), 100, 10, 1000);
        assert!(t.util() > 1000);
        // Clock jumps 1 hour forward, but only 1 ms was accounted, all idle.
        let jumped = IdleSample {
            t_ns: s.t_ns + 3600 * 1000 * MS,
            busy_ns: s.busy_ns,
            idle_ns: s.idle_ns + MS,
        };
        assert_eq!(t.update(jumped), SampleOutcome::Accepted);
        assert!(
            t.util() > 1000,
            "1 ms of idle decays ~2 %, not to zero: {}",
            t.util()
        );
        // Clock jumps back while counters advance.
        let back = IdleSample {
            t_ns: 5,
            busy_ns: jumped.busy_ns + 10 * MS,
            idle_ns: jumped.idle_ns,
        };
        assert_eq!(t.update(back), SampleOutcome::ClockJump);
        assert!(t.util() > 1000);
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
