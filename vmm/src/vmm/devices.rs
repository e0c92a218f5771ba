//! The VM's devices: the console, power-off and reset, the CPPC registers and the GED, on the
//! port I/O and MMIO buses, all reporting guest mistakes to one counter.

use std::io::Write;
use std::sync::{Arc, Mutex};

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
use super::virtio::{attach, AttachedDevice, OpenDevice};
use crate::config::VmConfig;
use crate::cppc::ProcSchedstat;
use crate::cppc::CPPC_HIGHEST_PERF;
use crate::exit::VmExit;
use crate::layout::{CPPC_MMIO_START, GED_IRQ, GED_MMIO_START};
use crate::memory::GuestMemory;
use crate::vstate::vcpu::VcpuBuses;
use crate::vstate::vm::Vm;

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
    /// The virtio devices, on the MMIO bus, not yet served.
    pub(super) virtio: Vec<AttachedDevice>,
}

/// Builds every device, wires its interrupt, and puts it on its bus.
pub(super) fn build_devices(
    config: &VmConfig,
    vm: &Vm,
    exit_tx: &Sender<VmExit>,
    (virtio, mem): (Vec<OpenDevice>, &GuestMemory),
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
        Arc::new(Mutex::new(GedDevice::new(ged.clone(), events.clone()))),
        GED_MMIO_START,
        GED_MMIO_LEN,
    )?;
    let virtio = attach(virtio, vm, mem, &mut mmio, &events)?;
    Ok(Devices {
        buses: VcpuBuses {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
        },
        serial,
        cppc,
        ged,
        guest_errors,
        virtio,
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
