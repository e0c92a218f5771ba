//! virtio-blk (virtio 1.2, 5.2) on a raw image file: read, write, flush (`fdatasync`) and
//! get-ID, read-only on request.
//!
//! pvmm takes an advisory lock on the image, as QEMU's image locking does: exclusive for a
//! writable disk, shared for a read-only one, so that two VMs never write one image and a VM
//! never reads an image another one writes.
//!
//! Every request is checked before the image is touched: its shape (a readable 16-byte
//! header first, a writable status byte last, at most `seg_max` data segments of at most
//! `size_max` bytes each), its direction, and its sectors against the disk's end. A request
//! that fails a check gets VIRTIO_BLK_S_IOERR (or UNSUPP for an unknown type) and is counted.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use virtio_queue::desc::split::Descriptor;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};

use super::{serve_chains, GuestMemory, QueueError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::events::GuestEvents;

/// virtio device ID of a block device.
pub const VIRTIO_ID_BLOCK: u32 = 2;
/// Sector size of the request protocol (and of `capacity`).
pub const SECTOR_SIZE: u64 = 512;
/// The queue's size.
const QUEUE_SIZE: u16 = 128;
/// Data segments per request: the queue less the header and status descriptors.
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Bytes per data segment: bounds the worker's bounce buffer (Linux splits larger I/O).
pub const SIZE_MAX: u32 = 1 << 20;
/// Length of the get-ID answer (VIRTIO_BLK_ID_BYTES).
const ID_BYTES: usize = 20;
/// The request header's length: type, reserved, sector.
const HEADER_LEN: u32 = 16;

/// Feature bits (virtio 1.2, 5.2.3).
const F_SIZE_MAX: u64 = 1 << 1;
const F_SEG_MAX: u64 = 1 << 2;
const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;

/// Request types.
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;

/// Status values.
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;

/// Why an image cannot back a disk.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image cannot be opened (missing, unreadable, not writable).
    #[error("--disk {path}: {source}")]
    Open {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The path is a directory or another non-file.
    #[error("--disk {0}: not a regular file")]
    NotAFile(PathBuf),
    /// Another process holds the image (writable, or at all for a writable disk).
    #[error("--disk {0}: the image is in use by another process (it holds its lock)")]
    Locked(PathBuf),
}

/// A disk on an image file.
pub struct Block {
    file: File,
    readonly: bool,
    capacity_sectors: u64,
    config: [u8; 24],
    id: [u8; ID_BYTES],
    buffer: Vec<u8>,
}

/// What a request asked for, once checked.
enum Request {
    Read { offset: u64 },
    Write { offset: u64 },
    Flush,
    GetId,
}

impl Block {
    /// Opens `path` as a disk, read-only if `readonly`, and locks it.
    pub fn open(path: &Path, readonly: bool) -> Result<Self, BlockError> {
        let open_err = |source| BlockError::Open {
            path: path.to_path_buf(),
            source,
        };
        // A directory or device node is refused by name, before an open that would fail (or
        // not) in its own way.
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            return Err(BlockError::NotAFile(path.to_path_buf()));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if !meta.is_file() {
            return Err(BlockError::NotAFile(path.to_path_buf()));
        }
        let lock = if readonly {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } != 0 {
            return Err(BlockError::Locked(path.to_path_buf()));
        }
        let capacity_sectors = meta.len() / SECTOR_SIZE;
        let mut config = [0u8; 24];
        config[0..8].copy_from_slice(&capacity_sectors.to_le_bytes());
        config[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        let mut id = [0u8; ID_BYTES];
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        let n = name.len().min(ID_BYTES);
        id[..n].copy_from_slice(&name.as_bytes()[..n]);
        Ok(Self {
            file,
            readonly,
            capacity_sectors,
            config,
            id,
            buffer: Vec::new(),
        })
    }

    /// The disk's size in sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }

    /// Checks a request's shape and reads its header: the request, or the status to answer.
    fn check(&self, all: &[Descriptor], mem: &GuestMemory) -> Result<Request, u8> {
        let [header, data @ .., _status] = all else {
            return Err(S_IOERR);
        };
        if header.is_write_only() || header.len() < HEADER_LEN {
            return Err(S_IOERR);
        }
        let mut raw = [0u8; HEADER_LEN as usize];
        mem.read_slice(&mut raw, header.addr())
            .map_err(|_| S_IOERR)?;
        let kind = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        let sector = u64::from_le_bytes(raw[8..16].try_into().map_err(|_| S_IOERR)?);
        let in_ram = |d: &Descriptor| {
            vm_memory::GuestMemoryBackend::check_range(mem, d.addr(), d.len() as usize)
        };
        if data.len() > SEG_MAX as usize || data.iter().any(|d| d.len() > SIZE_MAX || !in_ram(d)) {
            return Err(S_IOERR);
        }
        let total: u64 = data.iter().map(|d| u64::from(d.len())).sum();
        let in_disk = |writes_guest: bool| {
            let right_way = data.iter().all(|d| d.is_write_only() == writes_guest);
            let offset = sector.checked_mul(SECTOR_SIZE).ok_or(S_IOERR)?;
            let end = offset.checked_add(total).ok_or(S_IOERR)?;
            let whole = total.is_multiple_of(SECTOR_SIZE);
            if right_way && whole && end <= self.capacity_sectors * SECTOR_SIZE {
                Ok(offset)
            } else {
                Err(S_IOERR)
            }
        };
        match kind {
            T_IN => in_disk(true).map(|offset| Request::Read { offset }),
            T_OUT if self.readonly => Err(S_IOERR),
            T_OUT => in_disk(false).map(|offset| Request::Write { offset }),
            T_FLUSH => Ok(Request::Flush),
            T_GET_ID if data.len() == 1 && data[0].is_write_only() => Ok(Request::GetId),
            T_GET_ID => Err(S_IOERR),
            _ => Err(S_UNSUPP),
        }
    }

    /// Moves one segment between the image at `offset` and guest memory.
    fn segment(&mut self, d: &Descriptor, offset: u64, mem: &GuestMemory, read: bool) -> bool {
        self.buffer.resize(d.len() as usize, 0);
        if read {
            self.file.read_exact_at(&mut self.buffer, offset).is_ok()
                && mem.write_slice(&self.buffer, d.addr()).is_ok()
        } else {
            mem.read_slice(&mut self.buffer, d.addr()).is_ok()
                && self.file.write_all_at(&self.buffer, offset).is_ok()
        }
    }

    /// Serves a checked request; returns its status and the bytes written to the guest.
    fn serve(&mut self, request: Request, data: &[Descriptor], mem: &GuestMemory) -> (u8, u32) {
        match request {
            Request::Read { offset } | Request::Write { offset } => {
                let read = matches!(request, Request::Read { .. });
                let mut at = offset;
                for d in data {
                    if !self.segment(d, at, mem, read) {
                        return (S_IOERR, 0);
                    }
                    at += u64::from(d.len());
                }
                // At most SEG_MAX segments of SIZE_MAX bytes each (`check`): far below 4 GiB.
                let to_guest = if read {
                    u32::try_from(at - offset).unwrap_or(u32::MAX)
                } else {
                    0
                };
                (S_OK, to_guest)
            }
            Request::Flush => match self.file.sync_data() {
                Ok(()) => (S_OK, 0),
                Err(_) => (S_IOERR, 0),
            },
            Request::GetId => {
                let n = (data[0].len() as usize).min(ID_BYTES);
                match mem.write_slice(&self.id[..n], data[0].addr()) {
                    Ok(()) => (S_OK, u32::try_from(n).unwrap_or(u32::MAX)),
                    Err(_) => (S_IOERR, 0),
                }
            }
        }
    }

    /// Serves one request chain; returns the used length to report.
    fn request(&mut self, all: &[Descriptor], mem: &GuestMemory, events: &dyn GuestEvents) -> u32 {
        let Some(status) = all.last().filter(|d| d.is_write_only() && d.len() >= 1) else {
            events.virtio_error();
            return 0;
        };
        let (code, written) = match self.check(all, mem) {
            Ok(request) => self.serve(request, &all[1..all.len() - 1], mem),
            Err(code) => {
                events.virtio_error();
                (code, 0)
            }
        };
        let status_addr: GuestAddress = status.addr();
        if mem.write_slice(&[code], status_addr).is_err() {
            events.virtio_error();
            return written;
        }
        written + 1
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let ro = if self.readonly { F_RO } else { 0 };
        VIRTIO_F_VERSION_1 | F_SIZE_MAX | F_SEG_MAX | F_FLUSH | ro
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn config(&self) -> &[u8] {
        &self.config
    }

    fn process_queue(
        &mut self,
        _index: usize,
        queue: &mut Queue,
        mem: &GuestMemory,
        events: &dyn GuestEvents,
    ) -> Result<bool, QueueError> {
        serve_chains(queue, mem, events, |all| self.request(all, mem, events))
    }
}

#[cfg(test)]
mod tests;
