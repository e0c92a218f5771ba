//! The kernbench disk: a Debian 12 root file system with a C toolchain (gcc, make, libc6-dev)
//! and one pinned source tree, as an ext4 image the kernbench guests mount read-only
//! ([`crate::kernbench`]), and the L1 layer that carries it.
//!
//! The root file system comes from `mmdebstrap` (Debian's tool for a root tree from packages,
//! no installed system needed), the tree from Debian's source package of the same release
//! through a private `deb-src` list ([`PrivateApt::sources`]); `mke2fs -d` writes both into
//! the image. Every VM of a run shares the one image read-only; builds write into a tmpfs of
//! the guest's own memory, so no VM sees another's files and the image never changes.
//!
//! The tree is Lua 5.4.4: plain C99 with its own Makefile (no configure step to time), 34
//! C files of 60-2,000 lines that `make -jN` compiles in parallel, linked into a
//! static library and two programs, and it builds with nothing outside libc. It takes about
//! 9 s of one core of this machine's CPUs natively, so a few minutes in the nested rig, where
//! a kernel build would take hours. Its upstream tarball is pinned by SHA-256, so a new
//! Debian revision that ships the same tarball is accepted and a different one refused.
//!
//! The image is cached under `guests/out/guest/` and rebuilt only when its recipe (the
//! suite, packages, exclusions and the pinned tree) changes: the suite's point releases may
//! move the toolchain's versions, which a rebuild would pick up.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cpio::CpioArchive;
use crate::error::{io_err, ImageError};
use crate::host::{progress, run_tool};
use crate::inside;
use crate::private_apt::{PrivateApt, DEBIAN_MIRROR};
use crate::root_disk::write_ext4;

/// The Debian release of the toolchain and the source tree (the same as the guests' kernel).
const SUITE: &str = "bookworm";

/// What a C build needs besides mmdebstrap's `essential` variant (the Essential: yes
/// packages: a shell, coreutils, tar, ...).
const PACKAGES: &str = "gcc,make,libc6-dev";

/// Paths dpkg leaves out while unpacking (`--path-exclude`), with why: documentation no
/// build reads; gcc's link-time optimizer and its dump tool (the tree's Makefile does not use
/// `-flto`, so `lto1` never runs); the sanitizer runtimes (no `-fsanitize`). About 100 MiB
/// less to carry into L1 and to read in each guest.
const EXCLUDED: [&str; 7] = [
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/locale/*",
    "/usr/share/info/*",
    "/usr/lib/gcc/*/lto1",
    "/usr/bin/*lto-dump*",
    "/usr/lib/x86_64-linux-gnu/lib*san.so*",
];

/// The source package holding the tree.
const SOURCE_PACKAGE: &str = "lua5.4";

/// Its upstream tarball, as Debian names it.
const SOURCE_TARBALL: &str = "lua5.4_5.4.4.orig.tar.gz";

/// The tarball's SHA-256 (upstream's lua-5.4.4.tar.gz, which Debian ships unchanged).
const SOURCE_SHA256: &str = "164c7849653b80ae67bec4b7473b884bf5cc8d2dca05653475ec2ed27b9ebf61";

/// The folder the tarball unpacks into, and where the image holds it (under `/usr/src`).
pub const TREE: &str = "lua-5.4.4";

/// Free space the image keeps beyond its files, in MiB: room for ext4's journal and
/// metadata; nothing is written to it in use.
const IMAGE_HEADROOM_MIB: u64 = 48;

/// The image's UUID: fixed, as the root disk's.
const FIXED_UUID: &str = "5076d6d0-0000-4000-8000-000000000002";

/// The recipe the cached image was built from: rebuilt when it changes.
fn recipe() -> String {
    format!(
        "suite {SUITE}\nmirror {DEBIAN_MIRROR}\npackages {PACKAGES}\nexcluded {}\ntree {SOURCE_TARBALL} {SOURCE_SHA256}\nuuid {FIXED_UUID}\n",
        EXCLUDED.join(" ")
    )
}

/// mmdebstrap's command line for a root tree at `root`.
fn mmdebstrap(root: &Path) -> Command {
    let mut command = Command::new("mmdebstrap");
    command
        .args(["--quiet", "--variant=essential"])
        .arg(format!("--include={PACKAGES}"));
    for path in EXCLUDED {
        command.arg(format!("--dpkgopt=path-exclude={path}"));
    }
    command.arg(SUITE).arg(root).arg(DEBIAN_MIRROR);
    command
}

/// Fetches the pinned tarball into `dir` (through apt's source lists) and checks its digest.
fn fetch_tree(dir: &Path) -> Result<PathBuf, ImageError> {
    let apt = PrivateApt::sources(SUITE, dir.to_path_buf());
    let _lock = apt.prepare()?;
    let tarball = apt.debs().join(SOURCE_TARBALL);
    if !tarball.is_file() {
        apt.update()?;
        apt.download_source(SOURCE_PACKAGE)?;
    }
    if !tarball.is_file() {
        return Err(ImageError::Missing(tarball));
    }
    let listing = run_tool(Command::new("sha256sum").arg(&tarball), "coreutils")?;
    let digest = listing.split_whitespace().next().unwrap_or_default();
    if digest != SOURCE_SHA256 {
        return Err(ImageError::NotPinned {
            file: tarball,
            digest: digest.to_string(),
            pinned: SOURCE_SHA256,
        });
    }
    Ok(tarball)
}

/// Bytes under `dir` (files and symlinks, not following them), rounded up to 4 KiB blocks.
fn tree_bytes(dir: &Path) -> Result<u64, ImageError> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let meta = entry.metadata().map_err(io_err(&entry.path()))?;
        total += if meta.is_dir() {
            4096 + tree_bytes(&entry.path())?
        } else {
            meta.len().div_ceil(4096) * 4096
        };
    }
    Ok(total)
}

/// Writes the root tree `root` as an ext4 image at `image`, sized to fit.
fn make_image(root: &Path, image: &Path, mtime: u32) -> Result<(), ImageError> {
    let mib = tree_bytes(root)?.div_ceil(1 << 20) * 5 / 4 + IMAGE_HEADROOM_MIB;
    write_ext4(root, image, mib, "kernbench", FIXED_UUID, mtime)
}

/// Builds the kernbench image in `guest_dir` (when its recipe changed or it is missing) and
/// the L1 layer holding it at [`inside::KERNBENCH_DISK`] in `l1_dir`. Returns the layer.
pub fn build_layer(
    work_dir: &Path,
    guest_dir: &Path,
    l1_dir: &Path,
    mtime: u32,
) -> Result<PathBuf, ImageError> {
    let image = guest_dir.join("kernbench.ext4");
    let stamp = guest_dir.join("kernbench.recipe");
    let layer = l1_dir.join("kernbench.cpio");
    let current = std::fs::read_to_string(&stamp).is_ok_and(|r| r == recipe()) && image.is_file();
    if !current {
        let tarball = fetch_tree(&work_dir.join("source"))?;
        let root = work_dir.join("root");
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(io_err(&root))?;
        }
        progress(&format!(
            "building the kernbench root (Debian {SUITE}: {PACKAGES}) with mmdebstrap in {} (about a minute)",
            root.display()
        ));
        run_tool(&mut mmdebstrap(&root), "mmdebstrap")?;
        let src = root.join("usr/src");
        std::fs::create_dir_all(&src).map_err(io_err(&src))?;
        run_tool(
            Command::new("tar")
                .arg("-xzf")
                .arg(&tarball)
                .arg("-C")
                .arg(&src)
                .arg("--no-same-owner"),
            "tar",
        )?;
        progress(&format!("writing the kernbench disk {}", image.display()));
        let made = make_image(&root, &image, mtime);
        std::fs::remove_dir_all(&root).ok();
        made?;
        std::fs::write(&stamp, recipe()).map_err(io_err(&stamp))?;
    }
    if crate::cache::up_to_date(&layer, &[&image]) {
        progress(&format!(
            "L1 kernbench layer up to date: {}",
            layer.display()
        ));
        return Ok(layer);
    }
    progress(&format!("writing L1 kernbench layer {}", layer.display()));
    let mut archive = CpioArchive::new(mtime);
    archive.add_file_from(inside::KERNBENCH_DISK, &image, 0o644)?;
    archive.write_to(&layer)?;
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_names_everything_the_image_is_made_of() {
        let recipe = recipe();
        for part in [SUITE, PACKAGES, SOURCE_SHA256, "lto1", DEBIAN_MIRROR] {
            assert!(recipe.contains(part), "{part} missing from {recipe}");
        }
        let command = mmdebstrap(Path::new("/r"));
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(args[args.len() - 3..], [SUITE, "/r", DEBIAN_MIRROR]);
        assert_eq!(
            args.iter().filter(|a| a.starts_with("--dpkgopt=")).count(),
            EXCLUDED.len()
        );
        assert!(TREE.starts_with("lua-") && SOURCE_TARBALL.contains(&TREE[4..]));
    }

    #[test]
    fn tree_bytes_counts_blocks() {
        let dir = std::env::temp_dir().join(format!("pvmm-kb-tree-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a"), vec![0u8; 5000]).unwrap();
        std::fs::write(dir.join("sub/b"), b"x").unwrap();
        assert_eq!(tree_bytes(&dir).unwrap(), 8192 + 4096 + 4096);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
