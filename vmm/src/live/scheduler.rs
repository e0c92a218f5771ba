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

use super::capacity::CapacityReporter;
use super::control::{ExternalCopy, ExternalState, PlacementControl};
use super::idle::IdleSource;
use crate::config::PlacementPolicy;
use crate::seccomp::{SeccompFilters, ThreadKind};
use pvmm_tick::cpustat::{idle_share, read_proc_stat, CpuTimes};
use pvmm_tick::hotplug::OnlineCpus;
use pvmm_tick::own_threads::OwnThreads;
use pvmm_tick::procfs::{parse_last_cpu, stat_path, ProcFile};

mod snapshot;

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
    /// The one CPU its placement chose for it last (the engine's
    /// [`pvmm_scheduler::Assignment::cpu`], or an outside balancer's single CPU), where its
    /// thread is allowed: what a fresh engine is told it runs on, also when its thread may run
    /// on the whole of its package.
    home: Option<u32>,
    package: Option<u32>,
    capacity: u32,
    /// Its thread's `stat`, for where the host last ran it (`--policy none`), opened then.
    stat: Option<ProcFile>,
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
            home: None,
            package: None,
            capacity: CAPACITY_SCALE,
            stat: None,
        }
    }

    /// The CPU the host last ran the thread on.
    fn last_cpu(&mut self) -> Option<u32> {
        let tid = self.tid;
        let stat = self
            .stat
            .get_or_insert_with(|| ProcFile::new(stat_path(tid).into()));
        parse_last_cpu(stat.read()?)
    }
}

/// The ticks' CPU time by phase, in ns summed over the ticks (the scheduler thread's own CPU
/// clock).
#[derive(Debug, Clone, Copy, Default)]
pub struct TickTimes {
    /// Reading each vCPU's idle signal (`/proc` schedstat, KVM's statistics) and the host's
    /// online CPUs.
    pub read_ns: u64,
    /// Control requests and the engine's decision.
    pub decide_ns: u64,
    /// Affinity of vCPUs and of pvmm's own threads, and publishing capacities (CPPC).
    pub apply_ns: u64,
    /// The snapshot: `--stats` and the control socket's copy.
    pub report_ns: u64,
}

impl TickTimes {
    /// All phases.
    pub fn total_ns(&self) -> u64 {
        self.read_ns + self.decide_ns + self.apply_ns + self.report_ns
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
    /// CPU time of the ticks, by phase.
    pub time: TickTimes,
}

/// The live scheduler of one VM.
///
/// Every per-tick buffer (the engine's input and decision, the capacities, an outside
/// balancer's assignments, the snapshot) lives here and is reused, so that a tick allocates
/// nothing once warm; the topology's CPU sets are computed when the topology changes.
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
    /// Each package's CPUs, in package order.
    package_cpus: Vec<CpuSet>,
    /// All the topology's CPUs.
    all_cpus: CpuSet,
    /// The host's online CPUs, when watched: the topology follows them.
    online: Option<OnlineCpus>,
    loads: Vec<VcpuLoad>,
    decision: Decision,
    capacities: Vec<u32>,
    external_copy: ExternalCopy,
    /// The snapshot's text, written anew each tick.
    line: Vec<u8>,
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
        let mut s = Self {
            engine: make_engine(policy, &topology, &engine_config),
            package_capacity: Vec::new(),
            package_cpus: Vec::new(),
            all_cpus: CpuSet::new(),
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
            loads: Vec::new(),
            decision: Decision::default(),
            capacities: Vec::new(),
            external_copy: ExternalCopy::default(),
            line: Vec::new(),
        };
        s.topology_changed();
        s
    }

    /// Shared totals for the exit summary.
    pub fn totals(&self) -> Arc<Mutex<PlacementTotals>> {
        self.totals.clone()
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Recomputes what the scheduler keeps of the topology.
    fn topology_changed(&mut self) {
        let packages = self.topology.packages();
        self.package_cpus = packages
            .iter()
            .map(|p| self.topology.package_cpus(p.id))
            .collect();
        self.package_capacity = self
            .package_cpus
            .iter()
            .map(|cpus| group_capacity(&self.topology, cpus).capacity)
            .collect();
        self.all_cpus = self.topology.cpu_set();
    }

    /// One tick: sample, take control requests, place (pvmm's policy or an outside
    /// balancer's assignments), apply, publish capacities, report. Returns the engine's
    /// decision (None for the `none` policy and under outside placement).
    pub fn tick(&mut self) -> Result<Option<&Decision>, LiveError> {
        let mut clock = PhaseClock::start();
        let mut time = TickTimes::default();
        let now_ns = self.now_ns();
        self.sample(now_ns);
        self.follow_online_cpus();
        time.read_ns = clock.lap();
        let outside = self.outside_places();
        let decided = !outside && self.decide(now_ns)?;
        time.decide_ns = clock.lap();
        let (moved, apply_errors) = if outside {
            self.apply_external()
        } else if decided {
            self.apply_decision()
        } else {
            self.follow_unpinned();
            (0, 0)
        };
        let own_errors = self.pin_own_threads();
        self.publish_capacities();
        if let Ok(mut t) = self.totals.lock() {
            t.ticks += 1;
            t.migrations += moved;
            t.apply_errors += apply_errors + own_errors;
        }
        time.apply_ns = clock.lap();
        self.report(now_ns, moved);
        time.report_ns = clock.lap();
        if let Ok(mut t) = self.totals.lock() {
            t.time.read_ns += time.read_ns;
            t.time.decide_ns += time.decide_ns;
            t.time.apply_ns += time.apply_ns;
            t.time.report_ns += time.report_ns;
        }
        Ok(decided.then_some(&self.decision))
    }

    fn sample(&mut self, now_ns: u64) {
        for v in &mut self.vcpus {
            // A failed read leaves the previous utilization in place; the thread may be exiting.
            if let Ok(sample) = v.source.sample(now_ns) {
                v.tracker.update(sample, v.source.waited_ns());
            }
        }
    }

    /// Takes the control socket's requests; whether an outside balancer places at this tick
    /// (its assignments then in `self.external_copy`).
    fn outside_places(&mut self) -> bool {
        let (policy, who) = match &self.control {
            Some(c) => (
                c.take_policy_request(),
                c.external(Instant::now(), &mut self.external_copy),
            ),
            None => (None, ExternalState::Own),
        };
        if let Some(policy) = policy {
            self.set_policy(policy);
        }
        if who == ExternalState::Active {
            self.external = true;
            return true;
        }
        if who == ExternalState::Expired {
            eprintln!(
                "pvmm: external placement lease expired; placing under policy {} again",
                self.policy
            );
        }
        if std::mem::take(&mut self.external) {
            // The engine's view of where vCPUs are is stale: start it afresh, from where the
            // outside balancer left them.
            self.restart_engine();
        }
        false
    }

    /// Runs the engine into `self.decision`; false under the `none` policy.
    fn decide(&mut self, now_ns: u64) -> Result<bool, LiveError> {
        let Some(engine) = &mut self.engine else {
            return Ok(false);
        };
        self.loads.clear();
        self.loads.extend(self.vcpus.iter().map(|v| {
            v.tracker.load(VcpuId {
                vm: THIS_VM,
                vcpu: v.index,
            })
        }));
        engine.place_into(now_ns / 1_000_000, &self.loads, &mut self.decision)?;
        Ok(true)
    }

    /// Applies the engine's decision; returns (moves, refused affinity changes).
    fn apply_decision(&mut self) -> (u64, u64) {
        let mut counts = (0, 0);
        for (v, a) in self.vcpus.iter_mut().zip(&self.decision.assignments) {
            pin_vcpu(
                v,
                (&a.cpus, Some(a.cpu)),
                self.executor.as_mut(),
                &mut counts,
            );
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
                if let Some(cpu) = v.home {
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
            self.topology = topology;
            self.topology_changed();
            self.restart_engine();
        }
    }

    /// Applies an outside balancer's assignments; vCPUs they do not name stay as they are.
    fn apply_external(&mut self) -> (u64, u64) {
        let mut counts = (0, 0);
        for a in &self.external_copy.assignments {
            let Some(v) = self.vcpus.get_mut(a.vcpu as usize) else {
                continue;
            };
            pin_vcpu(
                v,
                (&a.cpus, single_cpu(&a.cpus)),
                self.executor.as_mut(),
                &mut counts,
            );
            v.package = a.cpus.first().and_then(|c| self.topology.package_of(c));
            v.capacity = a.capacity;
        }
        counts
    }

    /// Under `none`, reports where the host scheduler last ran each thread.
    fn follow_unpinned(&mut self) {
        for v in &mut self.vcpus {
            v.package = v.last_cpu().and_then(|c| self.topology.package_of(c));
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
            for v in &mut self.vcpus {
                if self.executor.apply(v.tid, &self.all_cpus).is_ok() {
                    v.last_cpus = None;
                    v.home = None;
                }
                v.capacity = CAPACITY_SCALE;
            }
            if let Some(own) = self.own_threads.as_mut() {
                own.pin(&self.all_cpus, self.executor.as_mut());
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
        let packages = self.topology.packages().iter();
        let Some(cpus) = packages
            .zip(&self.package_cpus)
            .find_map(|(p, cpus)| (p.id == home).then_some(cpus))
        else {
            return 0;
        };
        if cpus.is_empty() {
            return 0;
        }
        own.pin(cpus, self.executor.as_mut())
    }

    /// Tells the guest each vCPU's capacity.
    fn publish_capacities(&mut self) {
        if let Some(reporter) = self.capacity.as_mut() {
            self.capacities.clear();
            self.capacities
                .extend(self.vcpus.iter().map(|v| v.capacity));
            reporter.publish(&self.capacities, Instant::now());
        }
    }

    /// Writes this tick's snapshot to `--stats` and to the control socket's view.
    fn report(&mut self, now_ns: u64, moved: u64) {
        if self.stats.is_none() && self.control.is_none() {
            return;
        }
        let mut line = std::mem::take(&mut self.line);
        self.write_snapshot(&mut line, now_ns, moved);
        if let Some(out) = self.stats.as_mut() {
            line.push(b'\n');
            // A stats reader that went away must not stop the VM.
            if out.write_all(&line).and_then(|_| out.flush()).is_err() {
                self.stats = None;
            }
            line.pop();
        }
        if let Some(control) = &self.control {
            // The control keeps this text and hands back the buffer of the one it replaces.
            control.publish(&mut line);
        }
        self.line = line;
    }

    /// The `--stats` line of this tick, parsed.
    #[cfg(test)]
    fn snapshot(&self, now_ns: u64, moved: u64) -> serde_json::Value {
        let mut line = Vec::new();
        self.write_snapshot(&mut line, now_ns, moved);
        serde_json::from_slice(&line).expect("the snapshot is JSON")
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

    /// The `-v` exit line: the ticks' CPU time per tick, by phase ([`TickTimes`]).
    pub fn tick_cost_line(totals: &PlacementTotals) -> String {
        let t = &totals.time;
        let per_tick = |ns: u64| ns as f64 / totals.ticks.max(1) as f64 / 1000.0;
        format!(
            "scheduler tick: {:.1} us of CPU per tick over {} ticks (read {:.1}, decide {:.1}, \
             apply {:.1}, report {:.1} us)",
            per_tick(t.total_ns()),
            totals.ticks,
            per_tick(t.read_ns),
            per_tick(t.decide_ns),
            per_tick(t.apply_ns),
            per_tick(t.report_ns),
        )
    }

    /// /proc/stat at start, for the summary.
    pub fn host_stat_at_start(&self) -> Vec<(u32, CpuTimes)> {
        self.host_stat_at_start.clone()
    }
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

/// Restricts `v`'s thread to `cpus` if it is not there yet, counting (moves, refusals); once
/// its thread is allowed `cpus`, `home` is the CPU chosen for it among them.
fn pin_vcpu(
    v: &mut LiveVcpu,
    (cpus, home): (&CpuSet, Option<u32>),
    executor: &mut dyn Executor,
    counts: &mut (u64, u64),
) {
    if v.last_cpus.as_ref() != Some(cpus) {
        match executor.apply(v.tid, cpus) {
            Ok(()) => {
                if v.last_cpus.is_some() {
                    counts.0 += 1;
                }
                v.last_cpus = Some(cpus.clone());
            }
            Err(_) => {
                counts.1 += 1;
                return;
            }
        }
    }
    v.home = home;
}

/// The one CPU of `cpus`, if it holds exactly one.
fn single_cpu(cpus: &CpuSet) -> Option<u32> {
    (cpus.len() == 1).then(|| cpus.first()).flatten()
}

/// The calling thread's CPU clock, read phase by phase.
struct PhaseClock(u64);

impl PhaseClock {
    fn start() -> Self {
        Self(thread_cpu_ns())
    }

    /// The thread's CPU time since the last lap (or the start).
    fn lap(&mut self) -> u64 {
        let now = thread_cpu_ns();
        now.saturating_sub(std::mem::replace(&mut self.0, now))
    }
}

/// CPU time of the calling thread, in ns (0 if the clock cannot be read).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only to it.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests;
