//! Tests of the disk: requests as a driver sends them, then as a hostile one does.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::events::GuestErrorCounter;
use crate::virtio::testing::{fuzz_config, Image, TestRing, DATA, NEXT, WRITE};

/// Where tests put a request's header, and its status byte.
const HEADER: u64 = DATA;
const STATUS: u64 = DATA + 0x100;
/// Where tests put request data.
const BUF: u64 = DATA + 0x1000;

fn header(ring: &TestRing, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    ring.mem.write_slice(&h, GuestAddress(HEADER)).unwrap();
    ring.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
}

fn status(ring: &TestRing) -> u8 {
    ring.mem.read_obj(GuestAddress(STATUS)).unwrap()
}

/// Serves every available request; returns the errors counted.
fn run(disk: &mut Block, ring: &TestRing, q: &mut Queue) -> u64 {
    let errors = GuestErrorCounter::default();
    disk.process_queue(0, q, &ring.mem, &errors).unwrap();
    errors.total()
}

#[test]
fn reads_writes_flushes_and_names_itself() {
    let image = Image::new("rw", 4096);
    let mut disk = Block::open(&image.path, false).unwrap();
    assert_eq!(disk.capacity_sectors(), 8);
    assert_eq!(disk.features() & F_RO, 0);
    assert_eq!(&disk.config()[0..8], &8u64.to_le_bytes());
    let mut ring = TestRing::new(16);
    let mut q = ring.queue();

    header(&ring, T_IN, 1);
    ring.chain(&[(HEADER, 16, false), (BUF, 1024, true), (STATUS, 1, true)]);
    assert_eq!(run(&mut disk, &ring, &mut q), 0);
    assert_eq!(status(&ring), S_OK);
    assert_eq!(ring.used(0).1, 1024 + 1);
    let mut read = vec![0u8; 1024];
    ring.mem.read_slice(&mut read, GuestAddress(BUF)).unwrap();
    assert!(read.iter().enumerate().all(|(i, b)| *b == (512 + i) as u8));

    ring.mem
        .write_slice(&[0xab; 512], GuestAddress(BUF))
        .unwrap();
    header(&ring, T_OUT, 7);
    ring.chain(&[(HEADER, 16, false), (BUF, 512, false), (STATUS, 1, true)]);
    assert_eq!(run(&mut disk, &ring, &mut q), 0);
    assert_eq!(status(&ring), S_OK);
    header(&ring, T_FLUSH, 0);
    ring.chain(&[(HEADER, 16, false), (STATUS, 1, true)]);
    assert_eq!(run(&mut disk, &ring, &mut q), 0);
    assert_eq!(status(&ring), S_OK);
    let on_disk = std::fs::read(&image.path).unwrap();
    assert!(on_disk[3584..].iter().all(|b| *b == 0xab));
    assert_eq!(on_disk[3583], 3583u32 as u8);

    header(&ring, T_GET_ID, 0);
    ring.chain(&[(HEADER, 16, false), (BUF, 20, true), (STATUS, 1, true)]);
    assert_eq!(run(&mut disk, &ring, &mut q), 0);
    let mut id = [0u8; 20];
    ring.mem.read_slice(&mut id, GuestAddress(BUF)).unwrap();
    assert!(id.starts_with(b"pvmm-virtio-rw"), "{id:?}");
    assert_eq!(ring.used_idx(), 4);
}

#[test]
fn a_read_only_disk_refuses_writes_and_keeps_the_image() {
    let image = Image::new("ro", 4096);
    let before = std::fs::read(&image.path).unwrap();
    let mut disk = Block::open(&image.path, true).unwrap();
    assert_ne!(disk.features() & F_RO, 0);
    let mut ring = TestRing::new(8);
    let mut q = ring.queue();
    header(&ring, T_OUT, 0);
    ring.chain(&[(HEADER, 16, false), (BUF, 512, false), (STATUS, 1, true)]);
    assert_eq!(run(&mut disk, &ring, &mut q), 1);
    assert_eq!(status(&ring), S_IOERR);
    assert_eq!(std::fs::read(&image.path).unwrap(), before);
}

/// A request's type, sector, data buffers, and the status it must get.
type Case = (u32, u64, &'static [(u64, u32, bool)], u8);

#[test]
fn requests_past_the_end_or_of_odd_shape_get_an_error_status() {
    let image = Image::new("bad", 4096);
    let mut disk = Block::open(&image.path, false).unwrap();
    let mut ring = TestRing::new(16);
    let mut q = ring.queue();
    let cases: &[Case] = &[
        // Past the end; a sector so large its byte offset overflows.
        (T_IN, 8, &[(BUF, 512, true)], S_IOERR),
        (T_IN, u64::MAX / 2, &[(BUF, 512, true)], S_IOERR),
        // Not whole sectors; the wrong direction; too large a segment.
        (T_IN, 0, &[(BUF, 100, true)], S_IOERR),
        (T_IN, 0, &[(BUF, 512, false)], S_IOERR),
        (T_OUT, 0, &[(BUF, SIZE_MAX + 512, false)], S_IOERR),
        // A buffer outside RAM.
        (T_IN, 0, &[(1 << 40, 512, true)], S_IOERR),
        // A type nobody negotiated.
        (11, 0, &[], S_UNSUPP),
    ];
    for (i, &(kind, sector, data, expect)) in cases.iter().enumerate() {
        header(&ring, kind, sector);
        let mut chain = vec![(HEADER, 16, false)];
        chain.extend_from_slice(data);
        chain.push((STATUS, 1, true));
        ring.chain(&chain);
        let errors = run(&mut disk, &ring, &mut q);
        assert_eq!(status(&ring), expect, "case {i}");
        assert_eq!(errors, 1, "case {i}: each mistake counts once");
    }
    assert_eq!(ring.used_idx(), cases.len() as u16);
    assert_eq!(std::fs::read(&image.path).unwrap().len(), 4096);
}

#[test]
fn a_looping_chain_is_used_empty_and_counted() {
    let image = Image::new("loop", 4096);
    let mut disk = Block::open(&image.path, false).unwrap();
    let mut ring = TestRing::new(4);
    let mut q = ring.queue();
    header(&ring, T_IN, 0);
    ring.raw(0, HEADER, 16, NEXT, 1);
    ring.raw(1, BUF, 512, NEXT | WRITE, 0);
    ring.publish(0);
    assert_eq!(run(&mut disk, &ring, &mut q), 1);
    assert_eq!(ring.used(0), (0, 0));
    assert_eq!(
        status(&ring),
        0xff,
        "no status written for a chain that never ends"
    );
}

#[test]
fn images_that_cannot_back_a_disk_are_refused() {
    let missing = std::path::Path::new("/nonexistent/disk.img");
    assert!(matches!(
        Block::open(missing, false),
        Err(BlockError::Open { .. })
    ));
    let dir = std::env::temp_dir();
    assert!(Block::open(&dir, true).is_err());
    let image = Image::new("lock", 1024);
    let held = Block::open(&image.path, false).unwrap();
    let second = Block::open(&image.path, false).err().unwrap();
    assert!(matches!(second, BlockError::Locked(_)), "{second}");
    assert!(Block::open(&image.path, true).is_err());
    drop(held);
    let reader = Block::open(&image.path, true).unwrap();
    let also = Block::open(&image.path, true);
    assert!(also.is_ok(), "read-only disks share an image");
    assert!(Block::open(&image.path, false).is_err());
    drop(reader);
}

/// One hostile descriptor: any address (inside RAM or not), length and flags, any next.
fn descriptor() -> impl Strategy<Value = (u64, u32, u16, u16)> {
    (
        prop_oneof![0u64..(1 << 20), any::<u64>()],
        prop_oneof![0u32..4096, any::<u32>()],
        0u16..8,
        0u16..20,
    )
}

proptest! {
    #![proptest_config(fuzz_config(256, 0x626c_6b66_757a_7a21))]

    /// Whatever a driver writes in the ring, the disk answers every published chain without a
    /// panic, and never changes the image's size.
    #[test]
    fn hostile_rings_never_panic(
        table in prop::collection::vec(descriptor(), 16),
        heads in prop::collection::vec(0u16..20, 1..16),
        kind in prop_oneof![Just(T_IN), Just(T_OUT), Just(T_FLUSH), Just(T_GET_ID), any::<u32>()],
        sector in prop_oneof![0u64..16, any::<u64>()],
    ) {
        let image = Image::new("fuzz", 8192);
        let mut disk = Block::open(&image.path, false).unwrap();
        let mut ring = TestRing::new(16);
        let mut q = ring.queue();
        header(&ring, kind, sector);
        for (i, &(addr, len, flags, next)) in table.iter().enumerate() {
            ring.raw(i as u16, addr, len, flags, next);
        }
        for &h in &heads {
            ring.publish(h);
        }
        let errors = GuestErrorCounter::default();
        let served = disk.process_queue(0, &mut q, &ring.mem, &errors);
        if served.is_ok() {
            prop_assert_eq!(ring.used_idx(), heads.len() as u16);
        }
        prop_assert_eq!(std::fs::metadata(&image.path).unwrap().len(), 8192);
    }
}
