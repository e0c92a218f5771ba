//! `pvmm host --adopt auto` next to a cgroup cpuset, as Kubernetes' static CPU manager or
//! libvirt leave one: the test makes a cgroup of its own whose cpuset leaves CPU 1 out, starts
//! two VMs inside it, a QEMU VM (adopted by its KVM file descriptors) and a pvmm VM (joined by
//! its control socket), each of 2 vCPUs with vCPU 0 spinning, and runs the daemon with
//! `--policy performance` over a 2-package topology of this machine's 2 CPUs
//! (`--host-topology 2x1x1`: CPU N is package N), a policy that spreads vCPUs over both
//! packages. A pvmm VM outside the cgroup shows that the same daemon does use package 1.
//! Checked from /proc over many ticks: no thread of either VM in the cgroup is ever allowed,
//! or seen running, outside the cpuset, status puts all their vCPUs within it, and the daemon
//! makes no apply error.
//!
//! It needs root, /dev/kvm, QEMU, at least 2 CPUs and a cpuset controller the test can make
//! a cgroup in (cgroup v1's `cpuset` hierarchy, or cgroup2 with `cpuset` available); without
//! them it skips loudly, or fails under PVMM_REQUIRE_CGROUP=1. The cgroup is removed at the
//! end either way.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pvmm_api::stats::{HostStatus, HostVcpu};

/// The CPUs the test's cgroup allows: CPU 1, package 1 under `2x1x1`, is left out.
const CPUSET: &str = "0";
/// QEMU's firmware and the daemon's first ticks on a loaded machine.
const SETTLE: Duration = Duration::from_secs(120);
/// The VMs in the cgroup, by their names in status and metrics: QEMU's (`-name`), pvmm's
/// (its socket's).
const VMS: [&str; 2] = ["cg-qemu", "cg-pvmm"];

/// A cgroup made by the test, removed when dropped (after the processes in it have ended).
struct TestCgroup {
    dir: PathBuf,
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A killed process leaves its cgroup once reaped; give the kernel a moment.
        let start = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && start.elapsed() < SETTLE {
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.dir.exists() {
            eprintln!("cgroup test: could not remove {}", self.dir.display());
        }
    }
}

/// Where a cpuset can be made: cgroup v1's `cpuset` hierarchy, or a cgroup2 hierarchy that
/// has the `cpuset` controller. Which one, from /proc/mounts.
enum Hierarchy {
    V1(PathBuf),
    V2(PathBuf),
}

fn find_hierarchy() -> Result<Hierarchy, String> {
    let mounts =
        std::fs::read_to_string("/proc/mounts").map_err(|e| format!("/proc/mounts: {e}"))?;
    let mut v2 = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, point, kind, options, ..] = f[..] else {
            continue;
        };
        if kind == "cgroup" && options.split(',').any(|o| o == "cpuset") {
            return Ok(Hierarchy::V1(PathBuf::from(point)));
        }
        let controllers = std::fs::read_to_string(Path::new(point).join("cgroup.controllers"))
            .unwrap_or_default();
        if kind == "cgroup2" && controllers.split_whitespace().any(|c| c == "cpuset") {
            v2 = Some(Hierarchy::V2(PathBuf::from(point)));
        }
    }
    v2.ok_or_else(|| {
        "no cgroup v1 cpuset mount, and no cgroup2 mount offers the cpuset controller \
         (on a hybrid host it is bound to v1)"
            .to_string()
    })
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {text:?} to {}: {e}", path.display()))
}

/// Makes the test's cgroup with cpuset `CPUSET`.
fn make_cgroup() -> Result<TestCgroup, String> {
    let name = format!("pvmm-test-{}", std::process::id());
    let dir = match find_hierarchy()? {
        Hierarchy::V1(root) => {
            let dir = root.join(name);
            std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            let cgroup = TestCgroup { dir };
            // A v1 cpuset takes no task before it has memory nodes too: the parent's.
            let mems = std::fs::read_to_string(root.join("cpuset.mems"))
                .map_err(|e| format!("{}: {e}", root.display()))?;
            write(&cgroup.dir.join("cpuset.mems"), mems.trim())?;
            write(&cgroup.dir.join("cpuset.cpus"), CPUSET)?;
            return Ok(cgroup);
        }
        Hierarchy::V2(root) => {
            write(&root.join("cgroup.subtree_control"), "+cpuset")?;
            root.join(name)
        }
    };
    std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    let cgroup = TestCgroup { dir };
    write(&cgroup.dir.join("cpuset.cpus"), CPUSET)?;
    Ok(cgroup)
}

/// The test's cgroup, or why there is none (a loud skip, or a failure under
/// PVMM_REQUIRE_CGROUP=1).
fn cgroup_available() -> Option<TestCgroup> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    let made = if unsafe { libc::geteuid() } != 0 {
        Err("not root".to_string())
    } else if cpus < 2 {
        Err(format!("{cpus} CPU: nothing to leave out"))
    } else {
        make_cgroup()
    };
    found_or_skip(Need::Cgroup, "cgroup", made)
}

/// Makes `command`'s process join the cgroup whose `cgroup.procs` is `procs` before it runs,
/// so that every thread it makes is born there.
fn join_cgroup(command: &mut Command, procs: &Path) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let procs = std::ffi::CString::new(procs.as_os_str().as_bytes()).expect("a path");
    // SAFETY: between fork and exec the closure only makes system calls (open, write, close)
    // on memory made before the fork, none of which allocates.
    unsafe {
        command.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // "0": the writing process itself.
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            let error = std::io::Error::last_os_error();
            libc::close(fd);
            if written == 1 {
                Ok(())
            } else {
                Err(error)
            }
        });
    }
}

/// The CPU thread `tid` of `pid` last ran on (`/proc/.../stat`, field 39).
fn last_cpu(pid: u32, tid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let after_comm = stat.rsplit_once(')')?.1;
    // Field 3 (state) is the first after the command name.
    after_comm
        .split_whitespace()
        .nth(39 - 3)
        .map(str::to_string)
}

/// Each thread of `pid` that is allowed, or was last seen running, outside `CPUSET`.
fn outside(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_string_lossy().into_owned();
            let allowed = cpus_allowed(tid.parse().unwrap_or(0));
            let ran = last_cpu(pid, &tid)?;
            let within = (allowed.is_empty() || allowed == CPUSET) && ran == CPUSET;
            (!within).then(|| format!("thread {tid}: allowed {allowed:?}, last on CPU {ran}"))
        })
        .collect()
}

/// The vCPUs of the status's VM named `name` (none when there is no such VM).
fn vcpus<'a>(s: &'a HostStatus, name: &str) -> &'a [HostVcpu] {
    s.vm(name).map_or(&[], |vm| &vm.vcpus)
}

/// Whether the daemon gave vCPU `v` exactly `cpus`.
fn given(v: &HostVcpu, cpus: &str) -> bool {
    v.cpus.as_ref().is_some_and(|c| c.to_string() == cpus)
}

fn until(what: &str, cond: impl Fn() -> bool, show: impl Fn() -> String) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < SETTLE, "{what}: {}", show());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_adopted_vm_never_leaves_its_cgroups_cpuset() {
    if !kvm_available("cgroup cpuset") || !qemu_available("cgroup cpuset") {
        return;
    }
    let Some(cgroup) = cgroup_available() else {
        return;
    };
    let dir = scratch("cgroup");
    let kernel = write_kernel(&dir, &SPIN);
    let procs = cgroup.dir.join("cgroup.procs");
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(qemu_tiny_args(VMS[0], 2, &kernel))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    join_cgroup(&mut qemu, &procs);
    let qemu = Proc(qemu.spawn().expect("start QEMU"));
    let qpid = qemu.0.id();
    until(
        "QEMU's vCPU threads",
        || {
            let t = process_threads(qpid);
            t.iter().filter(|(c, _)| c.ends_with("/KVM")).count() == 2
        },
        || format!("{:?}", process_threads(qpid)),
    );
    // pvmm is told the CPUs its cgroup leaves it: it refuses a host topology it may not use.
    let (pvmm, _) = start_pvmm_vm_with(&dir, VMS[1], &SPIN, "2", "600", |c| {
        c.args(["--cpus", CPUSET]);
        join_cgroup(c, &procs);
    });
    let pids = [qpid, pvmm.0.id()];
    let (_control, _) = start_pvmm_vm(&dir, "control", &HALT_LOOP, "2", "600");
    let run = dir.join("run");
    let daemon = Proc(spawn_host(
        &run,
        &[
            "--adopt",
            "auto",
            "--policy",
            "performance",
            "--host-topology",
            "2x1x1",
            "--tick-ms",
            "100",
        ],
    ));
    // Both VMs placed, every vCPU on CPU 0; the control VM's vCPUs spread onto package 1.
    let placed = |s: &HostStatus| {
        let within = VMS.iter().all(|name| {
            let v = vcpus(s, name);
            v.len() == 2 && v.iter().all(|c| given(c, CPUSET))
        });
        let control_on_1 = vcpus(s, "control").iter().any(|c| given(c, "1"));
        within && control_on_1
    };
    let answer = || host_status(&run).expect("the daemon answers its status");
    until(
        "the VMs placed within their cpuset, the control VM on package 1",
        || host_status(&run).is_some_and(|s| placed(&s)),
        || format!("{:?}", host_status(&run)),
    );
    // The control VM's vCPU on package 1, as /proc has it.
    let s = answer();
    let on_1 = vcpus(&s, "control")
        .iter()
        .filter(|c| cpus_allowed(c.tid.into()) == "1")
        .count();
    assert!(on_1 > 0, "the policy spreads onto package 1: {s:?}");
    // Many ticks: no thread of either VM ever allowed or running outside the cpuset.
    for _ in 0..50 {
        let out: Vec<String> = pids.iter().flat_map(|&pid| outside(pid)).collect();
        assert!(out.is_empty(), "outside the cpuset {CPUSET}: {out:?}");
        let s = answer();
        assert!(placed(&s), "{s:?}");
        assert_eq!(s.apply_errors, 0, "{s:?}");
        for name in VMS {
            for v in vcpus(&s, name) {
                assert!(!v.pinned, "a cpuset is no operator's pin: {s:?}");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let metrics = host_metrics(&run);
    for name in VMS {
        let series = format!("pvmm_vm_vcpus{{vm=\"{name}\"}} 2");
        assert!(metrics.contains(&series), "{metrics}");
    }
    drop(daemon);
    drop(pvmm);
    drop(qemu);
    drop(cgroup);
    std::fs::remove_dir_all(&dir).ok();
}
