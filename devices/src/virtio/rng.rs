//! virtio-rng (virtio 1.2, 5.4): entropy for the guest from the host's `getrandom`, so that a
//! guest's early boot does not stall waiting for its own entropy to build up.

use virtio_queue::Queue;
use vm_memory::Bytes;

use super::{serve_chains, GuestMemory, QueueError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::events::GuestEvents;

/// virtio device ID of an entropy source.
pub const VIRTIO_ID_RNG: u32 = 4;
/// Its one queue's size.
const QUEUE_SIZE: u16 = 256;
/// The most bytes one request gets: Linux asks for at most a page or so at a time, and the
/// bound keeps one request from holding the worker (and a host getrandom) for long.
pub const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;

/// The entropy device.
#[derive(Debug, Default)]
pub struct Rng {
    buffer: Vec<u8>,
}

impl Rng {
    /// A new entropy device.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Fills `buf` from the host's `getrandom`; false if the host has none to give.
fn fill_random(buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is valid for writes of its length.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        // Negative on an error, else the bytes written.
        let Ok(n) = usize::try_from(n) else {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        };
        done += n;
    }
    true
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn config(&self) -> &[u8] {
        &[]
    }

    fn process_queue(
        &mut self,
        _index: usize,
        queue: &mut Queue,
        mem: &GuestMemory,
        events: &dyn GuestEvents,
    ) -> Result<bool, QueueError> {
        serve_chains(queue, mem, events, |all| {
            if !all.iter().all(|d| d.is_write_only()) {
                events.virtio_error();
                return 0;
            }
            let mut written: u32 = 0;
            let mut room = MAX_BYTES_PER_REQUEST;
            for d in all {
                let len = (d.len() as usize).min(room);
                self.buffer.resize(len, 0);
                let filled = fill_random(&mut self.buffer);
                if !filled || mem.write_slice(&self.buffer, d.addr()).is_err() {
                    events.virtio_error();
                    break;
                }
                written = written.saturating_add(u32::try_from(len).unwrap_or(u32::MAX));
                room -= len;
            }
            written
        })
    }
}
