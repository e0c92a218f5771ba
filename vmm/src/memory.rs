//! Guest RAM: its regions (RAM split around the 32-bit MMIO hole) and the e820 map the guest
//! is given.

use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::layout::{
    ACPI_TABLES_MAX_SIZE, ACPI_TABLES_START, EBDA_START, HIMEM_START, MMIO_GAP_END, MMIO_GAP_START,
};

/// Guest memory as pvmm maps it.
pub type GuestMemory = GuestMemoryMmap<()>;

/// Errors from setting up guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The host could not map guest RAM.
    #[error("cannot allocate {mib} MiB of guest memory: {source}")]
    Allocate {
        /// Requested size.
        mib: u64,
        /// Why the mapping failed.
        source: vm_memory::mmap::FromRangesError,
    },
}

/// The e820 entry types pvmm uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum E820Type {
    /// Usable RAM.
    Ram = 1,
    /// Reserved (firmware area, ACPI tables live here).
    Reserved = 2,
}

/// One e820 entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// What the range is.
    pub kind: E820Type,
}

const _: () = assert!(usize::BITS == 64, "pvmm runs on 64-bit hosts");

/// The RAM regions (start, length) backing `mem_size` bytes of guest memory: everything below
/// the MMIO hole, the rest above 4 GiB.
// usize is 64 bits on every host pvmm builds for (asserted above).
#[allow(clippy::cast_possible_truncation)]
pub fn ram_regions(mem_size: u64) -> Vec<(GuestAddress, usize)> {
    let low = mem_size.min(MMIO_GAP_START);
    let mut regions = vec![(GuestAddress(0), low as usize)];
    if mem_size > MMIO_GAP_START {
        regions.push((GuestAddress(MMIO_GAP_END), (mem_size - low) as usize));
    }
    regions
}

/// Maps guest RAM.
pub fn create_guest_memory(mem_size: u64) -> Result<GuestMemory, MemoryError> {
    GuestMemoryMmap::from_ranges(&ram_regions(mem_size)).map_err(|source| MemoryError::Allocate {
        mib: mem_size >> 20,
        source,
    })
}

/// The e820 map for `mem_size` bytes of RAM: conventional memory below the EBDA, the BIOS area
/// holding the ACPI tables as reserved, and the rest of RAM from 1 MiB (split by the MMIO hole).
pub fn e820_map(mem_size: u64) -> Vec<E820Entry> {
    let mut map = vec![
        E820Entry {
            addr: 0,
            size: EBDA_START,
            kind: E820Type::Ram,
        },
        E820Entry {
            addr: ACPI_TABLES_START,
            size: ACPI_TABLES_MAX_SIZE,
            kind: E820Type::Reserved,
        },
    ];
    let low_end = mem_size.min(MMIO_GAP_START);
    if low_end > HIMEM_START {
        map.push(E820Entry {
            addr: HIMEM_START,
            size: low_end - HIMEM_START,
            kind: E820Type::Ram,
        });
    }
    if mem_size > MMIO_GAP_START {
        map.push(E820Entry {
            addr: MMIO_GAP_END,
            size: mem_size - MMIO_GAP_START,
            kind: E820Type::Ram,
        });
    }
    map
}

/// The highest guest address below 4 GiB that is RAM, plus one.
pub fn low_ram_end(mem_size: u64) -> u64 {
    mem_size.min(MMIO_GAP_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_has_no_high_region() {
        let mib = 1 << 20;
        let map = e820_map(512 * mib);
        assert_eq!(map.len(), 3);
        assert_eq!(map[0].addr, 0);
        assert_eq!(map[0].size, EBDA_START);
        assert_eq!(map[1].kind, E820Type::Reserved);
        assert_eq!(map[2].addr, HIMEM_START);
        assert_eq!(map[2].addr + map[2].size, 512 * mib);
        assert_eq!(ram_regions(512 * mib), vec![(GuestAddress(0), 512 << 20)]);
    }

    #[test]
    fn large_memory_is_split_around_the_mmio_hole() {
        let mem = 4u64 << 30;
        let map = e820_map(mem);
        let ram: u64 = map
            .iter()
            .filter(|e| e.kind == E820Type::Ram)
            .map(|e| e.size)
            .sum();
        // All RAM but the 640 KiB..1 MiB hole is reported.
        assert_eq!(ram, mem - (HIMEM_START - EBDA_START));
        let high = map.last().unwrap();
        assert_eq!(high.addr, MMIO_GAP_END);
        assert_eq!(high.size, mem - MMIO_GAP_START);
        // No RAM entry overlaps the MMIO hole.
        for e in &map {
            assert!(e.addr + e.size <= MMIO_GAP_START || e.addr >= MMIO_GAP_END);
        }
        let regions = ram_regions(mem);
        assert_eq!(regions.len(), 2);
        assert_eq!(regions[1].0, GuestAddress(MMIO_GAP_END));
    }

    #[test]
    fn entries_are_sorted_and_disjoint() {
        for mib in [64u64, 512, 3072, 3073, 8192] {
            let map = e820_map(mib << 20);
            for w in map.windows(2) {
                assert!(w[0].addr + w[0].size <= w[1].addr, "{mib} MiB: {map:?}");
            }
        }
    }
}
