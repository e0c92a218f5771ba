//! A driver's side of a split virtqueue in test guest memory: descriptor table, available and
//! used rings at fixed addresses, and chains written as a driver (or a hostile one) would.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::GuestMemory;

/// Guest RAM of the tests: 1 MiB at 0.
pub const RAM_LEN: usize = 1 << 20;
/// Where the descriptor table is.
pub const DESC: u64 = 0x1000;
/// Where the available ring is.
pub const AVAIL: u64 = 0x3000;
/// Where the used ring is.
pub const USED: u64 = 0x4000;
/// Where tests put request data.
pub const DATA: u64 = 0x10000;

/// Descriptor flags.
pub const NEXT: u16 = 1;
/// The device writes this descriptor's buffer.
pub const WRITE: u16 = 2;

/// A queue of `size` in fresh guest memory.
pub struct TestRing {
    /// The guest's memory.
    pub mem: GuestMemory,
    /// The queue's size.
    pub size: u16,
    next_desc: u16,
    avail_idx: u16,
}

impl TestRing {
    /// An empty ring of `size` descriptors.
    pub fn new(size: u16) -> Self {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), RAM_LEN)]).unwrap();
        Self {
            mem,
            size,
            next_desc: 0,
            avail_idx: 0,
        }
    }

    /// The device's queue, set up and ready as the transport would leave it.
    pub fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        q.set_size(self.size);
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        q.set_ready(true);
        assert!(q.is_valid(&self.mem));
        q
    }

    /// Writes descriptor `index` as given.
    pub fn raw(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(DESC + 16 * u64::from(index));
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&d, at).unwrap();
    }

    /// Makes the chain headed by `head` available.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        let entry = GuestAddress(AVAIL + 4 + 2 * slot);
        self.mem.write_obj(head.to_le(), entry).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx.to_le(), GuestAddress(AVAIL + 2))
            .unwrap();
    }

    /// Writes a well-formed chain of `(addr, len, device-writes)` buffers and makes it
    /// available; returns its head.
    pub fn chain(&mut self, buffers: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, write)) in buffers.iter().enumerate() {
            let index = self.next_desc;
            let next = (index + 1) % self.size;
            let mut flags = if write { WRITE } else { 0 };
            if i + 1 < buffers.len() {
                flags |= NEXT;
            }
            self.raw(index, addr, len, flags, next);
            self.next_desc = next;
        }
        self.publish(head);
        head
    }

    /// How many buffers the device has used.
    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    /// Used entry `i`: the head it returns and the length written.
    pub fn used(&self, i: u16) -> (u32, u32) {
        let at = USED + 4 + 8 * u64::from(i % self.size);
        let id = self.mem.read_obj(GuestAddress(at)).unwrap();
        let len = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
        (id, len)
    }
}

/// Proptest settings of the device fuzzers: `cases` and a fixed `seed` in CI, unless
/// `PROPTEST_CASES` or `PROPTEST_RNG_SEED` ask for a longer or another run.
pub fn fuzz_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    }
    config.failure_persistence = None;
    config
}

/// A scratch image of `len` bytes, each byte its offset's low byte, removed on drop.
pub struct Image {
    /// Its path.
    pub path: std::path::PathBuf,
}

impl Image {
    /// A new image named for `name` and this thread.
    pub fn new(name: &str, len: usize) -> Self {
        let path = std::env::temp_dir().join(format!(
            "pvmm-virtio-{name}-{}-{:?}.img",
            std::process::id(),
            std::thread::current().id()
        ));
        let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        Self { path }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
