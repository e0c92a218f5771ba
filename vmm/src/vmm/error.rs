//! Why a VM could not be started, and the exit status each reason maps to.

use std::path::PathBuf;

use pvmm_devices::bus::BusError;
use pvmm_scheduler::cpuset::CpuSetError;
use pvmm_scheduler::{CpuSet, TopologyError};

use crate::acpi::AcpiError;
use crate::api::ApiError;
use crate::boot::BootError;
use crate::config::ConfigError;
use crate::exit::{printable, EXIT_BAD_INPUT, EXIT_HOST_ERROR};
use crate::live::scheduler::LiveError;
use crate::memory::MemoryError;
use crate::seccomp::SeccompError;
use crate::vstate::vcpu::VcpuError;
use crate::vstate::vm::VmError;

/// Errors before the VM runs.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Kernel or initrd problems.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// KVM device or VM setup.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// vCPU setup.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// ACPI tables.
    #[error(transparent)]
    Acpi(#[from] AcpiError),
    /// Device wiring, vCPU threads and the threads that serve the VM.
    #[error("device setup: {0}")]
    Devices(#[from] SetupError),
    /// Host topology, CPU list or stats file: the user's input.
    #[error(transparent)]
    Placement(#[from] PlacementInputError),
    /// Starting placement failed on the host.
    #[error("vCPU placement: {0}")]
    PlacementHost(#[from] PlacementStartError),
    /// The control socket could not be set up.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The seccomp filters could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// A `--disk` image cannot back a disk: the user's input.
    #[error(transparent)]
    Disk(#[from] pvmm_devices::virtio::block::BlockError),
    /// A `--net` tap cannot back a network card: the user's input.
    #[error(transparent)]
    Tap(#[from] pvmm_devices::virtio::tap::TapError),
}

impl From<BusError> for VmmError {
    fn from(e: BusError) -> Self {
        SetupError::Bus(e).into()
    }
}

/// Errors wiring devices and starting the VM's threads: host failures.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A device range could not be put on a bus.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// An interrupt eventfd could not be created.
    #[error(transparent)]
    EventFd(std::io::Error),
    /// The vCPU kick signal's handler could not be installed.
    #[error("vCPU kick signal: {0}")]
    KickSignal(#[source] vmm_sys_util::errno::Error),
    /// A vCPU thread ended before reporting its start.
    #[error("a vCPU thread died at start")]
    VcpuDied,
    /// A vCPU thread reported its start twice.
    #[error("vCPU {0} started twice")]
    VcpuStartedTwice(u32),
    /// The control socket's thread could not be spawned.
    #[error("control socket thread: {0}")]
    ApiThread(#[source] std::io::Error),
    /// The signal thread could not be spawned.
    #[error("signal thread: {0}")]
    SignalThread(#[source] std::io::Error),
    /// A virtio device's transport could not be built.
    #[error(transparent)]
    Virtio(pvmm_devices::virtio::mmio::TransportError),
    /// A virtio device's worker thread could not be spawned.
    #[error("{0} thread: {1}")]
    DeviceThread(String, #[source] std::io::Error),
}

/// Placement input that cannot be used: the user's flags or environment.
#[derive(Debug, thiserror::Error)]
pub enum PlacementInputError {
    /// `--host-topology` names no usable topology.
    #[error("--host-topology {}: {}", printable(.arg), printable(&.source.to_string()))]
    Topology {
        /// The flag's value.
        arg: String,
        /// Why.
        source: TopologyError,
    },
    /// `--cpus` is not a CPU list.
    #[error("--cpus {}: {}", printable(.list), printable(&.source.to_string()))]
    CpuList {
        /// The flag's value.
        list: String,
        /// Why.
        source: CpuSetError,
    },
    /// `--cpus` leaves no usable topology.
    #[error("--cpus {}: {}", printable(.list), printable(&.source.to_string()))]
    Restrict {
        /// The flag's value.
        list: String,
        /// Why.
        source: TopologyError,
    },
    /// The topology names CPUs outside pvmm's own affinity.
    #[error("host topology names CPUs {outside} that pvmm may not run on (allowed: {allowed}); use --cpus or a matching --host-topology")]
    NotAllowed {
        /// The CPUs pvmm may not use.
        outside: CpuSet,
        /// pvmm's affinity.
        allowed: CpuSet,
    },
    /// The `--stats` file cannot be created.
    #[error("--stats {}: {source}", path.display())]
    Stats {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Errors starting live placement: host failures.
#[derive(Debug, thiserror::Error)]
pub enum PlacementStartError {
    /// The first placement, before the guest runs, failed.
    #[error(transparent)]
    FirstPlacement(#[from] LiveError),
    /// The scheduler thread could not be spawned.
    #[error(transparent)]
    Thread(std::io::Error),
}

impl VmmError {
    /// The exit status: 2 for the user's input and environment, 1 for host failures.
    pub fn status(&self) -> i32 {
        match self {
            VmmError::Config(_) | VmmError::Memory(_) => EXIT_BAD_INPUT,
            VmmError::Boot(BootError::GuestMemory(_) | BootError::E820TooLong) => EXIT_HOST_ERROR,
            VmmError::Boot(_) => EXIT_BAD_INPUT,
            VmmError::Vm(
                VmError::Open { .. } | VmError::NotKvm(_) | VmError::TooManyVcpus { .. },
            ) => EXIT_BAD_INPUT,
            VmmError::Acpi(AcpiError::TooManyVcpus(_)) => EXIT_BAD_INPUT,
            VmmError::Placement(_) | VmmError::Disk(_) | VmmError::Tap(_) => EXIT_BAD_INPUT,
            VmmError::Api(_) => EXIT_BAD_INPUT,
            VmmError::Seccomp(SeccompError::SelfTest(_)) => EXIT_BAD_INPUT,
            _ => EXIT_HOST_ERROR,
        }
    }
}
