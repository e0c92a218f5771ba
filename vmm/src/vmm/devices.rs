//! The VM's devices: the console, power-off and reset, the CPPC registers and the GED, on the
//! port I/O and MMIO buses, all reporting guest mistakes to one counter.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::Sender;
use pvmm_devices::bus::Bus;
use pvmm_devices::cppc::{CppcDevice, CppcShared, CPPC_MMIO_LEN};
use pvmm_devices::events::{GuestErrorCounter, SharedEvents};
use pvmm_devices::ged::{GedDevice, GedShared, GED_MMIO_LEN};
use pvmm_devices::power::{
    AcpiPowerDevice, I8042ResetDevice, PowerEvent, PowerEventSink, ACPI_POWER_PORT_BASE,
    ACPI_POWER_PORT_LEN, I8042_COMMAND_PORT,
};
use pvmm_devices::serial::{SerialConsole, COM1_IRQ, COM1_PORT_BASE, COM_PORT_LEN};
use vmm_sys_util::eventfd::EventFd;

use super::error::{SetupError, VmmError};
use crate::config::VmConfig;
use crate::cppc::ProcSchedstat;
use crate::cppc::CPPC_HIGHEST_PERF;
use crate::exit::VmExit;
use crate::layout::{CPPC_MMIO_START, GED_IRQ, GED_MMIO_START};
use crate::seccomp::{SeccompFilters, ThreadKind};
use crate::vstate::vcpu::VcpuBuses;
use crate::vstate::vm::Vm;

/// How long to wait for a retry when the UART's receive FIFO is full.
const SERIAL_INPUT_RETRY: Duration = Duration::from_millis(10);
/// Host input is read in chunks of this size.
const SERIAL_INPUT_CHUNK: usize = 64;

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

/// The devices and the buses vCPUs dispatch to.
pub(super) struct Devices {
    pub(super) buses: VcpuBuses,
    pub(super) serial: Arc<Mutex<SerialConsole>>,
    pub(super) cppc: Arc<CppcShared>,
    pub(super) ged: Arc<GedShared>,
    /// Every guest mistake the buses and devices report.
    pub(super) guest_errors: Arc<GuestErrorCounter>,
}

/// Builds every device, wires its interrupt, and puts it on its bus.
pub(super) fn build_devices(
    config: &VmConfig,
    vm: &Vm,
    exit_tx: &Sender<VmExit>,
) -> Result<Devices, VmmError> {
    let guest_errors = Arc::new(GuestErrorCounter::default());
    let events: SharedEvents = guest_errors.clone();
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(SetupError::EventFd)?;
    vm.register_irq(&serial_irq, COM1_IRQ)?;
    let serial = Arc::new(Mutex::new(SerialConsole::new(
        serial_irq,
        Box::new(ConsoleOutput),
    )));
    let pio = port_io_bus(serial.clone(), exit_tx, &events)?;
    // CPPC registers and the GED that announces capacity changes and the power button.
    let cppc = Arc::new(CppcShared::new(config.vcpus, CPPC_HIGHEST_PERF));
    let ged_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(SetupError::EventFd)?;
    vm.register_irq(&ged_irq, GED_IRQ)?;
    let ged = Arc::new(GedShared::new(ged_irq));
    let mut mmio = Bus::new(events.clone());
    mmio.insert(
        Arc::new(Mutex::new(CppcDevice::new(
            cppc.clone(),
            Box::new(ProcSchedstat),
            events.clone(),
        ))),
        CPPC_MMIO_START,
        CPPC_MMIO_LEN,
    )?;
    mmio.insert(
        Arc::new(Mutex::new(GedDevice::new(ged.clone(), events))),
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

/// The port I/O bus: the console, the ACPI power block and the i8042 reset line, the last two
/// ending the VM through `exit_tx`.
fn port_io_bus(
    serial: Arc<Mutex<SerialConsole>>,
    exit_tx: &Sender<VmExit>,
    events: &SharedEvents,
) -> Result<Bus, VmmError> {
    let power_sink = || -> PowerEventSink {
        let tx = exit_tx.clone();
        Box::new(move |event| {
            // The main thread may already be ending the VM; then nothing is waiting.
            let _ = tx.send(match event {
                PowerEvent::PowerOff => VmExit::PowerOff,
                PowerEvent::Reset => VmExit::Reset,
            });
        })
    };
    let mut pio = Bus::new(events.clone());
    pio.insert(serial, u64::from(COM1_PORT_BASE), u64::from(COM_PORT_LEN))?;
    pio.insert(
        Arc::new(Mutex::new(AcpiPowerDevice::new(
            power_sink(),
            events.clone(),
        ))),
        u64::from(ACPI_POWER_PORT_BASE),
        u64::from(ACPI_POWER_PORT_LEN),
    )?;
    pio.insert(
        Arc::new(Mutex::new(I8042ResetDevice::new(
            power_sink(),
            events.clone(),
        ))),
        u64::from(I8042_COMMAND_PORT),
        1,
    )?;
    Ok(pio)
}

/// The console-input thread and what ends it.
pub struct ConsoleInput {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl ConsoleInput {
    /// Ends and joins the thread, which lets go of the serial console (and its interrupt
    /// eventfd). Reading stdin stops; anything typed later stays in stdin.
    pub fn stop(&mut self) {
        // An eventfd write fails only when its counter would overflow: it is readable then.
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Feeds pvmm's stdin to the guest's serial console until stdin ends or the VM stops, on a
/// thread confined by the console seccomp filter. The thread waits in `poll` on stdin and on an
/// eventfd that [`ConsoleInput::stop`] writes, so it ends with its VM even while stdin stays
/// open (a terminal, a service manager's pipe): a process that runs VM after VM keeps no
/// thread, and no serial console, of a VM that has ended. `None` when the thread could not be
/// started: the guest still runs, without console input.
pub(super) fn spawn_console_input(
    serial: Arc<Mutex<SerialConsole>>,
    seccomp: Arc<SeccompFilters>,
) -> Option<ConsoleInput> {
    let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK).ok()?);
    let thread_stop = stop.clone();
    let thread = std::thread::Builder::new()
        .name("console-in".into())
        .spawn(move || {
            seccomp.confine(ThreadKind::ConsoleInput);
            copy_input(&serial, &thread_stop);
        })
        .ok()?;
    Some(ConsoleInput {
        stop,
        thread: Some(thread),
    })
}

/// What woke the console thread.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// The VM is stopping (or `poll` itself failed): the thread ends.
    Stop,
    /// Stdin has input, has ended or is in error: `read` says which.
    Input,
    /// The timeout passed.
    Timeout,
}

/// Waits for the stop eventfd and, with `stdin`, for stdin; `timeout_ms` -1 waits forever.
fn wait(stop: &EventFd, stdin: bool, timeout_ms: libc::c_int) -> Wake {
    let mut fds = [
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let count: libc::nfds_t = if stdin { 2 } else { 1 };
    loop {
        // SAFETY: `fds` holds at least `count` initialized entries.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout_ms) };
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Wake::Stop;
        }
        return if fds[0].revents != 0 {
            Wake::Stop
        } else if ready == 0 {
            Wake::Timeout
        } else {
            Wake::Input
        };
    }
}

/// The console thread: copies stdin to the UART's receive FIFO, waiting for room when it is
/// full, until stdin ends or `stop` is written. Stdin is read directly, not through Rust's
/// buffered `Stdin`, so that `poll` sees everything not yet copied.
fn copy_input(serial: &Mutex<SerialConsole>, stop: &EventFd) {
    let mut buf = [0u8; SERIAL_INPUT_CHUNK];
    let retry_ms = SERIAL_INPUT_RETRY.as_millis() as libc::c_int;
    loop {
        if wait(stop, true, -1) == Wake::Stop {
            return;
        }
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                _ => return,
            }
        }
        if n == 0 {
            return;
        }
        let mut pending = &buf[..n as usize];
        while !pending.is_empty() {
            let taken = match serial.lock() {
                Ok(mut s) => s.enqueue_input(pending).unwrap_or(0),
                Err(_) => return,
            };
            pending = &pending[taken..];
            if !pending.is_empty() && wait(stop, false, retry_ms) == Wake::Stop {
                return;
            }
        }
    }
}
