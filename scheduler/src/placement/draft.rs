//! The decision being built: each vCPU's weight and new CPU, and the loads
//! the placed vCPUs put on every CPU, core and package. Both modes fill it;
//! [`super::Engine::finish`] turns it into a [`super::Decision`].

use crate::capacity::{CpuOffer, CAPACITY_SCALE};
use crate::cpuset::CpuSet;

use super::index::{dense, CpuIndex};
use super::layout::Layout;

/// Buffers reused across decisions so that a decision allocates little.
#[derive(Debug, Clone, Default)]
pub(super) struct Draft {
    /// Each vCPU's weight: its demand, at least [`super::MIN_VCPU_WEIGHT`] (set by
    /// [`super::Engine`] before [`Draft::begin`]).
    pub(super) weight: Vec<u64>,
    /// vCPU indices by descending weight, ties in input order.
    pub(super) order: Vec<u32>,
    /// Counting sort buckets for `order`.
    buckets: Vec<u32>,
    /// Each vCPU's CPU in this decision, [`CpuIndex::NONE`] until placed.
    pub(super) new_cpu: Vec<CpuIndex>,
    /// vCPUs that were placed before and have no migration token left: they
    /// stay on their CPU whatever the policy wants.
    pub(super) out_of_tokens: Vec<bool>,
    /// Sum of the weights placed on each CPU, core and package (a package's
    /// also holds the housekeeping load counted on it, `super::housekeeping`).
    pub(super) cpu_load: Vec<u64>,
    pub(super) core_load: Vec<u64>,
    pub(super) pkg_load: Vec<u64>,
    /// vCPUs placed on each CPU.
    pub(super) cpu_count: Vec<u32>,
    /// Whether a busy vCPU is placed on each CPU (recomputed in `finish`).
    pub(super) cpu_busy: Vec<bool>,
    /// `finish`: busy CPUs of each core, for SMT sharing.
    pub(super) core_busy: Vec<u32>,
    /// `finish`: what each CPU offers its vCPUs.
    pub(super) cpu_offer: Vec<CpuOffer>,
    /// `finish`, sharing packages: the CPUs each package uses.
    pub(super) pkg_cpus: Vec<CpuSet>,
}

impl Draft {
    /// Empties the draft on `layout`: nothing placed, and the vCPUs ordered
    /// by the weights already set.
    pub(super) fn begin(&mut self, layout: &Layout) {
        let (num_cpus, num_cores) = (layout.num_cpus(), layout.num_cores());
        reset(&mut self.cpu_load, num_cpus, 0);
        reset(&mut self.cpu_count, num_cpus, 0);
        reset(&mut self.cpu_busy, num_cpus, false);
        reset(&mut self.core_load, num_cores, 0);
        reset(&mut self.core_busy, num_cores, 0);
        reset(&mut self.pkg_load, layout.num_pkgs(), 0);
        reset(&mut self.new_cpu, self.weight.len(), CpuIndex::NONE);
        counting_sort_desc(&self.weight, &mut self.order, &mut self.buckets);
    }

    /// Records vCPU `i` on CPU `c` in the loads of that CPU, its core and its
    /// package (all that spread mode tracks).
    pub(super) fn assign(&mut self, l: &Layout, i: usize, c: CpuIndex, busy: bool) {
        let w = self.weight[i];
        let cu = c.get();
        self.new_cpu[i] = c;
        self.cpu_load[cu] += w;
        self.cpu_count[cu] += 1;
        self.cpu_busy[cu] |= busy;
        self.core_load[l.cpu_core[cu] as usize] += w;
        self.pkg_load[l.pkg_of(c).get()] += w;
    }

    /// Undoes [`Draft::assign`] (no-op for a vCPU not placed).
    pub(super) fn unassign(&mut self, l: &Layout, i: usize) {
        let c = self.new_cpu[i];
        if c.is_none() {
            return;
        }
        let w = self.weight[i];
        let cu = c.get();
        self.new_cpu[i] = CpuIndex::NONE;
        self.cpu_load[cu] -= w;
        self.cpu_count[cu] -= 1;
        self.core_load[l.cpu_core[cu] as usize] -= w;
        self.pkg_load[l.pkg_of(c).get()] -= w;
        // cpu_busy is recomputed in `finish`.
    }

    /// Whether vCPU `i` has a CPU in this decision yet.
    pub(super) fn placed(&self, i: usize) -> bool {
        !self.new_cpu[i].is_none()
    }
}

/// Clears `v` and fills it with `len` copies of `value`, keeping its memory.
pub(super) fn reset<T: Copy>(v: &mut Vec<T>, len: usize, value: T) {
    v.clear();
    v.resize(len, value);
}

/// Indices of `weights` by descending weight, ties in index order (stable):
/// a counting sort over the 0..=1024 range, O(n) and allocation-free once warm.
fn counting_sort_desc(weights: &[u64], order: &mut Vec<u32>, buckets: &mut Vec<u32>) {
    let top = CAPACITY_SCALE as usize;
    reset(buckets, top + 2, 0);
    for w in weights {
        buckets[top - usize::try_from(*w).map_or(top, |w| w.min(top)) + 1] += 1;
    }
    for b in 1..buckets.len() {
        buckets[b] += buckets[b - 1];
    }
    reset(order, weights.len(), 0);
    for (i, w) in weights.iter().enumerate() {
        let b = top - usize::try_from(*w).map_or(top, |w| w.min(top));
        order[buckets[b] as usize] = dense(i);
        buckets[b] += 1;
    }
}
