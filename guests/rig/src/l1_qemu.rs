//! Which QEMU runs L1.
//!
//! The rig's L1 needs QEMU's TCG emulation of AMD SVM. The `qemu10` variant runs L1 on a newer
//! QEMU than Debian 12's 7.2, to compare the two (docs/rig.md, "Rig reliability": measured side by
//! side, it was no more reliable and no faster, so it is not the default). Debian 12 ships
//! QEMU 10.0 in `bookworm-backports`, built against its own libraries, so the rig fetches it
//! there when the host's QEMU is older: `apt-get download` with a private sources list and
//! lists folder under `guests/out/qemu-backports/` ([`crate::private_apt`]: the machine's apt
//! setup is not touched), then `dpkg -x`: nothing is installed. A host whose own QEMU is 10 or newer (Debian 13) uses
//! its own.
//!
//! Only L1 runs on the fetched QEMU. The inner QEMU of `--vmm qemu` stays the host's: its
//! libraries are what L1's image carries.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::debian::find_deb;
use crate::error::{io_err, ImageError};
use crate::host::{progress, run_tool, which, QEMU};
use crate::private_apt::PrivateApt;
use crate::workspace::Workspace;

/// The oldest QEMU major version [`L1Qemu::Newer`] accepts from the host.
pub const NEWER_MAJOR: u32 = 10;

/// The Debian suite the newer QEMU is fetched from.
pub const BACKPORTS_SUITE: &str = "bookworm-backports";

/// The packages that make a working `qemu-system-x86_64`: the binary, its shared
/// helpers, and its firmware and option ROMs (`linuxboot_dma.bin` loads L1's kernel).
const BACKPORTS_PACKAGES: [&str; 3] = ["qemu-system-x86", "qemu-system-common", "qemu-system-data"];

/// SeaBIOS, from the host's `seabios` package (a dependency of its QEMU): the backported
/// `qemu-system-data` does not carry the BIOS images, so they are looked up here after its own
/// folder.
const SEABIOS_DIR: &str = "/usr/share/seabios";

/// Which QEMU an L1 variant runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L1Qemu {
    /// The host's `qemu-system-x86_64`, whatever its version.
    System,
    /// QEMU [`NEWER_MAJOR`] or newer: the host's when it is, else fetched from
    /// [`BACKPORTS_SUITE`].
    Newer,
}

/// A QEMU ready to run L1.
#[derive(Debug, Clone)]
pub struct QemuBinary {
    /// The executable.
    pub binary: PathBuf,
    /// Its `--version` first line.
    pub version: String,
    /// Firmware folders passed with `-L`, in search order (empty: QEMU's own).
    data_dirs: Vec<PathBuf>,
    /// Where its loadable modules are (`QEMU_MODULE_DIR`), when not the host's.
    module_dir: Option<PathBuf>,
}

impl QemuBinary {
    /// A command running this QEMU with its firmware and module folders set.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        for dir in &self.data_dirs {
            command.arg("-L").arg(dir);
        }
        if let Some(dir) = &self.module_dir {
            command.env("QEMU_MODULE_DIR", dir);
        }
        command
    }
}

/// The major version in a `qemu-system-x86_64 --version` first line.
pub fn major_version(version_line: &str) -> Option<u32> {
    let rest = version_line.split("version ").nth(1)?;
    rest.split('.').next()?.trim().parse().ok()
}

fn version_of(binary: &Path) -> Result<String, ImageError> {
    let text = run_tool(Command::new(binary).arg("--version"), "qemu-system-x86")?;
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
}

/// The QEMU `choice` names, fetched first when it must be.
pub fn resolve(ws: &Workspace, choice: L1Qemu) -> Result<QemuBinary, ImageError> {
    let host = which(QEMU).ok_or_else(|| ImageError::ToolMissing {
        program: QEMU.into(),
        package: "qemu-system-x86",
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let host_version = version_of(&host)?;
    let host_is_newer = major_version(&host_version).is_some_and(|m| m >= NEWER_MAJOR);
    if choice == L1Qemu::System || host_is_newer {
        return Ok(QemuBinary {
            binary: host,
            version: host_version,
            data_dirs: Vec::new(),
            module_dir: None,
        });
    }
    let root = fetch_backports(ws)?;
    let binary = root.join("usr/bin").join(QEMU);
    let version = version_of(&binary)?;
    if major_version(&version).is_none_or(|m| m < NEWER_MAJOR) {
        return Err(ImageError::QemuTooOld {
            binary,
            version,
            needed: NEWER_MAJOR,
        });
    }
    Ok(QemuBinary {
        binary,
        version,
        data_dirs: vec![root.join("usr/share/qemu"), PathBuf::from(SEABIOS_DIR)],
        module_dir: Some(root.join("usr/lib/x86_64-linux-gnu/qemu")),
    })
}

/// Downloads and unpacks [`BACKPORTS_PACKAGES`] once; returns the folder they are unpacked in.
fn fetch_backports(ws: &Workspace) -> Result<PathBuf, ImageError> {
    let apt = PrivateApt::new(BACKPORTS_SUITE, ws.out.join("qemu-backports"));
    let root = ws.out.join("qemu-backports").join("root");
    let stamp = root.join(".unpacked");
    if stamp.is_file() {
        return Ok(root);
    }
    let _lock = apt.prepare()?;
    if stamp.is_file() {
        return Ok(root);
    }
    progress(&format!(
        "QEMU {NEWER_MAJOR} for L1: fetching {} from {BACKPORTS_SUITE} into {} (once; nothing is installed)",
        BACKPORTS_PACKAGES.join(", "),
        apt.debs().display()
    ));
    apt.update()?;
    apt.download(&BACKPORTS_PACKAGES.map(|p| format!("{p}/{BACKPORTS_SUITE}")))?;
    if root.exists() {
        std::fs::remove_dir_all(&root).map_err(io_err(&root))?;
    }
    let debs = apt.debs();
    for package in BACKPORTS_PACKAGES {
        let deb = find_deb(&debs, package)
            .ok_or_else(|| ImageError::Missing(debs.join(format!("{package}_*.deb"))))?;
        run_tool(Command::new("dpkg").arg("-x").arg(&deb).arg(&root), "dpkg")?;
    }
    std::fs::write(&stamp, b"").map_err(io_err(&stamp))?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_qemu_major_versions() {
        assert_eq!(
            major_version("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"),
            Some(7)
        );
        assert_eq!(
            major_version("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"),
            Some(10)
        );
        assert_eq!(major_version("something else"), None);
    }
}
