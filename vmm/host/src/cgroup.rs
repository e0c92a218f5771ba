//! What bounds a thread's affinity from outside the daemon: its cgroup's effective cpuset
//! (libvirt puts each vCPU thread in `/machine/qemu-N-NAME.libvirt-qemu/vcpuK`, Kubernetes'
//! static CPU manager gives a pod exclusive CPUs the same way). The kernel refuses an affinity
//! outside the cpuset (EINVAL), so the daemon never asks for one.
//!
//! The cgroup comes from `/proc/<pid>/task/<tid>/cgroup`: cgroup v1's `cpuset` controller line
//! (`N:cpuset:/path`, the set in `cpuset.effective_cpus` under the v1 `cpuset` mount) or, on a
//! pure v2 host, the unified line (`0::/path`, the set in `cpuset.cpus.effective`).

use std::path::{Path, PathBuf};

use pvmm_scheduler::CpuSet;

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

/// Thread `tid` of process `pid`'s effective cpuset, if its cgroup has one that can be read.
pub fn thread_cpuset(proc: &Path, cgroups: &Path, pid: i32, tid: i32) -> Option<CpuSet> {
    let task = proc
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string());
    let listing = std::fs::read_to_string(task.join("cgroup")).ok()?;
    let file = cpuset_file(&listing, cgroups)?;
    let text = std::fs::read_to_string(file).ok()?;
    let set: CpuSet = text.trim().parse().ok()?;
    (!set.is_empty()).then_some(set)
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
        let (proc, cgroups) = (dir.join("proc"), dir.join("cg"));
        assert_eq!(
            thread_cpuset(&proc, &cgroups, 7, 8),
            Some(CpuSet::range(0, 1))
        );
        assert_eq!(thread_cpuset(&proc, &cgroups, 7, 9), None);
        std::fs::write(cg.join("cpuset.effective_cpus"), "\n").unwrap();
        assert_eq!(
            thread_cpuset(&proc, &cgroups, 7, 8),
            None,
            "an empty set bounds nothing"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
