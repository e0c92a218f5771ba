//! Tests of the transport: a driver's handshake through the registers, the rules it must
//! keep, and the worker serving an entropy queue; then random register traffic.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::events::GuestErrorCounter;
use crate::virtio::rng::{Rng, VIRTIO_ID_RNG};
use crate::virtio::testing::{fuzz_config, TestRing, AVAIL, DATA, DESC, USED};
use crate::virtio::worker::{notified, Worker};

struct Driver {
    dev: MmioTransport,
    errors: Arc<GuestErrorCounter>,
    ring: TestRing,
}

impl Driver {
    fn new() -> Self {
        let ring = TestRing::new(8);
        let errors = Arc::new(GuestErrorCounter::default());
        let line = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dev = MmioTransport::new(
            Box::new(Rng::new()),
            ring.mem.clone(),
            Arc::new(Interrupt::new(line)),
            errors.clone(),
        )
        .unwrap();
        Self { dev, errors, ring }
    }

    fn read(&mut self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.dev.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write(&mut self, offset: u64, value: u32) {
        self.dev.write(offset, &value.to_le_bytes());
    }

    /// The whole handshake, up to DRIVER_OK, with the test ring as queue 0.
    fn set_up(&mut self) {
        self.set_up_with(0);
    }

    /// The handshake, accepting `low` of the features' low word too.
    fn set_up_with(&mut self, low: u32) {
        use status::*;
        self.write(reg::STATUS, ACKNOWLEDGE);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER);
        self.write(reg::DRIVER_FEATURES_SEL, 0);
        self.write(reg::DRIVER_FEATURES, low);
        self.write(reg::DRIVER_FEATURES_SEL, 1);
        self.write(reg::DRIVER_FEATURES, 1);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_ne!(self.read(reg::STATUS) & FEATURES_OK, 0);
        self.write(reg::QUEUE_SEL, 0);
        self.write(reg::QUEUE_NUM, u32::from(self.ring.size));
        self.write(reg::QUEUE_DESC_LOW, DESC as u32);
        self.write(reg::QUEUE_DRIVER_LOW, AVAIL as u32);
        self.write(reg::QUEUE_DEVICE_LOW, USED as u32);
        self.write(reg::QUEUE_READY, 1);
        self.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        assert!(self.dev.lock().live());
    }
}

#[test]
fn a_driver_finds_the_device_and_gets_entropy() {
    let mut d = Driver::new();
    assert_eq!(d.read(reg::MAGIC), MAGIC);
    assert_eq!(d.read(reg::VERSION), 2);
    assert_eq!(d.read(reg::DEVICE_ID), VIRTIO_ID_RNG);
    d.write(reg::DEVICE_FEATURES_SEL, 1);
    assert_eq!(d.read(reg::DEVICE_FEATURES), 1, "VERSION_1, bit 32");
    assert_eq!(d.read(reg::QUEUE_NUM_MAX), 256);
    d.set_up();
    d.ring.chain(&[(DATA, 64, true)]);
    d.write(reg::QUEUE_NOTIFY, 0);
    assert_eq!(d.dev.notifiers()[0].read().unwrap(), 1);
    notified(&d.dev, 0);
    assert_eq!(d.ring.used(0), (0, 64));
    assert_eq!(d.read(reg::INTERRUPT_STATUS), INT_USED_BUFFER);
    d.write(reg::INTERRUPT_ACK, INT_USED_BUFFER);
    assert_eq!(d.read(reg::INTERRUPT_STATUS), 0);
    assert_eq!(d.errors.total(), 0);
}

#[test]
fn with_event_indexes_the_device_names_its_next_notification_and_spares_interrupts() {
    use vm_memory::{Bytes, GuestAddress};
    let mut d = Driver::new();
    d.write(reg::DEVICE_FEATURES_SEL, 0);
    assert_ne!(
        d.read(reg::DEVICE_FEATURES) & (1 << 29),
        0,
        "EVENT_IDX offered"
    );
    d.set_up_with(1 << 29);
    let size = u64::from(d.ring.size);
    let (avail_event, used_event) = (USED + 4 + 8 * size, AVAIL + 4 + 2 * size);
    // The driver wants an interrupt only once the used index passes 1: the first buffer used
    // raises none, the second does.
    d.ring
        .mem
        .write_obj(1u16, GuestAddress(used_event))
        .unwrap();
    d.ring.chain(&[(DATA, 16, true)]);
    notified(&d.dev, 0);
    assert_eq!(d.ring.used_idx(), 1);
    assert_eq!(
        d.read(reg::INTERRUPT_STATUS),
        0,
        "no interrupt before the driver's index"
    );
    // The device asks to be notified at the next available index, past what it served.
    let asked: u16 = d.ring.mem.read_obj(GuestAddress(avail_event)).unwrap();
    assert_eq!(asked, 1);
    d.ring.chain(&[(DATA, 16, true)]);
    notified(&d.dev, 0);
    assert_eq!(d.ring.used_idx(), 2);
    assert_eq!(d.read(reg::INTERRUPT_STATUS), INT_USED_BUFFER);
    let asked: u16 = d.ring.mem.read_obj(GuestAddress(avail_event)).unwrap();
    assert_eq!(asked, 2);
    assert_eq!(d.errors.total(), 0);
}

#[test]
fn the_worker_serves_notifications_on_its_own_thread() {
    let mut d = Driver::new();
    d.set_up();
    let mut worker = Worker::spawn("pvmm-rng-test", d.dev.clone(), Box::new(|| {})).unwrap();
    d.ring.chain(&[(DATA, 32, true)]);
    d.write(reg::QUEUE_NOTIFY, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while d.ring.used_idx() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    worker.stop();
    assert_eq!(d.ring.used(0), (0, 32));
}

#[test]
fn rule_breaking_writes_are_ignored_and_counted() {
    use status::*;
    let mut d = Driver::new();
    // A notification before DRIVER_OK.
    d.write(reg::QUEUE_NOTIFY, 0);
    assert_eq!(d.errors.total(), 1);
    assert!(d.dev.notifiers()[0].read().is_err(), "nothing to serve");
    // FEATURES_OK without VERSION_1 stays clear.
    d.write(reg::STATUS, ACKNOWLEDGE | DRIVER);
    d.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(d.read(reg::STATUS) & FEATURES_OK, 0);
    assert_eq!(d.errors.total(), 2);
    d.write(reg::STATUS, 0);
    d.set_up();
    let before = d.errors.total();
    // Live: the queue's size and rings stay; clearing a status bit is refused; a short
    // register access is ignored.
    d.write(reg::QUEUE_NUM, 4);
    d.write(reg::QUEUE_DESC_LOW, 0x8000);
    d.write(reg::STATUS, ACKNOWLEDGE);
    d.dev.write(reg::STATUS, &[0]);
    let mut short = [0u8; 2];
    d.dev.read(reg::MAGIC, &mut short);
    assert_eq!(d.errors.total(), before + 5);
    assert_eq!(d.dev.lock().queues[0].size(), 8);
    assert_eq!(d.dev.lock().queues[0].desc_table(), DESC);
    // A reset forgets everything.
    d.write(reg::STATUS, 0);
    assert_eq!(d.read(reg::STATUS), 0);
    assert!(!d.dev.lock().queues[0].ready());
}

#[test]
fn rings_outside_ram_put_the_device_into_needs_reset() {
    use status::*;
    let mut d = Driver::new();
    d.write(reg::STATUS, ACKNOWLEDGE | DRIVER);
    d.write(reg::DRIVER_FEATURES_SEL, 1);
    d.write(reg::DRIVER_FEATURES, 1);
    d.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    d.write(reg::QUEUE_NUM, 8);
    d.write(reg::QUEUE_DESC_HIGH, 0x10);
    d.write(reg::QUEUE_DRIVER_LOW, AVAIL as u32);
    d.write(reg::QUEUE_DEVICE_LOW, USED as u32);
    d.write(reg::QUEUE_READY, 1);
    d.write(reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
    assert_ne!(d.read(reg::STATUS) & DEVICE_NEEDS_RESET, 0);
    assert_eq!(d.read(reg::INTERRUPT_STATUS), INT_CONFIG_CHANGE);
    assert!(!d.dev.lock().live());
    d.write(reg::QUEUE_NOTIFY, 0);
    assert_eq!(d.errors.total(), 2);
}

#[test]
fn an_available_index_past_the_queue_size_needs_a_reset() {
    let mut d = Driver::new();
    d.set_up();
    for _ in 0..9 {
        d.ring.publish(0);
    }
    notified(&d.dev, 0);
    assert_ne!(d.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert_eq!(d.errors.total(), 1);
}

proptest! {
    #![proptest_config(fuzz_config(256, 0x6d6d_696f_6675_7a7a))]

    /// Any register traffic, of any size at any offset, interleaved with notifications the
    /// worker serves: never a panic, and every used entry the device writes is in the ring.
    #[test]
    fn random_register_traffic_never_panics(
        ops in prop::collection::vec(
            (0u64..0x140, prop::sample::select(vec![1usize, 2, 4, 8]), any::<u32>(), any::<bool>()),
            1..64,
        ),
    ) {
        let mut d = Driver::new();
        for (offset, size, value, write) in ops {
            let offset = offset & !3;
            if write {
                let bytes = u64::from(value).to_le_bytes();
                d.dev.write(offset, &bytes[..size]);
            } else {
                let mut data = vec![0u8; size];
                d.dev.read(offset, &mut data);
            }
            if offset == reg::QUEUE_NOTIFY {
                notified(&d.dev, value as usize % 2);
            }
        }
    }
}
