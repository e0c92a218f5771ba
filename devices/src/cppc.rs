//! The CPPC capacity device: per-vCPU ACPI CPPC registers in an MMIO window, read live by the
//! guest through the `_CPC` objects in pvmm's DSDT.
//!
//! Each vCPU owns [`CPPC_VCPU_STRIDE`] bytes: one 64-bit register per [`CppcRegister`]. The
//! highest, nominal and guaranteed performance registers hold one value per vCPU, the
//! performance the VMM sets with [`CppcShared::set_perf`], on the scale whose top the VMM
//! gives [`CppcShared::new`] (pvmm maps its placement engine's capacities onto a scale whose
//! top is below 255 and names that top as the reference performance in `_CPC`). Lowest and
//! lowest-nonlinear performance are [`CPPC_LOWEST_PERF`] and [`CPPC_LOWEST_NONLINEAR_PERF`]
//! on every scale. The guest's desired-performance writes are kept for pvmm's stats, and so
//! is what it writes to the CPPC enable register (0 or 1), so pvmm can report whether the
//! guest's cpufreq driver enabled CPPC. The two feedback counters count, in nanoseconds, how
//! long the vCPU wanted to run (reference) and how long it actually ran (delivered), so
//! `delivered / reference` is the share of its demand the host served, as APERF/MPERF would
//! show on hardware.
//!
//! Guest mistakes (writes to read-only registers, enable values other than 0 and 1, accesses
//! that are not 8 bytes wide and 8-byte aligned, offsets past the last vCPU) are ignored and
//! reported as [`GuestEvents::ignored_register_access`]; reads of them return 0.
//!
//! [`GuestEvents::ignored_register_access`]: crate::events::GuestEvents::ignored_register_access

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;

use crate::bus::BusDevice;
use crate::events::SharedEvents;

/// Bytes per register.
pub const CPPC_REG_SIZE: u64 = 8;
/// Bytes of registers per vCPU: one register per [`CppcRegister`].
pub const CPPC_VCPU_STRIDE: u64 = CppcRegister::ALL.len() as u64 * CPPC_REG_SIZE;
/// vCPUs the window has room for: 256, more than the 255 that x86's 8-bit xAPIC ids allow.
pub const CPPC_WINDOW_VCPUS: u64 = 256;
/// Bytes of the whole register window.
pub const CPPC_MMIO_LEN: u64 = CPPC_WINDOW_VCPUS * CPPC_VCPU_STRIDE;
/// Lowest performance the guest may be told: CPPC requires every performance level > 0.
pub const CPPC_LOWEST_PERF: u32 = 1;
/// Lowest nonlinear performance: one step above the lowest. Linux's amd-pstate refuses a CPU
/// whose lowest-nonlinear frequency (nominal frequency x lowest-nonlinear / nominal
/// performance) is not above its lowest frequency (drivers/cpufreq/amd-pstate.c,
/// `amd_pstate_init_freq`), and a vCPU's performance is a time share, which saves power
/// linearly all the way down: so the nonlinear range starts as low as the scale allows.
pub const CPPC_LOWEST_NONLINEAR_PERF: u32 = CPPC_LOWEST_PERF + 1;
/// The values of the CPPC enable register: the guest may only disable (0) or enable (1).
const CPPC_DISABLED: u64 = 0;
const CPPC_ENABLED: u64 = 1;

/// The registers of one vCPU, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CppcRegister {
    /// Highest performance (read-only): the vCPU's performance.
    Highest,
    /// Nominal performance (read-only): the vCPU's performance.
    Nominal,
    /// Lowest nonlinear performance (read-only): [`CPPC_LOWEST_NONLINEAR_PERF`].
    LowestNonlinear,
    /// Lowest performance (read-only): [`CPPC_LOWEST_PERF`].
    Lowest,
    /// Guaranteed performance (read-only): the vCPU's performance.
    Guaranteed,
    /// Desired performance (read/write): the guest's request.
    Desired,
    /// Reference performance counter (read-only): ns the vCPU wanted to run.
    ReferenceCounter,
    /// Delivered performance counter (read-only): ns the vCPU ran.
    DeliveredCounter,
    /// CPPC enable (read/write): 1 once the guest's cpufreq driver enabled CPPC, else 0.
    Enable,
}

impl CppcRegister {
    /// Every register, in layout order.
    pub const ALL: [CppcRegister; 9] = [
        CppcRegister::Highest,
        CppcRegister::Nominal,
        CppcRegister::LowestNonlinear,
        CppcRegister::Lowest,
        CppcRegister::Guaranteed,
        CppcRegister::Desired,
        CppcRegister::ReferenceCounter,
        CppcRegister::DeliveredCounter,
        CppcRegister::Enable,
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
    perf: AtomicU32,
    desired: AtomicU32,
    enabled: AtomicBool,
    tid: AtomicI32,
}

/// State shared by the device and the VMM.
pub struct CppcShared {
    vcpus: Vec<CppcVcpu>,
    highest: u32,
}

impl CppcShared {
    /// State for `vcpus` vCPUs whose performance scale tops out at `highest` (a vCPU with a
    /// CPU of its own; at least [`CPPC_LOWEST_NONLINEAR_PERF`]), each at `highest` until the
    /// VMM says otherwise.
    pub fn new(vcpus: u32, highest: u32) -> Self {
        let highest = highest.max(CPPC_LOWEST_NONLINEAR_PERF);
        Self {
            vcpus: (0..vcpus)
                .map(|_| CppcVcpu {
                    perf: AtomicU32::new(highest),
                    desired: AtomicU32::new(0),
                    enabled: AtomicBool::new(false),
                    tid: AtomicI32::new(0),
                })
                .collect(),
            highest,
        }
    }

    /// Publishes vCPU `vcpu`'s performance (clamped to the scale).
    pub fn set_perf(&self, vcpu: u32, perf: u32) {
        if let Some(v) = self.vcpus.get(vcpu as usize) {
            v.perf.store(
                perf.clamp(CPPC_LOWEST_PERF, self.highest),
                Ordering::Relaxed,
            );
        }
    }

    /// The performance the guest reads for `vcpu` (highest, nominal and guaranteed).
    pub fn perf(&self, vcpu: u32) -> Option<u32> {
        self.vcpus
            .get(vcpu as usize)
            .map(|v| v.perf.load(Ordering::Relaxed))
    }

    /// The guest's last desired-performance write for `vcpu` (0 = never written).
    pub fn desired(&self, vcpu: u32) -> Option<u32> {
        self.vcpus
            .get(vcpu as usize)
            .map(|v| v.desired.load(Ordering::Relaxed))
    }

    /// Whether the guest's last write to `vcpu`'s CPPC enable register was 1.
    pub fn enabled(&self, vcpu: u32) -> Option<bool> {
        self.vcpus
            .get(vcpu as usize)
            .map(|v| v.enabled.load(Ordering::Relaxed))
    }

    /// How many vCPUs the guest has CPPC enabled on.
    // At most the vCPU count, which `new` took as a u32.
    #[allow(clippy::cast_possible_truncation)]
    pub fn enabled_vcpus(&self) -> u32 {
        self.vcpus
            .iter()
            .filter(|v| v.enabled.load(Ordering::Relaxed))
            .count() as u32
    }

    /// Tells the device which thread runs `vcpu` (for the feedback counters).
    pub fn set_tid(&self, vcpu: u32, tid: i32) {
        if let Some(v) = self.vcpus.get(vcpu as usize) {
            v.tid.store(tid, Ordering::Relaxed);
        }
    }

    /// Number of vCPUs.
    // `new` built one entry per vCPU of a u32 count.
    #[allow(clippy::cast_possible_truncation)]
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
        match reg {
            CppcRegister::Highest | CppcRegister::Nominal | CppcRegister::Guaranteed => {
                u64::from(v.perf.load(Ordering::Relaxed))
            }
            CppcRegister::LowestNonlinear => u64::from(CPPC_LOWEST_NONLINEAR_PERF),
            CppcRegister::Lowest => u64::from(CPPC_LOWEST_PERF),
            CppcRegister::Desired => u64::from(v.desired.load(Ordering::Relaxed)),
            CppcRegister::Enable => u64::from(v.enabled.load(Ordering::Relaxed)),
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

    /// Applies a well-formed write of `value`; false when the guest may not write it.
    fn store(&self, vcpu: u32, reg: CppcRegister, value: u64) -> bool {
        let v = &self.shared.vcpus[vcpu as usize];
        match (reg, value) {
            (CppcRegister::Desired, _) => {
                let wish = u32::try_from(value)
                    .map_or(self.shared.highest, |w| w.min(self.shared.highest));
                v.desired.store(wish, Ordering::Relaxed);
                true
            }
            (CppcRegister::Enable, CPPC_DISABLED | CPPC_ENABLED) => {
                v.enabled.store(value == CPPC_ENABLED, Ordering::Relaxed);
                true
            }
            _ => false,
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
        let stored = self.decode(offset, data.len()).is_some_and(|(vcpu, reg)| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(data);
            self.store(vcpu, reg, u64::from_le_bytes(raw))
        });
        if !stored {
            self.events.ignored_register_access();
        }
    }
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::events::GuestErrorCounter;

    /// The top of the scale the tests use: pvmm's (a full CPU = 254).
    const HIGHEST: u32 = 254;

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
    fn perf_is_live() {
        let (mut d, s, _) = device(2);
        let hi = CppcRegister::Highest.address(0, 1);
        assert_eq!(read64(&mut d, hi), u64::from(HIGHEST));
        s.set_perf(1, 127);
        assert_eq!(read64(&mut d, hi), 127);
        assert_eq!(read64(&mut d, CppcRegister::Nominal.address(0, 1)), 127);
        assert_eq!(read64(&mut d, CppcRegister::Guaranteed.address(0, 1)), 127);
        assert_eq!(
            read64(&mut d, CppcRegister::Highest.address(0, 0)),
            u64::from(HIGHEST)
        );
        assert_eq!(read64(&mut d, CppcRegister::Lowest.address(0, 0)), 1);
        assert_eq!(
            read64(&mut d, CppcRegister::LowestNonlinear.address(0, 0)),
            2
        );
        s.set_perf(0, 0);
        assert_eq!(s.perf(0), Some(CPPC_LOWEST_PERF));
        s.set_perf(0, 5000);
        assert_eq!(s.perf(0), Some(HIGHEST));
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
        d.write(CppcRegister::Desired.address(0, 0), &200u64.to_le_bytes());
        assert_eq!(s.desired(0), Some(200));
        assert_eq!(read64(&mut d, CppcRegister::Desired.address(0, 0)), 200);
        d.write(CppcRegister::Desired.address(0, 0), &700u64.to_le_bytes());
        assert_eq!(s.desired(0), Some(HIGHEST), "clamped to the scale");
        assert_eq!(errors.total(), 0);
    }

    #[test]
    fn the_enable_register_keeps_0_and_1_per_vcpu_and_counts_other_values() {
        let (mut d, s, errors) = device(3);
        let enable = |v| CppcRegister::Enable.address(0, v);
        assert_eq!(read64(&mut d, enable(1)), 0);
        assert_eq!(s.enabled_vcpus(), 0);
        d.write(enable(1), &1u64.to_le_bytes());
        d.write(enable(2), &1u64.to_le_bytes());
        assert_eq!(read64(&mut d, enable(1)), 1);
        assert_eq!(read64(&mut d, enable(0)), 0);
        assert_eq!(s.enabled(1), Some(true));
        assert_eq!(s.enabled(0), Some(false));
        assert_eq!(s.enabled_vcpus(), 2);
        d.write(enable(2), &0u64.to_le_bytes());
        assert_eq!(s.enabled(2), Some(false));
        assert_eq!(errors.total(), 0);
        d.write(enable(1), &2u64.to_le_bytes());
        d.write(enable(1), &u64::MAX.to_le_bytes());
        d.write(enable(1), &[1, 0, 0, 0]);
        assert_eq!(errors.total(), 3);
        assert_eq!(s.enabled(1), Some(true), "bad writes change nothing");
        assert_eq!(s.enabled_vcpus(), 1);
    }

    #[test]
    fn the_layout_holds_every_register_of_every_vcpu() {
        assert_eq!(CPPC_VCPU_STRIDE, 72);
        assert_eq!(CppcRegister::Enable.address(0, 1), CPPC_VCPU_STRIDE + 64);
        let last = CppcRegister::ALL[CppcRegister::ALL.len() - 1];
        assert!(last.address(0, CPPC_WINDOW_VCPUS as u32 - 1) + CPPC_REG_SIZE <= CPPC_MMIO_LEN);
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
        assert_eq!(s.perf(0), Some(HIGHEST));
    }
}
