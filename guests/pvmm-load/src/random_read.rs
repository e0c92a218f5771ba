//! `--random-reads PATH`: 4 KiB reads at random block-aligned offsets of a file or block
//! device, one at a time and with O_DIRECT, for the run time. Past the page cache every read
//! reaches the disk, so the count over the run time is the disk's random-read rate at queue
//! depth 1 (IOPS), the figure `cargo xtask bench-io` compares between VMMs.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// The size and alignment of each read: a page, the block size of every disk we run on.
pub const BLOCK: usize = 4096;

/// `O_DIRECT` on x86-64 Linux, where the rig's guests run (std has no constant for it).
const O_DIRECT: i32 = 0o40000;

/// The xorshift seed of the offsets: fixed, so every VMM reads the same blocks in the same
/// order.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Opens `path` for direct reads; returns it with its size in whole blocks.
fn open(path: &Path) -> std::io::Result<(File, u64)> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(O_DIRECT)
        .open(path)?;
    let blocks = file.seek(SeekFrom::End(0))? / BLOCK as u64;
    if blocks == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is smaller than one {BLOCK}-byte block", path.display()),
        ));
    }
    Ok((file, blocks))
}

/// Reads random blocks of `path` for `run_time`; returns how many.
pub fn run(path: &Path, run_time: Duration) -> std::io::Result<u64> {
    let (file, blocks) = open(path)?;
    // O_DIRECT needs a buffer aligned like the disk's blocks: a buffer of two blocks holds one
    // whole aligned block from its first aligned byte.
    let mut buffer = vec![0u8; 2 * BLOCK];
    let start = buffer.as_ptr().align_offset(BLOCK);
    let block = &mut buffer[start..start + BLOCK];
    let end = Instant::now() + run_time;
    let (mut state, mut reads) = (SEED, 0);
    while Instant::now() < end {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        file.read_exact_at(block, (state % blocks) * BLOCK as u64)?;
        reads += 1;
    }
    Ok(reads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file on the build directory's file system (tmpfs has no O_DIRECT).
    fn scratch(name: &str, bytes: usize) -> std::path::PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target")
            .join(format!("pvmm-load-{name}-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; bytes]).unwrap();
        path
    }

    #[test]
    fn reads_random_blocks_of_a_file() {
        let path = scratch("blocks", 64 * BLOCK);
        let reads = run(&path, Duration::from_millis(50)).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(reads > 0);
    }

    #[test]
    fn refuses_a_file_without_a_whole_block() {
        let path = scratch("short", BLOCK - 1);
        let error = run(&path, Duration::from_millis(10)).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
        assert!(run(Path::new("/nonexistent/disk"), Duration::from_millis(1)).is_err());
    }
}
