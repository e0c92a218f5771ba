//! The oracle placement: packing with perfect, instant knowledge.
//!
//! [`super::Placement::Oracle`] places the vCPUs again at every work step
//! (1 ms), seeing which of them have work the moment it arrives, and pays
//! nothing to move them: no migration warm-up, no limit on moves. In each
//! step it runs the runnable vCPUs one to a core on the fewest packages that
//! have enough cores (packages in topology order); SMT siblings take vCPUs
//! only when every core of the host already has one, and CPUs are shared only
//! when every CPU has one. A runnable vCPU keeps its CPU when that CPU is
//! among the chosen ones and still free; the others take the free chosen CPUs
//! in vCPU order, so a VM's vCPUs that move land on neighbouring CPUs.
//!
//! It is the clairvoyant placement the engine cannot be (the engine sees
//! utilization once a tick, 100 ms late, and each move costs), run in the
//! same step loop under the same rules, so its energy is one that a
//! placement really reaches. The true optimum lies between the clairvoyant
//! bound ([`crate::bound`], which no placement goes below) and this
//! oracle's energy: where the oracle is far above the bound, the bound is
//! loose, not the policies.
//!
//! Without SMT one vCPU per core on the fewest packages is what the power
//! model rewards: an awake package costs the same whatever runs on it, a busy
//! core the same whichever core it is, and sharing a CPU only slows the
//! vCPUs (a closed-loop job then runs longer and pays the platform's floor
//! for longer). On SMT hosts a sibling thread is cheaper per work than a
//! core, so there the oracle is one sensible clairvoyant packing, not
//! necessarily the cheapest.

use super::host::{Host, NO_CPU};
use super::Vcpu;

/// The oracle's placement state: the host's CPUs in the order it fills them
/// and per-step scratch space.
pub(super) struct OracleHost {
    /// Dense CPUs in fill order: each package's cores' first threads, package
    /// by package, then the cores' further threads.
    fill_order: Vec<usize>,
    /// How many entries of `fill_order` are first threads.
    cores: usize,
    /// Per dense CPU: whether this step uses it.
    chosen: Vec<bool>,
    /// Runnable vCPUs still without a CPU this step.
    waiting: Vec<usize>,
}

impl OracleHost {
    /// The oracle for `host`.
    pub(super) fn new(host: &Host) -> Self {
        let mut fill_order = Vec::with_capacity(host.num_cpus());
        let max_threads = host.core_cpus.iter().map(Vec::len).max().unwrap_or(1);
        for thread in 0..max_threads {
            for cores in &host.pkg_cores {
                for &core in cores {
                    if let Some(&cpu) = host.core_cpus[core].get(thread) {
                        fill_order.push(cpu);
                    }
                }
            }
        }
        OracleHost {
            fill_order,
            cores: host.core_cpus.len(),
            chosen: vec![false; host.num_cpus()],
            waiting: Vec::new(),
        }
    }

    /// One step: puts every runnable vCPU in `runq` (module docs), counting
    /// the CPU changes in `migrations`; they cost nothing.
    pub(super) fn place(
        &mut self,
        vcpus: &mut [Vcpu],
        host: &Host,
        runq: &mut [Vec<usize>],
        migrations: &mut u64,
    ) {
        let runnable = vcpus.iter().filter(|v| v.runnable).count();
        if runnable == 0 {
            return;
        }
        self.choose_cpus(host, runnable);
        // Keep a vCPU where it is when its CPU is chosen and still free.
        self.waiting.clear();
        for (i, v) in vcpus.iter().enumerate() {
            if !v.runnable {
                continue;
            }
            if v.cpu != NO_CPU && self.chosen[v.cpu] && runq[v.cpu].is_empty() {
                runq[v.cpu].push(i);
            } else {
                self.waiting.push(i);
            }
        }
        // The others (in vCPU order, so a VM's vCPUs stay together) on the
        // free chosen CPUs in fill order, then on the least loaded ones.
        let mut slots = self.fill_order.iter().copied().filter(|&c| self.chosen[c]);
        for &i in &self.waiting {
            let cpu = slots
                .by_ref()
                .find(|&c| runq[c].is_empty())
                .unwrap_or_else(|| least_loaded(&self.fill_order, runq));
            let v = &mut vcpus[i];
            if v.cpu != NO_CPU && v.cpu != cpu {
                *migrations += 1;
            }
            v.cpu = cpu;
            runq[cpu].push(i);
        }
    }

    /// Marks the CPUs this step uses for `runnable` vCPUs: the first threads
    /// of the cores of the fewest packages with enough cores, or, when
    /// `runnable` exceeds the host's cores, every core and as many further
    /// threads as needed.
    fn choose_cpus(&mut self, host: &Host, runnable: usize) {
        self.chosen.iter_mut().for_each(|c| *c = false);
        let take = if runnable >= self.cores {
            runnable.min(self.fill_order.len())
        } else {
            let mut cores = 0;
            for package in &host.pkg_cores {
                cores += package.len();
                if cores >= runnable {
                    break;
                }
            }
            cores
        };
        for &cpu in &self.fill_order[..take] {
            self.chosen[cpu] = true;
        }
    }
}

/// The CPU of `order` with the fewest runnable vCPUs (the first such).
fn least_loaded(order: &[usize], runq: &[Vec<usize>]) -> usize {
    order
        .iter()
        .copied()
        .min_by_key(|&c| runq[c].len())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvmm_scheduler::topology::HostTopology;

    #[test]
    fn fill_order_is_cores_package_by_package_then_siblings() {
        let host = Host::new(&HostTopology::from_spec("2x2x2").unwrap());
        let oracle = OracleHost::new(&host);
        let pkg = |c: usize| host.cpu_pkg[c];
        let first: Vec<usize> = oracle.fill_order[..4].iter().map(|&c| pkg(c)).collect();
        assert_eq!(first, vec![0, 0, 1, 1]);
        // The first four are distinct cores; the last four their siblings.
        let cores: Vec<usize> = oracle
            .fill_order
            .iter()
            .map(|&c| host.cpu_core[c])
            .collect();
        assert_eq!(&cores[..4], &cores[4..]);
        assert_eq!(oracle.cores, 4);
    }

    #[test]
    fn chooses_the_fewest_packages_with_enough_cores() {
        let host = Host::new(&HostTopology::from_spec("2x2x2").unwrap());
        let mut oracle = OracleHost::new(&host);
        let chosen = |o: &OracleHost| o.chosen.iter().filter(|&&c| c).count();
        oracle.choose_cpus(&host, 1);
        assert_eq!(chosen(&oracle), 2, "package 0's two cores");
        oracle.choose_cpus(&host, 3);
        assert_eq!(chosen(&oracle), 4, "both packages' cores");
        oracle.choose_cpus(&host, 5);
        assert_eq!(chosen(&oracle), 5, "every core and one sibling");
        oracle.choose_cpus(&host, 20);
        assert_eq!(chosen(&oracle), 8, "every CPU");
    }
}
