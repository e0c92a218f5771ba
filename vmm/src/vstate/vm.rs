//! The KVM VM: opening the KVM device, memory slots, in-kernel IOAPIC/PIC/PIT, interrupts.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use kvm_bindings::{
    kvm_enable_cap, kvm_irq_routing_entry, kvm_irq_routing_irqchip, kvm_irqchip, kvm_pit_config,
    kvm_userspace_memory_region, KvmIrqRouting, KVM_API_VERSION, KVM_CAP_X86_USER_SPACE_MSR,
    KVM_IRQCHIP_IOAPIC, KVM_IRQ_ROUTING_IRQCHIP, KVM_MSR_EXIT_REASON_UNKNOWN,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, IoEventAddress, Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::layout::KVM_TSS_ADDRESS;
use crate::memory::GuestMemory as PvmmGuestMemory;

/// Errors from setting up the VM. [`VmError::Open`] and [`VmError::NotKvm`] are the user's
/// environment (exit status 2); the rest are host failures.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The KVM device cannot be opened.
    #[error("cannot open {path}: {source}{hint}")]
    Open {
        /// The device path.
        path: PathBuf,
        /// Why.
        source: kvm_ioctls::Error,
        /// What to check.
        hint: &'static str,
    },
    /// The device answers but is not KVM, or speaks another API version.
    #[error(
        "{0} is not a usable KVM device (KVM_GET_API_VERSION failed or is not {KVM_API_VERSION})"
    )]
    NotKvm(PathBuf),
    /// The host KVM lacks something pvmm needs.
    #[error("host KVM lacks {0}")]
    MissingCapability(&'static str),
    /// More vCPUs than the host KVM allows.
    #[error("{requested} vCPUs requested, host KVM allows at most {max}")]
    TooManyVcpus {
        /// Asked for.
        requested: u32,
        /// Host limit.
        max: usize,
    },
    /// A KVM ioctl failed.
    #[error("KVM {what} failed: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
}

/// Mask bit of an IOAPIC redirection table entry (set at reset).
const IOAPIC_REDIR_MASKED: u64 = 1 << 16;
/// Pins of KVM's in-kernel IOAPIC.
const IOAPIC_PINS: u32 = 24;

/// Routes every GSI to the IOAPIC pin of the same number, and none to the 8259 PIC.
///
/// KVM's default routing also wires GSIs 0-15 to its in-kernel PIC. pvmm describes a
/// hardware-reduced ACPI platform, on which Linux never programs the PIC; an interrupt reaching
/// the PIC in its reset state would be delivered through LINT0 with vector base 0, that is as
/// a CPU exception (IRQ 5 arrived as #BR). Without PIC routes that cannot happen.
fn route_gsis_to_ioapic_only(fd: &VmFd) -> Result<(), VmError> {
    let entries: Vec<kvm_irq_routing_entry> = (0..IOAPIC_PINS)
        .map(|pin| {
            let mut e = kvm_irq_routing_entry {
                gsi: pin,
                type_: KVM_IRQ_ROUTING_IRQCHIP,
                ..Default::default()
            };
            e.u.irqchip = kvm_irq_routing_irqchip {
                irqchip: KVM_IRQCHIP_IOAPIC,
                pin,
            };
            e
        })
        .collect();
    let routing = KvmIrqRouting::from_entries(&entries).map_err(|_| VmError::Kvm {
        what: "GSI routing table",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    })?;
    fd.set_gsi_routing(&routing).map_err(kvm_err("GSI routing"))
}

/// An open KVM device and a VM created from it.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
}

fn kvm_err(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

impl Vm {
    /// Opens `kvm_path` and creates a VM with an in-kernel irqchip and PIT.
    pub fn new(kvm_path: &Path, vcpus: u32) -> Result<Self, VmError> {
        let cpath = CString::new(kvm_path.as_os_str().as_bytes())
            .map_err(|_| VmError::NotKvm(kvm_path.to_path_buf()))?;
        let kvm = Kvm::new_with_path(&cpath).map_err(|source| VmError::Open {
            path: kvm_path.to_path_buf(),
            hint: match source.errno() {
                libc::ENOENT => " (is the kvm module loaded? on a host without virtualization, use the QEMU-nested rig: cargo xtask rig)",
                libc::EACCES | libc::EPERM => " (add yourself to the kvm group, or run as root)",
                _ => "",
            },
            source,
        })?;
        if u32::try_from(kvm.get_api_version()).ok() != Some(KVM_API_VERSION) {
            return Err(VmError::NotKvm(kvm_path.to_path_buf()));
        }
        for (cap, name) in [
            (Cap::Irqchip, "an in-kernel irqchip (KVM_CAP_IRQCHIP)"),
            (Cap::Irqfd, "irqfd (KVM_CAP_IRQFD)"),
            (Cap::Ioeventfd, "ioeventfd (KVM_CAP_IOEVENTFD)"),
            (Cap::Pit2, "an in-kernel PIT (KVM_CAP_PIT2)"),
            (Cap::UserMemory, "user memory slots (KVM_CAP_USER_MEMORY)"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCapability(name));
            }
        }
        let max = kvm.get_max_vcpus();
        if vcpus as usize > max {
            return Err(VmError::TooManyVcpus {
                requested: vcpus,
                max,
            });
        }
        let fd = kvm.create_vm().map_err(kvm_err("VM creation"))?;
        // usize is 64 bits on every host pvmm builds for (asserted in `memory`).
        #[allow(clippy::cast_possible_truncation)]
        fd.set_tss_address(KVM_TSS_ADDRESS as usize)
            .map_err(kvm_err("TSS address"))?;
        fd.create_irq_chip().map_err(kvm_err("irqchip creation"))?;
        route_gsis_to_ioapic_only(&fd)?;
        let pit = kvm_pit_config {
            // The PC speaker port (0x61) is emulated in-kernel as a dummy, so guests that poke
            // it do not exit to pvmm.
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(kvm_err("PIT creation"))?;
        if kvm.check_extension(Cap::X86UserSpaceMsr) {
            // Accesses to MSRs KVM does not know come to pvmm ([`super::msr`]); without the
            // capability they fault in the guest, as they always did.
            let cap = kvm_enable_cap {
                cap: KVM_CAP_X86_USER_SPACE_MSR,
                args: [u64::from(KVM_MSR_EXIT_REASON_UNKNOWN), 0, 0, 0],
                ..Default::default()
            };
            fd.enable_cap(&cap)
                .map_err(kvm_err("user-space MSR exits"))?;
        }
        Ok(Self { kvm, fd })
    }

    /// The KVM system handle.
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// The VM handle.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// Registers every guest memory region as a KVM memory slot.
    pub fn register_memory(&self, mem: &PvmmGuestMemory) -> Result<(), VmError> {
        for (slot, region) in (0u32..).zip(mem.iter()) {
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map_err(|_| VmError::Kvm {
                    what: "memory slot (no host mapping)",
                    source: kvm_ioctls::Error::new(libc::EFAULT),
                })?;
            let desc = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: host as u64,
            };
            // SAFETY: the region is a live mmap owned by `mem`, which outlives the VM (both are
            // held by the running VMM until the process exits), and slots do not overlap.
            unsafe { self.fd.set_user_memory_region(desc) }
                .map_err(kvm_err("memory slot registration"))?;
        }
        Ok(())
    }

    /// Whether the guest has unmasked IOAPIC pin `pin` (its driver for that line is ready).
    /// False when the state cannot be read.
    pub fn ioapic_pin_unmasked(&self, pin: u32) -> bool {
        let mut chip = kvm_irqchip {
            chip_id: KVM_IRQCHIP_IOAPIC,
            ..Default::default()
        };
        if self.fd.get_irqchip(&mut chip).is_err() {
            return false;
        }
        // SAFETY: for chip_id KVM_IRQCHIP_IOAPIC, KVM_GET_IRQCHIP fills the `ioapic` member.
        let ioapic = unsafe { chip.chip.ioapic };
        ioapic
            .redirtbl
            .get(pin as usize)
            // SAFETY: every bit pattern of the redirection entry is a valid u64.
            .is_some_and(|e| unsafe { e.bits } & IOAPIC_REDIR_MASKED == 0)
    }

    /// Makes a 4-byte guest write of `value` at MMIO address `addr` signal `evt` inside KVM,
    /// without an exit to pvmm (a virtio queue notification).
    pub fn register_mmio_notify(
        &self,
        evt: &EventFd,
        addr: u64,
        value: u32,
    ) -> Result<(), VmError> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), value)
            .map_err(kvm_err("ioeventfd registration"))
    }

    /// Makes a signal on `evt` raise interrupt line `gsi`.
    pub fn register_irq(&self, evt: &EventFd, gsi: u32) -> Result<(), VmError> {
        self.fd
            .register_irqfd(evt, gsi)
            .map_err(kvm_err("irqfd registration"))
    }
}
