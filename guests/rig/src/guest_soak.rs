//! Many real guests one after another in one L1 (`cargo xtask rig-guest-soak`): what one
//! pvmm run leaves behind in the host it ran on would pile up over a server's life, so after
//! each run L1 itself is read, once pvmm has exited: its available and unreclaimable kernel
//! memory, its processes, threads and open file descriptors, the KVM VMs it still holds, and
//! the files in its `/tmp`. Each pvmm serves a control socket and writes `--stats` there, and
//! each guest runs a short busy load, so the scheduler, the API and CPPC all run every time.
//!
//! A leak is a level that, after a warm-up ([`WARM_UP_GUESTS`]), ends above everything it was
//! early on (below, for available memory), by more than its noise (see [`findings`]). A run
//! that fails counts by its kind ([`crate::soak::BootKind`]); the rig's own failures (a guest
//! triple fault, L1's) are reported as such, anything else as a failure of pvmm.

use std::time::Duration;

use pvmm_scheduler::table::{columns, Align};

use crate::images::L1Images;
use crate::rig::{InnerVmm, RigError, RigOutcome, Topology, VmSpec};
use crate::scripts;
use crate::sequence::{run_pvmm_sequence, PvmmRun, SequenceOptions};
use crate::soak::{classify, vm_kind, BootKind};
use crate::tuning::L1Tuning;
use crate::workspace::Workspace;

/// Guests run before the levels count: L1's page cache takes in the kernel, the initramfs and
/// pvmm's binary, and the kernel's per-CPU caches and KVM's module state settle.
pub const WARM_UP_GUESTS: usize = 2;
/// Available memory may fall this much per guest before it counts as a leak (KiB). A guest's
/// memory is 256 MiB and a VM's KVM structures (page tables, memslots) several MiB, so a
/// leaked VM shows as hundreds of MiB at once; the page cache and the kernel's caches move
/// by a few MiB between runs either way.
pub const MEM_DRIFT_KIB_PER_GUEST: u64 = 1024;
/// The same for unreclaimable kernel memory (KiB per guest): a leaked VM's vCPU and MMU
/// structures are tens of KiB to MiB; per-CPU slab caches move by a few hundred KiB.
pub const SLAB_DRIFT_KIB_PER_GUEST: u64 = 256;
/// Where each pvmm serves its control socket and writes `--stats` in L1.
const L1_SOCKET: &str = "/tmp/guest-soak.sock";
const L1_STATS: &str = "/tmp/guest-soak-stats.jsonl";
/// The line the probe prints after each run.
const STATE_TAG: &str = "L1STATE";
/// The probe's line naming the slab caches that grew most since the first run.
const SLAB_TAG: &str = "L1SLAB";
/// The probe's own files in L1 (not counted among `/tmp`'s entries); the rig's per-run
/// directories (`/tmp/rig-run-LABEL`, its console logs) are not counted either.
const PROBE_DIR: &str = "/tmp/soak-probe";
/// Slab caches named per run: enough to say where kernel memory went.
const SLAB_TOP: usize = 3;

/// What a guest soak runs.
#[derive(Debug, Clone)]
pub struct GuestSoakOptions {
    /// Guests, one after another.
    pub guests: u32,
    /// vCPUs of each.
    pub vcpus: u32,
    /// Memory of each (MiB).
    pub memory_mib: u64,
    /// Seconds of busy load each guest runs (two threads) before it powers off.
    pub load_secs: u32,
    /// L1's topology.
    pub topology: Topology,
    /// Hard limit per guest: the L1 boot's limit is this times the guest count.
    pub timeout_per_guest: Duration,
    /// Print every rig line as it arrives.
    pub echo: bool,
}

/// L1's levels after one run, once pvmm has exited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L1State {
    /// `MemAvailable` (KiB).
    pub mem_available_kib: u64,
    /// `SUnreclaim` (KiB).
    pub slab_unreclaim_kib: u64,
    /// Processes.
    pub processes: u64,
    /// Threads (all tasks, `/proc/loadavg`).
    pub threads: u64,
    /// Open file descriptors of all processes (the kernel's own file count, `file-nr`, is a
    /// per-CPU approximation).
    pub open_files: u64,
    /// KVM VMs L1's KVM still holds (its debugfs directories).
    pub kvm_vms: u64,
    /// Entries in L1's `/tmp`.
    pub tmp_entries: u64,
}

impl L1State {
    /// Parses the probe's `L1STATE ...` line.
    fn parse(line: &str) -> Option<L1State> {
        let mut words = line.strip_prefix(STATE_TAG)?.split_whitespace();
        let mut next = || words.next()?.parse::<u64>().ok();
        Some(L1State {
            mem_available_kib: next()?,
            slab_unreclaim_kib: next()?,
            processes: next()?,
            threads: next()?,
            open_files: next()?,
            kvm_vms: next()?,
            tmp_entries: next()?,
        })
    }
}

/// One guest's run.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestRun {
    /// Its label (`guest-N`).
    pub label: String,
    /// How it ended.
    pub kind: BootKind,
    /// pvmm's exit status, if L1 reported it.
    pub status: Option<i32>,
    /// Boot to guest init (s, L1's clock).
    pub boot_seconds: Option<f64>,
    /// L1 after it.
    pub after: Option<L1State>,
    /// The slab caches that grew most since the first run (`name:KiB ...`).
    pub slab_growth: String,
}

/// A whole soak.
#[derive(Debug)]
pub struct GuestSoak {
    /// Every guest, in order (those the L1 boot did not reach are absent).
    pub runs: Vec<GuestRun>,
    /// How the L1 boot ended.
    pub l1_kind: BootKind,
    /// What it printed.
    pub outcome: RigOutcome,
}

/// The L1 probe: once pvmm has exited (and the run's console pipeline with it), prints L1's
/// levels on one line, then the [`SLAB_TOP`] slab caches that grew most since the first run
/// (`name:KiB`, from `/proc/slabinfo`: active objects times object size). debugfs is mounted
/// if it is not, for KVM's per-VM directories.
fn probe() -> String {
    scripts::assemble(
        &[
            ("STATE_TAG", STATE_TAG),
            ("SLAB_TAG", SLAB_TAG),
            ("PROBE_DIR", PROBE_DIR),
            ("SLAB_TOP", &SLAB_TOP.to_string()),
        ],
        &[scripts::GUEST_SOAK_PROBE],
    )
}

/// The runs of a soak.
fn runs(options: &GuestSoakOptions) -> Vec<PvmmRun> {
    let command = format!(
        "pvmm-load --threads 2 --duty 100 --seconds {} > /dev/null\nnproc\n",
        options.load_secs
    );
    (1..=options.guests)
        .map(|n| PvmmRun {
            label: format!("guest-{n}"),
            pvmm_args: [
                "--vcpus",
                &options.vcpus.to_string(),
                "--memory",
                &options.memory_mib.to_string(),
                "--policy",
                "powersaving",
                "--api-socket",
                L1_SOCKET,
                "--stats",
                L1_STATS,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            guest_command: command.clone(),
        })
        .collect()
}

/// Boots L1 once and runs every guest in it, one after another.
pub fn run_guest_soak(
    ws: &Workspace,
    images: &L1Images,
    options: &GuestSoakOptions,
) -> Result<GuestSoak, RigError> {
    let runs = runs(options);
    let sequence = SequenceOptions {
        topology: options.topology,
        timeout: options.timeout_per_guest * options.guests,
        run_limit_secs: options.timeout_per_guest.as_secs(),
        echo: options.echo,
        progress: true,
        probe: Some(probe()),
        tuning: L1Tuning::default(),
        guest_kernel: crate::GuestKernel::default(),
    };
    let outcome = run_pvmm_sequence(ws, images, &sequence, &runs)?;
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let vms = vec![VmSpec::new(InnerVmm::Pvmm); labels.len()];
    let (l1_kind, _) = classify(&outcome, &vms, &labels);
    let runs = labels
        .iter()
        .filter_map(|label| {
            let run = outcome.run(label)?;
            let kind = vm_kind(&outcome, InnerVmm::Pvmm, label);
            Some(GuestRun {
                label: label.clone(),
                kind,
                status: run.status,
                boot_seconds: outcome.boot_to_init_seconds(label),
                after: run.probe.iter().find_map(|l| L1State::parse(l)),
                slab_growth: run
                    .probe
                    .iter()
                    .find_map(|l| l.strip_prefix(SLAB_TAG))
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            })
        })
        .collect();
    Ok(GuestSoak {
        runs,
        l1_kind,
        outcome,
    })
}

/// A level the soak watches: its name, how to read it from a state (growing when leaking),
/// and how much it may grow over the soak.
type Level = (&'static str, fn(&L1State) -> u64, u64);

/// Levels that grew (or, for available memory, fell) over the soak: after the warm-up, the
/// last quarter of the runs against the first quarter, each level's best against its worst
/// (a level whose least value late is above its greatest value early has grown for good).
/// Counts must not grow at all; memory by at most its per-guest drift. Empty when nothing
/// leaked, or when too few runs were measured to tell.
pub fn findings(runs: &[GuestRun]) -> Vec<String> {
    let states: Vec<L1State> = runs
        .iter()
        .skip(WARM_UP_GUESTS)
        .filter_map(|r| r.after)
        .collect();
    let quarter = states.len() / 4;
    if quarter == 0 {
        return vec![format!(
            "only {} runs measured after the warm-up: too few to tell",
            states.len()
        )];
    }
    let (early, late) = (&states[..quarter], &states[states.len() - quarter..]);
    let guests = (states.len() - quarter) as u64;
    let counts: [Level; 7] = [
        ("processes", |s| s.processes, 0),
        ("threads", |s| s.threads, 0),
        ("open file descriptors", |s| s.open_files, 0),
        ("KVM VMs", |s| s.kvm_vms, 0),
        ("/tmp entries", |s| s.tmp_entries, 0),
        (
            "unreclaimable kernel memory (KiB)",
            |s| s.slab_unreclaim_kib,
            SLAB_DRIFT_KIB_PER_GUEST * guests,
        ),
        (
            "unavailable memory (KiB, from MemAvailable)",
            |s| u64::MAX - s.mem_available_kib,
            MEM_DRIFT_KIB_PER_GUEST * guests,
        ),
    ];
    counts
        .iter()
        .filter_map(|&(name, level, allowed)| {
            let early_worst = early.iter().map(level).max()?;
            let late_best = late.iter().map(level).min()?;
            (late_best > early_worst.saturating_add(allowed)).then(|| {
                format!(
                    "{name} grew by {} over {guests} guests (allowed {allowed})",
                    late_best - early_worst
                )
            })
        })
        .collect()
}

/// The soak's table: one row per guest, its name and outcome left, its figures right, then
/// the slab caches that grew, as text.
pub fn format_report(soak: &GuestSoak) -> String {
    let headers = [
        "guest",
        "outcome",
        "exit",
        "init(s)",
        "MemAvail(K)",
        "SUnrecl(K)",
        "procs",
        "threads",
        "files",
        "VMs",
        "tmp",
        "slab growth since guest 1 (KiB)",
    ];
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = soak
        .runs
        .iter()
        .map(|run| {
            let s = run.after;
            vec![
                run.label.clone(),
                run.kind.name().to_string(),
                opt(run.status.map(|v| v.to_string())),
                opt(run.boot_seconds.map(|v| format!("{v:.1}"))),
                opt(s.map(|s| s.mem_available_kib.to_string())),
                opt(s.map(|s| s.slab_unreclaim_kib.to_string())),
                opt(s.map(|s| s.processes.to_string())),
                opt(s.map(|s| s.threads.to_string())),
                opt(s.map(|s| s.open_files.to_string())),
                opt(s.map(|s| s.kvm_vms.to_string())),
                opt(s.map(|s| s.tmp_entries.to_string())),
                run.slab_growth.clone(),
            ]
        })
        .collect();
    let mut align = [Align::Right; 12];
    align[0] = Align::Left;
    align[1] = Align::Left;
    align[11] = Align::Left;
    columns(&align, &headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: usize, state: L1State) -> GuestRun {
        GuestRun {
            label: format!("guest-{n}"),
            kind: BootKind::Clean,
            status: Some(0),
            boot_seconds: Some(10.0),
            after: Some(state),
            slab_growth: String::new(),
        }
    }

    fn steady() -> L1State {
        L1State {
            mem_available_kib: 1_500_000,
            slab_unreclaim_kib: 40_000,
            processes: 30,
            threads: 90,
            open_files: 600,
            kvm_vms: 0,
            tmp_entries: 5,
        }
    }

    #[test]
    fn the_probe_line_parses() {
        assert_eq!(
            L1State::parse("L1STATE 1500000 40000 30 90 600 0 5"),
            Some(steady())
        );
        assert_eq!(L1State::parse("L1STATE 1 2 3"), None);
        assert_eq!(L1State::parse("V vcpu0 1 0-3 1 2 3"), None);
    }

    #[test]
    fn flat_levels_with_noise_are_no_leak() {
        let runs: Vec<GuestRun> = (0..20)
            .map(|n| {
                let mut s = steady();
                s.mem_available_kib -= (n % 3) as u64 * 2000;
                s.threads += (n % 2) as u64;
                s.open_files -= (n % 2) as u64;
                run(n, s)
            })
            .collect();
        assert_eq!(findings(&runs), Vec::<String>::new());
    }

    #[test]
    fn a_kvm_vm_left_per_guest_and_lost_memory_are_leaks() {
        let runs: Vec<GuestRun> = (0..20)
            .map(|n| {
                let mut s = steady();
                s.kvm_vms = n as u64;
                s.mem_available_kib -= n as u64 * 10_000;
                run(n, s)
            })
            .collect();
        let found = findings(&runs);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("KVM VMs grew"), "{found:?}");
        assert!(found[1].starts_with("unavailable memory"), "{found:?}");
    }

    #[test]
    fn too_few_runs_say_so() {
        let runs: Vec<GuestRun> = (0..4).map(|n| run(n, steady())).collect();
        assert_eq!(findings(&runs).len(), 1);
        assert!(findings(&runs)[0].contains("too few"));
    }

    #[test]
    fn every_run_serves_a_socket_and_loads_its_guest() {
        let options = GuestSoakOptions {
            guests: 3,
            vcpus: 2,
            memory_mib: 256,
            load_secs: 2,
            topology: Topology::default(),
            timeout_per_guest: Duration::from_secs(60),
            echo: false,
        };
        let runs = runs(&options);
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[2].label, "guest-3");
        assert!(runs[0].pvmm_args.contains(&L1_SOCKET.to_string()));
        assert!(runs[0].guest_command.contains("--seconds 2"));
    }
}
