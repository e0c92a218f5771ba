//! The unpinned baseline: no packing at all.
//!
//! [`super::Placement::Unpinned`] models vCPU threads left to a host scheduler that
//! knows nothing of packages, as on symmetric x86 servers today (EAS does not
//! run there): a vCPU that wakes goes to an idle CPU chosen uniformly at
//! random among all idle CPUs of the host (the CPU with the fewest runnable
//! vCPUs when none is idle); a CPU left with two runnable vCPUs while another
//! CPU idles has one pulled to a random idle CPU at once (newly idle
//! balancing); and a running vCPU is displaced to a random idle CPU after a
//! random residency of mean [`super::UNPINNED_MEAN_RESIDENCY_MS`] (host threads and
//! interrupts preempt it and the balancer moves it). Linux prefers a waking
//! thread's previous CPU when that is idle, so this is the upper bound of
//! wandering: real unpinned threads sit between it and `performance`. Every
//! change of CPU is a migration and pays the migration cost.

use super::host::{Host, NO_CPU};
use super::{MigrationCost, Vcpu};
use crate::load::Rng;

/// The unpinned baseline's host scheduler (module docs): where a scheduler
/// that knows nothing of packages runs each runnable vCPU.
pub(super) struct UnpinnedHost {
    rng: Rng,
    /// Scratch list of candidate CPUs.
    idle_cpus: Vec<usize>,
    /// [`super::SimConfig::unpinned_mean_residency_ms`] in ns.
    residency_ns: f64,
}

impl UnpinnedHost {
    /// The baseline's scheduler with its own random stream from `seed`, and
    /// a mean residency of `residency_ns`.
    pub(super) fn new(seed: u64, residency_ns: f64) -> Self {
        UnpinnedHost {
            rng: Rng::stream(seed, u64::MAX, 0),
            idle_cpus: Vec::new(),
            residency_ns,
        }
    }

    /// One step: fills `runq` with every runnable vCPU, moving woken, stacked
    /// and displaced ones, and counts the moves in `migrations`.
    pub(super) fn place(
        &mut self,
        vcpus: &mut [Vcpu],
        host: &Host,
        runq: &mut [Vec<usize>],
        cost: MigrationCost,
        now_ns: f64,
        migrations: &mut u64,
    ) {
        let mut move_to = |v: &mut Vcpu, cpu: usize, rng: &mut Rng| {
            if v.cpu != NO_CPU && v.cpu != cpu {
                *migrations += 1;
                v.warmup_ns += cost.between(host, v.cpu, cpu);
            }
            v.cpu = cpu;
            v.displace_at_ns = now_ns + rng.exponential(self.residency_ns);
        };
        let (rng, idle_cpus) = (&mut self.rng, &mut self.idle_cpus);
        // Running vCPUs keep their CPU, unless displaced (handled after wake-ups).
        for (i, v) in vcpus.iter().enumerate() {
            if v.runnable && !v.displace_at_ns.is_nan() && v.cpu != NO_CPU {
                runq[v.cpu].push(i);
            }
        }
        // Wake-ups: a random idle CPU anywhere, else the least loaded.
        for (i, v) in vcpus.iter_mut().enumerate() {
            if !(v.runnable && (v.displace_at_ns.is_nan() || v.cpu == NO_CPU)) {
                continue;
            }
            let cpu = pick_cpu(runq, idle_cpus, rng, None);
            move_to(v, cpu, rng);
            runq[cpu].push(i);
        }
        // Displacement of long-running vCPUs, to a random other idle CPU.
        for c in 0..runq.len() {
            let mut k = 0;
            while k < runq[c].len() {
                let i = runq[c][k];
                if vcpus[i].displace_at_ns <= now_ns {
                    let target = pick_cpu(runq, idle_cpus, rng, Some(c));
                    if runq[target].is_empty() && target != c {
                        runq[c].swap_remove(k);
                        move_to(&mut vcpus[i], target, rng);
                        runq[target].push(i);
                        continue;
                    }
                    vcpus[i].displace_at_ns = now_ns + rng.exponential(self.residency_ns);
                }
                k += 1;
            }
        }
        // Newly idle balancing: stacked vCPUs go to idle CPUs.
        for c in 0..runq.len() {
            while runq[c].len() > 1 {
                idle_cpus.clear();
                idle_cpus.extend((0..runq.len()).filter(|&d| runq[d].is_empty()));
                if idle_cpus.is_empty() {
                    return;
                }
                let target = idle_cpus[rng.below(idle_cpus.len())];
                if let Some(i) = runq[c].pop() {
                    move_to(&mut vcpus[i], target, rng);
                    runq[target].push(i);
                }
            }
        }
    }
}

/// A uniformly random idle CPU (not `except`), else a random one among the
/// least loaded.
fn pick_cpu(
    runq: &[Vec<usize>],
    candidates: &mut Vec<usize>,
    rng: &mut Rng,
    except: Option<usize>,
) -> usize {
    candidates.clear();
    candidates.extend((0..runq.len()).filter(|&c| runq[c].is_empty() && Some(c) != except));
    if candidates.is_empty() {
        let least = runq.iter().map(Vec::len).min().unwrap_or(0);
        candidates.extend((0..runq.len()).filter(|&c| runq[c].len() == least));
    }
    candidates[rng.below(candidates.len())]
}
