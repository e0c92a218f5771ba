//! Building and running one VM: the order of setup, the devices, and waiting for the end.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use crossbeam::channel::{bounded, unbounded, Sender};
use pvmm_devices::bus::{Bus, BusError};
use pvmm_devices::power::{
    AcpiPowerDevice, I8042ResetDevice, PowerEvent, PowerEventSink, ACPI_POWER_PORT_BASE,
    ACPI_POWER_PORT_LEN, I8042_COMMAND_PORT,
};
use pvmm_devices::serial::{SerialConsole, COM1_IRQ, COM1_PORT_BASE, COM_PORT_LEN};
use serde_json::json;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::acpi::{build_tables, AcpiError};
use crate::api::routes::VmShape;
use crate::api::{ApiError, ApiSocket};
use crate::boot::{detect_kernel_format, load_kernel, open_input_file, BootError, BootSpec};
use crate::config::PlacementPolicy;
use crate::config::{ConfigError, StatsTarget, VmConfig};
use crate::exit::{VmExit, EXIT_BAD_INPUT, EXIT_HOST_ERROR};
use crate::layout::HIMEM_START;
use crate::layout::{CPPC_MMIO_SIZE, CPPC_MMIO_START, GED_IRQ, GED_MMIO_START};
use crate::live::capacity::CppcReporter;
use crate::live::control::PlacementControl;
use crate::live::idle::{IdleSource, KvmHaltIdle, ThreadRunTime};
use crate::live::own_threads::OwnThreads;
use crate::live::scheduler::{LiveError, LiveScheduler, LiveVcpu};
use crate::memory::{create_guest_memory, low_ram_end, MemoryError};
use crate::procfs::ProcSchedstat;
use crate::running::{PlacementReport, RunningVm, VmCore};
use crate::signals::SignalThread;
use crate::vstate::handle::{register_kick_handler, RunControl, VcpuHandle};
use crate::vstate::vcpu::{Vcpu, VcpuBuses, VcpuError, VcpuStarted};
use crate::vstate::vm::{Vm, VmError};
use pvmm_devices::cppc::{CppcDevice, CppcShared};
use pvmm_devices::events::{GuestErrorCounter, SharedEvents};
use pvmm_devices::ged::{GedDevice, GedShared, GED_MMIO_LEN};
use pvmm_scheduler::capacity::CAPACITY_SCALE;
use pvmm_scheduler::cpuset::CpuSetError;
use pvmm_scheduler::{CpuSet, EngineConfig, Executor, HostTopology, LinuxExecutor, TopologyError};

/// How long to wait for a retry when the UART's receive FIFO is full.
const SERIAL_INPUT_RETRY: Duration = Duration::from_millis(10);
/// Host input is read in chunks of this size.
const SERIAL_INPUT_CHUNK: usize = 64;

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
}

/// Placement input that cannot be used: the user's flags or environment.
#[derive(Debug, thiserror::Error)]
pub enum PlacementInputError {
    /// `--host-topology` names no usable topology.
    #[error("--host-topology {arg}: {source}")]
    Topology {
        /// The flag's value.
        arg: String,
        /// Why.
        source: TopologyError,
    },
    /// `--cpus` is not a CPU list.
    #[error("--cpus {list}: {source}")]
    CpuList {
        /// The flag's value.
        list: String,
        /// Why.
        source: CpuSetError,
    },
    /// `--cpus` leaves no usable topology.
    #[error("--cpus {list}: {source}")]
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
            VmmError::Placement(_) => EXIT_BAD_INPUT,
            VmmError::Api(_) => EXIT_BAD_INPUT,
            _ => EXIT_HOST_ERROR,
        }
    }
}

/// Writes guest console output straight to stdout, flushing each write so that nothing is lost
/// when pvmm exits the moment the guest powers off.
struct ConsoleOutput;

impl Write for ConsoleOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = std::io::stdout().lock();
        out.write_all(buf)?;
        out.flush()?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

/// Resolves `--host-topology` and `--cpus`, and checks that pvmm may run on every CPU left.
pub fn resolve_topology(config: &VmConfig) -> Result<HostTopology, VmmError> {
    let p = &config.placement;
    let topology = pvmm_scheduler::parse_host_topology_arg(&p.host_topology).map_err(|source| {
        PlacementInputError::Topology {
            arg: p.host_topology.clone(),
            source,
        }
    })?;
    let topology = match &p.cpus {
        Some(list) => {
            let set: CpuSet = list
                .parse()
                .map_err(|source| PlacementInputError::CpuList {
                    list: list.clone(),
                    source,
                })?;
            topology
                .restrict(&set)
                .map_err(|source| PlacementInputError::Restrict {
                    list: list.clone(),
                    source,
                })?
        }
        None => topology,
    };
    if p.policy != PlacementPolicy::None {
        // Pinning to a CPU outside pvmm's own affinity fails; say so now, not at the first tick.
        if let Ok(allowed) = LinuxExecutor.read(0) {
            let outside = topology.cpu_set().difference(&allowed);
            if !outside.is_empty() {
                return Err(PlacementInputError::NotAllowed { outside, allowed }.into());
            }
        }
    }
    Ok(topology)
}

fn open_stats(target: &Option<StatsTarget>) -> Result<Option<Box<dyn Write + Send>>, VmmError> {
    Ok(match target {
        None => None,
        Some(StatsTarget::Stderr) => Some(Box::new(std::io::stderr())),
        Some(StatsTarget::File(path)) => Some(Box::new(std::io::LineWriter::new(
            std::fs::File::create(path).map_err(|source| PlacementInputError::Stats {
                path: path.clone(),
                source,
            })?,
        ))),
    })
}

fn log(config: &VmConfig, msg: impl AsRef<str>) {
    if config.verbose {
        eprintln!("pvmm: {}", msg.as_ref());
    }
}

/// Checks the kernel and initrd files before touching KVM, so bad input is reported the same
/// everywhere.
fn check_inputs(config: &VmConfig) -> Result<(), VmmError> {
    config.validate()?;
    let format = detect_kernel_format(&config.kernel)?;
    if let Some(initrd) = &config.initrd {
        let read_err = |source| BootError::InitrdRead {
            path: initrd.clone(),
            source,
        };
        let (_, size) = open_input_file(initrd).map_err(read_err)?;
        // The exact fit is checked when loading; an initrd larger than all RAM above 1 MiB
        // can be refused before opening KVM.
        let room = low_ram_end(config.memory_bytes()) - HIMEM_START;
        if size >= room {
            return Err(BootError::InitrdTooBig {
                path: initrd.clone(),
                size,
                limit: low_ram_end(config.memory_bytes()),
            }
            .into());
        }
    }
    log(
        config,
        format!("kernel {} ({format:?})", config.kernel.display()),
    );
    Ok(())
}

/// Guest memory with the ACPI tables and the kernel loaded; returns the entry point.
fn load_guest(
    config: &VmConfig,
    vm: &Vm,
) -> Result<(crate::memory::GuestMemory, crate::boot::EntryPoint), VmmError> {
    let mem = create_guest_memory(config.memory_bytes())?;
    vm.register_memory(&mem)?;
    let tables = build_tables(config.vcpus)?;
    for t in &tables.tables {
        mem.write_slice(&t.bytes, GuestAddress(t.addr))
            .map_err(BootError::GuestMemory)?;
    }
    let entry = load_kernel(
        &mem,
        &BootSpec {
            kernel: &config.kernel,
            initrd: config.initrd.as_deref(),
            cmdline: &config.cmdline,
            mem_size: config.memory_bytes(),
            rsdp_addr: tables.rsdp_addr(),
        },
    )?;
    log(config, format!("entry {entry:x?}"));
    Ok((mem, entry))
}

/// The devices and the buses vCPUs dispatch to.
struct Devices {
    buses: VcpuBuses,
    serial: Arc<Mutex<SerialConsole>>,
    cppc: Arc<CppcShared>,
    ged: Arc<GedShared>,
    /// Every guest mistake the buses and devices report.
    guest_errors: Arc<GuestErrorCounter>,
}

fn build_devices(
    config: &VmConfig,
    vm: &Vm,
    exit_tx: &Sender<VmExit>,
) -> Result<Devices, VmmError> {
    let power_sink = |tx: Sender<VmExit>| -> PowerEventSink {
        Box::new(move |event| {
            let _ = tx.send(match event {
                PowerEvent::PowerOff => VmExit::PowerOff,
                PowerEvent::Reset => VmExit::Reset,
            });
        })
    };
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(SetupError::EventFd)?;
    vm.register_irq(&serial_irq, COM1_IRQ)?;
    let serial = Arc::new(Mutex::new(SerialConsole::new(
        serial_irq,
        Box::new(ConsoleOutput),
    )));
    let guest_errors = Arc::new(GuestErrorCounter::default());
    let events = || -> SharedEvents { guest_errors.clone() };
    let mut pio = Bus::new(events());
    pio.insert(
        serial.clone(),
        u64::from(COM1_PORT_BASE),
        u64::from(COM_PORT_LEN),
    )?;
    pio.insert(
        Arc::new(Mutex::new(AcpiPowerDevice::new(
            power_sink(exit_tx.clone()),
            events(),
        ))),
        u64::from(ACPI_POWER_PORT_BASE),
        u64::from(ACPI_POWER_PORT_LEN),
    )?;
    pio.insert(
        Arc::new(Mutex::new(I8042ResetDevice::new(
            power_sink(exit_tx.clone()),
            events(),
        ))),
        u64::from(I8042_COMMAND_PORT),
        1,
    )?;
    // CPPC registers and the GED that announces capacity changes and the power button.
    let cppc = Arc::new(CppcShared::new(config.vcpus, CAPACITY_SCALE));
    let ged_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(SetupError::EventFd)?;
    vm.register_irq(&ged_irq, GED_IRQ)?;
    let ged = Arc::new(GedShared::new(ged_irq));
    let mut mmio = Bus::new(events());
    mmio.insert(
        Arc::new(Mutex::new(CppcDevice::new(
            cppc.clone(),
            Box::new(ProcSchedstat),
            events(),
        ))),
        CPPC_MMIO_START,
        CPPC_MMIO_SIZE,
    )?;
    mmio.insert(
        Arc::new(Mutex::new(GedDevice::new(ged.clone(), events()))),
        GED_MMIO_START,
        GED_MMIO_LEN,
    )?;
    Ok(Devices {
        buses: VcpuBuses {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
        },
        serial,
        cppc,
        ged,
        guest_errors,
    })
}

/// The vCPU threads (held at a gate until placed) and each one's idle signal.
struct StartedVcpus {
    handles: Vec<VcpuHandle>,
    live: Vec<LiveVcpu>,
    gate: Arc<Barrier>,
}

fn start_vcpus(
    config: &VmConfig,
    vm: &Vm,
    mem: &crate::memory::GuestMemory,
    entry: &crate::boot::EntryPoint,
    buses: &VcpuBuses,
    exit_tx: &Sender<VmExit>,
) -> Result<StartedVcpus, VmmError> {
    let supported = Vcpu::supported_cpuid(vm)?;
    let vcpus = (0..config.vcpus)
        .map(|i| Vcpu::new(vm, i, config.vcpus, mem, entry, &supported))
        .collect::<Result<Vec<_>, _>>()?;
    // The guest's halt counters drive placement; fall back to thread run time (and say so
    // once) where KVM has no binary stats.
    let mut halt_stats = Vec::with_capacity(vcpus.len());
    let mut stats_warning = None;
    for vcpu in &vcpus {
        match vcpu.halt_stats() {
            Ok(stats) => halt_stats.push(Some(stats)),
            Err(e) => {
                stats_warning.get_or_insert(e.to_string());
                halt_stats.push(None);
            }
        }
    }
    if let Some(why) = stats_warning {
        eprintln!("pvmm: KVM halt statistics unavailable ({why}); using vCPU thread run time from /proc instead");
    }
    register_kick_handler().map_err(SetupError::KickSignal)?;
    let gate = Arc::new(Barrier::new(vcpus.len() + 1));
    let (started_tx, started_rx) = unbounded();
    let mut threads = Vec::with_capacity(vcpus.len());
    for vcpu in vcpus {
        let control = Arc::new(RunControl::default());
        let thread = vcpu.spawn(
            buses.clone(),
            started_tx.clone(),
            gate.clone(),
            exit_tx.clone(),
            control.clone(),
        )?;
        threads.push(Some((thread, control)));
    }
    let mut started: Vec<VcpuStarted> = Vec::with_capacity(config.vcpus as usize);
    for _ in 0..config.vcpus {
        match started_rx.recv() {
            Ok(s) => started.push(s),
            Err(_) => return Err(SetupError::VcpuDied.into()),
        }
    }
    started.sort_by_key(|s| s.index);
    let mut handles = Vec::with_capacity(started.len());
    let mut live = Vec::with_capacity(started.len());
    for (s, halt) in started.iter().zip(halt_stats) {
        log(config, format!("vcpu{} tid {}", s.index, s.tid));
        let Some((thread, control)) = threads.get_mut(s.index as usize).and_then(Option::take)
        else {
            return Err(SetupError::VcpuStartedTwice(s.index).into());
        };
        handles.push(VcpuHandle::new(s.index, s.tid, control, thread));
        let source: Box<dyn IdleSource> = match halt {
            Some(halt) => Box::new(KvmHaltIdle::new(halt, s.tid)),
            None => Box::new(ThreadRunTime::new(s.tid)),
        };
        live.push(LiveVcpu::new(s.index, s.tid, source));
    }
    Ok(StartedVcpus {
        handles,
        live,
        gate,
    })
}

/// The running scheduler and what the VM's core keeps of it.
struct StartedPlacement {
    control: Arc<PlacementControl>,
    report: PlacementReport,
    /// The stop channel and the `pvmm-sched` thread.
    thread: (Sender<()>, std::thread::JoinHandle<()>),
}

/// Places the vCPUs once while they wait at `gate`, releases them, and starts the scheduler
/// thread.
fn start_scheduler(
    config: &VmConfig,
    topology: &HostTopology,
    live: Vec<LiveVcpu>,
    stats_out: Option<Box<dyn Write + Send>>,
    (handles, gate): (&[VcpuHandle], &Barrier),
    devices: &Devices,
    ged_unmasked: Box<dyn Fn() -> bool + Send>,
) -> Result<StartedPlacement, VmmError> {
    let control = Arc::new(PlacementControl::new(Duration::from_millis(
        config.external_lease_ms,
    )));
    let vcpu_tids = handles.iter().map(VcpuHandle::tid).collect();
    let mut scheduler = LiveScheduler::new(
        config.placement.policy,
        topology.clone(),
        EngineConfig::default(),
        Box::new(LinuxExecutor),
        live,
        stats_out,
    )
    .with_control(control.clone())
    .with_own_threads(OwnThreads::new(vcpu_tids))
    .with_guest_errors(devices.guest_errors.clone())
    .with_capacity_reporter(Box::new(CppcReporter::new(
        devices.cppc.clone(),
        devices.ged.clone(),
        ged_unmasked,
    )));
    // vCPUs start where the policy wants them: place before releasing the gate.
    let placed = scheduler.tick();
    gate.wait();
    placed.map_err(PlacementStartError::FirstPlacement)?;
    let report = PlacementReport {
        topology: topology.clone(),
        totals: scheduler.totals(),
        host_stat_at_start: scheduler.host_stat_at_start(),
        started: std::time::Instant::now(),
    };
    let (stop_tx, stop_rx) = bounded(0);
    let thread = scheduler
        .spawn(Duration::from_millis(config.placement.tick_ms), stop_rx)
        .map_err(PlacementStartError::Thread)?;
    Ok(StartedPlacement {
        control,
        report,
        thread: (stop_tx, thread),
    })
}

/// Builds the VM described by `config` and starts its vCPUs, its scheduler and, with
/// `--api-socket`, its control socket.
pub fn start(config: &VmConfig) -> Result<RunningVm, VmmError> {
    check_inputs(config)?;
    let topology = resolve_topology(config)?;
    let stats_out = open_stats(&config.placement.stats)?;
    // Bound before any thread starts (the socket is created under a narrowed umask).
    let api_socket = match &config.api_socket {
        Some(path) => Some(ApiSocket::bind(path)?),
        None => None,
    };

    let vm = Arc::new(Vm::new(&config.kvm_device, config.vcpus)?);
    let (mem, entry) = load_guest(config, &vm)?;
    let (exit_tx, exits) = unbounded::<VmExit>();
    let devices = build_devices(config, &vm, &exit_tx)?;
    let started = start_vcpus(config, &vm, &mem, &entry, &devices.buses, &exit_tx)?;
    for h in &started.handles {
        devices.cppc.set_tid(h.index(), h.tid());
    }
    let ged_unmasked = {
        let vm = vm.clone();
        move || vm.ioapic_pin_unmasked(GED_IRQ)
    };
    let placement = start_scheduler(
        config,
        &topology,
        started.live,
        stats_out,
        (&started.handles, &started.gate),
        &devices,
        Box::new(ged_unmasked.clone()),
    )?;
    let (deadline_tx, deadlines) = unbounded();
    let core = Arc::new(VmCore {
        vcpus: started.handles,
        control: placement.control,
        ged: devices.ged,
        description: json!({
            "vcpus": config.vcpus,
            "memory_mib": config.memory_mib,
            "kernel": config.kernel.display().to_string(),
        }),
        shape: VmShape {
            vcpus: config.vcpus,
            cpus: topology.cpu_set(),
        },
        deadlines: deadline_tx,
        report: placement.report,
        policy: Mutex::new(config.placement.policy),
        shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
        ged_listening: Box::new(ged_unmasked),
    });
    let api = match api_socket {
        Some(socket) => Some(socket.serve(core.clone()).map_err(SetupError::ApiThread)?),
        None => None,
    };
    let signals = SignalThread::spawn(core.clone()).map_err(SetupError::SignalThread)?;
    spawn_console_input(devices.serial);
    Ok(RunningVm::new(
        core,
        exits,
        deadlines,
        placement.thread,
        (api, signals),
        mem,
    ))
}

/// Feeds pvmm's stdin to the guest's serial console until stdin ends.
fn spawn_console_input(serial: Arc<Mutex<SerialConsole>>) {
    let spawned = std::thread::Builder::new()
        .name("console-in".into())
        .spawn(move || {
            let mut stdin = std::io::stdin();
            let mut buf = [0u8; SERIAL_INPUT_CHUNK];
            while let Ok(n) = stdin.read(&mut buf) {
                if n == 0 {
                    return;
                }
                let mut pending = &buf[..n];
                while !pending.is_empty() {
                    let taken = match serial.lock() {
                        Ok(mut s) => s.enqueue_input(pending).unwrap_or(0),
                        Err(_) => return,
                    };
                    pending = &pending[taken..];
                    if !pending.is_empty() {
                        std::thread::sleep(SERIAL_INPUT_RETRY);
                    }
                }
            }
        });
    // Without console input the guest still runs; nothing else to do.
    drop(spawned);
}
