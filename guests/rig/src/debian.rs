//! Debian packages as files: the cloud kernel package's name, downloaded `.deb` files and
//! their unpacked contents.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cache::up_to_date;
use crate::error::{io_err, ImageError};
use crate::host::{progress, run_tool};
use crate::packages;
use crate::workspace::Workspace;

/// The Debian metapackage whose dependency names the current cloud kernel package.
pub const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// The kernel package `linux-image-cloud-amd64` depends on (or `PVMM_GUEST_KERNEL_PACKAGE`).
pub fn resolve_kernel_package() -> Result<String, ImageError> {
    if let Ok(pinned) = std::env::var("PVMM_GUEST_KERNEL_PACKAGE") {
        if !pinned.is_empty() {
            return Ok(pinned);
        }
    }
    let depends = || {
        run_tool(
            Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]),
            "apt",
        )
        .ok()
        .and_then(|listing| kernel_dependency(&listing))
    };
    if let Some(package) = depends() {
        return Ok(package);
    }
    // apt's package lists are empty (a fresh container) or lack the metapackage.
    if packages::running_as_root() {
        progress("apt's package lists do not name the kernel package: apt-get update");
        packages::update_lists()?;
        if let Some(package) = depends() {
            return Ok(package);
        }
    }
    Err(ImageError::NoKernelPackage(KERNEL_METAPACKAGE.to_string()))
}

/// The `linux-image-*` dependency in `apt-cache depends` output.
pub(crate) fn kernel_dependency(listing: &str) -> Option<String> {
    listing
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|dep| dep.starts_with("linux-image-"))
        .map(str::to_string)
}

/// The newest `.deb` of `package` in `dir`.
pub(crate) fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .collect();
    debs.sort();
    debs.pop()
}

/// The first entry of `dir` whose name starts with `prefix`.
pub(crate) fn find_one(dir: &Path, prefix: &str) -> Result<PathBuf, ImageError> {
    std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .ok_or_else(|| ImageError::Missing(dir.join(format!("{prefix}*"))))
}

/// Unpacks the kernel package `deb` into `guests/out/kernel/<package>` (once per download);
/// returns that folder.
pub(crate) fn unpack_kernel(
    ws: &Workspace,
    package: &str,
    deb: &Path,
) -> Result<PathBuf, ImageError> {
    let unpacked = ws.out.join("kernel").join(package);
    let stamp = unpacked.join(".unpacked");
    if !up_to_date(&stamp, &[deb]) {
        progress(&format!("unpacking {}", deb.display()));
        if unpacked.exists() {
            std::fs::remove_dir_all(&unpacked).map_err(io_err(&unpacked))?;
        }
        std::fs::create_dir_all(&unpacked).map_err(io_err(&unpacked))?;
        run_tool(
            Command::new("dpkg").arg("-x").arg(deb).arg(&unpacked),
            "dpkg",
        )?;
        std::fs::write(&stamp, b"").map_err(io_err(&stamp))?;
    }
    Ok(unpacked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_kernel_dependency() {
        let listing = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-28-cloud-amd64\n";
        assert_eq!(
            kernel_dependency(listing).as_deref(),
            Some("linux-image-6.1.0-28-cloud-amd64")
        );
        assert_eq!(kernel_dependency("linux-image-cloud-amd64\n"), None);
    }
}
