//! The VM's virtio devices, in three steps: opened (and their images locked) with the other
//! input checks, before any KVM object exists, so that a bad `--disk` or `--net` ends pvmm
//! with status 2;
//! put on the MMIO bus at their slots ([`crate::layout::virtio_slots`], which the DSDT
//! describes), their queue notifications registered as ioeventfds and their interrupts as
//! irqfds; then served each by a worker thread (`pvmm-blk0`, `pvmm-rng0`) under the device
//! seccomp filter.

use std::sync::{Arc, Mutex};

use pvmm_devices::bus::Bus;
use pvmm_devices::events::SharedEvents;
use pvmm_devices::virtio::block::Block;
use pvmm_devices::virtio::mmio::{Interrupt, MmioTransport, MMIO_WINDOW_LEN, QUEUE_NOTIFY_OFFSET};
use pvmm_devices::virtio::net::{Net, NET_HEADER_LEN};
use pvmm_devices::virtio::rng::Rng;
use pvmm_devices::virtio::tap::{stable_mac, Tap};
use pvmm_devices::virtio::worker::Worker;
use pvmm_devices::virtio::VirtioDevice;

/// The name prefixes of the device threads (`pvmm-blk0`, `pvmm-net0`, `pvmm-rng0`): their CPU
/// time is the VM's I/O load, which placement counts on their package.
pub const DEVICE_THREADS: &[&str] = &[BLOCK_THREAD, NET_THREAD, RNG_THREAD];
/// A disk's worker thread, by the disk's index.
const BLOCK_THREAD: &str = "pvmm-blk";
/// A network card's worker thread, by the card's index.
const NET_THREAD: &str = "pvmm-net";
/// The entropy device's worker thread.
const RNG_THREAD: &str = "pvmm-rng";
use vmm_sys_util::eventfd::EventFd;

use super::error::{SetupError, VmmError};
use crate::config::VirtioConfig;
use crate::layout::virtio_slots;
use crate::memory::GuestMemory;
use crate::seccomp::{SeccompFilters, ThreadKind};
use crate::vstate::vm::Vm;

/// A device opened for the VM, with the name its worker thread gets.
pub(super) struct OpenDevice {
    name: String,
    device: Box<dyn VirtioDevice>,
}

/// Opens every device `config` asks for, in slot order: disks first (the first is `vda`),
/// then network cards, then the entropy device.
pub(super) fn open_devices(config: &VirtioConfig) -> Result<Vec<OpenDevice>, VmmError> {
    let mut out = Vec::with_capacity(config.count());
    for (i, disk) in config.disks.iter().enumerate() {
        out.push(OpenDevice {
            name: format!("{BLOCK_THREAD}{i}"),
            device: Box::new(Block::open(&disk.path, disk.readonly)?),
        });
    }
    for (i, net) in config.nets.iter().enumerate() {
        let tap = Tap::open(&net.tap, NET_HEADER_LEN)?;
        let mac = net.mac.unwrap_or_else(|| stable_mac(&net.tap));
        out.push(OpenDevice {
            name: format!("{NET_THREAD}{i}"),
            device: Box::new(Net::on_tap(tap, mac)),
        });
    }
    if config.rng {
        out.push(OpenDevice {
            name: format!("{RNG_THREAD}0"),
            device: Box::new(Rng::new()),
        });
    }
    Ok(out)
}

/// A device on the bus, not yet served.
pub(super) struct AttachedDevice {
    name: String,
    transport: MmioTransport,
}

/// Puts each device on `mmio` at its slot and wires its notifications and interrupt in KVM.
pub(super) fn attach(
    devices: Vec<OpenDevice>,
    vm: &Vm,
    mem: &GuestMemory,
    mmio: &mut Bus,
    events: &SharedEvents,
) -> Result<Vec<AttachedDevice>, VmmError> {
    let slots = virtio_slots(devices.len());
    let mut out = Vec::with_capacity(devices.len());
    for (open, slot) in devices.into_iter().zip(slots) {
        let line = EventFd::new(libc::EFD_NONBLOCK).map_err(SetupError::EventFd)?;
        vm.register_irq(&line, slot.irq)?;
        let transport = MmioTransport::new(
            open.device,
            mem.clone(),
            Arc::new(Interrupt::new(line)),
            events.clone(),
        )
        .map_err(SetupError::Virtio)?;
        for (queue, fd) in (0u32..).zip(transport.notifiers()) {
            vm.register_mmio_notify(fd, slot.base + QUEUE_NOTIFY_OFFSET, queue)?;
        }
        mmio.insert(
            Arc::new(Mutex::new(transport.clone())),
            slot.base,
            MMIO_WINDOW_LEN,
        )?;
        out.push(AttachedDevice {
            name: open.name,
            transport,
        });
    }
    Ok(out)
}

/// The devices' worker threads; dropping this stops each once its request in flight is done.
#[derive(Default)]
pub struct VirtioWorkers(Vec<Worker>);

impl VirtioWorkers {
    /// Stops every worker after the request it is serving.
    pub fn stop(&mut self) {
        for w in &mut self.0 {
            w.stop();
        }
    }
}

/// Starts a worker thread for each device, confined by the device filter.
pub(super) fn start_workers(
    devices: Vec<AttachedDevice>,
    seccomp: &Arc<SeccompFilters>,
) -> Result<VirtioWorkers, VmmError> {
    let mut workers = Vec::with_capacity(devices.len());
    for d in devices {
        let filters = seccomp.clone();
        let confine = Box::new(move || filters.confine(ThreadKind::Device));
        let worker = Worker::spawn(&d.name, d.transport, confine)
            .map_err(|e| SetupError::DeviceThread(d.name.clone(), e))?;
        workers.push(worker);
    }
    Ok(VirtioWorkers(workers))
}
