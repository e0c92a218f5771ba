//! The I/O benchmark (`cargo xtask bench-io`): pvmm's virtio devices against QEMU's, the same
//! guest kernel, root disk, scratch disk and tap network under each, in ONE L1 boot with the
//! VMs run in turn (pvmm and QEMU alternating, the first of each round swapped from round to
//! round: the benchmark runner's turned order, [`crate::runner`]), so every contender sees the
//! same noisy machine; where L1 fails by itself, only the VMs it cut off run again. Both run their devices with KVM in
//! L1: pvmm its virtio-mmio devices on their own threads, QEMU its virtio-pci devices
//! (`-drive`, `-netdev tap`) with its defaults.
//!
//! Measured in the guest ([`crate::scripts::IO_BENCH_GUEST`]) on the scratch disk: sequential
//! write and read with O_DIRECT, and random 4 KiB reads at queue depth 1 (pvmm-load
//! `--random-reads`); over TCP (busybox nc), guest to L1 timed in the guest and L1 to guest
//! timed in L1. Reported as medians over the rounds and pvmm/QEMU ratios (above 1: pvmm is
//! faster). Not a test: no thresholds.

use std::time::Duration;

use crate::figures::{median, table};
use crate::images::L1Images;
use crate::rig::{tap_network, InnerVmm, Rig, RigError, RigOutcome, Topology, VmSpec};
use crate::runner::{Benchmark, Boots, Measured, Run};
use crate::scripts::{assemble, guest_command, IO_BENCH_GUEST, IO_BENCH_PROBE, IO_BENCH_SETUP};
use crate::workspace::Workspace;

/// The scratch disk in L1 (in L1's RAM, as the root disks are).
const SCRATCH_IMAGE: &str = "/tmp/io-bench.img";

/// Rig limit per VM: a boot (10-30 s), the disk steps and 2 x 64 MiB through the nested
/// network take a few minutes on a loaded machine; the rest is headroom.
const PER_VM_LIMIT: Duration = Duration::from_secs(300);

/// What to benchmark.
#[derive(Debug, Clone)]
pub struct IoBenchOptions {
    /// Guest vCPUs, for both VMMs.
    pub vcpus: u32,
    /// Guest memory in MiB, for both VMMs.
    pub memory_mib: u64,
    /// Size of the sequential transfers and of the scratch disk, in MiB.
    pub disk_mib: u64,
    /// Seconds of random reads.
    pub random_secs: u32,
    /// MiB sent over TCP each way.
    pub net_mib: u64,
    /// Rounds (one pvmm and one QEMU VM each).
    pub rounds: u32,
    /// L1 topology.
    pub topology: Topology,
    /// Print the rig's lines as they arrive.
    pub echo: bool,
}

/// The figures, in report order: name, unit.
pub const FIGURES: [(&str, &str); 5] = [
    ("sequential write, O_DIRECT", "MiB/s"),
    ("sequential read, O_DIRECT", "MiB/s"),
    ("4 KiB random reads, queue depth 1", "IOPS"),
    ("TCP guest to L1", "MiB/s"),
    ("TCP L1 to guest", "MiB/s"),
];

/// One VM's figures (in [`FIGURES`] order), None where its step failed.
pub type Figures = [Option<f64>; FIGURES.len()];

/// The outcome: each VMM's figures per round.
#[derive(Debug, Clone, Default)]
pub struct IoBenchReport {
    /// pvmm's figures, one entry per round.
    pub pvmm: Vec<Figures>,
    /// QEMU's.
    pub qemu: Vec<Figures>,
}

/// The contenders, the first round's order: the runner turns it from round to round.
const VMMS: [InnerVmm; 2] = [InnerVmm::Pvmm, InnerVmm::Qemu];

/// The rig that runs `runs` in turn, VM `i` of this boot on tap network `i`.
fn rig(options: &IoBenchOptions, runs: &[Run]) -> Rig {
    let vms: Vec<VmSpec> = runs
        .iter()
        .enumerate()
        .map(|(index, run)| VmSpec {
            vmm: VMMS[run.case],
            args: [
                "--vcpus",
                &options.vcpus.to_string(),
                "--memory",
                &options.memory_mib.to_string(),
                "--disk",
                SCRATCH_IMAGE,
            ]
            .map(String::from)
            .to_vec(),
            guest_command: Some(guest_command(
                &[
                    ("MIB", &options.disk_mib.to_string()),
                    ("SECS", &options.random_secs.to_string()),
                    ("BYTES", &(options.net_mib << 20).to_string()),
                    ("GW", &tap_network(index).l1),
                ],
                &[IO_BENCH_GUEST],
            )),
        })
        .collect();
    let count = u32::try_from(vms.len()).unwrap_or(u32::MAX);
    Rig::with_vms(vms)
        .run_labels(runs.iter().map(|run| run.label.clone()).collect())
        .in_turn(true)
        .root_disk(true)
        .tap(true)
        .quiet(true)
        .l1_setup(assemble(
            &[
                ("IMAGE", SCRATCH_IMAGE),
                ("MIB", &options.disk_mib.to_string()),
            ],
            &[IO_BENCH_SETUP],
        ))
        .l1_probe(assemble(
            &[("BYTES", &(options.net_mib << 20).to_string())],
            &[IO_BENCH_PROBE],
        ))
        .l1_extra_memory(options.disk_mib)
        .topology(options.topology)
        .timeout(PER_VM_LIMIT * count)
        .echo(options.echo)
}

/// The benchmark on the runner ([`crate::runner::run`]): its cases pvmm and QEMU, every VM of
/// every round in one L1 boot.
pub struct IoBench<'a> {
    ws: &'a Workspace,
    images: &'a L1Images,
    options: IoBenchOptions,
}

impl<'a> IoBench<'a> {
    /// The benchmark of `options` on these images.
    pub fn new(ws: &'a Workspace, images: &'a L1Images, options: IoBenchOptions) -> Self {
        IoBench {
            ws,
            images,
            options,
        }
    }

    /// Its options.
    pub fn options(&self) -> &IoBenchOptions {
        &self.options
    }
}

impl Benchmark for IoBench<'_> {
    type Figures = Figures;

    fn name(&self) -> &str {
        "bench-io"
    }

    fn sections(&self) -> Vec<usize> {
        vec![VMMS.len()]
    }

    fn rounds(&self) -> u32 {
        self.options.rounds
    }

    fn boots(&self) -> Boots {
        Boots::Shared
    }

    fn label(&self, case: usize, round: u32) -> String {
        format!("{}-{}", VMMS[case].name(), round + 1)
    }

    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError> {
        rig(&self.options, runs).run(self.ws, self.images)
    }

    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<Figures, String> {
        figures(outcome, &run.label, &self.options).ok_or_else(|| "the VM never started".into())
    }

    fn summary(&self, figures: &Figures) -> String {
        FIGURES
            .iter()
            .zip(figures)
            .map(|((name, unit), value)| {
                let value = value.map_or("failed".to_string(), |v| format!("{v:.1}"));
                format!("{name} {value} {unit}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn tables(&self, results: &[Measured<Figures>]) -> String {
        IoBenchReport::of(results).table(&self.options)
    }
}

/// Seconds between the two uptimes of an `IO STEP BEFORE AFTER` line's `rest`.
fn span(rest: &str) -> Option<f64> {
    let mut words = rest.split_whitespace();
    let before: f64 = words.next()?.parse().ok()?;
    let after: f64 = words.next()?.parse().ok()?;
    Some(after - before).filter(|s| *s > 0.0)
}

/// The rest of the `IO STEP ...` line of `lines`.
fn step<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    let prefix = format!("IO {name} ");
    lines.iter().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// The figures of the VM labelled `label` in `outcome`; None when it never started.
pub fn figures(outcome: &RigOutcome, label: &str, options: &IoBenchOptions) -> Option<Figures> {
    let run = outcome.run(label)?;
    let failed = |name: &str| {
        run.guest
            .iter()
            .chain(run.probe)
            .any(|l| l == &format!("IO error {name}"))
    };
    let rate = |lines: &[String], name: &str, mib: u64| {
        let seconds = step(lines, name).and_then(span)?;
        (!failed(name)).then(|| mib as f64 / seconds)
    };
    let iops = step(run.guest, "random-reads").and_then(|rest| {
        let mut words = rest.split_whitespace();
        let reads: f64 = words.next()?.parse().ok()?;
        let seconds: f64 = words.nth(1)?.parse().ok()?;
        Some(reads / seconds)
    });
    Some([
        rate(run.guest, "seq-write", options.disk_mib),
        rate(run.guest, "seq-read", options.disk_mib),
        iops,
        rate(run.guest, "net-tx", options.net_mib),
        rate(run.probe, "net-rx", options.net_mib),
    ])
}

impl IoBenchReport {
    /// Each VMM's figures from the runner's results, round by round (a VM that never started
    /// as all figures failed).
    pub fn of(results: &[Measured<Figures>]) -> IoBenchReport {
        let mut sorted: Vec<&Measured<Figures>> = results.iter().collect();
        sorted.sort_by_key(|m| m.run.round);
        let mut report = IoBenchReport::default();
        for m in sorted {
            let figures = m.figures.clone().unwrap_or([None; FIGURES.len()]);
            match VMMS[m.run.case] {
                InnerVmm::Pvmm => report.pvmm.push(figures),
                InnerVmm::Qemu => report.qemu.push(figures),
            }
        }
        report
    }

    /// The median of figure `index` over `rounds`.
    fn median(rounds: &[Figures], index: usize) -> Option<f64> {
        median(rounds.iter().map(|f| f[index]))
    }

    /// pvmm's median over QEMU's for figure `index` (above 1: pvmm is faster).
    pub fn ratio(&self, index: usize) -> Option<f64> {
        let (pvmm, qemu) = (
            Self::median(&self.pvmm, index)?,
            Self::median(&self.qemu, index)?,
        );
        (qemu > 0.0).then(|| pvmm / qemu)
    }

    /// Whether every figure was measured for both VMMs in every round.
    pub fn all_measured(&self) -> bool {
        self.pvmm
            .iter()
            .chain(&self.qemu)
            .all(|f| f.iter().all(Option::is_some))
    }

    /// The table of medians and ratios, under a title line.
    pub fn table(&self, options: &IoBenchOptions) -> String {
        let show = |v: Option<f64>, digits: usize| {
            v.map_or("failed".to_string(), |v| format!("{v:.digits$}"))
        };
        let title = format!(
            "{} MiB disk transfers, {} s of random reads, {} MiB each way, medians of {} round(s):\n",
            options.disk_mib, options.random_secs, options.net_mib, options.rounds
        );
        let rows: Vec<[String; 4]> = FIGURES
            .iter()
            .enumerate()
            .map(|(index, (name, unit))| {
                [
                    format!("{name} ({unit})"),
                    show(Self::median(&self.pvmm, index), 1),
                    show(Self::median(&self.qemu, index), 1),
                    show(self.ratio(index), 2),
                ]
            })
            .collect();
        title + &table(["figure", "pvmm", "QEMU", "pvmm/QEMU"], &rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> IoBenchOptions {
        IoBenchOptions {
            vcpus: 2,
            memory_mib: 256,
            disk_mib: 256,
            random_secs: 10,
            net_mib: 64,
            rounds: 2,
            topology: Topology::default(),
            echo: false,
        }
    }

    #[test]
    fn rounds_alternate_and_every_vm_gets_the_same_disks_and_its_own_tap() {
        let order = crate::runner::plan(&[VMMS.len()], 2);
        let vmms: Vec<InnerVmm> = order.iter().map(|&(case, _)| VMMS[case]).collect();
        assert_eq!(
            vmms,
            [
                InnerVmm::Pvmm,
                InnerVmm::Qemu,
                InnerVmm::Qemu,
                InnerVmm::Pvmm
            ]
        );
        let runs: Vec<Run> = order
            .iter()
            .map(|&(case, round)| Run {
                case,
                round,
                label: format!("{}-{}", VMMS[case].name(), round + 1),
            })
            .collect();
        let all = rig(&options(), &runs);
        assert_eq!(
            all.labels(),
            ["pvmm-1", "qemu-kvm-1", "qemu-kvm-2", "pvmm-2"]
        );
        // A boot for the VMs a failed L1 left keeps their labels, the taps counted afresh.
        let again = rig(&options(), &runs[2..]);
        assert_eq!(again.labels(), ["qemu-kvm-2", "pvmm-2"]);
    }

    #[test]
    fn figures_are_rates_over_the_timed_spans_and_ratios_of_medians() {
        let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let guest = lines(&[
            "IO seq-write 10.0 12.0",
            "IO seq-read 12.0 13.0",
            "IO random-reads 5000 seconds 10",
            "IO net-tx 20.0 24.0",
        ]);
        assert_eq!(step(&guest, "seq-read").and_then(span), Some(1.0));
        assert_eq!(span("5.0 5.0"), None, "a zero span is no measurement");
        let pvmm: Figures = [
            Some(128.0),
            Some(256.0),
            Some(500.0),
            Some(16.0),
            Some(32.0),
        ];
        let qemu: Figures = [Some(64.0), Some(256.0), Some(1000.0), Some(16.0), None];
        let report = IoBenchReport {
            pvmm: vec![pvmm],
            qemu: vec![qemu],
        };
        assert_eq!(report.ratio(0), Some(2.0));
        assert_eq!(report.ratio(2), Some(0.5));
        assert_eq!(report.ratio(4), None);
        assert!(!report.all_measured());
        let table = report.table(&options());
        let row = |name: &str| {
            let line = table
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no row {name}: {table}"));
            line.split_whitespace().rev().take(3).collect::<Vec<_>>()
        };
        assert_eq!(
            row("sequential write, O_DIRECT (MiB/s)"),
            ["2.00", "64.0", "128.0"]
        );
        assert_eq!(row("TCP L1 to guest (MiB/s)"), ["failed", "failed", "32.0"]);
        assert!(table.starts_with("256 MiB disk transfers,"), "{table}");
    }
}
