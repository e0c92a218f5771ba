//! Building one VM, in the order [`start`] takes: everything the user can get wrong (flags,
//! files, topology, the stats file, the control socket) before any KVM object exists; then the
//! KVM VM and guest memory with ACPI tables and the kernel; the devices (`devices`); the vCPU
//! threads, held at a gate; the first placement; the threads that serve the running VM; and,
//! once every thread (the main one last) is under its seccomp filter, the gate opens and the
//! guest runs. Why a start fails is in `error`.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use crossbeam::channel::{bounded, unbounded, Receiver, Sender};
use pvmm_devices::ged::GedShared;
use pvmm_scheduler::{CpuSet, EngineConfig, Executor, HostTopology, LinuxExecutor};
use vm_memory::{Bytes, GuestAddress};

use crate::acpi::build_tables;
use crate::api::routes::VmShape;
use crate::api::{ApiServer, ApiSocket};
use crate::boot::{detect_kernel_format, load_kernel, open_input_file, BootError, BootSpec};
use crate::config::{PlacementPolicy, StatsTarget, VmConfig};
use crate::cppc::{CppcFrequencies, SYSFS_CPUFREQ};
use crate::exit::VmExit;
use crate::layout::{virtio_slots, GED_IRQ, HIMEM_START};
use crate::live::capacity::CppcReporter;
use crate::live::control::PlacementControl;
use crate::live::idle::{IdleSource, KvmHaltIdle, ThreadRunTime};
use crate::live::scheduler::{LiveScheduler, LiveVcpu};
use crate::memory::{create_guest_memory, low_ram_end};
use crate::running::{PlacementReport, RunningVm, VmCore, VmDescription};
use crate::seccomp::{SeccompFilters, ThreadKind};
use crate::signals::SignalThread;
use crate::vstate::handle::{register_kick_handler, RunControl, VcpuGate, VcpuHandle};
use crate::vstate::stats::VcpuHaltStats;
use crate::vstate::vcpu::{Vcpu, VcpuBuses, VcpuStarted};
use crate::vstate::vm::Vm;
use pvmm_tick::hotplug::{OnlineCpus, SYSFS_ONLINE};
use pvmm_tick::own_threads::OwnThreads;

mod devices;
mod error;
mod phases;
mod virtio;

pub use virtio::VirtioWorkers;

use crate::console::spawn_console_input;
use devices::{build_devices, Devices};
pub use error::{PlacementInputError, PlacementStartError, SetupError, VmmError};

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
    phases: &mut phases::Phases,
) -> Result<(crate::memory::GuestMemory, crate::boot::EntryPoint), VmmError> {
    let mem = create_guest_memory(config.memory_bytes())?;
    vm.register_memory(&mem)?;
    phases.mark("memory");
    let freqs = CppcFrequencies::host(Path::new(SYSFS_CPUFREQ));
    log(
        config,
        format!(
            "CPPC frequencies: nominal {} MHz, lowest {} MHz",
            freqs.nominal_mhz, freqs.lowest_mhz
        ),
    );
    let virtio = virtio_slots(config.virtio.count());
    let tables = build_tables(config.vcpus, &freqs, &virtio)?;
    for t in &tables.tables {
        mem.write_slice(&t.bytes, GuestAddress(t.addr))
            .map_err(BootError::GuestMemory)?;
    }
    phases.mark("acpi");
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
    phases.mark("kernel+initrd");
    log(config, format!("entry {entry:x?}"));
    Ok((mem, entry))
}

/// The vCPU threads (held at a gate until placed and every other thread is confined) and
/// each one's idle signal.
struct StartedVcpus {
    handles: Vec<VcpuHandle>,
    live: Vec<LiveVcpu>,
    gate: VcpuGate,
}

/// Creates the vCPUs, starts their threads held at a gate, and pairs each with its idle signal.
fn start_vcpus(
    config: &VmConfig,
    vm: &Vm,
    mem: &crate::memory::GuestMemory,
    entry: &crate::boot::EntryPoint,
    buses: &VcpuBuses,
    exit_tx: &Sender<VmExit>,
    seccomp: &Arc<SeccompFilters>,
) -> Result<StartedVcpus, VmmError> {
    let supported = Vcpu::supported_cpuid(vm)?;
    let vcpus = (0..config.vcpus)
        .map(|i| Vcpu::new(vm, i, config.vcpus, mem, entry, &supported))
        .collect::<Result<Vec<_>, _>>()?;
    let halt_stats = open_halt_stats(&vcpus);
    register_kick_handler().map_err(SetupError::KickSignal)?;
    let barrier = Arc::new(Barrier::new(vcpus.len() + 1));
    let (started_tx, started_rx) = unbounded();
    let mut threads = Vec::with_capacity(vcpus.len());
    for vcpu in vcpus {
        let control = Arc::new(RunControl::default());
        let thread = vcpu.spawn(
            buses.clone(),
            (started_tx.clone(), barrier.clone()),
            exit_tx.clone(),
            control.clone(),
            seccomp.clone(),
        )?;
        threads.push(Some((thread, control)));
    }
    let started = wait_started(&started_rx, config.vcpus)?;
    // Every thread has started and waits at the barrier, or is about to.
    let controls = threads.iter().flatten().map(|(_, c)| c.clone()).collect();
    let gate = VcpuGate::new(barrier, controls);
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

/// Each vCPU's KVM halt counters, which drive placement; where KVM has no binary stats the
/// vCPU falls back to its thread's run time, and pvmm says so once.
fn open_halt_stats(vcpus: &[Vcpu]) -> Vec<Option<VcpuHaltStats>> {
    let mut warning = None;
    let stats = vcpus
        .iter()
        .map(|vcpu| {
            vcpu.halt_stats()
                .map_err(|e| warning.get_or_insert(e.to_string()).clone())
                .ok()
        })
        .collect();
    if let Some(why) = warning {
        eprintln!("pvmm: KVM halt statistics unavailable ({why}); using vCPU thread run time from /proc instead");
    }
    stats
}

/// Waits for `count` vCPU threads to report their thread ids; in vCPU order.
fn wait_started(started: &Receiver<VcpuStarted>, count: u32) -> Result<Vec<VcpuStarted>, VmmError> {
    let mut all = (0..count)
        .map(|_| started.recv().map_err(|_| SetupError::VcpuDied))
        .collect::<Result<Vec<_>, _>>()?;
    all.sort_by_key(|s| s.index);
    Ok(all)
}

/// The running scheduler and what the VM's core keeps of it.
struct StartedPlacement {
    control: Arc<PlacementControl>,
    report: PlacementReport,
    /// The stop channel and the `pvmm-sched` thread.
    thread: (Sender<()>, std::thread::JoinHandle<()>),
}

/// Places the vCPUs once while they wait at their gate, and starts the scheduler thread.
fn start_scheduler(
    (config, seccomp): (&VmConfig, &Arc<SeccompFilters>),
    topology: &HostTopology,
    live: Vec<LiveVcpu>,
    stats_out: Option<Box<dyn Write + Send>>,
    handles: &[VcpuHandle],
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
        EngineConfig {
            share_package: config.placement.share_package,
            ..EngineConfig::default()
        },
        Box::new(LinuxExecutor),
        live,
        stats_out,
    )
    .with_control(control.clone())
    .with_own_threads(OwnThreads::new(vcpu_tids).counting_load_of(virtio::DEVICE_THREADS))
    .with_guest_errors(devices.guest_errors.clone())
    .with_capacity_reporter(Box::new(CppcReporter::new(
        devices.cppc.clone(),
        devices.ged.clone(),
        ged_unmasked,
    )));
    if let Some(online) = OnlineCpus::watch(topology.clone(), SYSFS_ONLINE.into()) {
        scheduler = scheduler.with_online_cpus(online);
    }
    // vCPUs start where the policy wants them: place before the gate opens.
    scheduler
        .tick()
        .map_err(PlacementStartError::FirstPlacement)?;
    let report = PlacementReport {
        topology: topology.clone(),
        totals: scheduler.totals(),
        host_stat_at_start: scheduler.host_stat_at_start(),
        started: std::time::Instant::now(),
    };
    let (stop_tx, stop_rx) = bounded(0);
    let thread = scheduler
        .spawn(
            Duration::from_millis(config.placement.tick_ms),
            stop_rx,
            seccomp.clone(),
        )
        .map_err(PlacementStartError::Thread)?;
    Ok(StartedPlacement {
        control,
        report,
        thread: (stop_tx, thread),
    })
}

/// What the user can get wrong, checked and opened before any KVM object exists.
struct Prepared {
    topology: HostTopology,
    virtio: Vec<virtio::OpenDevice>,
    stats_out: Option<Box<dyn Write + Send>>,
    api_socket: Option<ApiSocket>,
}

/// Checks the configuration and the files, resolves the host topology, opens the stats file
/// and binds the control socket (before any thread starts: it is created under a narrowed
/// umask).
fn prepare(config: &VmConfig) -> Result<Prepared, VmmError> {
    check_inputs(config)?;
    let virtio = virtio::open_devices(&config.virtio)?;
    let topology = resolve_topology(config)?;
    let stats_out = open_stats(&config.placement.stats)?;
    let api_socket = match &config.api_socket {
        Some(path) => Some(ApiSocket::bind(path)?),
        None => None,
    };
    Ok(Prepared {
        topology,
        virtio,
        stats_out,
        api_socket,
    })
}

/// Whether the guest has unmasked the GED's interrupt line, i.e. listens for capacity
/// notifications and the power button. Holds the KVM VM, which outlives every vCPU thread.
fn ged_listening(vm: &Arc<Vm>) -> impl Fn() -> bool + Send + Sync + Clone + 'static {
    let vm = vm.clone();
    move || vm.ioapic_pin_unmasked(GED_IRQ)
}

/// The part of the VM that the main thread, the control socket and the signal thread share;
/// also returns where shutdown deadlines arrive.
fn vm_core(
    config: &VmConfig,
    topology: &HostTopology,
    vcpus: Vec<VcpuHandle>,
    placement: (Arc<PlacementControl>, PlacementReport),
    ged: Arc<GedShared>,
    ged_listening: Box<dyn Fn() -> bool + Send + Sync>,
) -> (Arc<VmCore>, Receiver<std::time::Instant>) {
    let (deadline_tx, deadlines) = unbounded();
    let core = Arc::new(VmCore {
        vcpus,
        control: placement.0,
        ged,
        description: VmDescription {
            vcpus: config.vcpus,
            memory_mib: config.memory_mib,
            kernel: config.kernel.display().to_string(),
            name: config.name.clone(),
        },
        shape: VmShape {
            vcpus: config.vcpus,
            cpus: topology.cpu_set(),
        },
        deadlines: deadline_tx,
        report: placement.1,
        policy: Mutex::new(config.placement.policy),
        shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
        ged_listening,
    });
    (core, deadlines)
}

/// Starts the threads that act on a running VM from outside: the control socket's (with
/// `--api-socket`) and the signal thread.
fn serve(
    core: &Arc<VmCore>,
    api_socket: Option<ApiSocket>,
    seccomp: &Arc<SeccompFilters>,
) -> Result<(Option<ApiServer>, SignalThread), VmmError> {
    // Signal handlers first: once the control socket answers, a client (a service manager, a
    // test) may send SIGTERM or SIGHUP at once, and the default action would end pvmm.
    let signals =
        SignalThread::spawn(core.clone(), seccomp.clone()).map_err(SetupError::SignalThread)?;
    let api = match api_socket {
        Some(socket) => Some(
            socket
                .serve(core.clone(), seccomp.clone())
                .map_err(SetupError::ApiThread)?,
        ),
        None => None,
    };
    Ok((api, signals))
}

/// Builds the VM described by `config` and starts its vCPUs, its scheduler and, with
/// `--api-socket`, its control socket. Every thread it starts installs its seccomp filter
/// (`config.seccomp`) first; then the calling thread installs the main thread's, and only then
/// do the vCPUs run guest code. On an error the vCPUs end without running any.
pub fn start(config: &VmConfig) -> Result<RunningVm, VmmError> {
    let mut phases = phases::Phases::start();
    let mut prepared = prepare(config)?;
    let seccomp = Arc::new(SeccompFilters::new(config.seccomp)?);
    phases.mark("checks");
    let vm = Arc::new(Vm::new(&config.kvm_device, config.vcpus)?);
    phases.mark("kvm-vm");
    let (mem, entry) = load_guest(config, &vm, &mut phases)?;
    let (exit_tx, exits) = unbounded::<VmExit>();
    let open = std::mem::take(&mut prepared.virtio);
    let mut devices = build_devices(config, &vm, &exit_tx, (open, &mem))?;
    let workers = virtio::start_workers(std::mem::take(&mut devices.virtio), &seccomp)?;
    phases.mark("devices");
    let started = start_vcpus(
        config,
        &vm,
        &mem,
        &entry,
        &devices.buses,
        &exit_tx,
        &seccomp,
    )?;
    phases.mark("vcpus");
    for h in &started.handles {
        devices.cppc.set_tid(h.index(), h.tid());
    }
    let listening = ged_listening(&vm);
    let placement = start_scheduler(
        (config, &seccomp),
        &prepared.topology,
        started.live,
        prepared.stats_out,
        &started.handles,
        &devices,
        Box::new(listening.clone()),
    )?;
    phases.mark("first-placement");
    log(config, phases.summary());
    let (core, deadlines) = vm_core(
        config,
        &prepared.topology,
        started.handles,
        (placement.control, placement.report),
        devices.ged,
        Box::new(listening),
    );
    let services = serve(&core, prepared.api_socket, &seccomp)?;
    let console = spawn_console_input(devices.serial, seccomp.clone());
    seccomp.apply(ThreadKind::Main)?;
    started.gate.open();
    Ok(RunningVm::new(
        core,
        exits,
        deadlines,
        placement.thread,
        services,
        (console, workers),
        mem,
    ))
}
