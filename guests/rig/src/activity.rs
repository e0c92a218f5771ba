//! L1's CPU activity over a time window, from a probe's `/proc/stat` samples: each package's
//! idle share and the energy the simulator's power model gives for that activity. The rig has
//! no RAPL, so energy is modelled from measured activity. Shared by the placement and
//! host-wide benchmarks, whose probes print the same lines:
//!
//! - `PKG <cpu> <package> <core>` per L1 CPU (sysfs topology);
//! - `T <L1 uptime>` at each sample, then `C cpuN <the /proc/stat counters>` per CPU.
//!
//! The probes print them with the shell functions of [`crate::scripts::CPU_ACTIVITY_LIB`].

use std::collections::BTreeMap;

use pvmm_scheduler::power::thread_overlap;
use pvmm_scheduler::power::PowerModel;
use pvmm_tick::cpustat::CpuTimes;

/// One sample: L1 uptime and per-CPU (idle, total) ticks.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuSample {
    /// L1 uptime (s).
    pub t: f64,
    /// CPU -> its `/proc/stat` times.
    pub cpus: BTreeMap<u32, CpuTimes>,
}

/// What the probe printed about L1's CPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Activity {
    /// CPU -> (package, core).
    pub cores: BTreeMap<u32, (u32, u32)>,
    /// The samples, in order.
    pub samples: Vec<CpuSample>,
}

/// Measured over a window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowActivity {
    /// Seconds covered by samples.
    pub seconds: f64,
    /// Per package (ascending id), the share of the window in which none of its CPUs ran.
    pub package_idle: Vec<f64>,
    /// Modelled energy (J).
    pub energy_j: f64,
}

impl Activity {
    /// Takes one probe line; false when it is not a `PKG`, `T` or `C` line.
    pub fn parse_line(&mut self, line: &str) -> bool {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["PKG", cpu, pkg, core] => {
                if let (Ok(c), Ok(p), Ok(k)) = (cpu.parse(), pkg.parse(), core.parse()) {
                    self.cores.insert(c, (p, k));
                }
            }
            ["T", up] => {
                if let Ok(t) = up.parse() {
                    self.samples.push(CpuSample {
                        t,
                        cpus: BTreeMap::new(),
                    });
                }
            }
            ["C", cpu, counters @ ..] if counters.len() >= 8 => {
                let (Some(cpu), Some(sample)) = (
                    cpu.strip_prefix("cpu").and_then(|c| c.parse().ok()),
                    self.samples.last_mut(),
                ) else {
                    return true;
                };
                let n: Vec<u64> = counters.iter().filter_map(|c| c.parse().ok()).collect();
                if n.len() >= 8 {
                    sample.cpus.insert(cpu, CpuTimes::from_counters(&n));
                }
            }
            _ => return false,
        }
        true
    }

    fn packages(&self) -> Vec<u32> {
        let mut p: Vec<u32> = self.cores.values().map(|&(p, _)| p).collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    /// Package idle shares and modelled energy between L1 times `begin` and `end`.
    ///
    /// Per sample interval, a package is awake for the largest busy share of its CPUs (their
    /// busy time is assumed to overlap, the simulator's `thread_overlap` assumption), and the
    /// power model prices each package's awake share and its cores' activity.
    pub fn window(
        &self,
        begin: f64,
        end: f64,
        model: &PowerModel,
    ) -> Result<WindowActivity, String> {
        let inside: Vec<&CpuSample> = self
            .samples
            .iter()
            .filter(|s| s.t >= begin && s.t <= end && s.cpus.len() == self.cores.len())
            .collect();
        if inside.len() < 3 {
            return Err(format!("only {} samples in the load window", inside.len()));
        }
        let packages = self.packages();
        let mut idle_time = vec![0.0; packages.len()];
        let mut energy_j = 0.0;
        let mut seconds = 0.0;
        let mut levels = Vec::new();
        for pair in inside.windows(2) {
            let dt = pair[1].t - pair[0].t;
            if dt <= 0.0 {
                continue;
            }
            let busy = busy_shares(pair[0], pair[1]);
            let mut power = model.platform_w;
            for (slot, &pkg) in packages.iter().enumerate() {
                let mut core_busy: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
                for (&cpu, &(p, core)) in &self.cores {
                    if p == pkg {
                        core_busy
                            .entry(core)
                            .or_default()
                            .push(busy.get(&cpu).copied().unwrap_or(0.0));
                    }
                }
                let awake = core_busy
                    .values()
                    .flatten()
                    .copied()
                    .fold(0.0_f64, f64::max);
                idle_time[slot] += (1.0 - awake) * dt;
                let mut core_levels: Vec<Vec<f64>> = Vec::new();
                for threads in core_busy.values() {
                    thread_overlap(threads, &mut levels);
                    core_levels.push(levels.clone());
                }
                power += model.package_power(awake, core_levels.iter().map(Vec::as_slice));
            }
            energy_j += power * dt;
            seconds += dt;
        }
        Ok(WindowActivity {
            seconds,
            package_idle: idle_time.iter().map(|t| t / seconds).collect(),
            energy_j,
        })
    }
}

impl Activity {
    /// Seconds from L1 time `from` until package `package` is idle for good: the first sample
    /// at or after `from` from which, in every sample interval up to `until`, each of the
    /// package's CPUs was busy at most `max_busy` of the time. Some(0) when it never woke after
    /// `from`'s sample; None when it was not idle in the last interval before `until` (or the
    /// samples do not cover the span). The time is that of the sample that ends the last busy
    /// interval, so it overstates by up to one sampling interval.
    pub fn idle_for_good_after(
        &self,
        package: u32,
        from: f64,
        until: f64,
        max_busy: f64,
    ) -> Option<f64> {
        let cpus: Vec<u32> = self
            .cores
            .iter()
            .filter(|(_, &(p, _))| p == package)
            .map(|(&c, _)| c)
            .collect();
        let inside: Vec<&CpuSample> = self
            .samples
            .iter()
            .filter(|s| s.t >= from && s.t <= until && s.cpus.len() == self.cores.len())
            .collect();
        if cpus.is_empty() || inside.len() < 2 {
            return None;
        }
        // Walk back from the last interval while the package stays idle.
        let mut idle_since = inside.len() - 1;
        for i in (1..inside.len()).rev() {
            let busy = busy_shares(inside[i - 1], inside[i]);
            if cpus
                .iter()
                .any(|c| busy.get(c).copied().unwrap_or(0.0) > max_busy)
            {
                break;
            }
            idle_since = i - 1;
        }
        match idle_since {
            i if i == inside.len() - 1 => None,
            0 => Some(0.0),
            i => Some(inside[i].t - from),
        }
    }
}

/// Busy share of each CPU between two samples.
fn busy_shares(a: &CpuSample, b: &CpuSample) -> BTreeMap<u32, f64> {
    b.cpus
        .iter()
        .filter_map(|(&cpu, after)| {
            let idle = after.idle_fraction_since(a.cpus.get(&cpu)?);
            Some((cpu, idle.map_or(0.0, |idle| 1.0 - idle)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_package_and_a_half_busy_one() {
        let mut a = Activity::default();
        for line in ["PKG 0 0 0", "PKG 1 0 1", "PKG 2 1 0", "PKG 3 1 1"] {
            assert!(a.parse_line(line));
        }
        // CPU 0 half busy every second, the rest idle (counters: user nice system idle
        // iowait irq softirq steal).
        for s in 0..4u64 {
            assert!(a.parse_line(&format!("T {}", 10 + s)));
            for cpu in 0..4 {
                let busy = if cpu == 0 { 50 * s } else { 0 };
                let idle = 100 * s - busy;
                let line = format!("C cpu{cpu} {busy} 0 0 {idle} 0 0 0 0 0 0");
                assert!(a.parse_line(&line));
            }
        }
        assert!(!a.parse_line("M 10.5 load-begin"));
        let w = a.window(10.0, 13.0, &PowerModel::default()).unwrap();
        assert!((w.seconds - 3.0).abs() < 1e-9);
        assert!((w.package_idle[0] - 0.5).abs() < 1e-9, "{w:?}");
        assert!((w.package_idle[1] - 1.0).abs() < 1e-9, "{w:?}");
        assert!(w.energy_j > 0.0);
        assert!(a.window(20.0, 30.0, &PowerModel::default()).is_err());
        // Package 1 never woke; package 0 was busy to the end.
        assert_eq!(a.idle_for_good_after(1, 10.0, 13.0, 0.1), Some(0.0));
        assert_eq!(a.idle_for_good_after(0, 10.0, 13.0, 0.1), None);
        assert_eq!(a.idle_for_good_after(1, 20.0, 30.0, 0.1), None);
    }

    #[test]
    fn a_package_idle_for_good_from_the_sample_after_its_last_busy_interval() {
        let mut a = Activity::default();
        for line in ["PKG 0 0 0", "PKG 1 1 0"] {
            assert!(a.parse_line(line));
        }
        // CPU 1 busy in the intervals ending at 11 and 13, idle from 13 on.
        let busy_until = [0, 100, 100, 200, 200, 200, 200];
        for (s, &busy) in busy_until.iter().enumerate() {
            let s = s as u64;
            assert!(a.parse_line(&format!("T {}", 10 + s)));
            assert!(a.parse_line(&format!("C cpu0 0 0 0 {} 0 0 0 0", 100 * s)));
            let idle = 100 * s - busy;
            assert!(a.parse_line(&format!("C cpu1 {busy} 0 0 {idle} 0 0 0 0")));
        }
        assert_eq!(a.idle_for_good_after(1, 10.0, 16.0, 0.1), Some(3.0));
        assert_eq!(a.idle_for_good_after(1, 12.0, 16.0, 0.1), Some(1.0));
    }
}
