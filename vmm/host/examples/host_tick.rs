//! The cost of one `pvmm-host` tick at scale: N VMs of K vCPUs each, adopted from a fake
//! `/proc` (each VMM process with its KVM file descriptors, named vCPU threads and schedstat
//! files, as QEMU shows them), placed with a recording executor (no real affinity calls). Prints
//! the mean time of each phase over the ticks (full discovery scans included), and the share
//! of one CPU at a 100 ms tick: once with every vCPU idle, once with vCPU 0 of every VM
//! running all the time (its thread's and its process's CPU time advancing between ticks).
//!
//! `cargo run --release -p pvmm-host --example host_tick -- 100 10 1000 10` (pairs of VMS VCPUS).
//! The fake tree lives under the temporary directory (tmpfs or disk: the machine's own
//! `/proc` is in memory, so a disk-backed tree overstates the reading cost a little).

use std::path::Path;
use std::time::Duration;

use pvmm_host::discover::Roots;
use pvmm_host::{HostConfig, HostDaemon};
use pvmm_scheduler::{HostTopology, RecordingExecutor};

/// Ticks measured: two full discovery scans' worth.
// FULL_SCAN_TICKS is a small count of ticks.
#[allow(clippy::cast_possible_truncation)]
const TICKS: usize = 2 * pvmm_host::discover::FULL_SCAN_TICKS as usize;
/// Ticks run first: past the time every process counts as new.
#[allow(clippy::cast_possible_truncation)]
const WARMUP: usize = pvmm_host::discover::FULL_SCAN_TICKS as usize + 1;
/// The host: 2 sockets x 20 cores x 2 threads, a common two-socket server.
const HOST: &str = "2x20x2";
/// The tick the share of a CPU is computed against (pvmm-host's default).
const TICK: Duration = Duration::from_millis(100);

fn build_tree(root: &Path, vms: u32, vcpus: u32) -> std::io::Result<()> {
    let proc = root.join("proc");
    for vm in 0..vms {
        let pid = vm_pid(vm, vcpus);
        let p = proc.join(pid.to_string());
        std::fs::create_dir_all(p.join("fd"))?;
        std::fs::write(p.join("comm"), "qemu-system-x86\n")?;
        // The process's CPU time (utime, stime: fields 14 and 15), unchanging: idle VMs.
        std::fs::write(
            p.join("stat"),
            format!(
                "{pid} (qemu-system-x86) S 1 {pid} {pid} 0 -1 0 0 0 0 0 500 300 0 0 20 0 {}\n",
                vcpus + 2
            ),
        )?;
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

/// Pid of VM `vm` in the fake tree.
fn vm_pid(vm: u32, vcpus: u32) -> u32 {
    10_000 + vm * (vcpus + 4)
}

/// Makes vCPU 0 of every VM run a whole tick more, as of tick `tick`: its thread's run time and
/// its process's CPU time (in 100 Hz clock ticks) both advance by 100 ms a tick.
fn run_vcpu0(root: &Path, vms: u32, vcpus: u32, tick: u64) -> std::io::Result<()> {
    // A tick is 100 ms: its nanoseconds fit a u64.
    #[allow(clippy::cast_possible_truncation)]
    let ran_ns = tick * TICK.as_nanos() as u64;
    for vm in 0..vms {
        let pid = vm_pid(vm, vcpus);
        let p = root.join("proc").join(pid.to_string());
        std::fs::write(
            p.join("task").join((pid + 2).to_string()).join("schedstat"),
            format!("{ran_ns} 0 1\n"),
        )?;
        std::fs::write(
            p.join("stat"),
            format!(
                "{pid} (qemu-system-x86) S 1 {pid} {pid} 0 -1 0 0 0 0 0 {} 300 0 0 20 0 {}\n",
                500 + ran_ns / 10_000_000,
                vcpus + 2
            ),
        )?;
    }
    Ok(())
}

fn mean(v: Vec<u64>) -> u64 {
    v.iter().sum::<u64>() / v.len().max(1) as u64
}

fn run(vms: u32, vcpus: u32, busy: bool) -> Result<(), String> {
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
        share_package: false,
        runtime_dir: root.join("run"),
        adopt: true,
        roots: Roots {
            proc: root.join("proc"),
            kvm_debugfs: root.join("debugfs"),
            qmp: Vec::new(),
            cpu_online: root.join("online"),
            cgroup: root.join("cgroup"),
        },
        verbose: false,
        metrics: None,
    };
    let mut daemon = HostDaemon::with_executor(config, None, Box::new(RecordingExecutor::new()))
        .map_err(|e| e.to_string())?;
    let mut costs = Vec::new();
    for i in 0..WARMUP + TICKS {
        if busy {
            run_vcpu0(&root, vms, vcpus, i as u64)
                .map_err(|e| format!("updating the fake /proc: {e}"))?;
        }
        daemon.tick()?;
        if i >= WARMUP {
            costs.push(daemon.last_cost());
        }
    }
    let (found_vms, found_vcpus) = daemon.managed();
    let phase = |f: fn(&pvmm_api::stats::TickUs) -> u64| mean(costs.iter().map(f).collect());
    let (d, r, c, a) = (
        phase(|c| c.discover),
        phase(|c| c.read),
        phase(|c| c.decide),
        phase(|c| c.apply),
    );
    let total = d + r + c + a;
    println!(
        "| {found_vms} | {found_vcpus} | {} | {d} | {r} | {c} | {a} | {total} | {:.1} % |",
        if busy { vms } else { 0 },
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
    println!("| VMs | vCPUs | busy vCPUs | discover µs | read µs | decide µs | apply µs | tick µs | of one CPU at 100 ms |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (vms, vcpus) in pairs {
        for busy in [false, true] {
            if let Err(e) = run(vms, vcpus, busy) {
                eprintln!("host_tick: {e}");
                std::process::exit(1);
            }
        }
    }
}
