//! An address-range bus: routes a guest access (port I/O or MMIO) to the device that owns it.

use std::sync::{Arc, Mutex};

use crate::events::{NoEvents, SharedEvents};

/// A device that answers guest reads and writes within its address range.
///
/// `offset` is relative to the start of the range the device was inserted at. `data.len()` is
/// the access size the guest used (1, 2, 4 or 8 bytes); a device must cope with any size.
pub trait BusDevice: Send {
    /// Fills `data` with the value the guest reads at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Handles a guest write of `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors from building a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The new range overlaps a device already on the bus.
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap {
        /// Start of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
    /// A zero-length or wrapping range.
    #[error("invalid bus range {base:#x}+{len:#x}")]
    InvalidRange {
        /// Start of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
}

/// A shared handle to a device on a bus.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

struct BusEntry {
    base: u64,
    len: u64,
    device: SharedDevice,
}

/// A set of non-overlapping address ranges, each served by one device.
///
/// Unclaimed reads return all ones (what real hardware returns for an empty ISA port or an
/// unbacked MMIO address), unclaimed writes are dropped; both are reported to the bus's
/// [`crate::events::GuestEvents`].
pub struct Bus {
    entries: Vec<BusEntry>,
    events: SharedEvents,
}

impl Default for Bus {
    fn default() -> Self {
        Self::new(Arc::new(NoEvents))
    }
}

impl Bus {
    /// An empty bus reporting unclaimed accesses to `events`.
    pub fn new(events: SharedEvents) -> Self {
        Self {
            entries: Vec::new(),
            events,
        }
    }

    /// Puts `device` at `[base, base + len)`.
    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::InvalidRange { base, len })?;
        if self
            .entries
            .iter()
            .any(|e| base < e.base + e.len && e.base < end)
        {
            return Err(BusError::Overlap { base, len });
        }
        let at = self.entries.partition_point(|e| e.base < base);
        self.entries.insert(at, BusEntry { base, len, device });
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(&SharedDevice, u64)> {
        let idx = self.entries.partition_point(|e| e.base <= addr);
        let entry = self.entries.get(idx.checked_sub(1)?)?;
        (addr - entry.base < entry.len).then_some((&entry.device, addr - entry.base))
    }

    /// Dispatches a guest read. Returns false when no device claims `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((device, offset)) => {
                lock(device).read(offset, data);
                true
            }
            None => {
                data.fill(0xff);
                self.events.unclaimed_access(addr);
                false
            }
        }
    }

    /// Dispatches a guest write. Returns false when no device claims `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((device, offset)) => {
                lock(device).write(offset, data);
                true
            }
            None => {
                self.events.unclaimed_access(addr);
                false
            }
        }
    }
}

/// Locks a device, recovering it if another vCPU thread panicked while holding it: device state
/// is plain registers, always consistent between accesses.
fn lock(device: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    device
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::events::GuestErrorCounter;

    struct Echo(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_range_and_offset() {
        let errors = Arc::new(GuestErrorCounter::default());
        let mut bus = Bus::new(errors.clone());
        let a = Arc::new(Mutex::new(Echo(vec![])));
        bus.insert(a.clone(), 0x3f8, 8).unwrap();
        bus.insert(Arc::new(Mutex::new(Echo(vec![]))), 0x600, 4)
            .unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x3fa, &mut b));
        assert_eq!(b, [2]);
        assert!(bus.write(0x3ff, &[7]));
        assert_eq!(a.lock().unwrap().0, vec![(7, vec![7])]);
        assert!(!bus.read(0x400, &mut b));
        assert_eq!(b, [0xff]);
        assert!(!bus.read(0x3f7, &mut b));
        assert!(!bus.write(0x3f0, &[1]));
        assert_eq!(errors.total(), 3);
    }

    #[test]
    fn rejects_overlaps_and_empty_ranges() {
        let mut bus = Bus::default();
        bus.insert(Arc::new(Mutex::new(Echo(vec![]))), 0x10, 0x10)
            .unwrap();
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Echo(vec![]))), 0x1f, 2),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Echo(vec![]))), 0x8, 9),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Echo(vec![]))), 0x40, 0),
            Err(BusError::InvalidRange { .. })
        ));
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Echo(vec![]))), u64::MAX, 2),
            Err(BusError::InvalidRange { .. })
        ));
        bus.insert(Arc::new(Mutex::new(Echo(vec![]))), 0x20, 1)
            .unwrap();
    }
}
