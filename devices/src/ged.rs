//! The ACPI Generic Event Device (`ACPI0013`) pvmm uses to tell the guest that a vCPU's
//! capacity changed, and that its power button was pressed.
//!
//! The VMM queues an event and raises the GED interrupt; the guest's `_EVT` method reads the
//! status register until it returns 0. For [`POWER_BUTTON_STATUS`] it issues
//! `Notify(\_SB.PWRB, 0x80)` (a hardware-reduced platform has no fixed power button); for
//! each other value `N + 1` it issues `Notify(<processor N>, 0x85)` ("highest performance
//! changed").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;
use crate::events::SharedEvents;

/// Size of the GED's MMIO window: one 32-bit status register.
pub const GED_MMIO_LEN: u64 = 4;
/// Bytes of the status register.
const GED_STATUS_SIZE: usize = 4;

/// The status value that stands for a power-button press: above every vCPU index + 1.
pub const POWER_BUTTON_STATUS: u32 = 0x8000_0000;

/// Errors from raising an event.
#[derive(Debug, thiserror::Error)]
pub enum GedError {
    /// The interrupt eventfd could not be signalled.
    #[error("GED interrupt: {0}")]
    Interrupt(std::io::Error),
}

/// State shared by the device and the VMM.
pub struct GedShared {
    pending: Mutex<VecDeque<u32>>,
    irq: EventFd,
    raised: AtomicU64,
}

impl GedShared {
    /// A GED raising its interrupt through `irq` (registered with KVM as an irqfd).
    pub fn new(irq: EventFd) -> Self {
        Self {
            pending: Mutex::new(VecDeque::new()),
            irq,
            raised: AtomicU64::new(0),
        }
    }

    /// Queues a "capacity changed" event for `vcpu` and interrupts the guest.
    pub fn notify_capacity_changed(&self, vcpu: u32) -> Result<(), GedError> {
        self.raise(vcpu + 1)
    }

    /// Queues a power-button press and interrupts the guest.
    pub fn press_power_button(&self) -> Result<(), GedError> {
        self.raise(POWER_BUTTON_STATUS)
    }

    /// Queues status value `status` (once, however often it is raised before the guest reads
    /// it) and interrupts the guest.
    fn raise(&self, status: u32) -> Result<(), GedError> {
        {
            let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if !q.contains(&status) {
                q.push_back(status);
            }
        }
        self.raised.fetch_add(1, Ordering::Relaxed);
        self.irq.write(1).map_err(GedError::Interrupt)
    }

    /// Interrupts raised so far.
    pub fn raised(&self) -> u64 {
        self.raised.load(Ordering::Relaxed)
    }

    fn pop(&self) -> u32 {
        let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        q.pop_front().unwrap_or(0)
    }
}

/// The GED's MMIO status register. Accesses other than a 4-byte read of it are ignored and
/// reported as [`GuestEvents::ignored_register_access`].
///
/// [`GuestEvents::ignored_register_access`]: crate::events::GuestEvents::ignored_register_access
pub struct GedDevice {
    shared: Arc<GedShared>,
    events: SharedEvents,
}

impl GedDevice {
    /// The register over `shared`, reporting guest mistakes to `events`.
    pub fn new(shared: Arc<GedShared>, events: SharedEvents) -> Self {
        Self { shared, events }
    }
}

impl BusDevice for GedDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == 0 && data.len() == GED_STATUS_SIZE {
            data.copy_from_slice(&self.shared.pop().to_le_bytes());
        } else {
            self.events.ignored_register_access();
        }
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        // The status register is read-only.
        self.events.ignored_register_access();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::GuestErrorCounter;

    #[test]
    fn events_drain_in_order_without_duplicates() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let shared = Arc::new(GedShared::new(irq.try_clone().unwrap()));
        let errors = Arc::new(GuestErrorCounter::default());
        let mut dev = GedDevice::new(shared.clone(), errors.clone());
        shared.notify_capacity_changed(3).unwrap();
        shared.notify_capacity_changed(0).unwrap();
        shared.notify_capacity_changed(3).unwrap();
        assert_eq!(irq.read().unwrap(), 3);
        assert_eq!(shared.raised(), 3);
        let mut b = [0u8; 4];
        let mut seen = vec![];
        loop {
            dev.read(0, &mut b);
            let v = u32::from_le_bytes(b);
            if v == 0 {
                break;
            }
            seen.push(v - 1);
        }
        assert_eq!(seen, vec![3, 0]);
        shared.press_power_button().unwrap();
        shared.notify_capacity_changed(1).unwrap();
        dev.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), POWER_BUTTON_STATUS);
        dev.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), 2);
        dev.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0);
        dev.write(0, &[1, 0, 0, 0]);
        let mut b8 = [0u8; 8];
        dev.read(0, &mut b8);
        assert_eq!(errors.total(), 2);
        assert_eq!(shared.raised(), 5);
    }
}
