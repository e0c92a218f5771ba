//! The CPPC capacity device: per-vCPU ACPI CPPC registers in an MMIO window, read live by the
//! guest through the `_CPC` objects in pvmm's DSDT.
//!
//! Each vCPU owns [`CPPC_VCPU_STRIDE`] bytes: eight 64-bit registers. The performance values
//! are the placement engine's effective capacity of that vCPU, refreshed every tick, on the
//! scale whose top the VMM gives [`CppcShared::new`] (pvmm passes the engine's capacity scale,
//! which its `_CPC` objects also name as the reference performance). The guest's
//! desired-performance writes are kept for pvmm's stats. The two feedback counters count, in
//! nanoseconds, how long the vCPU wanted to run (reference) and how long it actually ran
//! (delivered), so `delivered / reference` is the share of its demand the host served, as
//! APERF/MPERF would show on hardware.
//!
//! Guest mistakes (writes to read-only registers, accesses that are not 8 bytes wide and
//! 8-byte aligned, offsets past the last vCPU) are ignored and reported as
//! [`GuestEvents::ignored_register_access`]; reads of them return 0.
//!
//! [`GuestEvents::ignored_register_access`]: crate::events::GuestEvents::ignored_register_access

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;

use crate::bus::BusDevice;
use crate::events::SharedEvents;

/// Bytes per register.
pub const CPPC_REG_SIZE: u64 = 8;
/// Bytes of registers per vCPU (eight registers).
pub const CPPC_VCPU_STRIDE: u64 = 64;
/// Lowest performance the guest may be told: CPPC requires every performance level > 0.
pub const CPPC_LOWEST_PERF: u32 = 1;

/// The registers of one vCPU, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CppcRegister {
    /// Highest performance (read-only): the vCPU's capacity.
    Highest,
    /// Nominal performance (read-only): the vCPU's capacity.
    Nominal,
    /// Lowest nonlinear performance (read-only).
    LowestNonlinear,
    /// Lowest performance (read-only).
    Lowest,
    /// Guaranteed performance (read-only): the vCPU's capacity.
    Guaranteed,
    /// Desired performance (read/write): the guest's request.
    Desired,
    /// Reference performance counter (read-only): ns the vCPU wanted to run.
    ReferenceCounter,
    /// Delivered performance counter (read-only): ns the vCPU ran.
    DeliveredCounter,
}

impl CppcRegister {
    /// Every register, in layout order.
    pub const ALL: [CppcRegister; 8] = [
        CppcRegister::Highest,
        CppcRegister::Nominal,
        CppcRegister::LowestNonlinear,
        CppcRegister::Lowest,
        CppcRegister::Guaranteed,
        CppcRegister::Desired,
        CppcRegister::ReferenceCounter,
        CppcRegister::DeliveredCounter,
    ];

    /// Offset of this register within a vCPU's block.
    pub fn offset(self) -> u64 {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0) as u64 * CPPC_REG_SIZE
    }

    /// Guest address of this register of vCPU `vcpu` in a window at `base`.
    pub fn address(self, base: u64, vcpu: u32) -> u64 {
        base + u64::from(vcpu) * CPPC_VCPU_STRIDE + self.offset()
    }
}

/// How long a thread wanted to run and how long it ran (ns, cumulative).
pub trait DemandCounters: Send + Sync {
    /// (wanted, ran) for thread `tid`, or None when unknown.
    fn read(&self, tid: i32) -> Option<(u64, u64)>;
}

/// Per-vCPU values shared between the device (guest side) and the scheduler (host side).
pub struct CppcVcpu {
    capacity: AtomicU32,
    desired: AtomicU32,
    tid: AtomicI32,
}

/// State shared by the device and the VMM.
pub struct CppcShared {
    vcpus: Vec<CppcVcpu>,
    highest: u32,
}

impl CppcShared {
    /// State for `vcpus` vCPUs whose performance scale tops out at `highest` (a vCPU with a
    /// CPU of its own), each at `highest` until the scheduler says otherwise.
    pub fn new(vcpus: u32, highest: u32) -> Self {
        let highest = highest.max(CPPC_LOWEST_PERF);
        Self {
            vcpus: (0..vcpus)
                .map(|_| CppcVcpu {
                    capacity: AtomicU32::new(highest),
                    desired: AtomicU32::new(0),
                    tid: AtomicI32::new(0),
                })
                .collect(),
            highest,
        }
    }

    /// Publishes vCPU `vcpu`'s effective capacity (clamped to the scale).
    pub fn set_capacity(&self, vcpu: u32, capacity: u32) {
        if let Some(v) = self.vcpus.get(vcpu as usize) {
            v.capacity.store(
                capacity.clamp(CPPC_LOWEST_PERF, self.highest),
                Ordering::Relaxed,
            );
        }
    }

    /// The capacity the guest reads for `vcpu`.
    pub fn capacity(&self, vcpu: u32) -> Option<u32> {
        self.vcpus
            .get(vcpu as usize)
            .map(|v| v.capacity.load(Ordering::Relaxed))
    }

    /// The guest's last desired-performance write for `vcpu` (0 = never written).
    pub fn desired(&self, vcpu: u32) -> Option<u32> {
        self.vcpus
            .get(vcpu as usize)
            .map(|v| v.desired.load(Ordering::Relaxed))
    }

    /// Tells the device which thread runs `vcpu` (for the feedback counters).
    pub fn set_tid(&self, vcpu: u32, tid: i32) {
        if let Some(v) = self.vcpus.get(vcpu as usize) {
            v.tid.store(tid, Ordering::Relaxed);
        }
    }

    /// Number of vCPUs.
    pub fn vcpus(&self) -> u32 {
        self.vcpus.len() as u32
    }
}

/// The MMIO device serving the CPPC window.
pub struct CppcDevice {
    shared: Arc<CppcShared>,
    counters: Box<dyn DemandCounters>,
    events: SharedEvents,
}

impl CppcDevice {
    /// A device over `shared`, reading feedback counters from `counters` and reporting guest
    /// mistakes to `events`.
    pub fn new(
        shared: Arc<CppcShared>,
        counters: Box<dyn DemandCounters>,
        events: SharedEvents,
    ) -> Self {
        Self {
            shared,
            counters,
            events,
        }
    }

    /// Decodes an access: (vCPU, register) for a well-formed one.
    fn decode(&self, offset: u64, len: usize) -> Option<(u32, CppcRegister)> {
        if len as u64 != CPPC_REG_SIZE || !offset.is_multiple_of(CPPC_REG_SIZE) {
            return None;
        }
        let vcpu = u32::try_from(offset / CPPC_VCPU_STRIDE).ok()?;
        if vcpu >= self.shared.vcpus() {
            return None;
        }
        let reg = CppcRegister::ALL
            .get(((offset % CPPC_VCPU_STRIDE) / CPPC_REG_SIZE) as usize)
            .copied()?;
        Some((vcpu, reg))
    }

    fn value(&self, vcpu: u32, reg: CppcRegister) -> u64 {
        let v = &self.shared.vcpus[vcpu as usize];
        let capacity = u64::from(v.capacity.load(Ordering::Relaxed));
        match reg {
            CppcRegister::Highest | CppcRegister::Nominal | CppcRegister::Guaranteed => capacity,
            CppcRegister::LowestNonlinear | CppcRegister::Lowest => u64::from(CPPC_LOWEST_PERF),
            CppcRegister::Desired => u64::from(v.desired.load(Ordering::Relaxed)),
            CppcRegister::ReferenceCounter | CppcRegister::DeliveredCounter => {
                let tid = v.tid.load(Ordering::Relaxed);
                let (wanted, ran) = self.counters.read(tid).unwrap_or((0, 0));
                if reg == CppcRegister::ReferenceCounter {
                    wanted
                } else {
                    ran.min(wanted)
                }
            }
        }
    }
}

impl BusDevice for CppcDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match self.decode(offset, data.len()) {
            Some((vcpu, reg)) => data.copy_from_slice(&self.value(vcpu, reg).to_le_bytes()),
            None => self.events.ignored_register_access(),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match self.decode(offset, data.len()) {
            Some((vcpu, CppcRegister::Desired)) => {
                let mut raw = [0u8; 8];
                raw.copy_from_slice(data);
                let wish = u64::from_le_bytes(raw).min(u64::from(self.shared.highest)) as u32;
                self.shared.vcpus[vcpu as usize]
                    .desired
                    .store(wish, Ordering::Relaxed);
            }
            _ => self.events.ignored_register_access(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::GuestErrorCounter;

    /// The scale the tests use: pvmm's (one CPU = 1024).
    const HIGHEST: u32 = 1024;

    struct Fixed;
    impl DemandCounters for Fixed {
        fn read(&self, tid: i32) -> Option<(u64, u64)> {
            (tid == 42).then_some((1000, 500))
        }
    }

    fn device(n: u32) -> (CppcDevice, Arc<CppcShared>, Arc<GuestErrorCounter>) {
        let shared = Arc::new(CppcShared::new(n, HIGHEST));
        let errors = Arc::new(GuestErrorCounter::default());
        let dev = CppcDevice::new(shared.clone(), Box::new(Fixed), errors.clone());
        (dev, shared, errors)
    }

    fn read64(d: &mut CppcDevice, at: u64) -> u64 {
        let mut b = [0u8; 8];
        d.read(at, &mut b);
        u64::from_le_bytes(b)
    }

    #[test]
    fn capacity_is_live() {
        let (mut d, s, _) = device(2);
        let hi = CppcRegister::Highest.address(0, 1);
        assert_eq!(read64(&mut d, hi), u64::from(HIGHEST));
        s.set_capacity(1, 512);
        assert_eq!(read64(&mut d, hi), 512);
        assert_eq!(read64(&mut d, CppcRegister::Nominal.address(0, 1)), 512);
        assert_eq!(read64(&mut d, CppcRegister::Guaranteed.address(0, 1)), 512);
        assert_eq!(
            read64(&mut d, CppcRegister::Highest.address(0, 0)),
            u64::from(HIGHEST)
        );
        assert_eq!(read64(&mut d, CppcRegister::Lowest.address(0, 0)), 1);
        s.set_capacity(0, 0);
        assert_eq!(s.capacity(0), Some(1));
        s.set_capacity(0, 5000);
        assert_eq!(s.capacity(0), Some(HIGHEST));
    }

    #[test]
    fn feedback_counters_and_desired() {
        let (mut d, s, errors) = device(1);
        s.set_tid(0, 42);
        assert_eq!(
            read64(&mut d, CppcRegister::ReferenceCounter.address(0, 0)),
            1000
        );
        assert_eq!(
            read64(&mut d, CppcRegister::DeliveredCounter.address(0, 0)),
            500
        );
        d.write(CppcRegister::Desired.address(0, 0), &700u64.to_le_bytes());
        assert_eq!(s.desired(0), Some(700));
        assert_eq!(read64(&mut d, CppcRegister::Desired.address(0, 0)), 700);
        assert_eq!(errors.total(), 0);
    }

    #[test]
    fn guest_mistakes_are_ignored_and_counted() {
        let (mut d, s, errors) = device(2);
        d.write(CppcRegister::Highest.address(0, 0), &5u64.to_le_bytes()); // read-only
        d.write(CppcRegister::Desired.address(0, 0), &[1, 2, 3, 4]); // 4 bytes
        let mut b = [0xaau8; 4];
        d.read(0, &mut b); // odd size
        assert_eq!(b, [0; 4]);
        let mut b = [0xaau8; 8];
        d.read(3, &mut b); // misaligned
        assert_eq!(b, [0; 8]);
        d.read(2 * CPPC_VCPU_STRIDE, &mut b); // past the last vCPU
        d.read(u64::MAX - 7, &mut b);
        d.write(u64::MAX - 7, &[0; 8]);
        d.write(0, &[]);
        assert_eq!(errors.total(), 8);
        assert_eq!(s.capacity(0), Some(HIGHEST));
    }
}
