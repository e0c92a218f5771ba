//! Tests of the live scheduler.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use super::*;
use crate::live::control::ExternalAssignment;
use pvmm_api::stats::round3;
use pvmm_scheduler::{IdleSample, Policy, RecordingExecutor};

struct Scripted {
    busy_fraction: f64,
}

/// `n` vCPUs on threads `first_tid..`, each busy `busy_fraction` of the time.
fn scripted_vcpus(n: u32, first_tid: i32, busy_fraction: f64) -> Vec<LiveVcpu> {
    (0..n)
        .map(|i| {
            LiveVcpu::new(
                i,
                first_tid + i as i32,
                Box::new(Scripted { busy_fraction }),
            )
        })
        .collect()
}
impl IdleSource for Scripted {
    fn sample(&mut self, now_ns: u64) -> Result<IdleSample, super::super::idle::IdleError> {
        let busy = (now_ns as f64 * self.busy_fraction) as u64;
        Ok(IdleSample {
            t_ns: now_ns,
            busy_ns: busy,
            idle_ns: now_ns - busy,
        })
    }
}

#[test]
fn idle_vcpus_are_packed_and_reported() {
    let topo = HostTopology::from_spec("2x2x1").unwrap();
    let vcpus = scripted_vcpus(4, 1000, 0.0);
    let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut s = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Powersaving { level: 1 }),
        topo,
        EngineConfig {
            ramp_down_window_ms: 0,
            ..Default::default()
        },
        Box::new(RecordingExecutor::new()),
        vcpus,
        Some(Box::new(Shared(buf.clone()))),
    );
    for _ in 0..3 {
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
    let last: pvmm_api::stats::VmStats =
        serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert_eq!(last.vcpus.len(), 4);
    for v in &last.vcpus {
        assert_eq!(v.package, Some(0), "{last:?}");
        assert!(v.capacity >= 1);
    }
    assert!(!last.packages[1].active);
    assert!(last.packages[0].active);
}

/// A fresh directory named after `name` holding a sysfs-like `online` file listing `cpus`:
/// (the directory, the file).
fn online_file(name: &str, cpus: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("pvmm-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let online = dir.join("online");
    std::fs::write(&online, format!("{cpus}\n")).unwrap();
    (dir, online)
}

/// A host CPU going offline moves only the vCPU that was on it, onto CPUs still online;
/// when the CPU comes back it is used again.
#[test]
fn vcpus_leave_a_cpu_going_offline_and_use_it_again_when_it_returns() {
    let (dir, online) = online_file("hotplug", "0-3");
    let topo = HostTopology::from_spec("2x2x1").unwrap();
    let vcpus = scripted_vcpus(4, 5000, 1.0);
    let mut s = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Performance),
        topo.clone(),
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        vcpus,
        None,
    )
    .with_online_cpus(OnlineCpus::watch(topo, online.clone()).unwrap());
    let placed = |s: &LiveScheduler| -> Vec<CpuSet> {
        s.vm.vcpus
            .iter()
            .map(|v| v.last_cpus.clone().unwrap())
            .collect()
    };
    for _ in 0..3 {
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let before = placed(&s);
    let used: CpuSet = before.iter().flat_map(|c| c.iter()).collect();
    assert_eq!(used.to_string(), "0-3", "{before:?}");

    std::fs::write(&online, "0-1,3\n").unwrap();
    s.tick().unwrap();
    let after = placed(&s);
    for (was, now) in before.iter().zip(&after) {
        assert!(!now.contains(2), "{after:?}");
        if !was.contains(2) {
            assert_eq!(
                was, now,
                "only the vCPU of CPU 2 moves: {before:?} -> {after:?}"
            );
        }
    }

    std::fs::write(&online, "0-3\n").unwrap();
    for _ in 0..3 {
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let back = placed(&s);
    let used: CpuSet = back.iter().flat_map(|c| c.iter()).collect();
    assert_eq!(used.to_string(), "0-3", "{back:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// When an outside balancer's lease lapses, pvmm's own engine starts from where the
/// balancer left the vCPUs: idle vCPUs it left together on CPU 1 (package 0, where
/// powersaving would keep them) stay; an engine starting from nothing would move them all
/// to CPU 0, its first fit.
#[test]
fn taking_over_from_a_lapsed_balancer_moves_nothing_needlessly() {
    let topo = HostTopology::from_spec("2x2x1").unwrap();
    let vcpus = scripted_vcpus(4, 3000, 0.0);
    let control = Arc::new(PlacementControl::new(Duration::from_millis(20)));
    let mut s = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Powersaving { level: 1 }),
        topo,
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        vcpus,
        None,
    )
    .with_control(control.clone());
    let one = CpuSet::single(1);
    control.set_external(
        (0..4)
            .map(|vcpu| ExternalAssignment {
                vcpu,
                cpus: one.clone(),
                capacity: 256,
            })
            .collect(),
    );
    s.tick().unwrap();
    assert!(s
        .vm
        .vcpus
        .iter()
        .all(|v| v.last_cpus.as_ref() == Some(&one)));
    std::thread::sleep(Duration::from_millis(40));
    assert!(!control.external_active());
    let before = s.totals.lock().unwrap().migrations;
    for _ in 0..3 {
        let decision = s.tick().unwrap().expect("pvmm places again");
        assert!(decision.migrations.is_empty(), "{:?}", decision.migrations);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.totals.lock().unwrap().migrations, before);
    assert!(s
        .vm
        .vcpus
        .iter()
        .all(|v| v.last_cpus.as_ref() == Some(&one)));
}

/// A lease ends on the clock the stats report: the first tick that pvmm places itself is the
/// first at or after the latest renewal (`external_renewed_ms`) plus the lease, both in
/// `t_ms`; the tick before it was still the balancer's.
#[test]
fn a_lease_ends_on_the_stats_clock() {
    const LEASE_MS: u64 = 20;
    let topo = HostTopology::from_spec("2x2x1").unwrap();
    let control = Arc::new(PlacementControl::new(Duration::from_millis(LEASE_MS)));
    let mut s = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Powersaving { level: 1 }),
        topo,
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        scripted_vcpus(2, 3000, 0.0),
        None,
    )
    .with_control(control.clone());
    s.tick().unwrap();
    let own = control.snapshot().unwrap();
    assert!(!own.external);
    assert_eq!(own.external_renewed_ms, None, "no balancer yet");
    control.set_external(vec![ExternalAssignment {
        vcpu: 0,
        cpus: CpuSet::single(1),
        capacity: 512,
    }]);
    let mut lines = Vec::new();
    for _ in 0..100 {
        s.tick().unwrap();
        let line = control.snapshot().unwrap();
        let lapsed = !line.external;
        lines.push(line);
        if lapsed {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (last, held) = lines.split_last().unwrap();
    assert!(!last.external, "the lease never ended: {lines:?}");
    let renewed = last
        .external_renewed_ms
        .expect("the renewal stays reported");
    assert!(last.t_ms >= renewed + LEASE_MS, "{last:?}");
    let before = held.last().expect("the balancer held at least one tick");
    assert!(
        before.external && before.t_ms <= renewed + LEASE_MS,
        "{before:?}"
    );
    assert!(last.boot_ms >= before.boot_ms && before.boot_ms > 0);
}

/// A package's util is its vCPUs' demand over its capacity, SMT counted as the engine
/// counts it (two busy siblings are 1178, not 2048); guest mistakes are reported.
#[test]
fn package_util_is_over_its_capacity() {
    use pvmm_devices::events::GuestEvents as _;
    let topo = HostTopology::from_spec("1x2x2").unwrap();
    let vcpus = scripted_vcpus(4, 2000, 1.0);
    let errors = Arc::new(GuestErrorCounter::default());
    let mut s = LiveScheduler::new(
        PlacementPolicy::default(),
        topo,
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        vcpus,
        None,
    )
    .with_guest_errors(errors.clone());
    for _ in 0..3 {
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    errors.unclaimed_access(0x80);
    let snap = s.snapshot(s.now_ns(), 0);
    let demand: f64 =
        s.vm.vcpus
            .iter()
            .map(|v| f64::from(v.tracker.util().util()))
            .sum();
    assert!(demand > 0.0, "{snap:?}");
    let util = snap.packages[0].util;
    assert!(
        (util - round3(demand / (2.0 * 1178.0))).abs() < 1e-9,
        "{snap:?}"
    );
    assert_eq!(snap.guest_register_errors, Some(1));
}

/// The snapshot as `serde_json` renders it from a `Value` tree of the same fields: the text
/// the reused-buffer writer must reproduce byte for byte.
fn reference_snapshot(s: &LiveScheduler, now_ns: u64, moved: u64) -> String {
    use serde_json::json;
    let all_cpus = s.tick.topology().cpu_set();
    let vcpus: Vec<_> =
        s.vm.vcpus
            .iter()
            .map(|v| {
                json!({
                    "vcpu": v.index,
                    "tid": v.tid,
                    "util": round3(f64::from(v.tracker.util().util()) / f64::from(CAPACITY_SCALE)),
                    "busy": v.tracker.util().is_busy(),
                    "waited": round3(f64::from(v.tracker.waited()) / f64::from(CAPACITY_SCALE)),
                    "cpus": v.last_cpus.as_ref().unwrap_or(&all_cpus).to_string(),
                    "package": v.package,
                    "capacity": v.capacity,
                    "desired": s.vm.capacity.as_ref().map(|r| r.guest_desired(v.index)),
                })
            })
            .collect();
    let packages: Vec<_> = s
        .tick
        .topology()
        .packages()
        .iter()
        .zip(s.tick.package_capacity())
        .map(|(p, &capacity)| {
            let on: Vec<&LiveVcpu> =
                s.vm.vcpus
                    .iter()
                    .filter(|v| v.package == Some(p.id))
                    .collect();
            let demand: u32 = on.iter().map(|v| v.tracker.util().util()).sum();
            json!({
                "id": p.id,
                "util": round3(f64::from(demand) / f64::from(capacity.max(1))),
                "active": !on.is_empty(),
            })
        })
        .collect();
    let totals = s.totals.lock().unwrap().clone();
    json!({
        "t_ms": now_ns / 1_000_000,
        "boot_ms": (s.vm.boot_at_start_ns + now_ns) / 1_000_000,
        "policy": s.tick.policy().to_string(),
        "external": s.tick.outside(),
        "external_renewed_ms": s.vm.external_copy.renewed.map(|at| s.vm.since_start_ns(at) / 1_000_000),
        "vcpus": vcpus,
        "packages": packages,
        "migrations": moved,
        "migrations_total": totals.migrations,
        "policy_changes": totals.policy_changes,
        "capacity_notifications": s.vm.capacity.as_ref().map(|r| r.notifications()),
        "cppc_enabled": s.vm.capacity.as_ref().map(|r| r.guest_enabled()),
        "guest_register_errors": s.vm.guest_errors.as_ref().map(|e| e.total()),
        "housekeeping": round3(f64::from(s.vm.housekeeping_util) / f64::from(CAPACITY_SCALE)),
    })
    .to_string()
}

/// The snapshot text is what `serde_json` prints for the same values, byte for byte: with and
/// without CPPC and guest error counts, with vCPUs placed and not yet placed (no package, all
/// CPUs), under a managed policy and under `none`.
#[test]
fn the_snapshot_is_serde_jsons_text_byte_for_byte() {
    use crate::cppc::CPPC_HIGHEST_PERF;
    use crate::live::capacity::CppcReporter;
    use pvmm_devices::cppc::CppcShared;
    use pvmm_devices::ged::GedShared;
    use vmm_sys_util::eventfd::EventFd;
    let topo = HostTopology::from_spec("2x2x2").unwrap();
    let cppc = Arc::new(CppcShared::new(6, CPPC_HIGHEST_PERF));
    let ged = Arc::new(GedShared::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    let control = Arc::new(PlacementControl::new(Duration::from_secs(3)));
    let mut bare = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Powersaving { level: 2 }),
        topo.clone(),
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        scripted_vcpus(3, 700, 0.3),
        None,
    );
    let mut full = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Performance),
        topo,
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        scripted_vcpus(6, -3, 0.7),
        None,
    )
    .with_control(control.clone())
    .with_guest_errors(Arc::new(GuestErrorCounter::default()))
    .with_capacity_reporter(Box::new(CppcReporter::new(cppc, ged, Box::new(|| true))));
    let mut text = Vec::new();
    for s in [&mut bare, &mut full] {
        // Not placed yet: no package, every CPU.
        s.write_snapshot(&mut text, 1_234_567, 0);
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            reference_snapshot(s, 1_234_567, 0)
        );
        for _ in 0..3 {
            s.tick().unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
        let now = s.now_ns();
        s.write_snapshot(&mut text, now, 2);
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            reference_snapshot(s, now, 2)
        );
    }
    control.request_policy(PlacementPolicy::None);
    full.tick().unwrap();
    let now = full.now_ns();
    full.write_snapshot(&mut text, now, 0);
    assert_eq!(
        std::str::from_utf8(&text).unwrap(),
        reference_snapshot(&full, now, 0)
    );
    assert_eq!(control.snapshot().unwrap().policy, PlacementPolicy::None);
}

/// With `share_package`, the affinity pvmm applies to each packed vCPU thread is every CPU its
/// package uses; without it, one CPU each.
#[test]
fn shared_packages_are_applied_as_each_threads_affinity() {
    let topo = HostTopology::from_spec("2x4x1").unwrap();
    let applied = |share_package: bool| -> Vec<CpuSet> {
        let mut s = LiveScheduler::new(
            PlacementPolicy::Managed(Policy::Balance),
            topo.clone(),
            EngineConfig {
                share_package,
                ..Default::default()
            },
            Box::new(RecordingExecutor::new()),
            scripted_vcpus(3, 7000, 1.0),
            None,
        );
        // A tick's utilization is over the time since the last one: give the ticks the
        // engine's own period, so the vCPUs show as busy and are spread one to a CPU.
        for _ in 0..5 {
            s.tick().unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        s.vm.vcpus
            .iter()
            .map(|v| v.last_cpus.clone().unwrap())
            .collect()
    };
    let pinned = applied(false);
    assert!(pinned.iter().all(|c| c.len() == 1), "{pinned:?}");
    // Three busy vCPUs: a CPU each, all in package 0.
    let used: CpuSet = pinned.iter().flat_map(|c| c.iter()).collect();
    assert_eq!(used.len(), 3, "{pinned:?}");
    assert!(used.is_subset(&topo.package_cpus(0)), "{used}");
    let shared = applied(true);
    assert!(shared.iter().all(|c| *c == used), "{shared:?} vs {used}");
}

/// With `share_package`, a host CPU going offline still moves only the vCPU the engine had
/// chosen it for: a fresh engine is told each vCPU's own CPU, not its thread's shared set.
#[test]
fn sharing_vcpus_keep_their_cpus_when_another_goes_offline() {
    let (dir, online) = online_file("hotplug-share", "0-7");
    let topo = HostTopology::from_spec("2x4x1").unwrap();
    let mut s = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Balance),
        topo.clone(),
        EngineConfig {
            share_package: true,
            ..Default::default()
        },
        Box::new(RecordingExecutor::new()),
        scripted_vcpus(3, 7000, 1.0),
        None,
    )
    .with_online_cpus(OnlineCpus::watch(topo, online.clone()).unwrap());
    // Ticks at the engine's own period, so the vCPUs show as busy: a CPU each in package 0.
    for _ in 0..5 {
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let homes =
        |s: &LiveScheduler| -> Vec<u32> { s.vm.vcpus.iter().map(|v| v.home.unwrap()).collect() };
    let before = homes(&s);
    assert!(
        s.vm.vcpus
            .iter()
            .all(|v| v.last_cpus.as_ref().unwrap().len() == 3),
        "shared sets"
    );
    let gone = before[1];
    let mut left = CpuSet::range(0, 7);
    left.remove(gone);
    std::fs::write(&online, format!("{left}\n")).unwrap();
    s.tick().unwrap();
    let after = homes(&s);
    assert_ne!(after[1], gone, "{before:?} -> {after:?}");
    assert_eq!(
        (after[0], after[2]),
        (before[0], before[2]),
        "only the vCPU of CPU {gone} moves: {before:?} -> {after:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A busy device thread of pvmm's own is load on the package pvmm's threads are kept on: two
/// always-busy vCPUs fill a two-CPU package, so once `pvmm-blk0` runs there too, powersaving
/// moves vCPUs to the other package (one or both: how much CPU the spinning thread gets on a
/// shared test machine decides), and the snapshot reports the threads' CPU time.
#[test]
fn a_busy_device_thread_takes_room_from_the_vcpus() {
    let topo = HostTopology::from_spec("2x2x1").unwrap();
    let mut s = LiveScheduler::new(
        PlacementPolicy::Managed(Policy::Powersaving { level: 1 }),
        topo,
        EngineConfig::default(),
        Box::new(RecordingExecutor::new()),
        scripted_vcpus(2, 900, 1.0),
        None,
    )
    .with_own_threads(OwnThreads::new(Vec::new()).counting_load_of(&["pvmm-blk"]));
    let packages = |d: &Decision| -> Vec<u32> {
        let mut p: Vec<u32> = d.assignments.iter().map(|a| a.package).collect();
        p.sort_unstable();
        p
    };
    let d = s.tick().unwrap().expect("decided");
    assert_eq!(
        packages(d),
        [0, 0],
        "the first tick has no own-thread reading yet"
    );
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let device = std::thread::Builder::new()
        .name("pvmm-blk0".into())
        .spawn(move || {
            while let Err(std::sync::mpsc::TryRecvError::Empty) = stopped.try_recv() {
                std::hint::spin_loop();
            }
        })
        .unwrap();
    let started = Instant::now();
    let mut spread = false;
    while !spread && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        let d = s.tick().unwrap().expect("decided");
        spread = packages(d).contains(&1);
    }
    let snap = s.snapshot(s.now_ns(), 0);
    drop(stop);
    device.join().unwrap();
    assert!(spread, "{snap:?}");
    assert!(snap.housekeeping > 0.0, "{snap:?}");
}
