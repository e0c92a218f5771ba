//! The I/O benchmark (`cargo xtask bench-io`): pvmm's virtio devices against QEMU's, the same
//! guest kernel, root disk, scratch disk and tap network under each, in ONE L1 boot with the
//! VMs run in turn (pvmm and QEMU alternating, the first of each round swapped from round to
//! round), so every contender sees the same noisy machine. Both run their devices with KVM in
//! L1: pvmm its virtio-mmio devices on their own threads, QEMU its virtio-pci devices
//! (`-drive`, `-netdev tap`) with its defaults.
//!
//! Measured in the guest ([`crate::scripts::IO_BENCH_GUEST`]) on the scratch disk: sequential
//! write and read with O_DIRECT, and random 4 KiB reads at queue depth 1 (pvmm-load
//! `--random-reads`); over TCP (busybox nc), guest to L1 timed in the guest and L1 to guest
//! timed in L1. Reported as medians over the rounds and pvmm/QEMU ratios (above 1: pvmm is
//! faster). Not a test: no thresholds.

use std::time::Duration;

use crate::figures::median;
use crate::images::L1Images;
use crate::retry::{l1_failure_kind, retry_boots};
use crate::rig::{tap_network, InnerVmm, Rig, RigError, RigOutcome, Topology, VmSpec};
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

/// The VMMs of round `round`, in the order they run.
fn round_order(round: u32) -> [InnerVmm; 2] {
    if round.is_multiple_of(2) {
        [InnerVmm::Pvmm, InnerVmm::Qemu]
    } else {
        [InnerVmm::Qemu, InnerVmm::Pvmm]
    }
}

/// The rig that runs every VM of the benchmark in turn.
fn rig(options: &IoBenchOptions) -> Rig {
    let vms: Vec<VmSpec> = (0..options.rounds)
        .flat_map(round_order)
        .enumerate()
        .map(|(index, vmm)| VmSpec {
            vmm,
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

/// The figures of the VM labelled `label` in `outcome`.
pub fn figures(outcome: &RigOutcome, label: &str, options: &IoBenchOptions) -> Figures {
    let Some(run) = outcome.run(label) else {
        return [None; FIGURES.len()];
    };
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
    [
        rate(run.guest, "seq-write", options.disk_mib),
        rate(run.guest, "seq-read", options.disk_mib),
        iops,
        rate(run.guest, "net-tx", options.net_mib),
        rate(run.probe, "net-rx", options.net_mib),
    ]
}

/// Runs the benchmark: one L1 boot, booted again (up to the rig's attempts) when L1 fails by
/// itself.
pub fn run_io_bench(
    ws: &Workspace,
    images: &L1Images,
    options: &IoBenchOptions,
) -> Result<IoBenchReport, RigError> {
    let rig = rig(options);
    let outcome = retry_boots("bench-io", || rig.run(ws, images), l1_failure_kind)?;
    crate::retry::dump_outcome("bench-io", &outcome);
    let mut report = IoBenchReport::default();
    for (label, vmm) in rig
        .labels()
        .iter()
        .zip((0..options.rounds).flat_map(round_order))
    {
        let figures = figures(&outcome, label, options);
        match vmm {
            InnerVmm::Pvmm => report.pvmm.push(figures),
            InnerVmm::Qemu => report.qemu.push(figures),
        }
    }
    Ok(report)
}

impl IoBenchReport {
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

    /// The Markdown table of medians and ratios.
    pub fn table(&self, options: &IoBenchOptions) -> String {
        let show = |v: Option<f64>, digits: usize| {
            v.map_or("failed".to_string(), |v| format!("{v:.digits$}"))
        };
        let mut text = format!(
            "| figure ({} MiB disk transfers, {} s of random reads, {} MiB each way, \
             medians of {} round(s)) | pvmm | QEMU | pvmm/QEMU |\n|---|---|---|---|\n",
            options.disk_mib, options.random_secs, options.net_mib, options.rounds
        );
        for (index, (name, unit)) in FIGURES.iter().enumerate() {
            text.push_str(&format!(
                "| {name} ({unit}) | {} | {} | {} |\n",
                show(Self::median(&self.pvmm, index), 1),
                show(Self::median(&self.qemu, index), 1),
                show(self.ratio(index), 2)
            ));
        }
        text
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
        assert_eq!(round_order(0), [InnerVmm::Pvmm, InnerVmm::Qemu]);
        assert_eq!(round_order(1), [InnerVmm::Qemu, InnerVmm::Pvmm]);
        let rig = rig(&options());
        assert_eq!(rig.labels(), ["0", "1", "2", "3"]);
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
        assert!(table.contains("| sequential write, O_DIRECT (MiB/s) | 128.0 | 64.0 | 2.00 |"));
        assert!(table.contains("| TCP L1 to guest (MiB/s) | 32.0 | failed | failed |"));
    }
}
