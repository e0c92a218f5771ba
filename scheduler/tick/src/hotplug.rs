//! Host CPUs going offline and coming back.
//!
//! pvmm places on the CPUs of its topology (`--host-topology`, limited by `--cpus`): that set
//! is the upper bound for the whole run. An operator may take a CPU offline at any time (`echo
//! 0 > /sys/devices/system/cpu/cpuN/online`); the kernel then moves the threads pinned to it
//! elsewhere, and an affinity that names only offline CPUs is refused. So at every tick the
//! scheduler reads the host's online CPUs and, when the bound's online part changed, places on
//! that part from then on; a CPU that comes back is used again. A whole package going offline
//! is the same case. A CPU offline when pvmm started is not in its topology (sysfs describes
//! online CPUs only) and is never used.

use std::path::PathBuf;

use pvmm_scheduler::{CpuSet, HostTopology};

use crate::procfs::ProcFile;

/// The host's online CPUs.
pub const SYSFS_ONLINE: &str = "/sys/devices/system/cpu/online";

/// Which of the CPUs pvmm may use are online, read from a kept-open sysfs file. The file's
/// text is parsed only when it differs from the last reading's, so that a tick where nothing
/// changed allocates nothing.
#[derive(Debug)]
pub struct OnlineCpus {
    file: ProcFile,
    bound: HostTopology,
    current: CpuSet,
    /// The text of the last reading.
    last_text: String,
}

/// What [`OnlineCpus::check`] found.
#[derive(Debug, Clone, PartialEq)]
enum OnlineChange {
    /// The usable CPUs are as before (or the file could not be read).
    Same,
    /// Place on this topology from now on: the bound's CPUs that are online.
    Now(HostTopology),
    /// None of the bound's CPUs is online: nothing can be placed.
    NoneLeft,
}

impl OnlineCpus {
    /// Watches `path` (the format of [`SYSFS_ONLINE`]) for the CPUs of `bound`. None when
    /// `path` cannot be read or some of `bound`'s CPUs are not online now: then `bound` does
    /// not describe this host's CPUs (a topology given for `--policy none`), and there is
    /// nothing to follow.
    pub fn watch(bound: HostTopology, path: PathBuf) -> Option<Self> {
        let mut file = ProcFile::new(path);
        let last_text = file.read()?.to_string();
        let online: CpuSet = last_text.trim().parse().ok()?;
        let current = bound.cpu_set();
        current.difference(&online).is_empty().then_some(Self {
            file,
            current,
            bound,
            last_text,
        })
    }

    /// Reads the online CPUs and returns the topology to place on when the usable ones
    /// changed since the last call, saying so on stderr after `who: ` (`pvmm`, `pvmm-host`).
    /// With none of them online it says that once and returns None: placing goes on as
    /// before.
    pub fn follow(&mut self, who: &str) -> Option<HostTopology> {
        if !self.text_changed() {
            return None;
        }
        let was = self.current.clone();
        match self.usable_change() {
            OnlineChange::Same => None,
            OnlineChange::NoneLeft => {
                eprintln!(
                    "{who}: none of the host CPUs {was} is online; placing on them as before"
                );
                None
            }
            OnlineChange::Now(topology) => {
                eprintln!(
                    "{who}: host CPUs online changed: placing on {} (was {was})",
                    topology.cpu_set()
                );
                Some(topology)
            }
        }
    }

    /// Reads the file; whether its text differs from the last reading's (which it replaces).
    /// An unreadable file is no change.
    fn text_changed(&mut self) -> bool {
        let Some(text) = self.file.read() else {
            return false;
        };
        if text == self.last_text {
            return false;
        }
        self.last_text.clear();
        self.last_text.push_str(text);
        true
    }

    /// Reads the online CPUs and says whether the usable ones changed since the last call.
    #[cfg(test)]
    fn check(&mut self) -> OnlineChange {
        if !self.text_changed() {
            return OnlineChange::Same;
        }
        self.usable_change()
    }

    /// Whether the usable CPUs in the last reading differ from those of the one before.
    fn usable_change(&mut self) -> OnlineChange {
        let Ok(online) = self.last_text.trim().parse::<CpuSet>() else {
            return OnlineChange::Same;
        };
        let usable = self.bound.cpu_set().intersection(&online);
        if usable == self.current {
            return OnlineChange::Same;
        }
        if usable.is_empty() {
            // Remembered, so that the same state is reported once.
            self.current = usable;
            return OnlineChange::NoneLeft;
        }
        match self.bound.restrict(&usable) {
            Ok(topology) => {
                self.current = usable;
                OnlineChange::Now(topology)
            }
            // Cannot happen for a subset of the bound's own CPUs; keep placing as before.
            Err(_) => OnlineChange::Same,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_and_returning_cpus_are_followed_within_the_bound() {
        let dir = std::env::temp_dir().join(format!("pvmm-online-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("online");
        let bound = HostTopology::from_spec("2x2x1")
            .unwrap()
            .restrict(&"0-2".parse().unwrap())
            .unwrap();
        std::fs::write(&path, "0-1\n").unwrap();
        assert!(OnlineCpus::watch(bound.clone(), path.clone()).is_none());
        std::fs::write(&path, "0-3\n").unwrap();
        let mut online = OnlineCpus::watch(bound, path.clone()).unwrap();
        // CPU 3 is outside the bound (`--cpus 0-2`): nothing changed.
        assert_eq!(online.check(), OnlineChange::Same);
        std::fs::write(&path, "0,2-3\n").unwrap();
        let OnlineChange::Now(t) = online.check() else {
            panic!("CPU 1 went offline");
        };
        assert_eq!(t.cpu_set().to_string(), "0,2");
        assert_eq!(online.check(), OnlineChange::Same);
        std::fs::write(&path, "3\n").unwrap();
        assert_eq!(online.check(), OnlineChange::NoneLeft);
        assert_eq!(online.check(), OnlineChange::Same);
        std::fs::write(&path, "0-3\n").unwrap();
        let OnlineChange::Now(t) = online.check() else {
            panic!("the CPUs came back");
        };
        assert_eq!(t.cpu_set().to_string(), "0-2");
        // Unreadable text changes nothing.
        std::fs::write(&path, "garbage\n").unwrap();
        assert_eq!(online.check(), OnlineChange::Same);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_whole_package_going_offline_leaves_the_other() {
        let dir = std::env::temp_dir().join(format!("pvmm-online-pkg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("online");
        std::fs::write(&path, "0-3\n").unwrap();
        let bound = HostTopology::from_spec("2x2x1").unwrap();
        let mut online = OnlineCpus::watch(bound, path.clone()).unwrap();
        std::fs::write(&path, "0-1\n").unwrap();
        let OnlineChange::Now(t) = online.check() else {
            panic!("package 1 went offline");
        };
        assert_eq!(t.num_packages(), 1);
        assert_eq!(t.package_cpus(0).to_string(), "0-1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
