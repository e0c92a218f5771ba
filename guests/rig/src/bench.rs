//! The boot-time benchmark: time from starting the inner VMM to the guest's init marker, for
//! pvmm and for `qemu-system-x86_64 -enable-kvm`, each on the bzImage and on the same kernel
//! uncompressed (an ELF vmlinux entered through PVH: pvmm's own PVH boot, QEMU's `-kernel
//! vmlinux` with its PVH option ROM), all in ONE L1 boot with the same initramfs, vCPUs and
//! memory, so every contender sees the same noisy machine. It runs on the benchmark runner
//! ([`crate::runner`]): each round boots every contender once, the order turned by one place
//! from round to round so that none always runs on a warmer L1, and where L1 fails by itself
//! only the boots it cut off run again. Reported as medians and ratios (above 1: pvmm boots
//! faster). Not a test: no thresholds.

use std::time::Duration;

use crate::figures::{median, table};
use crate::guest_kernel::GuestKernel;
use crate::images::L1Images;
use crate::rig::{
    guest_cmdline, inner_vmm_command, run_l1, InnerVmm, KernelForm, L1Job, L1Options, RigError,
    RigOutcome, Topology,
};
use crate::runner::{Benchmark, Boots, Measured, Run};
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
    /// Rounds: boots per contender.
    pub rounds: u32,
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

/// One boot of one contender.
#[derive(Debug, Clone, PartialEq)]
pub struct BootFigures {
    /// Seconds from starting the VMM to the guest's init (L1's clock).
    pub boot_s: f64,
    /// The guest kernel's uptime at its init.
    pub guest_uptime: Option<f64>,
    /// The VMM's exit status, if reported.
    pub exit_status: Option<i32>,
}

/// Every contender's boots from the runner's results, round by round (a boot that never
/// reached init as None).
pub fn times_of(options: &BenchOptions, results: &[Measured<BootFigures>]) -> Vec<VmmTimes> {
    options
        .contenders()
        .into_iter()
        .enumerate()
        .map(|(case, (vmm, kernel))| {
            let mut mine: Vec<&Measured<BootFigures>> =
                results.iter().filter(|m| m.run.case == case).collect();
            mine.sort_by_key(|m| m.run.round);
            let figures: Vec<Option<&BootFigures>> =
                mine.iter().map(|m| m.figures.as_ref().ok()).collect();
            VmmTimes {
                vmm,
                kernel,
                boot_seconds: figures.iter().map(|f| f.map(|f| f.boot_s)).collect(),
                guest_uptime: figures.iter().map(|f| (*f)?.guest_uptime).collect(),
                exit_status: figures.iter().map(|f| (*f)?.exit_status).collect(),
            }
        })
        .collect()
}

/// The table of `times`, then the ratios.
pub fn format_table(options: &BenchOptions, times: &[VmmTimes]) -> String {
    let fmt = |v: Option<f64>| v.map_or("failed".to_string(), |s| format!("{s:.2}"));
    let mut out = format!(
        "Boot to guest init, {} vCPUs, {} MiB, L1 topology {}, {} round(s), guest console {} (seconds, L1 clock)\n\n",
        options.vcpus,
        options.memory_mib,
        options.topology,
        options.rounds,
        if options.quiet { "quiet" } else { "full boot log" }
    );
    let headers = [
        "VMM",
        "kernel",
        "VMM start to guest init",
        "median",
        "guest uptime at init",
        "median",
    ];
    let rows: Vec<[String; 6]> = times
        .iter()
        .map(|t| {
            let runs: Vec<String> = t.boot_seconds.iter().map(|s| fmt(*s)).collect();
            let kernel: Vec<String> = t.guest_uptime.iter().map(|s| fmt(*s)).collect();
            [
                t.vmm.name().to_string(),
                t.kernel.name().to_string(),
                runs.join(", "),
                fmt(t.median()),
                kernel.join(", "),
                fmt(t.median_guest_uptime()),
            ]
        })
        .collect();
    out.push_str(&table(headers, &rows));
    out.push('\n');
    let pairs = [
        (KernelForm::BzImage, KernelForm::BzImage),
        (KernelForm::Pvh, KernelForm::Pvh),
        (KernelForm::BzImage, KernelForm::Pvh),
    ];
    for (q, p) in pairs {
        let measured = [(InnerVmm::Qemu, q), (InnerVmm::Pvmm, p)]
            .iter()
            .all(|&(v, k)| find(times, v, k).is_some());
        if !measured {
            continue;
        }
        let ratio = ratio(times, q, p)
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

/// The benchmark on the runner ([`crate::runner::run`]): its cases the contenders, every boot
/// of every round in one L1 boot.
pub struct BootBench<'a> {
    ws: &'a Workspace,
    images: &'a L1Images,
    options: BenchOptions,
    contenders: Vec<(InnerVmm, KernelForm)>,
}

impl<'a> BootBench<'a> {
    /// The benchmark of `options` on these images (which must hold the forms it boots).
    pub fn new(
        ws: &'a Workspace,
        images: &'a L1Images,
        options: BenchOptions,
    ) -> Result<Self, RigError> {
        if options.kernels.contains(&KernelForm::Pvh) && images.vmlinux.is_none() {
            return Err(RigError::BadArgs(
                "the L1 images were built without the vmlinux layer".into(),
            ));
        }
        Ok(BootBench {
            ws,
            images,
            contenders: options.contenders(),
            options,
        })
    }
}

impl Benchmark for BootBench<'_> {
    type Figures = BootFigures;

    fn name(&self) -> &str {
        "bench-boot"
    }

    fn sections(&self) -> Vec<usize> {
        vec![self.contenders.len()]
    }

    fn rounds(&self) -> u32 {
        self.options.rounds
    }

    fn boots(&self) -> Boots {
        Boots::Shared
    }

    fn label(&self, case: usize, round: u32) -> String {
        let (vmm, kernel) = self.contenders[case];
        format!("{}-{}", stem(vmm, kernel), round + 1)
    }

    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError> {
        let o = &self.options;
        let args = [
            "--vcpus".to_string(),
            o.vcpus.to_string(),
            "--memory".to_string(),
            o.memory_mib.to_string(),
        ];
        let mut script = String::new();
        for run in runs {
            let (vmm, kernel) = self.contenders[run.case];
            let cmdline = guest_cmdline(vmm, o.guest_kernel, Some("nproc"), o.quiet)?;
            let words = inner_vmm_command(vmm, o.guest_kernel, kernel, &args, &cmdline)?;
            script.push_str(&format!(
                "rig_run {} {PER_RUN_LIMIT_SECS} {}\n",
                run.label,
                shell_join(&words)
            ));
        }
        // L1 boot plus every run at its limit: the hard timeout only catches a hung L1.
        let timeout = Duration::from_secs(L1_BOOT_SECS + PER_RUN_LIMIT_SECS * runs.len() as u64);
        let job = L1Job {
            script,
            probe: None,
            guest_memory_mib: o.memory_mib,
            guest_kernel: o.guest_kernel,
        };
        let l1 = L1Options {
            topology: o.topology,
            timeout,
            echo: o.echo,
            progress: !o.echo,
            tuning: crate::tuning::L1Tuning::default(),
            vmm_name: "vmm",
            vm_names: Vec::new(),
        };
        run_l1(self.ws, self.images, &l1, &job)
    }

    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<BootFigures, String> {
        let event = |kind: &str| {
            outcome
                .events_of(kind)
                .find(|e| e.label == run.label)
                .map(|e| e.value.trim().to_string())
        };
        let exit_status = event("vmm-exit").and_then(|v| v.parse().ok());
        let boot_s = outcome.boot_to_init_seconds(&run.label).ok_or_else(|| {
            format!("the guest never reached init (VMM exit status {exit_status:?})")
        })?;
        Ok(BootFigures {
            boot_s,
            guest_uptime: event("guest-uptime").and_then(|v| v.parse().ok()),
            exit_status,
        })
    }

    fn summary(&self, f: &BootFigures) -> String {
        let uptime = f
            .guest_uptime
            .map_or("-".to_string(), |u| format!("{u:.2} s"));
        format!(
            "guest init after {:.2} s, guest uptime at init {uptime}",
            f.boot_s
        )
    }

    fn tables(&self, results: &[Measured<BootFigures>]) -> String {
        format_table(&self.options, &times_of(&self.options, results))
    }
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
            rounds: 5,
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
        let options = BenchOptions {
            vcpus: 4,
            memory_mib: 512,
            rounds: 1,
            topology: Topology::default(),
            with_pvmm: true,
            kernels: vec![BzImage, Pvh],
            echo: false,
            quiet: true,
            guest_kernel: GuestKernel::default(),
        };
        let table = format_table(&options, &all);
        let row: Vec<&str> = table
            .lines()
            .find(|l| l.starts_with("qemu-kvm") && l.contains("pvh"))
            .expect("QEMU's PVH row")
            .split_whitespace()
            .collect();
        assert_eq!(row, ["qemu-kvm", "pvh", "failed", "failed", "0.50", "0.50"]);
        assert!(
            table.contains("ratio qemu bzImage / pvmm pvh: 3.00\n"),
            "{table}"
        );
        assert!(table.contains("ratio qemu pvh / pvmm pvh: n/a"), "{table}");
    }

    #[test]
    fn each_contenders_boots_come_in_round_order_with_failures_in_place() {
        let options = BenchOptions {
            vcpus: 4,
            memory_mib: 512,
            rounds: 2,
            topology: Topology::default(),
            with_pvmm: true,
            kernels: vec![KernelForm::BzImage],
            echo: false,
            quiet: true,
            guest_kernel: GuestKernel::default(),
        };
        let result = |case, round, figures| Measured {
            run: Run {
                case,
                round,
                label: String::new(),
            },
            figures,
        };
        let boot = |boot_s| BootFigures {
            boot_s,
            guest_uptime: Some(1.0),
            exit_status: Some(0),
        };
        let results = [
            result(0, 0, Ok(boot(3.0))),
            result(1, 0, Ok(boot(5.0))),
            result(0, 1, Err("never reached init".into())),
            result(1, 1, Ok(boot(6.0))),
        ];
        let times = times_of(&options, &results);
        assert_eq!(times[0].boot_seconds, [Some(3.0), None]);
        assert_eq!(times[0].exit_status, [Some(0), None]);
        assert_eq!(times[1].median(), Some(5.5));
    }
}
