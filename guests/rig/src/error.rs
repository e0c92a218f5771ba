//! The crate's error types: building images ([`ImageError`]), making the Debian packages
//! available ([`PackageError`]) and running the rig ([`RigError`]).

use std::path::{Path, PathBuf};

use crate::cpio::CpioError;

/// Errors from building images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot locate the workspace root from {0}")]
    NoWorkspace(PathBuf),
    #[error("cannot run '{program}': {source} (is the Debian package {package} installed?)")]
    ToolMissing {
        program: String,
        package: &'static str,
        source: std::io::Error,
    },
    #[error("'{command}' failed with {status}: {stderr}")]
    ToolFailed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("'{0}' does not list a linux-image dependency (run 'sudo apt-get update' first)")]
    NoKernelPackage(String),
    #[error("apt {action} on Debian {suite} failed: {why}")]
    Apt {
        action: &'static str,
        suite: String,
        why: String,
    },
    #[error("{package} lacks {} (its {config})", .missing.join(", "))]
    KernelConfig {
        package: String,
        config: PathBuf,
        missing: Vec<&'static str>,
    },
    #[error("{0} is not a static executable (install the Debian package busybox-static)")]
    BusyboxNotStatic(String),
    #[error("{binary} is {version}; the rig's L1 needs QEMU {needed} or newer")]
    QemuTooOld {
        binary: PathBuf,
        version: String,
        needed: u32,
    },
    #[error("expected file missing: {0}")]
    Missing(PathBuf),
    #[error("{file} has SHA-256 {digest}, not the pinned {pinned}: its upstream version changed")]
    NotPinned {
        file: PathBuf,
        digest: String,
        pinned: &'static str,
    },
    #[error("cannot unpack the vmlinux of {kernel}: {source}")]
    Vmlinux {
        kernel: PathBuf,
        source: crate::vmlinux::VmlinuxError,
    },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cpio(#[from] CpioError),
    #[error(transparent)]
    Packages(#[from] PackageError),
}

/// Maps an I/O error on `path` to [`ImageError::Io`].
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Why the packages could not be made available; each reads as one line.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("missing Debian packages {}: run '{command}'", .packages.join(" "))]
    Missing {
        packages: Vec<&'static str>,
        command: String,
    },
    #[error(
        "missing Debian packages {} and no apt-get here: install what they provide ({})",
        .packages.join(" "),
        .provides.join("; ")
    )]
    NoApt {
        packages: Vec<&'static str>,
        provides: Vec<&'static str>,
    },
    #[error("cannot run apt-get: {0}")]
    AptSpawn(std::io::Error),
    #[error("'{command}' failed with {status}: {stderr}")]
    AptFailed {
        command: String,
        status: std::process::ExitStatus,
        /// The last lines of apt-get's stderr.
        stderr: String,
        /// Whether apt-get's stderr says that its package lists are missing or stale
        /// (`packages::lists_need_update`).
        lists_stale: bool,
    },
    #[error(
        "apt-get installed {}, yet what {} provide is still not found",
        .installed.join(" "),
        .missing.join(" ")
    )]
    StillMissing {
        installed: Vec<&'static str>,
        missing: Vec<&'static str>,
    },
}

/// Errors that keep a rig run from starting or finishing.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("invalid topology '{0}': expected SxCxT, e.g. 2x2x1, each 1-64")]
    BadTopology(String),
    #[error("{0}")]
    BadArgs(String),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Cpio(#[from] CpioError),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start qemu-system-x86_64: {0} (install the Debian package qemu-system-x86)")]
    Spawn(std::io::Error),
}
