//! The guest's root disk: an ext4 image of the guest's own userland, which a VM boots from with
//! `--disk` and `root=/dev/vda` ([`crate::rig::Rig::root_disk`]), and the L1 layer that carries
//! it with the e2fsprogs tools that read it back after the VM is gone.
//!
//! The image is made without privileges: the userland is written out as a directory tree and
//! `mke2fs -d` copies it into a fresh file system. Its UUID, hash seed and timestamps are fixed,
//! so the same inputs give the same image. The guest's init tells the two copies of the
//! userland apart by [`inside::GUEST_ROOT_DISK_MARK`], which only the disk holds: from the
//! initramfs it mounts the disk and switches to it, from the disk it runs the command.
//!
//! In L1, `e2fsck` replays the journal of an image whose VMM was killed (what a reboot's fsck
//! does) and `debugfs` reads files out of the image, both without mounting it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cache::up_to_date;
use crate::cpio::CpioArchive;
use crate::error::{io_err, ImageError};
use crate::host::{progress, run_tool, shared_libraries};
use crate::inside;

/// The image's size: the userland (busybox, pvmm-load, the virtio drivers) takes a few MiB,
/// which leaves room for the files the tests write and for ext4's journal.
pub const ROOT_DISK_MIB: u64 = 32;

/// The file system's UUID and directory hash seed: fixed, for reproducible images.
const FIXED_UUID: &str = "5076d6d0-0000-4000-8000-000000000001";

/// mke2fs on this machine (Debian's e2fsprogs; `/sbin` is on root's `PATH` only).
pub(crate) const MKE2FS: &str = "/sbin/mke2fs";

/// The e2fsprogs programs L1 gets, at the same paths as on this machine.
const L1_TOOLS: [&str; 2] = [inside::E2FSCK, inside::DEBUGFS];

/// Writes the tree `tree` as a fresh ext4 image of `mib` MiB at `image` (through a temporary
/// file next to it) with `mke2fs -d`: labelled `label`, root-owned, its UUID and directory
/// hash seed `uuid` and its timestamps `mtime`, so the same tree gives the same image.
pub(crate) fn write_ext4(
    tree: &Path,
    image: &Path,
    mib: u64,
    label: &str,
    uuid: &str,
    mtime: u32,
) -> Result<(), ImageError> {
    let tmp = image.with_extension("tmp");
    std::fs::remove_file(&tmp).ok();
    run_tool(
        Command::new(MKE2FS)
            .args(["-q", "-F", "-t", "ext4", "-L", label, "-U", uuid])
            .arg("-E")
            .arg(format!("root_owner=0:0,hash_seed={uuid}"))
            .arg("-d")
            .arg(tree)
            .arg(&tmp)
            .arg(format!("{mib}M"))
            .env("E2FSPROGS_FAKE_TIME", mtime.to_string()),
        "e2fsprogs",
    )?;
    std::fs::rename(&tmp, image).map_err(io_err(image))
}

/// Writes `userland` as an ext4 image at `image` (through a staging tree next to it).
fn make_image(userland: &CpioArchive, image: &Path, mtime: u32) -> Result<(), ImageError> {
    let staging = image.with_extension("tree");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io_err(&staging))?;
    }
    userland.extract_to(&staging)?;
    let made = write_ext4(
        &staging,
        image,
        ROOT_DISK_MIB,
        "pvmm-root",
        FIXED_UUID,
        mtime,
    );
    std::fs::remove_dir_all(&staging).ok();
    made
}

/// Builds the root disk from `userland` in `guest_dir` and the L1 layer that holds it with
/// e2fsck and debugfs (and their libraries) in `l1_dir`; both are written again only when one
/// of `inputs` (what `userland` was made from) is newer. Returns the layer.
pub fn build_layer(
    guest_dir: &Path,
    l1_dir: &Path,
    mut userland: CpioArchive,
    inputs: &[&Path],
    mtime: u32,
) -> Result<PathBuf, ImageError> {
    let image = guest_dir.join("root.ext4");
    let layer = l1_dir.join("root-disk.cpio");
    let mut all: Vec<&Path> = inputs.to_vec();
    all.extend(L1_TOOLS.iter().map(Path::new));
    if up_to_date(&image, &all) && up_to_date(&layer, &[&image]) {
        progress(&format!(
            "L1 root disk layer up to date: {}",
            layer.display()
        ));
        return Ok(layer);
    }
    progress(&format!(
        "writing the guest's root disk {} ({ROOT_DISK_MIB} MiB ext4) and L1 layer {}",
        image.display(),
        layer.display()
    ));
    userland.add_file_bytes(inside::GUEST_ROOT_DISK_MARK, b"", 0o644)?;
    make_image(&userland, &image, mtime)?;
    let mut archive = CpioArchive::new(mtime);
    archive.add_file_from(inside::GUEST_ROOT_DISK, &image, 0o644)?;
    for tool in L1_TOOLS {
        let binary = Path::new(tool);
        if !binary.is_file() {
            return Err(ImageError::ToolMissing {
                program: tool.into(),
                package: "e2fsprogs",
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        archive.add_file_from(tool, binary, 0o755)?;
        for library in shared_libraries(binary)? {
            let path = library.to_string_lossy().into_owned();
            archive.add_file_from(&path, &library, 0o755)?;
        }
    }
    archive.write_to(&layer)?;
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree with a file becomes an ext4 image that e2fsprogs reads the file back from, the
    /// same bytes for the same inputs.
    #[test]
    fn the_userland_becomes_a_readable_reproducible_image() {
        if Command::new(MKE2FS).arg("-V").output().is_err() {
            pvmm_testutil::require_or_skip(
                pvmm_testutil::Need::Rig,
                "the_userland_becomes_a_readable_reproducible_image",
                "no mke2fs (Debian package e2fsprogs)",
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("pvmm-root-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut userland = CpioArchive::new(0);
        userland
            .add_file_bytes("etc/hello", b"hello disk\n", 0o644)
            .unwrap();
        userland.add_symlink("bin/sh", "busybox").unwrap();
        let (a, b) = (dir.join("a.ext4"), dir.join("b.ext4"));
        make_image(&userland, &a, 0).unwrap();
        make_image(&userland, &b, 0).unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().len(), ROOT_DISK_MIB << 20);
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
        let out = Command::new(inside::DEBUGFS)
            .args(["-R", "cat /etc/hello"])
            .arg(&a)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello disk\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
