//! Per-vCPU load generators: how much work arrives at a vCPU over time.
//!
//! Work is measured in *reference nanoseconds*: the time the work takes on one
//! full host CPU (capacity 1024) with no slowdown. A vCPU keeps a backlog of
//! arrived but not yet done work; it is runnable while the backlog is not
//! empty, and halted (idle) otherwise.
//!
//! Generators (the text forms are what `--vm load=...` accepts):
//!
//! | form | kind | meaning |
//! |---|---|---|
//! | `constant:D` | open loop | `D` (0..1) of one CPU's worth of work arrives continuously |
//! | `duty:B/P[@S]` | open loop | fully busy for `B` ms of every `P` ms period, windows starting at `S` ms (default 0) |
//! | `bursty:B/I` | closed loop | bursts of work of random size (exponential, mean `B` ms) separated by random idle gaps (exponential, mean `I` ms) that start when the previous burst is *done* |
//! | `ramp:F/T/O` | open loop | demand moves linearly from `F` to `T` (0..1) over `O` ms, then stays at `T` |
//! | trace file | open loop | piecewise-constant demand per vCPU ([`crate::trace`]) |
//!
//! Open-loop work keeps arriving whatever the vCPU gets (unserved work queues
//! up); closed-loop work waits for the vCPU, so a slower placement stretches
//! the whole run, as a compile job waits for the previous one.
//! The random generator is seeded per vCPU, so every policy sees the same
//! sequence of burst and gap sizes.

use std::sync::Arc;

use thiserror::Error;

use super::trace::Trace;

/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;

/// Backlog below this many reference nanoseconds counts as empty: floating
/// point rounding leaves crumbs of work that would otherwise keep a vCPU
/// "runnable" for a whole extra step.
pub const EMPTY_BACKLOG_NS: f64 = 1.0;

/// Errors from parsing a load generator.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LoadError {
    /// Not one of the known generator names.
    #[error("unknown load '{0}' (expected constant:D, duty:B/P[@S], bursty:B/I or ramp:F/T/O)")]
    UnknownKind(String),
    /// A generator's parameters are malformed or out of range.
    #[error("bad load '{text}': {reason}")]
    BadParams {
        /// The generator text.
        text: String,
        /// What is wrong.
        reason: String,
    },
}

/// One vCPU's load generator (module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum LoadSpec {
    /// Open loop: `demand` (0..1) of one CPU, all the time.
    Constant {
        /// Fraction of one full CPU.
        demand: f64,
    },
    /// Open loop: fully busy for `busy_ms` of every `period_ms`, windows
    /// starting at `phase_ms`.
    Duty {
        /// Busy part of each period (ms).
        busy_ms: u64,
        /// Period (ms), > 0.
        period_ms: u64,
        /// Start of the first busy window (ms).
        phase_ms: u64,
    },
    /// Closed loop: exponential bursts of work and idle gaps.
    Bursty {
        /// Mean burst size (reference ms of work), > 0.
        burst_ms: f64,
        /// Mean idle gap after a burst completes (ms).
        idle_ms: f64,
    },
    /// Open loop: demand ramps linearly from `from` to `to` over `over_ms`.
    Ramp {
        /// Demand at time 0.
        from: f64,
        /// Demand from `over_ms` on.
        to: f64,
        /// Ramp length (ms); 0 jumps to `to` at once.
        over_ms: u64,
    },
    /// Open loop: column `column` of a trace.
    Trace {
        /// The trace (shared by the VM's vCPUs).
        trace: Arc<Trace>,
        /// Which vCPU column.
        column: usize,
    },
}

fn parse_fraction(text: &str, what: &str, whole: &str) -> Result<f64, LoadError> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && (0.0..=1.0).contains(v))
        .ok_or_else(|| LoadError::BadParams {
            text: whole.to_string(),
            reason: format!("{what} '{text}' is not a number from 0 to 1"),
        })
}

fn parse_ms(text: &str, what: &str, whole: &str) -> Result<u64, LoadError> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|v| *v <= MAX_MS)
        .ok_or_else(|| LoadError::BadParams {
            text: whole.to_string(),
            reason: format!("{what} '{text}' is not a whole number of milliseconds up to {MAX_MS}"),
        })
}

fn parse_mean_ms(text: &str, what: &str, whole: &str) -> Result<f64, LoadError> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0 && *v <= MAX_MS as f64)
        .ok_or_else(|| LoadError::BadParams {
            text: whole.to_string(),
            reason: format!("{what} '{text}' is not a number of milliseconds from 0 to {MAX_MS}"),
        })
}

/// Longest period, burst, gap or ramp accepted (ms): one day. Longer values
/// are typos, and the cap keeps nanosecond arithmetic far from overflow.
pub const MAX_MS: u64 = 86_400_000;

impl std::str::FromStr for LoadSpec {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (kind, params) = s
            .split_once(':')
            .ok_or_else(|| LoadError::UnknownKind(s.to_string()))?;
        let bad = |reason: &str| LoadError::BadParams {
            text: s.to_string(),
            reason: reason.to_string(),
        };
        match kind {
            "constant" => Ok(LoadSpec::Constant {
                demand: parse_fraction(params, "demand", s)?,
            }),
            "duty" => {
                let (pattern, phase) = match params.split_once('@') {
                    Some((p, ph)) => (p, Some(ph)),
                    None => (params, None),
                };
                let (busy, period) = pattern
                    .split_once('/')
                    .ok_or_else(|| bad("expected duty:BUSY_MS/PERIOD_MS[@PHASE_MS]"))?;
                let busy_ms = parse_ms(busy, "busy time", s)?;
                let period_ms = parse_ms(period, "period", s)?;
                if period_ms == 0 {
                    return Err(bad("the period must be at least 1 ms"));
                }
                if busy_ms > period_ms {
                    return Err(bad("the busy time is longer than the period"));
                }
                let phase_ms = match phase {
                    Some(p) => parse_ms(p, "phase", s)?,
                    None => 0,
                };
                Ok(LoadSpec::Duty {
                    busy_ms,
                    period_ms,
                    phase_ms,
                })
            }
            "bursty" => {
                let (burst, idle) = params
                    .split_once('/')
                    .ok_or_else(|| bad("expected bursty:BURST_MS/IDLE_MS"))?;
                let burst_ms = parse_mean_ms(burst, "mean burst", s)?;
                let idle_ms = parse_mean_ms(idle, "mean idle gap", s)?;
                if burst_ms <= 0.0 {
                    return Err(bad("the mean burst must be above 0 ms"));
                }
                Ok(LoadSpec::Bursty { burst_ms, idle_ms })
            }
            "ramp" => {
                let parts: Vec<&str> = params.split('/').collect();
                let [from, to, over] = parts[..] else {
                    return Err(bad("expected ramp:FROM/TO/OVER_MS"));
                };
                Ok(LoadSpec::Ramp {
                    from: parse_fraction(from, "start demand", s)?,
                    to: parse_fraction(to, "end demand", s)?,
                    over_ms: parse_ms(over, "ramp length", s)?,
                })
            }
            _ => Err(LoadError::UnknownKind(s.to_string())),
        }
    }
}

impl std::fmt::Display for LoadSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadSpec::Constant { demand } => write!(f, "constant:{demand}"),
            LoadSpec::Duty {
                busy_ms,
                period_ms,
                phase_ms: 0,
            } => write!(f, "duty:{busy_ms}/{period_ms}"),
            LoadSpec::Duty {
                busy_ms,
                period_ms,
                phase_ms,
            } => write!(f, "duty:{busy_ms}/{period_ms}@{phase_ms}"),
            LoadSpec::Bursty { burst_ms, idle_ms } => write!(f, "bursty:{burst_ms}/{idle_ms}"),
            LoadSpec::Ramp { from, to, over_ms } => write!(f, "ramp:{from}/{to}/{over_ms}"),
            LoadSpec::Trace { column, .. } => write!(f, "trace column {column}"),
        }
    }
}

impl LoadSpec {
    /// Whether the work that arrives depends on how fast the vCPU is served:
    /// a closed-loop generator's next burst waits for the previous one to be
    /// done, so a slower placement shifts every later arrival.
    pub fn is_closed_loop(&self) -> bool {
        matches!(self, LoadSpec::Bursty { .. })
    }

    /// Long-run fraction of one full CPU this load asks for, when its vCPU is
    /// served at full speed (a trace: its time-weighted mean up to its last
    /// sample, or its only value).
    pub fn mean_demand(&self) -> f64 {
        match self {
            LoadSpec::Constant { demand } => *demand,
            LoadSpec::Duty {
                busy_ms, period_ms, ..
            } => *busy_ms as f64 / (*period_ms).max(1) as f64,
            LoadSpec::Bursty { burst_ms, idle_ms } => burst_ms / (burst_ms + idle_ms),
            LoadSpec::Ramp { to, .. } => *to,
            LoadSpec::Trace { trace, column } => {
                let end = trace.last_time_ms();
                if end == 0 {
                    return trace.demand(0, *column);
                }
                let mut sum = 0.0;
                for i in 0..trace.len() - 1 {
                    let span = trace.next_change_ms(i).unwrap_or(end) - trace.time_ms(i);
                    sum += trace.demand(i, *column) * span as f64;
                }
                sum / end as f64
            }
        }
    }
}

/// A small deterministic random number generator (SplitMix64): the
/// simulator's runs must be reproducible from a seed and need no crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator for one of many streams derived from `seed` (e.g. one per vCPU).
    pub fn stream(seed: u64, a: u64, b: u64) -> Self {
        let mut mix = Rng(seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let x = mix.next_u64();
        Rng(x ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0; 0 when n == 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        // In 0..n: `next_f64` is in 0..1.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = (self.next_f64() * n as f64) as usize;
        i % n
    }

    /// Exponentially distributed with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

/// Busy time of a duty pattern in `[0, x)` (ns), windows of `busy` every
/// `period` starting at `phase` (and at `phase - k x period`).
fn duty_busy_before(x: i128, busy: i128, period: i128, phase: i128) -> i128 {
    let cumulative = |y: i128| y.div_euclid(period) * busy + y.rem_euclid(period).min(busy);
    cumulative(x - phase) - cumulative(-phase)
}

/// The running state of one vCPU's generator.
#[derive(Debug, Clone)]
pub struct LoadState {
    spec: LoadSpec,
    rng: Rng,
    /// Bursty: a burst's work has arrived and is not done yet.
    in_burst: bool,
    /// Bursty: when the current idle gap ends (ns).
    idle_until_ns: u64,
    /// Trace: sample in force at the last call.
    trace_hint: usize,
}

impl LoadState {
    /// A generator at time 0 with its own random stream.
    pub fn new(spec: LoadSpec, rng: Rng) -> Self {
        let mut state = LoadState {
            spec,
            rng,
            in_burst: false,
            idle_until_ns: 0,
            trace_hint: 0,
        };
        if let LoadSpec::Bursty { idle_ms, .. } = state.spec {
            // Start in an idle gap of random length so that vCPUs with the same
            // generator do not burst in lockstep.
            // An exponential sample is not negative; a float-to-integer cast saturates.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let idle_ns = (state.rng.exponential(idle_ms) * NS_PER_MS as f64) as u64;
            state.idle_until_ns = idle_ns;
        }
        state
    }

    /// The generator of vCPU `vcpu` of VM `vm` in a run seeded `seed`, with
    /// that vCPU's own random stream: every run of the same VMs and seed
    /// sees the same sequence of bursts and gaps, whoever serves them.
    pub fn for_vcpu(spec: LoadSpec, seed: u64, vm: usize, vcpu: usize) -> Self {
        LoadState::new(spec, Rng::stream(seed, vm as u64, vcpu as u64))
    }

    /// The generator.
    pub fn spec(&self) -> &LoadSpec {
        &self.spec
    }

    /// Work (reference ns) arriving during `[t_ns, t_ns + dt_ns)`. `backlog_ns`
    /// is the vCPU's undone work at `t_ns` (closed-loop generators wait for it
    /// to drain before the next idle gap starts).
    pub fn arrivals(&mut self, t_ns: u64, dt_ns: u64, backlog_ns: f64) -> f64 {
        let dt = dt_ns as f64;
        match &self.spec {
            LoadSpec::Constant { demand } => demand * dt,
            LoadSpec::Duty {
                busy_ms,
                period_ms,
                phase_ms,
            } => {
                let ms = i128::from(NS_PER_MS);
                let busy = i128::from(*busy_ms) * ms;
                let period = i128::from(*period_ms) * ms;
                let phase = i128::from(*phase_ms) * ms;
                let a = i128::from(t_ns);
                let b = a + i128::from(dt_ns);
                (duty_busy_before(b, busy, period, phase)
                    - duty_busy_before(a, busy, period, phase)) as f64
            }
            LoadSpec::Bursty { burst_ms, idle_ms } => {
                let (burst_ms, idle_ms) = (*burst_ms, *idle_ms);
                if self.in_burst && backlog_ns < EMPTY_BACKLOG_NS {
                    self.in_burst = false;
                    // An exponential sample is not negative; a float-to-integer cast saturates.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let idle_ns = (self.rng.exponential(idle_ms) * NS_PER_MS as f64) as u64;
                    self.idle_until_ns = t_ns + idle_ns;
                }
                if !self.in_burst && t_ns >= self.idle_until_ns {
                    self.in_burst = true;
                    // At least one nanosecond, so a burst always exists.
                    return (self.rng.exponential(burst_ms) * NS_PER_MS as f64).max(1.0);
                }
                0.0
            }
            LoadSpec::Ramp { from, to, over_ms } => {
                let over = (*over_ms * NS_PER_MS) as f64;
                let demand_at = |t: f64| {
                    if over <= 0.0 || t >= over {
                        *to
                    } else {
                        from + (to - from) * t / over
                    }
                };
                let a = t_ns as f64;
                let b = a + dt;
                if b <= over || a >= over {
                    // Linear (or constant) over the whole step: the midpoint is exact.
                    demand_at((a + b) / 2.0) * dt
                } else {
                    (demand_at((a + over) / 2.0) * (over - a)) + to * (b - over)
                }
            }
            LoadSpec::Trace { trace, column } => {
                let mut work = 0.0;
                let mut t = t_ns;
                let end = t_ns + dt_ns;
                while t < end {
                    let sample = trace.sample_at(t / NS_PER_MS, self.trace_hint);
                    self.trace_hint = sample;
                    let next = trace
                        .next_change_ms(sample)
                        .map_or(end, |ms| (ms * NS_PER_MS).clamp(t + 1, end));
                    work += trace.demand(sample, *column) * (next - t) as f64;
                    t = next;
                }
                work
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MS: u64 = NS_PER_MS;

    fn total(spec: &LoadSpec, steps: u64, dt: u64) -> f64 {
        let mut s = LoadState::new(spec.clone(), Rng::new(1));
        (0..steps).map(|i| s.arrivals(i * dt, dt, 0.0)).sum()
    }

    #[test]
    fn parse_and_display_round_trip() {
        for text in [
            "constant:0.5",
            "duty:30/100",
            "duty:30/100@50",
            "bursty:20/50",
            "ramp:0/1/5000",
        ] {
            let spec: LoadSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
        }
        for bad in [
            "constant",
            "constant:1.5",
            "constant:x",
            "duty:30",
            "duty:200/100",
            "duty:0/0",
            "duty:10/100@x",
            "bursty:0/10",
            "bursty:5",
            "bursty:-1/5",
            "ramp:0/1",
            "ramp:0/2/10",
            "sine:1",
            "duty:1/99999999999",
        ] {
            let err = bad.parse::<LoadSpec>().unwrap_err();
            assert!(!err.to_string().contains('\n'), "{bad}: {err}");
        }
        assert!(matches!(
            "sine:1".parse::<LoadSpec>(),
            Err(LoadError::UnknownKind(_))
        ));
    }

    #[test]
    fn constant_integrates_demand() {
        let spec = LoadSpec::Constant { demand: 0.25 };
        assert!((total(&spec, 1000, MS) - 250.0 * MS as f64).abs() < 1e-3);
    }

    #[test]
    fn duty_cycle_windows() {
        let spec: LoadSpec = "duty:30/100".parse().unwrap();
        let mut s = LoadState::new(spec.clone(), Rng::new(1));
        // Busy for the first 30 ms of each 100 ms.
        assert_eq!(s.arrivals(0, MS, 0.0), MS as f64);
        assert_eq!(s.arrivals(29 * MS, MS, 0.0), MS as f64);
        assert_eq!(s.arrivals(30 * MS, MS, 0.0), 0.0);
        assert_eq!(s.arrivals(99 * MS, MS, 0.0), 0.0);
        assert_eq!(s.arrivals(100 * MS, MS, 0.0), MS as f64);
        // A step straddling a window edge gets the overlap only.
        assert_eq!(s.arrivals(25 * MS, 10 * MS, 0.0), 5.0 * MS as f64);
        assert!((total(&spec, 1000, MS) - 300.0 * MS as f64).abs() < 1e-3);
        assert!((spec.mean_demand() - 0.3).abs() < 1e-12);
        // Phase shifts the windows; the one before time 0 wraps around.
        let shifted: LoadSpec = "duty:30/100@90".parse().unwrap();
        let mut s = LoadState::new(shifted, Rng::new(1));
        assert_eq!(
            s.arrivals(0, MS, 0.0),
            MS as f64,
            "window 90..120 covers 0..20"
        );
        assert_eq!(s.arrivals(20 * MS, MS, 0.0), 0.0);
        assert_eq!(s.arrivals(90 * MS, MS, 0.0), MS as f64);
    }

    #[test]
    fn ramp_moves_linearly() {
        let spec: LoadSpec = "ramp:0/1/1000".parse().unwrap();
        let mut s = LoadState::new(spec.clone(), Rng::new(1));
        assert!((s.arrivals(0, MS, 0.0) - 0.0005 * MS as f64).abs() < 1e-6);
        assert!((s.arrivals(500 * MS, MS, 0.0) - 0.5005 * MS as f64).abs() < 1e-6);
        assert_eq!(s.arrivals(2000 * MS, MS, 0.0), MS as f64);
        // Straddling the end of the ramp: 0.5 ms at mean 0.99975 + 0.5 ms at 1.
        let straddle = s.arrivals(999 * MS + MS / 2, MS, 0.0);
        assert!((straddle - (0.5 * 0.99975 + 0.5) * MS as f64).abs() < 1e-3);
        // The first 1000 ms average 0.5.
        assert!((total(&spec, 1000, MS) - 500.0 * MS as f64).abs() < 1.0);
        let jump: LoadSpec = "ramp:0.2/0.8/0".parse().unwrap();
        assert!((total(&jump, 10, MS) - 8.0 * MS as f64).abs() < 1e-6);
    }

    #[test]
    fn bursty_is_closed_loop_and_has_the_mean_duty() {
        let spec: LoadSpec = "bursty:20/60".parse().unwrap();
        let mut s = LoadState::new(spec.clone(), Rng::new(7));
        // Served instantly: the backlog is always drained by the next step.
        let mut work = 0.0;
        let mut backlog = 0.0;
        let steps = 400_000u64;
        for i in 0..steps {
            let arrived = s.arrivals(i * MS, MS, backlog);
            work += arrived;
            // Drain up to 1 ms of work per step, like a full CPU.
            backlog = (backlog + arrived - MS as f64).max(0.0);
        }
        let duty = work / (steps * MS) as f64;
        assert!((duty - 0.25).abs() < 0.02, "duty {duty}");
        assert!((spec.mean_demand() - 0.25).abs() < 1e-12);
        // No new burst while the previous one is not done.
        let mut s = LoadState::new("bursty:5/0".parse().unwrap(), Rng::new(3));
        let first = s.arrivals(0, MS, 0.0);
        assert!(first > 0.0);
        assert_eq!(s.arrivals(MS, MS, first), 0.0);
        assert!(s.arrivals(2 * MS, MS, 0.0) > 0.0);
    }

    #[test]
    fn bursty_streams_are_reproducible_and_distinct() {
        let spec: LoadSpec = "bursty:10/10".parse().unwrap();
        let run = |rng: Rng| {
            let mut s = LoadState::new(spec.clone(), rng);
            (0..200)
                .map(|i| s.arrivals(i * MS, MS, 0.0))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(Rng::stream(1, 0, 0)), run(Rng::stream(1, 0, 0)));
        assert_ne!(run(Rng::stream(1, 0, 0)), run(Rng::stream(1, 0, 1)));
        assert_ne!(run(Rng::stream(1, 0, 0)), run(Rng::stream(2, 0, 0)));
    }

    #[test]
    fn trace_integrates_across_changes() {
        let trace =
            Arc::new(Trace::parse("0 1.0 0.0\n10 0.5 1.0\n20 0 0\n", Path::new("x")).unwrap());
        let spec = LoadSpec::Trace {
            trace: trace.clone(),
            column: 0,
        };
        let mut s = LoadState::new(spec.clone(), Rng::new(1));
        // A 15 ms step from 5 ms: 5 ms at 1.0, then 10 ms at 0.5.
        assert_eq!(s.arrivals(5 * MS, 15 * MS, 0.0), 10.0 * MS as f64);
        assert_eq!(s.arrivals(30 * MS, MS, 0.0), 0.0);
        // Column 0 averages (10 x 1 + 10 x 0.5) / 20.
        assert!((spec.mean_demand() - 0.75).abs() < 1e-12);
        let col1 = LoadSpec::Trace { trace, column: 1 };
        assert!((total(&col1, 40, MS) - 10.0 * MS as f64).abs() < 1e-6);
    }

    #[test]
    fn rng_ranges() {
        let mut r = Rng::new(42);
        for _ in 0..1000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            assert!(r.below(3) < 3);
            assert!(r.exponential(5.0) >= 0.0);
        }
        assert_eq!(r.below(0), 0);
    }
}
