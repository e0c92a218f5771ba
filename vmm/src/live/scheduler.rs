//! The live scheduler: every tick, read each vCPU's idle signal, turn it into utilization,
//! run the scheduler crate's placement engine (the same code `pvmm-sim` runs), apply the
//! placement to the vCPU threads with `sched_setaffinity`, and report.

use std::io::Write;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvmm_scheduler::{
    CpuSet, Decision, Engine, EngineConfig, Executor, HostTopology, Policy, UtilConfig,
    UtilTracker, VcpuId, VcpuLoad,
};
use serde_json::json;

use super::capacity::CapacityReporter;
use super::hoststat::{idle_share, read_proc_stat, CpuTimes};
use super::idle::IdleSource;

/// Default placement tick: fast enough to spread a vCPU that turns busy within a few hundred
/// milliseconds, slow enough that reading stats and deciding costs well under 1 % of a CPU.
pub const DEFAULT_TICK_MS: u64 = 100;
/// Shortest tick accepted: below 10 ms the decayed utilization (32 ms half-life) barely moves
/// between decisions and affinity changes would outpace the host scheduler.
pub const MIN_TICK_MS: u64 = 10;
/// Longest tick accepted: one minute.
pub const MAX_TICK_MS: u64 = 60_000;
/// The single VM a `pvmm` process runs is VM 0 in the engine's numbering.
const THIS_VM: u32 = 0;

/// What pvmm does with vCPU threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementPolicy {
    /// Never pin: the host scheduler decides (the baseline users have today).
    None,
    /// Pin and migrate under a balancing policy.
    Managed(Policy),
}

impl Default for PlacementPolicy {
    /// `powersaving:1`: pvmm's reason to exist is packing an under-used guest onto few
    /// packages; level 1 does so without level 2's wake-up bias.
    fn default() -> Self {
        PlacementPolicy::Managed(Policy::Powersaving { level: 1 })
    }
}

impl FromStr for PlacementPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" {
            return Ok(PlacementPolicy::None);
        }
        Policy::from_str(s)
            .map(PlacementPolicy::Managed)
            .map_err(|e| e.to_string())
    }
}

impl std::fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlacementPolicy::None => f.write_str("none"),
            PlacementPolicy::Managed(p) => write!(f, "{p}"),
        }
    }
}

/// Errors of the live scheduler.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The engine refused the input (a pvmm bug).
    #[error("placement engine: {0}")]
    Engine(String),
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
    tracker: UtilTracker,
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
            tracker: UtilTracker::new(UtilConfig::default()),
            last_cpus: None,
            package: None,
            capacity: pvmm_scheduler::capacity::CAPACITY_SCALE,
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
}

/// The live scheduler of one VM.
pub struct LiveScheduler {
    policy: PlacementPolicy,
    topology: HostTopology,
    engine: Option<Engine>,
    executor: Box<dyn Executor + Send>,
    vcpus: Vec<LiveVcpu>,
    start: Instant,
    stats: Option<Box<dyn Write + Send>>,
    totals: Arc<Mutex<PlacementTotals>>,
    host_stat_at_start: Vec<(u32, CpuTimes)>,
    capacity: Option<Box<dyn CapacityReporter>>,
}

impl LiveScheduler {
    /// Publishes every placement's effective capacities to the guest through `reporter`.
    pub fn with_capacity_reporter(mut self, reporter: Box<dyn CapacityReporter>) -> Self {
        self.capacity = Some(reporter);
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
        let engine = match policy {
            PlacementPolicy::None => None,
            PlacementPolicy::Managed(p) => Some(Engine::new(topology.clone(), p, engine_config)),
        };
        Self {
            policy,
            topology,
            engine,
            executor,
            vcpus,
            start: Instant::now(),
            stats,
            totals: Arc::new(Mutex::new(PlacementTotals::default())),
            host_stat_at_start: read_proc_stat(),
            capacity: None,
        }
    }

    /// Shared totals for the exit summary.
    pub fn totals(&self) -> Arc<Mutex<PlacementTotals>> {
        self.totals.clone()
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// One tick: sample, place, apply, report. Returns the engine's decision (None for the
    /// `none` policy).
    pub fn tick(&mut self) -> Result<Option<Decision>, LiveError> {
        let now_ns = self.now_ns();
        for v in &mut self.vcpus {
            // A failed read leaves the previous utilization in place; the thread may be exiting.
            if let Ok(sample) = v.source.sample(now_ns, 0) {
                v.tracker.update(sample);
            }
        }
        let loads: Vec<VcpuLoad> = self
            .vcpus
            .iter()
            .map(|v| VcpuLoad {
                id: VcpuId {
                    vm: THIS_VM,
                    vcpu: v.index,
                },
                util: v.tracker.util(),
                busy: v.tracker.is_busy(),
            })
            .collect();
        let decision = match &mut self.engine {
            Some(engine) => Some(
                engine
                    .place(now_ns / 1_000_000, &loads)
                    .map_err(|e| LiveError::Engine(e.to_string()))?,
            ),
            None => None,
        };
        let mut moved = 0u64;
        let mut apply_errors = 0u64;
        if let Some(d) = &decision {
            for (v, a) in self.vcpus.iter_mut().zip(&d.assignments) {
                if v.last_cpus.as_ref() != Some(&a.cpus) {
                    match self.executor.apply(v.tid, &a.cpus) {
                        Ok(()) => {
                            if v.last_cpus.is_some() {
                                moved += 1;
                            }
                            v.last_cpus = Some(a.cpus.clone());
                        }
                        Err(_) => apply_errors += 1,
                    }
                }
                v.package = Some(a.package);
                v.capacity = a.capacity;
            }
        } else {
            for v in &mut self.vcpus {
                v.package = last_cpu_of_thread(v.tid).and_then(|c| self.topology.package_of(c));
            }
        }
        if let Some(reporter) = self.capacity.as_mut() {
            let now = Instant::now();
            for v in &self.vcpus {
                reporter.publish(v.index, v.capacity, now);
            }
        }
        if let Ok(mut t) = self.totals.lock() {
            t.ticks += 1;
            t.migrations += moved;
            t.apply_errors += apply_errors;
        }
        self.report(now_ns, moved);
        Ok(decision)
    }

    fn report(&mut self, now_ns: u64, moved: u64) {
        let Some(out) = self.stats.as_mut() else {
            return;
        };
        let all_cpus = self.topology.cpu_set();
        let vcpus: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| {
                json!({
                    "vcpu": v.index,
                    "tid": v.tid,
                    "util": round3(f64::from(v.tracker.util()) / 1024.0),
                    "busy": v.tracker.is_busy(),
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
            .map(|p| {
                let on: Vec<&LiveVcpu> = self
                    .vcpus
                    .iter()
                    .filter(|v| v.package == Some(p.id))
                    .collect();
                let demand: u32 = on.iter().map(|v| v.tracker.util()).sum();
                let cpus = self.topology.package_cpus(p.id).len().max(1) as f64;
                json!({
                    "id": p.id,
                    "util": round3(f64::from(demand) / (cpus * 1024.0)),
                    "active": !on.is_empty(),
                })
            })
            .collect();
        let totals = self.totals.lock().map(|t| t.clone()).unwrap_or_default();
        let line = json!({
            "t_ms": now_ns / 1_000_000,
            "policy": self.policy.to_string(),
            "vcpus": vcpus,
            "packages": packages,
            "migrations": moved,
            "migrations_total": totals.migrations,
            "capacity_notifications": self.capacity.as_ref().map(|r| r.notifications()),
            "guest_register_errors": self.capacity.as_ref().map(|r| r.ignored_accesses()),
        });
        // A stats reader that went away must not stop the VM.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            self.stats = None;
        }
    }

    /// Runs ticks every `tick` on a thread named `pvmm-sched` until the process exits.
    pub fn spawn(mut self, tick: Duration) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("pvmm-sched".into())
            .spawn(move || {
                let mut next = Instant::now() + tick;
                loop {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
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

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The CPU a thread last ran on (field 39 of /proc/self/task/<tid>/stat).
pub fn last_cpu_of_thread(tid: i32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    parse_last_cpu(&text)
}

/// Parses field 39 (`processor`) of a /proc stat line; the command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its closing parenthesis.
pub fn parse_last_cpu(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3.. ; processor is field 39, i.e. index 36 here.
    after.split_whitespace().nth(36)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvmm_scheduler::{IdleSample, RecordingExecutor};

    struct Scripted {
        busy_fraction: f64,
    }
    impl IdleSource for Scripted {
        fn sample(
            &mut self,
            now_ns: u64,
            start_ns: u64,
        ) -> Result<IdleSample, super::super::idle::IdleError> {
            let e = now_ns - start_ns;
            let busy = (e as f64 * self.busy_fraction) as u64;
            Ok(IdleSample {
                t_ns: now_ns,
                busy_ns: busy,
                idle_ns: e - busy,
            })
        }
        fn kind(&self) -> &'static str {
            "scripted"
        }
    }

    #[test]
    fn policy_names() {
        assert_eq!("none".parse::<PlacementPolicy>(), Ok(PlacementPolicy::None));
        assert_eq!(
            "powersaving:2".parse::<PlacementPolicy>(),
            Ok(PlacementPolicy::Managed(Policy::Powersaving { level: 2 }))
        );
        assert!("fastest".parse::<PlacementPolicy>().is_err());
        assert_eq!(PlacementPolicy::default().to_string(), "powersaving:1");
    }

    #[test]
    fn last_cpu_parsing_survives_odd_names() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[36] = "7".into(); // field 39
        let line = format!("123 (vcpu (0) x) {}", fields.join(" "));
        assert_eq!(parse_last_cpu(&line), Some(7));
        assert_eq!(parse_last_cpu("garbage"), None);
    }

    #[test]
    fn idle_vcpus_are_packed_and_reported() {
        let topo = HostTopology::from_spec("2x2x1").unwrap();
        let vcpus = (0..4)
            .map(|i| {
                LiveVcpu::new(
                    i,
                    1000 + i as i32,
                    Box::new(Scripted { busy_fraction: 0.0 }),
                )
            })
            .collect();
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
}
