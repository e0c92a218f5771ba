//! virtio-net (virtio 1.2, 5.1) on a frame file (a tap in pvmm, a datagram socket in tests):
//! one receive and one transmit queue, a MAC address and a link that is up, and no offloads.
//!
//! No offloads keeps the frames plain: the guest sends and takes whole Ethernet frames behind
//! a 12-byte virtio-net header whose GSO and checksum fields say "none", and the tap, opened
//! with that header size and no offload enabled, reads and writes exactly that. So a frame
//! passes between the queue and the tap unchanged, but for the header's `num_buffers`, which
//! the device sets to 1 on receive.
//!
//! Receiving is driven by the frame file becoming readable (the worker waits on it, edge
//! triggered) and by the guest adding receive buffers: either way the device reads frames
//! until the file has none or the guest has no buffer left; a frame read with no buffer to
//! take it waits in the device for the next one.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;

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

/// Feature bits (virtio 1.2, 5.1.3).
const F_MAC: u64 = 1 << 5;
const F_STATUS: u64 = 1 << 16;
/// The link is up (the configuration's `status`).
const LINK_UP: u16 = 1;

/// A network card on a frame file.
pub struct Net {
    frames: File,
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
            config,
            pending: None,
            buffer: vec![0; MAX_FRAME],
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
                    at as u32
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
        VIRTIO_F_VERSION_1 | F_MAC | F_STATUS
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

    fn reset(&mut self) {
        self.pending = None;
    }
}

#[cfg(test)]
mod tests;
