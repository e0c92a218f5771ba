//! The Debian packages the rig and the tests need, and getting them installed.
//!
//! Every entry point of the rig (`cargo xtask rig`, the benchmarks, the rig tests) builds its
//! images through the image builder's `build_guest`, which first calls [`ensure`]. It looks for
//! the files each package provides; when some are missing it either installs the packages
//! (running as root: `apt-get install -y --no-install-recommends ...`, after `apt-get update`
//! when apt's package lists are missing or stale) or fails with one line that names the one
//! command to run. `.ci/run` installs the same [`PACKAGES`] explicitly; a unit test keeps the
//! two in step.
//!
//! Packages only the tests need (`iasl` for the ACPI table tests) are installed along with the
//! rig's when running as root, so that the README's test command skips nothing after the first
//! rig run; otherwise their absence is one note line, not an error (those tests skip loudly).

use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};

pub use crate::error::PackageError;
use crate::host::{is_static_elf, progress, which, BUSYBOX, QEMU};

/// What a package is needed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The rig cannot build its images or boot L1 without it.
    Rig,
    /// Some tests skip without it.
    Tests,
}

/// A Debian package and how to tell that what the project uses from it is there.
#[derive(Debug, Clone, Copy)]
pub struct Package {
    /// The Debian package name.
    pub name: &'static str,
    /// What the project uses from it.
    pub provides: &'static str,
    /// What it is needed for.
    pub need: Need,
    /// Whether what it provides is there.
    pub present: fn() -> bool,
}

/// The packages, in the order `.ci/run` installs them. apt, dpkg and libc-bin (`ldd`), which
/// the image build also runs, are part of every Debian system.
pub const PACKAGES: [Package; 5] = [
    Package {
        name: "qemu-system-x86",
        provides: "qemu-system-x86_64: L1, and the inner QEMU of `--vmm qemu`",
        need: Need::Rig,
        present: || which(QEMU).is_some(),
    },
    Package {
        name: "busybox-static",
        provides: "a static /bin/busybox: the guest's and L1's userland",
        need: Need::Rig,
        present: || is_static_elf(Path::new(BUSYBOX)).unwrap_or(false),
    },
    Package {
        name: "e2fsprogs",
        provides: "mke2fs, e2fsck, debugfs: the guests' root disk (`--root-disk`) and reading it back in L1",
        need: Need::Rig,
        present: || Path::new("/sbin/mke2fs").is_file() && Path::new("/sbin/debugfs").is_file(),
    },
    Package {
        name: "mmdebstrap",
        provides: "mmdebstrap: the kernbench disk's Debian root with a C toolchain (`bench-kernbench`)",
        need: Need::Rig,
        present: || which("mmdebstrap").is_some(),
    },
    Package {
        name: "acpica-tools",
        provides: "iasl: the ACPI table tests disassemble pvmm's tables with it",
        need: Need::Tests,
        present: || which("iasl").is_some(),
    },
];

/// The apt-get options of every install, here and in the printed command.
const INSTALL_OPTIONS: [&str; 3] = ["install", "-y", "--no-install-recommends"];

/// What to do about the missing packages.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is missing.
    Ready,
    /// Only packages the tests need are missing and this process cannot install them: say so
    /// on one line and go on.
    Note(String),
    /// Install these now (running as root).
    Install(Vec<&'static str>),
    /// Not root: the rig cannot run until the user runs `command`.
    Ask {
        packages: Vec<&'static str>,
        command: String,
    },
    /// No apt-get: the rig cannot run until the user installs what the packages provide.
    NoApt {
        packages: Vec<&'static str>,
        provides: Vec<&'static str>,
    },
}

/// The command a user who is not root runs to install `packages` (the package lists first:
/// on a fresh machine or container they are empty).
pub fn install_command(packages: &[&str]) -> String {
    format!(
        "sudo apt-get update && sudo apt-get {} {}",
        INSTALL_OPTIONS.join(" "),
        packages.join(" ")
    )
}

/// Decides what to do about the `missing` packages: `root` says whether this process may
/// install them, `apt` whether apt-get is there.
pub fn plan(missing: &[Package], root: bool, apt: bool) -> Plan {
    if missing.is_empty() {
        return Plan::Ready;
    }
    let names: Vec<&'static str> = missing.iter().map(|p| p.name).collect();
    let rig_needs_one = missing.iter().any(|p| p.need == Need::Rig);
    match (apt, root, rig_needs_one) {
        (true, true, _) => Plan::Install(names),
        (true, false, true) => Plan::Ask {
            command: install_command(&names),
            packages: names,
        },
        (true, false, false) => Plan::Note(format!(
            "Debian packages {} are missing (tests that need them skip): '{}' installs them",
            names.join(" "),
            install_command(&names)
        )),
        (false, _, true) => Plan::NoApt {
            packages: names,
            provides: missing.iter().map(|p| p.provides).collect(),
        },
        (false, _, false) => Plan::Note(format!(
            "missing {} (tests that need them skip)",
            missing
                .iter()
                .map(|p| p.provides)
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
}

/// The effective user id in a `/proc/<pid>/status` text (its `Uid:` line: real, effective,
/// saved, filesystem).
pub fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse().ok())
}

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_uid(&status))
        == Some(0)
}

/// Whether a failed `apt-get install`'s stderr says that apt's package lists are missing (a
/// fresh container) or stale (the mirror no longer has the versions they name), which
/// `apt-get update` cures.
pub fn lists_need_update(stderr: &str) -> bool {
    [
        "Unable to locate package",
        "has no installation candidate",
        "Failed to fetch",
    ]
    .iter()
    .any(|sign| stderr.contains(sign))
}

/// The packages of [`PACKAGES`] whose files are missing.
pub fn missing() -> Vec<Package> {
    PACKAGES.into_iter().filter(|p| !(p.present)()).collect()
}

/// Makes the rig's packages available (see the module documentation); Ok when the rig can run.
pub fn ensure() -> Result<(), PackageError> {
    let missing = missing();
    match plan(&missing, running_as_root(), which("apt-get").is_some()) {
        Plan::Ready => Ok(()),
        Plan::Note(note) => {
            progress(&note);
            Ok(())
        }
        Plan::Ask { packages, command } => Err(PackageError::Missing { packages, command }),
        Plan::NoApt { packages, provides } => Err(PackageError::NoApt { packages, provides }),
        Plan::Install(names) => {
            install(&names)?;
            let still: Vec<&'static str> = self::missing().iter().map(|p| p.name).collect();
            if still.is_empty() {
                Ok(())
            } else {
                Err(PackageError::StillMissing {
                    installed: names,
                    missing: still,
                })
            }
        }
    }
}

/// Runs `apt-get ARGS` (noninteractive; its output on our stderr, so that stdout keeps only
/// results); Err with the last lines of its stderr when it fails.
fn apt_get(args: &[&str]) -> Result<(), PackageError> {
    let command = format!("apt-get {}", args.join(" "));
    let stdout = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(PackageError::AptSpawn)?;
    let mut child = Command::new("apt-get")
        .arg("-q")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::piped())
        .spawn()
        .map_err(PackageError::AptSpawn)?;
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child.wait().map_err(PackageError::AptSpawn)?;
    if status.success() {
        return Ok(());
    }
    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
    Err(PackageError::AptFailed {
        command,
        status,
        stderr: tail.into_iter().rev().collect::<Vec<_>>().join(" / "),
        lists_stale: lists_need_update(&stderr),
    })
}

/// Updates apt's package lists (as root).
pub fn update_lists() -> Result<(), PackageError> {
    apt_get(&["update"])
}

/// Installs `packages` as root, updating apt's package lists first when they are missing or
/// stale.
fn install(packages: &[&'static str]) -> Result<(), PackageError> {
    let mut args = INSTALL_OPTIONS.to_vec();
    args.extend_from_slice(packages);
    progress(&format!(
        "installing Debian packages {} (apt-get {}); a minute or two",
        packages.join(" "),
        args.join(" ")
    ));
    match apt_get(&args) {
        Err(PackageError::AptFailed {
            lists_stale: true, ..
        }) => {
            progress("apt's package lists are missing or stale: apt-get update, then again");
            update_lists()?;
            apt_get(&args)
        }
        result => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(names: &[&str]) -> Vec<Package> {
        PACKAGES
            .into_iter()
            .filter(|p| names.contains(&p.name))
            .collect()
    }

    #[test]
    fn nothing_missing_is_ready() {
        assert_eq!(plan(&[], false, true), Plan::Ready);
        assert_eq!(plan(&[], true, false), Plan::Ready);
    }

    #[test]
    fn root_installs_everything_missing() {
        let missing = named(&["qemu-system-x86", "acpica-tools"]);
        assert_eq!(
            plan(&missing, true, true),
            Plan::Install(vec!["qemu-system-x86", "acpica-tools"])
        );
        // The tests' packages too, when the rig's are all there.
        assert_eq!(
            plan(&named(&["acpica-tools"]), true, true),
            Plan::Install(vec!["acpica-tools"])
        );
    }

    #[test]
    fn others_get_the_one_command_with_sudo() {
        let missing = named(&["busybox-static", "acpica-tools"]);
        let command =
            "sudo apt-get update && sudo apt-get install -y --no-install-recommends busybox-static acpica-tools";
        let packages = vec!["busybox-static", "acpica-tools"];
        assert_eq!(
            plan(&missing, false, true),
            Plan::Ask {
                packages: packages.clone(),
                command: command.to_string()
            }
        );
        let error = PackageError::Missing {
            packages,
            command: command.to_string(),
        }
        .to_string();
        assert_eq!(
            error,
            format!("missing Debian packages busybox-static acpica-tools: run '{command}'")
        );
        assert!(!error.contains('\n'));
    }

    #[test]
    fn a_test_only_package_is_a_note_for_others() {
        let Plan::Note(note) = plan(&named(&["acpica-tools"]), false, true) else {
            panic!("expected a note");
        };
        assert!(note.contains(
            "sudo apt-get update && sudo apt-get install -y --no-install-recommends acpica-tools"
        ));
    }

    #[test]
    fn without_apt_the_files_are_named() {
        let Plan::NoApt { packages, provides } = plan(&named(&["qemu-system-x86"]), true, false)
        else {
            panic!("expected a failure");
        };
        let error = PackageError::NoApt { packages, provides }.to_string();
        assert!(error.contains("no apt-get") && error.contains("qemu-system-x86_64"));
        assert!(matches!(
            plan(&named(&["acpica-tools"]), true, false),
            Plan::Note(_)
        ));
    }

    #[test]
    fn reads_the_effective_uid() {
        let status = "Name:\tcargo\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Uid:\t1000\t1000\t1000\t1000\n"), Some(1000));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn missing_or_stale_lists_are_recognised() {
        assert!(lists_need_update(
            "E: Unable to locate package busybox-static"
        ));
        assert!(lists_need_update(
            "E: Package 'qemu-system-x86' has no installation candidate"
        ));
        assert!(lists_need_update(
            "E: Failed to fetch http://deb.debian.org/debian/pool/main/q/qemu/x.deb  404  Not Found"
        ));
        assert!(!lists_need_update(
            "E: Could not get lock /var/lib/dpkg/lock-frontend"
        ));
    }

    /// `.ci/run` installs exactly these packages, in this order.
    #[test]
    fn ci_installs_the_same_packages() {
        let run = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/run");
        let script = std::fs::read_to_string(run).unwrap();
        let line = script
            .lines()
            .find(|l| l.contains("apt-get install"))
            .expect("an apt-get install line");
        let listed: Vec<&str> = line
            .split_whitespace()
            .skip_while(|w| *w != "--no-install-recommends")
            .skip(1)
            .collect();
        let ours: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
        assert_eq!(listed, ours);
    }
}
