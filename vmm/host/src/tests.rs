//! The daemon's unit tests, on a fake `/proc` with a recording executor.

use super::discover::fake::FakeHost;
use super::*;
use pvmm_scheduler::{CpuSet, RecordingExecutor, VcpuId};

fn daemon(host: &FakeHost, policy: &str) -> HostDaemon {
    daemon_with(host, policy, RecordingExecutor::new())
}

fn daemon_with(host: &FakeHost, policy: &str, executor: RecordingExecutor) -> HostDaemon {
    HostDaemon::with_executor(config(host, policy), None, Box::new(executor)).unwrap()
}

/// The daemon's settings for `host`: a 2x2x1 topology, `policy`, adopting other VMMs' VMs.
fn config(host: &FakeHost, policy: &str) -> HostConfig {
    let dir = host.roots.proc.parent().unwrap().join("run");
    HostConfig {
        policy: policy.parse().unwrap(),
        topology: HostTopology::from_spec("2x2x1").unwrap(),
        tick: Duration::from_millis(100),
        share_package: false,
        runtime_dir: dir.clone(),
        adopt: true,
        roots: host.roots.clone(),
        verbose: false,
        metrics: None,
    }
}

#[test]
fn foreign_vms_are_packed_with_their_housekeeping_and_gone_ones_dropped() {
    let host = FakeHost::new("daemon");
    for (pid, base) in [(100, 110), (200, 210)] {
        host.process(
            pid,
            &[
                (pid, "qemu"),
                (pid + 1, "io"),
                (base, "CPU 0/KVM"),
                (base + 1, "CPU 1/KVM"),
            ],
            &[
                (3, "anon_inode:kvm-vm"),
                (4, "anon_inode:kvm-vcpu:0"),
                (5, "anon_inode:kvm-vcpu:1"),
            ],
        );
    }
    let mut d = daemon(&host, "powersaving");
    d.tick().unwrap();
    assert_eq!(d.host.vms.len(), 2);
    // Idle VMs: every vCPU thread and both VMMs' housekeeping on package 0 (CPUs 0-1).
    let package0 = CpuSet::range(0, 1);
    for tid in [110, 111, 210, 211, 100, 101, 200, 201] {
        let cpus = d
            .host
            .threads
            .applied(tid)
            .unwrap_or_else(|| panic!("thread {tid} not placed"));
        assert!(cpus.is_subset(&package0), "thread {tid} on {cpus}");
    }
    // The second VM ends: it is dropped, no error.
    std::fs::remove_dir_all(host.roots.proc.join("200")).unwrap();
    d.tick().unwrap();
    assert_eq!(d.host.vms.len(), 1);
    // A VM that starts between full scans is placed at the next tick.
    d.tick().unwrap();
    host.process(
        300,
        &[(300, "qemu"), (310, "CPU 0/KVM")],
        &[(3, "anon_inode:kvm-vm"), (4, "anon_inode:kvm-vcpu:0")],
    );
    d.tick().unwrap();
    assert_eq!(d.managed(), (2, 3));
    assert!(d
        .host
        .threads
        .applied(310)
        .is_some_and(|c| c.is_subset(&package0)));
    // A vCPU added to a running VM (a new thread and file descriptor) is found by the
    // next full scan; the unchanged VM is not examined again.
    host.process(
        100,
        &[
            (100, "qemu"),
            (101, "io"),
            (110, "CPU 0/KVM"),
            (111, "CPU 1/KVM"),
            (112, "CPU 2/KVM"),
        ],
        &[(6, "anon_inode:kvm-vcpu:2")],
    );
    for _ in 0..discover::FULL_SCAN_TICKS {
        d.tick().unwrap();
    }
    assert_eq!(d.managed(), (2, 4));
    assert!(d.host.threads.applied(112).is_some());
}

/// With `--share-package` every packed vCPU thread may run on all the CPUs its package uses;
/// without it, on one CPU each.
#[test]
fn shared_packages_are_applied_to_adopted_vcpu_threads() {
    let applied = |share_package: bool| -> Vec<CpuSet> {
        let host = host_with_one_qemu(if share_package { "shared" } else { "pinned" });
        // The idle vCPUs sit on CPUs 0 and 1, where powersaving leaves them (package 0), so
        // the package uses two CPUs.
        let mut executor = RecordingExecutor::new();
        for (tid, cpu) in [(110, 0), (111, 1)] {
            executor.apply(tid, &CpuSet::single(cpu)).unwrap();
        }
        let mut d = HostDaemon::with_executor(
            HostConfig {
                share_package,
                ..config(&host, "powersaving")
            },
            None,
            Box::new(executor),
        )
        .unwrap();
        d.tick().unwrap();
        [110, 111]
            .map(|tid| {
                d.host
                    .threads
                    .applied(tid)
                    .unwrap_or_else(|| panic!("thread {tid} not placed"))
                    .clone()
            })
            .to_vec()
    };
    assert_eq!(applied(false), [CpuSet::single(0), CpuSet::single(1)]);
    let package0 = CpuSet::range(0, 1);
    assert_eq!(applied(true), [package0.clone(), package0]);
}

/// A fake host named `name` with one QEMU (pid 100) of two vCPUs on threads 110 and 111.
fn host_with_one_qemu(name: &str) -> FakeHost {
    let host = FakeHost::new(name);
    host.process(
        100,
        &[(100, "qemu"), (110, "CPU 0/KVM"), (111, "CPU 1/KVM")],
        &[
            (3, "anon_inode:kvm-vm"),
            (4, "anon_inode:kvm-vcpu:0"),
            (5, "anon_inode:kvm-vcpu:1"),
        ],
    );
    host
}

#[test]
fn an_adopted_vm_whose_vcpus_sit_where_the_engine_would_put_them_is_not_moved() {
    let host = host_with_one_qemu("adopt-in-place");
    // An earlier daemon (or the VMM's own pinning) left both idle vCPUs on CPU 1, a CPU
    // of package 0, where powersaving packs them; from scratch the engine would choose
    // CPU 0 for vCPU 0.
    let mut executor = RecordingExecutor::new();
    for tid in [110, 111] {
        executor.apply(tid, &CpuSet::single(1)).unwrap();
    }
    let mut d = daemon_with(&host, "powersaving", executor);
    d.tick().unwrap();
    assert_eq!(d.tick.totals().migrations, 0);
    for tid in [110, 111] {
        assert_eq!(
            d.host.threads.applied(tid),
            Some(&CpuSet::single(1)),
            "thread {tid}"
        );
    }
}

#[test]
fn a_thread_created_while_placed_gets_its_process_affinity_back() {
    let host = FakeHost::new("late-thread");
    let fds = [(3, "anon_inode:kvm-vm"), (4, "anon_inode:kvm-vcpu:0")];
    host.process(100, &[(100, "qemu"), (110, "CPU 0/KVM")], &fds);
    let mut executor = RecordingExecutor::new();
    for tid in [100, 110] {
        executor.apply(tid, &CpuSet::range(0, 3)).unwrap();
    }
    let mut d = daemon_with(&host, "powersaving", executor);
    d.tick().unwrap();
    // A thread appears while the VM is placed; it inherited its creator's pinning.
    host.process(
        100,
        &[(100, "qemu"), (110, "CPU 0/KVM"), (120, "worker")],
        &[],
    );
    let pinned = d.host.executor.read(100).unwrap();
    assert_ne!(pinned, CpuSet::range(0, 3));
    d.host.executor.apply(120, &pinned).unwrap();
    for _ in 0..discover::FULL_SCAN_TICKS {
        d.tick().unwrap();
    }
    assert!(
        d.host.threads.applied(120).is_some(),
        "the new thread is housekeeping"
    );
    d.release();
    for tid in [100, 110, 120] {
        assert_eq!(
            d.host.executor.read(tid).unwrap(),
            CpuSet::range(0, 3),
            "thread {tid}"
        );
    }
}

#[test]
fn placement_follows_host_cpus_going_offline_and_coming_back() {
    let host = host_with_one_qemu("daemon-hotplug");
    std::fs::write(&host.roots.cpu_online, "0-3\n").unwrap();
    let mut d = daemon(&host, "powersaving");
    d.tick().unwrap();
    let on = |d: &HostDaemon| -> CpuSet {
        [100, 110, 111]
            .iter()
            .flat_map(|tid| d.host.threads.applied(*tid).unwrap().iter())
            .collect()
    };
    assert!(on(&d).contains(0), "{}", on(&d));
    // CPU 0 goes offline: nothing stays on it, and package 0 keeps CPU 1.
    std::fs::write(&host.roots.cpu_online, "1-3\n").unwrap();
    d.tick().unwrap();
    assert_eq!(d.host.config().topology.cpu_set().to_string(), "1-3");
    assert_eq!(on(&d).to_string(), "1", "{}", on(&d));
    // It comes back: the placement may use it again.
    std::fs::write(&host.roots.cpu_online, "0-3\n").unwrap();
    d.tick().unwrap();
    assert_eq!(d.host.config().topology.cpu_set().to_string(), "0-3");
}

/// With `--share-package`, CPUs going offline move only the vCPUs the engine had chosen them
/// for: the fresh engine is told each vCPU's own CPU, not its thread's shared set.
#[test]
fn sharing_vcpus_keep_their_cpus_when_other_cpus_go_offline() {
    let host = host_with_one_qemu("daemon-hotplug-share");
    std::fs::write(&host.roots.cpu_online, "0-3\n").unwrap();
    // The idle vCPUs sit on CPUs 1 and 0 (package 0, where powersaving packs them); from
    // scratch the engine would choose otherwise for vCPU 0.
    let mut executor = RecordingExecutor::new();
    for (tid, cpu) in [(110, 1), (111, 0)] {
        executor.apply(tid, &CpuSet::single(cpu)).unwrap();
    }
    let mut d = HostDaemon::with_executor(
        HostConfig {
            share_package: true,
            ..config(&host, "powersaving")
        },
        None,
        Box::new(executor),
    )
    .unwrap();
    d.tick().unwrap();
    let homes = |d: &HostDaemon| -> Vec<u32> {
        let mut h: Vec<(VcpuId, u32)> = d.host.homes.iter().map(|(&id, &cpu)| (id, cpu)).collect();
        h.sort_unstable_by_key(|&(id, _)| id.vcpu);
        h.into_iter().map(|(_, cpu)| cpu).collect()
    };
    assert_eq!(homes(&d), [1, 0]);
    assert_eq!(d.host.threads.applied(110), Some(&CpuSet::range(0, 1)));
    // Package 1 goes offline: no vCPU was there, none moves.
    std::fs::write(&host.roots.cpu_online, "0-1\n").unwrap();
    d.tick().unwrap();
    assert_eq!(d.host.config().topology.cpu_set().to_string(), "0-1");
    assert_eq!(homes(&d), [1, 0]);
}

#[test]
fn a_second_daemon_on_the_same_directory_is_refused() {
    let host = FakeHost::new("lock");
    let dir = host.roots.proc.parent().unwrap().join("run");
    let _first = lock(&dir).unwrap();
    assert!(matches!(lock(&dir), Err(HostError::AlreadyRunning(_))));
}

/// An executor the test can also act through, as an operator's `taskset` would.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<RecordingExecutor>>);

impl Executor for Shared {
    fn apply(&mut self, tid: i32, cpus: &CpuSet) -> Result<(), pvmm_scheduler::ExecutorError> {
        self.0.lock().unwrap().apply(tid, cpus)
    }
    fn read(&self, tid: i32) -> Result<CpuSet, pvmm_scheduler::ExecutorError> {
        self.0.lock().unwrap().read(tid)
    }
}

impl Shared {
    fn now(&self, tid: i32) -> CpuSet {
        self.0.lock().unwrap().current()[&tid].clone()
    }
}

/// The latest status's vCPU `vcpu` of the only VM.
fn vcpu_status(d: &HostDaemon, vcpu: u32) -> pvmm_api::stats::HostVcpu {
    let status = d.host.status.latest().lock().unwrap().clone().unwrap();
    status.vms[0].vcpus[vcpu as usize].clone()
}

#[test]
fn an_operators_pin_is_left_alone_until_widened_and_a_cpuset_never_left() {
    let host = FakeHost::new("operator");
    host.process(
        100,
        &[(100, "qemu"), (110, "CPU 0/KVM"), (111, "CPU 1/KVM")],
        &[
            (3, "anon_inode:kvm-vm"),
            (4, "anon_inode:kvm-vcpu:0"),
            (5, "anon_inode:kvm-vcpu:1"),
        ],
    );
    // vCPU 1's cgroup allows CPUs 2-3 only (package 1).
    let task = host.roots.proc.join("100/task/111");
    std::fs::write(task.join("cgroup"), "3:cpuset:/machine/vm/vcpu1\n").unwrap();
    let cg = host.roots.cgroup.join("cpuset/machine/vm/vcpu1");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cpuset.effective_cpus"), "2-3\n").unwrap();
    let shared = Shared::default();
    let config = config(&host, "powersaving");
    let mut d = HostDaemon::with_executor(config, None, Box::new(shared.clone())).unwrap();
    let package0 = CpuSet::range(0, 1);
    let package1 = CpuSet::range(2, 3);
    for _ in 0..3 {
        d.tick().unwrap();
    }
    assert!(shared.now(110).is_subset(&package0), "{}", shared.now(110));
    assert!(
        shared.now(111).is_subset(&package1),
        "within its cpuset: {}",
        shared.now(111)
    );
    assert!(!vcpu_status(&d, 0).pinned);
    // An operator pins vCPU 0 to CPU 3.
    shared
        .0
        .lock()
        .unwrap()
        .apply(110, &CpuSet::single(3))
        .unwrap();
    for _ in 0..3 {
        d.tick().unwrap();
    }
    assert_eq!(
        shared.now(110),
        CpuSet::single(3),
        "left where the operator put it"
    );
    let v0 = vcpu_status(&d, 0);
    assert!(v0.pinned);
    assert_eq!(
        v0.cpus,
        Some(CpuSet::single(3)),
        "its load counted where it runs"
    );
    assert_eq!(d.tick.totals().apply_errors, 0);
    // Widened to every CPU again: the daemon takes it back.
    shared
        .0
        .lock()
        .unwrap()
        .apply(110, &CpuSet::range(0, 3))
        .unwrap();
    for _ in 0..3 {
        d.tick().unwrap();
    }
    assert!(!vcpu_status(&d, 0).pinned);
    assert!(
        shared.now(110).len() == 1,
        "placed again: {}",
        shared.now(110)
    );
    assert!(shared.now(111).is_subset(&package1));
}
