//! Property-based fuzzing of every device's port I/O and MMIO handler, through the buses as
//! pvmm wires them: random sequences of reads and writes of every size from 1 to 8 bytes, at
//! every alignment, on, around and far from every register, mixed with the host's own
//! updates (performance values, GED events, the power button).
//!
//! Properties, after every access:
//! - nothing panics;
//! - a mistake is counted exactly once, by the device that owns the address (or by the bus
//!   when no device does), and a correct access is not counted; each device and each bus
//!   reports to a counter of its own here, so a count in the wrong place is seen;
//! - nothing outside the accessed device changes: no other device's state, events or
//!   interrupts;
//! - what a read returns follows each device's documented contract (all ones where nothing
//!   answers, zeros for an ignored register access).
//!
//! Seeded and bounded for CI; a longer run:
//! `PROPTEST_CASES=100000 cargo test -p pvmm-devices --test fuzz_devices` (and
//! `PROPTEST_RNG_SEED=N` for another seed).

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use pvmm_devices::bus::{Bus, BusDevice};
use pvmm_devices::cppc::{
    CppcDevice, CppcRegister, CppcShared, DemandCounters, CPPC_LOWEST_NONLINEAR_PERF,
    CPPC_LOWEST_PERF, CPPC_MMIO_LEN, CPPC_REG_SIZE, CPPC_VCPU_STRIDE,
};
use pvmm_devices::events::GuestErrorCounter;
use pvmm_devices::ged::{GedDevice, GedShared, GED_MMIO_LEN};
use pvmm_devices::power::{
    AcpiPowerDevice, I8042ResetDevice, PowerEvent, PowerEventSink, ACPI_POWER_PORT_BASE,
    ACPI_POWER_PORT_LEN, I8042_COMMAND_PORT, RESET_OFFSET, RESET_VALUE, S5_SLEEP_TYPE,
    SLEEP_CONTROL_OFFSET, SLEEP_STATUS_OFFSET,
};
use pvmm_devices::serial::{SerialConsole, COM1_PORT_BASE, COM_PORT_LEN};
use vmm_sys_util::eventfd::EventFd;

/// Cases per property in CI.
const CI_CASES: u32 = 512;
/// The fixed seed of CI runs.
const CI_SEED: u64 = 0x6465_7669_6365_735f;

/// CI's bounded, seeded configuration; `PROPTEST_CASES` and `PROPTEST_RNG_SEED` override it.
fn fuzz_config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = CI_CASES;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(CI_SEED);
    }
    config.failure_persistence = None;
    config
}

/// Where pvmm puts its MMIO devices (vmm/src/layout.rs): the GED right after the CPPC window.
const CPPC_BASE: u64 = 0xd000_0000;
const GED_BASE: u64 = CPPC_BASE + CPPC_MMIO_LEN;
/// vCPUs behind the CPPC window: offsets past them are mistakes.
const VCPUS: u32 = 4;
/// The top of the performance scale (pvmm's: a full CPU is 254).
const HIGHEST: u32 = 254;
const SLP_EN: u8 = 1 << 5;
const WAK_STS: u8 = 1 << 7;

/// The devices, each with its own mistake counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Device {
    PioBus,
    MmioBus,
    Serial,
    Power,
    I8042,
    Cppc,
    Ged,
}

/// Feedback counters that depend only on the thread id.
struct FixedDemand;
impl DemandCounters for FixedDemand {
    fn read(&self, tid: i32) -> Option<(u64, u64)> {
        (tid != 0).then(|| (tid as u64 * 1000, tid as u64 * 700))
    }
}

#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);
impl std::io::Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn recording() -> (PowerEventSink, Arc<Mutex<Vec<PowerEvent>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (Box::new(move |e| l.lock().unwrap().push(e)), log)
}

/// pvmm's two buses and every device on them, with what each lets the test observe.
struct Machine {
    pio: Bus,
    mmio: Bus,
    errors: Vec<(Device, Arc<GuestErrorCounter>)>,
    serial_out: Output,
    serial_irq: EventFd,
    serial_irqs: u64,
    power_log: Arc<Mutex<Vec<PowerEvent>>>,
    i8042_log: Arc<Mutex<Vec<PowerEvent>>>,
    cppc: Arc<CppcShared>,
    ged: Arc<GedShared>,
    ged_irq: EventFd,
    ged_irqs: u64,
}

/// Everything observable, per device.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    errors: Vec<(Device, u64)>,
    serial: (usize, u64),
    power: Vec<PowerEvent>,
    i8042: Vec<PowerEvent>,
    /// Per vCPU: performance, desired performance, CPPC enabled.
    cppc: Vec<(Option<u32>, Option<u32>, Option<bool>)>,
    ged: (u64, u64),
}

impl Machine {
    fn new() -> Self {
        let counter = || Arc::new(GuestErrorCounter::default());
        let (pio_errors, mmio_errors, power_errors, i8042_errors, cppc_errors, ged_errors) = (
            counter(),
            counter(),
            counter(),
            counter(),
            counter(),
            counter(),
        );
        let serial_out = Output::default();
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let serial = SerialConsole::new(
            serial_irq.try_clone().unwrap(),
            Box::new(serial_out.clone()),
        );
        let (power_sink, power_log) = recording();
        let (i8042_sink, i8042_log) = recording();
        let mut pio = Bus::new(pio_errors.clone());
        pio.insert(
            Arc::new(Mutex::new(serial)),
            u64::from(COM1_PORT_BASE),
            u64::from(COM_PORT_LEN),
        )
        .unwrap();
        pio.insert(
            Arc::new(Mutex::new(AcpiPowerDevice::new(
                power_sink,
                power_errors.clone(),
            ))),
            u64::from(ACPI_POWER_PORT_BASE),
            u64::from(ACPI_POWER_PORT_LEN),
        )
        .unwrap();
        pio.insert(
            Arc::new(Mutex::new(I8042ResetDevice::new(
                i8042_sink,
                i8042_errors.clone(),
            ))),
            u64::from(I8042_COMMAND_PORT),
            1,
        )
        .unwrap();
        let cppc = Arc::new(CppcShared::new(VCPUS, HIGHEST));
        for v in 0..VCPUS {
            cppc.set_tid(v, 100 + v as i32);
        }
        let ged_irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let ged = Arc::new(GedShared::new(ged_irq.try_clone().unwrap()));
        let mut mmio = Bus::new(mmio_errors.clone());
        mmio.insert(
            Arc::new(Mutex::new(CppcDevice::new(
                cppc.clone(),
                Box::new(FixedDemand),
                cppc_errors.clone(),
            ))),
            CPPC_BASE,
            CPPC_MMIO_LEN,
        )
        .unwrap();
        mmio.insert(
            Arc::new(Mutex::new(GedDevice::new(ged.clone(), ged_errors.clone()))),
            GED_BASE,
            GED_MMIO_LEN,
        )
        .unwrap();
        Machine {
            pio,
            mmio,
            errors: vec![
                (Device::PioBus, pio_errors),
                (Device::MmioBus, mmio_errors),
                (Device::Power, power_errors),
                (Device::I8042, i8042_errors),
                (Device::Cppc, cppc_errors),
                (Device::Ged, ged_errors),
            ],
            serial_out,
            serial_irq,
            serial_irqs: 0,
            power_log,
            i8042_log,
            cppc,
            ged,
            ged_irq,
            ged_irqs: 0,
        }
    }

    fn snapshot(&mut self) -> Snapshot {
        self.serial_irqs += self.serial_irq.read().unwrap_or(0);
        self.ged_irqs += self.ged_irq.read().unwrap_or(0);
        Snapshot {
            errors: self.errors.iter().map(|(d, c)| (*d, c.total())).collect(),
            serial: (self.serial_out.0.lock().unwrap().len(), self.serial_irqs),
            power: self.power_log.lock().unwrap().clone(),
            i8042: self.i8042_log.lock().unwrap().clone(),
            cppc: (0..VCPUS)
                .map(|v| {
                    (
                        self.cppc.perf(v),
                        self.cppc.desired(v),
                        self.cppc.enabled(v),
                    )
                })
                .collect(),
            ged: (self.ged.raised(), self.ged_irqs),
        }
    }
}

/// Which device owns a guest address (None: nothing does, the bus answers).
fn owner(mmio: bool, addr: u64) -> Option<(Device, u64)> {
    let within = |base: u64, len: u64| (base..base + len).contains(&addr).then(|| addr - base);
    if mmio {
        within(CPPC_BASE, CPPC_MMIO_LEN)
            .map(|o| (Device::Cppc, o))
            .or_else(|| within(GED_BASE, GED_MMIO_LEN).map(|o| (Device::Ged, o)))
    } else {
        within(u64::from(COM1_PORT_BASE), u64::from(COM_PORT_LEN))
            .map(|o| (Device::Serial, o))
            .or_else(|| {
                within(
                    u64::from(ACPI_POWER_PORT_BASE),
                    u64::from(ACPI_POWER_PORT_LEN),
                )
                .map(|o| (Device::Power, o))
            })
            .or_else(|| within(u64::from(I8042_COMMAND_PORT), 1).map(|o| (Device::I8042, o)))
    }
}

/// A well-formed CPPC access: (vCPU, register).
fn cppc_decode(offset: u64, len: usize) -> Option<(u32, CppcRegister)> {
    if len as u64 != CPPC_REG_SIZE || !offset.is_multiple_of(CPPC_REG_SIZE) {
        return None;
    }
    let vcpu = u32::try_from(offset / CPPC_VCPU_STRIDE).ok()?;
    (vcpu < VCPUS).then_some(())?;
    CppcRegister::ALL
        .get(((offset % CPPC_VCPU_STRIDE) / CPPC_REG_SIZE) as usize)
        .map(|r| (vcpu, *r))
}

/// How many mistakes an access is, by each device's documented contract.
fn expected_mistakes(device: Device, offset: u64, data: &[u8], write: bool) -> u64 {
    let first = data[0];
    let mistake = match (device, write) {
        (Device::PioBus | Device::MmioBus, _) => true,
        (Device::Serial, _) => false,
        (Device::Power, false) | (Device::I8042, false) => false,
        (Device::Power, true) => match offset {
            SLEEP_CONTROL_OFFSET => first & SLP_EN == 0 || (first >> 2) & 0b111 != S5_SLEEP_TYPE,
            SLEEP_STATUS_OFFSET => first & !WAK_STS != 0,
            RESET_OFFSET => first != RESET_VALUE,
            _ => true,
        },
        (Device::I8042, true) => first != 0xfe,
        (Device::Cppc, false) => cppc_decode(offset, data.len()).is_none(),
        (Device::Cppc, true) => match cppc_decode(offset, data.len()) {
            Some((_, CppcRegister::Desired)) => false,
            Some((_, CppcRegister::Enable)) => u64_of(data) > 1,
            _ => true,
        },
        (Device::Ged, false) => !(offset == 0 && data.len() == 4),
        (Device::Ged, true) => true,
    };
    u64::from(mistake)
}

/// The little-endian value of an 8-byte access.
fn u64_of(data: &[u8]) -> u64 {
    u64::from_le_bytes(data.try_into().unwrap())
}

/// One step: a guest access or a host update.
#[derive(Debug, Clone)]
enum Op {
    Access {
        mmio: bool,
        addr: u64,
        data: Vec<u8>,
        write: bool,
    },
    SetPerf(u32, u32),
    NotifyCapacity(u32),
    PowerButton,
}

/// Addresses on, around and far from every register.
fn address(mmio: bool) -> BoxedStrategy<u64> {
    let bases: Vec<(u64, u64)> = if mmio {
        vec![
            (CPPC_BASE, CPPC_MMIO_LEN),
            (CPPC_BASE, u64::from(VCPUS) * CPPC_VCPU_STRIDE + 16),
            (GED_BASE, GED_MMIO_LEN),
        ]
    } else {
        vec![
            (u64::from(COM1_PORT_BASE), u64::from(COM_PORT_LEN)),
            (
                u64::from(ACPI_POWER_PORT_BASE),
                u64::from(ACPI_POWER_PORT_LEN),
            ),
            (u64::from(I8042_COMMAND_PORT), 1),
        ]
    };
    let near = prop::sample::select(bases).prop_flat_map(|(base, len)| {
        (-9i64..(len as i64 + 9)).prop_map(move |d| base.wrapping_add_signed(d))
    });
    let far = if mmio {
        any::<u64>().boxed()
    } else {
        (0u64..=0xffff).boxed()
    };
    prop_oneof![6 => near, 1 => far].boxed()
}

/// Values that hit the interesting cases of the power registers, and anything.
fn value_bytes(len: usize) -> impl Strategy<Value = Vec<u8>> {
    let first = prop_oneof![
        Just((S5_SLEEP_TYPE << 2) | SLP_EN),
        Just(WAK_STS),
        Just(RESET_VALUE),
        Just(0xfe),
        any::<u8>(),
    ];
    (first, prop::collection::vec(any::<u8>(), len - 1)).prop_map(|(f, mut rest)| {
        rest.insert(0, f);
        rest
    })
}

fn op() -> impl Strategy<Value = Op> {
    let access = (any::<bool>(), any::<bool>(), 1usize..=8).prop_flat_map(|(mmio, write, len)| {
        // Small values too: the CPPC enable register takes 0 and 1 only.
        let data = prop_oneof![
            4 => value_bytes(len),
            1 => (0u64..=2).prop_map(move |v| v.to_le_bytes()[..len].to_vec()),
        ];
        (address(mmio), data).prop_map(move |(addr, data)| Op::Access {
            mmio,
            addr,
            data,
            write,
        })
    });
    prop_oneof![
        12 => access,
        1 => (0..VCPUS + 1, any::<u32>()).prop_map(|(v, c)| Op::SetPerf(v, c)),
        1 => (0..VCPUS + 1).prop_map(Op::NotifyCapacity),
        1 => Just(Op::PowerButton),
    ]
}

/// Runs one guest access and checks the properties.
fn access(
    m: &mut Machine,
    mmio: bool,
    addr: u64,
    data: &[u8],
    write: bool,
) -> Result<(), TestCaseError> {
    let before = m.snapshot();
    let owned = owner(mmio, addr);
    let mut read = data.to_vec();
    let claimed = match (mmio, write) {
        (true, true) => m.mmio.write(addr, data),
        (true, false) => m.mmio.read(addr, &mut read),
        (false, true) => m.pio.write(addr, data),
        (false, false) => m.pio.read(addr, &mut read),
    };
    let after = m.snapshot();
    prop_assert_eq!(claimed, owned.is_some());
    let (counted_by, offset) = match owned {
        Some((device, offset)) => (device, offset),
        None if mmio => (Device::MmioBus, 0),
        None => (Device::PioBus, 0),
    };
    // Only the accessed device (or the bus, for an unclaimed access) changed.
    prop_assert_eq!(
        others(&before, counted_by),
        others(&after, counted_by),
        "{:?} changed another device",
        counted_by
    );
    let count = |s: &Snapshot| {
        s.errors
            .iter()
            .find(|(d, _)| *d == counted_by)
            .map_or(0, |(_, n)| *n)
    };
    let expected = if owned.is_none() {
        1
    } else {
        expected_mistakes(counted_by, offset, data, write)
    };
    prop_assert_eq!(
        count(&after) - count(&before),
        expected,
        "{:?} {} at offset {:#x} size {}: {:x?}",
        counted_by,
        if write { "write" } else { "read" },
        offset,
        data.len(),
        data
    );
    if !write {
        check_read(counted_by, owned.is_some(), offset, &read, &before)?;
    }
    Ok(())
}

/// Blanks the state and the mistake count of `device` in a snapshot, leaving everything else.
fn others(s: &Snapshot, device: Device) -> Snapshot {
    let mut s = s.clone();
    for (d, n) in &mut s.errors {
        if *d == device {
            *n = 0;
        }
    }
    match device {
        Device::Serial => s.serial = (0, 0),
        Device::Power => s.power.clear(),
        Device::I8042 => s.i8042.clear(),
        Device::Cppc => s.cppc.clear(),
        Device::Ged => s.ged = (0, 0),
        Device::PioBus | Device::MmioBus => {}
    }
    s
}

/// What a read returned, against the device's contract.
fn check_read(
    device: Device,
    claimed: bool,
    offset: u64,
    read: &[u8],
    before: &Snapshot,
) -> Result<(), TestCaseError> {
    if !claimed {
        prop_assert!(read.iter().all(|b| *b == 0xff), "unclaimed read {read:x?}");
        return Ok(());
    }
    match device {
        Device::Cppc => match cppc_decode(offset, read.len()) {
            None => prop_assert!(read.iter().all(|b| *b == 0), "{read:x?}"),
            Some((vcpu, reg)) => {
                let value = u64_of(read);
                let (perf, desired, enabled) = before.cppc[vcpu as usize];
                let tid = 100 + u64::from(vcpu);
                let want = match reg {
                    CppcRegister::Highest | CppcRegister::Nominal | CppcRegister::Guaranteed => {
                        u64::from(perf.unwrap())
                    }
                    CppcRegister::LowestNonlinear => u64::from(CPPC_LOWEST_NONLINEAR_PERF),
                    CppcRegister::Lowest => u64::from(CPPC_LOWEST_PERF),
                    CppcRegister::Desired => u64::from(desired.unwrap()),
                    CppcRegister::Enable => u64::from(enabled.unwrap()),
                    CppcRegister::ReferenceCounter => tid * 1000,
                    CppcRegister::DeliveredCounter => tid * 700,
                };
                prop_assert_eq!(value, want, "{:?}", reg);
            }
        },
        Device::Ged if !(offset == 0 && read.len() == 4) => {
            prop_assert!(read.iter().all(|b| *b == 0), "{read:x?}");
        }
        Device::Power => {
            let status = if offset == SLEEP_STATUS_OFFSET {
                WAK_STS
            } else {
                0
            };
            prop_assert_eq!(read[0], status);
            prop_assert!(read[1..].iter().all(|b| *b == 0), "{read:x?}");
        }
        Device::I8042 => prop_assert!(read.iter().all(|b| *b == 0), "{read:x?}"),
        Device::Serial => prop_assert!(read[1..].iter().all(|b| *b == 0), "{read:x?}"),
        _ => {}
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz_config())]

    /// Random access sequences on pvmm's buses, mixed with host updates.
    #[test]
    fn random_accesses_are_served_or_counted_and_touch_only_their_device(
        ops in prop::collection::vec(op(), 1..64)
    ) {
        let mut m = Machine::new();
        for op in ops {
            match op {
                Op::Access { mmio, addr, data, write } => access(&mut m, mmio, addr, &data, write)?,
                Op::SetPerf(v, c) => {
                    m.cppc.set_perf(v, c);
                    if let Some(got) = m.cppc.perf(v) {
                        prop_assert!((CPPC_LOWEST_PERF..=HIGHEST).contains(&got));
                    }
                }
                Op::NotifyCapacity(v) => m.ged.notify_capacity_changed(v).unwrap(),
                Op::PowerButton => m.ged.press_power_button().unwrap(),
            }
        }
    }

    /// Desired-performance writes are kept, clamped to the scale, for the vCPU written only.
    #[test]
    fn cppc_desired_writes_land_on_their_vcpu(vcpu in 0..VCPUS, value in any::<u64>()) {
        let mut m = Machine::new();
        let addr = CppcRegister::Desired.address(CPPC_BASE, vcpu);
        access(&mut m, true, addr, &value.to_le_bytes(), true)?;
        for v in 0..VCPUS {
            let want = if v == vcpu { value.min(u64::from(HIGHEST)) as u32 } else { 0 };
            prop_assert_eq!(m.cppc.desired(v), Some(want));
        }
    }

    /// CPPC enable writes of 0 and 1 are kept for the vCPU written only; any other value is
    /// a mistake and changes nothing.
    #[test]
    fn cppc_enable_writes_land_on_their_vcpu(
        vcpu in 0..VCPUS,
        value in prop_oneof![0u64..=1, any::<u64>()],
    ) {
        let mut m = Machine::new();
        let addr = CppcRegister::Enable.address(CPPC_BASE, vcpu);
        access(&mut m, true, addr, &value.to_le_bytes(), true)?;
        for v in 0..VCPUS {
            prop_assert_eq!(m.cppc.enabled(v), Some(v == vcpu && value == 1));
        }
        prop_assert_eq!(m.cppc.enabled_vcpus(), u32::from(value == 1));
    }

    /// Any set of ranges: the bus accepts exactly the ones that do not overlap, and routes
    /// every address to the device whose range holds it.
    #[test]
    fn the_bus_routes_like_a_list_of_ranges(
        ranges in prop::collection::vec((0u64..0x200, 0u64..0x40), 1..12),
        probes in prop::collection::vec(0u64..0x260, 1..64),
    ) {
        struct Id(u8);
        impl BusDevice for Id {
            fn read(&mut self, _offset: u64, data: &mut [u8]) {
                data.fill(self.0);
            }
            fn write(&mut self, _offset: u64, _data: &[u8]) {}
        }
        let errors = Arc::new(GuestErrorCounter::default());
        let mut bus = Bus::new(errors.clone());
        let mut accepted: Vec<(u64, u64, u8)> = Vec::new();
        for (i, (base, len)) in ranges.into_iter().enumerate() {
            let overlaps = accepted.iter().any(|(b, l, _)| base < b + l && *b < base + len);
            let ok = bus.insert(Arc::new(Mutex::new(Id(i as u8))), base, len).is_ok();
            prop_assert_eq!(ok, len > 0 && !overlaps);
            if ok {
                accepted.push((base, len, i as u8));
            }
        }
        let mut misses = 0;
        for addr in probes {
            let mut b = [0u8; 2];
            let claimed = bus.read(addr, &mut b);
            match accepted.iter().find(|(base, len, _)| (*base..base + len).contains(&addr)) {
                Some((_, _, id)) => {
                    prop_assert!(claimed);
                    prop_assert_eq!(b, [*id; 2]);
                }
                None => {
                    prop_assert!(!claimed);
                    prop_assert_eq!(b, [0xff; 2]);
                    misses += 1;
                }
            }
        }
        prop_assert_eq!(errors.total(), misses);
    }
}
