//! vCPUs: creation, configuration, and the thread that runs each one.
//!
//! Each vCPU runs `KVM_RUN` on its own thread named `vcpu<N>`. Port I/O and MMIO exits go to
//! the device buses; everything that ends the VM (power-off, reset, triple fault, KVM errors)
//! is sent to the VMM's main thread as a [`VmExit`], which ends the process.

use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;

use crossbeam::channel::Sender;
use kvm_bindings::CpuId;
use kvm_ioctls::{VcpuExit, VcpuFd};
use pvmm_devices::bus::Bus;

use crate::boot::regs::{setup_boot_vcpu, setup_common_vcpu_state, RegsError};
use crate::boot::EntryPoint;
use crate::cpuid::{configure_cpuid, CpuidError};
use crate::exit::VmExit;
use crate::live::kvm_stats::{StatsError, VcpuHaltStats};
use crate::memory::GuestMemory;
use crate::vstate::vm::Vm;

/// `KVM_SYSTEM_EVENT_*` types (include/uapi/linux/kvm.h).
const KVM_SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const KVM_SYSTEM_EVENT_RESET: u32 = 2;
const KVM_SYSTEM_EVENT_CRASH: u32 = 3;
/// Room for the host's supported CPUID list (KVM_MAX_CPUID_ENTRIES).
const MAX_CPUID_ENTRIES: usize = kvm_bindings::KVM_MAX_CPUID_ENTRIES;

/// Errors from creating and configuring vCPUs.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A KVM ioctl failed.
    #[error("vCPU {index}: KVM {what} failed: {source}")]
    Kvm {
        /// vCPU index.
        index: u32,
        /// Operation.
        what: &'static str,
        /// Error.
        source: kvm_ioctls::Error,
    },
    /// CPUID could not be built.
    #[error("vCPU {index}: {source}")]
    Cpuid {
        /// vCPU index.
        index: u32,
        /// Error.
        source: CpuidError,
    },
    /// Registers could not be set.
    #[error("vCPU {index}: {source}")]
    Regs {
        /// vCPU index.
        index: u32,
        /// Error.
        source: RegsError,
    },
    /// The thread could not be spawned.
    #[error("vCPU {index}: cannot spawn thread: {source}")]
    Spawn {
        /// vCPU index.
        index: u32,
        /// Error.
        source: std::io::Error,
    },
}

/// A configured vCPU, ready to run.
pub struct Vcpu {
    index: u32,
    fd: VcpuFd,
}

/// What a running vCPU thread reports to the VMM at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VcpuStarted {
    /// vCPU index.
    pub index: u32,
    /// Linux thread id of the vCPU thread (for affinity and /proc).
    pub tid: i32,
}

/// The buses a vCPU dispatches exits to.
#[derive(Clone)]
pub struct VcpuBuses {
    /// Port I/O.
    pub pio: Arc<Bus>,
    /// MMIO.
    pub mmio: Arc<Bus>,
}

impl Vcpu {
    /// Creates vCPU `index` of `count`, with CPUID, FPU, MSRs, LAPIC, and for the boot vCPU
    /// (index 0) the entry state.
    pub fn new(
        vm: &Vm,
        index: u32,
        count: u32,
        mem: &GuestMemory,
        entry: &EntryPoint,
        supported_cpuid: &CpuId,
    ) -> Result<Self, VcpuError> {
        let kvm = |what| {
            move |source| VcpuError::Kvm {
                index,
                what,
                source,
            }
        };
        let fd = vm
            .fd()
            .create_vcpu(u64::from(index))
            .map_err(kvm("vCPU creation"))?;
        let mut cpuid = supported_cpuid.clone();
        configure_cpuid(&mut cpuid, index, count)
            .map_err(|source| VcpuError::Cpuid { index, source })?;
        fd.set_cpuid2(&cpuid).map_err(kvm("CPUID setup"))?;
        setup_common_vcpu_state(&fd).map_err(|source| VcpuError::Regs { index, source })?;
        if index == 0 {
            setup_boot_vcpu(&fd, mem, entry).map_err(|source| VcpuError::Regs { index, source })?;
        }
        Ok(Self { index, fd })
    }

    /// Reads the host's KVM-supported CPUID once for all vCPUs.
    pub fn supported_cpuid(vm: &Vm) -> Result<CpuId, VcpuError> {
        vm.kvm()
            .get_supported_cpuid(MAX_CPUID_ENTRIES)
            .map_err(|source| VcpuError::Kvm {
                index: 0,
                what: "KVM_GET_SUPPORTED_CPUID",
                source,
            })
    }

    /// Opens KVM's binary statistics for this vCPU (before it runs: the ioctl takes the vCPU
    /// mutex that `KVM_RUN` holds).
    pub fn halt_stats(&self) -> Result<VcpuHaltStats, StatsError> {
        VcpuHaltStats::open(&self.fd)
    }

    /// vCPU index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Starts the vCPU on its own thread `vcpu<N>`; it reports its thread id on `started`,
    /// waits at `gate` (so the VMM can place the thread before the guest runs), and sends the
    /// reason the VM must end on `exits`.
    pub fn spawn(
        self,
        buses: VcpuBuses,
        started: Sender<VcpuStarted>,
        gate: Arc<Barrier>,
        exits: Sender<VmExit>,
    ) -> Result<JoinHandle<()>, VcpuError> {
        let index = self.index;
        std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                // The VMM may already be gone when a late vCPU starts; nothing to do then.
                let _ = started.send(VcpuStarted { index, tid });
                gate.wait();
                let exit = self.run(&buses);
                let _ = exits.send(exit);
            })
            .map_err(|source| VcpuError::Spawn { index, source })
    }

    /// Runs until something ends the VM.
    fn run(mut self, buses: &VcpuBuses) -> VmExit {
        loop {
            let exit = match self.fd.run() {
                Ok(exit) => exit,
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
                Err(e) => {
                    return VmExit::HostError(format!("vCPU {}: KVM_RUN failed: {e}", self.index))
                }
            };
            match exit {
                VcpuExit::IoIn(port, data) => {
                    buses.pio.read(u64::from(port), data);
                }
                VcpuExit::IoOut(port, data) => {
                    buses.pio.write(u64::from(port), data);
                }
                VcpuExit::MmioRead(addr, data) => {
                    buses.mmio.read(addr, data);
                }
                VcpuExit::MmioWrite(addr, data) => {
                    buses.mmio.write(addr, data);
                }
                // With the in-kernel LAPIC a halt stays in KVM; these are harmless if seen.
                VcpuExit::Hlt | VcpuExit::IrqWindowOpen | VcpuExit::Intr => {}
                VcpuExit::Shutdown => {
                    return VmExit::TripleFault {
                        vcpu: self.index,
                        state: self.fault_state(),
                    }
                }
                VcpuExit::SystemEvent(kind, _) => match kind {
                    KVM_SYSTEM_EVENT_SHUTDOWN => return VmExit::PowerOff,
                    KVM_SYSTEM_EVENT_RESET => return VmExit::Reset,
                    KVM_SYSTEM_EVENT_CRASH => {
                        return VmExit::KvmError(format!("vCPU {}: guest crash event", self.index))
                    }
                    other => {
                        return VmExit::KvmError(format!(
                            "vCPU {}: unknown system event {other}",
                            self.index
                        ))
                    }
                },
                VcpuExit::FailEntry(reason, cpu) => {
                    return VmExit::KvmError(format!(
                        "vCPU {}: VM entry failed (hardware reason {reason:#x}, host CPU {cpu})",
                        self.index
                    ))
                }
                VcpuExit::InternalError => {
                    let suberror = self.internal_suberror();
                    return VmExit::KvmError(format!(
                        "vCPU {}: KVM internal error (suberror {suberror})",
                        self.index
                    ));
                }
                other => {
                    return VmExit::KvmError(format!(
                        "vCPU {}: unexpected exit {other:?}",
                        self.index
                    ))
                }
            }
        }
    }

    /// A one-line summary of the registers that tell where and how a guest died.
    fn fault_state(&self) -> String {
        let (Ok(regs), Ok(sregs)) = (self.fd.get_regs(), self.fd.get_sregs()) else {
            return String::new();
        };
        format!(
            "rip {:#x} rsp {:#x} cr0 {:#x} cr3 {:#x} cr4 {:#x} efer {:#x} idt {:#x}/{:#x}",
            regs.rip,
            regs.rsp,
            sregs.cr0,
            sregs.cr3,
            sregs.cr4,
            sregs.efer,
            sregs.idt.base,
            sregs.idt.limit
        )
    }

    fn internal_suberror(&mut self) -> u32 {
        let run = self.fd.get_kvm_run();
        // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member of the exit union is the
        // one KVM filled in.
        unsafe { run.__bindgen_anon_1.internal.suberror }
    }
}
