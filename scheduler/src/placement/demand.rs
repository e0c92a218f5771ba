//! Each vCPU's demand: the weight placement packs and balances, kept by the
//! engine between decisions.
//!
//! The utilization the engine is given follows the last tick closely (PELT's
//! 32 ms half-life over a 100 ms tick keeps about a tenth of the past). That
//! is what a load that has just started or stopped needs, but a vCPU running
//! short bursts (a compiler, a web worker: bursts of tens of milliseconds)
//! reads a different value every tick, depending on how many bursts fell
//! into it: a 29 % load in 70 ms periods reads anywhere from 20 % to 50 %.
//! Packed on those readings, several such vCPUs open and close packages and
//! move between CPUs every few ticks for no lasting change in load.
//!
//! So the engine packs on a slower average of the utilization, much as the
//! kernel's `util_est` keeps a task's utilization steady across its sleeps
//! ("[PATCH v6 0/4] Utilization estimation (util_est) for FAIR tasks",
//! Patrick Bellasi, LKML, 2018-03-09). A rise that lasts is still followed
//! at once, by two rules:
//!
//! - a vCPU that ran flat out through the tick ([`DEMAND_FLAT_OUT_UTIL`])
//!   counts for at least its utilization now: a load that starts gets its
//!   room at the first decision that sees it whole;
//! - a vCPU busy (it ran at least half of the tick) at this decision and at
//!   the one before counts for at least the smaller of those two
//!   utilizations: a lasting partial load is followed at the second tick.
//!
//! A single busy tick short of flat out, which a bursty vCPU has whenever two
//! bursts fall into one tick, only moves the average like any other reading.
//!
//! What is averaged is the time the vCPU ran: its utilization less the time
//! it waited for a host CPU ([`VcpuLoad::waited`]). Bursty vCPUs sharing a
//! CPU wait for each other whenever their bursts collide, and counted as
//! demand that wait would make the packed CPU look fuller than its work, and
//! open a package for load that fits one. Waiting still counts where it tells
//! of more demand than the CPU can serve: the two rules above are triggered by
//! the utilization with the wait (two vCPUs spinning on one CPU each ran half
//! of it but wanted all of it), and a flat-out vCPU is lifted to all it
//! wanted; the second rule lifts to what it ran, which, for vCPUs that really
//! overfill their CPU, is already more than the CPU has room for.

use crate::capacity::CAPACITY_SCALE;

use super::VcpuLoad;

/// Half-life of the demand average, in ms. Several periods of a bursty load
/// (tens of ms each) and several ticks fall within it, which is what smooths
/// the tick-to-tick noise; a vCPU whose load ended counts as idle within
/// about 2 s (from a whole CPU to under a tenth: 3.5 half-lives), well inside
/// the 5 s consolidation ramp that follows.
pub const DEFAULT_DEMAND_HALF_LIFE_MS: u32 = 500;

/// Utilization (of 1024) at or above which a tick's reading counts at once:
/// 85 %, a vCPU that ran through all but about 15 ms of a 100 ms tick (the
/// tick's PELT value also carries a tenth of the tick before). A bursty load
/// of tens of milliseconds with idle gaps between its bursts does not reach
/// it; a thread that starts spinning does at the first whole tick.
pub const DEMAND_FLAT_OUT_UTIL: u32 = 870;

/// Fixed-point scale of the kept demand (1024 steps per utilization unit), so
/// that slow decay is not lost to rounding.
pub(super) const DEMAND_FRAC: u64 = 1024;

/// The share (of [`DEMAND_FRAC`]) of the old average kept after `dt_ms` with
/// half-life `half_life_ms`: 0 when averaging is off or no time is known.
pub(super) fn keep_fraction(dt_ms: Option<u64>, half_life_ms: u32) -> u64 {
    match dt_ms {
        Some(dt) if half_life_ms > 0 => {
            let keep = (-(dt as f64) / f64::from(half_life_ms)).exp2();
            // `keep` is in 0..=1 (2 to a power of at most 0): the product is in 0..=DEMAND_FRAC.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let kept = (keep * DEMAND_FRAC as f64).round() as u64;
            kept
        }
        _ => 0,
    }
}

/// One vCPU's demand average.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Demand {
    /// Utilization x [`DEMAND_FRAC`]; `None` before the vCPU's first decision.
    scaled: Option<u64>,
    /// The previous decision's utilization (x [`DEMAND_FRAC`]) when the
    /// vCPU was busy then.
    busy_before: Option<u64>,
}

impl Demand {
    /// Folds in this decision's load with `keep` (from [`keep_fraction`]) and
    /// returns the demand, 0..=1024.
    pub(super) fn update(&mut self, load: &VcpuLoad, keep: u64) -> u64 {
        let util = u64::from(load.util.min(CAPACITY_SCALE));
        let ran = util - u64::from(load.waited).min(util);
        let now = ran * DEMAND_FRAC;
        let mut scaled = average(self.scaled, now, keep);
        if util >= u64::from(DEMAND_FLAT_OUT_UTIL) {
            scaled = scaled.max(util * DEMAND_FRAC);
        } else if let (true, Some(before)) = (load.busy, self.busy_before) {
            scaled = scaled.max(now.min(before));
        }
        self.busy_before = load.busy.then_some(now);
        self.scaled = Some(scaled);
        to_demand(scaled)
    }
}

/// `old` (None before the first reading) averaged with `now` (both x [`DEMAND_FRAC`]),
/// keeping `keep` of `old` ([`keep_fraction`]); the first reading is taken whole.
pub(super) fn average(old: Option<u64>, now: u64, keep: u64) -> u64 {
    match old {
        Some(old) => (old * keep + now * (DEMAND_FRAC - keep)) / DEMAND_FRAC,
        None => now,
    }
}

/// A kept average (x [`DEMAND_FRAC`]) as a demand, rounded.
pub(super) fn to_demand(scaled: u64) -> u64 {
    (scaled + DEMAND_FRAC / 2) / DEMAND_FRAC
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::VcpuId;

    fn waiting(util: u32, waited: u32, busy: bool) -> VcpuLoad {
        VcpuLoad {
            waited,
            ..load(util, busy)
        }
    }

    fn load(util: u32, busy: bool) -> VcpuLoad {
        VcpuLoad {
            id: VcpuId { vm: 0, vcpu: 0 },
            util,
            busy,
            waited: 0,
        }
    }

    #[test]
    fn first_reading_is_taken_whole() {
        let mut d = Demand::default();
        assert_eq!(
            d.update(&load(300, false), keep_fraction(Some(100), 500)),
            300
        );
    }

    #[test]
    fn noisy_readings_average_out() {
        let keep = keep_fraction(Some(100), DEFAULT_DEMAND_HALF_LIFE_MS);
        let mut d = Demand::default();
        let mut seen = Vec::new();
        for k in 0..100 {
            let util = if k % 2 == 0 { 200 } else { 400 };
            seen.push(d.update(&load(util, false), keep));
        }
        // Readings jump by 200; the average stays within a quarter of that.
        assert!(
            seen[50..].iter().all(|v| (275..=325).contains(v)),
            "{seen:?}"
        );
    }

    #[test]
    fn a_flat_out_tick_counts_at_once() {
        let keep = keep_fraction(Some(100), DEFAULT_DEMAND_HALF_LIFE_MS);
        let mut d = Demand::default();
        d.update(&load(16, false), keep);
        assert_eq!(d.update(&load(DEMAND_FLAT_OUT_UTIL, true), keep), 870);
    }

    #[test]
    fn a_lasting_rise_counts_at_the_second_busy_tick_and_falls_slowly() {
        let keep = keep_fraction(Some(100), DEFAULT_DEMAND_HALF_LIFE_MS);
        let mut d = Demand::default();
        d.update(&load(16, false), keep);
        // One busy tick short of flat out moves the average only.
        assert!(d.update(&load(800, true), keep) < 200);
        // A second one lifts it to the smaller of the two.
        assert_eq!(d.update(&load(700, true), keep), 700);
        // Idle again: one half-life later about half is left.
        let mut v = 0;
        for _ in 0..5 {
            v = d.update(&load(0, false), keep);
        }
        assert!((330..=370).contains(&v), "{v}");
        for _ in 0..15 {
            v = d.update(&load(0, false), keep);
        }
        assert!(v < 90, "{v}");
    }

    #[test]
    fn waiting_for_a_cpu_is_not_averaged_as_demand() {
        let keep = keep_fraction(Some(100), DEFAULT_DEMAND_HALF_LIFE_MS);
        let mut d = Demand::default();
        let mut v = 0;
        // A 30 % load whose bursts collide with a neighbour's: it reads 45 % with the wait,
        // half of the time busy (two bursts in one tick).
        for k in 0..50 {
            v = d.update(&waiting(450, 150, k % 2 == 0), keep);
        }
        assert_eq!(v, 300);
        // Counted with the wait, the same readings average to what the vCPU wanted.
        let mut with_wait = Demand::default();
        for k in 0..50 {
            v = with_wait.update(&load(450, k % 2 == 0), keep);
        }
        assert_eq!(v, 450);
    }

    #[test]
    fn vcpus_overfilling_a_cpu_still_count_for_what_they_want() {
        let keep = keep_fraction(Some(100), DEFAULT_DEMAND_HALF_LIFE_MS);
        // Spinning beside another spinner: it ran half the CPU, waited the other half.
        let mut d = Demand::default();
        d.update(&load(16, false), keep);
        assert_eq!(d.update(&waiting(1024, 512, true), keep), 1024);
        // Two vCPUs of 70 % each on one CPU: each ran about half of it and waited a fifth;
        // the second busy tick lifts each to what it ran, together a full CPU.
        let mut d = Demand::default();
        d.update(&load(16, false), keep);
        d.update(&waiting(700, 200, true), keep);
        assert_eq!(d.update(&waiting(700, 200, true), keep), 500);
        // A wait larger than the utilization (two sources out of step) counts as no run.
        assert_eq!(Demand::default().update(&waiting(100, 300, false), keep), 0);
    }

    #[test]
    fn averaging_off_follows_every_reading() {
        let mut d = Demand::default();
        d.update(&load(900, true), 0);
        d.update(&load(900, true), 0);
        assert_eq!(d.update(&load(10, false), keep_fraction(Some(100), 0)), 10);
    }
}
