//! Spread mode: `performance`, and every policy while the host is overutilized.
//!
//! Each vCPU that moves goes to the least loaded package, then the least loaded
//! core in it, then the least loaded thread (loads relative to capacity, ties to
//! the lowest index). A vCPU keeps its CPU unless, with its own weight removed
//! from the previous placement, the least loaded CPU is clearly
//! ([`CAPACITY_GREATER_MARGIN`]) better at package level (busy vCPUs only), core
//! or CPU level.
//!
//! Spread mode has no slots and no fit test: it tracks loads only
//! ([`super::draft::Draft::assign`]).

use super::draft::{reserve_len, reset, ScratchSizes};
use super::index::{dense, CpuIndex, PkgIndex};
use super::layout::ratio_less;
use super::{Engine, VcpuLoad};
use crate::capacity::{CAPACITY_GREATER_MARGIN, CAPACITY_SCALE};

/// Spread mode's buffers, reused across decisions.
#[derive(Debug, Clone)]
pub(super) struct SpreadScratch {
    /// vCPUs that keep their previous CPU this decision.
    stay: Vec<bool>,
    /// Least and second least loaded package during the stay test
    /// ([`PkgIndex::NONE`] when the host has fewer).
    min_pkg: [PkgIndex; 2],
    /// Least loaded core of each package during the stay test.
    pkg_min_core: Vec<u32>,
}

impl Default for SpreadScratch {
    fn default() -> Self {
        SpreadScratch {
            stay: Vec::new(),
            min_pkg: [PkgIndex::NONE; 2],
            pkg_min_core: Vec::new(),
        }
    }
}

impl SpreadScratch {
    /// Room for every vector at `sizes`.
    pub(super) fn reserve(&mut self, sizes: ScratchSizes) {
        reserve_len(&mut self.stay, sizes.vcpus);
        reserve_len(&mut self.pkg_min_core, sizes.pkgs);
    }
}

/// The loads around one CPU: its package's, its core's and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoadsAround {
    pkg: u64,
    core: u64,
    cpu: u64,
}

/// `a_num / a_den` is clearly ([`CAPACITY_GREATER_MARGIN`]) greater than
/// `b_num / b_den`; dens are taken as at least 1.
fn ratio_clearly_greater(a_num: u64, a_den: u64, b_num: u64, b_den: u64) -> bool {
    let (a_den, b_den) = (a_den.max(1), b_den.max(1));
    let scale = u64::from(CAPACITY_SCALE);
    match (
        a_num.checked_mul(b_den).and_then(|a| a.checked_mul(scale)),
        b_num
            .checked_mul(a_den)
            .and_then(|b| b.checked_mul(CAPACITY_GREATER_MARGIN)),
    ) {
        (Some(a), Some(b)) => a > b,
        // Loads beyond u64 products: exact in u128 (never on real hosts).
        _ => {
            u128::from(a_num) * u128::from(b_den) * u128::from(scale)
                > u128::from(b_num) * u128::from(a_den) * u128::from(CAPACITY_GREATER_MARGIN)
        }
    }
}

/// `a` is clearly ([`CAPACITY_GREATER_MARGIN`]) greater than `b`: loads
/// against equal capacities.
fn clearly_greater_load(a: u64, b: u64) -> bool {
    ratio_clearly_greater(a, 1, b, 1)
}

impl Engine {
    /// Spread mode (see the module documentation).
    pub(super) fn place_spread(&mut self, loads: &[VcpuLoad]) {
        // Stay-put test, against the loads of the previous placement (every
        // placed vCPU on its previous CPU, current weights): a vCPU keeps its
        // CPU unless, with its own weight removed, the least loaded CPU is
        // clearly better. Testing each vCPU one by one against a half-built
        // placement would make two vCPUs swap whenever their utils change
        // order; a fair-share test would fail whenever one vCPU exceeds its
        // share of a core. A busy vCPU sharing a core while another core is
        // idle still moves: load + w against w is clearly greater.
        let n = self.vcpus.len();
        reset(&mut self.spread.stay, n, false);
        for (i, load) in loads.iter().enumerate() {
            let prev = self.vcpus[i].cpu;
            if !prev.is_none() {
                self.draft.assign(&self.layout, i, prev, load.busy);
            }
        }
        // Each stay test below asks what the placement would be without one
        // vCPU: between tests the placement is the previous one, so its least
        // loaded package and cores, found once here, hold for every test.
        self.fill_spread_minima();
        for (i, load) in loads.iter().enumerate() {
            let prev = self.vcpus[i].cpu;
            if prev.is_none() {
                continue;
            }
            let stays = self.draft.out_of_tokens[i]
                || if self.layout.spread.uniform {
                    let fast = self.spread_stays_uniform(i, prev, load.busy);
                    debug_assert_eq!(
                        fast,
                        self.spread_stays_by_search(i, prev, load.busy),
                        "stay-test shortcut for vCPU {i}"
                    );
                    fast
                } else {
                    self.spread_stays_by_search(i, prev, load.busy)
                };
            self.spread.stay[i] = stays;
        }
        for i in 0..n {
            if !self.vcpus[i].cpu.is_none() && !self.spread.stay[i] {
                self.draft.unassign(&self.layout, i);
            }
        }
        for k in 0..self.draft.order.len() {
            let i = self.draft.order[k] as usize;
            if self.draft.placed(i) {
                continue;
            }
            let w = self.draft.weight[i];
            let best = self.least_loaded_cpu(w);
            let prev = self.vcpus[i].cpu;
            // Hysteresis: without it two vCPUs bigger than their fair share of
            // a core (few vCPUs on many cores) swap packages every time their
            // utils change order. Keep the previous CPU unless the least loaded
            // one is clearly better; a busy vCPU sharing a core while another
            // core is idle still moves (load + w vs w is clearly greater).
            let c = if !prev.is_none()
                && !self.clearly_better(
                    prev,
                    self.loads_around(prev),
                    best,
                    self.loads_around(best),
                    w,
                    loads[i].busy,
                ) {
                prev
            } else {
                best
            };
            self.draft.assign(&self.layout, i, c, loads[i].busy);
        }
    }

    /// The stay test by search: takes vCPU `i` off its previous CPU `prev`,
    /// finds the least loaded CPU, and puts `i` back. Any topology.
    fn spread_stays_by_search(&mut self, i: usize, prev: CpuIndex, busy: bool) -> bool {
        self.draft.unassign(&self.layout, i);
        let w = self.draft.weight[i];
        let best = self.least_loaded_cpu(w);
        let keep = !self.clearly_better(
            prev,
            self.loads_around(prev),
            best,
            self.loads_around(best),
            w,
            busy,
        );
        self.draft.assign(&self.layout, i, prev, busy);
        keep
    }

    /// The stay test on a uniform host ([`super::layout::SpreadCapacity::uniform`]),
    /// in constant time: comparing loads relative to equal capacities is
    /// comparing loads, so the least loaded CPU without vCPU `i` is the
    /// least loaded package / core / thread of [`Self::fill_spread_minima`],
    /// unless `i`'s own package / core / CPU, lighter by `i`'s weight, beats
    /// it. Gives the same answer as [`Self::spread_stays_by_search`] (debug
    /// builds check every call); it is most of a decision's work, run for
    /// every placed vCPU every tick.
    fn spread_stays_uniform(&self, i: usize, prev_cpu: CpuIndex, busy: bool) -> bool {
        let l = &self.layout;
        let s = &self.draft;
        let w = s.weight[i];
        let prev = prev_cpu.get();
        let (p, k) = (l.pkg_of(prev_cpu).get(), l.cpu_core[prev] as usize);
        // Everything `i` sits on, with `i` removed.
        let mine = LoadsAround {
            pkg: s.pkg_load[p] - w,
            core: s.core_load[k] - w,
            cpu: s.cpu_load[prev] - w,
        };
        let [min_pkg, next_min_pkg] = self.spread.min_pkg;
        // The least loaded package other than `i`'s own.
        let other = if min_pkg.get() == p {
            next_min_pkg
        } else {
            min_pkg
        };
        let best_pkg = if other.is_none() || (mine.pkg, p) < (s.pkg_load[other.get()], other.get())
        {
            p
        } else {
            other.get()
        };
        let min_core = self.spread.pkg_min_core[best_pkg] as usize;
        let best_core = if best_pkg == p && (mine.core, k) < (s.core_load[min_core], min_core) {
            k
        } else {
            min_core
        };
        let cpu_load = |c: usize| if c == prev { mine.cpu } else { s.cpu_load[c] };
        let cpus = l.core_cpu_start[best_core] as usize..l.core_cpu_start[best_core + 1] as usize;
        let mut best = cpus.start;
        for c in cpus {
            if cpu_load(c) < cpu_load(best) {
                best = c;
            }
        }
        if best == prev {
            return true;
        }
        let theirs = LoadsAround {
            pkg: if best_pkg == p {
                mine.pkg
            } else {
                s.pkg_load[best_pkg]
            },
            core: if best_core == k {
                mine.core
            } else {
                s.core_load[best_core]
            },
            cpu: cpu_load(best),
        };
        !self.clearly_better(prev_cpu, mine, CpuIndex(dense(best)), theirs, w, busy)
    }

    /// The loads around CPU `c` as placed now.
    fn loads_around(&self, c: CpuIndex) -> LoadsAround {
        let l = &self.layout;
        let s = &self.draft;
        LoadsAround {
            pkg: s.pkg_load[l.pkg_of(c).get()],
            core: s.core_load[l.cpu_core[c.get()] as usize],
            cpu: s.cpu_load[c.get()],
        }
    }

    /// Whether CPU `best` (with loads `theirs`) is clearly less loaded than
    /// CPU `prev` (with loads `mine`), relative to capacity and after adding
    /// `w`, at package, core or CPU level. The package level counts only for
    /// a vCPU that is `busy` now: a less loaded package (its cache, memory
    /// bandwidth, turbo headroom) helps a vCPU that runs, while an idle vCPU
    /// with a core of its own gains nothing by moving. Under bursty loads (a
    /// kernel build) idle vCPUs would otherwise leave a package every time a
    /// sibling bursts, several times a second.
    fn clearly_better(
        &self,
        prev: CpuIndex,
        mine: LoadsAround,
        best: CpuIndex,
        theirs: LoadsAround,
        w: u64,
        busy: bool,
    ) -> bool {
        if prev == best {
            return false;
        }
        let (prev, best) = (prev.get(), best.get());
        let l = &self.layout;
        let relative = || {
            let worse =
                |lp: u64, cp: u64, lb: u64, cb: u64| ratio_clearly_greater(lp + w, cp, lb + w, cb);
            let (pp, pb) = (l.cpu_pkg[prev].get(), l.cpu_pkg[best].get());
            let (kp, kb) = (l.cpu_core[prev] as usize, l.cpu_core[best] as usize);
            (busy
                && worse(
                    mine.pkg,
                    l.spread.pkg_cap[pp],
                    theirs.pkg,
                    l.spread.pkg_cap[pb],
                ))
                || worse(
                    mine.core,
                    l.spread.core_cap[kp],
                    theirs.core,
                    l.spread.core_cap[kb],
                )
                || worse(
                    mine.cpu,
                    l.spread.cpu_cap[prev],
                    theirs.cpu,
                    l.spread.cpu_cap[best],
                )
        };
        if !l.spread.equal_caps {
            return relative();
        }
        // Every package, core and CPU alike: capacities cancel out.
        let worse = |lp: u64, lb: u64| clearly_greater_load(lp + w, lb + w);
        let better = (busy && worse(mine.pkg, theirs.pkg))
            || worse(mine.core, theirs.core)
            || worse(mine.cpu, theirs.cpu);
        debug_assert_eq!(better, relative(), "equal-capacity shortcut");
        better
    }

    /// Least loaded package, then core in it, then thread in that (weights
    /// relative to capacity, after adding `w`); ties go to lower indices.
    fn least_loaded_cpu(&self, w: u64) -> CpuIndex {
        let best_pkg = self.least_loaded_package(w);
        let best_core = self.least_loaded_core(best_pkg, w);
        self.least_loaded_thread(best_core, w)
    }

    /// Fills `spread.min_pkg` (the least and second least loaded packages)
    /// and `spread.pkg_min_core` (each package's least loaded core)
    /// by load, lowest index on ties, under the current placement. Only
    /// meaningful on a uniform host, where load order is capacity order.
    fn fill_spread_minima(&mut self) {
        let l = &self.layout;
        let load = &self.draft.pkg_load;
        let s = &mut self.spread;
        let mut min = [PkgIndex::NONE; 2];
        for p in l.pkgs() {
            let key = |q: PkgIndex| (load[q.get()], q);
            if min[0].is_none() || key(p) < key(min[0]) {
                min = [p, min[0]];
            } else if min[1].is_none() || key(p) < key(min[1]) {
                min[1] = p;
            }
        }
        s.min_pkg = min;
        reset(&mut s.pkg_min_core, l.num_pkgs(), 0);
        for p in 0..l.num_pkgs() {
            let cores = l.pkg_core_start[p] as usize..l.pkg_core_start[p + 1] as usize;
            let mut best = cores.start;
            for core in cores {
                if self.draft.core_load[core] < self.draft.core_load[best] {
                    best = core;
                }
            }
            s.pkg_min_core[p] = dense(best);
        }
    }

    /// The least loaded package for weight `w` (relative to capacity).
    fn least_loaded_package(&self, w: u64) -> usize {
        let l = &self.layout;
        least_loaded(
            0..l.num_pkgs(),
            &self.draft.pkg_load,
            &l.spread.pkg_cap,
            w,
            l.spread.uniform_pkgs,
        )
    }

    /// The least loaded core of package `p` for weight `w`.
    fn least_loaded_core(&self, p: usize, w: u64) -> usize {
        let l = &self.layout;
        least_loaded(
            l.pkg_core_start[p] as usize..l.pkg_core_start[p + 1] as usize,
            &self.draft.core_load,
            &l.spread.core_cap,
            w,
            l.spread.pkg_uniform_cores[p],
        )
    }

    /// The least loaded thread of core `core` for weight `w`.
    fn least_loaded_thread(&self, core: usize, w: u64) -> CpuIndex {
        let l = &self.layout;
        let best = least_loaded(
            l.core_cpu_start[core] as usize..l.core_cpu_start[core + 1] as usize,
            &self.draft.cpu_load,
            &l.spread.cpu_cap,
            w,
            l.spread.core_uniform_threads[core],
        );
        CpuIndex(dense(best))
    }
}

/// The member of `members` (a range of indices into `load` and `cap`) whose
/// load plus `w` is least relative to its capacity, the lowest index on ties;
/// with `equal_caps` (the usual case) simply the least loaded. Empty ranges
/// give their start.
fn least_loaded(
    members: std::ops::Range<usize>,
    load: &[u64],
    cap: &[u64],
    w: u64,
    equal_caps: bool,
) -> usize {
    let mut best = members.start;
    if equal_caps {
        let loads = &load[members.clone()];
        let Some(mut best_load) = loads.first().copied() else {
            return best;
        };
        for (k, l) in loads.iter().enumerate().skip(1) {
            if *l < best_load {
                best_load = *l;
                best = members.start + k;
            }
        }
    } else {
        for i in members {
            if ratio_less(load[i] + w, cap[i], load[best] + w, cap[best]) {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearly_greater_needs_the_margin_and_survives_huge_values() {
        // 1078/1024 is the margin: 1079 vs 1024 is clearly greater, 1078 is not.
        assert!(ratio_clearly_greater(1079, 1, 1024, 1));
        assert!(!ratio_clearly_greater(1078, 1, 1024, 1));
        // Capacities scale the comparison.
        assert!(ratio_clearly_greater(600, 1024, 1000, 2048));
        assert!(!ratio_clearly_greater(500, 1024, 1000, 2048));
        // Products beyond u64 fall back to exact arithmetic.
        let big = 1u64 << 40;
        assert!(ratio_clearly_greater(big + big / 8, 1 << 30, big, 1 << 30));
        assert!(!ratio_clearly_greater(
            big + big / 32,
            1 << 30,
            big,
            1 << 30
        ));
        // A zero capacity counts as 1.
        assert!(ratio_clearly_greater(10, 0, 1, 1));
    }
}
