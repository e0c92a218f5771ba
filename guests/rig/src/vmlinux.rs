//! The uncompressed kernel inside a bzImage, for PVH boots (pvmm and QEMU both enter an ELF
//! vmlinux at its `XEN_ELFNOTE_PHYS32_ENTRY`, skipping the bzImage's own decompressor, which
//! under nested TCG takes a second or more).
//!
//! The boot protocol (Documentation/arch/x86/boot.rst, version 2.08 and later) says where the
//! compressed kernel is: `payload_offset` and `payload_length` in the setup header, counted
//! from the start of the protected-mode code (after the `setup_sects` + 1 sectors of real-mode
//! code). Debian's kernels compress it with LZ4 in the legacy frame format the kernel's own
//! decompressor reads (`lib/decompress_unlz4.c`): a magic number, then blocks of at most
//! 8 MiB each, each preceded by its compressed size (little-endian u32); a repeated magic
//! starts a new frame; what follows the last block is the kernel's appended uncompressed size.

/// Offset of `setup_sects` in a bzImage.
const SETUP_SECTS: usize = 0x1f1;
/// Offset of the header magic `HdrS`.
const HEADER_MAGIC_AT: usize = 0x202;
/// Offset of the boot protocol version.
const VERSION_AT: usize = 0x206;
/// Offsets of `payload_offset` and `payload_length`.
const PAYLOAD_OFFSET_AT: usize = 0x248;
const PAYLOAD_LENGTH_AT: usize = 0x24c;
/// The first protocol version with the payload fields.
const PAYLOAD_VERSION: u16 = 0x0208;
/// A sector.
const SECTOR: usize = 512;
/// `setup_sects` 0 means 4 (boot.rst).
const DEFAULT_SETUP_SECTS: usize = 4;
/// The LZ4 legacy frame magic (lib/decompress_unlz4.c: ARCHIVE_MAGICNUMBER).
const LZ4_LEGACY_MAGIC: u32 = 0x184c_2102;
/// The largest uncompressed block of a legacy frame (LZ4_DEFAULT_UNCOMPRESSED_CHUNK_SIZE).
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// The ELF magic the result must start with.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// Why a bzImage's vmlinux could not be taken out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VmlinuxError {
    #[error("not a bzImage (no HdrS setup header)")]
    NotBzImage,
    #[error("boot protocol {0:#06x} has no payload fields (2.08 and later have)")]
    OldProtocol(u16),
    #[error("the payload ({offset:#x} + {length:#x}) lies outside the {size}-byte image")]
    PayloadOutside {
        offset: usize,
        length: usize,
        size: usize,
    },
    #[error("the payload is compressed as {0}; the rig unpacks LZ4 (legacy frames) only")]
    Unsupported(&'static str),
    #[error("LZ4 block at payload offset {at:#x}: {why}")]
    Lz4 { at: usize, why: String },
    #[error("the unpacked payload is not an ELF file")]
    NotElf,
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

/// The compressed payload of `bzimage`.
fn payload(bzimage: &[u8]) -> Result<&[u8], VmlinuxError> {
    if bzimage.get(HEADER_MAGIC_AT..HEADER_MAGIC_AT + 4) != Some(b"HdrS") {
        return Err(VmlinuxError::NotBzImage);
    }
    let version = u16_at(bzimage, VERSION_AT).ok_or(VmlinuxError::NotBzImage)?;
    if version < PAYLOAD_VERSION {
        return Err(VmlinuxError::OldProtocol(version));
    }
    let setup_sects = match bzimage[SETUP_SECTS] as usize {
        0 => DEFAULT_SETUP_SECTS,
        n => n,
    };
    let field = |at| u32_at(bzimage, at).map(|v| v as usize);
    let (Some(offset), Some(length)) = (field(PAYLOAD_OFFSET_AT), field(PAYLOAD_LENGTH_AT)) else {
        return Err(VmlinuxError::NotBzImage);
    };
    let offset = (setup_sects + 1) * SECTOR + offset;
    offset
        .checked_add(length)
        .and_then(|end| bzimage.get(offset..end))
        .ok_or(VmlinuxError::PayloadOutside {
            offset,
            length,
            size: bzimage.len(),
        })
}

/// The name of a compression format the kernel supports, by its magic, for the error.
fn format_name(data: &[u8]) -> &'static str {
    match data {
        [0x1f, 0x8b, ..] => "gzip",
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => "xz",
        [0x28, 0xb5, 0x2f, 0xfd, ..] => "zstd",
        [b'B', b'Z', b'h', ..] => "bzip2",
        [0x5d, 0, 0, ..] => "lzma",
        [0x89, b'L', b'Z', b'O', ..] => "lzo",
        _ => "an unknown format",
    }
}

/// Unpacks an LZ4 legacy stream (see the module documentation).
fn unlz4_legacy(data: &[u8]) -> Result<Vec<u8>, VmlinuxError> {
    let mut out = Vec::new();
    let mut at = 4;
    while let Some(size) = u32_at(data, at) {
        at += 4;
        if size == LZ4_LEGACY_MAGIC {
            continue;
        }
        let Some(block) = data.get(at..at + size as usize) else {
            // The 4 bytes left after the last block are the kernel's uncompressed size.
            break;
        };
        let start = out.len();
        out.resize(start + LZ4_LEGACY_BLOCK, 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..]).map_err(|e| {
            VmlinuxError::Lz4 {
                at,
                why: e.to_string(),
            }
        })?;
        out.truncate(start + n);
        at += size as usize;
    }
    Ok(out)
}

/// The ELF vmlinux inside `bzimage`.
pub fn extract(bzimage: &[u8]) -> Result<Vec<u8>, VmlinuxError> {
    let data = payload(bzimage)?;
    if u32_at(data, 0) != Some(LZ4_LEGACY_MAGIC) {
        return Err(VmlinuxError::Unsupported(format_name(data)));
    }
    let vmlinux = unlz4_legacy(data)?;
    if !vmlinux.starts_with(ELF_MAGIC) {
        return Err(VmlinuxError::NotElf);
    }
    Ok(vmlinux)
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    /// A bzImage header around `payload`: protocol `version`, one setup sector.
    fn bzimage(version: u16, payload: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 2 * SECTOR];
        image[SETUP_SECTS] = 1;
        image[HEADER_MAGIC_AT..HEADER_MAGIC_AT + 4].copy_from_slice(b"HdrS");
        image[VERSION_AT..VERSION_AT + 2].copy_from_slice(&version.to_le_bytes());
        image[PAYLOAD_OFFSET_AT..PAYLOAD_OFFSET_AT + 4].copy_from_slice(&16u32.to_le_bytes());
        image[PAYLOAD_LENGTH_AT..PAYLOAD_LENGTH_AT + 4]
            .copy_from_slice(&(payload.len() as u32).to_le_bytes());
        image.extend([0u8; 16]);
        image.extend(payload);
        image
    }

    /// An LZ4 legacy stream of `blocks`, with the kernel's trailing size.
    fn lz4_legacy(blocks: &[&[u8]]) -> Vec<u8> {
        let mut stream = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        let mut total = 0u32;
        for (i, block) in blocks.iter().enumerate() {
            if i == 1 {
                // A second frame's magic is skipped.
                stream.extend(LZ4_LEGACY_MAGIC.to_le_bytes());
            }
            let packed = lz4_flex::block::compress(block);
            stream.extend((packed.len() as u32).to_le_bytes());
            stream.extend(packed);
            total += block.len() as u32;
        }
        stream.extend(total.to_le_bytes());
        stream
    }

    #[test]
    fn blocks_and_frames_unpack_in_order() {
        let first: Vec<u8> = ELF_MAGIC
            .iter()
            .copied()
            .chain((0..5000u32).map(|i| (i % 251) as u8))
            .collect();
        let second = vec![7u8; 3000];
        let image = bzimage(0x020f, &lz4_legacy(&[&first, &second]));
        let vmlinux = extract(&image).unwrap();
        assert_eq!(vmlinux.len(), first.len() + second.len());
        assert_eq!(&vmlinux[..first.len()], &first[..]);
        assert_eq!(&vmlinux[first.len()..], &second[..]);
    }

    #[test]
    fn bad_images_are_refused_with_their_reason() {
        assert_eq!(extract(&[0u8; 100]), Err(VmlinuxError::NotBzImage));
        assert_eq!(
            extract(&bzimage(0x0206, b"x")),
            Err(VmlinuxError::OldProtocol(0x0206))
        );
        let mut truncated = bzimage(0x020f, &lz4_legacy(&[b"\x7fELF...."]));
        truncated.truncate(truncated.len() - 10);
        assert!(matches!(
            extract(&truncated),
            Err(VmlinuxError::PayloadOutside { .. })
        ));
        assert_eq!(
            extract(&bzimage(0x020f, &[0xfd, b'7', b'z', b'X', b'Z', 0, 1, 2])),
            Err(VmlinuxError::Unsupported("xz"))
        );
        assert_eq!(
            extract(&bzimage(0x020f, &lz4_legacy(&[b"not an elf"]))),
            Err(VmlinuxError::NotElf)
        );
        // A match before any output: no LZ4 decoder can resolve it.
        let mut corrupt = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        corrupt.extend(3u32.to_le_bytes());
        corrupt.extend([0x00, 0x01, 0x00]);
        assert!(matches!(
            extract(&bzimage(0x020f, &corrupt)),
            Err(VmlinuxError::Lz4 { .. })
        ));
    }
}
