//! `pvmm-host`: one placement engine for every VM on the host.
//!
//! Each pvmm process places only its own vCPUs, so two of them under `powersaving` both pick
//! the lowest package and its lowest CPUs and stack their busy vCPUs there. The daemon runs
//! the same [`Engine`](pvmm_scheduler::Engine) as pvmm and `pvmm-sim`, over the vCPUs of all VMs at once: pvmm VMs
//! found by their control sockets in the runtime directory, and (with `--adopt auto`) VMs of
//! other VMMs found by their KVM vCPU file descriptors ([`discover`], [`members`]).
//!
//! Every tick: discover, read each vCPU's utilization, decide, apply (pvmm VMs through
//! `PUT /v1/placement/external`, which renews their lease; foreign VMs by thread affinity),
//! pin foreign VMMs' housekeeping threads to the active packages, and report. A daemon that
//! dies leaves pvmm VMs to their lease: they place themselves again. One that is told to stop
//! (SIGTERM, SIGINT) hands placement back and restores foreign threads' affinity first.

pub mod cgroup;
pub mod cli;
pub mod command;
pub mod discover;
pub mod energy;
pub mod members;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod qmp;
pub mod status;
pub mod threads;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pvmm_api::stats::TickUs;
use pvmm_scheduler::{
    Assignment, CpuSet, Decision, EngineConfig, Executor, HostTopology, LinuxExecutor, PlaceError,
    PlacementPolicy, Policy, VcpuId, VcpuLoad,
};
use pvmm_tick::hotplug::OnlineCpus;
use pvmm_tick::own_threads::OwnThreads;
use pvmm_tick::{Applied, Members, PhaseClock, Tick, TickReport};

use self::cgroup::thread_cpuset;
use self::discover::{foreign_vms_among, pvmm_sockets, Roots, ScanSchedule};
use self::members::{ForeignMember, Member, MemberVcpu, Placer, PvmmMember, VcpuPlacement};
use self::status::{tick_us, StatusOutput, VmView};
use self::threads::Threads;

/// The lock file in the runtime directory that keeps a second daemon out.
pub const LOCK_FILE: &str = "pvmm-host.lock";
/// The daemon's own socket in the runtime directory (`GET /v1/host`, `GET /metrics`; what
/// `pvmm-host status` reads). Not `*.sock`, which names pvmm VMs.
pub const STATUS_SOCKET: &str = "pvmm-host.api";

/// What the daemon is asked to do.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The balancing policy.
    pub policy: Policy,
    /// The host CPUs it places on (topology restricted to `--cpus`).
    pub topology: HostTopology,
    /// Placement period.
    pub tick: Duration,
    /// Packing policies: vCPUs share their package's CPUs in use
    /// (`pvmm_scheduler::EngineConfig::share_package`).
    pub share_package: bool,
    /// Where pvmm control sockets are.
    pub runtime_dir: PathBuf,
    /// Whether to adopt VMs of other VMMs.
    pub adopt: bool,
    /// Where `/proc` and debugfs are.
    pub roots: Roots,
    /// Log each VM that joins or leaves on stderr.
    pub verbose: bool,
    /// Serve `GET /metrics` (Prometheus text) over TCP here.
    pub metrics: Option<std::net::SocketAddr>,
}

impl HostConfig {
    /// The engine's settings: its defaults, with the sharing asked for.
    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            share_package: self.share_package,
            ..EngineConfig::default()
        }
    }
}

/// Errors that stop the daemon before it runs.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Another daemon holds the runtime directory.
    #[error("{0}: another pvmm-host is running on this runtime directory")]
    AlreadyRunning(PathBuf),
    /// The runtime directory or lock file is unusable.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Error.
        source: std::io::Error,
    },
}

/// Set by SIGTERM and SIGINT: stop at the end of the tick.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP.store(true, Ordering::Relaxed);
}

struct Managed {
    /// The engine's VM number.
    id: u32,
    member: Box<dyn Member>,
    /// vCPUs read at this tick.
    vcpus: Vec<MemberVcpu>,
    /// A foreign VM's affinity (its main thread's) when it was adopted: what a thread it
    /// creates while placed gets back at release, since such a thread inherits the affinity
    /// the daemon gave its creator.
    inherited: Option<CpuSet>,
    /// Its vCPUs have been placed by this daemon. Until then, where they run now is told to
    /// the engine first.
    placed: bool,
}

/// A thread's placement to apply: (thread, CPUs, its affinity before when it inherited the
/// daemon's).
type ThreadPin = (i32, CpuSet, Option<CpuSet>);

impl Managed {
    /// The threads of a VM the daemon places by affinity that are not where they belong: each
    /// vCPU thread on the CPUs of its assignment in `mine`, each housekeeping thread on the
    /// `active` packages (as `threads` last saw them), pushed to `pins`.
    fn thread_pins(
        &self,
        mine: &[&Assignment],
        active: &CpuSet,
        threads: &Threads,
        pins: &mut Vec<ThreadPin>,
    ) {
        let unplaced = |tid: i32, cpus: &CpuSet| threads.applied(tid) != Some(cpus);
        let inherited = self.inherited.clone().filter(|_| self.placed);
        for a in mine {
            let tid = self
                .vcpus
                .iter()
                .find(|v| v.vcpu == a.id.vcpu)
                .map(|v| v.tid);
            match tid {
                Some(tid) if unplaced(tid, &a.cpus) => {
                    pins.push((tid, a.cpus.clone(), inherited.clone()))
                }
                _ => {}
            }
        }
        if !active.is_empty() {
            for tid in self.member.housekeeping() {
                if unplaced(tid, active) {
                    pins.push((tid, active.clone(), inherited.clone()));
                }
            }
        }
    }
}

/// The daemon: the placement loop ([`Tick`], the loop pvmm and `pvmm-sim` run) over every VM
/// on the host.
pub struct HostDaemon {
    tick: Tick,
    host: HostMembers,
    start: Instant,
}

/// Every VM on the host, as the loop's members.
struct HostMembers {
    config: HostConfig,
    executor: Box<dyn Executor>,
    /// By pid.
    vms: BTreeMap<i32, Managed>,
    next_id: u32,
    /// Where each tick's snapshot goes.
    status: StatusOutput,
    /// Each thread's bookkeeping: its affinity before, what was applied, refusals, bounds and
    /// operators' pins.
    threads: Threads,
    /// The CPU the engine chose for each vCPU in its last decision: what a fresh engine is told
    /// the vCPU runs on, also when its thread may run on its whole package (`share_package`).
    homes: HashMap<VcpuId, u32>,
    /// Affinity changes refused while applying this tick.
    refusals: u64,
    scan: ScanSchedule,
    /// The daemon's own threads, kept on the lowest active package like pvmm's.
    own: OwnThreads,
    _lock: std::fs::File,
}

/// Takes the runtime directory's lock (flock), so that one daemon manages a host.
fn lock(dir: &std::path::Path) -> Result<std::fs::File, HostError> {
    use std::os::unix::io::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let io = |source| HostError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    // SAFETY: flock on a file descriptor this function owns; the result is checked.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(HostError::AlreadyRunning(path));
    }
    Ok(file)
}

impl HostDaemon {
    /// A daemon for `config`, holding its runtime directory's lock, writing a JSON line per
    /// tick to `stats`.
    pub fn new(config: HostConfig, stats: Option<Box<dyn Write>>) -> Result<Self, HostError> {
        Self::with_executor(config, stats, Box::new(LinuxExecutor))
    }

    /// [`HostDaemon::new`] applying affinity through `executor` (a recording one in tests and
    /// the scale benchmark).
    pub fn with_executor(
        config: HostConfig,
        stats: Option<Box<dyn Write>>,
        executor: Box<dyn Executor>,
    ) -> Result<Self, HostError> {
        let lock = lock(&config.runtime_dir)?;
        let mut tick = Tick::new(
            PlacementPolicy::Managed(config.policy),
            config.topology.clone(),
            config.engine_config(),
            PhaseClock::Wall,
        );
        if let Some(online) =
            OnlineCpus::watch(config.topology.clone(), config.roots.cpu_online.clone())
        {
            tick = tick.with_online_cpus(online, "pvmm-host");
        }
        Ok(Self {
            tick,
            host: HostMembers {
                config,
                executor,
                vms: BTreeMap::new(),
                next_id: 0,
                status: StatusOutput::new(stats),
                threads: Threads::default(),
                homes: HashMap::new(),
                refusals: 0,
                scan: ScanSchedule::default(),
                own: OwnThreads::new(Vec::new()),
                _lock: lock,
            },
            start: Instant::now(),
        })
    }

    /// Where the last tick's time went.
    pub fn last_cost(&self) -> TickUs {
        tick_us(&self.tick.totals().last)
    }

    /// VMs and vCPUs managed at the last tick.
    pub fn managed(&self) -> (usize, usize) {
        (
            self.host.vms.len(),
            self.host.vms.values().map(|m| m.vcpus.len()).sum(),
        )
    }

    /// One tick of the placement loop over every VM: discover, read, decide, apply, report.
    pub fn tick(&mut self) -> Result<(), String> {
        // u64 nanoseconds last 584 years.
        #[allow(clippy::cast_possible_truncation)]
        let now_ns = self.start.elapsed().as_nanos() as u64;
        self.tick
            .run(now_ns, &mut self.host)
            .map_err(|e| format!("placement engine: {e}"))?;
        Ok(())
    }

    /// Hands placement back: each pvmm VM to its own policy, each foreign thread to the
    /// affinity it had before.
    pub fn release(&mut self) {
        self.host.release();
    }

    /// Ticks until SIGTERM or SIGINT, then releases everything.
    pub fn run(&mut self) -> Result<(), String> {
        for signal in [libc::SIGTERM, libc::SIGINT] {
            vmm_sys_util::signal::register_signal_handler(signal, on_stop)
                .map_err(|e| format!("signal handler: {e}"))?;
        }
        let host = &self.host;
        host.status
            .serve(&host.config.runtime_dir, host.config.metrics)?;
        let mut next = Instant::now();
        while !STOP.load(Ordering::Relaxed) {
            self.tick()?;
            next += self.host.config.tick;
            // std's sleep resumes after a signal; a stop waits out at most one tick.
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        self.release();
        let _ = std::fs::remove_file(self.host.config.runtime_dir.join(STATUS_SOCKET));
        Ok(())
    }
}

impl Members for HostMembers {
    type Error = PlaceError;

    fn discover(&mut self) {
        self.find_vms();
    }

    fn sample(&mut self, now_ns: u64, loads: &mut Vec<VcpuLoad>) {
        self.read(now_ns);
        self.observe_operators();
        for m in self.vms.values() {
            loads.extend(m.vcpus.iter().map(|v| VcpuLoad {
                id: VcpuId {
                    vm: m.id,
                    vcpu: v.vcpu,
                },
                util: v.util,
                busy: v.busy,
                waited: v.waited,
            }));
        }
    }

    /// Tells the engine where each vCPU of a VM it has not placed yet runs now: the CPU this
    /// daemon last chose for it, or else its thread's affinity when that is one CPU (where pvmm
    /// placed it, or a foreign thread's). A fresh engine after CPU hotplug, or a restarted
    /// daemon, then moves only the vCPUs it would put elsewhere.
    fn assume(&mut self, fresh: bool, assume: &mut dyn FnMut(VcpuId, u32)) {
        for m in self.vms.values_mut() {
            m.placed &= !fresh;
        }
        for m in self.vms.values().filter(|m| !m.placed) {
            for v in &m.vcpus {
                let id = VcpuId {
                    vm: m.id,
                    vcpu: v.vcpu,
                };
                let home = self.homes.get(&id).copied().or_else(|| {
                    let cpus = match m.member.placer() {
                        Placer::Vmm => v.cpus.clone(),
                        Placer::Daemon => self.executor.read(v.tid).ok(),
                    };
                    cpus.filter(|c| c.len() == 1).and_then(|c| c.first())
                });
                if let Some(cpu) = home {
                    assume(id, cpu);
                }
            }
        }
    }

    fn limits(&mut self, fresh: bool, limit: &mut dyn FnMut(VcpuId, Option<CpuSet>)) {
        let all = self.config.topology.cpu_set();
        let mut wanted = HashMap::new();
        for m in self.vms.values() {
            for v in &m.vcpus {
                if let Some(set) = self.threads.limit(v.tid, &all) {
                    let id = VcpuId {
                        vm: m.id,
                        vcpu: v.vcpu,
                    };
                    wanted.insert(id, set);
                }
            }
        }
        self.threads.tell_limits(fresh, wanted, limit);
    }

    fn topology_changed(&mut self, topology: &HostTopology) {
        self.config.topology = topology.clone();
    }

    fn apply(&mut self, decision: &Decision) -> Result<Applied, PlaceError> {
        self.refusals = 0;
        self.apply_decision(decision);
        Ok(Applied {
            moved: decision.migrations.len() as u64,
            refused: std::mem::take(&mut self.refusals),
        })
    }

    /// The daemon wakes every tick: on the lowest active package, not on one it empties.
    fn pin_housekeeping(&mut self, cpus: &CpuSet) -> u64 {
        self.own.pin(cpus, self.executor.as_mut())
    }

    fn report(&mut self, tick: &TickReport<'_>) {
        if let Some(decision) = tick.decision {
            self.report_line(tick, decision);
        }
    }
}

impl HostMembers {
    fn log(&self, msg: impl AsRef<str>) {
        if self.config.verbose {
            eprintln!("pvmm-host: {}", msg.as_ref());
        }
    }

    /// Finds the VMs now: joins new ones, forgets those that ended.
    fn find_vms(&mut self) {
        let mut seen: HashSet<i32> = HashSet::new();
        for socket in pvmm_sockets(&self.config.runtime_dir) {
            let known = self
                .vms
                .iter()
                .find_map(|(pid, m)| (m.member.socket() == Some(&socket)).then_some(*pid));
            match known {
                Some(pid) => {
                    seen.insert(pid);
                }
                None => {
                    // A socket nobody answers on is a VM that ended (or has not started).
                    if let Ok(member) = PvmmMember::join(&socket) {
                        seen.insert(member.pid);
                        self.add(member.pid, Box::new(member));
                    }
                }
            }
        }
        if self.config.adopt {
            self.discover_foreign(&mut seen);
        }
        let gone: Vec<i32> = self
            .vms
            .keys()
            .filter(|p| !seen.contains(p))
            .copied()
            .collect();
        for pid in gone {
            self.vms.remove(&pid);
            self.log(format!("VM pid {pid} is gone"));
        }
    }

    /// Adopts VMs of other VMMs among the processes the scan schedule says to examine; known
    /// ones not examined this tick stay while their process lives.
    fn discover_foreign(&mut self, seen: &mut HashSet<i32>) {
        let proc = self.config.roots.proc.clone();
        let alive = discover::pids(&proc);
        let (_, mut examine) = self.scan.next(&alive);
        // An adopted VM whose threads are those it had is the VM it was: its file descriptors
        // need no second look (a vCPU added or gone comes with its thread).
        let vms = &mut self.vms;
        examine.retain(|pid| {
            let foreign = vms.get_mut(pid).and_then(|m| m.member.as_foreign_mut());
            !foreign.is_some_and(|f| f.unchanged(&proc))
        });
        let mut skip: Vec<i32> = seen.iter().copied().collect();
        // Linux pids are at most PID_MAX_LIMIT (2^22): the fallback is never taken.
        skip.push(i32::try_from(std::process::id()).unwrap_or(i32::MAX));
        let mut examined: HashSet<i32> = examine.iter().copied().collect();
        for found in foreign_vms_among(&self.config.roots, &examine, &skip) {
            let pid = found.pid;
            seen.insert(pid);
            examined.remove(&pid);
            let known = self.vms.get_mut(&pid);
            match known.and_then(|m| m.member.as_foreign_mut()) {
                Some(f) => f.update(found, &proc),
                None => self.add(pid, Box::new(ForeignMember::adopt(found, &proc))),
            }
        }
        for (pid, m) in &self.vms {
            let kept = m.member.socket().is_none()
                && !examined.contains(pid)
                && alive.binary_search(pid).is_ok();
            if kept {
                seen.insert(*pid);
            }
        }
    }

    fn add(&mut self, pid: i32, member: Box<dyn Member>) {
        self.log(format!("joined {}", member.describe(pid)));
        // A thread the VM creates while placed inherits the affinity the daemon gave its
        // creator: it gets the process's own back at release.
        let inherited = match member.placer() {
            Placer::Daemon => self.executor.read(pid).ok(),
            Placer::Vmm => None,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.vms.insert(
            pid,
            Managed {
                id,
                member,
                vcpus: Vec::new(),
                inherited,
                placed: false,
            },
        );
    }

    /// Reads every VM's vCPUs; a pvmm that does not answer is dropped until it does.
    fn read(&mut self, now_ns: u64) {
        let mut lost = Vec::new();
        for (pid, m) in &mut self.vms {
            m.vcpus = match m.member.read(now_ns) {
                Ok(v) => v,
                Err(_) => {
                    lost.push(*pid);
                    Vec::new()
                }
            };
        }
        for pid in lost {
            self.vms.remove(&pid);
        }
    }

    /// Reads each vCPU thread's cgroup cpuset, and each foreign one's affinity, noting the
    /// operators' pins among those ([`operator`]). A VM whose VMM places it sets its threads'
    /// affinity itself, as the daemon asks: its cpuset bounds it, and nothing else is an
    /// operator's pin.
    fn observe_operators(&mut self) {
        let all = self.config.topology.cpu_set();
        let roots = &self.config.roots;
        let mut live = HashSet::new();
        self.threads.clear_bounds();
        for (pid, m) in &self.vms {
            let foreign = m.member.placer() == Placer::Daemon;
            for v in &m.vcpus {
                let cpuset = thread_cpuset(&roots.proc, &roots.cgroup, *pid, v.tid);
                let bound = cpuset
                    .map(|set| set.intersection(&all))
                    .filter(|set| !set.is_empty() && *set != all);
                if foreign {
                    live.insert(v.tid);
                    let affinity = self.executor.read(v.tid).ok();
                    let within = bound.as_ref().unwrap_or(&all);
                    self.threads.observe_pin(v.tid, affinity.as_ref(), within);
                }
                if let Some(bound) = bound {
                    self.threads.set_bound(v.tid, bound);
                }
            }
        }
        self.threads.retain_pins(|tid| live.contains(&tid));
    }

    /// Applies `decision`, whose assignments follow the loads' order: the VMs in `self.vms`
    /// order, each VM's vCPUs as read. Threads already where they belong cost nothing.
    fn apply_decision(&mut self, decision: &Decision) {
        self.homes.clear();
        self.homes
            .extend(decision.assignments.iter().map(|a| (a.id, a.cpu)));
        let mut packages: Vec<u32> = decision.assignments.iter().map(|a| a.package).collect();
        packages.sort_unstable();
        packages.dedup();
        let active: CpuSet = packages
            .iter()
            .map(|&p| self.config.topology.package_cpus(p))
            .fold(CpuSet::default(), |acc, cpus| acc.union(&cpus));
        let mut pins = Vec::new();
        let mut failed = Vec::new();
        let mut next = decision.assignments.iter();
        for (pid, m) in &mut self.vms {
            let mine: Vec<&Assignment> = next
                .by_ref()
                .take(m.vcpus.len())
                .filter(|a| a.id.vm == m.id)
                .collect();
            match m.member.placer() {
                Placer::Vmm => {
                    let list: Vec<VcpuPlacement> = mine
                        .iter()
                        .map(|a| (a.id.vcpu, a.cpus.clone(), a.capacity))
                        .collect();
                    if !list.is_empty() && m.member.place(&list).is_err() {
                        failed.push(*pid);
                    }
                }
                Placer::Daemon => m.thread_pins(&mine, &active, &self.threads, &mut pins),
            }
            m.placed |= !mine.is_empty();
        }
        for (tid, cpus, inherited) in pins {
            // An operator's pin is left alone; a cpuset is never stepped out of.
            let outside = self.threads.outside_bound(tid, &cpus);
            if !self.threads.is_pinned(tid)
                && !outside
                && !self
                    .threads
                    .place(tid, &cpus, inherited, self.executor.as_mut())
            {
                self.refusals += 1;
            }
        }
        self.refusals += failed.len() as u64;
        for pid in failed {
            // Read again next tick if it still answers; gone otherwise.
            self.vms.remove(&pid);
        }
    }

    /// Reports the tick's status ([`status`]).
    fn report_line(&mut self, tick: &TickReport<'_>, decision: &Decision) {
        let vms = self.vms.iter().map(|(pid, m)| VmView {
            pid: *pid,
            id: m.id,
            kind: m.member.kind(),
            name: m.member.name(),
            vcpus: &m.vcpus,
        });
        let pinned = |tid| self.threads.is_pinned(tid);
        let line = status::snapshot(vms, &pinned, &self.config, tick, decision);
        self.status.publish(tick.now_ns, &self.config, line);
    }

    /// Hands placement back: each pvmm VM to its own policy, each foreign thread to the
    /// affinity it had before.
    fn release(&mut self) {
        for m in self.vms.values_mut() {
            if let Err(e) = m.member.release() {
                eprintln!("pvmm-host: {e}");
            }
        }
        self.threads.restore(self.executor.as_mut());
    }
}

#[cfg(test)]
mod tests;
