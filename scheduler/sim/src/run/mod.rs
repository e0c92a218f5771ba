//! The simulation loop: discrete time, a fine *work step* for accounting and a
//! coarser *placement tick* at which the placement engine decides.
//!
//! # What happens each placement tick (default every 100 ms, as the live VMM)
//!
//! The simulated vCPUs are the [`Members`] of the placement loop that pvmm and
//! `pvmm-host` run ([`Tick`]): each vCPU's cumulative busy and idle time
//! (simulated) is fed as an [`IdleSample`] to its own utilization tracker,
//! the tracker's utilization and busy flag go into the engine for all vCPUs
//! of all VMs, and the decision is applied through a [`RecordingExecutor`]
//! and read back. The simulator has no placement logic of its own.
//! Migrations are the decision's moves.
//!
//! # What happens each work step (default 1 ms)
//!
//! 1. Work arrives at each vCPU from its generator ([`crate::load`]),
//!    limited by what is left of its VM's job (`work=`).
//! 2. A vCPU with undone work is runnable. Under [`Placement::Unpinned`] the
//!    host's own scheduler places it, under [`Placement::Oracle`] the oracle
//!    (below); otherwise it runs on the CPU the engine gave it, or, when the
//!    engine allows it several (`EngineConfig::share_package`), where the
//!    host's wake-up path would run it among them (`Sim::wake_within_affinity`).
//! 3. Each host CPU serves its runnable vCPUs by time slicing (water-filling:
//!    equal shares, a vCPU that needs less leaves the rest to the others). A
//!    vCPU's speed while it runs is its thread's share of the core
//!    ([`thread_share`]: 1024 alone, 589 when an SMT sibling is also busy,
//!    the capacity model the engine uses) times its cache factor: a vCPU whose
//!    VM's other vCPUs sit on other packages runs up to
//!    [`CACHE_SHARING_SPEEDUP`] slower than one whose VM shares its package.
//!    A vCPU that moved first spends a migration cost refilling caches
//!    ([`MIGRATION_COST_SAME_PACKAGE_US`], [`MIGRATION_COST_CROSS_PACKAGE_US`]).
//! 4. Time a vCPU runs counts as busy, time it has nothing to do as idle,
//!    and time it has work but waits for its share of a CPU as busy and as
//!    waited: what the live VMM reads for a vCPU thread (not halted, and
//!    runnable but not running, from its scheduler statistics), and what its
//!    tracker sees at the next tick.
//! 5. The power model ([`pvmm_scheduler::power::PowerModel`]) turns the
//!    step's busy fractions per CPU into package, core and SMT activity;
//!    energy is power x time.
//!
//! Within a step, work on different CPUs is taken to start at the start of
//! the step, so a package is awake for the largest busy fraction of its CPUs
//! (an approximation finer than the 1 ms step only).

//!
//! [`Placement::Unpinned`] has no engine: the host's own scheduler places
//! the vCPUs (module `unpinned`). Nor has [`Placement::Oracle`]: it packs
//! the runnable vCPUs again at every step, for free (module `oracle`).
//!
//! - `config`: the settings and their defaults, and the errors;
//! - `result`: what a run measured;
//! - `host`: the topology flattened for the step loop;
//! - `unpinned`: the unpinned baseline's host scheduler;
//! - `oracle`: the oracle placement.

use pvmm_scheduler::capacity::{thread_share, CAPACITY_SCALE};
use pvmm_scheduler::executor::{Executor, RecordingExecutor};
use pvmm_scheduler::placement::{Decision, VcpuId, VcpuLoad};
use pvmm_scheduler::power::thread_overlap;
use pvmm_scheduler::topology::HostTopology;
use pvmm_scheduler::util::{IdleSample, LoadTracker};
use pvmm_scheduler::PlacementPolicy;
use pvmm_tick::{Applied, Members, PhaseClock, Tick};

use super::load::{LoadState, EMPTY_BACKLOG_NS, NS_PER_MS};
use super::spec::VmSpec;

mod config;
mod host;
mod oracle;
mod result;
#[cfg(test)]
mod tests;
mod unpinned;

pub use config::{
    Placement, SimConfig, SimError, CACHE_SHARING_SPEEDUP, DEFAULT_STEP_US, DEFAULT_TICK_MS,
    MAX_DURATION_MS, MIGRATION_COST_CROSS_PACKAGE_US, MIGRATION_COST_SAME_PACKAGE_US,
    UNPINNED_MEAN_RESIDENCY_MS,
};
pub use result::{Progress, RunResult, Timeline, TimelineCell};

pub(crate) use host::Host;
use host::NO_CPU;
use oracle::OracleHost;
use unpinned::UnpinnedHost;

struct Vcpu {
    id: VcpuId,
    vm: usize,
    load: LoadState,
    backlog_ns: f64,
    /// Migration cost still to pay (ns of running without progress).
    warmup_ns: f64,
    /// The CPU it runs on (or ran on last).
    cpu: usize,
    /// The CPUs the engine allows it (dense; empty under the unpinned
    /// baseline and the oracle).
    allowed: Vec<usize>,
    runnable: bool,
    /// It became runnable this step (it was not the step before).
    woke: bool,
    busy_ns: f64,
    idle_ns: f64,
    /// Time it had work but waited for its CPU (ns).
    waited_ns: f64,
    tracker: LoadTracker,
    /// Unpinned: when host activity next displaces it while running (ns).
    displace_at_ns: f64,
    /// This tick: running time (ns) and running time per package.
    tick_busy_ns: f64,
    tick_pkg_ns: Vec<f64>,
}

struct Vm {
    /// Work left to arrive (ns); `None` for an endless load.
    remaining_ns: Option<f64>,
    done_s: Option<f64>,
    first: usize,
    count: usize,
    total_ns: f64,
}

impl Vm {
    /// Whether the VM has a job that is not finished yet.
    fn job_pending(&self) -> bool {
        self.remaining_ns.is_some() && self.done_s.is_none()
    }
}

/// What a migration costs a vCPU (ns of running without progress).
#[derive(Debug, Clone, Copy)]
struct MigrationCost {
    same_package_ns: f64,
    cross_package_ns: f64,
}

impl MigrationCost {
    /// The cost of moving from dense CPU `from` to dense CPU `to`.
    fn between(&self, host: &Host, from: usize, to: usize) -> f64 {
        if host.cpu_pkg[from] == host.cpu_pkg[to] {
            self.same_package_ns
        } else {
            self.cross_package_ns
        }
    }
}

/// The simulated time base: work steps inside placement ticks, up to a limit.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// Now (ns since the start).
    t: u64,
    step_ns: u64,
    tick_ns: u64,
    limit_ns: u64,
    next_progress_ns: u64,
}

/// Per-step buffers, reused so that a step allocates nothing.
#[derive(Default)]
struct StepBuffers {
    /// Runnable vCPUs of each dense CPU this step.
    runq: Vec<Vec<usize>>,
    /// Runnable vCPUs whose CPU another one held first this step.
    stacked: Vec<usize>,
    /// Fraction of the step each CPU ran.
    cpu_busy: Vec<f64>,
    core_busy_threads: Vec<u32>,
    /// Each vCPU's speed factor from cache sharing (1 = its VM on its package).
    speed: Vec<f64>,
    /// `vm_pkg_count[vm * packages + p]`: the VM's placed vCPUs on package `p`.
    vm_pkg_count: Vec<u32>,
    vm_placed: Vec<u32>,
    /// Water-filling order of one CPU: (time the vCPU needs, vCPU).
    fill: Vec<(f64, usize)>,
    overlap: Vec<f64>,
    thread_busy: Vec<f64>,
}

/// What a run has measured so far.
#[derive(Default)]
struct Measured {
    energy_j: f64,
    work_done_ns: f64,
    migrations: u64,
    ticks: u64,
    pkg_idle_ns: Vec<f64>,
}

/// One run's whole state: [`simulate`] is `Sim::new`, then [`Sim::step`]
/// until every job is done or the limit is reached, then [`Sim::finish`].
struct Sim<'a> {
    config: &'a SimConfig,
    placement: Placement,
    host: Host,
    vcpus: Vec<Vcpu>,
    vms: Vec<Vm>,
    has_jobs: bool,
    total_job_ns: f64,
    /// The placement loop; `None` for [`Placement::Unpinned`] and [`Placement::Oracle`].
    tick: Option<Tick>,
    executor: RecordingExecutor,
    unpinned: UnpinnedHost,
    oracle: OracleHost,
    cost: MigrationCost,
    clock: Clock,
    timeline: Option<Timeline>,
    buffers: StepBuffers,
    totals: Measured,
}

/// The simulated vCPU threads, as the placement loop's members.
struct SimMembers<'s> {
    vcpus: &'s mut [Vcpu],
    host: &'s Host,
    executor: &'s mut RecordingExecutor,
    cost: MigrationCost,
}

impl Members for SimMembers<'_> {
    type Error = SimError;

    /// Utilization from the simulated busy, idle and waiting time.
    fn sample(&mut self, now_ns: u64, loads: &mut Vec<VcpuLoad>) {
        for v in self.vcpus.iter_mut() {
            // Simulated times are sums of non-negative durations, far below 2^64 ns.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            v.tracker.update(
                IdleSample {
                    t_ns: now_ns,
                    busy_ns: (v.busy_ns + v.waited_ns).round() as u64,
                    idle_ns: v.idle_ns.round() as u64,
                },
                v.waited_ns.round() as u64,
            );
            loads.push(v.tracker.load(v.id));
        }
    }

    /// The simulated engine never restarts: nothing to tell it.
    fn assume(&mut self, _fresh: bool, _assume: &mut dyn FnMut(VcpuId, u32)) {}

    /// Applies the decision through the executor and reads it back. A thread
    /// still allowed where it runs stays there; one that is not goes to the CPU
    /// the engine chose for it, owing the migration cost.
    fn apply(&mut self, decision: &Decision) -> Result<Applied, SimError> {
        let mut applied = Applied::default();
        for (i, assignment) in decision.assignments.iter().enumerate() {
            // One simulated thread per vCPU: a scenario's are far fewer than 2^31.
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
            let tid = i as i32 + 1;
            if self.executor.current().get(&tid) != Some(&assignment.cpus) {
                self.executor.apply(tid, &assignment.cpus)?;
            }
            let v = &mut self.vcpus[i];
            self.host
                .dense_set(&self.executor.read(tid)?, &mut v.allowed)?;
            if v.cpu == NO_CPU || !v.allowed.contains(&v.cpu) {
                let home = self.host.dense(assignment.cpu)?;
                if v.cpu != NO_CPU {
                    v.warmup_ns += self.cost.between(self.host, v.cpu, home);
                    applied.moved += 1;
                }
                v.cpu = home;
            }
        }
        Ok(applied)
    }
}

/// Simulates `vms` on `topology` under `placement`. `progress` is called about
/// every simulated second.
pub fn simulate(
    topology: &HostTopology,
    vms: &[VmSpec],
    placement: Placement,
    config: &SimConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunResult, SimError> {
    config.validate()?;
    let mut sim = Sim::new(topology, vms, placement, config)?;
    loop {
        sim.step()?;
        if let Some(p) = sim.progress_due() {
            progress(p);
        }
        if sim.all_jobs_done() || sim.clock.t >= sim.clock.limit_ns {
            break;
        }
    }
    Ok(sim.finish())
}

impl<'a> Sim<'a> {
    fn new(
        topology: &HostTopology,
        vms: &[VmSpec],
        placement: Placement,
        config: &'a SimConfig,
    ) -> Result<Self, SimError> {
        let host = Host::new(topology);
        let (vcpus, vm_state) = Self::build_vms(vms, &host, config);
        if vcpus.is_empty() {
            return Err(SimError::NoVcpus);
        }
        let num_pkgs = host.package_ids.len();
        let num_cpus = host.num_cpus();
        let has_jobs = vm_state.iter().any(|v| v.remaining_ns.is_some());
        let total_job_ns: f64 = vm_state.iter().map(|v| v.total_ns).sum();
        let tick = match placement {
            Placement::Engine(policy) => Some(Tick::new(
                PlacementPolicy::Managed(policy),
                topology.clone(),
                config.engine,
                PhaseClock::Wall,
            )),
            Placement::Unpinned | Placement::Oracle => None,
        };
        let timeline = config.timeline.then(|| Timeline {
            tick_ms: config.tick_ms,
            vcpus: vcpus.iter().map(|v| v.id).collect(),
            cells: vec![Vec::new(); vcpus.len()],
        });
        let buffers = StepBuffers {
            runq: vec![Vec::new(); num_cpus],
            cpu_busy: vec![0.0; num_cpus],
            core_busy_threads: vec![0; host.core_cpus.len()],
            speed: vec![1.0; vcpus.len()],
            vm_pkg_count: vec![0; vm_state.len() * num_pkgs],
            vm_placed: vec![0; vm_state.len()],
            ..StepBuffers::default()
        };
        Ok(Sim {
            config,
            placement,
            has_jobs,
            total_job_ns,
            tick,
            executor: RecordingExecutor::new(),
            unpinned: UnpinnedHost::new(config.seed, config.unpinned_mean_residency_ms * 1e6),
            oracle: OracleHost::new(&host),
            cost: MigrationCost {
                same_package_ns: config.migration_cost_same_package_us * 1e3,
                cross_package_ns: config.migration_cost_cross_package_us * 1e3,
            },
            clock: Clock {
                t: 0,
                step_ns: config.step_us * 1000,
                tick_ns: config.tick_ms * NS_PER_MS,
                limit_ns: config.duration_ms * NS_PER_MS,
                next_progress_ns: 1_000 * NS_PER_MS,
            },
            timeline,
            buffers,
            totals: Measured {
                pkg_idle_ns: vec![0.0; num_pkgs],
                ..Measured::default()
            },
            host,
            vcpus,
            vms: vm_state,
        })
    }

    /// The simulated vCPUs and VMs of `vms`, each vCPU with its own load
    /// stream and utilization tracker.
    fn build_vms(vms: &[VmSpec], host: &Host, config: &SimConfig) -> (Vec<Vcpu>, Vec<Vm>) {
        let num_pkgs = host.package_ids.len();
        let mut vcpus = Vec::new();
        let mut vm_state = Vec::new();
        for (vm_index, vm) in vms.iter().enumerate() {
            let first = vcpus.len();
            for (i, spec) in vm.vcpus.iter().enumerate() {
                // At most MAX_VCPUS_PER_VM vCPUs a VM, and the VMs of a scenario held in
                // memory: both far below 2^32.
                #[allow(clippy::cast_possible_truncation)]
                vcpus.push(Vcpu {
                    id: VcpuId {
                        vm: vm_index as u32,
                        vcpu: i as u32,
                    },
                    vm: vm_index,
                    load: LoadState::for_vcpu(spec.clone(), config.seed, vm_index, i),
                    backlog_ns: 0.0,
                    warmup_ns: 0.0,
                    cpu: NO_CPU,
                    allowed: Vec::new(),
                    runnable: false,
                    woke: false,
                    busy_ns: 0.0,
                    idle_ns: 0.0,
                    waited_ns: 0.0,
                    tracker: LoadTracker::new(config.util),
                    displace_at_ns: f64::INFINITY,
                    tick_busy_ns: 0.0,
                    tick_pkg_ns: vec![0.0; num_pkgs],
                });
            }
            vm_state.push(Vm {
                remaining_ns: vm.work_s.map(|w| w * 1e9),
                done_s: None,
                first,
                count: vm.vcpus.len(),
                total_ns: vm.work_s.map_or(0.0, |w| w * 1e9),
            });
        }
        (vcpus, vm_state)
    }

    /// One work step, preceded by a placement tick when one is due.
    fn step(&mut self) -> Result<(), SimError> {
        if self.clock.t.is_multiple_of(self.clock.tick_ns) {
            if self.clock.t > 0 {
                let tick_ns = self.clock.tick_ns as f64;
                record_tick(&mut self.timeline, &mut self.vcpus, &self.host, tick_ns);
            }
            self.placement_tick()?;
            self.totals.ticks += 1;
        }
        self.arrivals();
        self.fill_run_queues();
        self.cache_factors();
        self.serve();
        self.account_power();
        self.clock.t += self.clock.step_ns;
        self.mark_finished_jobs();
        Ok(())
    }

    /// The placement loop's tick over the simulated threads ([`SimMembers`]).
    /// Moved vCPUs owe the migration cost.
    fn placement_tick(&mut self) -> Result<(), SimError> {
        let Some(tick) = self.tick.as_mut() else {
            return Ok(());
        };
        let mut members = SimMembers {
            vcpus: &mut self.vcpus,
            host: &self.host,
            executor: &mut self.executor,
            cost: self.cost,
        };
        let before = tick.totals().migrations;
        tick.run(self.clock.t, &mut members)?;
        self.totals.migrations += tick.totals().migrations - before;
        Ok(())
    }

    /// Step 1: work arrives from each vCPU's generator, limited by what is
    /// left of its VM's job; a vCPU with work is runnable.
    fn arrivals(&mut self) {
        let (t, step_ns) = (self.clock.t, self.clock.step_ns);
        let unpinned = self.placement == Placement::Unpinned;
        for v in &mut self.vcpus {
            let vm = &mut self.vms[v.vm];
            let mut work = v.load.arrivals(t, step_ns, v.backlog_ns);
            if let Some(remaining) = vm.remaining_ns.as_mut() {
                work = work.min(*remaining);
                *remaining -= work;
            }
            v.backlog_ns += work;
            let was = v.runnable;
            v.runnable = v.backlog_ns >= EMPTY_BACKLOG_NS;
            v.woke = v.runnable && !was;
            if !v.runnable {
                v.displace_at_ns = f64::INFINITY;
            } else if !was && unpinned {
                // Step 2 places a vCPU that just woke on a random idle CPU.
                v.displace_at_ns = f64::NAN;
            }
        }
    }

    /// Step 2: the runnable vCPUs of each CPU, on the engine's CPUs or, for
    /// the unpinned baseline and the oracle, where they put them.
    fn fill_run_queues(&mut self) {
        let runq = &mut self.buffers.runq;
        for q in runq.iter_mut() {
            q.clear();
        }
        match self.placement {
            Placement::Unpinned => self.unpinned.place(
                &mut self.vcpus,
                &self.host,
                runq,
                self.cost,
                self.clock.t as f64,
                &mut self.totals.migrations,
            ),
            Placement::Oracle => self.oracle.place(
                &mut self.vcpus,
                &self.host,
                runq,
                &mut self.totals.migrations,
            ),
            Placement::Engine(_) => self.wake_within_affinity(),
        }
    }

    /// Step 2 under the engine: each runnable vCPU runs where it ran last, as
    /// the host's wake-up path prefers; one whose CPU another vCPU already
    /// holds this step goes to a CPU of its affinity that none holds, if there
    /// is one (a move, at its cost), as the wake-up path's search for an idle
    /// CPU does. The vCPUs that were running keep their CPUs first, and the
    /// ones that just woke find theirs taken: a wake-up does not evict a
    /// running thread. With one CPU per vCPU (the engine's default) every vCPU
    /// runs on that CPU.
    fn wake_within_affinity(&mut self) {
        let runq = &mut self.buffers.runq;
        let stacked = &mut self.buffers.stacked;
        stacked.clear();
        for woken in [false, true] {
            for (i, v) in self.vcpus.iter().enumerate() {
                if !v.runnable || v.cpu == NO_CPU || v.woke != woken {
                    continue;
                }
                if runq[v.cpu].is_empty() || v.allowed.len() <= 1 {
                    runq[v.cpu].push(i);
                } else {
                    stacked.push(i);
                }
            }
        }
        for &i in stacked.iter() {
            let v = &mut self.vcpus[i];
            if let Some(&free) = v.allowed.iter().find(|&&c| runq[c].is_empty()) {
                v.warmup_ns += self.cost.between(&self.host, v.cpu, free);
                self.totals.migrations += 1;
                v.cpu = free;
            }
            runq[v.cpu].push(i);
        }
    }

    /// Each vCPU's cache factor: slower by the share of its VM's other
    /// vCPUs that sit on other packages ([`SimConfig::cache_sharing_speedup`]).
    fn cache_factors(&mut self) {
        let num_pkgs = self.host.package_ids.len();
        let b = &mut self.buffers;
        b.vm_pkg_count.iter_mut().for_each(|c| *c = 0);
        b.vm_placed.iter_mut().for_each(|c| *c = 0);
        for v in &self.vcpus {
            if v.cpu != NO_CPU {
                b.vm_pkg_count[v.vm * num_pkgs + self.host.cpu_pkg[v.cpu]] += 1;
                b.vm_placed[v.vm] += 1;
            }
        }
        for (i, v) in self.vcpus.iter().enumerate() {
            b.speed[i] = if v.cpu == NO_CPU || b.vm_placed[v.vm] <= 1 {
                1.0
            } else {
                let others = f64::from(b.vm_placed[v.vm] - 1);
                let same =
                    f64::from(b.vm_pkg_count[v.vm * num_pkgs + self.host.cpu_pkg[v.cpu]] - 1);
                1.0 / (1.0 + self.config.cache_sharing_speedup * (others - same) / others)
            };
        }
    }

    /// Steps 3 and 4: SMT sharing per core, time slicing per CPU; running
    /// time counts as busy, time without work as idle.
    fn serve(&mut self) {
        let b = &mut self.buffers;
        b.core_busy_threads.iter_mut().for_each(|c| *c = 0);
        for (c, q) in b.runq.iter().enumerate() {
            if !q.is_empty() {
                b.core_busy_threads[self.host.cpu_core[c]] += 1;
            }
        }
        for c in 0..self.host.num_cpus() {
            self.buffers.cpu_busy[c] = self.serve_cpu(c);
        }
        let dt = self.clock.step_ns as f64;
        for v in &mut self.vcpus {
            if !v.runnable {
                v.idle_ns += dt;
            }
        }
    }

    /// Serves CPU `c`'s run queue for one step by water-filling (equal
    /// shares; a vCPU that needs less leaves the rest to the others) and
    /// returns the fraction of the step the CPU ran.
    fn serve_cpu(&mut self, c: usize) -> f64 {
        let host = &self.host;
        let b = &mut self.buffers;
        if b.runq[c].is_empty() {
            return 0.0;
        }
        let dt = self.clock.step_ns as f64;
        let share = f64::from(thread_share(
            host.cpu_capacity[c],
            host.cpu_threads[c],
            b.core_busy_threads[host.cpu_core[c]],
        )) / f64::from(CAPACITY_SCALE);
        b.fill.clear();
        for &i in &b.runq[c] {
            let v = &self.vcpus[i];
            let rate = share * b.speed[i];
            b.fill.push((v.warmup_ns + v.backlog_ns / rate, i));
        }
        b.fill.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut left = dt;
        let mut count = b.fill.len();
        let mut used = 0.0;
        for &(need, i) in &b.fill {
            let slice = (left / count as f64).min(need);
            left -= slice;
            count -= 1;
            used += slice;
            let v = &mut self.vcpus[i];
            let warm = slice.min(v.warmup_ns);
            v.warmup_ns -= warm;
            let work = ((slice - warm) * share * b.speed[i]).min(v.backlog_ns);
            v.backlog_ns -= work;
            self.totals.work_done_ns += work;
            v.busy_ns += slice;
            v.tick_busy_ns += slice;
            v.tick_pkg_ns[host.cpu_pkg[c]] += slice;
            if v.backlog_ns < EMPTY_BACKLOG_NS {
                // Done within the step: halted for the rest of it.
                v.idle_ns += dt - slice;
            } else {
                // Work left: it waited for the CPU the rest of the step.
                v.waited_ns += dt - slice;
            }
        }
        (used / dt).min(1.0)
    }

    /// Step 5: the step's power from package, core and SMT activity, and
    /// each package's idle time.
    fn account_power(&mut self) {
        let dt = self.clock.step_ns as f64;
        let model = &self.config.power;
        let b = &mut self.buffers;
        let mut power = model.platform_w;
        for (p, cores) in self.host.pkg_cores.iter().enumerate() {
            let mut awake = 0.0f64;
            let mut cores_w = 0.0;
            for &core in cores {
                b.thread_busy.clear();
                b.thread_busy
                    .extend(self.host.core_cpus[core].iter().map(|&c| b.cpu_busy[c]));
                thread_overlap(&b.thread_busy, &mut b.overlap);
                awake = awake.max(b.overlap.first().copied().unwrap_or(0.0));
                cores_w += model.core_power(&b.overlap);
            }
            power += model.package_base_power(awake) + cores_w;
            self.totals.pkg_idle_ns[p] += (1.0 - awake) * dt;
        }
        self.totals.energy_j += power * dt * 1e-9;
    }

    /// Records when each VM's job finished: all its work arrived and done.
    fn mark_finished_jobs(&mut self) {
        let now_s = self.clock.t as f64 * 1e-9;
        for vm in &mut self.vms {
            if vm.done_s.is_none() && vm.remaining_ns.is_some_and(|r| r < EMPTY_BACKLOG_NS) {
                let drained = self.vcpus[vm.first..vm.first + vm.count]
                    .iter()
                    .all(|v| v.backlog_ns < EMPTY_BACKLOG_NS);
                if drained {
                    vm.done_s = Some(now_s);
                }
            }
        }
    }

    /// Whether there are jobs and every one of them finished.
    fn all_jobs_done(&self) -> bool {
        self.has_jobs && !self.vms.iter().any(Vm::job_pending)
    }

    /// The progress report, once per simulated second.
    fn progress_due(&mut self) -> Option<Progress> {
        let clock = &mut self.clock;
        if clock.t < clock.next_progress_ns {
            return None;
        }
        clock.next_progress_ns += 1_000 * NS_PER_MS;
        Some(Progress {
            simulated_s: clock.t as f64 * 1e-9,
            limit_s: clock.limit_ns as f64 * 1e-9,
            work_fraction: self
                .has_jobs
                .then(|| (self.totals.work_done_ns / self.total_job_ns).min(1.0)),
        })
    }

    /// Closes the last (maybe partial) tick and reports the run.
    fn finish(mut self) -> RunResult {
        let t = self.clock.t;
        let partial = t % self.clock.tick_ns;
        let last_tick_ns = if partial == 0 {
            self.clock.tick_ns
        } else {
            partial
        };
        record_tick(
            &mut self.timeline,
            &mut self.vcpus,
            &self.host,
            last_tick_ns as f64,
        );
        let elapsed_ns = t as f64;
        RunResult {
            placement: self.placement,
            elapsed_s: elapsed_ns * 1e-9,
            has_jobs: self.has_jobs,
            finished: !self.vms.iter().any(Vm::job_pending),
            vm_done_s: self.vms.iter().map(|vm| vm.done_s).collect(),
            work_done_s: self.totals.work_done_ns * 1e-9,
            backlog_s: self.vcpus.iter().map(|v| v.backlog_ns).sum::<f64>() * 1e-9,
            package_idle: self
                .totals
                .pkg_idle_ns
                .iter()
                .map(|ns| ns / elapsed_ns)
                .collect(),
            energy_j: self.totals.energy_j,
            migrations: self.totals.migrations,
            ticks: self.totals.ticks,
            timeline: self.timeline,
            package_ids: self.host.package_ids,
        }
    }
}

/// Appends one timeline cell per vCPU and clears the tick accumulators.
fn record_tick(timeline: &mut Option<Timeline>, vcpus: &mut [Vcpu], host: &Host, tick_ns: f64) {
    for (i, v) in vcpus.iter_mut().enumerate() {
        if let Some(tl) = timeline.as_mut() {
            let ran_most = v
                .tick_pkg_ns
                .iter()
                .enumerate()
                .filter(|(_, ns)| **ns > 0.0)
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(p, _)| p);
            let package = ran_most
                .or((v.cpu != NO_CPU).then(|| host.cpu_pkg[v.cpu]))
                .and_then(|p| u16::try_from(p).ok());
            // A share in 0..=1: f32 keeps it to well within a pixel.
            #[allow(clippy::cast_possible_truncation)]
            let busy = (v.tick_busy_ns / tick_ns).clamp(0.0, 1.0) as f32;
            tl.cells[i].push(TimelineCell { package, busy });
        }
        v.tick_busy_ns = 0.0;
        v.tick_pkg_ns.iter_mut().for_each(|ns| *ns = 0.0);
    }
}
