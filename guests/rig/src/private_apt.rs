//! apt-get and apt-cache on a Debian suite the machine's own apt setup does not name.
//!
//! The rig fetches packages from suites other than the host's (QEMU 10 from
//! `bookworm-backports` for L1, the 6.12 guest kernel from `trixie`) without touching
//! `/etc/apt` or `/var/lib/apt`: every command runs with its own sources list, an empty
//! sources-parts folder, its own package lists and its own cache under one folder of
//! `guests/out/` (`man apt.conf`: `Dir::Etc::sourcelist`, `Dir::Etc::sourceparts`,
//! `Dir::State::Lists`, `Dir::Cache`). Packages are only downloaded (`apt-get download`) and
//! unpacked by the caller (`dpkg -x`); nothing is installed.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use crate::error::{io_err, ImageError};

/// The Debian mirror every suite is fetched from (the host's own apt setup names the same).
pub const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// The one-line sources list of `suite`'s `main` component on [`DEBIAN_MIRROR`]: its binary
/// packages, or with `source` its source packages.
pub fn sources_list(suite: &str, source: bool) -> String {
    let kind = if source { "deb-src" } else { "deb" };
    format!("{kind} {DEBIAN_MIRROR} {suite} main\n")
}

/// apt on one suite, with its state in one folder.
#[derive(Debug, Clone)]
pub struct PrivateApt {
    /// The suite, for messages.
    suite: String,
    /// The folder holding the sources list, lists, cache and downloaded packages.
    base: PathBuf,
    /// Whether the lists are the suite's source packages (`deb-src`) rather than its binary
    /// ones.
    source: bool,
}

impl PrivateApt {
    /// apt on `suite`, its state under `base`.
    pub fn new(suite: &str, base: PathBuf) -> PrivateApt {
        PrivateApt {
            suite: suite.to_string(),
            base,
            source: false,
        }
    }

    /// apt on `suite`'s source packages, its state under `base`.
    pub fn sources(suite: &str, base: PathBuf) -> PrivateApt {
        PrivateApt {
            source: true,
            ..PrivateApt::new(suite, base)
        }
    }

    /// The folder `apt-get download` writes the packages into.
    pub fn debs(&self) -> PathBuf {
        self.base.join("debs")
    }

    fn sources_path(&self) -> PathBuf {
        self.base.join("sources.list")
    }

    fn lists(&self) -> PathBuf {
        self.base.join("lists")
    }

    fn parts(&self) -> PathBuf {
        self.base.join("sources.list.d")
    }

    fn cache(&self) -> PathBuf {
        self.base.join("cache")
    }

    /// Creates the folders and the sources list, then takes a lock file that keeps two rigs
    /// starting at once from fetching over each other: hold the returned file while using
    /// this apt.
    pub fn prepare(&self) -> Result<File, ImageError> {
        for dir in [
            self.lists().join("partial"),
            self.debs(),
            self.parts(),
            self.cache(),
        ] {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        let lock_path = self.base.join(".lock");
        let lock = File::create(&lock_path).map_err(io_err(&lock_path))?;
        lock.lock().map_err(io_err(&lock_path))?;
        let sources = self.sources_path();
        std::fs::write(&sources, sources_list(&self.suite, self.source))
            .map_err(io_err(&sources))?;
        Ok(lock)
    }

    /// The `-o` options every command of this apt runs with.
    fn options(&self) -> Vec<String> {
        vec![
            format!("Dir::Etc::sourcelist={}", self.sources_path().display()),
            format!("Dir::Etc::sourceparts={}", self.parts().display()),
            format!("Dir::State::Lists={}", self.lists().display()),
            format!("Dir::Cache={}", self.cache().display()),
            // The machine's own apt may be running; these folders are ours alone (see
            // `prepare`'s lock).
            "Debug::NoLocking=1".to_string(),
            // The files land in folders the unprivileged _apt user may not write.
            "APT::Sandbox::User=root".to_string(),
        ]
    }

    /// `program` (apt-get, apt-cache) with this apt's options, run in [`Self::debs`].
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in self.options() {
            command.arg("-o").arg(option);
        }
        command.arg("-q").current_dir(self.debs());
        command
    }

    /// Runs `command` for `action`; its stdout, or one line saying what went wrong.
    fn run(&self, action: &'static str, command: &mut Command) -> Result<String, ImageError> {
        let output = command.output().map_err(|source| ImageError::ToolMissing {
            program: command.get_program().to_string_lossy().into_owned(),
            package: "apt",
            source,
        })?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        // `apt-get update` exits 0 when it could not fetch the lists (it keeps the old ones):
        // its "Failed to fetch" warning is the failure.
        match apt_problem(&stderr) {
            None if output.status.success() => {
                Ok(String::from_utf8_lossy(&output.stdout).into_owned())
            }
            problem => Err(ImageError::Apt {
                action,
                suite: self.suite.clone(),
                why: problem.unwrap_or_else(|| format!("{}", output.status)),
            }),
        }
    }

    /// Fetches the suite's package lists.
    pub fn update(&self) -> Result<(), ImageError> {
        self.run("update", self.command("apt-get").arg("update"))
            .map(drop)
    }

    /// The `linux-image-*` package `metapackage` depends on in the lists fetched so far, if
    /// they name it.
    pub fn kernel_dependency(&self, metapackage: &str) -> Option<String> {
        let listing = self
            .run(
                "depends",
                self.command("apt-cache").args(["depends", metapackage]),
            )
            .ok()?;
        crate::debian::kernel_dependency(&listing)
    }

    /// Downloads `packages` (`name` or `name/suite`) into [`Self::debs`].
    pub fn download<S: AsRef<std::ffi::OsStr>>(&self, packages: &[S]) -> Result<(), ImageError> {
        self.run(
            "download",
            self.command("apt-get").arg("download").args(packages),
        )
        .map(drop)
    }

    /// Downloads the source package `package` (`name` or `name=version`: its `.dsc`, upstream
    /// tarball and Debian changes) into [`Self::debs`], unpacking nothing. apt checks each
    /// file against the signed lists.
    pub fn download_source(&self, package: &str) -> Result<(), ImageError> {
        self.run(
            "source",
            self.command("apt-get")
                .args(["source", "--download-only"])
                .arg(package),
        )
        .map(drop)
    }
}

/// What went wrong, on one line, in apt's stderr: its first error (`E: `) or failed fetch
/// (`W: Failed to fetch ...`), without the prefix and with runs of spaces squeezed.
fn apt_problem(stderr: &str) -> Option<String> {
    let line = stderr
        .lines()
        .find(|line| line.starts_with("E: "))
        .or_else(|| {
            stderr
                .lines()
                .find(|line| line.starts_with("W: Failed to fetch"))
        })?;
    let text = line.get(3..).unwrap_or_default();
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn sources_list_names_one_suite_on_the_mirror() {
        assert_eq!(
            sources_list("trixie", false),
            "deb http://deb.debian.org/debian trixie main\n"
        );
        assert_eq!(
            sources_list("bookworm", true),
            "deb-src http://deb.debian.org/debian bookworm main\n"
        );
    }

    #[test]
    fn every_command_uses_the_private_folders() {
        let apt = PrivateApt::new("trixie", PathBuf::from("/o/t"));
        assert_eq!(
            apt.options(),
            [
                "Dir::Etc::sourcelist=/o/t/sources.list",
                "Dir::Etc::sourceparts=/o/t/sources.list.d",
                "Dir::State::Lists=/o/t/lists",
                "Dir::Cache=/o/t/cache",
                "Debug::NoLocking=1",
                "APT::Sandbox::User=root",
            ]
        );
        let command = apt.command("apt-cache");
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(args.len(), 13);
        assert_eq!(args[0], "-o");
        assert_eq!(args[12], "-q");
        assert_eq!(command.get_current_dir(), Some(Path::new("/o/t/debs")));
    }

    #[test]
    fn apt_failures_read_as_one_line() {
        // `apt-get update` with the network unreachable: exit 0, warnings only.
        let offline = "W: Failed to fetch http://deb.debian.org/debian/dists/trixie/InRelease  \
                       Could not resolve 'deb.debian.org'\n\
                       W: Some index files failed to download. They have been ignored, or old ones used instead.\n";
        assert_eq!(
            apt_problem(offline).as_deref(),
            Some("Failed to fetch http://deb.debian.org/debian/dists/trixie/InRelease Could not resolve 'deb.debian.org'")
        );
        let missing = "W: Some index files failed\nE: No packages found\n";
        assert_eq!(apt_problem(missing).as_deref(), Some("No packages found"));
        assert_eq!(
            apt_problem("W: Target Packages is configured multiple times\n"),
            None
        );
        assert_eq!(apt_problem(""), None);
    }
}
