//! Finding the VMs on the host: pvmm VMs by their control sockets in the runtime directory,
//! and VMs of other VMMs (QEMU, Firecracker, cloud-hypervisor, crosvm) by the KVM vCPU file
//! descriptors they hold.
//!
//! A process is a KVM VMM when `/proc/<pid>/fd` holds `anon_inode:kvm-vcpu:N` links. Its vCPU
//! N runs on the thread that debugfs names (`/sys/kernel/debug/kvm/<pid>-<fd>/vcpuN/pid`, any
//! VMM), or failing that the thread its VMM names after it ([`VCPU_THREAD_NAMES`]), or what a
//! QEMU answers on a QMP socket the operator named ([`super::qmp`]); its other threads are
//! housekeeping. Every path is under a root, so tests run against a fake `/proc`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::names::{foreign_name, read_cmdline};

/// The prefix of a KVM vCPU file descriptor's link target.
const KVM_VCPU_LINK: &str = "anon_inode:kvm-vcpu:";
/// The link target of a KVM VM file descriptor.
const KVM_VM_LINK: &str = "anon_inode:kvm-vm";

/// Where the daemon reads the host (real paths by default, a fake tree in tests).
#[derive(Debug, Clone)]
pub struct Roots {
    /// `/proc`.
    pub proc: PathBuf,
    /// debugfs's `kvm` directory (`/sys/kernel/debug/kvm`).
    pub kvm_debugfs: PathBuf,
    /// QEMU QMP sockets (`--qmp`), asked for the vCPUs neither debugfs nor thread names map.
    pub qmp: Vec<PathBuf>,
    /// The host's online CPUs ([`pvmm_tick::hotplug::SYSFS_ONLINE`]).
    pub cpu_online: PathBuf,
    /// Where cgroup file systems are mounted ([`crate::cgroup::CGROUP_ROOT`]).
    pub cgroup: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            proc: "/proc".into(),
            kvm_debugfs: "/sys/kernel/debug/kvm".into(),
            qmp: Vec::new(),
            cpu_online: pvmm_tick::hotplug::SYSFS_ONLINE.into(),
            cgroup: crate::cgroup::CGROUP_ROOT.into(),
        }
    }
}

/// A VM of another VMM, as found in `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignVm {
    /// The VMM's pid.
    pub pid: i32,
    /// Its command name.
    pub comm: String,
    /// Its stable name ([`crate::names`]).
    pub name: String,
    /// vCPU index -> thread id, for the vCPUs whose thread was found.
    pub vcpu_tids: BTreeMap<u32, i32>,
    /// vCPUs whose thread could not be found (no debugfs entry, no known thread name).
    pub unmapped: Vec<u32>,
}

fn read_trimmed(path: &Path) -> Option<String> {
    Some(std::fs::read_to_string(path).ok()?.trim_end().to_string())
}

/// The pids under `proc`, ascending.
pub fn pids(proc: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// The KVM file descriptors of `pid`: (the VM fd, vCPU index per vCPU fd). None when the
/// process holds no vCPU fd (or is gone).
fn kvm_fds(proc: &Path, pid: i32) -> Option<(Option<u32>, Vec<u32>)> {
    let entries = std::fs::read_dir(proc.join(pid.to_string()).join("fd")).ok()?;
    let mut vm_fd = None;
    let mut vcpus = Vec::new();
    for e in entries.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if let Some(n) = target.strip_prefix(KVM_VCPU_LINK) {
            if let Ok(n) = n.parse() {
                vcpus.push(n);
            }
        } else if target == KVM_VM_LINK {
            vm_fd = e.file_name().to_str().and_then(|f| f.parse().ok());
        }
    }
    vcpus.sort_unstable();
    vcpus.dedup();
    (!vcpus.is_empty()).then_some((vm_fd, vcpus))
}

/// How VMMs name their vCPU threads, as (prefix, suffix) around the vCPU index: QEMU
/// (`-name ...,debug-threads=on`, which libvirt sets), Firecracker, crosvm and
/// cloud-hypervisor. Thread names are cut to 15 bytes by the kernel; these fit for any index
/// below 1,000.
pub const VCPU_THREAD_NAMES: [(&str, &str); 4] = [
    ("CPU ", "/KVM"),
    ("fc_vcpu ", ""),
    ("crosvm_vcpu", ""),
    ("vcpu", ""),
];

/// The vCPU index a VMM's thread name gives, by [`VCPU_THREAD_NAMES`].
fn named_vcpu_index(comm: &str) -> Option<u32> {
    VCPU_THREAD_NAMES.iter().find_map(|(prefix, suffix)| {
        let index = comm.strip_prefix(prefix)?.strip_suffix(suffix)?;
        // Digits only: "vcpu" must not read "vcpu-worker" or "vcpu 1x".
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        index.parse().ok()
    })
}

/// The thread ids of `pid` (no names: cheaper than [`threads`]).
pub fn thread_ids(proc: &Path, pid: i32) -> Vec<i32> {
    std::fs::read_dir(proc.join(pid.to_string()).join("task"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The threads of `pid` with their names.
pub fn threads(proc: &Path, pid: i32) -> Vec<(i32, String)> {
    let task = proc.join(pid.to_string()).join("task");
    let Ok(entries) = std::fs::read_dir(&task) else {
        return Vec::new();
    };
    let mut out: Vec<(i32, String)> = entries
        .filter_map(|e| {
            let tid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            Some((tid, read_trimmed(&task.join(tid.to_string()).join("comm"))?))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Maps each vCPU of `pid` to its thread: debugfs first, then the VMM's thread names, then
/// the QMP sockets.
fn map_vcpus(roots: &Roots, pid: i32, vm_fd: Option<u32>, vcpus: &[u32]) -> ForeignVm {
    let debug_dir = vm_fd.map(|fd| roots.kvm_debugfs.join(format!("{pid}-{fd}")));
    let named: BTreeMap<u32, i32> = threads(&roots.proc, pid)
        .into_iter()
        .filter_map(|(tid, comm)| Some((named_vcpu_index(&comm)?, tid)))
        .collect();
    let mut vcpu_tids = BTreeMap::new();
    let mut unmapped = Vec::new();
    let mut from_qmp: Option<BTreeMap<u32, i32>> = None;
    for &n in vcpus {
        let from_debugfs = debug_dir
            .as_ref()
            .and_then(|d| read_trimmed(&d.join(format!("vcpu{n}")).join("pid")))
            .and_then(|t| t.parse::<i32>().ok())
            .filter(|tid| *tid > 0);
        let tid = from_debugfs.or_else(|| named.get(&n).copied()).or_else(|| {
            from_qmp
                .get_or_insert_with(|| qmp_vcpu_threads(roots, pid))
                .get(&n)
                .copied()
        });
        match tid {
            Some(tid) => {
                vcpu_tids.insert(n, tid);
            }
            None => unmapped.push(n),
        }
    }
    let proc_pid = roots.proc.join(pid.to_string());
    ForeignVm {
        pid,
        comm: read_trimmed(&proc_pid.join("comm")).unwrap_or_default(),
        name: foreign_name(&read_cmdline(&proc_pid), pid),
        vcpu_tids,
        unmapped,
    }
}

/// The vCPU threads of `pid` from the first QMP socket whose QEMU is that process (its
/// threads are `pid`'s); empty when none is.
fn qmp_vcpu_threads(roots: &Roots, pid: i32) -> BTreeMap<u32, i32> {
    let task = roots.proc.join(pid.to_string()).join("task");
    roots
        .qmp
        .iter()
        .filter_map(|socket| super::qmp::vcpu_threads(socket).ok())
        .find(|threads| {
            !threads.is_empty()
                && threads
                    .values()
                    .all(|tid| task.join(tid.to_string()).is_dir())
        })
        .unwrap_or_default()
}

/// The command name of pvmm processes: they join through their sockets, never by adoption
/// (a pvmm places its own vCPUs, and two placers would fight over the same threads).
pub const PVMM_COMM: &str = "pvmm";

/// Every KVM VMM process under `roots.proc` except those in `skip` (pvmm VMs that joined, and
/// this process) and pvmm processes.
pub fn foreign_vms(roots: &Roots, skip: &[i32]) -> Vec<ForeignVm> {
    foreign_vms_among(roots, &pids(&roots.proc), skip)
}

/// [`foreign_vms`] among `pids` only.
pub fn foreign_vms_among(roots: &Roots, pids: &[i32], skip: &[i32]) -> Vec<ForeignVm> {
    pids.iter()
        .copied()
        .filter(|pid| !skip.contains(pid))
        .filter_map(|pid| {
            let (vm_fd, vcpus) = kvm_fds(&roots.proc, pid)?;
            let vm = map_vcpus(roots, pid, vm_fd, &vcpus);
            (vm.comm != PVMM_COMM).then_some(vm)
        })
        .collect()
}

/// Every this many ticks discovery examines every process's file descriptors (1 s at the
/// default tick); in between, only processes it has not examined yet or first saw less than
/// that long ago (a VMM creates its vCPU file descriptors just after it starts). Reading
/// every process's `fd` directory each tick is what costs at scale.
pub const FULL_SCAN_TICKS: u64 = 10;

/// Which processes discovery examines at each tick.
#[derive(Debug, Default)]
pub struct ScanSchedule {
    tick: u64,
    first_seen: std::collections::HashMap<i32, u64>,
}

impl ScanSchedule {
    /// For the processes alive now (`alive`), whether this is a full scan and the pids to
    /// examine.
    pub fn next(&mut self, alive: &[i32]) -> (bool, Vec<i32>) {
        let tick = self.tick;
        self.tick += 1;
        let full = tick.is_multiple_of(FULL_SCAN_TICKS);
        self.first_seen
            .retain(|pid, _| alive.binary_search(pid).is_ok());
        let examine = alive
            .iter()
            .copied()
            .filter(|pid| {
                let first = *self.first_seen.entry(*pid).or_insert(tick);
                full || tick - first < FULL_SCAN_TICKS
            })
            .collect();
        (full, examine)
    }
}

/// The control sockets in `dir` (`*.sock`), sorted.
pub fn pvmm_sockets(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    out.sort();
    out
}

/// A thread's `schedstat` (nanoseconds it ran, waited for a CPU, and its timeslices; parsed by
/// [`pvmm_tick::procfs::parse_schedstat`]). Works for any thread on the host, not only this
/// process's.
pub fn schedstat_path(proc: &Path, pid: i32, tid: i32) -> PathBuf {
    task_path(proc, pid, tid).join("schedstat")
}

/// Thread `tid` of process `pid`'s directory: present while that thread lives.
pub fn task_path(proc: &Path, pid: i32, tid: i32) -> PathBuf {
    proc.join(pid.to_string())
        .join("task")
        .join(tid.to_string())
}

/// The kernel's clock tick for `/proc` CPU times (`USER_HZ`, from `sysconf(_SC_CLK_TCK)`).
fn clock_ticks_per_s() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the C library; it has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        u64::try_from(hz).ok().filter(|hz| *hz > 0).unwrap_or(100)
    })
}

/// `/proc/<pid>/stat`: one file for the whole process, where its threads' schedstat files
/// cost one read each.
pub fn process_stat_path(proc: &Path, pid: i32) -> PathBuf {
    proc.join(pid.to_string()).join("stat")
}

/// The CPU time every thread of a process has run so far (nanoseconds, at the kernel's
/// clock-tick granularity), from its `stat` text (`utime` + `stime`).
pub fn parse_process_ran_ns(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime).saturating_mul(1_000_000_000 / clock_ticks_per_s()))
}

/// [`clock_ticks_per_s`], for tests that write fake `stat` files.
#[cfg(test)]
pub fn test_clock_ticks_per_s() -> u64 {
    clock_ticks_per_s()
}

#[cfg(test)]
pub mod fake {
    //! A fake `/proc` and debugfs for discovery tests.
    use super::*;

    /// A fake tree under a fresh temporary directory.
    pub struct FakeHost {
        /// Its roots.
        pub roots: Roots,
        dir: PathBuf,
    }

    impl FakeHost {
        /// An empty host named `name`.
        pub fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("pvmm-host-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self {
                roots: Roots {
                    proc: dir.join("proc"),
                    kvm_debugfs: dir.join("debugfs-kvm"),
                    qmp: Vec::new(),
                    cpu_online: dir.join("online"),
                    cgroup: dir.join("cgroup"),
                },
                dir,
            }
        }

        /// A process with `threads` (tid, comm) and fd links (fd, target).
        pub fn process(&self, pid: i32, threads: &[(i32, &str)], fds: &[(u32, &str)]) {
            let p = self.roots.proc.join(pid.to_string());
            std::fs::create_dir_all(p.join("fd")).unwrap();
            std::fs::write(p.join("comm"), format!("{}\n", threads[0].1)).unwrap();
            for (tid, comm) in threads {
                let t = p.join("task").join(tid.to_string());
                std::fs::create_dir_all(&t).unwrap();
                std::fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
            }
            for (fd, target) in fds {
                std::os::unix::fs::symlink(target, p.join("fd").join(fd.to_string())).unwrap();
            }
        }

        /// debugfs's `vcpuN/pid` for VM fd `fd` of `pid`.
        pub fn debugfs_vcpu(&self, pid: i32, fd: u32, vcpu: u32, tid: i32) {
            let d = self
                .roots
                .kvm_debugfs
                .join(format!("{pid}-{fd}"))
                .join(format!("vcpu{vcpu}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("pid"), format!("{tid}\n")).unwrap();
        }
    }

    impl Drop for FakeHost {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_wrap)]
mod tests {
    use super::fake::FakeHost;
    use super::*;

    #[test]
    fn qemu_threads_by_name_and_any_vmm_through_debugfs() {
        let host = FakeHost::new("discover");
        // QEMU with debug-threads: vCPUs found by thread name.
        host.process(
            100,
            &[
                (100, "qemu-system-x86"),
                (101, "worker"),
                (102, "CPU 0/KVM"),
                (103, "CPU 1/KVM"),
            ],
            &[
                (9, "anon_inode:kvm-vm"),
                (10, "anon_inode:kvm-vcpu:0"),
                (11, "anon_inode:kvm-vcpu:1"),
            ],
        );
        // Another VMM whose threads have no known names: debugfs maps vCPU 0; vCPU 1 stays
        // unmapped.
        host.process(
            200,
            &[(200, "vmm"), (201, "worker 0"), (202, "worker 1")],
            &[
                (4, "anon_inode:kvm-vm"),
                (5, "anon_inode:kvm-vcpu:0"),
                (6, "anon_inode:kvm-vcpu:1"),
            ],
        );
        host.debugfs_vcpu(200, 4, 0, 201);
        // A process without KVM, and a pvmm VM that joins through its socket.
        host.process(300, &[(300, "bash")], &[(0, "/dev/null")]);
        host.process(
            400,
            &[(400, "pvmm"), (401, "vcpu0")],
            &[(7, "anon_inode:kvm-vcpu:0")],
        );
        // A pvmm outside the runtime directory is not adopted either.
        host.process(
            500,
            &[(500, "pvmm"), (501, "vcpu0")],
            &[(7, "anon_inode:kvm-vcpu:0")],
        );
        let vms = foreign_vms(&host.roots, &[400]);
        assert_eq!(vms.len(), 2, "{vms:?}");
        assert_eq!(vms[0].pid, 100);
        assert_eq!(vms[0].comm, "qemu-system-x86");
        assert_eq!(vms[0].vcpu_tids, BTreeMap::from([(0, 102), (1, 103)]));
        assert!(vms[0].unmapped.is_empty());
        assert_eq!(vms[1].vcpu_tids, BTreeMap::from([(0, 201)]));
        assert_eq!(vms[1].unmapped, vec![1]);
    }

    #[test]
    fn firecracker_crosvm_and_cloud_hypervisor_vcpus_are_found_by_their_thread_names() {
        let host = FakeHost::new("discover-names");
        let kvm = [
            (3, "anon_inode:kvm-vm"),
            (4, "anon_inode:kvm-vcpu:0"),
            (5, "anon_inode:kvm-vcpu:1"),
        ];
        host.process(
            10,
            &[
                (10, "firecracker"),
                (11, "fc_api"),
                (12, "fc_vcpu 0"),
                (13, "fc_vcpu 1"),
            ],
            &kvm,
        );
        host.process(
            20,
            &[(20, "crosvm"), (21, "crosvm_vcpu1"), (22, "crosvm_vcpu0")],
            &kvm,
        );
        host.process(
            30,
            &[
                (30, "cloud-hypervisor"),
                (31, "http-server"),
                (32, "vcpu0"),
                (33, "vcpu1"),
            ],
            &kvm,
        );
        let vms = foreign_vms(&host.roots, &[]);
        let found: Vec<(i32, BTreeMap<u32, i32>)> =
            vms.iter().map(|v| (v.pid, v.vcpu_tids.clone())).collect();
        assert_eq!(
            found,
            [
                (10, BTreeMap::from([(0, 12), (1, 13)])),
                (20, BTreeMap::from([(0, 22), (1, 21)])),
                (30, BTreeMap::from([(0, 32), (1, 33)])),
            ]
        );
        assert!(vms.iter().all(|v| v.unmapped.is_empty()));
    }

    #[test]
    fn a_qemu_without_thread_names_is_mapped_through_its_qmp_socket() {
        let mut host = FakeHost::new("discover-qmp");
        let kvm = [
            (3, "anon_inode:kvm-vm"),
            (4, "anon_inode:kvm-vcpu:0"),
            (5, "anon_inode:kvm-vcpu:1"),
        ];
        let unnamed = |pid: i32| {
            [
                (pid, "qemu-system-x86"),
                (pid + 1, "qemu-system-x86"),
                (pid + 2, "qemu-system-x86"),
            ]
        };
        host.process(40, &unnamed(40), &kvm);
        host.process(50, &unnamed(50), &kvm);
        // Two QMP sockets: the first is another QEMU's (its threads are not process 50's).
        let dir = host.roots.proc.parent().unwrap().to_path_buf();
        let (a, b) = (dir.join("a.qmp"), dir.join("b.qmp"));
        let servers = [
            super::super::qmp::fake::serve(&a, vec![(0, 41), (1, 42)], 2),
            super::super::qmp::fake::serve(&b, vec![(0, 52), (1, 51)], 1),
        ];
        host.roots.qmp = vec![a, b];
        let vms = foreign_vms(&host.roots, &[]);
        assert_eq!(vms[0].vcpu_tids, BTreeMap::from([(0, 41), (1, 42)]));
        assert_eq!(vms[1].vcpu_tids, BTreeMap::from([(0, 52), (1, 51)]));
        for server in servers {
            server.join().unwrap();
        }
    }

    #[test]
    fn the_scan_schedule_examines_new_processes_every_tick_and_all_now_and_then() {
        let mut s = ScanSchedule::default();
        assert_eq!(s.next(&[1, 2]), (true, vec![1, 2]));
        // 1 and 2 were seen at tick 0: examined again until they are FULL_SCAN_TICKS old.
        for _ in 1..FULL_SCAN_TICKS {
            assert_eq!(s.next(&[1, 2]).1, vec![1, 2]);
        }
        // A full scan; then a process that appears is examined, the old ones are not.
        assert_eq!(s.next(&[1, 2]), (true, vec![1, 2]));
        assert_eq!(s.next(&[1, 2, 3]), (false, vec![3]));
        assert_eq!(s.next(&[2, 3]), (false, vec![3]));
    }

    #[test]
    fn names_and_schedstat() {
        assert_eq!(named_vcpu_index("CPU 12/KVM"), Some(12));
        assert_eq!(named_vcpu_index("fc_vcpu 3"), Some(3));
        assert_eq!(named_vcpu_index("crosvm_vcpu7"), Some(7));
        assert_eq!(named_vcpu_index("vcpu11"), Some(11));
        for other in [
            "CPU x/KVM",
            "CPU 1/TCG",
            "vcpu",
            "vcpu-worker",
            "fc_vcpu",
            "vcpu 1",
            "qemu",
        ] {
            assert_eq!(named_vcpu_index(other), None, "{other}");
        }
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let pid = std::process::id() as i32;
        let read = |path: PathBuf| std::fs::read_to_string(path).ok();
        let proc = Path::new("/proc");
        assert!(read(schedstat_path(proc, pid, tid))
            .and_then(|t| pvmm_tick::procfs::parse_schedstat(&t))
            .is_some());
        assert_eq!(read(schedstat_path(proc, pid, -5)), None);
        assert!(read(process_stat_path(proc, pid))
            .and_then(|t| parse_process_ran_ns(&t))
            .is_some());
        assert_eq!(parse_process_ran_ns("12 (x) garbage"), None);
    }
}
