//! The CPUID each vCPU sees: the host's KVM-supported leaves, with a topology that matches
//! the vCPU count and the MADT (one package, `N` cores, one thread per core, APIC id = vCPU
//! index).
//!
//! pvmm moves vCPU threads between host packages at run time, so the guest must not believe in
//! any host topology: it sees one flat package, and learns what each vCPU really gets through
//! ACPI (capacity), not through CPUID.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

/// Leaf 0x1, EBX: initial APIC id in bits 31..24, logical processor count in bits 23..16.
const LEAF1_EBX_APIC_ID_SHIFT: u32 = 24;
const LEAF1_EBX_LOGICAL_COUNT_SHIFT: u32 = 16;
const LEAF1_EBX_LOW_MASK: u32 = 0xffff;
/// Leaf 0x1, EDX bit 28: HTT (more than one logical processor per package).
const LEAF1_EDX_HTT: u32 = 1 << 28;
/// Leaf 0x1, ECX bit 31: running under a hypervisor.
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 0xB: extended topology enumeration; level types in ECX[15:8].
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
/// Leaf 0x1F: V2 extended topology; dropped so the guest uses 0xB only.
const LEAF_EXT_TOPOLOGY_V2: u32 = 0x1f;
const TOPOLOGY_LEVEL_SMT: u32 = 1;
const TOPOLOGY_LEVEL_CORE: u32 = 2;
const TOPOLOGY_LEVEL_TYPE_SHIFT: u32 = 8;
/// Leaf 0x4 (Intel deterministic cache parameters), EAX[31:26]: cores per package - 1.
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF4_EAX_CORES_SHIFT: u32 = 26;
const LEAF4_EAX_CORES_MASK: u32 = 0x3f << LEAF4_EAX_CORES_SHIFT;
/// Leaf 0x8000_0001, ECX bit 1: CmpLegacy (AMD: HTT counts cores, not threads).
const LEAF_EXT_FEATURES: u32 = 0x8000_0001;
const EXT_ECX_CMP_LEGACY: u32 = 1 << 1;
/// Leaf 0x8000_0008, ECX: NC (cores - 1) in bits 7..0, ApicIdCoreIdSize in bits 15..12.
const LEAF_AMD_SIZE_IDS: u32 = 0x8000_0008;
const AMD_ECX_APIC_ID_SIZE_SHIFT: u32 = 12;
/// Leaf 0x8000_001E (AMD topology extensions): extended APIC id, core id, node id.
const LEAF_AMD_TOPOLOGY: u32 = 0x8000_001e;

/// Bits of the APIC id that number cores: enough for `vcpus` distinct ids.
pub fn core_id_bits(vcpus: u32) -> u32 {
    vcpus.max(1).next_power_of_two().trailing_zeros()
}

/// Rewrites `cpuid` (the KVM-supported set) for vCPU `index` of `vcpus`.
pub fn configure_cpuid(cpuid: &mut CpuId, index: u32, vcpus: u32) -> Result<(), CpuidError> {
    let apic_id = index;
    let shift = core_id_bits(vcpus);
    for entry in cpuid.as_mut_slice().iter_mut() {
        match entry.function {
            0 => entry.eax = entry.eax.max(LEAF_EXT_TOPOLOGY),
            1 => {
                entry.ebx = (apic_id << LEAF1_EBX_APIC_ID_SHIFT)
                    | ((1u32 << shift).min(0xff) << LEAF1_EBX_LOGICAL_COUNT_SHIFT)
                    | (entry.ebx & LEAF1_EBX_LOW_MASK);
                if vcpus > 1 {
                    entry.edx |= LEAF1_EDX_HTT;
                } else {
                    entry.edx &= !LEAF1_EDX_HTT;
                }
                entry.ecx |= LEAF1_ECX_HYPERVISOR;
            }
            LEAF_CACHE_PARAMS => {
                entry.eax = (entry.eax & !LEAF4_EAX_CORES_MASK)
                    | ((((1u32 << shift) - 1) << LEAF4_EAX_CORES_SHIFT) & LEAF4_EAX_CORES_MASK);
            }
            LEAF_EXT_FEATURES => {
                if vcpus > 1 {
                    entry.ecx |= EXT_ECX_CMP_LEGACY;
                } else {
                    entry.ecx &= !EXT_ECX_CMP_LEGACY;
                }
            }
            LEAF_AMD_SIZE_IDS => {
                entry.ecx = (shift << AMD_ECX_APIC_ID_SIZE_SHIFT) | (vcpus - 1);
            }
            LEAF_AMD_TOPOLOGY => {
                entry.eax = apic_id;
                entry.ebx = index & 0xff; // core id; threads per core - 1 = 0 in bits 15..8
                entry.ecx = 0; // node 0, one node per package
                entry.edx = 0;
            }
            _ => {}
        }
    }
    // Replace whatever extended topology the host reported with ours.
    let kept: Vec<kvm_cpuid_entry2> = cpuid
        .as_slice()
        .iter()
        .filter(|e| e.function != LEAF_EXT_TOPOLOGY && e.function != LEAF_EXT_TOPOLOGY_V2)
        .copied()
        .collect();
    let mut entries = kept;
    entries.extend(extended_topology_entries(apic_id, vcpus));
    *cpuid = CpuId::from_entries(&entries).map_err(|_| CpuidError::TooManyEntries)?;
    Ok(())
}

/// Leaf 0xB subleaves: SMT level (1 thread), core level (`vcpus` cores), then the terminator.
pub fn extended_topology_entries(apic_id: u32, vcpus: u32) -> [kvm_cpuid_entry2; 3] {
    let leaf = |index: u32, eax: u32, ebx: u32, level_type: u32| kvm_cpuid_entry2 {
        function: LEAF_EXT_TOPOLOGY,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax,
        ebx,
        ecx: (level_type << TOPOLOGY_LEVEL_TYPE_SHIFT) | index,
        edx: apic_id,
        ..Default::default()
    };
    [
        leaf(0, 0, 1, TOPOLOGY_LEVEL_SMT),
        leaf(1, core_id_bits(vcpus), vcpus, TOPOLOGY_LEVEL_CORE),
        leaf(2, 0, 0, 0),
    ]
}

/// Errors from building a vCPU's CPUID.
#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    /// More entries than KVM accepts.
    #[error("too many CPUID entries")]
    TooManyEntries,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            ..Default::default()
        }
    }

    #[test]
    fn core_bits() {
        assert_eq!(core_id_bits(1), 0);
        assert_eq!(core_id_bits(2), 1);
        assert_eq!(core_id_bits(3), 2);
        assert_eq!(core_id_bits(8), 3);
        assert_eq!(core_id_bits(255), 8);
    }

    #[test]
    fn topology_is_consistent() {
        let mut cpuid = CpuId::from_entries(&[
            entry(0),
            entry(1),
            kvm_cpuid_entry2 {
                function: 0xb,
                index: 0,
                ebx: 77,
                ..Default::default()
            },
            entry(0x8000_0001),
            entry(0x8000_0008),
            entry(0x8000_001e),
        ])
        .unwrap();
        configure_cpuid(&mut cpuid, 5, 6).unwrap();
        let find = |f: u32, i: u32| {
            *cpuid
                .as_slice()
                .iter()
                .find(|e| e.function == f && e.index == i)
                .unwrap()
        };
        let l1 = find(1, 0);
        assert_eq!(l1.ebx >> 24, 5);
        assert_eq!((l1.ebx >> 16) & 0xff, 8);
        assert_ne!(l1.edx & LEAF1_EDX_HTT, 0);
        let core = find(0xb, 1);
        assert_eq!((core.eax, core.ebx, core.edx), (3, 6, 5));
        assert_eq!((core.ecx >> 8) & 0xff, TOPOLOGY_LEVEL_CORE);
        assert_eq!(
            cpuid
                .as_slice()
                .iter()
                .filter(|e| e.function == 0xb)
                .count(),
            3
        );
        assert_eq!(find(0x8000_0008, 0).ecx, (3 << 12) | 5);
        assert_eq!(find(0x8000_001e, 0).ebx, 5);
        assert!(find(0, 0).eax >= 0xb);
    }

    #[test]
    fn single_vcpu_has_no_htt() {
        let mut cpuid = CpuId::from_entries(&[entry(1)]).unwrap();
        cpuid.as_mut_slice()[0].edx = LEAF1_EDX_HTT;
        configure_cpuid(&mut cpuid, 0, 1).unwrap();
        assert_eq!(cpuid.as_slice()[0].edx & LEAF1_EDX_HTT, 0);
    }
}
