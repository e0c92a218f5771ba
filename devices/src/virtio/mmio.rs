//! The virtio-mmio transport, version 2 (virtio 1.2, 4.2.2): one register window per device,
//! which the guest's `virtio_mmio` driver finds through the DSDT.
//!
//! The register file owns the driver's side of the device ([`Transport`]): status, negotiated
//! features, the queues' sizes and addresses. It lives behind one mutex that the vCPU thread
//! (register accesses) and the device's worker thread (queue processing) share; the interrupt
//! status is an atomic so that the worker can raise it and a vCPU acknowledge it without
//! waiting for a request to finish.
//!
//! What the driver may do is checked at each step: features only before FEATURES_OK, queue
//! setup only while the queue is not ready, status bits only added (0 resets), and the queues
//! checked against guest RAM at DRIVER_OK. A write that breaks a rule is ignored and counted.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::{
    status, GuestMemory, VirtioDevice, TRANSPORT_FEATURES, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX,
};
use crate::bus::BusDevice;
use crate::events::SharedEvents;

/// The window's size: registers up to 0x100, then the device's configuration space.
pub const MMIO_WINDOW_LEN: u64 = 0x1000;
/// Where the device's configuration space starts in the window.
const CONFIG_START: u64 = 0x100;
/// "virt", little-endian: the magic value the driver checks first.
const MAGIC: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout.
const VERSION: u32 = 2;
/// "PVMM", little-endian: the subsystem vendor ID.
const VENDOR_ID: u32 = 0x4d4d_5650;

/// The registers (offsets in the window; all 32 bits wide).
mod reg {
    pub const MAGIC: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
}

/// The QueueNotify register's offset: where the VMM registers each queue's ioeventfd.
pub const QUEUE_NOTIFY_OFFSET: u64 = reg::QUEUE_NOTIFY;

/// Interrupt status bit: a used buffer was added.
pub const INT_USED_BUFFER: u32 = 1;
/// Interrupt status bit: the configuration (or DEVICE_NEEDS_RESET) changed.
pub const INT_CONFIG_CHANGE: u32 = 2;

/// How the device interrupts the guest: a status word the driver reads and acknowledges, and
/// the line's eventfd (an irqfd).
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    line: EventFd,
}

impl Interrupt {
    /// An interrupt raised by writing `line`.
    pub fn new(line: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            line,
        }
    }

    /// Sets `bits` in the status and raises the line.
    pub fn raise(&self, bits: u32) {
        self.status.fetch_or(bits, Ordering::AcqRel);
        // A full eventfd counter is already readable: the guest will be interrupted.
        let _ = self.line.write(1);
    }

    fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }

    fn acknowledge(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::AcqRel);
    }

    fn clear(&self) {
        self.status.store(0, Ordering::Release);
    }
}

/// The driver's side of a device, and the device itself.
pub struct Transport {
    /// The device.
    pub device: Box<dyn VirtioDevice>,
    /// Its queues, as the driver set them up.
    pub queues: Vec<Queue>,
    /// Device status (the [`status`] bits).
    pub status: u32,
    /// Features the driver accepted.
    pub driver_features: u64,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    config_generation: u32,
    /// Guest memory, for checking the queues and serving them.
    pub mem: GuestMemory,
}

impl Transport {
    /// Whether the device may use its queues: the driver is done and nothing broke.
    pub fn live(&self) -> bool {
        self.status & status::DRIVER_OK != 0 && self.status & status::DEVICE_NEEDS_RESET == 0
    }

    fn reset(&mut self, interrupt: &Interrupt) {
        self.device.reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.status = 0;
        self.driver_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        interrupt.clear();
    }

    /// Marks the device broken: the driver must reset it.
    pub fn needs_reset(&mut self, interrupt: &Interrupt) {
        if self.status & status::DEVICE_NEEDS_RESET == 0 {
            self.status |= status::DEVICE_NEEDS_RESET;
            self.config_generation = self.config_generation.wrapping_add(1);
            interrupt.raise(INT_CONFIG_CHANGE);
        }
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }
}

/// A device as the guest sees it: its register window. Clones share the device.
#[derive(Clone)]
pub struct MmioTransport {
    shared: Arc<Mutex<Transport>>,
    interrupt: Arc<Interrupt>,
    /// Each queue's notify eventfd, written on a QueueNotify register write (KVM's ioeventfd
    /// writes the same eventfds without an exit once the VMM registers them).
    notifiers: Arc<Vec<EventFd>>,
    events: SharedEvents,
}

/// Errors in building a transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A queue's eventfd could not be made.
    #[error("virtio queue eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// A queue size the device gave is not a power of two up to 32768.
    #[error("virtio queue: {0}")]
    Queue(#[from] virtio_queue::Error),
}

impl MmioTransport {
    /// `device` behind a register window, interrupting through `interrupt`.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        events: SharedEvents,
    ) -> Result<Self, TransportError> {
        let sizes = device.queue_max_sizes().to_vec();
        let queues = sizes
            .iter()
            .map(|&max| Queue::new(max))
            .collect::<Result<Vec<_>, _>>()?;
        let notifiers = sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(TransportError::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            shared: Arc::new(Mutex::new(Transport {
                device,
                queues,
                status: 0,
                driver_features: 0,
                device_features_sel: 0,
                driver_features_sel: 0,
                queue_sel: 0,
                config_generation: 0,
                mem,
            })),
            interrupt,
            notifiers: Arc::new(notifiers),
            events,
        })
    }

    /// Each queue's notify eventfd, in queue order.
    pub fn notifiers(&self) -> &[EventFd] {
        &self.notifiers
    }

    /// The device's interrupt.
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// The shared state, locked (a poisoned lock is taken over: the state stays consistent
    /// because every change is a plain field store).
    pub fn lock(&self) -> MutexGuard<'_, Transport> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The events sink.
    pub fn events(&self) -> &SharedEvents {
        &self.events
    }

    fn read_register(&self, offset: u64) -> Option<u32> {
        // The driver's interrupt handler reads this while the worker may hold the lock for a
        // whole request: the status is an atomic, read without it.
        if offset == reg::INTERRUPT_STATUS {
            return Some(self.interrupt.status());
        }
        let t = self.lock();
        let features = t.device.features() | TRANSPORT_FEATURES;
        Some(match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => VERSION,
            reg::DEVICE_ID => t.device.device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match t.device_features_sel {
                0 => (features & 0xffff_ffff) as u32,
                1 => (features >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => t
                .queues
                .get(t.queue_sel as usize)
                .map_or(0, |q| u32::from(q.max_size())),
            reg::QUEUE_READY => t
                .queues
                .get(t.queue_sel as usize)
                .map_or(0, |q| u32::from(q.ready())),
            reg::STATUS => t.status,
            reg::CONFIG_GENERATION => t.config_generation,
            _ => return None,
        })
    }

    fn write_status(&self, t: &mut Transport, value: u32) -> bool {
        if value == 0 {
            t.reset(&self.interrupt);
            return true;
        }
        // The driver only adds bits; clearing one is a reset's job.
        if value & t.status != t.status {
            return false;
        }
        let added = value & !t.status;
        if added & status::FEATURES_OK != 0 {
            let offered = t.device.features() | TRANSPORT_FEATURES;
            let acceptable =
                t.driver_features & !offered == 0 && t.driver_features & VIRTIO_F_VERSION_1 != 0;
            if !acceptable {
                // FEATURES_OK stays clear: the driver reads it back and gives up.
                t.status = value & !status::FEATURES_OK;
                return false;
            }
            let acked = t.driver_features;
            t.device.features_acked(acked);
        }
        if added & status::DRIVER_OK != 0 {
            let mem = t.mem.clone();
            let event_idx = t.driver_features & VIRTIO_RING_F_EVENT_IDX != 0;
            for q in &mut t.queues {
                q.set_event_idx(event_idx);
            }
            let broken = t.queues.iter().any(|q| q.ready() && !q.is_valid(&mem));
            t.status = value;
            if broken {
                t.needs_reset(&self.interrupt);
                return false;
            }
            return true;
        }
        t.status = value;
        true
    }

    fn write_queue_register(&self, t: &mut Transport, offset: u64, value: u32) -> bool {
        let live = t.status & status::DRIVER_OK != 0;
        let Some(q) = t.selected_queue() else {
            return false;
        };
        if offset == reg::QUEUE_READY {
            if value == 0 {
                q.set_ready(false);
                return true;
            }
            q.set_ready(true);
            return true;
        }
        // Sizes and addresses change only while the queue is off.
        if q.ready() || live {
            return false;
        }
        match offset {
            reg::QUEUE_NUM => {
                let ok = u16::try_from(value).is_ok_and(|n| q.try_set_size(n).is_ok());
                return ok;
            }
            reg::QUEUE_DESC_LOW => q.set_desc_table_address(Some(value), None),
            reg::QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(value)),
            reg::QUEUE_DRIVER_LOW => q.set_avail_ring_address(Some(value), None),
            reg::QUEUE_DRIVER_HIGH => q.set_avail_ring_address(None, Some(value)),
            reg::QUEUE_DEVICE_LOW => q.set_used_ring_address(Some(value), None),
            reg::QUEUE_DEVICE_HIGH => q.set_used_ring_address(None, Some(value)),
            _ => return false,
        }
        true
    }

    fn write_register(&self, offset: u64, value: u32) -> bool {
        // Acknowledged without the lock, as the status is read.
        if offset == reg::INTERRUPT_ACK {
            self.interrupt.acknowledge(value);
            return true;
        }
        let mut t = self.lock();
        match offset {
            reg::DEVICE_FEATURES_SEL => t.device_features_sel = value,
            reg::DRIVER_FEATURES_SEL => t.driver_features_sel = value,
            reg::DRIVER_FEATURES => {
                if t.status & status::FEATURES_OK != 0 {
                    return false;
                }
                let v = u64::from(value);
                match t.driver_features_sel {
                    0 => t.driver_features = (t.driver_features & !0xffff_ffff) | v,
                    1 => t.driver_features = (t.driver_features & 0xffff_ffff) | (v << 32),
                    _ => return value == 0,
                }
            }
            reg::QUEUE_SEL => t.queue_sel = value,
            reg::QUEUE_NOTIFY => {
                let live = t.live();
                drop(t);
                let Some(fd) = self.notifiers.get(value as usize) else {
                    return false;
                };
                if !live {
                    return false;
                }
                // A full counter is already readable: the worker will wake.
                let _ = fd.write(1);
            }
            reg::STATUS => return self.write_status(&mut t, value),
            reg::QUEUE_NUM
            | reg::QUEUE_READY
            | reg::QUEUE_DESC_LOW
            | reg::QUEUE_DESC_HIGH
            | reg::QUEUE_DRIVER_LOW
            | reg::QUEUE_DRIVER_HIGH
            | reg::QUEUE_DEVICE_LOW
            | reg::QUEUE_DEVICE_HIGH => return self.write_queue_register(&mut t, offset, value),
            _ => return false,
        }
        true
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= CONFIG_START {
            let t = self.lock();
            let config = t.device.config();
            // An offset past usize (a 32-bit host) is past the config space too.
            let start = usize::try_from(offset - CONFIG_START).unwrap_or(usize::MAX);
            match config.get(start..start.saturating_add(data.len())) {
                Some(bytes) => data.copy_from_slice(bytes),
                None => self.events.ignored_register_access(),
            }
            return;
        }
        match (data.len(), self.read_register(offset)) {
            (4, Some(v)) => data.copy_from_slice(&v.to_le_bytes()),
            _ => self.events.ignored_register_access(),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        // Configuration spaces of these devices are read-only to the driver.
        let value = <[u8; 4]>::try_from(data).ok().map(u32::from_le_bytes);
        let accepted = match value {
            Some(v) if offset < CONFIG_START => self.write_register(offset, v),
            _ => false,
        };
        if !accepted {
            self.events.virtio_error();
        }
    }
}

#[cfg(test)]
mod tests;
