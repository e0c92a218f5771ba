//! Every VM on the host as the placement loop's members ([`HostMembers`]).
//!
//! The loop ([`pvmm_tick::Tick`]) asks for the phases of a tick; this module answers them
//! over every VM, whatever its kind ([`Member`]): it finds VMs (pvmm VMs by their control
//! sockets, others in `/proc`), reads their vCPUs into the engine's loads in one order (VMs by
//! pid, each VM's vCPUs as read), and applies the decision in that same order. A VM whose VMM
//! places it is handed its assignments; for the others the daemon sets each thread's affinity
//! itself, keeping what it knows of every thread in [`Threads`] (the affinity to restore,
//! operators' pins, cgroup bounds), and never moves a thread an operator pinned or out of its
//! cpuset.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use pvmm_scheduler::{
    Assignment, CpuSet, Decision, Executor, HostTopology, PlaceError, VcpuId, VcpuLoad,
};
use pvmm_tick::own_threads::OwnThreads;
use pvmm_tick::{Applied, Members, TickReport};

use crate::cgroup::CpusetWatch;
use crate::discover::{self, foreign_vms_among, pvmm_sockets, ScanSchedule};
use crate::members::{
    ForeignMember, Member, MemberError, MemberVcpu, Placer, PvmmMember, VcpuPlacement,
};
use crate::status::{self, StatusOutput, VmView};
use crate::threads::Threads;
use crate::HostConfig;

/// One VM the daemon manages.
pub(crate) struct Managed {
    /// The engine's VM number.
    id: u32,
    member: Box<dyn Member>,
    /// vCPUs read at this tick.
    pub(crate) vcpus: Vec<MemberVcpu>,
    /// The affinity of a VM the daemon places by affinity (its main thread's) when it joined:
    /// what a thread it creates while placed gets back at release, since such a thread
    /// inherits the affinity the daemon gave its creator.
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

/// Every VM on the host, as the loop's members.
pub(crate) struct HostMembers {
    config: HostConfig,
    pub(crate) executor: Box<dyn Executor>,
    /// By pid.
    pub(crate) vms: BTreeMap<i32, Managed>,
    next_id: u32,
    /// Where each tick's snapshot goes.
    pub(crate) status: StatusOutput,
    /// Each thread's bookkeeping: its affinity before, what was applied, refusals, bounds and
    /// operators' pins.
    pub(crate) threads: Threads,
    /// Each vCPU thread's cgroup cpuset, read each tick.
    cpusets: CpusetWatch,
    /// The CPU the engine chose for each vCPU in its last decision: what a fresh engine is told
    /// the vCPU runs on, also when its thread may run on its whole package (`share_package`).
    pub(crate) homes: HashMap<VcpuId, u32>,
    /// Affinity changes refused while applying this tick.
    refusals: u64,
    scan: ScanSchedule,
    /// The daemon's own threads, kept on the lowest active package like pvmm's.
    own: OwnThreads,
}

impl HostMembers {
    /// The members for `config`, applying affinity through `executor`, writing a JSON line per
    /// tick to `stats`.
    pub(crate) fn new(
        config: HostConfig,
        stats: Option<Box<dyn Write>>,
        executor: Box<dyn Executor>,
    ) -> Self {
        let cpusets = CpusetWatch::new(&config.roots.proc, &config.roots.cgroup);
        Self {
            config,
            executor,
            cpusets,
            vms: BTreeMap::new(),
            next_id: 0,
            status: StatusOutput::new(stats),
            threads: Threads::default(),
            homes: HashMap::new(),
            refusals: 0,
            scan: ScanSchedule::default(),
            own: OwnThreads::new(Vec::new()),
        }
    }

    /// What the daemon was asked to do.
    pub(crate) fn config(&self) -> &HostConfig {
        &self.config
    }

    /// VMs and vCPUs managed at the last tick.
    pub(crate) fn managed(&self) -> (usize, usize) {
        (
            self.vms.len(),
            self.vms.values().map(|m| m.vcpus.len()).sum(),
        )
    }

    /// Starts the status socket and, with `--metrics`, the metrics endpoint.
    pub(crate) fn serve(&self) -> Result<(), String> {
        self.status
            .serve(&self.config.runtime_dir, self.config.metrics)
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
                    let cpus = self.executor.read(v.tid).ok();
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
            self.log_migrations(decision);
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
        // By socket: one lookup per socket, not a scan of every VM (hundreds of VMs).
        let by_socket: HashMap<&Path, i32> = self
            .vms
            .iter()
            .filter_map(|(pid, m)| m.member.socket().map(|s| (s, *pid)))
            .collect();
        let mut fresh = Vec::new();
        for socket in pvmm_sockets(&self.config.runtime_dir) {
            match by_socket.get(socket.as_path()) {
                Some(pid) => {
                    seen.insert(*pid);
                }
                None => fresh.push(socket),
            }
        }
        for socket in fresh {
            // A socket nobody answers on is a VM that ended (or has not started).
            if let Ok(member) = PvmmMember::join(&socket, &self.config.roots.proc) {
                seen.insert(member.pid);
                self.add(member.pid, Box::new(member));
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

    /// Reads every VM's vCPUs; a pvmm whose process is gone is dropped.
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

    /// Reads each vCPU thread's cgroup cpuset, and the affinity of each the daemon places,
    /// noting the operators' pins among those ([`crate::operator`]). A VM whose VMM places it
    /// sets its threads' affinity itself, as the daemon asks: its cpuset bounds it, and nothing
    /// else is an operator's pin.
    fn observe_operators(&mut self) {
        let all = self.config.topology.cpu_set();
        let mut live = HashSet::new();
        self.threads.clear_bounds();
        self.cpusets.begin_tick();
        for (pid, m) in &self.vms {
            let by_daemon = m.member.placer() == Placer::Daemon;
            for v in &m.vcpus {
                let cpuset = self.cpusets.cpuset(*pid, v.tid);
                let bound = cpuset
                    .map(|set| set.intersection(&all))
                    .filter(|set| !set.is_empty() && *set != all);
                if by_daemon {
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
                    let placed = if list.is_empty() {
                        Ok(())
                    } else {
                        m.member.place(&list)
                    };
                    match placed {
                        Ok(()) => {}
                        // Still there: asked again next tick, its sampling kept.
                        Err(MemberError::Refused { .. }) => self.refusals += 1,
                        Err(_) => failed.push(*pid),
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
            // Joined again by discovery while its socket answers.
            self.vms.remove(&pid);
        }
    }

    /// With `-v`, one line per decision that moved vCPUs: each move, and the load of every
    /// vCPU of the VMs it moved, as the engine was given it (what an operator needs to tell a
    /// load change from a placement that moves vCPUs for nothing).
    fn log_migrations(&self, decision: &Decision) {
        if !self.config.verbose || decision.migrations.is_empty() {
            return;
        }
        let moves: Vec<String> = decision
            .migrations
            .iter()
            .map(|m| format!("{}/{} {}->{}", m.id.vm, m.id.vcpu, m.from, m.to))
            .collect();
        let moved_vms: HashSet<u32> = decision.migrations.iter().map(|m| m.id.vm).collect();
        let loads: Vec<String> = self
            .vms
            .values()
            .filter(|m| moved_vms.contains(&m.id))
            .flat_map(|m| {
                m.vcpus.iter().map(move |v| {
                    let busy = if v.busy { " busy" } else { "" };
                    format!("{}/{} {}{busy} waited {}", m.id, v.vcpu, v.util, v.waited)
                })
            })
            .collect();
        self.log(format!(
            "moved {} ({} packages{}); loads {}",
            moves.join(", "),
            decision.target_packages,
            if decision.overutilized {
                ", overutilized"
            } else {
                ""
            },
            loads.join(", ")
        ));
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
    pub(crate) fn release(&mut self) {
        for m in self.vms.values_mut() {
            if let Err(e) = m.member.release() {
                eprintln!("pvmm-host: {e}");
            }
        }
        self.threads.restore(self.executor.as_mut());
    }
}
