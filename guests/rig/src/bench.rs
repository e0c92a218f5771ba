//! The boot-time benchmark: time from starting the inner VMM to the guest's init marker, for
//! pvmm and for `qemu-system-x86_64 -enable-kvm`, alternating within ONE L1 boot (same kernel,
//! initramfs, vCPUs and memory), so both see the same noisy machine. Reported as medians and
//! the ratio QEMU / pvmm (above 1: pvmm boots faster). Not a test: no thresholds.

use std::time::Duration;

use crate::images::{L1Images, Workspace};
use crate::rig::{
    guest_cmdline, inner_vmm_command, run_l1, InnerVmm, L1Job, L1Options, RigError, RigOutcome,
    Topology,
};
use crate::scripts::shell_join;

/// Limit for one inner VMM run inside L1 (busybox `timeout -s KILL`): a guest that has not
/// reached init and powered off by then is stuck, and the other runs should still happen.
/// A 4-vCPU boot takes about 10-20 s in the rig; 180 s is ample on a noisy machine.
pub const PER_RUN_LIMIT_SECS: u64 = 180;

/// What to benchmark.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Guest vCPUs, for both VMMs.
    pub vcpus: u32,
    /// Guest memory in MiB, for both VMMs.
    pub memory_mib: u64,
    /// Boots per VMM.
    pub runs: u32,
    /// L1 topology.
    pub topology: Topology,
    /// Measure pvmm too (false: QEMU only, e.g. while pvmm cannot boot yet).
    pub with_pvmm: bool,
    /// Print the rig's lines as they arrive.
    pub echo: bool,
    /// Add `quiet` to the guest command line (see [`crate::rig::guest_cmdline`]).
    pub quiet: bool,
}

/// One VMM's measurements.
#[derive(Debug, Clone, Default)]
pub struct VmmTimes {
    /// Boot-to-init seconds per run, from starting the VMM in L1 (None: the guest never
    /// reached init).
    pub boot_seconds: Vec<Option<f64>>,
    /// The guest kernel's own uptime when its init started, per run: the kernel's part of the
    /// boot; the rest of `boot_seconds` is the VMM's setup (and firmware, for QEMU).
    pub guest_uptime: Vec<Option<f64>>,
    /// Exit status per run (None: not reported).
    pub exit_status: Vec<Option<i32>>,
}

impl VmmTimes {
    /// Median boot-to-init of the runs that reached init, if any did.
    pub fn median(&self) -> Option<f64> {
        median(&self.boot_seconds)
    }

    /// Median of the guest kernel's uptime at init.
    pub fn median_guest_uptime(&self) -> Option<f64> {
        median(&self.guest_uptime)
    }
}

/// Median of the present values, if any.
fn median(values: &[Option<f64>]) -> Option<f64> {
    let mut ok: Vec<f64> = values.iter().flatten().copied().collect();
    if ok.is_empty() {
        return None;
    }
    ok.sort_by(f64::total_cmp);
    let mid = ok.len() / 2;
    Some(if ok.len() % 2 == 1 {
        ok[mid]
    } else {
        (ok[mid - 1] + ok[mid]) / 2.0
    })
}

/// The benchmark's result.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// pvmm's runs (empty when not measured).
    pub pvmm: VmmTimes,
    /// QEMU's runs.
    pub qemu: VmmTimes,
    /// The whole L1 run.
    pub outcome: RigOutcome,
}

impl BenchReport {
    /// QEMU's median over pvmm's: how many times faster pvmm reaches guest init.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.qemu.median()? / self.pvmm.median()?)
    }

    /// A Markdown table of the results.
    pub fn table(&self, options: &BenchOptions) -> String {
        let fmt = |v: Option<f64>| v.map_or("failed".to_string(), |s| format!("{s:.2}"));
        let row = |name: &str, t: &VmmTimes| {
            let runs: Vec<String> = t.boot_seconds.iter().map(|s| fmt(*s)).collect();
            let kernel: Vec<String> = t.guest_uptime.iter().map(|s| fmt(*s)).collect();
            format!(
                "| {name} | {} | {} | {} | {} |\n",
                runs.join(", "),
                fmt(t.median()),
                kernel.join(", "),
                fmt(t.median_guest_uptime())
            )
        };
        let mut out = format!(
            "Boot to guest init, {} vCPUs, {} MiB, L1 topology {}, {} runs each, guest console {} (seconds, L1 clock)\n\n| VMM | VMM start to guest init | median | guest uptime at init | median |\n|---|---|---|---|---|\n",
            options.vcpus,
            options.memory_mib,
            options.topology,
            options.runs,
            if options.quiet { "quiet" } else { "full boot log" }
        );
        if options.with_pvmm {
            out.push_str(&row("pvmm", &self.pvmm));
        }
        out.push_str(&row("qemu -enable-kvm", &self.qemu));
        match self.ratio() {
            Some(ratio) => out.push_str(&format!(
                "\nratio qemu/pvmm: {ratio:.2} (above 1: pvmm is faster)\n"
            )),
            None if options.with_pvmm => {
                out.push_str("\nratio qemu/pvmm: n/a (a VMM never reached guest init)\n")
            }
            None => out.push_str("\nratio: n/a (pvmm not measured)\n"),
        }
        out
    }
}

/// Runs the benchmark in one L1 boot. Run order alternates (pvmm first in odd runs, QEMU first
/// in even ones) so neither VMM always runs on a warmer L1.
pub fn run_bench(
    ws: &Workspace,
    images: &L1Images,
    options: &BenchOptions,
) -> Result<BenchReport, RigError> {
    let args = vec![
        "--vcpus".to_string(),
        options.vcpus.to_string(),
        "--memory".to_string(),
        options.memory_mib.to_string(),
    ];
    let command = |vmm| -> Result<String, RigError> {
        let cmdline = guest_cmdline(vmm, Some("nproc"), options.quiet)?;
        Ok(shell_join(&inner_vmm_command(vmm, &args, &cmdline)?))
    };
    let pvmm = command(InnerVmm::Pvmm)?;
    let qemu = command(InnerVmm::Qemu)?;
    let mut script = String::new();
    for run in 1..=options.runs {
        let mut order = vec![("qemu", &qemu)];
        if options.with_pvmm {
            if run % 2 == 1 {
                order.insert(0, ("pvmm", &pvmm));
            } else {
                order.push(("pvmm", &pvmm));
            }
        }
        for (name, command) in order {
            script.push_str(&format!(
                "rig_run {name}-{run} {PER_RUN_LIMIT_SECS} {command}\n"
            ));
        }
    }
    let vmm_count = if options.with_pvmm { 2 } else { 1 };
    // L1 boot plus every run at its limit: the hard timeout only catches a hung L1.
    let timeout =
        Duration::from_secs(120 + PER_RUN_LIMIT_SECS * u64::from(options.runs) * vmm_count);
    let job = L1Job {
        script,
        probe: None,
        guest_memory_mib: options.memory_mib,
    };
    let l1 = L1Options {
        topology: options.topology,
        timeout,
        echo: options.echo,
        tuning: crate::tuning::L1Tuning::default(),
        vmm_name: "vmm",
        vm_names: Vec::new(),
    };
    let outcome = run_l1(ws, images, &l1, &job)?;
    let collect = |name: &str| {
        let mut times = VmmTimes::default();
        for run in 1..=options.runs {
            let label = format!("{name}-{run}");
            times
                .boot_seconds
                .push(outcome.boot_to_init_seconds(&label));
            times.guest_uptime.push(
                outcome
                    .events_of("guest-uptime")
                    .find(|e| e.label == label)
                    .and_then(|e| e.value.trim().parse().ok()),
            );
            times.exit_status.push(
                outcome
                    .events_of("vmm-exit")
                    .find(|e| e.label == label)
                    .and_then(|e| e.value.trim().parse().ok()),
            );
        }
        times
    };
    let pvmm_times = if options.with_pvmm {
        collect("pvmm")
    } else {
        VmmTimes::default()
    };
    Ok(BenchReport {
        pvmm: pvmm_times,
        qemu: collect("qemu"),
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_skips_failed_runs() {
        let times = VmmTimes {
            boot_seconds: vec![Some(3.0), None, Some(1.0), Some(2.0)],
            guest_uptime: vec![],
            exit_status: vec![],
        };
        assert_eq!(times.median(), Some(2.0));
        let even = VmmTimes {
            boot_seconds: vec![Some(1.0), Some(2.0)],
            guest_uptime: vec![Some(0.5)],
            exit_status: vec![],
        };
        assert_eq!(even.median(), Some(1.5));
        assert_eq!(even.median_guest_uptime(), Some(0.5));
        assert_eq!(VmmTimes::default().median(), None);
    }
}
