//! virtio 1.x devices (the modern interface only) on the virtio-mmio transport, version 2.
//!
//! Why MMIO and not PCI: the guest kernels that matter (Debian's cloud kernels, 6.1 and 6.12)
//! build `virtio_mmio` as a module whose ACPI table matches `_HID "LNRO0005"`, so one DSDT
//! entry per device (its register window and its interrupt) is all the discovery a device
//! needs. virtio-pci would need a PCI host bridge, ECAM described in MCFG, configuration-space
//! emulation and BAR allocation for the same devices. What MMIO costs instead is that the
//! `virtio_mmio`, `virtio_blk`, `virtio_net` and `virtio_rng` modules must be in the guest's
//! initramfs.
//!
//! - [`mmio`]: the transport's register file ([`mmio::MmioTransport`], a
//!   [`crate::bus::BusDevice`]), which owns the driver's state: status, features, queues;
//! - [`worker`]: the thread that serves a device's queues: it wakes on each queue's notify
//!   eventfd (registered with KVM as an ioeventfd, so a notification never leaves the kernel
//!   on the vCPU's exit path) and interrupts the guest through an irqfd;
//! - [`rng`] (entropy from the host's `getrandom`), [`block`] (a raw image file) and [`net`]
//!   (an existing [`tap`]): the devices, each a [`VirtioDevice`].
//!
//! A hostile driver never panics pvmm and never reaches memory outside guest RAM (every
//! access goes through vm-memory, bounded by the guest's regions): a bad request gets an
//! error status, a broken queue puts the device into DEVICE_NEEDS_RESET, and either is
//! counted once through [`crate::events::GuestEvents::virtio_error`].

pub mod block;
pub mod mmio;
pub mod net;
pub mod rng;
pub mod tap;
pub mod worker;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;

use crate::events::GuestEvents;

/// The guest memory devices see.
pub type GuestMemory = GuestMemoryMmap<()>;

/// VIRTIO_F_VERSION_1: the modern interface, the only one offered.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// VIRTIO_F_EVENT_IDX (virtio 1.2, 2.7.10): the driver says at which used index it wants its
/// next interrupt, and the device at which available index it wants its next notification,
/// so that neither side signals the other for each buffer of a burst. Offered by the
/// transport for every device: every notification and interrupt is an exit of the guest, and
/// a virtio-mmio interrupt costs two more (the driver reads and acknowledges its status).
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
/// What the transport offers on top of each device's own features.
pub const TRANSPORT_FEATURES: u64 = VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX;

/// Device status bits (virtio 1.2, 2.1).
pub mod status {
    /// The guest found the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u32 = 2;
    /// The driver is set up: the device may use its queues.
    pub const DRIVER_OK: u32 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u32 = 8;
    /// The device met an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    /// The driver gave up on the device.
    pub const FAILED: u32 = 0x80;
}

/// Why a queue could not be served: the device goes into DEVICE_NEEDS_RESET.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The rings themselves are unreadable or inconsistent (an available index further ahead
    /// than the queue size, a ring outside RAM).
    #[error("virtio queue: {0}")]
    Ring(#[from] virtio_queue::Error),
}

/// One virtio device behind the transport.
pub trait VirtioDevice: Send {
    /// Its virtio device ID (2 block, 4 entropy).
    fn device_type(&self) -> u32;
    /// The feature bits it offers, [`VIRTIO_F_VERSION_1`] included.
    fn features(&self) -> u64;
    /// The maximum size of each of its queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Its configuration space, as the driver reads it.
    fn config(&self) -> &[u8];
    /// Serves the requests available on queue `index`, which is ready and valid. Returns
    /// whether any buffer was used (the guest is then interrupted). A malformed request is
    /// answered (an error status where the device has one) and reported to `events`; only a
    /// broken ring is an error.
    fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemory,
        events: &dyn GuestEvents,
    ) -> Result<bool, QueueError>;
    /// A host file whose readiness is work for the device (a tap with frames to receive), and
    /// the queue to serve when it is readable. The worker waits on it edge-triggered, so the
    /// device reads it until it would block (or keeps what it read for later).
    fn backend(&self) -> Option<(std::os::fd::RawFd, usize)> {
        None
    }
    /// The driver accepted `features` (a subset of [`VirtioDevice::features`]) and set
    /// FEATURES_OK: a device whose backend must know them (the tap's offloads) tells it now.
    fn features_acked(&mut self, _features: u64) {}
    /// The driver reset the device: anything it asked for is forgotten.
    fn reset(&mut self) {}
}

/// A descriptor chain over guest memory, as devices read it.
pub type Chain<'m> = virtio_queue::DescriptorChain<&'m GuestMemory>;

/// Pops the next available chain of `queue`, if any. An available index further ahead than
/// the queue size is an error (the ring is broken).
pub(crate) fn pop_chain<'m>(
    queue: &mut Queue,
    mem: &'m GuestMemory,
) -> Result<Option<Chain<'m>>, QueueError> {
    let mut available = queue.iter(mem)?;
    Ok(available.next())
}

/// Serves every chain available on `queue` with `serve`, which answers the chain's descriptors
/// (None for a chain cut short, already counted) with the length it wrote; returns whether any
/// chain was used.
pub(crate) fn serve_chains(
    queue: &mut Queue,
    mem: &GuestMemory,
    events: &dyn GuestEvents,
    mut serve: impl FnMut(&[Descriptor]) -> u32,
) -> Result<bool, QueueError> {
    let mut used = false;
    while let Some(chain) = pop_chain(queue, mem)? {
        let head = chain.head_index();
        let len = match descriptors(chain) {
            Some(all) => serve(&all),
            None => {
                events.virtio_error();
                0
            }
        };
        queue.add_used(mem, head, len)?;
        used = true;
    }
    Ok(used)
}

/// Every descriptor of `chain`, or None when the chain is cut short: it loops, is longer than
/// the queue, or names a descriptor past the table (the last one read still has NEXT set).
pub(crate) fn descriptors(chain: Chain<'_>) -> Option<Vec<Descriptor>> {
    let all: Vec<_> = chain.collect();
    match all.last() {
        Some(last) if !last.has_next() => Some(all),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod testing;
