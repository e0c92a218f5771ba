//! The clairvoyant bound: energy that no placement the simulator can run
//! goes below, computed from the load alone (same generators, seeds, jobs,
//! topology and power model), free of every placement cost (migrations,
//! cache sharing, waiting for a CPU).
//!
//! # The bound
//!
//! ```text
//! bound(W) = floor x T_min + max(joint x W, wake x A_open + core x W)
//! ```
//!
//! for a run that does `W` CPU-seconds of work. The simulator's energy is
//! exactly `floor x T + wake x A + C` ([`crate::run`], step 5): `floor` the
//! platform and every package idle, `T` the run time, `wake` what an awake
//! package adds, `A` the package-awake time summed over packages and `C` the
//! cores' energy. Each term of the bound is a lower bound on the matching
//! term of any run, because every placement (each engine policy and
//! `unpinned`) runs in the same step loop, where:
//!
//! 1. a vCPU runs on one CPU in a step and at a rate of at most one CPU's
//!    work per unit of time (its thread's share of a core of capacity
//!    ≤ 1024, times a cache factor ≤ 1; migration warm-up is busy time
//!    without work);
//! 2. a CPU idles only when none of its vCPUs has work: time slicing by
//!    water-filling keeps it busy for what its vCPUs need, up to the whole
//!    step, so it is busy at least as long as any one of them needs;
//! 3. every runnable vCPU is on a CPU.
//!
//! The *ideal timeline* runs the load with every vCPU served at that full
//! rate as soon as its work arrives (up to a whole step of work per step), as
//! if each had a core of its own. By
//! induction over steps, a vCPU's backlog under any placement is never below
//! its ideal backlog (it arrives no earlier and is served no faster), and a
//! closed-loop vCPU's k-th burst arrives no earlier than in the ideal
//! timeline (it waits for the previous burst to be done).
//!
//! - **`T_min`**: without jobs, the duration, as for every run. With jobs,
//!   when the ideal timeline has finished every job: a VM whose generators
//!   are all open loop gets the same arrivals under any placement and drains
//!   no earlier than its ideal backlogs do; a VM with a closed-loop vCPU
//!   receives its job's work no faster than in the ideal timeline, so its
//!   run lasts at least until the end of the step in which the ideal
//!   timeline has received all of it. A placement that delays work pays the
//!   floor for longer; the bound pays it for `T_min` only.
//! - **`A_open`**: for a vCPU whose arrivals do not depend on the placement
//!   (open loop, in a VM without a job or with open-loop vCPUs only), facts
//!   2 and 3 and its backlog keep its CPU busy in each step at least as long
//!   as the ideal timeline runs it (counted only once its ideal backlog
//!   reaches the simulator's empty threshold, below which no vCPU runs), and
//!   a package is awake as long as its busiest CPU: each step adds the
//!   longest ideal run time of such a vCPU.
//! - **`joint`** (J per CPU-second): in a step, a package awake for a
//!   fraction `a` has every CPU busy for at most `a`. Package and core power
//!   and the work done are linear in the busy fractions once their order is
//!   fixed, so over fractions from 0 to `a` the ratio of power to work is
//!   smallest where each is 0 or `a`; a thread at 0 that still counts as busy
//!   only lowers its siblings' share. So the ratio is at least the best of
//!   the package's configurations (how many threads busy on each core, at
//!   most the number of vCPUs in all, SMT sharing by [`thread_share`]) with
//!   its wake-up, found by Dinkelbach's method over a knapsack of the thread
//!   budget. So `wake x A + C >= joint x W`.
//! - **`core`** (J per CPU-second): the same argument for one core and its
//!   own power only: `C >= core x W`.
//!
//! # Where it is tight and where it is not
//!
//! A constant load that fits in one package, one vCPU per core, on a host
//! without SMT, gets exactly the energy of a placement that packs it there:
//! `T_min` is its run time, `A_open` the busiest vCPU's time, `core x W` its
//! cores' energy. The bound is looser for closed-loop (`bursty`) loads: when
//! their bursts run depends on the placement (a slowed burst shifts the later
//! ones, which may then overlap other vCPUs' bursts), so no step of the ideal
//! timeline bounds their package-awake time, and only `joint` counts it, as
//! if the vCPUs always ran together. It is also looser on SMT hosts where a
//! core's second thread is cheaper per work than a second core (the default
//! power model): `core` and `joint` count that even when the vCPUs cannot
//! keep both threads busy, or it would lengthen the run.
//!
//! A run that leaves work undone (a host that cannot keep up without jobs,
//! or jobs cut by the duration cap) does less work, so the bound is taken
//! for the work each run did: `bound(W)`.

use pvmm_scheduler::capacity::{thread_share, CAPACITY_SCALE};
use pvmm_scheduler::power::PowerModel;
use pvmm_scheduler::topology::HostTopology;

use super::load::{LoadState, EMPTY_BACKLOG_NS, NS_PER_MS};
use super::run::{Host, SimConfig, SimError};
use super::spec::VmSpec;

/// Dinkelbach rounds for a package's best configuration. Each round moves to
/// a strictly better configuration and there are finitely many, so a few
/// rounds suffice (the ratio converges superlinearly); the cap only guards
/// against floating-point cycling, and the bound stays valid when it stops
/// early ([`package_joule_per_cpu_s`]).
const DINKELBACH_ROUNDS: usize = 64;

/// The clairvoyant bound of one load on one host (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// `T_min`: no run of this load is shorter (s).
    pub run_time_s: f64,
    /// `floor x T_min` (J).
    floor_j: f64,
    /// `wake x A_open` (J).
    open_wake_j: f64,
    /// `joint`: package and core energy per CPU-second of work (J).
    joint_j_per_cpu_s: f64,
    /// `core`: core energy per CPU-second of work (J).
    core_j_per_cpu_s: f64,
}

impl Bound {
    /// The least energy (J) of a run of this load that does `work_s`
    /// CPU-seconds of work.
    pub fn energy_j(&self, work_s: f64) -> f64 {
        let work_s = work_s.max(0.0);
        let with_open = self.open_wake_j + self.core_j_per_cpu_s * work_s;
        self.floor_j + (self.joint_j_per_cpu_s * work_s).max(with_open)
    }
}

/// The clairvoyant bound of `vms` on `topology` with the settings of
/// `config` (its placement settings do not matter).
pub fn clairvoyant(
    topology: &HostTopology,
    vms: &[VmSpec],
    config: &SimConfig,
) -> Result<Bound, SimError> {
    config.validate()?;
    let vcpus: usize = vms.iter().map(|vm| vm.vcpus.len()).sum();
    if vcpus == 0 {
        return Err(SimError::NoVcpus);
    }
    let host = Host::new(topology);
    let power = &config.power;
    let ideal = ideal_timeline(vms, config);
    let floor_w = power.platform_w + host.package_ids.len() as f64 * power.package_base_power(0.0);
    let wake_w = package_wake_w(power);
    let run_time_s = ideal.run_time_ns as f64 * 1e-9;
    Ok(Bound {
        run_time_s,
        floor_j: floor_w * run_time_s,
        open_wake_j: wake_w * ideal.open_awake_ns * 1e-9,
        joint_j_per_cpu_s: host_joule_per_cpu_s(&host, power, vcpus),
        core_j_per_cpu_s: core_joule_per_cpu_s(&host, power, vcpus),
    })
}

/// What an awake package draws over an idle one (W).
fn package_wake_w(power: &PowerModel) -> f64 {
    power.package_base_power(1.0) - power.package_base_power(0.0)
}

/// What the ideal timeline yields.
struct Ideal {
    /// `T_min` (ns).
    run_time_ns: u64,
    /// `A_open` (ns).
    open_awake_ns: f64,
}

struct IdealVcpu {
    load: LoadState,
    backlog_ns: f64,
    vm: usize,
    /// Its arrivals do not depend on the placement.
    fixed_arrivals: bool,
}

struct IdealVm {
    /// Work of the job left to arrive (ns); `None` without a job.
    remaining_ns: Option<f64>,
    closed_loop: bool,
    first: usize,
    count: usize,
    done: bool,
}

/// Runs the load with every vCPU served at full rate as its work arrives,
/// step by step as the simulator does, until every job is done or the
/// duration is up (module docs).
fn ideal_timeline(vms: &[VmSpec], config: &SimConfig) -> Ideal {
    let (mut vcpus, mut vm_state) = ideal_vms(vms, config.seed);
    let step_ns = config.step_us * 1000;
    let dt = step_ns as f64;
    let limit_ns = config.duration_ms * NS_PER_MS;
    let has_jobs = vm_state.iter().any(|vm| vm.remaining_ns.is_some());
    let mut t = 0u64;
    let mut open_awake_ns = 0.0;
    while t < limit_ns {
        let mut busiest = 0.0f64;
        for v in &mut vcpus {
            let mut work = v.load.arrivals(t, step_ns, v.backlog_ns);
            if let Some(remaining) = vm_state[v.vm].remaining_ns.as_mut() {
                work = work.min(*remaining);
                *remaining -= work;
            }
            v.backlog_ns += work;
            if v.fixed_arrivals && v.backlog_ns >= EMPTY_BACKLOG_NS {
                busiest = busiest.max(v.backlog_ns.min(dt));
            }
            v.backlog_ns = (v.backlog_ns - dt).max(0.0);
        }
        open_awake_ns += busiest;
        t += step_ns;
        if has_jobs && all_jobs_done(&mut vm_state, &vcpus) {
            break;
        }
    }
    Ideal {
        run_time_ns: t,
        open_awake_ns,
    }
}

/// The ideal timeline's vCPUs (each with the simulator's random stream) and VMs.
fn ideal_vms(vms: &[VmSpec], seed: u64) -> (Vec<IdealVcpu>, Vec<IdealVm>) {
    let mut vcpus = Vec::new();
    let mut vm_state = Vec::new();
    for (vm_index, vm) in vms.iter().enumerate() {
        let closed_loop = vm.vcpus.iter().any(|spec| spec.is_closed_loop());
        let shared_job = vm.work_s.is_some() && closed_loop;
        let first = vcpus.len();
        for (i, spec) in vm.vcpus.iter().enumerate() {
            vcpus.push(IdealVcpu {
                fixed_arrivals: !spec.is_closed_loop() && !shared_job,
                load: LoadState::for_vcpu(spec.clone(), seed, vm_index, i),
                backlog_ns: 0.0,
                vm: vm_index,
            });
        }
        vm_state.push(IdealVm {
            remaining_ns: vm.work_s.map(|w| w * 1e9),
            closed_loop,
            first,
            count: vm.vcpus.len(),
            done: false,
        });
    }
    (vcpus, vm_state)
}

/// Marks the jobs no run can have finished before now (module docs,
/// `T_min`) and says whether every job is marked.
fn all_jobs_done(vms: &mut [IdealVm], vcpus: &[IdealVcpu]) -> bool {
    for vm in vms.iter_mut() {
        let arrived = vm.remaining_ns.is_some_and(|r| r < EMPTY_BACKLOG_NS);
        if vm.done || !arrived {
            continue;
        }
        vm.done = vm.closed_loop
            || vcpus[vm.first..vm.first + vm.count]
                .iter()
                .all(|v| v.backlog_ns < EMPTY_BACKLOG_NS);
    }
    vms.iter().all(|vm| vm.done || vm.remaining_ns.is_none())
}

/// One way to run a core for a whole step: how many threads busy, its power
/// (W) and its work (CPUs' worth).
#[derive(Debug, Clone, Copy)]
struct CoreOption {
    threads: usize,
    power_w: f64,
    work: f64,
}

/// The options of each core of the host, per package: 1 to all of its
/// threads busy, on its fastest CPUs.
fn core_options(host: &Host, power: &PowerModel) -> Vec<Vec<Vec<CoreOption>>> {
    let ones = |k: usize| vec![1.0; k];
    host.pkg_cores
        .iter()
        .map(|cores| {
            cores
                .iter()
                .map(|&core| {
                    let cpus = &host.core_cpus[core];
                    let mut capacities: Vec<u32> =
                        cpus.iter().map(|&c| host.cpu_capacity[c]).collect();
                    capacities.sort_unstable_by(|a, b| b.cmp(a));
                    let threads = cpus.first().map_or(1, |&c| host.cpu_threads[c]);
                    (1..=capacities.len())
                        .map(|k| CoreOption {
                            threads: k,
                            power_w: power.core_power(&ones(k)),
                            work: capacities[..k]
                                .iter()
                                .map(|&cap| {
                                    f64::from(thread_share(
                                        cap,
                                        threads,
                                        u32::try_from(k).unwrap_or(threads),
                                    ))
                                })
                                .sum::<f64>()
                                / f64::from(CAPACITY_SCALE),
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// `core`: the least core energy per CPU-second of work of any core run
/// with at most `vcpus` busy threads.
fn core_joule_per_cpu_s(host: &Host, power: &PowerModel, vcpus: usize) -> f64 {
    core_options(host, power)
        .iter()
        .flatten()
        .flatten()
        .filter(|o| o.threads <= vcpus && o.work > 0.0)
        .map(|o| o.power_w / o.work)
        .fold(f64::INFINITY, f64::min)
}

/// `joint`: the least package and core energy per CPU-second of work of any
/// package run with at most `vcpus` busy threads.
fn host_joule_per_cpu_s(host: &Host, power: &PowerModel, vcpus: usize) -> f64 {
    let wake_w = package_wake_w(power);
    core_options(host, power)
        .iter()
        .map(|cores| package_joule_per_cpu_s(wake_w, cores, vcpus))
        .fold(f64::INFINITY, f64::min)
}

/// The least `(wake + cores' power) / work` over the configurations of one
/// package with at most `vcpus` busy threads, by Dinkelbach's method: for a
/// ratio `l`, the configuration that minimises `wake + power - l x work`
/// (a knapsack over the thread budget, [`best_configuration`]) either shows
/// that no configuration is below `l` (a minimum of at least 0) or has a
/// smaller ratio, which becomes the next `l`. If the rounds run out with a
/// negative minimum `m`, every configuration's ratio is still at least
/// `l + m / (most work)`, which is returned: a lower bound either way.
fn package_joule_per_cpu_s(wake_w: f64, cores: &[Vec<CoreOption>], vcpus: usize) -> f64 {
    let budget = vcpus.min(cores.iter().map(Vec::len).sum());
    let most_work: f64 = cores
        .iter()
        .map(|options| options.iter().map(|o| o.work).fold(0.0, f64::max))
        .sum();
    let Some(first) = cores.first().and_then(|options| options.first()) else {
        return f64::INFINITY;
    };
    if budget == 0 || most_work <= 0.0 {
        return f64::INFINITY;
    }
    let mut ratio = (wake_w + first.power_w) / first.work;
    let mut gap = 0.0;
    for _ in 0..DINKELBACH_ROUNDS {
        let Some((power_w, work)) = best_configuration(cores, budget, ratio) else {
            // No busy configuration at all (cannot happen with a core): no
            // work, and 0 bounds any ratio of non-negative powers.
            return 0.0;
        };
        gap = wake_w + power_w - ratio * work;
        if gap >= 0.0 {
            return ratio;
        }
        let next = (wake_w + power_w) / work;
        if next >= ratio {
            break;
        }
        ratio = next;
    }
    ratio + gap.min(0.0) / most_work
}

/// The busy configuration of a package (at least one busy thread, at most
/// `budget` in all) that minimises `power - ratio x work`: its power (W)
/// and work. Knapsack over the cores: `best[b]` is the best choice for the
/// cores so far using `b` threads.
fn best_configuration(cores: &[Vec<CoreOption>], budget: usize, ratio: f64) -> Option<(f64, f64)> {
    let value = |(power_w, work): (f64, f64)| power_w - ratio * work;
    let mut best: Vec<Option<(f64, f64)>> = vec![None; budget + 1];
    best[0] = Some((0.0, 0.0));
    for options in cores {
        let before = best.clone();
        for b in 1..=budget {
            for o in options.iter().filter(|o| o.threads <= b) {
                let Some((p, w)) = before[b - o.threads] else {
                    continue;
                };
                let candidate = (p + o.power_w, w + o.work);
                if best[b].is_none_or(|current| value(candidate) < value(current)) {
                    best[b] = Some(candidate);
                }
            }
        }
    }
    best[1..]
        .iter()
        .flatten()
        .copied()
        .min_by(|a, b| value(*a).total_cmp(&value(*b)))
}

#[cfg(test)]
mod tests;
