//! Building and running one VM: the order of setup, the devices, and waiting for the end.

use std::io::{Read, Write};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use crossbeam::channel::{unbounded, Receiver};
use pvmm_devices::bus::{Bus, BusError};
use pvmm_devices::power::{
    AcpiPowerDevice, I8042ResetDevice, PowerEvent, PowerEventSink, ACPI_POWER_PORT_BASE,
    ACPI_POWER_PORT_LEN, I8042_COMMAND_PORT,
};
use pvmm_devices::serial::{SerialConsole, COM1_IRQ, COM1_PORT_BASE, COM_PORT_LEN};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::acpi::{build_tables, AcpiError};
use crate::boot::{detect_kernel_format, load_kernel, open_input_file, BootError, BootSpec};
use crate::config::{ConfigError, StatsTarget, VmConfig};
use crate::exit::{VmExit, EXIT_BAD_INPUT, EXIT_HOST_ERROR};
use crate::layout::HIMEM_START;
use crate::layout::{CPPC_MMIO_SIZE, CPPC_MMIO_START, GED_IRQ, GED_MMIO_START};
use crate::live::capacity::CppcReporter;
use crate::live::hoststat::CpuTimes;
use crate::live::idle::{IdleSource, KvmHaltIdle, ThreadRunTime};
use crate::live::scheduler::{LiveScheduler, LiveVcpu, PlacementPolicy, PlacementTotals};
use crate::memory::{create_guest_memory, low_ram_end, MemoryError};
use crate::vstate::vcpu::{Vcpu, VcpuBuses, VcpuError, VcpuStarted};
use crate::vstate::vm::{Vm, VmError};
use pvmm_devices::cppc::{CppcDevice, CppcShared, ProcSchedstat};
use pvmm_devices::ged::{GedDevice, GedShared, GED_MMIO_LEN};
use pvmm_scheduler::{CpuSet, EngineConfig, Executor, HostTopology, LinuxExecutor};

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
    /// Device wiring.
    #[error("device setup: {0}")]
    Devices(String),
    /// Host topology, CPU list or stats file: the user's input.
    #[error("{0}")]
    Placement(String),
    /// Starting placement failed on the host.
    #[error("vCPU placement: {0}")]
    PlacementHost(String),
}

impl From<BusError> for VmmError {
    fn from(e: BusError) -> Self {
        VmmError::Devices(e.to_string())
    }
}

impl VmmError {
    /// The exit status: 2 for the user's input and environment, 1 for host failures.
    pub fn status(&self) -> i32 {
        match self {
            VmmError::Config(_) | VmmError::Memory(_) => EXIT_BAD_INPUT,
            VmmError::Boot(BootError::GuestMemory(_)) => EXIT_HOST_ERROR,
            VmmError::Boot(_) => EXIT_BAD_INPUT,
            VmmError::Vm(
                VmError::Open { .. } | VmError::NotKvm(_) | VmError::TooManyVcpus { .. },
            ) => EXIT_BAD_INPUT,
            VmmError::Acpi(AcpiError::TooManyVcpus(_)) => EXIT_BAD_INPUT,
            VmmError::Placement(_) => EXIT_BAD_INPUT,
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

/// A running VM: its vCPU thread ids and the channel on which it ends.
pub struct RunningVm {
    /// Each vCPU's thread, in vCPU order.
    pub vcpus: Vec<VcpuStarted>,
    exits: Receiver<VmExit>,
    placement: PlacementReport,
    // Keep guest memory and KVM objects alive while vCPUs run.
    _vm: Arc<Vm>,
    _mem: crate::memory::GuestMemory,
}

impl RunningVm {
    /// Blocks until the VM ends and says why.
    pub fn wait(&self) -> VmExit {
        self.exits
            .recv()
            .unwrap_or_else(|_| VmExit::HostError("every vCPU thread ended unexpectedly".into()))
    }

    /// The exit, if the VM has ended within `timeout`.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<VmExit> {
        self.exits.recv_timeout(timeout).ok()
    }

    /// The one-line placement summary (migrations, measured package idle share).
    pub fn placement_summary(&self) -> String {
        let p = &self.placement;
        let totals = p.totals.lock().map(|t| t.clone()).unwrap_or_default();
        LiveScheduler::summary_line(
            p.policy,
            &p.topology,
            &totals,
            &p.host_stat_at_start,
            p.started.elapsed(),
        )
    }
}

/// What the exit summary needs from the live scheduler.
struct PlacementReport {
    policy: PlacementPolicy,
    topology: HostTopology,
    totals: Arc<Mutex<PlacementTotals>>,
    host_stat_at_start: Vec<(u32, CpuTimes)>,
    started: std::time::Instant,
}

/// Resolves `--host-topology` and `--cpus`, and checks that pvmm may run on every CPU left.
pub fn resolve_topology(config: &VmConfig) -> Result<HostTopology, VmmError> {
    let p = &config.placement;
    let topology = pvmm_scheduler::parse_host_topology_arg(&p.host_topology)
        .map_err(|e| VmmError::Placement(format!("--host-topology {}: {e}", p.host_topology)))?;
    let topology = match &p.cpus {
        Some(list) => {
            let set: CpuSet = list
                .parse()
                .map_err(|e| VmmError::Placement(format!("--cpus {list}: {e}")))?;
            topology
                .restrict(&set)
                .map_err(|e| VmmError::Placement(format!("--cpus {list}: {e}")))?
        }
        None => topology,
    };
    if p.policy != PlacementPolicy::None {
        // Pinning to a CPU outside pvmm's own affinity fails; say so now, not at the first tick.
        if let Ok(allowed) = LinuxExecutor.read(0) {
            let outside = topology.cpu_set().difference(&allowed);
            if !outside.is_empty() {
                return Err(VmmError::Placement(format!(
                    "host topology names CPUs {outside} that pvmm may not run on (allowed: {allowed}); use --cpus or a matching --host-topology"
                )));
            }
        }
    }
    Ok(topology)
}

fn open_stats(target: &Option<StatsTarget>) -> Result<Option<Box<dyn Write + Send>>, VmmError> {
    Ok(match target {
        None => None,
        Some(StatsTarget::Stdout) => Some(Box::new(ConsoleOutput)),
        Some(StatsTarget::File(path)) => Some(Box::new(std::io::LineWriter::new(
            std::fs::File::create(path)
                .map_err(|e| VmmError::Placement(format!("--stats {}: {e}", path.display())))?,
        ))),
    })
}

fn log(config: &VmConfig, msg: impl AsRef<str>) {
    if config.verbose {
        eprintln!("pvmm: {}", msg.as_ref());
    }
}

/// Builds the VM described by `config` and starts its vCPUs.
pub fn start(config: &VmConfig) -> Result<RunningVm, VmmError> {
    config.validate()?;
    // Check the files before touching KVM, so bad input is reported the same everywhere.
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
    let topology = resolve_topology(config)?;
    let stats_out = open_stats(&config.placement.stats)?;

    let vm = Arc::new(Vm::new(&config.kvm_device, config.vcpus)?);
    let mem = create_guest_memory(config.memory_bytes())?;
    vm.register_memory(&mem)?;

    let tables = build_tables(config.vcpus)?;
    for t in &tables.tables {
        mem.write_slice(&t.bytes, GuestAddress(t.addr))
            .map_err(|e| BootError::GuestMemory(e.to_string()))?;
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

    let (exit_tx, exits) = unbounded::<VmExit>();
    let power_sink = |tx: crossbeam::channel::Sender<VmExit>| -> PowerEventSink {
        Box::new(move |event| {
            let _ = tx.send(match event {
                PowerEvent::PowerOff => VmExit::PowerOff,
                PowerEvent::Reset => VmExit::Reset,
            });
        })
    };

    let serial_irq =
        EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Devices(e.to_string()))?;
    vm.register_irq(&serial_irq, COM1_IRQ)?;
    let serial = Arc::new(Mutex::new(SerialConsole::new(
        serial_irq,
        Box::new(ConsoleOutput),
    )));
    let mut pio = Bus::new();
    pio.insert(
        serial.clone(),
        u64::from(COM1_PORT_BASE),
        u64::from(COM_PORT_LEN),
    )?;
    pio.insert(
        Arc::new(Mutex::new(AcpiPowerDevice::new(power_sink(
            exit_tx.clone(),
        )))),
        u64::from(ACPI_POWER_PORT_BASE),
        u64::from(ACPI_POWER_PORT_LEN),
    )?;
    pio.insert(
        Arc::new(Mutex::new(I8042ResetDevice::new(power_sink(
            exit_tx.clone(),
        )))),
        u64::from(I8042_COMMAND_PORT),
        1,
    )?;
    // CPPC registers and the GED that announces capacity changes.
    let cppc = Arc::new(CppcShared::new(config.vcpus));
    let ged_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Devices(e.to_string()))?;
    vm.register_irq(&ged_irq, GED_IRQ)?;
    let ged = Arc::new(GedShared::new(ged_irq));
    let mut mmio = Bus::new();
    mmio.insert(
        Arc::new(Mutex::new(CppcDevice::new(
            cppc.clone(),
            Box::new(ProcSchedstat),
        ))),
        CPPC_MMIO_START,
        CPPC_MMIO_SIZE,
    )?;
    mmio.insert(
        Arc::new(Mutex::new(GedDevice(ged.clone()))),
        GED_MMIO_START,
        GED_MMIO_LEN,
    )?;
    let buses = VcpuBuses {
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
    };

    let supported = Vcpu::supported_cpuid(&vm)?;
    let vcpus = (0..config.vcpus)
        .map(|i| Vcpu::new(&vm, i, config.vcpus, &mem, &entry, &supported))
        .collect::<Result<Vec<_>, _>>()?;
    // The guest's halt counters drive placement; fall back to thread run time (and say so
    // once) where KVM has no binary stats.
    let mut idle_sources: Vec<Option<crate::live::kvm_stats::VcpuHaltStats>> =
        Vec::with_capacity(vcpus.len());
    let mut stats_warning = None;
    for vcpu in &vcpus {
        match vcpu.halt_stats() {
            Ok(stats) => idle_sources.push(Some(stats)),
            Err(e) => {
                stats_warning.get_or_insert(e.to_string());
                idle_sources.push(None);
            }
        }
    }
    if let Some(why) = stats_warning {
        eprintln!("pvmm: KVM halt statistics unavailable ({why}); using vCPU thread run time from /proc instead");
    }
    let gate = Arc::new(Barrier::new(vcpus.len() + 1));
    let (started_tx, started_rx) = unbounded();
    for vcpu in vcpus {
        vcpu.spawn(
            buses.clone(),
            started_tx.clone(),
            gate.clone(),
            exit_tx.clone(),
        )?;
    }
    let mut started: Vec<VcpuStarted> = Vec::with_capacity(config.vcpus as usize);
    for _ in 0..config.vcpus {
        match started_rx.recv() {
            Ok(s) => started.push(s),
            Err(_) => return Err(VmmError::Devices("a vCPU thread died at start".into())),
        }
    }
    started.sort_by_key(|s| s.index);
    for s in &started {
        log(config, format!("vcpu{} tid {}", s.index, s.tid));
        cppc.set_tid(s.index, s.tid);
    }
    let live_vcpus = started
        .iter()
        .zip(idle_sources)
        .map(|(s, src)| {
            let source: Box<dyn IdleSource> = match src {
                Some(halt) => Box::new(KvmHaltIdle::new(halt, s.tid)),
                None => Box::new(ThreadRunTime::new(s.tid)),
            };
            LiveVcpu::new(s.index, s.tid, source)
        })
        .collect();
    let mut scheduler = LiveScheduler::new(
        config.placement.policy,
        topology.clone(),
        EngineConfig::default(),
        Box::new(LinuxExecutor),
        live_vcpus,
        stats_out,
    )
    .with_capacity_reporter(Box::new(CppcReporter::new(cppc, ged, {
        let vm = vm.clone();
        Box::new(move || vm.ioapic_pin_unmasked(GED_IRQ))
    })));
    // vCPUs start where the policy wants them: place before releasing the gate.
    let placed = scheduler.tick();
    gate.wait();
    placed.map_err(|e| VmmError::PlacementHost(e.to_string()))?;
    let placement = PlacementReport {
        policy: config.placement.policy,
        topology,
        totals: scheduler.totals(),
        host_stat_at_start: scheduler.host_stat_at_start(),
        started: std::time::Instant::now(),
    };
    scheduler
        .spawn(Duration::from_millis(config.placement.tick_ms))
        .map_err(|e| VmmError::PlacementHost(e.to_string()))?;
    spawn_console_input(serial);
    Ok(RunningVm {
        vcpus: started,
        exits,
        placement,
        _vm: vm,
        _mem: mem,
    })
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
