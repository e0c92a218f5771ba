//! Tests of the network card on a datagram socket pair (one datagram, one frame, as a tap):
//! frames both ways, then hostile rings.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use std::os::unix::net::UnixDatagram;

use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::events::GuestErrorCounter;
use crate::virtio::testing::{fuzz_config, TestRing, DATA};

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];

/// A card on one end of a socket pair; the other end is the "tap".
fn card() -> (Net, UnixDatagram) {
    let (ours, theirs) = UnixDatagram::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    let file = File::from(std::os::fd::OwnedFd::from(ours));
    (Net::new(file, MAC), theirs)
}

fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; NET_HEADER_LEN];
    f.extend((0..len).map(|i| i as u8));
    f
}

#[test]
fn frames_go_out_and_come_in_unchanged_but_for_num_buffers() {
    let (mut net, tap) = card();
    assert_eq!(&net.config()[..6], &MAC);
    let errors = GuestErrorCounter::default();
    let mut tx = TestRing::new(8);
    let mut q = tx.queue();
    let out = frame(100);
    tx.mem
        .write_slice(&out[..NET_HEADER_LEN], GuestAddress(DATA))
        .unwrap();
    tx.mem
        .write_slice(&out[NET_HEADER_LEN..], GuestAddress(DATA + 0x100))
        .unwrap();
    tx.chain(&[
        (DATA, NET_HEADER_LEN as u32, false),
        (DATA + 0x100, 100, false),
    ]);
    assert!(net.process_queue(TX, &mut q, &tx.mem, &errors).unwrap());
    let mut got = vec![0u8; 2048];
    let n = tap.recv(&mut got).unwrap();
    assert_eq!(&got[..n], &out[..]);

    let mut rx = TestRing::new(8);
    let mut q = rx.queue();
    // No buffer yet: the frame waits in the device.
    let incoming = frame(60);
    tap.send(&incoming).unwrap();
    assert!(!net.process_queue(RX, &mut q, &rx.mem, &errors).unwrap());
    rx.chain(&[(DATA, 1526, true)]);
    assert!(net.process_queue(RX, &mut q, &rx.mem, &errors).unwrap());
    assert_eq!(rx.used(0).1 as usize, incoming.len());
    let mut seen = vec![0u8; incoming.len()];
    rx.mem.read_slice(&mut seen, GuestAddress(DATA)).unwrap();
    assert_eq!(
        &seen[NUM_BUFFERS_OFFSET..NET_HEADER_LEN],
        &1u16.to_le_bytes()
    );
    assert_eq!(&seen[NET_HEADER_LEN..], &incoming[NET_HEADER_LEN..]);
    assert_eq!(errors.total(), 0);
}

#[test]
fn bad_chains_are_counted_and_the_card_goes_on() {
    let (mut net, tap) = card();
    let errors = GuestErrorCounter::default();
    let mut tx = TestRing::new(8);
    let mut q = tx.queue();
    // A write-only buffer on the transmit queue; a frame shorter than its header.
    tx.chain(&[(DATA, 64, true)]);
    tx.chain(&[(DATA, 4, false)]);
    net.process_queue(TX, &mut q, &tx.mem, &errors).unwrap();
    assert_eq!(errors.total(), 2);
    assert_eq!(tx.used_idx(), 2);
    // A receive buffer too small for the frame, then one outside RAM.
    let mut rx = TestRing::new(8);
    let mut q = rx.queue();
    tap.send(&frame(200)).unwrap();
    tap.send(&frame(200)).unwrap();
    rx.chain(&[(DATA, 20, true)]);
    rx.chain(&[(1 << 40, 1526, true)]);
    net.process_queue(RX, &mut q, &rx.mem, &errors).unwrap();
    assert_eq!(errors.total(), 4);
    assert_eq!(rx.used_idx(), 2);
}

proptest! {
    #![proptest_config(fuzz_config(256, 0x6e65_7466_757a_7a21))]

    /// Any ring on either queue, with frames waiting: never a panic, every published chain
    /// used.
    #[test]
    fn hostile_rings_never_panic(
        table in prop::collection::vec(
            (prop_oneof![0u64..(1 << 20), any::<u64>()], prop_oneof![0u32..2048, any::<u32>()], 0u16..8, 0u16..20),
            16,
        ),
        heads in prop::collection::vec(0u16..20, 1..16),
        queue in 0usize..2,
        frames in prop::collection::vec(0usize..1600, 0..4),
    ) {
        let (mut net, tap) = card();
        for f in &frames {
            tap.send(&frame(*f)).unwrap();
        }
        let mut ring = TestRing::new(16);
        let mut q = ring.queue();
        for (i, &(addr, len, flags, next)) in table.iter().enumerate() {
            ring.raw(i as u16, addr, len, flags, next);
        }
        for &h in &heads {
            ring.publish(h);
        }
        let errors = GuestErrorCounter::default();
        let _ = net.process_queue(queue, &mut q, &ring.mem, &errors);
    }
}

#[test]
fn offloads_are_offered_on_taps_only_and_follow_what_the_driver_took() {
    let (net, _) = card();
    assert_eq!(
        net.features() & TAP_OFFLOADS,
        0,
        "a socket pair does no offloads"
    );
    assert_eq!(tun_offloads(0), 0);
    assert_eq!(
        tun_offloads(F_GUEST_TSO4),
        0,
        "no segments without checksums"
    );
    assert_eq!(tun_offloads(F_GUEST_CSUM), TUN_F_CSUM);
    assert_eq!(
        tun_offloads(F_GUEST_CSUM | F_GUEST_TSO4 | F_GUEST_TSO6),
        TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6
    );
}
