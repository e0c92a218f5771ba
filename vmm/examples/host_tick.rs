//! The cost of one `pvmm-host` tick at scale: N VMs of K vCPUs each, adopted from a fake
//! `/proc` (each VMM process with its KVM file descriptors, named vCPU threads and schedstat
//! files, as QEMU shows them), placed with a recording executor (no real affinity calls). Prints
//! the mean time of each phase over the ticks (full discovery scans included), and the share
//! of one CPU at a 100 ms tick.
//!
//! `cargo run --release -p pvmm --example host_tick -- 100 10 1000 10` (pairs of VMS VCPUS).
//! The fake tree lives under the temporary directory (tmpfs or disk: the machine's own
//! `/proc` is in memory, so a disk-backed tree overstates the reading cost a little).

use std::path::Path;
use std::time::Duration;

use pvmm::host::discover::Roots;
use pvmm::host::{HostConfig, HostDaemon};
use pvmm_scheduler::{HostTopology, RecordingExecutor};

/// Ticks measured: two full discovery scans' worth.
const TICKS: usize = 2 * pvmm::host::discover::FULL_SCAN_TICKS as usize;
/// Ticks run first: past the time every process counts as new.
const WARMUP: usize = pvmm::host::discover::FULL_SCAN_TICKS as usize + 1;
/// The host: 2 sockets x 20 cores x 2 threads, a common two-socket server.
const HOST: &str = "2x20x2";
/// The tick the share of a CPU is computed against (pvmm-host's default).
const TICK: Duration = Duration::from_millis(100);

fn build_tree(root: &Path, vms: u32, vcpus: u32) -> std::io::Result<()> {
    let proc = root.join("proc");
    for vm in 0..vms {
        let pid = 10_000 + vm * (vcpus + 4);
        let p = proc.join(pid.to_string());
        std::fs::create_dir_all(p.join("fd"))?;
        std::fs::write(p.join("comm"), "qemu-system-x86\n")?;
        std::os::unix::fs::symlink("anon_inode:kvm-vm", p.join("fd/3"))?;
        let thread = |tid: u32, comm: &str| -> std::io::Result<()> {
            let t = p.join("task").join(tid.to_string());
            std::fs::create_dir_all(&t)?;
            std::fs::write(t.join("comm"), format!("{comm}\n"))?;
            std::fs::write(
                t.join("schedstat"),
                format!("{} 0 1\n", u64::from(tid) * 1000),
            )
        };
        thread(pid, "qemu-system-x86")?;
        thread(pid + 1, "worker")?;
        for n in 0..vcpus {
            thread(pid + 2 + n, &format!("CPU {n}/KVM"))?;
            let fd = p.join("fd").join((10 + n).to_string());
            std::os::unix::fs::symlink(format!("anon_inode:kvm-vcpu:{n}"), fd)?;
        }
    }
    Ok(())
}

fn mean(v: Vec<u64>) -> u64 {
    v.iter().sum::<u64>() / v.len().max(1) as u64
}

fn run(vms: u32, vcpus: u32) -> Result<(), String> {
    let root = std::env::temp_dir().join(format!(
        "pvmm-host-tick-{}-{vms}x{vcpus}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    build_tree(&root, vms, vcpus).map_err(|e| format!("building the fake /proc: {e}"))?;
    let config = HostConfig {
        policy: "powersaving".parse().map_err(|e| format!("{e}"))?,
        topology: HostTopology::from_spec(HOST).map_err(|e| e.to_string())?,
        tick: TICK,
        runtime_dir: root.join("run"),
        adopt: true,
        roots: Roots {
            proc: root.join("proc"),
            kvm_debugfs: root.join("debugfs"),
        },
        verbose: false,
        metrics: None,
    };
    let mut daemon = HostDaemon::with_executor(config, None, Box::new(RecordingExecutor::new()))
        .map_err(|e| e.to_string())?;
    let mut costs = Vec::new();
    for i in 0..WARMUP + TICKS {
        daemon.tick()?;
        if i >= WARMUP {
            costs.push(daemon.last_cost());
        }
    }
    let (found_vms, found_vcpus) = daemon.managed();
    let phase = |f: fn(&pvmm::host::TickCost) -> u64| mean(costs.iter().map(f).collect());
    let (d, r, c, a) = (
        phase(|c| c.discover_us),
        phase(|c| c.read_us),
        phase(|c| c.decide_us),
        phase(|c| c.apply_us),
    );
    let total = d + r + c + a;
    println!(
        "| {found_vms} | {found_vcpus} | {d} | {r} | {c} | {a} | {total} | {:.1} % |",
        total as f64 / TICK.as_micros() as f64 * 100.0
    );
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| {
            eprintln!("host_tick: arguments are pairs of numbers (VMS VCPUS): {e}");
            std::process::exit(2);
        });
    let pairs: Vec<(u32, u32)> = if args.is_empty() {
        vec![(100, 10), (1000, 10)]
    } else if args.len().is_multiple_of(2) {
        args.chunks(2).map(|p| (p[0], p[1])).collect()
    } else {
        eprintln!("host_tick: arguments are pairs of numbers (VMS VCPUS)");
        std::process::exit(2);
    };
    println!("| VMs | vCPUs | discover µs | read µs | decide µs | apply µs | tick µs | of one CPU at 100 ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for (vms, vcpus) in pairs {
        if let Err(e) = run(vms, vcpus) {
            eprintln!("host_tick: {e}");
            std::process::exit(1);
        }
    }
}
