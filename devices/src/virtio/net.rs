//! virtio-net (virtio 1.2, 5.1) on a frame file (a tap in pvmm, a datagram socket in tests):
//! one receive and one transmit queue, a MAC address and a link that is up, and on a tap the
//! checksum and TCP segmentation offloads.
//!
//! Every frame passes between the queue and the file unchanged behind its 12-byte virtio-net
//! header, but for the header's `num_buffers`, which the device sets to 1 on receive. The
//! offloads cost nothing more, because the tap speaks the same header: on transmit it
//! completes a frame's checksum and cuts a 64 KiB TCP segment into MTU-sized packets as the
//! header asks, and on receive it hands over unchecked and unsegmented frames, with a header
//! that says so, only once told which of them the driver accepted (`TUNSETOFFLOAD`, set from
//! the features the driver acknowledges). So with offloads a frame of up to 64 KiB is one
//! queue entry and one notification instead of some 45, the figure that bounds a virtual
//! network card's throughput. Without a tap (a socket pair) the card offers none, and its
//! frames' headers say "no checksum, no segmentation".
//!
//! Receiving is driven by the frame file becoming readable (the worker waits on it, edge
//! triggered) and by the guest adding receive buffers: either way the device reads frames
//! until the file has none or the guest has no buffer left; a frame read with no buffer to
//! take it waits in the device for the next one. Without `VIRTIO_NET_F_MRG_RXBUF` a driver
//! that accepts segmentation offloads posts receive buffers that each hold a whole 64 KiB
//! frame (Linux's "big packets").

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;

use super::tap::{set_offload, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6};
use super::{
    descriptors, pop_chain, serve_chains, GuestMemory, QueueError, VirtioDevice, VIRTIO_F_VERSION_1,
};
use crate::events::GuestEvents;

/// virtio device ID of a network card.
pub const VIRTIO_ID_NET: u32 = 1;
/// The virtio 1.x header on every frame (with `num_buffers`).
pub const NET_HEADER_LEN: usize = 12;
/// Where `num_buffers` is in the header.
const NUM_BUFFERS_OFFSET: usize = 10;
/// Each queue's size.
const QUEUE_SIZE: u16 = 256;
/// The receive and transmit queues' indexes.
const RX: usize = 0;
const TX: usize = 1;
/// The longest frame the device moves, header included: a 64 KiB IP packet in an Ethernet
/// frame, so that a guest or host MTU up to 65535 passes.
const MAX_FRAME: usize = NET_HEADER_LEN + 14 + 4 + 65535;
// A whole segmentation-offload frame (64 KiB of IP behind its Ethernet header) fits.
const _: () = assert!(MAX_FRAME >= NET_HEADER_LEN + 14 + 65535);

/// Feature bits (virtio 1.2, 5.1.3).
const F_MAC: u64 = 1 << 5;
const F_STATUS: u64 = 1 << 16;
/// The device completes checksums of frames the driver sends (`VIRTIO_NET_F_CSUM`).
pub const F_CSUM: u64 = 1 << 0;
/// The driver takes frames whose checksum is not computed (`VIRTIO_NET_F_GUEST_CSUM`).
pub const F_GUEST_CSUM: u64 = 1 << 1;
/// The driver takes unsegmented TCP frames of up to 64 KiB, IPv4 and IPv6.
pub const F_GUEST_TSO4: u64 = 1 << 7;
/// See [`F_GUEST_TSO4`].
pub const F_GUEST_TSO6: u64 = 1 << 8;
/// The device segments TCP frames of up to 64 KiB the driver sends, IPv4 and IPv6.
pub const F_HOST_TSO4: u64 = 1 << 11;
/// See [`F_HOST_TSO4`].
pub const F_HOST_TSO6: u64 = 1 << 12;
/// The offloads a card on a tap offers: each has a `TUN_F_*` counterpart (receive) or is done
/// by the tap on every frame written to it (transmit).
const TAP_OFFLOADS: u64 =
    F_CSUM | F_GUEST_CSUM | F_GUEST_TSO4 | F_GUEST_TSO6 | F_HOST_TSO4 | F_HOST_TSO6;
/// The link is up (the configuration's `status`).
const LINK_UP: u16 = 1;

/// A network card on a frame file.
pub struct Net {
    frames: File,
    /// The frame file is a tap, which can take offloads.
    tap: bool,
    config: [u8; 8],
    /// A frame read from the file that no receive buffer has taken yet.
    pending: Option<usize>,
    buffer: Vec<u8>,
}

impl Net {
    /// A card with address `mac` on `frames`, a non-blocking file of which each read or write
    /// is one frame behind a [`NET_HEADER_LEN`]-byte header.
    pub fn new(frames: File, mac: [u8; 6]) -> Self {
        let mut config = [0u8; 8];
        config[..6].copy_from_slice(&mac);
        config[6..].copy_from_slice(&LINK_UP.to_le_bytes());
        Self {
            frames,
            tap: false,
            config,
            pending: None,
            buffer: vec![0; MAX_FRAME],
        }
    }

    /// A card with address `mac` on the tap `tap`, offering the offloads the tap does.
    pub fn on_tap(tap: super::tap::Tap, mac: [u8; 6]) -> Self {
        Self {
            tap: true,
            ..Self::new(tap.into_file(), mac)
        }
    }

    /// Sends every frame the guest has queued; a frame the file refuses is dropped, as a
    /// full link drops it.
    fn transmit(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemory,
        events: &dyn GuestEvents,
    ) -> Result<bool, QueueError> {
        serve_chains(queue, mem, events, |all| {
            if !self.gather(all, mem) {
                events.virtio_error();
            }
            0
        })
    }

    /// Copies a transmit chain's frame into the buffer and writes it to the file; false when
    /// the chain is not a frame (device-writable, shorter than its header, too long, or
    /// outside RAM). A frame the file refuses is dropped, as a full link drops it.
    fn gather(&mut self, all: &[Descriptor], mem: &GuestMemory) -> bool {
        let mut len = 0usize;
        for d in all {
            let n = d.len() as usize;
            let Some(room) = self.buffer.get_mut(len..len.saturating_add(n)) else {
                return false;
            };
            if d.is_write_only() || mem.read_slice(room, d.addr()).is_err() {
                return false;
            }
            len += n;
        }
        if len < NET_HEADER_LEN {
            return false;
        }
        let _ = self.frames.write(&self.buffer[..len]);
        true
    }

    /// Moves frames from the file into the guest's receive buffers while both have some.
    fn receive(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemory,
        events: &dyn GuestEvents,
    ) -> Result<bool, QueueError> {
        let mut used = false;
        loop {
            let len = match self.pending.take() {
                Some(len) => len,
                None => match self.frames.read(&mut self.buffer) {
                    Ok(len) if len >= NET_HEADER_LEN => len,
                    Ok(0) => return Ok(used),
                    // Shorter than a header: not a frame this device can pass on.
                    Ok(_) => continue,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => return Ok(used),
                },
            };
            let Some(chain) = pop_chain(queue, mem)? else {
                self.pending = Some(len);
                return Ok(used);
            };
            let head = chain.head_index();
            self.buffer[NUM_BUFFERS_OFFSET..NET_HEADER_LEN].copy_from_slice(&1u16.to_le_bytes());
            let written = match descriptors(chain) {
                Some(all) if all.iter().all(|d| d.is_write_only()) => {
                    let mut at = 0usize;
                    for d in &all {
                        let n = (d.len() as usize).min(len - at);
                        if mem.write_slice(&self.buffer[at..at + n], d.addr()).is_err() {
                            break;
                        }
                        at += n;
                    }
                    if at < len {
                        // Buffers too small or outside RAM: the frame is lost.
                        events.virtio_error();
                    }
                    u32::try_from(at).unwrap_or(u32::MAX)
                }
                _ => {
                    events.virtio_error();
                    0
                }
            };
            queue.add_used(mem, head, written)?;
            used = true;
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        let offloads = if self.tap { TAP_OFFLOADS } else { 0 };
        VIRTIO_F_VERSION_1 | F_MAC | F_STATUS | offloads
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn config(&self) -> &[u8] {
        &self.config
    }

    fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemory,
        events: &dyn GuestEvents,
    ) -> Result<bool, QueueError> {
        match index {
            RX => self.receive(queue, mem, events),
            TX => self.transmit(queue, mem, events),
            _ => Ok(false),
        }
    }

    fn backend(&self) -> Option<(RawFd, usize)> {
        Some((self.frames.as_raw_fd(), RX))
    }

    fn features_acked(&mut self, features: u64) {
        if self.tap {
            // A tap that refuses them keeps handing over plain frames, which every driver
            // takes: the card works, only slower.
            let _ = set_offload(&self.frames, tun_offloads(features));
        }
    }

    fn reset(&mut self) {
        self.pending = None;
        if self.tap {
            let _ = set_offload(&self.frames, 0);
        }
    }
}

/// The tap offloads (`TUN_F_*`) that the driver's accepted `features` allow on received
/// frames: checksums left undone only when it takes them, segments only with them.
pub fn tun_offloads(features: u64) -> u32 {
    if features & F_GUEST_CSUM == 0 {
        return 0;
    }
    let mut flags = TUN_F_CSUM;
    if features & F_GUEST_TSO4 != 0 {
        flags |= TUN_F_TSO4;
    }
    if features & F_GUEST_TSO6 != 0 {
        flags |= TUN_F_TSO6;
    }
    flags
}

#[cfg(test)]
mod tests;
