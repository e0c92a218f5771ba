//! The live scheduler of one VM: the placement loop ([`pvmm_tick::Tick`], the same loop
//! `pvmm-host` and `pvmm-sim` run) over this VM's vCPU threads. Each tick reads every vCPU's
//! idle signal into utilization and the CPU time of pvmm's own threads (the virtio devices'
//! threads among them), lets the engine (or an outside balancer) place, applies the
//! placement to the threads with `sched_setaffinity`, publishes capacities to the guest
//! (CPPC), and writes the snapshot (`--stats`, `GET /v1/placement`).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvmm_devices::events::GuestErrorCounter;
use pvmm_scheduler::capacity::CAPACITY_SCALE;
use pvmm_scheduler::{
    CpuSet, Decision, EngineConfig, Executor, HostTopology, LoadTracker, PlaceError,
    PlacementPolicy, UtilConfig, VcpuId, VcpuLoad,
};
use pvmm_tick::cpustat::{idle_share, read_proc_stat, CpuTimes};
use pvmm_tick::hotplug::OnlineCpus;
use pvmm_tick::own_threads::OwnThreads;
use pvmm_tick::procfs::{parse_last_cpu, stat_path, ProcFile};
use pvmm_tick::{
    boot_clock_ns, Applied, Control, Members, Outside, PhaseClock, Tick, TickReport, Totals,
};

use super::capacity::CapacityReporter;
use super::control::{ExternalCopy, ExternalState, PlacementControl};
use super::idle::IdleSource;
use crate::seccomp::{SeccompFilters, ThreadKind};

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

/// Running totals, readable by the VMM's main thread for the exit summary.
pub type PlacementTotals = Totals;

/// The live scheduler of one VM: the placement loop ([`Tick`]) over this VM's vCPU threads.
pub struct LiveScheduler {
    tick: Tick,
    vm: VmMembers,
    totals: Arc<Mutex<PlacementTotals>>,
    host_stat_at_start: Vec<(u32, CpuTimes)>,
}

/// This VM's vCPU threads and pvmm's own threads, as the loop's members.
///
/// Every per-tick buffer (the capacities, an outside balancer's assignments, the snapshot)
/// lives here and is reused, so that a tick allocates nothing once warm.
struct VmMembers {
    control: Option<Arc<PlacementControl>>,
    own_threads: Option<OwnThreads>,
    executor: Box<dyn Executor + Send>,
    vcpus: Vec<LiveVcpu>,
    stats: Option<Box<dyn Write + Send>>,
    capacity: Option<Box<dyn CapacityReporter>>,
    guest_errors: Option<Arc<GuestErrorCounter>>,
    capacities: Vec<u32>,
    /// What pvmm's own threads used over the last tick, 1024 = one CPU.
    housekeeping_util: u32,
    external_copy: ExternalCopy,
    /// The snapshot's text, written anew each tick.
    line: Vec<u8>,
    /// The origin of the loop's clock (`t_ms`).
    start: Instant,
    /// The host's boot clock at `start`, in ns: a tick's `boot_ms` is this plus its `now_ns`.
    boot_at_start_ns: u64,
}

impl LiveScheduler {
    /// Publishes every placement's effective capacities to the guest through `reporter`.
    pub fn with_capacity_reporter(mut self, reporter: Box<dyn CapacityReporter>) -> Self {
        self.vm.capacity = Some(reporter);
        self
    }

    /// Takes policy changes and outside placement from `control`, and publishes each tick's
    /// snapshot there.
    pub fn with_control(mut self, control: Arc<PlacementControl>) -> Self {
        self.vm.control = Some(control);
        self
    }

    /// Reports the guest's ignored device accesses, counted by `errors`, in every snapshot.
    pub fn with_guest_errors(mut self, errors: Arc<GuestErrorCounter>) -> Self {
        self.vm.guest_errors = Some(errors);
        self
    }

    /// Follows host CPUs going offline and coming back ([`pvmm_tick::hotplug`]).
    pub fn with_online_cpus(mut self, online: OnlineCpus) -> Self {
        self.tick = self.tick.with_online_cpus(online, "pvmm");
        self
    }

    /// Keeps pvmm's own threads on the lowest-numbered package that holds vCPUs (or their own
    /// load, [`pvmm_scheduler::Engine::housekeeping_package`]), and counts their CPU time as
    /// load there.
    pub fn with_own_threads(mut self, own: OwnThreads) -> Self {
        self.vm.own_threads = Some(own);
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
            tick: Tick::new(policy, topology, engine_config, PhaseClock::ThreadCpu),
            vm: VmMembers {
                control: None,
                own_threads: None,
                executor,
                vcpus,
                stats,
                capacity: None,
                guest_errors: None,
                capacities: Vec::new(),
                housekeeping_util: 0,
                external_copy: ExternalCopy::default(),
                line: Vec::new(),
                boot_at_start_ns: boot_clock_ns(),
                start: Instant::now(),
            },
            totals: Arc::new(Mutex::new(PlacementTotals::default())),
            host_stat_at_start: read_proc_stat(),
        }
    }

    /// Shared totals for the exit summary.
    pub fn totals(&self) -> Arc<Mutex<PlacementTotals>> {
        self.totals.clone()
    }

    // u64 nanoseconds last 584 years.
    #[allow(clippy::cast_possible_truncation)]
    fn now_ns(&self) -> u64 {
        self.vm.since_start_ns(Instant::now())
    }

    /// One tick of the placement loop ([`Tick::run`]) over this VM. Returns the engine's
    /// decision (None for the `none` policy and under outside placement).
    pub fn tick(&mut self) -> Result<Option<&Decision>, LiveError> {
        let now_ns = self.now_ns();
        let decided = self.tick.run(now_ns, &mut self.vm)?.is_some();
        if let Ok(mut t) = self.totals.lock() {
            t.clone_from(self.tick.totals());
        }
        Ok(decided.then(|| self.tick.decision()))
    }

    /// The `--stats` line of the state at `now_ns` with `moved` moves, parsed.
    #[cfg(test)]
    fn snapshot(&self, now_ns: u64, moved: u64) -> pvmm_api::stats::VmStats {
        let mut line = Vec::new();
        self.write_snapshot(&mut line, now_ns, moved);
        serde_json::from_slice(&line).expect("the snapshot is a stats line")
    }

    /// The `--stats` line of the state at `now_ns` with `moved` moves, into `out`.
    #[cfg(test)]
    fn write_snapshot(&self, out: &mut Vec<u8>, now_ns: u64, moved: u64) {
        self.vm
            .write_snapshot(out, &self.tick.report_at(now_ns, moved));
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

impl Members for VmMembers {
    type Error = LiveError;

    fn sample(&mut self, now_ns: u64, loads: &mut Vec<VcpuLoad>) {
        for v in &mut self.vcpus {
            // A failed read leaves the previous utilization in place; the thread may be exiting.
            if let Ok(sample) = v.source.sample(now_ns) {
                v.tracker.update(sample, v.source.waited_ns());
            }
            loads.push(v.tracker.load(VcpuId {
                vm: THIS_VM,
                vcpu: v.index,
            }));
        }
    }

    fn control(&mut self, now_ns: u64) -> Control {
        let now = self.start + Duration::from_nanos(now_ns);
        match &self.control {
            Some(c) => Control {
                policy: c.take_policy_request(),
                outside: match c.external(now, &mut self.external_copy) {
                    ExternalState::Active => Outside::Active,
                    ExternalState::Expired => Outside::Lapsed,
                    ExternalState::Own => Outside::No,
                },
            },
            None => Control::default(),
        }
    }

    fn lease_lapsed(&mut self, policy: PlacementPolicy) {
        eprintln!("pvmm: external placement lease expired; placing under policy {policy} again");
    }

    /// A fresh engine is told where each vCPU runs now (the CPU its placement chose for it,
    /// also when its thread may run on its whole package), so that a vCPU already where the
    /// policy would put it does not move; a vCPU on a CPU outside the topology is placed anew.
    fn assume(&mut self, fresh: bool, assume: &mut dyn FnMut(VcpuId, u32)) {
        if !fresh {
            return;
        }
        for v in &self.vcpus {
            if let Some(cpu) = v.home {
                assume(
                    VcpuId {
                        vm: THIS_VM,
                        vcpu: v.index,
                    },
                    cpu,
                );
            }
        }
    }

    fn apply(&mut self, decision: &Decision) -> Result<Applied, LiveError> {
        let mut counts = Applied::default();
        for (v, a) in self.vcpus.iter_mut().zip(&decision.assignments) {
            pin_vcpu(
                v,
                (&a.cpus, Some(a.cpu)),
                self.executor.as_mut(),
                &mut counts,
            );
            v.package = Some(a.package);
            v.capacity = a.capacity;
        }
        Ok(counts)
    }

    /// Applies an outside balancer's assignments; vCPUs they do not name stay as they are.
    fn apply_outside(&mut self, topology: &HostTopology) -> Applied {
        let mut counts = Applied::default();
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
            v.package = a.cpus.first().and_then(|c| topology.package_of(c));
            v.capacity = a.capacity;
        }
        counts
    }

    /// Under `none`, reports where the host scheduler last ran each thread.
    fn follow_host(&mut self, topology: &HostTopology) {
        for v in &mut self.vcpus {
            v.package = v.last_cpu().and_then(|c| topology.package_of(c));
        }
    }

    fn release(&mut self, all: &CpuSet) {
        for v in &mut self.vcpus {
            if self.executor.apply(v.tid, all).is_ok() {
                v.last_cpus = None;
                v.home = None;
            }
            v.capacity = CAPACITY_SCALE;
        }
        if let Some(own) = self.own_threads.as_mut() {
            own.pin(all, self.executor.as_mut());
        }
    }

    fn lowest_package(&self) -> Option<u32> {
        self.vcpus.iter().filter_map(|v| v.package).min()
    }

    fn pin_housekeeping(&mut self, cpus: &CpuSet) -> u64 {
        match self.own_threads.as_mut() {
            Some(own) => own.pin(cpus, self.executor.as_mut()),
            None => 0,
        }
    }

    /// pvmm's own threads' CPU time since the last tick (the device threads' I/O work among
    /// it), for the engine to count on their package.
    fn sample_housekeeping(&mut self, now_ns: u64) -> u32 {
        self.housekeeping_util = self
            .own_threads
            .as_mut()
            .map_or(0, |own| own.sample_load(now_ns));
        self.housekeeping_util
    }

    /// Tells the guest each vCPU's capacity.
    fn publish(&mut self) {
        if let Some(reporter) = self.capacity.as_mut() {
            self.capacities.clear();
            self.capacities
                .extend(self.vcpus.iter().map(|v| v.capacity));
            reporter.publish(&self.capacities, Instant::now());
        }
    }

    /// Writes this tick's snapshot to `--stats` and to the control socket's view.
    fn report(&mut self, tick: &TickReport<'_>) {
        if self.stats.is_none() && self.control.is_none() {
            return;
        }
        let mut line = std::mem::take(&mut self.line);
        self.write_snapshot(&mut line, tick);
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
}

/// Restricts `v`'s thread to `cpus` if it is not there yet, counting moves and refusals; once
/// its thread is allowed `cpus`, `home` is the CPU chosen for it among them.
fn pin_vcpu(
    v: &mut LiveVcpu,
    (cpus, home): (&CpuSet, Option<u32>),
    executor: &mut dyn Executor,
    counts: &mut Applied,
) {
    if v.last_cpus.as_ref() != Some(cpus) {
        match executor.apply(v.tid, cpus) {
            Ok(()) => {
                if v.last_cpus.is_some() {
                    counts.moved += 1;
                }
                v.last_cpus = Some(cpus.clone());
            }
            Err(_) => {
                counts.refused += 1;
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

#[cfg(test)]
mod tests;
