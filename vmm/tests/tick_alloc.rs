//! pvmm's live tick allocates nothing once warm: a counting global allocator counts the heap
//! allocations of the test's own thread while it runs scheduler ticks in the configuration a
//! VM runs (a managed policy, `--stats`, a control socket, CPPC publishing, pvmm's own threads,
//! the host's online CPUs watched), with loads that keep the engine moving vCPUs.
//!
//! The counter ([`pvmm_testutil::alloc_count`]) is per thread, so the test harness's other
//! threads do not disturb it; this file holds one test, so the process's thread list (which
//! the tick reads) stays the same too.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvmm::config::PlacementPolicy;
use pvmm::live::capacity::CppcReporter;
use pvmm::live::control::{ExternalAssignment, PlacementControl};
use pvmm::live::idle::{IdleError, IdleSource};
use pvmm::live::scheduler::{LiveScheduler, LiveVcpu};
use pvmm_devices::cppc::CppcShared;
use pvmm_devices::events::GuestErrorCounter;
use pvmm_devices::ged::GedShared;
use pvmm_scheduler::{
    CpuSet, EngineConfig, Executor, ExecutorError, HostTopology, IdleSample, Policy,
};
use pvmm_testutil::alloc_count::{thread_allocations, CountingAllocator};
use pvmm_tick::hotplug::OnlineCpus;
use pvmm_tick::own_threads::OwnThreads;
use vmm_sys_util::eventfd::EventFd;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// A vCPU busy `permille` / 1000 of the time, changed by the test between ticks.
struct Scripted {
    permille: Arc<AtomicU32>,
    last_ns: u64,
    busy_ns: u64,
    idle_ns: u64,
}

impl IdleSource for Scripted {
    fn sample(&mut self, now_ns: u64) -> Result<IdleSample, IdleError> {
        let dt = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let busy = dt * u64::from(self.permille.load(Ordering::Relaxed)) / 1000;
        self.busy_ns += busy;
        self.idle_ns += dt - busy;
        Ok(IdleSample {
            t_ns: now_ns,
            busy_ns: self.busy_ns,
            idle_ns: self.idle_ns,
        })
    }
}

/// Records affinity changes into room reserved up front, so that recording allocates nothing.
struct Recorder {
    calls: Arc<Mutex<Vec<(i32, CpuSet)>>>,
}

impl Executor for Recorder {
    fn apply(&mut self, tid: i32, cpus: &CpuSet) -> Result<(), ExecutorError> {
        if let Ok(mut calls) = self.calls.lock() {
            assert!(calls.len() < calls.capacity(), "recorder full");
            calls.push((tid, cpus.clone()));
        }
        Ok(())
    }

    fn read(&self, tid: i32) -> Result<CpuSet, ExecutorError> {
        Err(ExecutorError::Unknown { tid })
    }
}

/// `--stats` output: the last line only, in room reserved up front.
struct LastLine {
    line: Arc<Mutex<Vec<u8>>>,
    ended: bool,
}

impl Write for LastLine {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut line = self.line.lock().map_err(|_| std::io::ErrorKind::Other)?;
        if std::mem::take(&mut self.ended) {
            line.clear();
        }
        assert!(
            line.len() + b.len() <= line.capacity(),
            "stats line too long"
        );
        line.extend_from_slice(b);
        self.ended = b.ends_with(b"\n");
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const VCPUS: u32 = 8;
/// Ticks of one load cycle: a light load for half of it (two busy vCPUs, which powersaving
/// packs onto one package), a heavy one for the other half (every vCPU busy: both packages).
const CYCLE: u32 = 12;

fn set_loads(loads: &[Arc<AtomicU32>], tick: u32) {
    let heavy = tick % CYCLE >= CYCLE / 2;
    for (i, l) in loads.iter().enumerate() {
        let busy = heavy || i < 2;
        l.store(if busy { 950 } else { 10 }, Ordering::Relaxed);
    }
}

/// What a run of ticks under one policy did once warm.
struct Run {
    allocations: u64,
    affinity_changes: usize,
    ticks: u32,
}

/// Runs a scheduler under `policy` with every part a VM's has, counting the allocations of
/// its warm ticks; with `outside`, an outside balancer places the vCPUs (its lease renewed
/// between the warm-up and the counted ticks).
fn run(policy: PlacementPolicy, outside: Option<&[ExternalAssignment]>, dir: &Path) -> Run {
    let online = dir.join("online");
    std::fs::write(&online, "0-7\n").unwrap();
    let topology = HostTopology::from_spec("2x4x1").unwrap();
    let loads: Vec<Arc<AtomicU32>> = (0..VCPUS).map(|_| Arc::new(AtomicU32::new(0))).collect();
    let vcpus = loads
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let source = Scripted {
                permille: l.clone(),
                last_ns: 0,
                busy_ns: 0,
                idle_ns: 0,
            };
            LiveVcpu::new(i as u32, 100_000 + i as i32, Box::new(source))
        })
        .collect();
    let calls = Arc::new(Mutex::new(Vec::with_capacity(100_000)));
    let line = Arc::new(Mutex::new(Vec::with_capacity(1 << 20)));
    let control = Arc::new(PlacementControl::new(Duration::from_secs(3)));
    let cppc = Arc::new(CppcShared::new(VCPUS, pvmm::cppc::CPPC_HIGHEST_PERF));
    let ged = Arc::new(GedShared::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    let mut s = LiveScheduler::new(
        policy,
        topology.clone(),
        EngineConfig {
            ramp_down_window_ms: 0,
            max_migrations_per_vcpu_per_s: 1000,
            demand_half_life_ms: 0,
            share_package: false,
        },
        Box::new(Recorder {
            calls: calls.clone(),
        }),
        vcpus,
        Some(Box::new(LastLine {
            line: line.clone(),
            ended: false,
        })),
    )
    .with_control(control.clone())
    .with_own_threads(OwnThreads::new(Vec::new()))
    .with_guest_errors(Arc::new(GuestErrorCounter::default()))
    .with_capacity_reporter(Box::new(CppcReporter::new(cppc, ged, Box::new(|| true))))
    .with_online_cpus(OnlineCpus::watch(topology, online).unwrap());

    let mut tick = |t: u32| {
        set_loads(&loads, t);
        let start = Instant::now();
        s.tick().unwrap();
        // Ticks some milliseconds apart, so that utilization follows the loads.
        std::thread::sleep(Duration::from_millis(4).saturating_sub(start.elapsed()));
    };
    const WARM: u32 = 3 * CYCLE;
    const MEASURED: u32 = 5 * CYCLE;
    if let Some(a) = outside {
        control.set_external(a.to_vec());
    }
    for t in 0..WARM {
        tick(t);
    }
    if let Some(a) = outside {
        control.set_external(a.to_vec());
        tick(WARM);
    }
    let changes_before = calls.lock().unwrap().len();
    let before = thread_allocations();
    for t in WARM..WARM + MEASURED {
        // The test's own steps (sleeping, the loads) allocate nothing: what is counted is the
        // tick's.
        tick(t);
    }
    let allocations = thread_allocations() - before;
    let affinity_changes = calls.lock().unwrap().len() - changes_before;

    let text = String::from_utf8(line.lock().unwrap().clone()).unwrap();
    let stats: pvmm_api::stats::VmStats = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(stats.vcpus.len(), VCPUS as usize);
    assert_eq!(control.snapshot(), Some(stats));
    Run {
        allocations,
        affinity_changes,
        ticks: MEASURED,
    }
}

#[test]
fn a_warm_tick_allocates_nothing() {
    let dir = std::env::temp_dir().join(format!("pvmm-tick-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policies = [
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
        Policy::Balance,
        Policy::Performance,
    ]
    .map(PlacementPolicy::Managed)
    .into_iter()
    .chain([PlacementPolicy::None]);
    for policy in policies {
        let r = run(policy, None, &dir);
        assert_eq!(
            r.allocations, 0,
            "{policy}: {} warm ticks allocated {} times ({} affinity changes)",
            r.ticks, r.allocations, r.affinity_changes
        );
        // The default policy packs the light load onto one package and spreads the heavy
        // one: the warm ticks move vCPUs.
        if policy == PlacementPolicy::default() {
            assert!(
                r.affinity_changes >= 8,
                "the loads should have moved vCPUs: {} affinity changes",
                r.affinity_changes
            );
        }
    }
    // An outside balancer's assignments, one of them a CPU set that is not one range.
    let outside: Vec<ExternalAssignment> = (0..VCPUS)
        .map(|vcpu| ExternalAssignment {
            vcpu,
            cpus: if vcpu == 0 {
                "0,2".parse().unwrap()
            } else {
                CpuSet::single(vcpu % 8)
            },
            capacity: 512,
        })
        .collect();
    let r = run(PlacementPolicy::default(), Some(&outside), &dir);
    assert_eq!(
        r.allocations, 0,
        "outside placement: {} warm ticks allocated {} times",
        r.ticks, r.allocations
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
