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
    /// Room for every vector at `sizes`.
    pub(super) fn reserve(&mut self, sizes: ScratchSizes) {
        reserve_len(&mut self.weight, sizes.vcpus);
        reserve_len(&mut self.order, sizes.vcpus);
        reserve_len(&mut self.buckets, CAPACITY_SCALE as usize + 2);
        reserve_len(&mut self.new_cpu, sizes.vcpus);
        reserve_len(&mut self.out_of_tokens, sizes.vcpus);
        reserve_len(&mut self.cpu_load, sizes.cpus);
        reserve_len(&mut self.core_load, sizes.cores);
        reserve_len(&mut self.pkg_load, sizes.pkgs);
        reserve_len(&mut self.cpu_count, sizes.cpus);
        reserve_len(&mut self.cpu_busy, sizes.cpus);
        reserve_len(&mut self.core_busy, sizes.cores);
        reserve_len(&mut self.cpu_offer, sizes.cpus);
        reserve_len(&mut self.pkg_cpus, sizes.pkgs);
    }

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

/// The largest length each scratch vector takes in a decision over these vCPUs, VMs and
/// host: reserving that much when the vCPU list or the layout changes means that no
/// decision path allocates the first time it runs (spread mode first used after minutes of
/// packing, a first migration).
#[derive(Debug, Clone, Copy)]
pub(super) struct ScratchSizes {
    pub(super) vcpus: usize,
    pub(super) vms: usize,
    pub(super) cpus: usize,
    pub(super) cores: usize,
    pub(super) pkgs: usize,
}

/// Gives `v` room for `len` items, so that a later [`reset`] to at most `len` keeps its
/// memory.
pub(super) fn reserve_len<T>(v: &mut Vec<T>, len: usize) {
    v.reserve(len.saturating_sub(v.len()));
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
