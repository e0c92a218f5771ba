//! What bounds a thread's affinity from outside the daemon: its cgroup's effective cpuset
//! (libvirt puts each vCPU thread in `/machine/qemu-N-NAME.libvirt-qemu/vcpuK`, Kubernetes'
//! static CPU manager gives a pod exclusive CPUs the same way). The kernel refuses an affinity
//! outside the cpuset (EINVAL), so the daemon never asks for one.
//!
//! The cgroup comes from `/proc/<pid>/task/<tid>/cgroup`: cgroup v1's `cpuset` controller line
//! (`N:cpuset:/path`, the set in `cpuset.effective_cpus` under the v1 `cpuset` mount) or, on a
//! pure v2 host, the unified line (`0::/path`, the set in `cpuset.cpus.effective`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use pvmm_scheduler::CpuSet;
use pvmm_tick::procfs::ProcFile;

use crate::discover::task_path;

/// Where cgroup file systems are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The file holding a cgroup's effective CPUs, under `root`, for `/proc`'s `cgroup` listing.
fn cpuset_file(listing: &str, root: &Path) -> Option<PathBuf> {
    let mut unified = None;
    for line in listing.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "cpuset") {
            return Some(
                root.join("cpuset")
                    .join(relative)
                    .join("cpuset.effective_cpus"),
            );
        }
        if controllers.is_empty() {
            unified = Some(root.join(relative).join("cpuset.cpus.effective"));
        }
    }
    unified
}

/// A thread's cgroup is read again at most this many ticks apart (1 s at the default tick),
/// staggered over thread ids: a thread changes cgroup rarely (libvirt moves each vCPU thread
/// once, as the VM starts), while its cgroup's cpuset is what an operator changes, and that is
/// read every tick. A thread seen for the first time is read at once.
const CGROUP_RECHECK_TICKS: u64 = 10;

/// The effective cpusets of the threads the daemon places, read each tick at the cost of one
/// `pread` per distinct cgroup: each cgroup's cpuset file and each thread's `/proc` cgroup
/// listing are kept open ([`ProcFile`]), and the listing is read again only every
/// `CGROUP_RECHECK_TICKS` ticks. Opening two files per vCPU thread per tick was most of an idle
/// host's cost.
#[derive(Debug)]
pub struct CpusetWatch {
    proc: PathBuf,
    cgroups: PathBuf,
    /// Ticks so far ([`CpusetWatch::begin_tick`]).
    tick: u64,
    /// By (pid, tid): a thread id taken again by another process is another thread.
    threads: HashMap<(i32, i32), ThreadCgroup>,
    /// Each cgroup's cpuset file, with the set read from it this tick.
    files: HashMap<PathBuf, CpusetFile>,
}

/// One thread's cgroup, as its `/proc` listing last said.
#[derive(Debug)]
struct ThreadCgroup {
    listing: ProcFile,
    /// Its cgroup's cpuset file (None: the listing names none, or cannot be read).
    file: Option<PathBuf>,
    /// The tick its listing was last read.
    read_at: u64,
    /// The tick it was last asked for.
    seen_at: u64,
}

#[derive(Debug)]
struct CpusetFile {
    file: ProcFile,
    /// The set read at `read_at`.
    set: Option<CpuSet>,
    read_at: u64,
}

impl CpusetWatch {
    /// A watch reading threads under `proc` and cgroups under `cgroups`.
    pub fn new(proc: &Path, cgroups: &Path) -> Self {
        Self {
            proc: proc.to_path_buf(),
            cgroups: cgroups.to_path_buf(),
            tick: 0,
            threads: HashMap::new(),
            files: HashMap::new(),
        }
    }

    /// Starts a tick: forgets the threads not asked for in the previous one, and the cpuset
    /// files no thread names any more.
    pub fn begin_tick(&mut self) {
        let previous = self.tick;
        self.threads.retain(|_, t| t.seen_at == previous);
        let named: HashSet<&PathBuf> = self
            .threads
            .values()
            .filter_map(|t| t.file.as_ref())
            .collect();
        self.files.retain(|path, _| named.contains(path));
        self.tick += 1;
    }

    /// Thread `tid` of process `pid`'s effective cpuset, if its cgroup has one that can be
    /// read and is not empty (an empty set bounds nothing).
    pub fn cpuset(&mut self, pid: i32, tid: i32) -> Option<CpuSet> {
        let tick = self.tick;
        let thread = self
            .threads
            .entry((pid, tid))
            .or_insert_with(|| ThreadCgroup {
                listing: ProcFile::new(task_path(&self.proc, pid, tid).join("cgroup")),
                file: None,
                read_at: 0,
                seen_at: 0,
            });
        thread.seen_at = tick;
        let due = thread.read_at == 0
            || (tick + u64::from(tid.unsigned_abs())).is_multiple_of(CGROUP_RECHECK_TICKS);
        if due {
            thread.read_at = tick;
            thread.file = thread
                .listing
                .read()
                .and_then(|l| cpuset_file(l, &self.cgroups));
        }
        let path = thread.file.as_ref()?;
        let file = self
            .files
            .entry(path.clone())
            .or_insert_with(|| CpusetFile {
                file: ProcFile::new(path.clone()),
                set: None,
                read_at: 0,
            });
        if file.read_at != tick {
            file.read_at = tick;
            file.set = file
                .file
                .read()
                .and_then(|text| text.trim().parse::<CpuSet>().ok())
                .filter(|set| !set.is_empty());
        }
        file.set.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpuset_file_comes_from_the_v1_controller_or_the_unified_hierarchy() {
        let root = Path::new("/cg");
        let v1 = "9:name=systemd:/\n3:cpuset:/machine/qemu-1-web.libvirt-qemu/vcpu0\n0::/";
        assert_eq!(
            cpuset_file(v1, root),
            Some(PathBuf::from(
                "/cg/cpuset/machine/qemu-1-web.libvirt-qemu/vcpu0/cpuset.effective_cpus"
            ))
        );
        let merged = "4:cpu,cpuset:/pod\n";
        assert!(cpuset_file(merged, root).is_some());
        let v2 = "0::/kubepods/pod1/c1\n";
        assert_eq!(
            cpuset_file(v2, root),
            Some(PathBuf::from("/cg/kubepods/pod1/c1/cpuset.cpus.effective"))
        );
        assert_eq!(cpuset_file("garbage", root), None);
        assert_eq!(cpuset_file("", root), None);
    }

    #[test]
    fn a_threads_cpuset_is_read_through_its_cgroup() {
        let dir = std::env::temp_dir().join(format!("pvmm-cgroup-{}", std::process::id()));
        let task = dir.join("proc/7/task/8");
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("cgroup"), "3:cpuset:/machine/vm/vcpu0\n").unwrap();
        let cg = dir.join("cg/cpuset/machine/vm/vcpu0");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cpuset.effective_cpus"), "0-1\n").unwrap();
        let mut watch = CpusetWatch::new(&dir.join("proc"), &dir.join("cg"));
        watch.begin_tick();
        assert_eq!(watch.cpuset(7, 8), Some(CpuSet::range(0, 1)));
        assert_eq!(watch.cpuset(7, 9), None);
        // An operator's change to the cpuset shows at the next tick.
        std::fs::write(cg.join("cpuset.effective_cpus"), "2\n").unwrap();
        watch.begin_tick();
        assert_eq!(watch.cpuset(7, 8), Some(CpuSet::single(2)));
        std::fs::write(cg.join("cpuset.effective_cpus"), "\n").unwrap();
        watch.begin_tick();
        assert_eq!(watch.cpuset(7, 8), None, "an empty set bounds nothing");
        // A thread moved to another cgroup is followed within CGROUP_RECHECK_TICKS.
        let other = dir.join("cg/cpuset/machine/vm/vcpu1");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("cpuset.effective_cpus"), "3\n").unwrap();
        std::fs::write(task.join("cgroup"), "3:cpuset:/machine/vm/vcpu1\n").unwrap();
        let moved = (0..CGROUP_RECHECK_TICKS).any(|_| {
            watch.begin_tick();
            watch.cpuset(7, 8) == Some(CpuSet::single(3))
        });
        assert!(moved, "the thread's new cgroup was never read");
        // Threads and files no longer asked for are forgotten.
        watch.begin_tick();
        watch.begin_tick();
        assert!(watch.threads.is_empty() && watch.files.is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }
}
