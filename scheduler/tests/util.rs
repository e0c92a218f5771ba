//! Utilization tracker properties: bounded output, convergence, configurable
//! half-life, and robustness to duplicates, late samples, gaps, counter resets
//! and clock jumps.

use proptest::prelude::*;
use pvmm_scheduler::util::SampleOutcome;
use pvmm_scheduler::{IdleSample, UtilConfig, UtilTracker};

const MS: u64 = 1_000_000;

/// A clean stream: intervals of `len_ms` with `busy_permille` busy.
fn stream(intervals: &[(u64, u64)]) -> Vec<IdleSample> {
    let mut s = IdleSample {
        t_ns: 1_000 * MS,
        busy_ns: 0,
        idle_ns: 0,
    };
    let mut out = vec![s];
    for (len_ms, busy_permille) in intervals {
        let busy = len_ms * MS * busy_permille / 1000;
        s = IdleSample {
            t_ns: s.t_ns + len_ms * MS,
            busy_ns: s.busy_ns + busy,
            idle_ns: s.idle_ns + len_ms * MS - busy,
        };
        out.push(s);
    }
    out
}

fn run(config: UtilConfig, samples: &[IdleSample]) -> UtilTracker {
    let mut t = UtilTracker::new(config);
    for s in samples {
        t.update(*s);
    }
    t
}

#[test]
fn half_life_is_configurable() {
    for half_life_ms in [8u32, 32, 100] {
        let config = UtilConfig {
            half_life_ms,
            ..UtilConfig::default()
        };
        // From idle, one half-life of running: half of 1024.
        let samples = stream(&vec![(1, 1000); half_life_ms as usize]);
        let util = run(config, &samples).util();
        assert!(
            (util as i64 - 512).abs() <= 1,
            "half-life {half_life_ms}: {util}"
        );
    }
}

#[test]
fn a_long_gap_saturates_to_the_gap_fraction() {
    let mut intervals = vec![(10, 1000); 50];
    intervals.push((10_000, 250)); // 10 s between two samples, 25 % busy
    let t = run(UtilConfig::default(), &stream(&intervals));
    assert_eq!(t.util(), 256);
    assert!(!t.is_busy());
}

#[test]
fn counter_reset_then_steady_load_converges() {
    let mut samples = stream(&vec![(10, 1000); 50]);
    let last = *samples.last().unwrap();
    // The counters restart (vCPU thread re-created); 10 ms later they read 2 ms busy.
    let restarted = IdleSample {
        t_ns: last.t_ns + 10 * MS,
        busy_ns: 2 * MS,
        idle_ns: 8 * MS,
    };
    let mut t = run(UtilConfig::default(), &samples);
    assert_eq!(t.update(restarted), SampleOutcome::CounterReset);
    samples = stream(&vec![(10, 100); 100]);
    let offset = IdleSample {
        t_ns: restarted.t_ns - samples[0].t_ns,
        busy_ns: restarted.busy_ns,
        idle_ns: restarted.idle_ns,
    };
    for s in &samples[1..] {
        t.update(IdleSample {
            t_ns: s.t_ns + offset.t_ns,
            busy_ns: s.busy_ns + offset.busy_ns,
            idle_ns: s.idle_ns + offset.idle_ns,
        });
    }
    assert!((t.util() as i64 - 102).abs() <= 1, "{}", t.util());
}

#[test]
fn samples_without_accounting_change_nothing() {
    let samples = stream(&vec![(10, 500); 20]);
    let mut t = run(UtilConfig::default(), &samples);
    let before = t.util();
    let mut last = *samples.last().unwrap();
    last.t_ns += 50 * MS;
    assert_eq!(t.update(last), SampleOutcome::NoAccounting);
    assert_eq!(t.util(), before);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A constant busy fraction, sampled at any intervals, converges to it.
    #[test]
    fn converges_to_a_constant_fraction(
        busy_permille in 0u64..=1000,
        lens in prop::collection::vec(1u64..=50, 200),
    ) {
        let intervals: Vec<(u64, u64)> = lens.iter().map(|l| (*l, busy_permille)).collect();
        let t = run(UtilConfig::default(), &stream(&intervals));
        let expected = busy_permille as f64 * 1024.0 / 1000.0;
        prop_assert!((t.util() as f64 - expected).abs() <= 2.0, "{} vs {}", t.util(), expected);
        // Busy now: at least half of the last interval was busy.
        prop_assert_eq!(t.is_busy(), busy_permille >= 500);
    }

    /// Duplicates and late (out-of-order) samples do not change the result.
    #[test]
    fn duplicates_and_out_of_order_samples_are_ignored(
        intervals in prop::collection::vec((1u64..=40, 0u64..=1000), 2..60),
        noise in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..30),
    ) {
        let clean = stream(&intervals);
        let reference = run(UtilConfig::default(), &clean);
        // Interleave copies of earlier samples after later ones.
        let mut noisy = Vec::new();
        let mut extra = noise.clone();
        for (k, s) in clean.iter().enumerate() {
            noisy.push(*s);
            extra.retain(|(at, which)| {
                if at.index(clean.len()) == k {
                    noisy.push(clean[which.index(k + 1)]);
                    false
                } else {
                    true
                }
            });
        }
        let t = run(UtilConfig::default(), &noisy);
        prop_assert_eq!(t.util(), reference.util());
        prop_assert_eq!(t.is_busy(), reference.is_busy());
    }

    /// Arbitrary garbage: output stays in 0..=1024 and nothing panics.
    #[test]
    fn arbitrary_samples_stay_in_range(
        samples in prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..80),
        half_life_ms in prop::sample::select(vec![0u32, 1, 32, 1000, u32::MAX]),
    ) {
        let mut t = UtilTracker::new(UtilConfig { half_life_ms, ..UtilConfig::default() });
        for (t_ns, busy_ns, idle_ns) in samples {
            t.update(IdleSample { t_ns, busy_ns, idle_ns });
            prop_assert!(t.util() <= 1024);
        }
    }

    /// Resets, gaps and clock jumps anywhere in a stream: output stays in range,
    /// and a steady tail brings utilization back to the tail's fraction.
    #[test]
    fn recovers_from_resets_gaps_and_clock_jumps(
        head in prop::collection::vec((1u64..=40, 0u64..=1000), 1..40),
        disturbances in prop::collection::vec(0u8..4, 1..6),
        tail_permille in 0u64..=1000,
    ) {
        let mut t = UtilTracker::default();
        let mut samples = stream(&head);
        for d in &disturbances {
            let last = *samples.last().unwrap();
            let next = match d {
                0 => IdleSample { t_ns: last.t_ns + 5 * MS, busy_ns: MS, idle_ns: 0 },       // reset
                1 => IdleSample { t_ns: last.t_ns + 3_600_000 * MS, ..last },                  // jump forward, no accounting
                2 => IdleSample { t_ns: last.t_ns / 2, busy_ns: last.busy_ns + MS, idle_ns: last.idle_ns }, // jump back
                _ => IdleSample { t_ns: last.t_ns + 60_000 * MS, busy_ns: last.busy_ns + 30_000 * MS, idle_ns: last.idle_ns + 30_000 * MS }, // gap
            };
            samples.push(next);
        }
        for s in &samples {
            t.update(*s);
            prop_assert!(t.util() <= 1024);
        }
        let last = *samples.last().unwrap();
        let mut s = last;
        for _ in 0..200 {
            let busy = 10 * MS * tail_permille / 1000;
            s = IdleSample { t_ns: s.t_ns + 10 * MS, busy_ns: s.busy_ns + busy, idle_ns: s.idle_ns + 10 * MS - busy };
            t.update(s);
        }
        let expected = tail_permille as f64 * 1024.0 / 1000.0;
        prop_assert!((t.util() as f64 - expected).abs() <= 2.0, "{} vs {}", t.util(), expected);
    }
}
