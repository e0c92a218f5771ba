//! The boot vCPU's initial register state for each entry path, and the state every vCPU needs
//! (FPU, MSRs, local APIC LINT pins).

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use super::EntryPoint;
use crate::layout::{
    BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, PDE_START, PDPTE_START, PML4_START,
};
use crate::memory::GuestMemory;

/// Errors from programming a vCPU's registers.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// A KVM register ioctl failed.
    #[error("cannot set vCPU {what}: {source}")]
    Kvm {
        /// Which state.
        what: &'static str,
        /// The ioctl error.
        source: kvm_ioctls::Error,
    },
    /// Writing GDT or page tables into guest memory failed.
    #[error("cannot write boot tables into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// CR0.PE: protected mode.
const X86_CR0_PE: u64 = 1 << 0;
/// CR0.ET: extension type, hard-wired to 1 on every CPU since the 486.
const X86_CR0_ET: u64 = 1 << 4;
/// CR0.PG: paging.
const X86_CR0_PG: u64 = 1 << 31;
/// CR4.PAE: needed for long mode.
const X86_CR4_PAE: u64 = 1 << 5;
/// EFER.LME / EFER.LMA: long mode enabled / active.
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// RFLAGS bit 1 is reserved and always set.
const RFLAGS_RESERVED: u64 = 1 << 1;
/// Page-table entry bits: present, writable, and (in a page directory) 2 MiB page.
const PTE_PRESENT_RW: u64 = 0b11;
const PDE_PAGE_SIZE: u64 = 1 << 7;
/// 2 MiB: the page size of the boot identity map.
const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// Entries per page-table page.
const PT_ENTRIES: u64 = 512;

/// GDT selectors (index << 3): null, 64-bit code, 32-bit code, data, TSS.
const GDT_CODE64: u16 = 1 << 3;
const GDT_CODE32: u16 = 2 << 3;
const GDT_DATA: u16 = 3 << 3;
const GDT_TSS: u16 = 4 << 3;

/// FPU control word after FNINIT (all exceptions masked, extended precision).
const FPU_FCW_DEFAULT: u16 = 0x37f;
/// MXCSR after reset (all SSE exceptions masked).
const MXCSR_DEFAULT: u32 = 0x1f80;

/// MSRs zeroed at boot so no stale host-side value leaks into the guest's first instructions.
/// The TSC is deliberately not written: KVM synchronizes the vCPUs' TSCs at creation, and
/// writing it per vCPU at slightly different times makes Linux mark the TSC unstable.
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// IA32_MISC_ENABLE with "fast strings" set, what firmware leaves for the OS.
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;

/// Local APIC register offsets and delivery modes for LINT0 and LINT1. LINT1 carries NMIs, as
/// on a PC. LINT0 is the 8259 PIC's path (ExtINT); pvmm's platform has no PIC in use
/// (hardware-reduced ACPI, GSIs routed to the IOAPIC only), so LINT0 is left masked.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;
const APIC_DELIVERY_MODE_SHIFT: u32 = 8;
const APIC_DELIVERY_MODE_MASK: u32 = 0x7 << APIC_DELIVERY_MODE_SHIFT;

/// A GDT descriptor from flags, base and limit (Intel SDM vol. 3, 3.4.5).
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The boot GDT: null, 64-bit code, 32-bit code, flat data, TSS.
pub const BOOT_GDT: [u64; 5] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff), // 64-bit code: L=1, present, exec/read, accessed
    gdt_entry(0xc09b, 0, 0xfffff), // 32-bit code: D=1, G=1
    gdt_entry(0xc093, 0, 0xfffff), // data: D=1, G=1, read/write, accessed
    gdt_entry(0x808b, 0, 0xfffff), // TSS, busy
];

/// Turns a GDT entry into the segment register value KVM wants.
pub fn segment_from_gdt(entry: u64, table_index: u16) -> kvm_segment {
    let base = ((entry >> 16) & 0xff_ffff) | ((entry >> 32) & 0xff00_0000);
    let limit = u32::try_from((entry & 0xffff) | ((entry >> 32) & 0xf_0000)).unwrap_or(0xf_ffff);
    let g = ((entry >> 55) & 1) as u8;
    kvm_segment {
        base,
        // With G=1 the limit counts 4 KiB pages.
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector: table_index << 3,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 0x3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
        unusable: u8::from((entry >> 47) & 1 == 0),
        padding: 0,
    }
}

fn write_gdt_idt(mem: &GuestMemory) -> Result<(), RegsError> {
    for (i, entry) in BOOT_GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(BOOT_GDT_START + (i as u64) * 8))
            .map_err(RegsError::GuestMemory)?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(RegsError::GuestMemory)
}

/// Identity-maps the first GiB with 2 MiB pages (PML4 -> PDPT -> PD).
fn write_identity_page_tables(mem: &GuestMemory) -> Result<(), RegsError> {
    let w = |v: u64, at: u64| {
        mem.write_obj(v, GuestAddress(at))
            .map_err(RegsError::GuestMemory)
    };
    w(PDPTE_START | PTE_PRESENT_RW, PML4_START)?;
    w(PDE_START | PTE_PRESENT_RW, PDPTE_START)?;
    for i in 0..PT_ENTRIES {
        w(
            (i * HUGE_PAGE_SIZE) | PTE_PRESENT_RW | PDE_PAGE_SIZE,
            PDE_START + i * 8,
        )?;
    }
    Ok(())
}

/// Special registers for the entry path: long mode with paging for a bzImage, flat 32-bit
/// protected mode without paging for PVH.
pub fn boot_sregs(mut sregs: kvm_sregs, entry: &EntryPoint) -> kvm_sregs {
    let (code, code_index) = match entry {
        EntryPoint::Linux64 { .. } => (BOOT_GDT[1], GDT_CODE64 >> 3),
        EntryPoint::Pvh32 { .. } => (BOOT_GDT[2], GDT_CODE32 >> 3),
    };
    let data = segment_from_gdt(BOOT_GDT[3], GDT_DATA >> 3);
    sregs.cs = segment_from_gdt(code, code_index);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_gdt(BOOT_GDT[4], GDT_TSS >> 3);
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = u16::try_from(std::mem::size_of_val(&BOOT_GDT) - 1).unwrap_or(u16::MAX);
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = u16::try_from(std::mem::size_of::<u64>() - 1).unwrap_or(u16::MAX);
    match entry {
        EntryPoint::Linux64 { .. } => {
            sregs.cr0 = X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
            sregs.cr3 = PML4_START;
            sregs.cr4 = X86_CR4_PAE;
            sregs.efer = EFER_LME | EFER_LMA;
        }
        EntryPoint::Pvh32 { .. } => {
            sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
            sregs.cr3 = 0;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
    }
    sregs
}

/// General registers for the entry path.
pub fn boot_regs(entry: &EntryPoint) -> kvm_regs {
    let mut regs = kvm_regs {
        rflags: RFLAGS_RESERVED,
        ..Default::default()
    };
    match *entry {
        EntryPoint::Linux64 { rip, zero_page } => {
            regs.rip = rip;
            regs.rsi = zero_page;
            regs.rsp = BOOT_STACK_POINTER;
            regs.rbp = BOOT_STACK_POINTER;
        }
        EntryPoint::Pvh32 { eip, start_info } => {
            regs.rip = eip;
            regs.rbx = start_info;
        }
    }
    regs
}

/// Writes the boot tables and programs the boot vCPU for `entry`.
pub fn setup_boot_vcpu(
    vcpu: &VcpuFd,
    mem: &GuestMemory,
    entry: &EntryPoint,
) -> Result<(), RegsError> {
    write_gdt_idt(mem)?;
    if matches!(entry, EntryPoint::Linux64 { .. }) {
        write_identity_page_tables(mem)?;
    }
    let kvm = |what| move |source| RegsError::Kvm { what, source };
    let sregs = vcpu.get_sregs().map_err(kvm("special registers"))?;
    vcpu.set_sregs(&boot_sregs(sregs, entry))
        .map_err(kvm("special registers"))?;
    vcpu.set_regs(&boot_regs(entry))
        .map_err(kvm("general registers"))?;
    Ok(())
}

/// State every vCPU (boot or not) starts with: FPU, MSRs and the local APIC's LINT pins.
pub fn setup_common_vcpu_state(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let kvm = |what| move |source| RegsError::Kvm { what, source };
    let fpu = kvm_fpu {
        fcw: FPU_FCW_DEFAULT,
        mxcsr: MXCSR_DEFAULT,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm("FPU"))?;

    let entries: Vec<kvm_msr_entry> = [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
    ]
    .iter()
    .map(|&(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect();
    let msrs = Msrs::from_entries(&entries).map_err(|_| RegsError::Kvm {
        what: "MSRs",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    })?;
    vcpu.set_msrs(&msrs).map_err(kvm("MSRs"))?;

    let mut lapic = vcpu.get_lapic().map_err(kvm("local APIC"))?;
    set_lvt_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
    set_lvt_masked(&mut lapic.regs, APIC_LVT0);
    set_lvt_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
    vcpu.set_lapic(&lapic).map_err(kvm("local APIC"))
}

/// LVT mask bit.
const APIC_LVT_MASKED: u32 = 1 << 16;

fn set_lvt_masked(regs: &mut [std::os::raw::c_char], offset: usize) {
    update_lvt(regs, offset, |v| v | APIC_LVT_MASKED);
}

fn set_lvt_mode(regs: &mut [std::os::raw::c_char], offset: usize, mode: u32) {
    update_lvt(regs, offset, |v| {
        (v & !APIC_DELIVERY_MODE_MASK) | (mode << APIC_DELIVERY_MODE_SHIFT)
    });
}

fn update_lvt(regs: &mut [std::os::raw::c_char], offset: usize, f: impl Fn(u32) -> u32) {
    let Some(bytes) = regs.get_mut(offset..offset + 4) else {
        return;
    };
    let mut raw = [0u8; 4];
    for (r, b) in raw.iter_mut().zip(bytes.iter()) {
        *r = u8::from_ne_bytes(b.to_ne_bytes());
    }
    let value = f(u32::from_le_bytes(raw));
    for (b, r) in bytes.iter_mut().zip(value.to_le_bytes()) {
        *b = std::os::raw::c_char::from_ne_bytes([r]);
    }
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_sign_loss)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode_to_flat_segments() {
        let code = segment_from_gdt(BOOT_GDT[1], 1);
        assert_eq!(code.l, 1);
        assert_eq!(code.db, 0);
        assert_eq!(code.base, 0);
        assert_eq!(code.limit, 0xffff_ffff);
        assert_eq!(code.present, 1);
        assert_eq!(code.selector, GDT_CODE64);
        let code32 = segment_from_gdt(BOOT_GDT[2], 2);
        assert_eq!((code32.l, code32.db), (0, 1));
        let data = segment_from_gdt(BOOT_GDT[3], 3);
        assert_eq!(data.type_, 0x3);
        assert_eq!(data.s, 1);
        let null = segment_from_gdt(0, 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn long_mode_and_pvh_register_state() {
        let lm = EntryPoint::Linux64 {
            rip: 0x100200,
            zero_page: 0x7000,
        };
        let s = boot_sregs(kvm_sregs::default(), &lm);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_ne!(s.cr0 & X86_CR0_PG, 0);
        assert_eq!(s.cr3, PML4_START);
        let r = boot_regs(&lm);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x100200, 0x7000, 2));

        let pvh = EntryPoint::Pvh32 {
            eip: 0x1000000,
            start_info: 0x6000,
        };
        let s = boot_sregs(kvm_sregs::default(), &pvh);
        assert_eq!(s.cr0 & X86_CR0_PG, 0);
        assert_eq!(s.efer, 0);
        assert_eq!(s.cs.db, 1);
        let r = boot_regs(&pvh);
        assert_eq!((r.rip, r.rbx), (0x1000000, 0x6000));
    }

    #[test]
    fn page_tables_identity_map_first_gib() {
        let mem = crate::memory::create_guest_memory(16 << 20).unwrap();
        write_identity_page_tables(&mem).unwrap();
        let pde: u64 = mem.read_obj(GuestAddress(PDE_START + 8 * 3)).unwrap();
        assert_eq!(pde, (3 * HUGE_PAGE_SIZE) | PTE_PRESENT_RW | PDE_PAGE_SIZE);
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_START)).unwrap();
        assert_eq!(pml4 & !0xfff, PDPTE_START);
    }

    #[test]
    fn lvt_mode_is_set_without_touching_other_bits() {
        let mut regs = [0 as std::os::raw::c_char; 1024];
        regs[APIC_LVT0] = 0x30;
        regs[APIC_LVT0 + 2] = 1; // masked bit 16
        set_lvt_mode(&mut regs, APIC_LVT0, APIC_MODE_EXTINT);
        assert_eq!(regs[APIC_LVT0 + 1] as u8, 0x7);
        assert_eq!(regs[APIC_LVT0] as u8, 0x30);
        assert_eq!(regs[APIC_LVT0 + 2], 1);
        set_lvt_mode(&mut regs, 1022, APIC_MODE_NMI); // out of range: ignored
        set_lvt_masked(&mut regs, APIC_LVT0);
        assert_eq!(regs[APIC_LVT0 + 2], 1);
        assert_eq!(regs[APIC_LVT0 + 1] as u8, 0x7);
    }
}
