//! Dense indices into the engine's flattened topology ([`super::layout::Layout`]).
//!
//! A host names its CPUs and packages by ids (`/sys/devices/system/cpu/cpuN`,
//! `physical_package_id`) that may have gaps; the engine works on dense
//! indices in topology order. The two kinds of number are both integers, so
//! each dense index has its own type and ids stay plain `u32`: an id can only
//! come out of the layout ([`super::layout::Layout::cpu_id`],
//! [`super::layout::Layout::pkg_id`]), never be used as an index by mistake.

/// A host CPU's dense index: package, core, thread order, so each package's
/// and each core's CPUs form a contiguous range. Not the CPU id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct CpuIndex(pub(super) u32);

impl CpuIndex {
    /// "No CPU": a vCPU not placed (yet).
    pub(super) const NONE: CpuIndex = CpuIndex(u32::MAX);

    /// The index, for indexing per-CPU arrays.
    pub(super) fn get(self) -> usize {
        self.0 as usize
    }

    pub(super) fn is_none(self) -> bool {
        self == CpuIndex::NONE
    }
}

/// A package's dense index, in topology order. Not the package id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct PkgIndex(pub(super) u32);

impl PkgIndex {
    /// "No package": a VM with no home yet, or fewer packages than asked for.
    pub(super) const NONE: PkgIndex = PkgIndex(u32::MAX);

    /// The index, for indexing per-package arrays.
    pub(super) fn get(self) -> usize {
        self.0 as usize
    }

    pub(super) fn is_none(self) -> bool {
        self == PkgIndex::NONE
    }
}

/// `i` as a dense u32 index or count: of a CPU, core or package of the layout, or of a VM
/// or vCPU of the loads.
// Every array the engine indexes stays far below 2^32 entries: the layout's hold a
// topology's CPUs, cores and packages (fewer than its distinct u32 CPU ids), and 2^32 vCPUs'
// loads would not fit a host's memory.
#[allow(clippy::cast_possible_truncation)]
pub(super) fn dense(i: usize) -> u32 {
    i as u32
}
