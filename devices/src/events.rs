//! Guest mistakes, reported through one trait.
//!
//! Devices and the bus never fail on guest input: what they cannot serve they ignore, and
//! report here, in the way vm-superio's `SerialEvents` reports a UART's events: one method per
//! kind of event, a no-op implementation ([`NoEvents`]) for users that do not care, and a sink
//! chosen by the VMM. pvmm's sink is a [`GuestErrorCounter`] shared by every device and bus,
//! so one counter sees every mistake.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What devices and buses report about guest accesses they ignored.
pub trait GuestEvents: Send + Sync {
    /// A port I/O or MMIO access at `addr` that no device on the bus claims.
    fn unclaimed_access(&self, addr: u64);
    /// A register access a device ignored: a write to a read-only register, an access of the
    /// wrong size or alignment, or one past the registers that exist.
    fn ignored_register_access(&self);
    /// A power-control write asking for something pvmm does not implement: a sleep state other
    /// than S5, a wrong reset value, an i8042 command other than the CPU reset pulse.
    fn ignored_power_write(&self);
    /// A virtio driver mistake the device refused: a malformed request (a looping or
    /// over-long descriptor chain, an address outside RAM, a bad length, a write to a
    /// read-only disk, a sector past the end), a notification before DRIVER_OK, or a queue
    /// change while the queue is live.
    fn virtio_error(&self);
}

/// A shared events sink, as devices hold it.
pub type SharedEvents = Arc<dyn GuestEvents>;

/// Ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEvents;

impl GuestEvents for NoEvents {
    fn unclaimed_access(&self, _addr: u64) {}
    fn ignored_register_access(&self) {}
    fn ignored_power_write(&self) {}
    fn virtio_error(&self) {}
}

/// Counts every guest mistake in one counter.
#[derive(Debug, Default)]
pub struct GuestErrorCounter(AtomicU64);

impl GuestErrorCounter {
    /// Mistakes counted so far.
    pub fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl GuestEvents for GuestErrorCounter {
    fn unclaimed_access(&self, _addr: u64) {
        self.count();
    }
    fn ignored_register_access(&self) {
        self.count();
    }
    fn ignored_power_write(&self) {
        self.count();
    }
    fn virtio_error(&self) {
        self.count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_counts_once() {
        let c = GuestErrorCounter::default();
        c.unclaimed_access(0x80);
        c.ignored_register_access();
        c.ignored_power_write();
        c.virtio_error();
        assert_eq!(c.total(), 4);
        NoEvents.unclaimed_access(0);
    }
}
