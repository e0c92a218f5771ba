//! The placement loop: one tick, for whatever it places.
//!
//! Every tick runs the same phases, whoever the members are (one pvmm VM's vCPU threads, every
//! VM on the host under `pvmm-host`, or `pvmm-sim`'s simulated threads):
//!
//! 1. **discover**: members join and leave ([`Members::discover`]);
//! 2. **read**: each vCPU's load from its idle signal ([`Members::sample`]), the CPU time the
//!    housekeeping threads used ([`Members::sample_housekeeping`]), and the host's online
//!    CPUs: when they changed, the topology follows and the engine starts afresh;
//! 3. **decide**: control requests ([`Members::control`]: a policy change, an outside
//!    balancer's lease), then the engine, told first where the vCPUs it has not placed yet run
//!    ([`Members::assume`]), so that a vCPU already where the policy wants it does not move,
//!    and what the housekeeping threads used on the package they were kept on
//!    ([`pvmm_scheduler::Engine::set_housekeeping`]), so that their load takes room there;
//! 4. **apply**: the decision's affinities ([`Members::apply`]), or an outside balancer's
//!    ([`Members::apply_outside`]), or under the `none` policy where the host ran each thread
//!    ([`Members::follow_host`]); housekeeping threads onto the lowest-numbered package that
//!    holds vCPUs ([`Members::pin_housekeeping`]), since a package reaches its deep idle state
//!    only when every CPU in it is idle (a package the engine counted their own load on counts
//!    as holding vCPUs, [`pvmm_scheduler::Engine::housekeeping_package`]); capacities to the
//!    guests ([`Members::publish`]);
//! 5. **report** ([`Members::report`]).
//!
//! The engine starts afresh when the policy changes, when an outside balancer's lease ends,
//! and when CPUs go offline or come back; after the last two it is told where every vCPU runs.
//! Every buffer of a tick is kept here and reused, so that a warm tick allocates nothing.

use pvmm_scheduler::capacity::group_capacity;
use pvmm_scheduler::{
    CpuSet, Decision, Engine, EngineConfig, HostTopology, PlaceError, PlacementPolicy, VcpuId,
    VcpuLoad,
};

use crate::hotplug::OnlineCpus;
use crate::phase::{PhaseClock, PhaseTimer, Totals};

/// What members did with a placement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// vCPUs that moved (a first placement is not a move).
    pub moved: u64,
    /// Affinity changes or placements the host or a member refused.
    pub refused: u64,
}

impl std::ops::AddAssign for Applied {
    fn add_assign(&mut self, other: Applied) {
        self.moved += other.moved;
        self.refused += other.refused;
    }
}

/// Whether an outside balancer places the members at this tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Outside {
    /// The members are placed by the loop's own policy.
    #[default]
    No,
    /// An outside balancer's lease holds: its assignments are applied, the engine waits.
    Active,
    /// The outside balancer's lease ran out without renewal at this tick.
    Lapsed,
}

/// Requests taken from the members' control channel since the last tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Control {
    /// A new policy.
    pub policy: Option<PlacementPolicy>,
    /// Who places.
    pub outside: Outside,
}

/// What a tick hands to [`Members::report`].
#[derive(Debug)]
pub struct TickReport<'a> {
    /// Time since the loop started, in ns.
    pub now_ns: u64,
    /// The policy placed under.
    pub policy: PlacementPolicy,
    /// The engine's decision, when the engine placed at this tick.
    pub decision: Option<&'a Decision>,
    /// An outside balancer placed at this tick.
    pub outside: bool,
    /// vCPUs moved at this tick.
    pub moved: u64,
    /// The loop's totals, with this tick's phases up to `apply` in [`Totals::last`].
    pub totals: &'a Totals,
    /// The CPUs placed on.
    pub topology: &'a HostTopology,
    /// Each package's capacity, in the topology's package order.
    pub package_capacity: &'a [u32],
    /// All CPUs placed on.
    pub all_cpus: &'a CpuSet,
}

/// What the loop places: the vCPU threads of one VM, of every VM on a host, or simulated ones.
///
/// The loop calls these in the order of the module's phases. The assignments of a decision
/// follow the order in which [`Members::sample`] pushed the loads.
pub trait Members {
    /// What applying can fail with; an engine refusal becomes one too.
    type Error: From<PlaceError>;

    /// Finds members that joined or left since the last tick.
    fn discover(&mut self) {}

    /// Reads each vCPU's load into `loads` (empty on entry).
    fn sample(&mut self, now_ns: u64, loads: &mut Vec<VcpuLoad>);

    /// Requests that came in up to this tick (at `now_ns`, the tick's own instant, so that a
    /// lease ends on the clock the tick reports).
    fn control(&mut self, _now_ns: u64) -> Control {
        Control::default()
    }

    /// An outside balancer's lease ran out: the loop's own `policy` places again.
    fn lease_lapsed(&mut self, _policy: PlacementPolicy) {}

    /// Calls `assume` with the CPU each vCPU that the engine has not placed yet runs on now.
    /// With `fresh`, the engine has just been made afresh and no vCPU is placed by it yet.
    fn assume(&mut self, fresh: bool, assume: &mut dyn FnMut(VcpuId, u32));

    /// Calls `limit` with each vCPU whose CPUs are limited from outside (an operator's pin, a
    /// cgroup cpuset) and the CPUs it may use, or None for a limit lifted. With `fresh`, the
    /// engine holds no limit yet.
    fn limits(&mut self, _fresh: bool, _limit: &mut dyn FnMut(VcpuId, Option<CpuSet>)) {}

    /// The CPUs placed on changed (CPUs went offline or came back).
    fn topology_changed(&mut self, _topology: &HostTopology) {}

    /// Applies the engine's decision.
    fn apply(&mut self, decision: &Decision) -> Result<Applied, Self::Error>;

    /// Applies an outside balancer's assignments.
    fn apply_outside(&mut self, _topology: &HostTopology) -> Applied {
        Applied::default()
    }

    /// No one places (the `none` policy): notes where the host ran each thread.
    fn follow_host(&mut self, _topology: &HostTopology) {}

    /// The policy became `none`: every thread is allowed `all` again.
    fn release(&mut self, _all: &CpuSet) {}

    /// The lowest-numbered package holding vCPUs, when the engine did not place at this tick.
    fn lowest_package(&self) -> Option<u32> {
        None
    }

    /// Keeps housekeeping threads on `cpus`; returns the affinity changes refused.
    fn pin_housekeeping(&mut self, _cpus: &CpuSet) -> u64 {
        0
    }

    /// The CPU time the housekeeping threads ([`Members::pin_housekeeping`]) used since the
    /// last reading, over the time since then: 1024 = one CPU (several threads may use more);
    /// 0 at the first reading. The engine counts it on the package they were kept on.
    fn sample_housekeeping(&mut self, _now_ns: u64) -> u32 {
        0
    }

    /// Tells the guests each vCPU's capacity.
    fn publish(&mut self) {}

    /// Reports the tick.
    fn report(&mut self, _tick: &TickReport<'_>) {}
}

/// The placement loop's state between ticks.
pub struct Tick {
    policy: PlacementPolicy,
    topology: HostTopology,
    config: EngineConfig,
    engine: Option<Engine>,
    /// The next tick tells the engine where every vCPU runs.
    fresh: bool,
    /// An outside balancer placed at the last tick.
    outside: bool,
    online: Option<(OnlineCpus, &'static str)>,
    clock: PhaseClock,
    /// Each package's CPUs, in package order.
    package_cpus: Vec<CpuSet>,
    /// Each package's capacity, in package order.
    package_capacity: Vec<u32>,
    all_cpus: CpuSet,
    loads: Vec<VcpuLoad>,
    /// The package housekeeping threads were kept on at the last tick, if any.
    housekeeping_package: Option<u32>,
    /// What they used since ([`Members::sample_housekeeping`]).
    housekeeping_util: u32,
    decision: Decision,
    totals: Totals,
}

impl Tick {
    /// A loop placing under `policy` on `topology`, timing its phases on `clock`.
    pub fn new(
        policy: PlacementPolicy,
        topology: HostTopology,
        config: EngineConfig,
        clock: PhaseClock,
    ) -> Self {
        let mut tick = Self {
            engine: None,
            policy,
            topology,
            config,
            fresh: false,
            outside: false,
            online: None,
            clock,
            package_cpus: Vec::new(),
            package_capacity: Vec::new(),
            all_cpus: CpuSet::new(),
            loads: Vec::new(),
            housekeeping_package: None,
            housekeeping_util: 0,
            decision: Decision::default(),
            totals: Totals::default(),
        };
        tick.engine = tick.make_engine();
        tick.topology_changed();
        tick
    }

    /// Follows host CPUs going offline and coming back; `who` names the loop in the log line.
    pub fn with_online_cpus(mut self, online: OnlineCpus, who: &'static str) -> Self {
        self.online = Some((online, who));
        self
    }

    /// The policy placed under.
    pub fn policy(&self) -> PlacementPolicy {
        self.policy
    }

    /// The CPUs placed on.
    pub fn topology(&self) -> &HostTopology {
        &self.topology
    }

    /// Each package's capacity (SMT counted as the engine counts it), in package order.
    pub fn package_capacity(&self) -> &[u32] {
        &self.package_capacity
    }

    /// Each package's CPUs, in package order.
    pub fn package_cpus(&self) -> &[CpuSet] {
        &self.package_cpus
    }

    /// All CPUs placed on.
    pub fn all_cpus(&self) -> &CpuSet {
        &self.all_cpus
    }

    /// Whether an outside balancer placed at the last tick.
    pub fn outside(&self) -> bool {
        self.outside
    }

    /// The engine's last decision (empty before the first).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// What a member reports of the loop between ticks (a snapshot before the first tick, or
    /// one written again): the state of the last tick at `now_ns`, with `moved` moves.
    pub fn report_at(&self, now_ns: u64, moved: u64) -> TickReport<'_> {
        TickReport {
            now_ns,
            policy: self.policy,
            decision: None,
            outside: self.outside,
            moved,
            totals: &self.totals,
            topology: &self.topology,
            package_capacity: &self.package_capacity,
            all_cpus: &self.all_cpus,
        }
    }

    /// The running totals.
    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    fn make_engine(&self) -> Option<Engine> {
        match self.policy {
            PlacementPolicy::None => None,
            PlacementPolicy::Managed(p) => Some(Engine::new(self.topology.clone(), p, self.config)),
        }
    }

    fn topology_changed(&mut self) {
        let topology = &self.topology;
        self.package_cpus = topology
            .packages()
            .iter()
            .map(|p| topology.package_cpus(p.id))
            .collect();
        self.package_capacity = self
            .package_cpus
            .iter()
            .map(|cpus| group_capacity(topology, cpus).capacity)
            .collect();
        self.all_cpus = topology.cpu_set();
    }

    /// A fresh engine, told at the next decision where each vCPU runs now.
    pub fn restart(&mut self) {
        self.engine = self.make_engine();
        self.fresh = true;
    }

    /// Switches policy: a fresh engine; `none` hands every thread back to the host.
    pub fn set_policy<M: Members>(&mut self, policy: PlacementPolicy, members: &mut M) {
        if policy == self.policy {
            return;
        }
        self.policy = policy;
        self.engine = self.make_engine();
        self.totals.policy_changes += 1;
        if policy == PlacementPolicy::None {
            members.release(&self.all_cpus);
        }
    }

    /// Places on the CPUs online now, when they changed: a fresh engine, told where every vCPU
    /// runs, so that only the vCPUs of CPUs gone move and a CPU that returns is used again.
    fn follow_online_cpus<M: Members>(&mut self, members: &mut M) {
        let Some((online, who)) = self.online.as_mut() else {
            return;
        };
        if let Some(topology) = online.follow(who) {
            self.topology = topology;
            self.topology_changed();
            members.topology_changed(&self.topology);
            self.restart();
        }
    }

    /// Takes the members' control requests; whether an outside balancer places at this tick.
    fn take_control<M: Members>(&mut self, now_ns: u64, members: &mut M) -> bool {
        let control = members.control(now_ns);
        if let Some(policy) = control.policy {
            self.set_policy(policy, members);
        }
        match control.outside {
            Outside::Active => {
                self.outside = true;
                return true;
            }
            Outside::Lapsed => members.lease_lapsed(self.policy),
            Outside::No => {}
        }
        if std::mem::take(&mut self.outside) {
            // The engine's view of where vCPUs are is stale: start it afresh, from where the
            // outside balancer left them.
            self.restart();
        }
        false
    }

    /// Runs the engine into `self.decision`; false under the `none` policy.
    fn decide<M: Members>(&mut self, now_ns: u64, members: &mut M) -> Result<bool, M::Error> {
        let Some(engine) = self.engine.as_mut() else {
            return Ok(false);
        };
        let fresh = std::mem::take(&mut self.fresh);
        members.assume(fresh, &mut |id, cpu| {
            engine.assume(id, cpu);
        });
        members.limits(fresh, &mut |id, cpus| engine.set_allowed(id, cpus));
        // A package gone offline is not counted: the engine has just started afresh without it.
        engine.set_housekeeping(self.housekeeping_package, self.housekeeping_util);
        engine.place_into(now_ns / 1_000_000, &self.loads, &mut self.decision)?;
        Ok(true)
    }

    /// Keeps housekeeping threads on the lowest-numbered package holding vCPUs, while the
    /// loop or an outside balancer places them, and notes that package for the next decision.
    /// A package the engine counted their load on counts as holding vCPUs: vCPUs that left it
    /// to make room for the threads must not draw the threads after them, or each would
    /// follow the other from package to package every tick. Returns refused affinity changes.
    fn pin_housekeeping<M: Members>(
        &mut self,
        decided: bool,
        outside: bool,
        members: &mut M,
    ) -> u64 {
        self.housekeeping_package = None;
        if self.policy == PlacementPolicy::None && !outside {
            return 0;
        }
        let home = if decided {
            let counted = self.engine.as_ref().and_then(Engine::housekeeping_package);
            let vcpus = self.decision.assignments.iter().map(|a| a.package).min();
            vcpus.into_iter().chain(counted).min()
        } else {
            members.lowest_package()
        };
        let Some(home) = home else {
            return 0;
        };
        let packages = self.topology.packages().iter();
        match packages
            .zip(&self.package_cpus)
            .find_map(|(p, cpus)| (p.id == home).then_some(cpus))
        {
            Some(cpus) if !cpus.is_empty() => {
                self.housekeeping_package = Some(home);
                members.pin_housekeeping(cpus)
            }
            _ => 0,
        }
    }

    /// One tick at `now_ns` (time since the loop started). Returns the engine's decision, or
    /// None when the engine did not place (the `none` policy, an outside balancer).
    pub fn run<M: Members>(
        &mut self,
        now_ns: u64,
        members: &mut M,
    ) -> Result<Option<&Decision>, M::Error> {
        let mut timer = PhaseTimer::start(self.clock);
        self.totals.last = Default::default();
        members.discover();
        self.totals.last.discover_ns = timer.lap();
        self.loads.clear();
        members.sample(now_ns, &mut self.loads);
        self.housekeeping_util = members.sample_housekeeping(now_ns);
        self.follow_online_cpus(members);
        self.totals.last.read_ns = timer.lap();
        let outside = self.take_control(now_ns, members);
        let decided = !outside && self.decide(now_ns, members)?;
        self.totals.last.decide_ns = timer.lap();
        let applied = if outside {
            members.apply_outside(&self.topology)
        } else if decided {
            members.apply(&self.decision)?
        } else {
            members.follow_host(&self.topology);
            Applied::default()
        };
        let own_refused = self.pin_housekeeping(decided, outside, members);
        members.publish();
        self.totals.ticks += 1;
        self.totals.migrations += applied.moved;
        self.totals.apply_errors += applied.refused + own_refused;
        self.totals.last.apply_ns = timer.lap();
        members.report(&TickReport {
            now_ns,
            policy: self.policy,
            decision: decided.then_some(&self.decision),
            outside,
            moved: applied.moved,
            totals: &self.totals,
            topology: &self.topology,
            package_capacity: &self.package_capacity,
            all_cpus: &self.all_cpus,
        });
        self.totals.last.report_ns = timer.lap();
        let last = self.totals.last;
        self.totals.time.add(&last);
        Ok(decided.then_some(&self.decision))
    }
}

#[cfg(test)]
mod tests;
