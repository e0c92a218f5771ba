//! Energy per VM: each package's energy over a tick is shared out over the VMs by their vCPUs'
//! CPU time on that package, and what no VM used is the package's idle remainder, so that the
//! VMs' shares and the remainder add up to the package's energy, tick by tick and in total.
//!
//! A package's energy comes from RAPL (`/sys/class/powercap/intel-rapl:N/energy_uj`, package
//! N) where the host exposes it, and otherwise from the package power model applied to the
//! placement over the tick's length ([`EnergySource`]; the metrics name the model's series as
//! such). Kepler shares energy out this way for QEMU VMs only; the daemon does it for every VM
//! it places.
//!
//! A VM's CPU time on a package over a tick is the utilization (in CPUs) of its vCPUs placed
//! there, times the tick's length: the readings the placement itself decided on.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use pvmm_api::stats::{EnergySource, HostStatus};
use pvmm_scheduler::HostTopology;

/// Where RAPL's package domains are.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";
/// A RAPL counter that goes back wrapped around (or was reset): that tick adds nothing.
const NO_ENERGY: f64 = 0.0;

/// RAPL package energy counters (`intel-rapl:N/energy_uj`, package N; AMD exposes the same
/// names), in joules; empty where none is readable.
pub fn rapl_energy(root: &Path) -> Vec<(u32, f64)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, f64)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("intel-rapl:")?.parse().ok()?;
            let uj: f64 = std::fs::read_to_string(e.path().join("energy_uj"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((n, uj / 1e6))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// The energy each VM and each package's idle remainder have used since the daemon started.
#[derive(Debug)]
pub struct EnergyLedger {
    powercap: PathBuf,
    source: Option<EnergySource>,
    last_ns: Option<u64>,
    last_rapl: BTreeMap<u32, f64>,
    /// Joules by VM (the VMM's pid: a VM's name may repeat, its pid does not).
    vms: HashMap<i32, f64>,
    /// Joules by package: the package's total, and its idle remainder.
    packages: BTreeMap<u32, (f64, f64)>,
}

impl EnergyLedger {
    /// A ledger reading RAPL under `powercap` if any counter is readable there.
    pub fn new(powercap: PathBuf) -> Self {
        Self {
            powercap,
            source: None,
            last_ns: None,
            last_rapl: BTreeMap::new(),
            vms: HashMap::new(),
            packages: BTreeMap::new(),
        }
    }

    /// Adds the tick that `status` reports (at `now_ns`) and writes the totals into it.
    pub fn account(&mut self, now_ns: u64, topology: &HostTopology, status: &mut HostStatus) {
        let source = *self.source.get_or_insert_with(|| {
            if rapl_energy(&self.powercap).is_empty() {
                EnergySource::Model
            } else {
                EnergySource::Rapl
            }
        });
        let seconds = self
            .last_ns
            .map_or(0.0, |last| now_ns.saturating_sub(last) as f64 / 1e9);
        self.last_ns = Some(now_ns);
        let spent = self.package_energy(source, seconds, status);
        // CPU seconds by (package, VM), in a fixed order: where decayed utilizations add up to
        // more than a package's CPUs, the VMs met first get their whole share.
        let mut used_by: BTreeMap<(u32, i32), f64> = BTreeMap::new();
        for vm in &status.vms {
            for v in &vm.vcpus {
                if let Some(p) = v.package {
                    *used_by.entry((p, vm.pid)).or_default() += v.util * seconds;
                }
            }
        }
        for p in topology.packages() {
            let joules = spent.get(&p.id).copied().unwrap_or(NO_ENERGY);
            let cpu_seconds = p.cpus().len() as f64 * seconds;
            let mut left = 1.0f64;
            for ((_, pid), cpu) in used_by.range((p.id, i32::MIN)..=(p.id, i32::MAX)) {
                let share = if cpu_seconds > 0.0 {
                    (cpu / cpu_seconds).min(left)
                } else {
                    0.0
                };
                left -= share;
                *self.vms.entry(*pid).or_default() += joules * share;
            }
            let totals = self.packages.entry(p.id).or_default();
            totals.0 += joules;
            totals.1 += joules * left;
        }
        let live: std::collections::HashSet<i32> = status.vms.iter().map(|vm| vm.pid).collect();
        self.vms.retain(|pid, _| live.contains(pid));
        status.energy_source = source;
        for vm in &mut status.vms {
            vm.energy_joules = self.vms.get(&vm.pid).copied().unwrap_or(0.0);
        }
        for p in &mut status.packages {
            let (total, idle) = self.packages.get(&p.id).copied().unwrap_or_default();
            p.energy_joules = total;
            p.idle_energy_joules = idle;
        }
    }

    /// Each package's energy over the tick: RAPL's counter since the last tick, or the
    /// model's watts over its length.
    fn package_energy(
        &mut self,
        source: EnergySource,
        seconds: f64,
        status: &HostStatus,
    ) -> BTreeMap<u32, f64> {
        match source {
            EnergySource::Model => status
                .packages
                .iter()
                .map(|p| (p.id, p.power_w_model * seconds))
                .collect(),
            EnergySource::Rapl => {
                let now: BTreeMap<u32, f64> = rapl_energy(&self.powercap).into_iter().collect();
                let spent = now
                    .iter()
                    .map(|(p, j)| {
                        let before = self.last_rapl.get(p).copied().unwrap_or(*j);
                        (*p, if *j >= before { j - before } else { NO_ENERGY })
                    })
                    .collect();
                self.last_rapl = now;
                spent
            }
        }
    }
}

#[cfg(test)]
mod tests;
