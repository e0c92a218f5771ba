//! The live scheduler: every tick, read each vCPU's idle signal, turn it into utilization,
//! run the scheduler crate's placement engine (the same code `pvmm-sim` runs), apply the
//! placement to the vCPU threads with `sched_setaffinity`, and report.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvmm_devices::events::GuestErrorCounter;
use pvmm_scheduler::capacity::{group_capacity, CAPACITY_SCALE};
use pvmm_scheduler::{
    CpuSet, Decision, Engine, EngineConfig, Executor, HostTopology, LoadTracker, PlaceError,
    UtilConfig, VcpuId, VcpuLoad,
};
use serde_json::json;

use super::capacity::CapacityReporter;
use super::control::{ExternalAssignment, ExternalState, PlacementControl};
use super::hoststat::{idle_share, read_proc_stat, CpuTimes};
use super::hotplug::OnlineCpus;
use super::idle::IdleSource;
use super::own_threads::OwnThreads;
use crate::config::PlacementPolicy;
use crate::procfs::last_cpu_of_thread;
use crate::seccomp::{SeccompFilters, ThreadKind};

/// The single VM a `pvmm` process runs is VM 0 in the engine's numbering.
const THIS_VM: u32 = 0;

/// Errors of the live scheduler.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The engine refused the input (a pvmm bug).
    #[error("placement engine: {0}")]
    Engine(#[from] PlaceError),
    /// Applying affinity failed.
    #[error("applying placement: {0}")]
    Apply(#[from] pvmm_scheduler::ExecutorError),
}

/// One vCPU as the live scheduler sees it.
pub struct LiveVcpu {
    /// vCPU index.
    pub index: u32,
    /// Thread id.
    pub tid: i32,
    /// Its idle signal.
    pub source: Box<dyn IdleSource>,
    tracker: LoadTracker,
    last_cpus: Option<CpuSet>,
    package: Option<u32>,
    capacity: u32,
}

impl LiveVcpu {
    /// A vCPU with a fresh utilization tracker.
    pub fn new(index: u32, tid: i32, source: Box<dyn IdleSource>) -> Self {
        Self {
            index,
            tid,
            source,
            tracker: LoadTracker::new(UtilConfig::default()),
            last_cpus: None,
            package: None,
            capacity: CAPACITY_SCALE,
        }
    }
}

/// Running totals, readable by the VMM's main thread for the exit summary.
#[derive(Debug, Clone, Default)]
pub struct PlacementTotals {
    /// Ticks run.
    pub ticks: u64,
    /// Moves of vCPUs between CPUs (initial placements excluded).
    pub migrations: u64,
    /// Affinity changes the host refused.
    pub apply_errors: u64,
    /// Policy changes asked for at run time (control socket).
    pub policy_changes: u64,
}

/// The live scheduler of one VM.
pub struct LiveScheduler {
    policy: PlacementPolicy,
    topology: HostTopology,
    engine_config: EngineConfig,
    engine: Option<Engine>,
    /// Whether an outside balancer placed the vCPUs at the last tick.
    external: bool,
    control: Option<Arc<PlacementControl>>,
    own_threads: Option<OwnThreads>,
    executor: Box<dyn Executor + Send>,
    vcpus: Vec<LiveVcpu>,
    start: Instant,
    stats: Option<Box<dyn Write + Send>>,
    totals: Arc<Mutex<PlacementTotals>>,
    host_stat_at_start: Vec<(u32, CpuTimes)>,
    capacity: Option<Box<dyn CapacityReporter>>,
    guest_errors: Option<Arc<GuestErrorCounter>>,
    /// Each package's capacity (SMT counted as the engine counts it), in package order.
    package_capacity: Vec<u32>,
    /// The host's online CPUs, when watched: the topology follows them.
    online: Option<OnlineCpus>,
}

impl LiveScheduler {
    /// Publishes every placement's effective capacities to the guest through `reporter`.
    pub fn with_capacity_reporter(mut self, reporter: Box<dyn CapacityReporter>) -> Self {
        self.capacity = Some(reporter);
        self
    }

    /// Takes policy changes and outside placement from `control`, and publishes each tick's
    /// snapshot there.
    pub fn with_control(mut self, control: Arc<PlacementControl>) -> Self {
        self.control = Some(control);
        self
    }

    /// Reports the guest's ignored device accesses, counted by `errors`, in every snapshot.
    pub fn with_guest_errors(mut self, errors: Arc<GuestErrorCounter>) -> Self {
        self.guest_errors = Some(errors);
        self
    }

    /// Follows host CPUs going offline and coming back ([`super::hotplug`]).
    pub fn with_online_cpus(mut self, online: OnlineCpus) -> Self {
        self.online = Some(online);
        self
    }

    /// Keeps pvmm's own threads on the lowest-numbered package that holds vCPUs.
    pub fn with_own_threads(mut self, own: OwnThreads) -> Self {
        self.own_threads = Some(own);
        self
    }

    /// A scheduler for `vcpus` on `topology`.
    pub fn new(
        policy: PlacementPolicy,
        topology: HostTopology,
        engine_config: EngineConfig,
        executor: Box<dyn Executor + Send>,
        vcpus: Vec<LiveVcpu>,
        stats: Option<Box<dyn Write + Send>>,
    ) -> Self {
        Self {
            engine: make_engine(policy, &topology, &engine_config),
            package_capacity: package_capacities(&topology),
            policy,
            topology,
            engine_config,
            external: false,
            control: None,
            own_threads: None,
            executor,
            vcpus,
            start: Instant::now(),
            stats,
            totals: Arc::new(Mutex::new(PlacementTotals::default())),
            host_stat_at_start: read_proc_stat(),
            capacity: None,
            guest_errors: None,
            online: None,
        }
    }

    /// Shared totals for the exit summary.
    pub fn totals(&self) -> Arc<Mutex<PlacementTotals>> {
        self.totals.clone()
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// One tick: sample, take control requests, place (pvmm's policy or an outside
    /// balancer's assignments), apply, publish capacities, report. Returns the engine's
    /// decision (None for the `none` policy and under outside placement).
    pub fn tick(&mut self) -> Result<Option<Decision>, LiveError> {
        let now_ns = self.now_ns();
        self.sample(now_ns);
        self.follow_online_cpus();
        if let Some(policy) = self.control.as_ref().and_then(|c| c.take_policy_request()) {
            self.set_policy(policy);
        }
        let who = match &self.control {
            Some(c) => c.external(Instant::now()),
            None => ExternalState::Own,
        };
        let (decision, (moved, apply_errors)) = match who {
            ExternalState::Active(assignments) => {
                self.external = true;
                (None, self.apply_external(&assignments))
            }
            own => {
                if own == ExternalState::Expired {
                    eprintln!(
                        "pvmm: external placement lease expired; placing under policy {} again",
                        self.policy
                    );
                }
                if std::mem::take(&mut self.external) {
                    // The engine's view of where vCPUs are is stale: start it afresh, from
                    // where the outside balancer left them.
                    self.restart_engine();
                }
                let decision = self.decide(now_ns)?;
                let counts = match &decision {
                    Some(d) => self.apply_decision(d),
                    None => {
                        self.follow_unpinned();
                        (0, 0)
                    }
                };
                (decision, counts)
            }
        };
        let own_errors = self.pin_own_threads();
        if let Some(reporter) = self.capacity.as_mut() {
            let capacities: Vec<u32> = self.vcpus.iter().map(|v| v.capacity).collect();
            reporter.publish(&capacities, Instant::now());
        }
        if let Ok(mut t) = self.totals.lock() {
            t.ticks += 1;
            t.migrations += moved;
            t.apply_errors += apply_errors + own_errors;
        }
        self.report(now_ns, moved);
        Ok(decision)
    }

    fn sample(&mut self, now_ns: u64) {
        for v in &mut self.vcpus {
            // A failed read leaves the previous utilization in place; the thread may be exiting.
            if let Ok(sample) = v.source.sample(now_ns) {
                v.tracker.update(sample, v.source.waited_ns());
            }
        }
    }

    fn decide(&mut self, now_ns: u64) -> Result<Option<Decision>, LiveError> {
        let Some(engine) = &mut self.engine else {
            return Ok(None);
        };
        let loads: Vec<VcpuLoad> = self
            .vcpus
            .iter()
            .map(|v| {
                v.tracker.load(VcpuId {
                    vm: THIS_VM,
                    vcpu: v.index,
                })
            })
            .collect();
        engine
            .place(now_ns / 1_000_000, &loads)
            .map(Some)
            .map_err(LiveError::Engine)
    }

    /// Applies the engine's decision; returns (moves, refused affinity changes).
    fn apply_decision(&mut self, d: &Decision) -> (u64, u64) {
        let mut counts = (0, 0);
        for (v, a) in self.vcpus.iter_mut().zip(&d.assignments) {
            pin_vcpu(v, &a.cpus, self.executor.as_mut(), &mut counts);
            v.package = Some(a.package);
            v.capacity = a.capacity;
        }
        counts
    }

    /// A fresh engine, told where each vCPU runs now, so that a vCPU already where the policy
    /// would put it does not move (a vCPU on a CPU outside the topology is placed anew).
    fn restart_engine(&mut self) {
        self.engine = make_engine(self.policy, &self.topology, &self.engine_config);
        if let Some(engine) = self.engine.as_mut() {
            for v in &self.vcpus {
                if let Some(cpu) = v.last_cpus.as_ref().and_then(single_cpu) {
                    engine.assume(
                        VcpuId {
                            vm: THIS_VM,
                            vcpu: v.index,
                        },
                        cpu,
                    );
                }
            }
        }
    }

    /// Places on the host CPUs that are online now, when they changed ([`super::hotplug`]):
    /// only the vCPUs of CPUs gone move, and a CPU that returns is used again.
    fn follow_online_cpus(&mut self) {
        if let Some(topology) = self.online.as_mut().and_then(|o| o.follow("pvmm")) {
            self.package_capacity = package_capacities(&topology);
            self.topology = topology;
            self.restart_engine();
        }
    }

    /// Applies an outside balancer's assignments; vCPUs they do not name stay as they are.
    fn apply_external(&mut self, assignments: &[ExternalAssignment]) -> (u64, u64) {
        let mut counts = (0, 0);
        for a in assignments {
            let Some(v) = self.vcpus.get_mut(a.vcpu as usize) else {
                continue;
            };
            pin_vcpu(v, &a.cpus, self.executor.as_mut(), &mut counts);
            v.package = a.cpus.first().and_then(|c| self.topology.package_of(c));
            v.capacity = a.capacity;
        }
        counts
    }

    /// Under `none`, reports where the host scheduler last ran each thread.
    fn follow_unpinned(&mut self) {
        for v in &mut self.vcpus {
            v.package = last_cpu_of_thread(v.tid).and_then(|c| self.topology.package_of(c));
        }
    }

    /// Switches policy at run time; `none` hands every thread back to the host scheduler.
    fn set_policy(&mut self, policy: PlacementPolicy) {
        if policy == self.policy {
            return;
        }
        self.policy = policy;
        self.engine = make_engine(policy, &self.topology, &self.engine_config);
        if let Ok(mut t) = self.totals.lock() {
            t.policy_changes += 1;
        }
        if policy == PlacementPolicy::None {
            let all = self.topology.cpu_set();
            for v in &mut self.vcpus {
                if self.executor.apply(v.tid, &all).is_ok() {
                    v.last_cpus = None;
                }
                v.capacity = CAPACITY_SCALE;
            }
            if let Some(own) = self.own_threads.as_mut() {
                own.pin(&all, self.executor.as_mut());
            }
        }
    }

    /// Keeps pvmm's own threads on the lowest-numbered package holding vCPUs, while pvmm (or
    /// an outside balancer) places the vCPUs. Returns refused affinity changes.
    fn pin_own_threads(&mut self) -> u64 {
        if self.policy == PlacementPolicy::None && !self.external {
            return 0;
        }
        let Some(own) = self.own_threads.as_mut() else {
            return 0;
        };
        let Some(home) = self.vcpus.iter().filter_map(|v| v.package).min() else {
            return 0;
        };
        let cpus = self.topology.package_cpus(home);
        if cpus.is_empty() {
            return 0;
        }
        own.pin(&cpus, self.executor.as_mut())
    }

    /// Writes this tick's snapshot to `--stats` and to the control socket's view.
    fn report(&mut self, now_ns: u64, moved: u64) {
        if self.stats.is_none() && self.control.is_none() {
            return;
        }
        let line = self.snapshot(now_ns, moved);
        if let Some(out) = self.stats.as_mut() {
            // A stats reader that went away must not stop the VM.
            if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                self.stats = None;
            }
        }
        if let Some(control) = &self.control {
            control.publish(line);
        }
    }

    /// The `--stats` line of this tick.
    fn snapshot(&self, now_ns: u64, moved: u64) -> serde_json::Value {
        let all_cpus = self.topology.cpu_set();
        let vcpus: Vec<_> = self
            .vcpus
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
                    "desired": self.capacity.as_ref().map(|r| r.guest_desired(v.index)),
                })
            })
            .collect();
        let packages: Vec<_> = self
            .topology
            .packages()
            .iter()
            .zip(&self.package_capacity)
            .map(|(p, &capacity)| {
                let on: Vec<&LiveVcpu> = self
                    .vcpus
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
        let totals = self.totals.lock().map(|t| t.clone()).unwrap_or_default();
        json!({
            "t_ms": now_ns / 1_000_000,
            "policy": self.policy.to_string(),
            "external": self.external,
            "vcpus": vcpus,
            "packages": packages,
            "migrations": moved,
            "migrations_total": totals.migrations,
            "policy_changes": totals.policy_changes,
            "capacity_notifications": self.capacity.as_ref().map(|r| r.notifications()),
            "cppc_enabled": self.capacity.as_ref().map(|r| r.guest_enabled()),
            "guest_register_errors": self.guest_errors.as_ref().map(|e| e.total()),
        })
    }

    /// Runs ticks every `tick` on a thread named `pvmm-sched`, confined by the scheduler
    /// seccomp filter, until `stop` receives or is dropped.
    pub fn spawn(
        mut self,
        tick: Duration,
        stop: crossbeam::channel::Receiver<()>,
        seccomp: Arc<SeccompFilters>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("pvmm-sched".into())
            .spawn(move || {
                seccomp.confine(ThreadKind::Scheduler);
                let mut next = Instant::now() + tick;
                loop {
                    let wait = next.saturating_duration_since(Instant::now());
                    if !matches!(
                        stop.recv_timeout(wait),
                        Err(crossbeam::channel::RecvTimeoutError::Timeout)
                    ) {
                        return;
                    }
                    next += tick;
                    if let Err(e) = self.tick() {
                        eprintln!("pvmm: scheduler stopped: {e}");
                        return;
                    }
                }
            })
    }

    /// The one-line exit summary: policy, migrations, and how idle each package really was
    /// (host /proc/stat over the run).
    pub fn summary_line(
        policy: PlacementPolicy,
        topology: &HostTopology,
        totals: &PlacementTotals,
        host_stat_at_start: &[(u32, CpuTimes)],
        elapsed: Duration,
    ) -> String {
        let now = read_proc_stat();
        let idle: Vec<String> = topology
            .packages()
            .iter()
            .map(|p| {
                match idle_share(host_stat_at_start, &now, topology.package_cpus(p.id).iter()) {
                    Some(s) => format!("package {} {:.1} %", p.id, s * 100.0),
                    None => format!("package {} n/a", p.id),
                }
            })
            .collect();
        format!(
            "placement summary: policy {policy}, {} migrations in {:.1} s ({} ticks); host idle: {}",
            totals.migrations,
            elapsed.as_secs_f64(),
            totals.ticks,
            idle.join(", ")
        )
    }

    /// /proc/stat at start, for the summary.
    pub fn host_stat_at_start(&self) -> Vec<(u32, CpuTimes)> {
        self.host_stat_at_start.clone()
    }
}

/// Each package's capacity (SMT counted as the engine counts it), in package order.
fn package_capacities(topology: &HostTopology) -> Vec<u32> {
    topology
        .packages()
        .iter()
        .map(|p| group_capacity(topology, &topology.package_cpus(p.id)).capacity)
        .collect()
}

fn make_engine(
    policy: PlacementPolicy,
    topology: &HostTopology,
    config: &EngineConfig,
) -> Option<Engine> {
    match policy {
        PlacementPolicy::None => None,
        PlacementPolicy::Managed(p) => Some(Engine::new(topology.clone(), p, *config)),
    }
}

/// Restricts `v`'s thread to `cpus` if it is not there yet, counting (moves, refusals).
fn pin_vcpu(v: &mut LiveVcpu, cpus: &CpuSet, executor: &mut dyn Executor, counts: &mut (u64, u64)) {
    if v.last_cpus.as_ref() == Some(cpus) {
        return;
    }
    match executor.apply(v.tid, cpus) {
        Ok(()) => {
            if v.last_cpus.is_some() {
                counts.0 += 1;
            }
            v.last_cpus = Some(cpus.clone());
        }
        Err(_) => counts.1 += 1,
    }
}

/// The one CPU of `cpus`, if it holds exactly one.
fn single_cpu(cpus: &CpuSet) -> Option<u32> {
    (cpus.len() == 1).then(|| cpus.first()).flatten()
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(text.lines().count(), 3);
        let vcpus = last["vcpus"].as_array().unwrap();
        assert_eq!(vcpus.len(), 4);
        for v in vcpus {
            assert_eq!(v["package"], 0, "{last}");
            assert!(v["capacity"].as_u64().unwrap() >= 1);
        }
        assert_eq!(last["packages"][1]["active"], false);
        assert_eq!(last["packages"][0]["active"], true);
    }

    /// A host CPU going offline moves only the vCPU that was on it, onto CPUs still online;
    /// when the CPU comes back it is used again.
    #[test]
    fn vcpus_leave_a_cpu_going_offline_and_use_it_again_when_it_returns() {
        let dir = std::env::temp_dir().join(format!("pvmm-hotplug-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let online = dir.join("online");
        std::fs::write(&online, "0-3\n").unwrap();
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
            s.vcpus
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
        assert!(s.vcpus.iter().all(|v| v.last_cpus.as_ref() == Some(&one)));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!control.external_active());
        let before = s.totals.lock().unwrap().migrations;
        for _ in 0..3 {
            let decision = s.tick().unwrap().expect("pvmm places again");
            assert!(decision.migrations.is_empty(), "{:?}", decision.migrations);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(s.totals.lock().unwrap().migrations, before);
        assert!(s.vcpus.iter().all(|v| v.last_cpus.as_ref() == Some(&one)));
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
        let demand: f64 = s
            .vcpus
            .iter()
            .map(|v| f64::from(v.tracker.util().util()))
            .sum();
        assert!(demand > 0.0, "{snap}");
        let util = snap["packages"][0]["util"].as_f64().unwrap();
        assert!(
            (util - round3(demand / (2.0 * 1178.0))).abs() < 1e-9,
            "{snap}"
        );
        assert_eq!(snap["guest_register_errors"], 1);
    }
}
