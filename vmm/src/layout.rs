//! Guest physical memory layout. Every fixed guest address pvmm uses is named here, with why.

use pvmm_devices::cppc::CPPC_MMIO_LEN;
use pvmm_devices::ged::GED_MMIO_LEN;
use pvmm_devices::virtio::mmio::MMIO_WINDOW_LEN;

/// Where the GDT lives while the boot vCPU enters 64-bit mode: low memory that Linux treats as
/// scratch once it has set up its own tables.
pub const BOOT_GDT_START: u64 = 0x500;
/// An empty IDT right after the GDT: interrupts stay disabled until the kernel loads its own.
pub const BOOT_IDT_START: u64 = 0x520;
/// The PVH `hvm_start_info` block (ELF/PVH boot).
pub const PVH_INFO_START: u64 = 0x6000;
/// The PVH module list (the initrd), after the start info.
pub const PVH_MODLIST_START: u64 = 0x6040;
/// The PVH memory map, after the module list.
pub const PVH_MEMMAP_START: u64 = 0x7000;
/// The Linux "zero page" (`struct boot_params`, bzImage boot).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer of the boot vCPU: below the page tables, above the zero page.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity-map page tables for 64-bit boot: PML4, PDPT, then one page directory.
pub const PML4_START: u64 = 0x9000;
/// Page-directory-pointer table.
pub const PDPTE_START: u64 = 0xa000;
/// Page directory with 512 2 MiB pages: identity-maps the first GiB, enough for the kernel's
/// early code, the zero page, the command line and the initrd header.
pub const PDE_START: u64 = 0xb000;
/// The kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Room reserved for the command line (Linux's COMMAND_LINE_SIZE on x86 is 2048; newer kernels
/// accept more, bounded by the bzImage header's `cmdline_size`).
pub const CMDLINE_MAX_SIZE: usize = 0x10000;
/// End of conventional low RAM: the EBDA starts here on PCs, and Linux expects a hole up to 1 MiB.
pub const EBDA_START: u64 = 0x9fc00;
/// The BIOS area where Linux also scans for the RSDP; pvmm writes its ACPI tables here.
pub const ACPI_TABLES_START: u64 = 0xe0000;
/// Size of the BIOS area holding the ACPI tables (up to 1 MiB).
pub const ACPI_TABLES_MAX_SIZE: u64 = 0x20000;
/// Kernels are loaded at 1 MiB, the start of high memory (boot protocol default).
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO hole: RAM above this address is moved above 4 GiB so that the
/// IOAPIC, LAPIC and pvmm's MMIO devices have addresses no RAM shadows.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO hole.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// Where pvmm's own MMIO devices start (inside the gap, well below the IOAPIC).
pub const PVMM_MMIO_START: u64 = 0xd000_0000;
/// The CPPC register window ([`CPPC_MMIO_LEN`] bytes: room for every vCPU).
pub const CPPC_MMIO_START: u64 = PVMM_MMIO_START;
/// The ACPI Generic Event Device's status register, after the CPPC window.
pub const GED_MMIO_START: u64 = CPPC_MMIO_START + CPPC_MMIO_LEN;
/// The GED's interrupt: ISA line 5, free on pvmm's platform (COM1 uses 4).
pub const GED_IRQ: u32 = 5;
/// Where the virtio-mmio windows start: the page after the GED's register.
pub const VIRTIO_MMIO_START: u64 = (GED_MMIO_START + GED_MMIO_LEN).next_multiple_of(0x1000);
/// The first virtio device's interrupt: IOAPIC pins 16..23 are no ISA device's, so the
/// devices' lines never meet a legacy one.
pub const VIRTIO_IRQ_BASE: u32 = 16;
/// virtio devices a VM may have: one per IOAPIC pin from [`VIRTIO_IRQ_BASE`] to the last (23).
pub const MAX_VIRTIO_DEVICES: usize = 8;

/// Where virtio device `index` is: its register window's base and its interrupt line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioSlot {
    /// The window's base (its length is `pvmm_devices::virtio::mmio::MMIO_WINDOW_LEN`).
    pub base: u64,
    /// Its IOAPIC pin.
    pub irq: u32,
}

/// The slots of `count` virtio devices, in device order.
pub fn virtio_slots(count: usize) -> Vec<VirtioSlot> {
    (0u32..)
        .take(count.min(MAX_VIRTIO_DEVICES))
        .map(|i| VirtioSlot {
            base: VIRTIO_MMIO_START + u64::from(i) * MMIO_WINDOW_LEN,
            irq: VIRTIO_IRQ_BASE + i,
        })
        .collect()
}

/// IOAPIC base address (PC default; KVM's in-kernel IOAPIC answers here).
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// Local APIC base address (architectural default).
pub const APIC_START: u64 = 0xfee0_0000;
/// The TSS KVM needs for real-mode emulation on some hosts: three pages just below the BIOS.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;
