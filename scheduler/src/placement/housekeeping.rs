//! The placing process's own threads (a VMM's device, console, API and scheduler threads): not
//! vCPUs, but CPU time on the one package they are kept on ([`super::Engine::set_housekeeping`]).
//!
//! The engine counts that time as load of that package, so that a package whose vCPUs leave
//! no room for the threads that serve their I/O is seen as full:
//!
//! - the host's total fit demand includes it, so the packing policies open one more package
//!   when vCPUs and housekeeping together exceed the packages in use, and the host counts as
//!   overutilized when they exceed all of them;
//! - in pack mode, the package starts each decision with it as fit demand, so vCPUs stay on,
//!   move to and are placed on it only while both fit;
//! - in spread mode, the package starts each decision with it as load, so spreading vCPUs
//!   prefer the other packages.
//!
//! The threads may run on any CPU of their package (the host scheduler puts them where it
//! finds room), so the load is counted against the package, never against one CPU: it takes
//! no CPU slot. Only when the package's capacity (every thread busy) cannot hold the vCPUs'
//! load and theirs (spread mode, an overutilized host) do they take time the vCPUs would
//! run: the excess, shared evenly by the package's CPUs, is taken off what each of those CPUs
//! offers its vCPUs, so the capacities published to the guest show it.
//!
//! With no housekeeping load (none set, or an average under [`MIN_HOUSEKEEPING_UTIL`]), every
//! count above adds 0: decisions are the same as an engine's that was never told of one.

use crate::capacity::FIT_MARGIN;

use super::demand::{average, to_demand, DEMAND_FRAC};
use super::draft::Draft;
use super::index::{dense, PkgIndex};
use super::layout::Layout;

/// Average housekeeping load (1024 = one CPU) under which the engine counts none: about 1.6 %
/// of a CPU, the least a vCPU counts for ([`super::MIN_VCPU_WEIGHT`]). A VMM's own threads
/// never quite stop: pvmm's tick alone costs about a thousandth of a CPU
/// (`docs/results/own-threads.md`). Counted, that would open a package for busy vCPUs that
/// exactly fill theirs, for bookkeeping that costs them less than the noise of their own
/// utilization; device threads at work use far more.
pub const MIN_HOUSEKEEPING_UTIL: u32 = 16;

/// The housekeeping load as the engine counts it between decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Housekeeping {
    /// The package the threads are kept on; [`PkgIndex::NONE`] when not known.
    pkg: PkgIndex,
    /// The latest reading, 1024 = one CPU (several threads may use more than one CPU).
    util: u64,
    /// Its average, scaled as the vCPUs' demand is ([`super::demand`]); None before the
    /// first decision that saw a reading.
    scaled: Option<u64>,
    /// The weight of the current decision: the average, 1024 = one CPU, or 0 under
    /// [`MIN_HOUSEKEEPING_UTIL`].
    weight: u64,
}

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping {
            pkg: PkgIndex::NONE,
            util: 0,
            scaled: None,
            weight: 0,
        }
    }
}

impl Housekeeping {
    /// Takes a reading: `util` (1024 = one CPU) on package `pkg`.
    pub(super) fn set(&mut self, pkg: PkgIndex, util: u32) {
        self.pkg = pkg;
        self.util = u64::from(util);
    }

    /// Folds the latest reading into the average with `keep` (the share of the old average
    /// kept, as for the vCPUs' demand) and makes it this decision's weight.
    ///
    /// A rise counts at once and a fall decays with the demand half-life. Device threads
    /// serve the guest's I/O in bursts whose requests queue while they wait: room must be
    /// there at the first decision that sees the work, as for a vCPU that ran flat out, and
    /// a quiet tick between bursts must not hand the room to a vCPU.
    pub(super) fn update(&mut self, keep: u64) {
        let now = self.util * DEMAND_FRAC;
        let scaled = average(self.scaled, now, keep).max(now);
        self.scaled = Some(scaled);
        let demand = to_demand(scaled);
        self.weight = if demand < u64::from(MIN_HOUSEKEEPING_UTIL) {
            0
        } else {
            demand
        };
    }

    /// The package the load is counted on, if it is known and has a load this decision.
    pub(super) fn loaded_pkg(&self) -> Option<PkgIndex> {
        (!self.pkg.is_none() && self.weight > 0).then_some(self.pkg)
    }

    /// Its fit demand: the weight with the fit rule's headroom, as a vCPU's, but against the
    /// whole package rather than one slot (its threads use any CPU of the package), and never
    /// more than the package has.
    pub(super) fn fit(&self, l: &Layout) -> u64 {
        match self.loaded_pkg() {
            Some(p) => (self.weight * FIT_MARGIN).min(l.slots.pkg_total[p.get()]),
            None => 0,
        }
    }

    /// Adds the fit demand to its package's, in pack mode's per-package fit demands.
    pub(super) fn add_fit(&self, l: &Layout, pkg_fit: &mut [u64]) {
        if let Some(p) = self.loaded_pkg() {
            pkg_fit[p.get()] += self.fit(l);
        }
    }

    /// What the threads take from each CPU of their package beyond the room its vCPUs leave
    /// (its capacity with every thread busy, less their load in `draft`): that excess shared
    /// evenly by the package's CPUs, rounded up. None when there is no excess.
    pub(super) fn taken_per_cpu(&self, l: &Layout, draft: &Draft) -> Option<(PkgIndex, u32)> {
        let p = self.loaded_pkg()?.get();
        let vcpus = draft.pkg_load[p].saturating_sub(self.weight);
        let room = l.spread.pkg_cap[p].saturating_sub(vcpus);
        let excess = self.weight.saturating_sub(room);
        let cpus = u64::from(l.pkg_cpu_start[p + 1] - l.pkg_cpu_start[p]).max(1);
        let per_cpu = u32::try_from(excess.div_ceil(cpus)).unwrap_or(u32::MAX);
        (excess > 0).then_some((PkgIndex(dense(p)), per_cpu))
    }

    /// Adds the weight to its package's load in the draft (spread mode's package loads).
    pub(super) fn add_load(&self, draft: &mut Draft) {
        if let Some(p) = self.loaded_pkg() {
            draft.pkg_load[p.get()] += self.weight;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::demand::keep_fraction;
    use super::*;

    #[test]
    fn a_rise_counts_at_once_and_a_fall_decays_with_the_half_life() {
        let keep = keep_fraction(Some(100), 500);
        let mut h = Housekeeping::default();
        h.set(PkgIndex(0), 0);
        h.update(keep);
        assert_eq!(h.weight, 0);
        h.set(PkgIndex(0), 800);
        h.update(keep);
        assert_eq!(h.weight, 800, "a rise counts at once");
        h.set(PkgIndex(0), 0);
        for _ in 0..5 {
            h.update(keep);
        }
        assert!(
            (390..=410).contains(&h.weight),
            "half after one half-life: {}",
            h.weight
        );
        for _ in 0..100 {
            h.update(keep);
        }
        assert_eq!(h.weight, 0, "it decays to nothing");
    }

    #[test]
    fn a_load_under_the_floor_counts_for_nothing() {
        let mut h = Housekeeping::default();
        h.set(PkgIndex(0), MIN_HOUSEKEEPING_UTIL - 1);
        h.update(0);
        assert_eq!(h.weight, 0);
        h.set(PkgIndex(0), MIN_HOUSEKEEPING_UTIL);
        h.update(0);
        assert_eq!(h.weight, u64::from(MIN_HOUSEKEEPING_UTIL));
    }

    #[test]
    fn more_than_one_cpu_counts_whole() {
        let mut h = Housekeeping::default();
        h.set(PkgIndex(0), 3000);
        h.update(0);
        assert_eq!(h.weight, 3000);
    }
}
