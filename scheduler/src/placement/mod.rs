//! The placement engine: one decision, for all vCPUs of all VMs at once, of the
//! host CPU each vCPU thread may run on.
//!
//! # How a decision is made
//!
//! Every vCPU has a *weight*: its demand (module `demand`: a slower average
//! of its utilization, 0..=1024, that a lasting rise lifts at once), at least
//! [`MIN_VCPU_WEIGHT`]. The engine then works in one of two modes.
//!
//! **Spread** (policy `performance`, or any policy while the host is
//! overutilized; module `spread`): each vCPU goes to the least loaded package,
//! then the least loaded core in it, then the least loaded thread, loads being
//! weights relative to capacity. A vCPU keeps its current CPU unless, with its
//! own weight taken off, the least loaded CPU is clearly (about 5 %) less
//! loaded at package (busy vCPUs only), core or CPU level (so two busy vCPUs
//! never stay on one core while another core is idle, but small imbalances do
//! not move anything). Spread mode has no fit test: it balances loads.
//!
//! **Pack** (`balance`, `powersaving`; module `pack`): every vCPU has a *fit
//! demand* `min(weight x 1280, slot)`: its weight plus the 20 % headroom of
//! the fit rule, but never more than one CPU slot (an always-busy vCPU fills
//! one slot; it cannot use headroom). Slots are one thread per core for
//! `balance`, every logical CPU for `powersaving` (an SMT thread's slot is its
//! share of the core, 1178 / 2). A package fits a set of vCPUs while the sum
//! of their fit demands is at most the sum of its slots, a CPU while their
//! demands fit its slot. The engine computes how many packages the total
//! needs, applies thrash control (module `ramp`: up at once, down along a
//! quadratic ramp) and uses the `k` lowest numbered packages (so a
//! consolidating host always empties its high packages, whatever a tick's
//! noise says). Then:
//!
//! 1. *Stay*: a vCPU keeps its CPU while its package is in use and still has
//!    room (vCPUs at their VM's home package, the lowest numbered package in
//!    use that holds any of the VM's vCPUs, are counted first; one away from
//!    home leaves when home has a CPU it fits on, except while the ramp holds
//!    surplus packages). Busy vCPUs
//!    claim room first: one away from home, or whose CPU is taken, moves to a
//!    CPU of home / its package that fits it before lighter vCPUs stay there.
//! 2. *Relieve*: on a CPU that is clearly too full (its vCPUs use more than
//!    90 % of it, or it holds a busy vCPU and others: a CPU is filled with
//!    the fit rule's headroom but emptied
//!    only past this, so demands drifting around a slot's edge move nothing),
//!    the smallest vCPUs move to a CPU of the same package where they fit
//!    (each such move lowers the total overflow, so this cannot cycle).
//! 3. *Place* the rest VM by VM, largest VM first: its home package if it
//!    fits, else the first package that fits the whole VM, else the first that
//!    fits the vCPU, else one more package at once; first fit over CPUs in
//!    packing order, the least loaded slot when no slot has room.
//! 4. `powersaving:2` only: the preferred package (package 0) pulls every
//!    VM with a busy vCPU that it can take whole, at once.
//!
//! When whole vCPUs and VMs need more packages than the total suggested, that
//! count is remembered until the demand is clearly lower, so the ramp does not
//! retry an impossible consolidation every window.
//!
//! When the whole host's fit demand exceeds the sum of its slots, every
//! policy spreads instead of packing.
//!
//! The placing process's own threads (a VMM's device threads, say) are load
//! too, on the package they are kept on ([`Engine::set_housekeeping`]; module
//! `housekeeping`): it counts in the host's total fit demand, takes room from
//! that package before any vCPU in pack mode, and adds to its load in spread
//! mode. So vCPUs that fill a package with their I/O threads make a packing
//! policy open another; where the package still cannot hold both (spread
//! mode, an overutilized host), its vCPUs' capacities are lowered by the
//! excess.
//!
//! Migrations are bounded per vCPU by a token bucket (module `tokens`,
//! [`EngineConfig::max_migrations_per_vcpu_per_s`]); a vCPU without a token
//! stays where it is, whatever the policy wants.
//!
//! # Modules
//!
//! - `layout`: the topology as dense arrays, with the policy's slots;
//! - `index`: dense CPU and package indices, distinct from CPU and package ids;
//! - `vcpus`: the vCPUs known between decisions, matched to the input by id;
//! - `demand`: each vCPU's demand, the weight of the decisions;
//! - `housekeeping`: the load of threads that are not vCPUs, on their package;
//! - `tokens`: the migration token bucket;
//! - `ramp`: thrash control for the number of packages in use;
//! - `draft`: the decision being built, shared by both modes;
//! - `spread` and `pack`: the two modes, each with its own scratch.

use thiserror::Error;

use crate::capacity::CpuOffer;
use crate::cpuset::CpuSet;
use crate::policy::Policy;
use crate::topology::HostTopology;

mod allowed;
mod demand;
mod draft;
mod housekeeping;
mod index;
mod layout;
mod pack;
mod ramp;
mod spread;
mod tokens;
mod vcpus;

pub use demand::{DEFAULT_DEMAND_HALF_LIFE_MS, DEMAND_FLAT_OUT_UTIL};
use draft::{reset, Draft, ScratchSizes};
use housekeeping::Housekeeping;
pub use housekeeping::MIN_HOUSEKEEPING_UTIL;
use index::{dense, CpuIndex};
use layout::Layout;
use pack::PackScratch;
use ramp::Ramp;
use spread::SpreadScratch;
use vcpus::VcpuState;

/// Default consolidation ramp: 5 s, as powernv's global pstate ramp-down
/// (5120 ms there). Long enough that a load dipping between bursts of a
/// kernel build does not trigger a consolidate/spread cycle.
pub const DEFAULT_RAMP_DOWN_WINDOW_MS: u64 = 5000;

/// Default placement tick (ms), for pvmm and the simulator alike: fast enough to spread a vCPU
/// that turns busy within a few hundred milliseconds, slow enough that reading stats and
/// deciding costs well under 1 % of a CPU.
pub const DEFAULT_TICK_MS: u64 = 100;

/// Default migration bound: a bucket of 2 moves, refilled at 2 moves per
/// second (module `tokens`: at most 3 moves within any one second). A
/// migrated vCPU refills its L1/L2 (a few hundred microseconds to
/// milliseconds of slower execution); 2 moves per second on average keeps
/// that cost under about 1 % while still letting a vCPU leave a package
/// within one 100 ms tick when it must.
pub const DEFAULT_MAX_MIGRATIONS_PER_VCPU_PER_S: u32 = 2;

/// Smallest weight a vCPU counts for (about 1.6 % of a CPU). An idle guest
/// vCPU still wakes for timers and interrupts; the floor also spreads idle
/// vCPUs by count under `performance` and caps how many idle vCPUs
/// `powersaving` stacks on one CPU (819 / 16 = 51).
pub const MIN_VCPU_WEIGHT: u32 = 16;

/// A CPU counts as busy, for its SMT siblings' capacity, when the vCPUs on it
/// have this much utilization in total (half a CPU) or any of them is busy now.
pub const BUSY_CPU_UTIL: u64 = 512;

/// Identifies one vCPU of one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VcpuId {
    /// VM id, unique on the host.
    pub vm: u32,
    /// vCPU index within the VM.
    pub vcpu: u32,
}

/// The engine's input for one vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VcpuLoad {
    /// Which vCPU.
    pub id: VcpuId,
    /// Decayed utilization, 0..=1024 (larger values are clamped), e.g. from
    /// [`crate::util::UtilTracker::util`].
    pub util: u32,
    /// Whether it is running now ([`crate::util::UtilTracker::is_busy`]).
    pub busy: bool,
    /// The part of `util` it spent runnable but waiting for a host CPU, 0..=`util` (larger
    /// values are clamped): the contention it met where it sits, not load of its own. 0 where
    /// the source cannot tell waiting from running. See `demand` for how it is used.
    pub waited: u32,
}

/// Engine tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Quadratic consolidation ramp length ([`DEFAULT_RAMP_DOWN_WINDOW_MS`]).
    /// 0 consolidates as soon as the load allows.
    pub ramp_down_window_ms: u64,
    /// Migrations a vCPU may make per second on average, with bursts up to
    /// this many: a token bucket of this many moves refilled at this many per
    /// second, so up to one more than this many fall within one second
    /// ([`DEFAULT_MAX_MIGRATIONS_PER_VCPU_PER_S`]). 0 pins every vCPU to its
    /// first placement.
    pub max_migrations_per_vcpu_per_s: u32,
    /// Half-life in ms of the demand average the engine packs on
    /// ([`DEFAULT_DEMAND_HALF_LIFE_MS`]); 0 packs on each decision's
    /// utilization as given.
    pub demand_half_life_ms: u32,
    /// Packing policies only: let each vCPU's thread run on every CPU of its
    /// package that the decision uses ([`Assignment::cpus`]), not only on
    /// the CPU chosen for it. Where a package holds more vCPUs than CPUs, a
    /// pinned vCPU that wakes waits behind the other vCPUs of its CPU while
    /// a CPU beside it may idle; with the package's CPUs shared, the host
    /// scheduler's wake-up path runs it on the idle one at once (the engine
    /// decides every 100 ms, bursts last milliseconds). Packages are chosen
    /// as before, so the same packages sleep. Off by default.
    pub share_package: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            ramp_down_window_ms: DEFAULT_RAMP_DOWN_WINDOW_MS,
            max_migrations_per_vcpu_per_s: DEFAULT_MAX_MIGRATIONS_PER_VCPU_PER_S,
            demand_half_life_ms: DEFAULT_DEMAND_HALF_LIFE_MS,
            share_package: false,
        }
    }
}

/// Where one vCPU may run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// Which vCPU.
    pub id: VcpuId,
    /// Host CPUs its thread may run on: `cpu`, or with
    /// [`EngineConfig::share_package`] under a packing policy, every CPU of
    /// its package that holds a vCPU in this decision.
    pub cpus: CpuSet,
    /// The CPU the engine chose for it (its capacity is counted there).
    pub cpu: u32,
    /// Package id of those CPUs.
    pub package: u32,
    /// Capacity the vCPU can get there running flat out, 1..=1024: its CPU's
    /// share of the core (less when an SMT sibling is busy, and less what
    /// the housekeeping threads take from it when their package has no room
    /// left for them, [`Engine::set_housekeeping`]) minus what the other
    /// vCPUs on that CPU use, but at least an equal share of it
    /// ([`crate::capacity::CpuOffer`]).
    pub capacity: u32,
}

/// A change of the CPU the engine chose for a vCPU ([`Assignment::cpu`])
/// from the previous decision.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Migration {
    /// Which vCPU.
    pub id: VcpuId,
    /// Its previous CPU.
    pub from: CpuSet,
    /// Its new CPU.
    pub to: CpuSet,
}

/// One placement decision.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// One per input [`VcpuLoad`], in the same order.
    pub assignments: Vec<Assignment>,
    /// vCPUs whose CPUs changed since the previous decision, in input order.
    /// A vCPU placed for the first time is not a migration: its CPUs are in
    /// `assignments` (which a first decision of 10,000 vCPUs would otherwise
    /// repeat in another half megabyte).
    pub migrations: Vec<Migration>,
    /// The host had no headroom for the policy (total fit demand above its
    /// capacity), so the engine spread the load instead of packing it.
    pub overutilized: bool,
    /// Packages the policy allowed this time (all of them when spreading).
    pub target_packages: u32,
    /// `powersaving:2`'s preferred package id (where waking vCPUs go).
    pub preferred_package: Option<u32>,
}

impl Decision {
    /// Number of moves: `migrations.len()`.
    pub fn moves(&self) -> usize {
        self.migrations.len()
    }

    /// Package ids hosting at least one vCPU, ascending.
    pub fn used_packages(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.assignments.iter().map(|a| a.package).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Errors from [`Engine::place`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlaceError {
    /// The same vCPU appeared twice in one input.
    #[error("vCPU {vcpu} of VM {vm} appears more than once in the load list", vm = .0.vm, vcpu = .0.vcpu)]
    DuplicateVcpu(VcpuId),
}

/// The placement engine. See the module documentation for the algorithm.
#[derive(Debug, Clone)]
pub struct Engine {
    topology: HostTopology,
    policy: Policy,
    config: EngineConfig,
    layout: Layout,
    vcpus: Vec<VcpuState>,
    num_vms: usize,
    /// Duplicate check of `sync_state`: bit `v` of VM `m`'s bits is vCPU `v`
    /// of the VM with dense index `m`.
    seen_bits: Vec<u64>,
    ramp: Ramp,
    /// Time of the previous decision, for the demand average.
    last_ms: Option<u64>,
    /// (total fit demand, packages) of the last decision that had to open
    /// more packages than the total needed.
    fragmentation: Option<(u64, usize)>,
    draft: Draft,
    spread: SpreadScratch,
    pack: PackScratch,
    /// Where vCPUs the engine has not placed yet already run ([`Engine::assume`]): taken as
    /// their previous CPU when they first appear.
    assumed: std::collections::HashMap<VcpuId, CpuIndex>,
    /// Packages (the lowest ones) holding the vCPUs adopted where they ran
    /// since the previous decision; 0 when none were.
    adopted_packages: usize,
    /// The CPUs some vCPUs are limited to ([`Engine::set_allowed`]).
    allowed: std::collections::HashMap<VcpuId, CpuSet>,
    /// The placing process's own threads' load ([`Engine::set_housekeeping`]).
    housekeeping: Housekeeping,
}

impl Engine {
    /// An engine with no vCPU history.
    pub fn new(topology: HostTopology, policy: Policy, config: EngineConfig) -> Self {
        let layout = Layout::new(&topology, policy);
        Engine {
            topology,
            policy,
            config,
            layout,
            vcpus: Vec::new(),
            num_vms: 0,
            seen_bits: Vec::new(),
            ramp: Ramp::default(),
            last_ms: None,
            fragmentation: None,
            draft: Draft::default(),
            spread: SpreadScratch::default(),
            pack: PackScratch::default(),
            assumed: std::collections::HashMap::new(),
            adopted_packages: 0,
            allowed: std::collections::HashMap::new(),
            housekeeping: Housekeeping::default(),
        }
    }

    /// Takes note that vCPU `id`, which this engine has not placed, already runs on host CPU
    /// `cpu` (another placer left it there: a restarted host daemon adopting VMs, or VMs that
    /// placed themselves). When the vCPU first appears in a decision, that CPU counts as its
    /// previous one, so a vCPU already where the engine would put it stays (no migration),
    /// and one moved is counted as a migration. Ignored for a vCPU the engine knows; false
    /// when `cpu` is not in the topology.
    pub fn assume(&mut self, id: VcpuId, cpu: u32) -> bool {
        match self.layout.cpu_index(cpu) {
            Some(index) if !self.vcpus.iter().any(|v| v.id == id) => {
                self.assumed.insert(id, index);
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Counts `util` (1024 = one CPU; threads together may use more) of CPU time that no
    /// vCPU uses on package `package` in the next decisions: the placing process's own threads
    /// (device, console, API threads), kept on that package, used that much since the previous
    /// reading. Each decision averages the readings (a rise counts at once, a fall decays with
    /// [`EngineConfig::demand_half_life_ms`]) and counts the average as that package's load:
    /// in the fit demand that decides how many packages the packing policies use, against the
    /// package's room for vCPUs, and in spread mode's package loads; what the package cannot
    /// hold beside its vCPUs is taken off their capacities ([`Assignment::capacity`]). Without
    /// a reading, or with an average under [`MIN_HOUSEKEEPING_UTIL`], decisions are those of an
    /// engine never told of one. False (and the reading
    /// ignored) when `package` is not in the topology; None clears the package.
    pub fn set_housekeeping(&mut self, package: Option<u32>, util: u32) -> bool {
        let pkg = match package {
            Some(id) => match self.layout.pkg_index(id) {
                Some(pkg) => pkg,
                None => return false,
            },
            None => index::PkgIndex::NONE,
        };
        self.housekeeping.set(pkg, util);
        true
    }

    /// The package the last decision counted a housekeeping load on ([`Engine::set_housekeeping`]),
    /// None when it counted none. That package is in use as much as one holding vCPUs: the
    /// threads' owner keeps them there rather than move them after vCPUs that left to make
    /// room for them (and that would follow them back).
    pub fn housekeeping_package(&self) -> Option<u32> {
        self.housekeeping
            .loaded_pkg()
            .map(|p| self.layout.pkg_id(p))
    }

    /// The host topology placements are made on.
    pub fn topology(&self) -> &HostTopology {
        &self.topology
    }

    /// The policy in use.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The configuration in use.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Switches policy; current placements are kept as the starting point.
    pub fn set_policy(&mut self, policy: Policy) {
        if policy != self.policy {
            self.policy = policy;
            self.layout = Layout::new(&self.topology, policy);
            self.reserve_scratch();
        }
    }

    /// Gives every scratch vector room for the largest length a decision over the current
    /// vCPUs and layout can take: called when either changes, so that the first decision to
    /// take a path the earlier ones did not (spread mode, a first migration) allocates
    /// nothing.
    fn reserve_scratch(&mut self) {
        let l = &self.layout;
        let sizes = ScratchSizes {
            vcpus: self.vcpus.len(),
            vms: self.num_vms,
            cpus: l.num_cpus(),
            cores: l.num_cores(),
            pkgs: l.num_pkgs(),
        };
        self.draft.reserve(sizes);
        self.spread.reserve(sizes);
        self.pack.reserve(sizes);
    }

    /// One decision for all vCPUs of all VMs, at time `now_ms` (any monotonic
    /// clock; it only drives thrash control). Deterministic: the same sequence
    /// of calls gives the same decisions. vCPUs missing from `loads` are
    /// forgotten; new ones are placed for the first time.
    pub fn place(&mut self, now_ms: u64, loads: &[VcpuLoad]) -> Result<Decision, PlaceError> {
        let mut decision = Decision::default();
        self.place_into(now_ms, loads, &mut decision)?;
        Ok(decision)
    }

    /// [`Engine::place`] writing into `out`, whose vectors are reused: with the
    /// same `out` every tick a decision allocates nothing once warm (unless the
    /// vCPU list changes). On error `out` is left empty.
    pub fn place_into(
        &mut self,
        now_ms: u64,
        loads: &[VcpuLoad],
        out: &mut Decision,
    ) -> Result<(), PlaceError> {
        out.assignments.clear();
        out.migrations.clear();
        out.overutilized = false;
        out.target_packages = 0;
        out.preferred_package = None;
        self.sync_state(now_ms, loads)?;
        self.update_demand(now_ms, loads);
        self.draft.begin(&self.layout);
        self.housekeeping.add_load(&mut self.draft);
        self.refill_tokens(now_ms);
        let total_fit: u64 = self
            .draft
            .weight
            .iter()
            .map(|w| layout::fit_demand(*w, self.layout.slots.host_max))
            .sum::<u64>()
            + self.housekeeping.fit(&self.layout);
        let overutilized = total_fit > self.layout.slots.total;
        let (target_packages, preferred) = if !self.policy.packs() || overutilized {
            let num_pkgs = self.layout.num_pkgs();
            self.ramp.up_at_once(num_pkgs);
            self.place_spread(loads);
            (num_pkgs, None)
        } else {
            if self.adopted_packages > 0 {
                // vCPUs adopted where they run keep the packages they are on until the
                // consolidation ramp has passed, as if this engine had opened them: the
                // placer before it knew why they were open (a ramp still holding, whole
                // VMs that did not fit fewer packages), this engine does not yet.
                self.ramp.raise_to(self.adopted_packages);
            }
            self.place_pack(now_ms, loads, total_fit)
        };
        self.adopted_packages = 0;
        self.keep_allowed(loads);
        let share = self.config.share_package && self.policy.packs() && !overutilized;
        self.finish(loads, share, out);
        out.overutilized = overutilized;
        out.target_packages = dense(target_packages);
        out.preferred_package = preferred;
        Ok(())
    }

    /// Each vCPU's weight for this decision: its demand average updated with
    /// `loads`, at least [`MIN_VCPU_WEIGHT`].
    fn update_demand(&mut self, now_ms: u64, loads: &[VcpuLoad]) {
        let dt = self.last_ms.map(|last| now_ms.saturating_sub(last));
        self.last_ms = Some(now_ms);
        let keep = demand::keep_fraction(dt, self.config.demand_half_life_ms);
        self.housekeeping.update(keep);
        let weight = &mut self.draft.weight;
        weight.clear();
        weight.extend(self.vcpus.iter_mut().zip(loads).map(|(v, l)| {
            v.demand.update(l, keep).clamp(
                u64::from(MIN_VCPU_WEIGHT),
                u64::from(crate::capacity::CAPACITY_SCALE),
            )
        }));
    }

    /// Refills every vCPU's migration tokens and notes the placed ones that
    /// have none left.
    fn refill_tokens(&mut self, now_ms: u64) {
        let limit = self.config.max_migrations_per_vcpu_per_s;
        let out_of_tokens = &mut self.draft.out_of_tokens;
        out_of_tokens.clear();
        for v in &mut self.vcpus {
            v.tokens.refill(now_ms, limit);
            out_of_tokens.push(!v.cpu.is_none() && !v.tokens.has_token());
        }
    }

    /// Builds the decision and moves the per-vCPU state forward; with `share`,
    /// each vCPU may run on every CPU its package uses
    /// ([`EngineConfig::share_package`]).
    fn finish(&mut self, loads: &[VcpuLoad], share: bool, out: &mut Decision) {
        self.count_busy_cpus(loads);
        let l = &self.layout;
        let taken = self.housekeeping.taken_per_cpu(l, &self.draft);
        let d = &mut self.draft;
        d.cpu_offer.clear();
        d.cpu_offer.extend((0..l.num_cpus()).map(|c| {
            let busy_threads = d.core_busy[l.cpu_core[c] as usize] + u32::from(!d.cpu_busy[c]);
            let offer = CpuOffer::new(
                l.cpu_capacity[c],
                l.cpu_threads[c],
                busy_threads,
                d.cpu_count[c],
            );
            match taken {
                Some((p, per_cpu)) if l.cpu_pkg[c] == p => offer.less(per_cpu, d.cpu_count[c]),
                _ => offer,
            }
        }));
        let assignments = &mut out.assignments;
        let migrations = &mut out.migrations;
        assignments.reserve(loads.len());
        // Room for every vCPU to move: a first migration after ticks without any (a
        // warm VM's) allocates nothing.
        migrations.reserve(loads.len());
        if share {
            d.pkg_cpus.resize(l.num_pkgs(), CpuSet::new());
            for set in &mut d.pkg_cpus {
                *set = CpuSet::new();
            }
            for c in &d.new_cpu {
                d.pkg_cpus[l.pkg_of(*c).get()].insert(l.cpu_id(*c));
            }
        }
        for (i, load) in loads.iter().enumerate() {
            let c = d.new_cpu[i];
            let cpu = CpuSet::single(l.cpu_id(c));
            let state = &mut self.vcpus[i];
            if state.cpu != c {
                if !state.cpu.is_none() {
                    state.tokens.spend();
                    migrations.push(Migration {
                        id: load.id,
                        from: CpuSet::single(l.cpu_id(state.cpu)),
                        to: cpu.clone(),
                    });
                }
                state.cpu = c;
            }
            let cpus = if share && !self.allowed.is_empty() {
                let package = &d.pkg_cpus[l.pkg_of(c).get()];
                match self.allowed.get(&load.id) {
                    Some(set) if !set.intersection(package).is_empty() => set.intersection(package),
                    _ => package.clone(),
                }
            } else if share {
                d.pkg_cpus[l.pkg_of(c).get()].clone()
            } else {
                cpu
            };
            assignments.push(Assignment {
                id: load.id,
                cpus,
                cpu: l.cpu_id(c),
                package: l.pkg_id(l.pkg_of(c)),
                capacity: d.cpu_offer[c.get()].for_vcpu(d.cpu_load[c.get()] - d.weight[i]),
            });
        }
    }

    /// Marks the busy CPUs of the draft (a busy vCPU on them, or at least
    /// [`BUSY_CPU_UTIL`] of load) and counts them per core, for SMT sharing.
    fn count_busy_cpus(&mut self, loads: &[VcpuLoad]) {
        let l = &self.layout;
        let d = &mut self.draft;
        reset(&mut d.cpu_busy, l.num_cpus(), false);
        for (i, load) in loads.iter().enumerate() {
            d.cpu_busy[d.new_cpu[i].get()] |= load.busy;
        }
        for c in 0..l.num_cpus() {
            if d.cpu_load[c] >= BUSY_CPU_UTIL {
                d.cpu_busy[c] = true;
            }
            if d.cpu_busy[c] {
                d.core_busy[l.cpu_core[c] as usize] += 1;
            }
        }
    }
}
