//! The placement engine: one decision, for all vCPUs of all VMs at once, of the
//! host CPU each vCPU thread may run on.
//!
//! # How a decision is made
//!
//! Every vCPU has a *weight*: its utilization (0..=1024), at least
//! [`MIN_VCPU_WEIGHT`]. The engine then works in one of two modes.
//!
//! **Spread** (policy `performance`, or any policy while the host is
//! overutilized; module `spread`): each vCPU goes to the least loaded package,
//! then the least loaded core in it, then the least loaded thread, loads being
//! weights relative to capacity. A vCPU keeps its current CPU unless, with its
//! own weight taken off, the least loaded CPU is clearly (about 5 %) less
//! loaded at package (busy vCPUs only), core or CPU level (so two busy vCPUs
//! never stay on one core while another core is idle, but small imbalances do
//! not move anything).
//!
//! **Pack** (`balance`, `powersaving`): every vCPU has a *fit demand*
//! `min(weight x 1280, slot)`: its weight plus the 20 % headroom of the fit
//! rule, but never more than one CPU slot (an always-busy vCPU fills one slot;
//! it cannot use headroom). Slots are one thread per core for `balance`, every
//! logical CPU for `powersaving` (an SMT thread's slot is its share of the
//! core, 1178 / 2). A package fits a set of vCPUs while the sum of their fit
//! demands is at most the sum of its slots. The engine computes how many
//! packages the total needs, applies thrash control (up at once, down along a
//! quadratic ramp) and uses the `k` lowest numbered packages (so a consolidating
//! host always empties its high packages, whatever a tick's noise says). Then:
//!
//! 1. *Stay*: a vCPU keeps its CPU while its package is in use and still has
//!    room (vCPUs at their VM's home package, the lowest numbered package in
//!    use that holds any of the VM's vCPUs, are counted first; one away from
//!    home leaves when home has a CPU it fits on, except while the ramp holds
//!    surplus packages). Busy vCPUs
//!    claim room first: one away from home, or whose CPU is taken, moves to a
//!    CPU of home / its package that fits it before lighter vCPUs stay there.
//! 2. *Relieve*: on a CPU that is too full, the smallest vCPUs move to a CPU
//!    of the same package where they fit (each such move lowers the total
//!    overflow, so this cannot cycle).
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
//! Migrations are bounded per vCPU by a token bucket
//! ([`EngineConfig::max_migrations_per_vcpu_per_s`]); a vCPU without a token
//! stays where it is, whatever the policy wants.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use thiserror::Error;

use crate::capacity::{
    capacity_greater, core_capacity, thread_share, CpuOffer, CAPACITY_GREATER_MARGIN,
    CAPACITY_SCALE, FIT_MARGIN,
};
use crate::cpuset::CpuSet;
use crate::policy::Policy;
use crate::topology::HostTopology;

mod spread;

/// Default consolidation ramp: 5 s, as powernv's global pstate ramp-down
/// (5120 ms there). Long enough that a load dipping between bursts of a
/// kernel build does not trigger a consolidate/spread cycle.
pub const DEFAULT_RAMP_DOWN_WINDOW_MS: u64 = 5000;

/// Default migration bound. A migrated vCPU refills its L1/L2 (a few hundred
/// microseconds to milliseconds of slower execution); at most 2 moves per
/// second keeps that cost under about 1 % while still letting a vCPU leave a
/// package within one 100 ms tick when it must.
pub const DEFAULT_MAX_MIGRATIONS_PER_VCPU_PER_S: u32 = 2;

/// Smallest weight a vCPU counts for (about 1.6 % of a CPU). An idle guest
/// vCPU still wakes for timers and interrupts; the floor also spreads idle
/// vCPUs by count under `performance` and caps how many idle vCPUs
/// `powersaving` stacks on one CPU (819 / 16 = 51).
pub const MIN_VCPU_WEIGHT: u32 = 16;

/// A CPU counts as busy, for its SMT siblings' capacity, when the vCPUs on it
/// have this much utilization in total (half a CPU) or any of them is busy now.
pub const BUSY_CPU_UTIL: u64 = 512;

/// Token cost of one migration in the bucket's fixed-point units.
const TOKEN: u64 = 1000;

/// Marks "no CPU" in dense CPU index arrays.
const NO_CPU: u32 = u32::MAX;

/// vCPU numbers below this are checked for duplicates in a bitmap per VM
/// (pvmm's limit is 255 vCPUs); larger ones, in a map.
const SEEN_BITS_PER_VM: u32 = 256;

/// Marks "no package" in dense package index arrays.
const NO_PKG: u32 = u32::MAX;

/// Hash map keyed by a packed id, with [`IdHasher`].
type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Packs a vCPU id into one integer key.
fn id_key(id: VcpuId) -> u64 {
    (u64::from(id.vm) << 32) | u64::from(id.vcpu)
}

/// SplitMix64's finalizer as a hasher for integer keys: a few cycles per key
/// (SipHash costs tens of nanoseconds, too much for 10,000 vCPUs per tick) and
/// every input bit reaches every output bit. Keys are ours, not an attacker's.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = self.0.rotate_left(32) ^ value;
    }
}

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
}

/// Engine tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Quadratic consolidation ramp length ([`DEFAULT_RAMP_DOWN_WINDOW_MS`]).
    /// 0 consolidates as soon as the load allows.
    pub ramp_down_window_ms: u64,
    /// Migrations a vCPU may make per second, with bursts up to this many
    /// ([`DEFAULT_MAX_MIGRATIONS_PER_VCPU_PER_S`]). 0 pins every vCPU to its
    /// first placement.
    pub max_migrations_per_vcpu_per_s: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            ramp_down_window_ms: DEFAULT_RAMP_DOWN_WINDOW_MS,
            max_migrations_per_vcpu_per_s: DEFAULT_MAX_MIGRATIONS_PER_VCPU_PER_S,
        }
    }
}

/// Where one vCPU may run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// Which vCPU.
    pub id: VcpuId,
    /// Host CPUs its thread may run on (one CPU).
    pub cpus: CpuSet,
    /// Package id of those CPUs.
    pub package: u32,
    /// Capacity the vCPU can get there running flat out, 1..=1024: its CPU's
    /// share of the core (less when an SMT sibling is busy) minus what the
    /// other vCPUs on that CPU use, but at least an equal share of it
    /// ([`crate::capacity::effective_capacity`]).
    pub capacity: u32,
}

/// A change of a vCPU's allowed CPUs from the previous decision.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Migration {
    /// Which vCPU.
    pub id: VcpuId,
    /// Its previous CPUs.
    pub from: CpuSet,
    /// Its new CPUs.
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

/// Per-vCPU state kept between decisions.
#[derive(Debug, Clone, Copy)]
struct VcpuState {
    id: VcpuId,
    /// Dense VM index.
    vm: u32,
    /// Dense CPU index of the previous decision, or [`NO_CPU`].
    cpu: u32,
    /// Migration tokens x [`TOKEN`].
    tokens: u64,
    /// When `tokens` was last refilled.
    refill_ms: u64,
}

/// The topology flattened into dense arrays, with the policy's capacities.
/// Dense CPU order is package, core, thread, so each package's and each
/// core's CPUs form a contiguous range.
#[derive(Debug, Clone, Default)]
struct Layout {
    pkg_id: Vec<u32>,
    /// First dense CPU of each package, plus the total at the end.
    pkg_cpu_start: Vec<u32>,
    /// First core index of each package, plus the total at the end.
    pkg_core_start: Vec<u32>,
    /// First dense CPU of each core, plus the total at the end.
    core_cpu_start: Vec<u32>,
    cpu_id: Vec<u32>,
    cpu_pkg: Vec<u32>,
    cpu_core: Vec<u32>,
    cpu_capacity: Vec<u32>,
    cpu_threads: Vec<u32>,
    /// Spread capacities (all threads busy).
    spread_cpu_cap: Vec<u64>,
    spread_core_cap: Vec<u64>,
    spread_pkg_cap: Vec<u64>,
    spread_total_cap: u64,
    /// Packing slot of each CPU in fit units (capacity x 1024); 0 = not a slot.
    slot: Vec<u64>,
    pkg_fit_cap: Vec<u64>,
    pkg_slot_max: Vec<u64>,
    /// Whether all cores of a package have the same spread capacity.
    pkg_uniform_cores: Vec<bool>,
    /// Whether all threads of a core have the same spread capacity.
    core_uniform_threads: Vec<bool>,
    /// Whether all packages have the same spread capacity.
    uniform_pkgs: bool,
    /// All of the above: comparing loads relative to capacity is comparing
    /// loads at every level (spread mode's constant-time stay test).
    spread_uniform: bool,
    /// Every package, every core and every CPU have the same spread
    /// capacity as their likes (loads compare across levels' members).
    equal_caps: bool,
    host_slot_max: u64,
    total_fit_cap: u64,
    /// Dense CPUs in packing order; package p's are at its `pkg_cpu_start` range.
    pack_order: Vec<u32>,
}

impl Layout {
    fn new(topology: &HostTopology, policy: Policy) -> Layout {
        let mut l = Layout::default();
        for package in topology.packages() {
            l.pkg_id.push(package.id);
            l.pkg_cpu_start.push(l.cpu_id.len() as u32);
            l.pkg_core_start.push(l.core_cpu_start.len() as u32);
            let pkg_index = l.pkg_id.len() as u32 - 1;
            let mut pkg_spread = 0u64;
            let mut pkg_fit = 0u64;
            let mut pkg_slot_max = 0u64;
            let first_cpu = l.cpu_id.len();
            for core in package.cores() {
                let core_index = l.core_cpu_start.len() as u32;
                l.core_cpu_start.push(l.cpu_id.len() as u32);
                let threads = core.cpus.len() as u32;
                let thread_cap = core
                    .cpus
                    .iter()
                    .filter_map(|id| topology.cpu(*id))
                    .map(|c| c.capacity)
                    .max()
                    .unwrap_or(CAPACITY_SCALE);
                let core_cap = u64::from(core_capacity(thread_cap, threads));
                l.spread_core_cap.push(core_cap);
                pkg_spread += core_cap;
                for (thread, id) in core.cpus.iter().enumerate() {
                    let capacity = topology.cpu(*id).map_or(thread_cap, |c| c.capacity);
                    l.cpu_id.push(*id);
                    l.cpu_pkg.push(pkg_index);
                    l.cpu_core.push(core_index);
                    l.cpu_capacity.push(capacity);
                    l.cpu_threads.push(threads);
                    let share = u64::from(thread_share(capacity, threads, threads));
                    l.spread_cpu_cap.push(share);
                    let slot_capacity = match policy {
                        Policy::Balance if thread == 0 => u64::from(capacity),
                        Policy::Balance => 0,
                        Policy::Performance | Policy::Powersaving { .. } => share,
                    };
                    let slot = slot_capacity * u64::from(CAPACITY_SCALE);
                    l.slot.push(slot);
                    pkg_fit += slot;
                    pkg_slot_max = pkg_slot_max.max(slot);
                }
            }
            let mut order: Vec<u32> = (first_cpu as u32..l.cpu_id.len() as u32).collect();
            if matches!(policy, Policy::Balance) {
                // One thread per core first: every core's thread 0, then thread 1, ...
                let thread_of = |c: u32| {
                    let core = l.cpu_core[c as usize] as usize;
                    c - l.core_cpu_start[core]
                };
                order.sort_by_key(|c| (thread_of(*c), *c));
            }
            l.pack_order.extend(order);
            let core_caps = &l.spread_core_cap[l.pkg_core_start[pkg_index as usize] as usize..];
            l.pkg_uniform_cores
                .push(core_caps.iter().all(|c| *c == core_caps[0]));
            l.spread_pkg_cap.push(pkg_spread);
            l.spread_total_cap += pkg_spread;
            l.pkg_fit_cap.push(pkg_fit);
            l.pkg_slot_max.push(pkg_slot_max);
            l.total_fit_cap += pkg_fit;
            l.host_slot_max = l.host_slot_max.max(pkg_slot_max);
        }
        l.pkg_cpu_start.push(l.cpu_id.len() as u32);
        l.pkg_core_start.push(l.core_cpu_start.len() as u32);
        l.core_cpu_start.push(l.cpu_id.len() as u32);
        l.core_uniform_threads = (0..l.num_cores())
            .map(|k| {
                let caps = &l.spread_cpu_cap
                    [l.core_cpu_start[k] as usize..l.core_cpu_start[k + 1] as usize];
                caps.iter().all(|c| *c == caps[0])
            })
            .collect();
        l.uniform_pkgs = l.spread_pkg_cap.iter().all(|c| *c == l.spread_pkg_cap[0]);
        let all_equal = |caps: &[u64]| caps.iter().all(|c| *c == caps[0]);
        l.equal_caps = all_equal(&l.spread_pkg_cap)
            && all_equal(&l.spread_core_cap)
            && all_equal(&l.spread_cpu_cap);
        l.spread_uniform = l.uniform_pkgs
            && l.pkg_uniform_cores.iter().all(|u| *u)
            && l.core_uniform_threads.iter().all(|u| *u);
        l
    }

    /// Fit demand of weight `w` on dense CPU `c`: against its packing slot, or
    /// its whole capacity on a CPU that is not a slot (balance's sibling threads).
    fn cpu_fit_demand(&self, c: usize, w: u64) -> u64 {
        let slot = self.slot[c];
        if slot > 0 {
            fit_demand(w, slot)
        } else {
            fit_demand(
                w,
                u64::from(self.cpu_capacity[c]) * u64::from(CAPACITY_SCALE),
            )
        }
    }

    fn num_pkgs(&self) -> usize {
        self.pkg_id.len()
    }

    fn num_cpus(&self) -> usize {
        self.cpu_id.len()
    }

    fn num_cores(&self) -> usize {
        self.spread_core_cap.len()
    }
}

/// Fit demand of weight `w` against a slot of `slot` fit units.
fn fit_demand(w: u64, slot: u64) -> u64 {
    (w * FIT_MARGIN).min(slot)
}

/// Whether weight `w` fits a CPU slot of `slot` fit units already filled to
/// `filled` (a slot of 0 takes nothing).
fn slot_fits(filled: u64, w: u64, slot: u64) -> bool {
    slot > 0 && filled + fit_demand(w, slot) <= slot
}

/// `a_num / a_den < b_num / b_den` for non-negative values, dens > 0.
fn ratio_less(a_num: u64, a_den: u64, b_num: u64, b_den: u64) -> bool {
    match (a_num.checked_mul(b_den), b_num.checked_mul(a_den)) {
        (Some(a), Some(b)) => a < b,
        _ => u128::from(a_num) * u128::from(b_den) < u128::from(b_num) * u128::from(a_den),
    }
}

/// Thrash control state for the number of packages in use.
#[derive(Debug, Clone, Copy, Default)]
struct Ramp {
    /// Packages in use (0 before the first packing decision).
    active: usize,
    /// When the current ramp-down started.
    start_ms: Option<u64>,
    /// Packages in use when it started.
    from: usize,
    /// Packages needed at the previous decision.
    last_needed: usize,
}

impl Ramp {
    /// Packages to use now, given the packages the load needs.
    fn step(&mut self, now_ms: u64, needed: usize, window_ms: u64) -> usize {
        if self.active == 0 || needed >= self.active {
            // First decision, or the load grew: go up at once.
            self.active = needed;
            self.start_ms = None;
        } else {
            if self.start_ms.is_none() || needed > self.last_needed {
                // A ramp starts, or any rise restarts it.
                self.start_ms = Some(now_ms);
                self.from = self.active;
            }
            let elapsed = now_ms.saturating_sub(self.start_ms.unwrap_or(now_ms));
            let span = (self.from - needed) as u128;
            // powernv: ramp_down_percent(t) = t^2 / window^2, in packages.
            let drop = if window_ms == 0 || elapsed >= window_ms {
                span
            } else {
                // Scale huge windows down so span x elapsed^2 fits in u128.
                let shift = 64 - u64::from(u32::MAX).leading_zeros();
                let shift = (64 - window_ms.leading_zeros()).saturating_sub(shift);
                let (e, w) = (
                    u128::from(elapsed >> shift),
                    u128::from(window_ms >> shift).max(1),
                );
                span * e * e / (w * w)
            };
            let target = (self.from as u128 - drop).max(needed as u128) as usize;
            self.active = self.active.min(target);
            if self.active == needed {
                self.start_ms = None;
            }
        }
        self.last_needed = needed;
        self.active
    }

    /// Spreading over everything: the ramp restarts from all packages.
    fn spread_all(&mut self, packages: usize) {
        self.active = packages;
        self.start_ms = None;
        self.last_needed = packages;
    }
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
    ramp: Ramp,
    /// (total fit demand, packages) of the last decision that had to open
    /// more packages than the total needed.
    fragmentation: Option<(u64, usize)>,
    scratch: Scratch,
}

/// Buffers reused across decisions so that a decision allocates little.
#[derive(Debug, Clone, Default)]
struct Scratch {
    weight: Vec<u64>,
    order: Vec<u32>,
    buckets: Vec<u32>,
    new_cpu: Vec<u32>,
    forced: Vec<bool>,
    /// Spread mode: vCPUs that keep their previous CPU this decision.
    spread_stay: Vec<bool>,
    cpu_load: Vec<u64>,
    cpu_fit: Vec<u64>,
    cpu_count: Vec<u32>,
    cpu_busy: Vec<bool>,
    core_load: Vec<u64>,
    core_busy: Vec<u32>,
    pkg_load: Vec<u64>,
    pkg_fit: Vec<u64>,
    pkg_cursor: Vec<u32>,
    /// Least loaded core of each package during the spread stay test.
    pkg_min_core: Vec<u32>,
    /// What each CPU offers its vCPUs, in `finish`.
    cpu_offer: Vec<CpuOffer>,
    /// Duplicate check of `sync_state`: bit `v` of VM `m`'s
    /// [`SEEN_BITS_PER_VM`] bits is vCPU `v` of the VM with dense index `m`.
    seen_bits: Vec<u64>,
    /// Least and second least loaded package during the spread stay test
    /// ([`NO_PKG`] when the host has fewer).
    spread_min_pkg: [u32; 2],
    active: Vec<bool>,
    /// Pack mode: vCPUs of the previous placement still on each package (not
    /// yet sent home this decision); read only while the ramp holds surplus
    /// packages.
    pkg_left: Vec<u32>,
    vm_home: Vec<u32>,
    vm_remaining: Vec<u64>,
    vm_order: Vec<u32>,
    vm_offset: Vec<u32>,
    pass2: Vec<u32>,
    vm_start: Vec<u32>,
    vm_members: Vec<u32>,
    vm_done: Vec<bool>,
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
            ramp: Ramp::default(),
            fragmentation: None,
            scratch: Scratch::default(),
        }
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
        }
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
        let n = loads.len();
        let num_cpus = self.layout.num_cpus();
        let num_pkgs = self.layout.num_pkgs();
        let num_cores = self.layout.num_cores();
        let s = &mut self.scratch;
        reset(&mut s.cpu_load, num_cpus, 0);
        reset(&mut s.cpu_fit, num_cpus, 0);
        reset(&mut s.cpu_count, num_cpus, 0);
        reset(&mut s.cpu_busy, num_cpus, false);
        reset(&mut s.core_load, num_cores, 0);
        reset(&mut s.core_busy, num_cores, 0);
        reset(&mut s.pkg_load, num_pkgs, 0);
        reset(&mut s.pkg_fit, num_pkgs, 0);
        reset(&mut s.new_cpu, n, NO_CPU);
        s.weight.clear();
        s.weight.extend(
            loads
                .iter()
                .map(|l| u64::from(l.util.clamp(MIN_VCPU_WEIGHT, CAPACITY_SCALE))),
        );
        // Migration tokens: refill, and note who has none left.
        let limit = u64::from(self.config.max_migrations_per_vcpu_per_s);
        s.forced.clear();
        for v in &mut self.vcpus {
            let elapsed = now_ms.saturating_sub(v.refill_ms);
            v.tokens = v
                .tokens
                .saturating_add(elapsed.saturating_mul(limit))
                .min(limit * TOKEN);
            v.refill_ms = v.refill_ms.max(now_ms);
            s.forced.push(v.cpu != NO_CPU && v.tokens < TOKEN);
        }
        counting_sort_desc(&s.weight, &mut s.order, &mut s.buckets);

        let total_fit: u64 = s
            .weight
            .iter()
            .map(|w| fit_demand(*w, self.layout.host_slot_max))
            .sum();
        let overutilized = total_fit > self.layout.total_fit_cap;
        let mut preferred = None;
        let target_packages;
        if !self.policy.packs() || overutilized {
            self.ramp.spread_all(num_pkgs);
            target_packages = num_pkgs;
            self.place_spread(loads);
        } else {
            let (k, pref) = self.place_pack(now_ms, loads, total_fit);
            target_packages = k;
            preferred = pref;
        }
        self.finish(loads, out);
        out.overutilized = overutilized;
        out.target_packages = target_packages as u32;
        out.preferred_package = preferred;
        Ok(())
    }

    /// Aligns `self.vcpus` with `loads` (fast when the order is unchanged).
    fn sync_state(&mut self, now_ms: u64, loads: &[VcpuLoad]) -> Result<(), PlaceError> {
        if self.vcpus.len() == loads.len()
            && self.vcpus.iter().zip(loads).all(|(v, l)| v.id == l.id)
        {
            return Ok(());
        }
        // Keyed by id through a cheap well-mixed hasher: placement must stay
        // fast even when the vCPU list changes (a VM starts or stops).
        let mut old: IdMap<u32> =
            IdMap::with_capacity_and_hasher(self.vcpus.len(), Default::default());
        for (index, v) in self.vcpus.iter().enumerate() {
            old.insert(id_key(v.id), index as u32);
        }
        // Duplicates: a bitmap of vCPU numbers per VM (vCPU numbers are small:
        // at most 255 under pvmm), a map only for larger ones. Hashing every
        // vCPU cost a cold 10,000-vCPU decision more than its whole stay test.
        let seen_bits = &mut self.scratch.seen_bits;
        seen_bits.clear();
        let mut seen_large: IdMap<()> = IdMap::default();
        let mut vm_index: IdMap<u32> = IdMap::default();
        let full = u64::from(self.config.max_migrations_per_vcpu_per_s) * TOKEN;
        let mut vcpus = Vec::with_capacity(loads.len());
        // (VM id, dense index) of the previous load: vCPUs of a VM usually come
        // together, so most lookups are skipped.
        let mut last_vm: Option<(u32, u32)> = None;
        for l in loads {
            let vm = match last_vm {
                Some((id, index)) if id == l.id.vm => index,
                _ => {
                    let next_vm = vm_index.len() as u32;
                    *vm_index.entry(u64::from(l.id.vm)).or_insert(next_vm)
                }
            };
            last_vm = Some((l.id.vm, vm));
            let duplicate = if l.id.vcpu < SEEN_BITS_PER_VM {
                let bit = vm as usize * SEEN_BITS_PER_VM as usize + l.id.vcpu as usize;
                if seen_bits.len() <= bit / 64 {
                    seen_bits.resize(bit / 64 + 1, 0);
                }
                let mask = 1u64 << (bit % 64);
                let duplicate = seen_bits[bit / 64] & mask != 0;
                seen_bits[bit / 64] |= mask;
                duplicate
            } else {
                seen_large.insert(id_key(l.id), ()).is_some()
            };
            if duplicate {
                return Err(PlaceError::DuplicateVcpu(l.id));
            }
            let previous = if old.is_empty() {
                None
            } else {
                old.get(&id_key(l.id))
            };
            let mut state = match previous {
                Some(index) => self.vcpus[*index as usize],
                None => VcpuState {
                    id: l.id,
                    vm,
                    cpu: NO_CPU,
                    tokens: full,
                    refill_ms: now_ms,
                },
            };
            state.vm = vm;
            vcpus.push(state);
        }
        self.vcpus = vcpus;
        self.num_vms = vm_index.len();
        Ok(())
    }

    /// Records vCPU `i` on dense CPU `c` in the loads of that CPU, its core
    /// and its package (all that spread mode tracks).
    fn assign_load(&mut self, i: usize, c: u32, busy: bool) {
        let l = &self.layout;
        let s = &mut self.scratch;
        let w = s.weight[i];
        let cu = c as usize;
        s.new_cpu[i] = c;
        s.cpu_load[cu] += w;
        s.cpu_count[cu] += 1;
        s.cpu_busy[cu] |= busy;
        s.core_load[l.cpu_core[cu] as usize] += w;
        s.pkg_load[l.cpu_pkg[cu] as usize] += w;
    }

    /// Undoes [`Engine::assign_load`].
    fn unassign_load(&mut self, i: usize) {
        let c = self.scratch.new_cpu[i];
        if c == NO_CPU {
            return;
        }
        let l = &self.layout;
        let s = &mut self.scratch;
        let w = s.weight[i];
        let cu = c as usize;
        s.new_cpu[i] = NO_CPU;
        s.cpu_load[cu] -= w;
        s.cpu_count[cu] -= 1;
        s.core_load[l.cpu_core[cu] as usize] -= w;
        s.pkg_load[l.cpu_pkg[cu] as usize] -= w;
        // cpu_busy is recomputed in `finish`.
    }

    /// [`Engine::assign_load`] plus pack mode's fit demands of the CPU and
    /// its package.
    fn assign(&mut self, i: usize, c: u32, busy: bool) {
        self.assign_load(i, c, busy);
        let l = &self.layout;
        let s = &mut self.scratch;
        let w = s.weight[i];
        let cu = c as usize;
        let p = l.cpu_pkg[cu] as usize;
        s.cpu_fit[cu] += l.cpu_fit_demand(cu, w);
        s.pkg_fit[p] += fit_demand(w, l.pkg_slot_max[p]);
    }

    /// Undoes [`Engine::assign`].
    fn unassign(&mut self, i: usize) {
        let c = self.scratch.new_cpu[i];
        if c == NO_CPU {
            return;
        }
        let l = &self.layout;
        let s = &mut self.scratch;
        let w = s.weight[i];
        let cu = c as usize;
        let p = l.cpu_pkg[cu] as usize;
        s.cpu_fit[cu] -= l.cpu_fit_demand(cu, w);
        s.pkg_fit[p] -= fit_demand(w, l.pkg_slot_max[p]);
        self.unassign_load(i);
    }

    /// Pack mode (see the module documentation). Returns the packages in use
    /// and the preferred package id for `powersaving:2`.
    fn place_pack(
        &mut self,
        now_ms: u64,
        loads: &[VcpuLoad],
        total_fit: u64,
    ) -> (usize, Option<u32>) {
        let num_pkgs = self.layout.num_pkgs();
        // Packages are used in id order: the packages in use are always the
        // lowest numbered ones, so a consolidating host empties its high
        // packages and busy vCPUs gather on package 0 whichever of them turned
        // busy first. (Ranking by load kept load where it was, but then which
        // package survived depended on a tick's noise: an idle vCPU's timer
        // burst or which of two vCPUs started a job 100 ms earlier.)
        let mut needed = 0usize;
        let mut cap = 0u64;
        for p in 0..num_pkgs {
            if needed > 0 && cap >= total_fit {
                break;
            }
            cap += self.layout.pkg_fit_cap[p];
            needed += 1;
        }
        // Packing whole vCPUs (and whole VMs) can need more packages than the
        // total suggests; once a decision had to open more, keep that many
        // until the demand is clearly (5 %) lower, rather than let the ramp
        // retry an impossible consolidation every window.
        if let Some((fit_then, k_then)) = self.fragmentation {
            if capacity_greater(fit_then, total_fit) {
                self.fragmentation = None;
            } else {
                needed = needed.max(k_then);
            }
        }
        let ramp_target = self
            .ramp
            .step(now_ms, needed.max(1), self.config.ramp_down_window_ms);
        // While the ramp holds more packages than the load needs, vCPUs on
        // those packages stay put: moving a VM's vCPUs home would consolidate
        // before the window has passed, which is what the ramp exists to stop.
        let ramp_holding = ramp_target > needed.max(1);
        let mut active_k = ramp_target;
        {
            let s = &mut self.scratch;
            reset(&mut s.active, num_pkgs, false);
            s.active[..active_k].fill(true);
            reset(&mut s.pkg_cursor, num_pkgs, 0);
            for p in 0..num_pkgs {
                s.pkg_cursor[p] = self.layout.pkg_cpu_start[p];
            }
        }
        let preferred = if self.policy.prefers_package() {
            Some(0)
        } else {
            None
        };

        // Each VM's home: the lowest numbered active package holding any of its
        // vCPUs now.
        let num_vms = self.num_vms;
        {
            let s = &mut self.scratch;
            reset(&mut s.vm_home, num_vms, NO_PKG);
            reset(&mut s.vm_remaining, num_vms, 0);
            reset(&mut s.pkg_left, num_pkgs, 0);
            for (i, v) in self.vcpus.iter().enumerate() {
                s.vm_remaining[v.vm as usize] += fit_demand(s.weight[i], self.layout.host_slot_max);
                if v.cpu != NO_CPU {
                    let p = self.layout.cpu_pkg[v.cpu as usize];
                    s.pkg_left[p as usize] += 1;
                    // NO_PKG is u32::MAX, so min keeps the lowest package.
                    if s.active[p as usize] {
                        let home = &mut s.vm_home[v.vm as usize];
                        *home = (*home).min(p);
                    }
                }
            }
        }

        // Pass 1: stays, busy vCPUs before the others: an idle vCPU staying on
        // the last free CPU of a package would push a vCPU that just turned
        // busy out to another package (busy vCPUs would end up spread by the
        // history of where idle ones sat) or onto an already busy CPU. In each
        // group, vCPUs at their VM's home (or forced) first, then the others,
        // which move home instead when home has a CPU they fit on.
        for busy_group in [true, false] {
            let mut away_from_home = 0usize;
            for second in [false, true] {
                if second && away_from_home == 0 {
                    break;
                }
                for k in 0..self.scratch.order.len() {
                    let i = self.scratch.order[k] as usize;
                    let prev = self.vcpus[i].cpu;
                    if prev == NO_CPU
                        || self.scratch.new_cpu[i] != NO_CPU
                        || self.claims_first(i, loads) != busy_group
                    {
                        continue;
                    }
                    let vm = self.vcpus[i].vm as usize;
                    let p = self.layout.cpu_pkg[prev as usize];
                    let home = self.scratch.vm_home[vm];
                    let at_home = home == NO_PKG || home == p;
                    if self.scratch.forced[i] {
                        if !second {
                            self.assign_pack(i, prev, loads[i].busy);
                        }
                        continue;
                    }
                    if at_home == second {
                        away_from_home += usize::from(!at_home);
                        continue;
                    }
                    // A busy vCPU also needs its CPU to itself: two busy vCPUs
                    // on one CPU would both "fit" their package.
                    if !self.stay_fits(i, prev) || (busy_group && !self.cpu_fits(prev, i)) {
                        continue;
                    }
                    let w = self.scratch.weight[i];
                    // Moves home in pass 2 when home has a CPU it fits on; room in
                    // home's total alone is not enough, or two vCPUs of one VM could
                    // keep trading places between an overfull CPU and elsewhere.
                    // While the ramp holds surplus packages, idle vCPUs stay
                    // (going home would consolidate early), and a busy one goes
                    // home only if another vCPU remains on its package: the
                    // last one leaving would empty a package the ramp holds (a
                    // burst right after a load ends, the guest reaping its
                    // jobs, would consolidate before the window has passed).
                    let may_leave =
                        !ramp_holding || (busy_group && self.scratch.pkg_left[p as usize] > 1);
                    if second
                        && may_leave
                        && self.pkg_fits(home as usize, w)
                        && self.first_fit_cpu(home as usize, w).is_some()
                    {
                        self.scratch.pkg_left[p as usize] -= 1;
                        continue;
                    }
                    self.assign_pack(i, prev, loads[i].busy);
                }
            }
            if busy_group {
                self.place_displaced_busy(loads);
            }
        }

        // Relieve CPUs that are too full (loads grew, or a fallback placement
        // overfilled them): their smallest vCPUs move to a CPU of the same
        // package where they fit. Every such move lowers the total overflow and
        // creates none, so repeated decisions converge.
        let any_overfull = (0..self.layout.num_cpus())
            .any(|c| self.scratch.cpu_fit[c] > self.layout.slot[c] && self.layout.slot[c] > 0);
        let relieve = if any_overfull {
            0..self.scratch.order.len()
        } else {
            0..0
        };
        for k in relieve.rev() {
            let i = self.scratch.order[k] as usize;
            let c = self.scratch.new_cpu[i];
            if c == NO_CPU || self.scratch.forced[i] {
                continue;
            }
            let cu = c as usize;
            if self.scratch.cpu_fit[cu] <= self.layout.slot[cu] {
                continue;
            }
            let p = self.layout.cpu_pkg[cu] as usize;
            if let Some(target) = self.first_fit_cpu(p, self.scratch.weight[i]) {
                self.unassign(i);
                self.assign_pack(i, target, loads[i].busy);
            }
        }

        // Pass 2: everyone else, VM by VM (largest remaining demand first, so
        // first-fit works on whole VMs), each VM's vCPUs by weight.
        self.group_unplaced_by_vm();
        for k in 0..self.scratch.pass2.len() {
            let i = self.scratch.pass2[k] as usize;
            let c = self.choose_pack_cpu(i, &mut active_k);
            self.assign_pack(i, c, loads[i].busy);
            let vm = self.vcpus[i].vm as usize;
            if self.scratch.vm_home[vm] == NO_PKG {
                self.scratch.vm_home[vm] = self.layout.cpu_pkg[c as usize];
            }
        }

        // Pass 3 (powersaving:2): the preferred package pulls VMs with busy
        // vCPUs from other packages at once, whole VMs only (a VM split over
        // two packages would lose its shared cache and free no package).
        if let Some(pref) = preferred {
            self.pull_into(pref as usize, loads);
        }
        // Packages opened in pass 2 count as in use at once (going up is immediate).
        if active_k > ramp_target {
            self.ramp.active = active_k;
            self.ramp.last_needed = active_k;
            self.ramp.start_ms = None;
            self.fragmentation = Some((total_fit, active_k));
        }
        (active_k, preferred.map(|p| self.layout.pkg_id[p as usize]))
    }

    /// Fills `scratch.pass2` with the unplaced vCPUs grouped by VM: VMs by
    /// descending remaining fit demand (ties by first appearance), each VM's
    /// vCPUs in `order` (descending weight). O(vCPUs + VMs log VMs).
    fn group_unplaced_by_vm(&mut self) {
        let num_vms = self.num_vms;
        let s = &mut self.scratch;
        reset(&mut s.vm_offset, num_vms + 1, 0);
        for k in 0..s.order.len() {
            let i = s.order[k] as usize;
            if s.new_cpu[i] == NO_CPU {
                s.vm_offset[self.vcpus[i].vm as usize] += 1;
            }
        }
        s.vm_order.clear();
        s.vm_order
            .extend((0..num_vms as u32).filter(|v| s.vm_offset[*v as usize] > 0));
        let remaining = &s.vm_remaining;
        s.vm_order.sort_unstable_by(|a, b| {
            remaining[*b as usize]
                .cmp(&remaining[*a as usize])
                .then(a.cmp(b))
        });
        // vm_offset: count -> start position, in vm_order sequence.
        let mut next = 0u32;
        for v in &s.vm_order {
            let count = s.vm_offset[*v as usize];
            s.vm_offset[*v as usize] = next;
            next += count;
        }
        reset(&mut s.pass2, next as usize, 0);
        for k in 0..s.order.len() {
            let i = s.order[k];
            if s.new_cpu[i as usize] == NO_CPU {
                let vm = self.vcpus[i as usize].vm as usize;
                s.pass2[s.vm_offset[vm] as usize] = i;
                s.vm_offset[vm] += 1;
            }
        }
    }

    /// First CPU of package `p`, in packing order, with no busy vCPU and less
    /// than [`BUSY_CPU_UTIL`] of load: a newly idle CPU that may pull work.
    fn idle_cpu(&self, p: usize) -> Option<u32> {
        let l = &self.layout;
        let s = &self.scratch;
        (l.pkg_cpu_start[p]..l.pkg_cpu_start[p + 1])
            .map(|pos| l.pack_order[pos as usize])
            .find(|c| {
                let c = *c as usize;
                l.slot[c] > 0 && !s.cpu_busy[c] && s.cpu_load[c] < BUSY_CPU_UTIL
            })
    }

    /// `powersaving:2`'s immediate pull into the preferred package `pref`.
    fn pull_into(&mut self, pref: usize, loads: &[VcpuLoad]) {
        let num_vms = self.num_vms;
        let candidates = loads.iter().enumerate().any(|(i, l)| {
            l.busy && self.layout.cpu_pkg[self.scratch.new_cpu[i] as usize] as usize != pref
        });
        if !candidates {
            return;
        }
        {
            // vm_members[vm_start[v]..vm_start[v + 1]]: VM v's vCPUs.
            let s = &mut self.scratch;
            reset(&mut s.vm_start, num_vms + 1, 0);
            for v in &self.vcpus {
                s.vm_start[v.vm as usize + 1] += 1;
            }
            for v in 0..num_vms {
                s.vm_start[v + 1] += s.vm_start[v];
            }
            reset(&mut s.vm_members, self.vcpus.len(), 0);
            reset(&mut s.vm_offset, num_vms, 0);
            for (i, v) in self.vcpus.iter().enumerate() {
                let vm = v.vm as usize;
                s.vm_members[(s.vm_start[vm] + s.vm_offset[vm]) as usize] = i as u32;
                s.vm_offset[vm] += 1;
            }
            reset(&mut s.vm_done, num_vms, false);
        }
        let slot = self.layout.pkg_slot_max[pref];
        for k in 0..self.scratch.order.len() {
            let i = self.scratch.order[k] as usize;
            let c = self.scratch.new_cpu[i] as usize;
            let vm = self.vcpus[i].vm as usize;
            if !loads[i].busy || self.layout.cpu_pkg[c] as usize == pref || self.scratch.vm_done[vm]
            {
                continue;
            }
            self.scratch.vm_done[vm] = true;
            let members =
                self.scratch.vm_start[vm] as usize..self.scratch.vm_start[vm + 1] as usize;
            let mut outside = 0u64;
            let mut pinned = false;
            for m in members.clone() {
                let j = self.scratch.vm_members[m] as usize;
                if self.layout.cpu_pkg[self.scratch.new_cpu[j] as usize] as usize != pref {
                    outside += fit_demand(self.scratch.weight[j], slot);
                    pinned |= self.scratch.forced[j];
                }
            }
            if pinned || self.scratch.pkg_fit[pref] + outside > self.layout.pkg_fit_cap[pref] {
                continue;
            }
            for m in members {
                let j = self.scratch.vm_members[m] as usize;
                if self.layout.cpu_pkg[self.scratch.new_cpu[j] as usize] as usize == pref {
                    continue;
                }
                let w = self.scratch.weight[j];
                // A CPU where it fits, else one running only idle vCPUs (they
                // share it; the next decision moves them if it is too full).
                let target = match self.first_fit_cpu(pref, w) {
                    Some(c) => c,
                    None => match self.idle_cpu(pref) {
                        Some(c) => c,
                        None => self.cpu_in_package(pref, j),
                    },
                };
                self.unassign(j);
                self.assign_pack(j, target, loads[j].busy);
            }
        }
    }

    /// [`Engine::assign`], also keeping the VM's remaining demand current.
    fn assign_pack(&mut self, i: usize, c: u32, busy: bool) {
        let vm = self.vcpus[i].vm as usize;
        if self.scratch.new_cpu[i] == NO_CPU {
            let fd = fit_demand(self.scratch.weight[i], self.layout.host_slot_max);
            self.scratch.vm_remaining[vm] = self.scratch.vm_remaining[vm].saturating_sub(fd);
        }
        self.assign(i, c, busy);
    }

    /// Whether vCPU `i` may stay on dense CPU `c` in pack mode: its package is
    /// in use and has room, and `c` is a packing slot. A CPU that is too full
    /// is relieved afterwards, by moves that are strict improvements only.
    fn stay_fits(&self, i: usize, c: u32) -> bool {
        let l = &self.layout;
        let s = &self.scratch;
        let cu = c as usize;
        let p = l.cpu_pkg[cu] as usize;
        let w = s.weight[i];
        s.active[p] && l.slot[cu] > 0 && self.pkg_fits(p, w)
    }

    /// Pass 1, busy vCPUs that did not stay (their CPU is taken by another
    /// busy vCPU, or they go home): a CPU of their VM's home, else of their
    /// own package, that fits them, while only busy vCPUs are placed. With no
    /// such CPU a vCPU stays where it was if its package has room (the relieve
    /// step then evens out its CPU), else pass 2 places it.
    fn place_displaced_busy(&mut self, loads: &[VcpuLoad]) {
        for k in 0..self.scratch.order.len() {
            let i = self.scratch.order[k] as usize;
            let prev = self.vcpus[i].cpu;
            if prev == NO_CPU
                || self.scratch.new_cpu[i] != NO_CPU
                || !self.claims_first(i, loads)
                || self.scratch.forced[i]
            {
                continue;
            }
            let p = self.layout.cpu_pkg[prev as usize] as usize;
            let home = self.scratch.vm_home[self.vcpus[i].vm as usize];
            let home = if home == NO_PKG { p } else { home as usize };
            let w = self.scratch.weight[i];
            let target = [home, p].into_iter().find_map(|pkg| {
                if self.scratch.active[pkg] && self.pkg_fits(pkg, w) {
                    self.first_fit_cpu(pkg, w)
                } else {
                    None
                }
            });
            match target {
                Some(c) => self.assign_pack(i, c, true),
                None if self.stay_fits(i, prev) => self.assign_pack(i, prev, true),
                None => {}
            }
        }
    }

    /// Whether vCPU `i` is placed with the busy group of pass 1: busy now and
    /// with at least half a CPU of decayed utilization ([`BUSY_CPU_UTIL`]), so
    /// a short burst of a mostly idle vCPU does not shuffle its neighbours.
    fn claims_first(&self, i: usize, loads: &[VcpuLoad]) -> bool {
        loads[i].busy && self.scratch.weight[i] >= BUSY_CPU_UTIL
    }

    /// Whether vCPU `i` fits on CPU `c` as it is filled so far.
    fn cpu_fits(&self, c: u32, i: usize) -> bool {
        let cu = c as usize;
        slot_fits(
            self.scratch.cpu_fit[cu],
            self.scratch.weight[i],
            self.layout.slot[cu],
        )
    }

    fn pkg_fits(&self, p: usize, w: u64) -> bool {
        let l = &self.layout;
        self.scratch.pkg_fit[p] + fit_demand(w, l.pkg_slot_max[p]) <= l.pkg_fit_cap[p]
    }

    /// First CPU of package `p`, in packing order, where weight `w` fits.
    fn first_fit_cpu(&mut self, p: usize, w: u64) -> Option<u32> {
        let l = &self.layout;
        let s = &mut self.scratch;
        let end = l.pkg_cpu_start[p + 1];
        let min_fd = u64::from(MIN_VCPU_WEIGHT) * FIT_MARGIN;
        // Skip CPUs that cannot take even the smallest vCPU any more.
        while s.pkg_cursor[p] < end {
            let c = l.pack_order[s.pkg_cursor[p] as usize] as usize;
            if l.slot[c] > 0 && s.cpu_fit[c] + min_fd.min(l.slot[c]) <= l.slot[c] {
                break;
            }
            s.pkg_cursor[p] += 1;
        }
        (s.pkg_cursor[p]..end)
            .map(|pos| l.pack_order[pos as usize])
            .find(|c| slot_fits(s.cpu_fit[*c as usize], w, l.slot[*c as usize]))
    }

    /// Picks the CPU for a vCPU that is not staying, in pack mode.
    fn choose_pack_cpu(&mut self, i: usize, active_k: &mut usize) -> u32 {
        let num_pkgs = self.layout.num_pkgs();
        let w = self.scratch.weight[i];
        let vm = self.vcpus[i].vm as usize;
        let home = self.scratch.vm_home[vm];
        let home_fits =
            home != NO_PKG && self.scratch.active[home as usize] && self.pkg_fits(home as usize, w);
        if home_fits {
            if let Some(c) = self.first_fit_cpu(home as usize, w) {
                return c;
            }
        }
        // Home is too fragmented: a vCPU that only left to go home stays put.
        let prev = self.vcpus[i].cpu;
        if prev != NO_CPU && self.stay_fits(i, prev) {
            return prev;
        }
        if home_fits {
            return self.cpu_in_package(home as usize, i);
        }
        if home == NO_PKG {
            // A VM not placed yet: the first package where all of it fits.
            let whole = self.scratch.vm_remaining[vm];
            for p in 0..*active_k {
                if self.scratch.pkg_fit[p] + whole <= self.layout.pkg_fit_cap[p] {
                    return self.cpu_in_package(p, i);
                }
            }
        }
        for p in 0..num_pkgs {
            if p >= *active_k {
                // Nothing active fits: use one more package at once.
                *active_k = p + 1;
                self.scratch.active[p] = true;
            }
            if self.pkg_fits(p, w) {
                return self.cpu_in_package(p, i);
            }
        }
        // Overflow (fragmentation only: totals above capacity spread instead):
        // the least loaded package.
        let l = &self.layout;
        let s = &self.scratch;
        let mut best_pkg = 0usize;
        for p in 1..l.num_pkgs() {
            if ratio_less(
                s.pkg_fit[p],
                l.pkg_fit_cap[p],
                s.pkg_fit[best_pkg],
                l.pkg_fit_cap[best_pkg],
            ) {
                best_pkg = p;
            }
        }
        // Unless its own package is not clearly fuller.
        if prev != NO_CPU {
            let p = l.cpu_pkg[prev as usize] as usize;
            let lhs = u128::from(s.pkg_fit[p]) * u128::from(l.pkg_fit_cap[best_pkg]);
            let rhs = u128::from(s.pkg_fit[best_pkg]) * u128::from(l.pkg_fit_cap[p]);
            if lhs * u128::from(CAPACITY_SCALE) <= rhs * u128::from(CAPACITY_GREATER_MARGIN) {
                best_pkg = p;
            }
        }
        self.cpu_in_package(best_pkg, i)
    }

    /// CPU for vCPU `i` in package `p`: the first in packing order where it
    /// fits, else (the package has room in total but no single slot has) the
    /// least loaded slot, or the vCPU's previous CPU in `p` when that is not
    /// clearly worse.
    fn cpu_in_package(&mut self, p: usize, i: usize) -> u32 {
        let w = self.scratch.weight[i];
        if let Some(c) = self.first_fit_cpu(p, w) {
            return c;
        }
        let l = &self.layout;
        let s = &self.scratch;
        let range = l.pkg_cpu_start[p] as usize..l.pkg_cpu_start[p + 1] as usize;
        let mut best = NO_CPU;
        for pos in range {
            let c = l.pack_order[pos] as usize;
            if l.slot[c] == 0 {
                continue;
            }
            if best == NO_CPU
                || ratio_less(
                    s.cpu_fit[c],
                    l.slot[c],
                    s.cpu_fit[best as usize],
                    l.slot[best as usize],
                )
            {
                best = c as u32;
            }
        }
        if best == NO_CPU {
            best = l.pack_order[l.pkg_cpu_start[p] as usize];
        }
        let prev = self.vcpus[i].cpu;
        if prev != NO_CPU
            && prev != best
            && l.cpu_pkg[prev as usize] as usize == p
            && l.slot[prev as usize] > 0
        {
            let fd = fit_demand(w, l.slot[prev as usize]);
            let prev_after = s.cpu_fit[prev as usize] + fd;
            let best_after = s.cpu_fit[best as usize] + fd;
            if !capacity_greater(prev_after, best_after) {
                return prev;
            }
        }
        best
    }

    /// Builds the decision and moves the per-vCPU state forward.
    fn finish(&mut self, loads: &[VcpuLoad], out: &mut Decision) {
        let l = &self.layout;
        let s = &mut self.scratch;
        // Busy CPUs, per core, for SMT sharing.
        for c in 0..l.num_cpus() {
            s.cpu_busy[c] = false;
        }
        for (i, load) in loads.iter().enumerate() {
            let c = s.new_cpu[i] as usize;
            s.cpu_busy[c] |= load.busy;
        }
        for c in 0..l.num_cpus() {
            if s.cpu_load[c] >= BUSY_CPU_UTIL {
                s.cpu_busy[c] = true;
            }
            if s.cpu_busy[c] {
                s.core_busy[l.cpu_core[c] as usize] += 1;
            }
        }
        s.cpu_offer.clear();
        s.cpu_offer.extend((0..l.num_cpus()).map(|c| {
            let busy_threads = s.core_busy[l.cpu_core[c] as usize] + u32::from(!s.cpu_busy[c]);
            CpuOffer::new(
                l.cpu_capacity[c],
                l.cpu_threads[c],
                busy_threads,
                s.cpu_count[c],
            )
        }));
        let assignments = &mut out.assignments;
        let migrations = &mut out.migrations;
        assignments.reserve(loads.len());
        let changed = (0..loads.len())
            .filter(|i| {
                let prev = self.vcpus[*i].cpu;
                prev != NO_CPU && prev != s.new_cpu[*i]
            })
            .count();
        migrations.reserve(changed);
        for (i, load) in loads.iter().enumerate() {
            let c = s.new_cpu[i] as usize;
            let cpus = CpuSet::single(l.cpu_id[c]);
            let state = &mut self.vcpus[i];
            if state.cpu != c as u32 {
                if state.cpu != NO_CPU {
                    state.tokens = state.tokens.saturating_sub(TOKEN);
                    migrations.push(Migration {
                        id: load.id,
                        from: CpuSet::single(l.cpu_id[state.cpu as usize]),
                        to: cpus.clone(),
                    });
                }
                state.cpu = c as u32;
            }
            assignments.push(Assignment {
                id: load.id,
                cpus,
                package: l.pkg_id[l.cpu_pkg[c] as usize],
                capacity: s.cpu_offer[c].for_vcpu(s.cpu_load[c] - s.weight[i]),
            });
        }
    }
}

fn reset<T: Copy>(v: &mut Vec<T>, len: usize, value: T) {
    v.clear();
    v.resize(len, value);
}

/// Indices of `weights` by descending weight, ties in index order (stable):
/// a counting sort over the 0..=1024 range, O(n) and allocation-free once warm.
fn counting_sort_desc(weights: &[u64], order: &mut Vec<u32>, buckets: &mut Vec<u32>) {
    let top = CAPACITY_SCALE as usize;
    reset(buckets, top + 2, 0);
    for w in weights {
        buckets[top - (*w as usize).min(top) + 1] += 1;
    }
    for b in 1..buckets.len() {
        buckets[b] += buckets[b - 1];
    }
    reset(order, weights.len(), 0);
    for (i, w) in weights.iter().enumerate() {
        let b = top - (*w as usize).min(top);
        order[buckets[b] as usize] = i as u32;
        buckets[b] += 1;
    }
}
