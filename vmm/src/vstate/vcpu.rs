//! vCPUs: creation, configuration, and the thread that runs each one.
//!
//! Each vCPU runs `KVM_RUN` on its own thread named `vcpu<N>`. Port I/O and MMIO exits go to
//! the device buses; everything that ends the VM (power-off, reset, triple fault, KVM errors)
//! is sent to the VMM's main thread as a [`VmExit`]. Before each `KVM_RUN` the thread checks
//! its [`RunControl`], so the VMM can pause, resume and stop it (see [`super::handle`]).

use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;

use crossbeam::channel::Sender;
use kvm_bindings::{
    CpuId, KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use pvmm_devices::bus::Bus;

use crate::boot::regs::{setup_boot_vcpu, setup_common_vcpu_state, RegsError};
use crate::boot::EntryPoint;
use crate::cpuid::{configure_cpuid, CpuidError};
use crate::exit::VmExit;
use crate::memory::GuestMemory;
use crate::seccomp::{SeccompFilters, ThreadKind};
use crate::vstate::handle::RunControl;
use crate::vstate::msr;
use crate::vstate::stats::{StatsError, VcpuHaltStats};
use crate::vstate::vm::Vm;

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

    /// Starts the vCPU on its own thread `vcpu<N>`; the thread installs the vCPU seccomp
    /// filter, reports its thread id on `started`, waits at `gate` (so the VMM can place the
    /// thread before the guest runs), runs while `control` lets it, and sends the reason the
    /// VM must end on `exits`.
    pub fn spawn(
        self,
        buses: VcpuBuses,
        (started, gate): (Sender<VcpuStarted>, Arc<Barrier>),
        exits: Sender<VmExit>,
        control: Arc<RunControl>,
        seccomp: Arc<SeccompFilters>,
    ) -> Result<JoinHandle<()>, VcpuError> {
        let index = self.index;
        std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                seccomp.confine(ThreadKind::Vcpu);
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                // The VMM may already be gone when a late vCPU starts; nothing to do then.
                let _ = started.send(VcpuStarted { index, tid });
                gate.wait();
                if let Some(exit) = self.run(&buses, &control) {
                    let _ = exits.send(exit);
                }
                control.thread_ended();
            })
            .map_err(|source| VcpuError::Spawn { index, source })
    }

    /// Runs until something ends the VM (`Some(why)`) or the VMM stops the vCPU (`None`).
    fn run(mut self, buses: &VcpuBuses, control: &RunControl) -> Option<VmExit> {
        while control.may_run() {
            if let Some(exit) = self.run_once(buses) {
                return Some(exit);
            }
        }
        None
    }

    /// One `KVM_RUN` and the handling of its exit; `Some` when the exit ends the VM.
    fn run_once(&mut self, buses: &VcpuBuses) -> Option<VmExit> {
        let index = self.index;
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            // A kick (or any signal) interrupted KVM_RUN: the caller checks its run control.
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => return None,
            Err(e) => {
                return Some(VmExit::HostError(format!(
                    "vCPU {index}: KVM_RUN failed: {e}"
                )))
            }
        };
        let ended = match exit {
            VcpuExit::IoIn(port, data) => {
                buses.pio.read(u64::from(port), data);
                return None;
            }
            VcpuExit::IoOut(port, data) => {
                buses.pio.write(u64::from(port), data);
                return None;
            }
            VcpuExit::MmioRead(addr, data) => {
                buses.mmio.read(addr, data);
                return None;
            }
            VcpuExit::MmioWrite(addr, data) => {
                buses.mmio.write(addr, data);
                return None;
            }
            VcpuExit::X86Rdmsr(exit) => {
                match msr::read(exit.index) {
                    Some(value) => *exit.data = value,
                    None => *exit.error = 1,
                }
                return None;
            }
            VcpuExit::X86Wrmsr(exit) => {
                if !msr::write(exit.index) {
                    *exit.error = 1;
                }
                return None;
            }
            // With the in-kernel LAPIC a halt stays in KVM; these are harmless if seen.
            VcpuExit::Hlt | VcpuExit::IrqWindowOpen | VcpuExit::Intr => return None,
            VcpuExit::Shutdown => VmExit::TripleFault {
                vcpu: index,
                state: self.fault_state(),
            },
            VcpuExit::SystemEvent(kind, _) => match kind {
                KVM_SYSTEM_EVENT_SHUTDOWN => VmExit::PowerOff,
                KVM_SYSTEM_EVENT_RESET => VmExit::Reset,
                KVM_SYSTEM_EVENT_CRASH => {
                    VmExit::KvmError(format!("vCPU {index}: guest crash event"))
                }
                other => VmExit::KvmError(format!("vCPU {index}: unknown system event {other}")),
            },
            VcpuExit::FailEntry(reason, cpu) => VmExit::KvmError(format!(
                "vCPU {index}: VM entry failed (hardware reason {reason:#x}, host CPU {cpu})"
            )),
            VcpuExit::InternalError => {
                let suberror = self.internal_suberror();
                VmExit::KvmError(format!(
                    "vCPU {index}: KVM internal error (suberror {suberror})"
                ))
            }
            other => VmExit::KvmError(format!("vCPU {index}: unexpected exit {other:?}")),
        };
        Some(ended)
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
