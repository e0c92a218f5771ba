//! The boot-time benchmark: time from starting the inner VMM to the guest's init marker, for
//! pvmm and for `qemu-system-x86_64 -enable-kvm`, each on the bzImage and on the same kernel
//! uncompressed (an ELF vmlinux entered through PVH: pvmm's own PVH boot, QEMU's `-kernel
//! vmlinux` with its PVH option ROM), all in ONE L1 boot with the same initramfs, vCPUs and
//! memory, so every contender sees the same noisy machine. Run order rotates from run to run
//! so that none always runs on a warmer L1. Reported as medians and ratios (above 1: pvmm
//! boots faster). Not a test: no thresholds.

use std::time::Duration;

use crate::figures::median;
use crate::guest_kernel::GuestKernel;
use crate::images::L1Images;
use crate::rig::{
    guest_cmdline, inner_vmm_command, run_l1, InnerVmm, KernelForm, L1Job, L1Options, RigError,
    RigOutcome, Topology,
};
use crate::scripts::shell_join;
use crate::sequence::L1_BOOT_SECS;
use crate::workspace::Workspace;

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
    /// Boots per contender.
    pub runs: u32,
    /// L1 topology.
    pub topology: Topology,
    /// Measure pvmm too (false: QEMU only).
    pub with_pvmm: bool,
    /// The kernel forms to boot (each by every VMM measured); the L1 images must hold them.
    pub kernels: Vec<KernelForm>,
    /// Print the rig's lines as they arrive.
    pub echo: bool,
    /// Add `quiet` to the guest command line (see [`crate::rig::guest_cmdline`]).
    pub quiet: bool,
    /// The kernel every contender boots (the L1 images must hold it in each form).
    pub guest_kernel: GuestKernel,
}

impl BenchOptions {
    /// The contenders, in the first run's order.
    fn contenders(&self) -> Vec<(InnerVmm, KernelForm)> {
        let mut vmms = vec![InnerVmm::Qemu];
        if self.with_pvmm {
            vmms.insert(0, InnerVmm::Pvmm);
        }
        self.kernels
            .iter()
            .flat_map(|&k| vmms.iter().map(move |&v| (v, k)))
            .collect()
    }
}

/// A contender's label stem in L1 (`pvmm-pvh`).
fn stem(vmm: InnerVmm, kernel: KernelForm) -> String {
    format!("{}-{}", vmm.name(), kernel.name())
}

/// One contender's measurements.
#[derive(Debug, Clone)]
pub struct VmmTimes {
    /// The VMM.
    pub vmm: InnerVmm,
    /// The kernel form it booted.
    pub kernel: KernelForm,
    /// Boot-to-init seconds per run, from starting the VMM in L1 (None: the guest never
    /// reached init).
    pub boot_seconds: Vec<Option<f64>>,
    /// The guest kernel's own uptime when its init started, per run: the kernel's part of the
    /// boot; the rest of `boot_seconds` is the VMM's setup (and firmware, for QEMU), and the
    /// bzImage's decompression, which runs before the kernel's clock starts.
    pub guest_uptime: Vec<Option<f64>>,
    /// Exit status per run (None: not reported).
    pub exit_status: Vec<Option<i32>>,
}

impl VmmTimes {
    /// Median boot-to-init of the runs that reached init, if any did.
    pub fn median(&self) -> Option<f64> {
        median(self.boot_seconds.iter().copied())
    }

    /// Median of the guest kernel's uptime at init.
    pub fn median_guest_uptime(&self) -> Option<f64> {
        median(self.guest_uptime.iter().copied())
    }
}

/// The contender `vmm` on `kernel` among `times`.
fn find(times: &[VmmTimes], vmm: InnerVmm, kernel: KernelForm) -> Option<&VmmTimes> {
    times.iter().find(|t| t.vmm == vmm && t.kernel == kernel)
}

/// See [`BenchReport::ratio`].
fn ratio(times: &[VmmTimes], qemu_kernel: KernelForm, pvmm_kernel: KernelForm) -> Option<f64> {
    let qemu = find(times, InnerVmm::Qemu, qemu_kernel)?.median()?;
    Some(qemu / find(times, InnerVmm::Pvmm, pvmm_kernel)?.median()?)
}

/// The benchmark's result.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Every contender's runs, in the first run's order.
    pub times: Vec<VmmTimes>,
    /// The whole L1 run.
    pub outcome: RigOutcome,
}

impl BenchReport {
    /// The contender `vmm` on `kernel`, if measured.
    pub fn get(&self, vmm: InnerVmm, kernel: KernelForm) -> Option<&VmmTimes> {
        find(&self.times, vmm, kernel)
    }

    /// QEMU's median on `qemu_kernel` over pvmm's on `pvmm_kernel`: how many times faster
    /// pvmm reaches guest init.
    pub fn ratio(&self, qemu_kernel: KernelForm, pvmm_kernel: KernelForm) -> Option<f64> {
        ratio(&self.times, qemu_kernel, pvmm_kernel)
    }

    /// Whether every contender reached guest init in at least one run.
    pub fn all_measured(&self) -> bool {
        self.times.iter().all(|t| t.median().is_some())
    }

    /// A Markdown table of the results, then the ratios.
    pub fn table(&self, options: &BenchOptions) -> String {
        let fmt = |v: Option<f64>| v.map_or("failed".to_string(), |s| format!("{s:.2}"));
        let mut out = format!(
            "Boot to guest init, {} vCPUs, {} MiB, L1 topology {}, {} runs each, guest console {} (seconds, L1 clock)\n\n| VMM | kernel | VMM start to guest init | median | guest uptime at init | median |\n|---|---|---|---|---|---|\n",
            options.vcpus,
            options.memory_mib,
            options.topology,
            options.runs,
            if options.quiet { "quiet" } else { "full boot log" }
        );
        for t in &self.times {
            let runs: Vec<String> = t.boot_seconds.iter().map(|s| fmt(*s)).collect();
            let kernel: Vec<String> = t.guest_uptime.iter().map(|s| fmt(*s)).collect();
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                t.vmm.name(),
                t.kernel.name(),
                runs.join(", "),
                fmt(t.median()),
                kernel.join(", "),
                fmt(t.median_guest_uptime())
            ));
        }
        out.push('\n');
        let pairs = [
            (KernelForm::BzImage, KernelForm::BzImage),
            (KernelForm::Pvh, KernelForm::Pvh),
            (KernelForm::BzImage, KernelForm::Pvh),
        ];
        for (q, p) in pairs {
            let measured = [(InnerVmm::Qemu, q), (InnerVmm::Pvmm, p)]
                .iter()
                .all(|&(v, k)| self.get(v, k).is_some());
            if !measured {
                continue;
            }
            let ratio = self
                .ratio(q, p)
                .map_or("n/a (a contender never reached guest init)".into(), |r| {
                    format!("{r:.2}")
                });
            out.push_str(&format!(
                "ratio qemu {} / pvmm {}: {ratio}\n",
                q.name(),
                p.name()
            ));
        }
        out.push_str("(above 1: pvmm reaches guest init faster)\n");
        out
    }
}

/// Runs the benchmark in one L1 boot. Run `r` starts at contender `r - 1` (in the order of
/// `BenchOptions::contenders`) and goes round, so that each takes each place in turn.
pub fn run_bench(
    ws: &Workspace,
    images: &L1Images,
    options: &BenchOptions,
) -> Result<BenchReport, RigError> {
    if options.kernels.contains(&KernelForm::Pvh) && images.vmlinux.is_none() {
        return Err(RigError::BadArgs(
            "the L1 images were built without the vmlinux layer".into(),
        ));
    }
    let args = vec![
        "--vcpus".to_string(),
        options.vcpus.to_string(),
        "--memory".to_string(),
        options.memory_mib.to_string(),
    ];
    let contenders = options.contenders();
    let mut commands = Vec::new();
    for &(vmm, kernel) in &contenders {
        let cmdline = guest_cmdline(vmm, options.guest_kernel, Some("nproc"), options.quiet)?;
        let words = inner_vmm_command(vmm, options.guest_kernel, kernel, &args, &cmdline)?;
        commands.push((stem(vmm, kernel), shell_join(&words)));
    }
    let mut script = String::new();
    for run in 1..=options.runs as usize {
        for i in 0..commands.len() {
            let (stem, command) = &commands[(run - 1 + i) % commands.len()];
            script.push_str(&format!(
                "rig_run {stem}-{run} {PER_RUN_LIMIT_SECS} {command}\n"
            ));
        }
    }
    // L1 boot plus every run at its limit: the hard timeout only catches a hung L1.
    let timeout = Duration::from_secs(
        L1_BOOT_SECS + PER_RUN_LIMIT_SECS * u64::from(options.runs) * contenders.len() as u64,
    );
    let job = L1Job {
        script,
        probe: None,
        guest_memory_mib: options.memory_mib,
        guest_kernel: options.guest_kernel,
    };
    let l1 = L1Options {
        topology: options.topology,
        timeout,
        echo: options.echo,
        progress: !options.echo,
        tuning: crate::tuning::L1Tuning::default(),
        vmm_name: "vmm",
        vm_names: Vec::new(),
    };
    let outcome = run_l1(ws, images, &l1, &job)?;
    let event = |kind: &str, label: &str| {
        outcome
            .events_of(kind)
            .find(|e| e.label == label)
            .map(|e| e.value.trim().to_string())
    };
    let times = contenders
        .iter()
        .map(|&(vmm, kernel)| {
            let labels: Vec<String> = (1..=options.runs)
                .map(|run| format!("{}-{run}", stem(vmm, kernel)))
                .collect();
            VmmTimes {
                vmm,
                kernel,
                boot_seconds: labels
                    .iter()
                    .map(|l| outcome.boot_to_init_seconds(l))
                    .collect(),
                guest_uptime: labels
                    .iter()
                    .map(|l| event("guest-uptime", l)?.parse().ok())
                    .collect(),
                exit_status: labels
                    .iter()
                    .map(|l| event("vmm-exit", l)?.parse().ok())
                    .collect(),
            }
        })
        .collect();
    Ok(BenchReport { times, outcome })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(vmm: InnerVmm, kernel: KernelForm, boot: &[Option<f64>]) -> VmmTimes {
        VmmTimes {
            vmm,
            kernel,
            boot_seconds: boot.to_vec(),
            guest_uptime: vec![Some(0.5)],
            exit_status: vec![Some(0)],
        }
    }

    #[test]
    fn median_skips_failed_runs() {
        let t = times(
            InnerVmm::Pvmm,
            KernelForm::BzImage,
            &[Some(3.0), None, Some(1.0), Some(2.0)],
        );
        assert_eq!(t.median(), Some(2.0));
        let even = times(InnerVmm::Pvmm, KernelForm::BzImage, &[Some(1.0), Some(2.0)]);
        assert_eq!(even.median(), Some(1.5));
        assert_eq!(even.median_guest_uptime(), Some(0.5));
        assert_eq!(
            times(InnerVmm::Qemu, KernelForm::Pvh, &[None]).median(),
            None
        );
    }

    #[test]
    fn every_vmm_boots_every_kernel_form() {
        let options = BenchOptions {
            vcpus: 4,
            memory_mib: 512,
            runs: 5,
            topology: Topology::default(),
            with_pvmm: true,
            kernels: vec![KernelForm::BzImage, KernelForm::Pvh],
            echo: false,
            quiet: true,
            guest_kernel: GuestKernel::default(),
        };
        let names: Vec<String> = options
            .contenders()
            .into_iter()
            .map(|(v, k)| stem(v, k))
            .collect();
        assert_eq!(
            names,
            [
                "pvmm-bzImage",
                "qemu-kvm-bzImage",
                "pvmm-pvh",
                "qemu-kvm-pvh"
            ]
        );
        let qemu_only = BenchOptions {
            with_pvmm: false,
            kernels: vec![KernelForm::Pvh],
            ..options
        };
        assert_eq!(qemu_only.contenders(), [(InnerVmm::Qemu, KernelForm::Pvh)]);
    }

    #[test]
    fn ratios_compare_qemu_with_pvmm_per_kernel_form_and_across() {
        let all = [
            times(InnerVmm::Pvmm, KernelForm::BzImage, &[Some(4.0)]),
            times(InnerVmm::Qemu, KernelForm::BzImage, &[Some(6.0)]),
            times(InnerVmm::Pvmm, KernelForm::Pvh, &[Some(2.0)]),
            times(InnerVmm::Qemu, KernelForm::Pvh, &[None]),
        ];
        use KernelForm::{BzImage, Pvh};
        assert_eq!(ratio(&all, BzImage, BzImage), Some(1.5));
        assert_eq!(ratio(&all, BzImage, Pvh), Some(3.0));
        assert_eq!(ratio(&all, Pvh, Pvh), None);
    }
}
