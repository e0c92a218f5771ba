//! `pvmm-host` against real pvmm VMs: tiny guests on this machine's /dev/kvm, the daemon told
//! the host has two packages of one CPU each (`--host-topology 2x1x1`: CPU 0 is package 0,
//! CPU 1 package 1), every placement read back from `/proc`.
//!
//! A busy vCPU here is a guest spinning on `jmp $` in kernel mode, which this machine's KVM
//! emulates instruction by instruction: the vCPU thread never sleeps. An idle one halts.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_wrap)]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pvmm::api::client::request;
use pvmm_api::stats::VmStats;
use serde::Deserialize as _;

/// Long enough for several daemon ticks on a loaded machine.
const SETTLE: Duration = Duration::from_secs(20);
/// The lease the test VMs give an outside balancer.
const LEASE_MS: &str = "600";

/// The tests of this file run one at a time: a daemon with `--adopt auto` adopts every KVM
/// process of the machine, other tests' QEMU included.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn start_vm(dir: &Path, name: &str, code: &[u8], vcpus: &str) -> (Proc, PathBuf) {
    start_pvmm_vm(dir, name, code, vcpus, LEASE_MS)
}

fn start_daemon(dir: &Path, extra: &[&str]) -> Proc {
    Proc(
        host_command()
            .args([
                "--host-topology",
                "2x1x1",
                "--tick-ms",
                "50",
                "--runtime-dir",
            ])
            .arg(dir.join("run"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pvmm-host"),
    )
}

/// The VM's latest tick (`GET /v1/placement`); None while it does not answer one.
fn placement(socket: &Path) -> Option<VmStats> {
    let answer = request(socket, "GET", "/v1/placement", None).ok()?;
    VmStats::deserialize(&answer.body).ok()
}

/// Whether the VM's latest tick says an outside balancer (the daemon) places it: `Some(true)`
/// or `Some(false)`, None while it answers no tick.
fn external(socket: &Path) -> Option<bool> {
    placement(socket).map(|p| p.external)
}

/// Each vCPU thread's `Cpus_allowed_list`, from /proc.
fn allowed(socket: &Path) -> Vec<String> {
    placement(socket).map_or_else(Vec::new, |p| {
        p.vcpus.iter().map(|v| cpus_allowed(v.tid.into())).collect()
    })
}

fn wait_for(what: &str, cond: impl Fn() -> bool, show: impl Fn() -> String) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < SETTLE, "{what}: {}", show());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_busy_vms_are_spread_where_each_alone_would_stack_them() {
    let _serial = serial();
    if !kvm_available("host-spread") {
        return;
    }
    let dir = scratch("host-spread");
    let (_a, sa) = start_vm(&dir, "a", &SPIN, "1");
    let (_b, sb) = start_vm(&dir, "b", &SPIN, "1");
    // Each pvmm alone packs its one busy vCPU onto the lowest CPU: both on CPU 0.
    wait_for(
        "each VM on its own",
        || allowed(&sa) == ["0"] && allowed(&sb) == ["0"],
        || format!("{:?} {:?}", allowed(&sa), allowed(&sb)),
    );
    let _daemon = start_daemon(&dir, &["--policy", "powersaving"]);
    // One engine for both: two busy vCPUs need two CPUs.
    wait_for(
        "spread by pvmm-host",
        || {
            let (a, b) = (allowed(&sa), allowed(&sb));
            external(&sa) == Some(true)
                && external(&sb) == Some(true)
                && a.len() == 1
                && b.len() == 1
                && a != b
        },
        || {
            format!(
                "{:?} {:?} {:?} {:?}",
                allowed(&sa),
                allowed(&sb),
                placement(&sa),
                placement(&sb)
            )
        },
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn idle_vms_are_packed_and_sigterm_hands_placement_back() {
    let _serial = serial();
    if !kvm_available("host-idle") {
        return;
    }
    let dir = scratch("host-idle");
    let (_a, sa) = start_vm(&dir, "a", &HALT_LOOP, "2");
    let (_b, sb) = start_vm(&dir, "b", &HALT_LOOP, "2");
    let mut daemon = start_daemon(&dir, &["--policy", "powersaving"]);
    wait_for(
        "idle VMs packed on package 0",
        || {
            external(&sa) == Some(true)
                && external(&sb) == Some(true)
                && allowed(&sa) == ["0", "0"]
                && allowed(&sb) == ["0", "0"]
        },
        || format!("{:?} {:?}", allowed(&sa), allowed(&sb)),
    );
    // What operators see: `pvmm-host status`, and the metrics on the status socket.
    let status = host_command()
        .args(["status", "--runtime-dir"])
        .arg(dir.join("run"))
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(
        text.lines().filter(|l| l.contains(" pvmm ")).count(),
        4,
        "{text}"
    );
    let metrics = host_metrics(&dir.join("run"));
    assert!(metrics.contains("pvmm_vms 2\n"), "{metrics}");
    assert!(
        metrics.contains("pvmm_package_active{package=\"1\"} 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("pvmm_package_power_model_watts{package=\"0\"}"),
        "{metrics}"
    );
    // Each VM under its stable name: its socket's, in the metrics and status's first column.
    for name in ["a", "b"] {
        let series = format!("pvmm_vm_vcpus{{vm=\"{name}\"}} 2\n");
        assert!(metrics.contains(&series), "{metrics}");
        let rows = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name} ")))
            .count();
        assert_eq!(rows, 2, "{text}");
    }
    // A second daemon on the same runtime directory is refused.
    let second = host_command()
        .args(["--host-topology", "2x1x1", "--runtime-dir"])
        .arg(dir.join("run"))
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2));
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("another pvmm-host"), "{err}");
    // SIGTERM: placement handed back at once (DELETE), not at the lease's end.
    // SAFETY: kill on a child's pid; the result is checked.
    let killed = unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    assert_eq!(killed, 0);
    let status = daemon.0.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    for s in [&sa, &sb] {
        let vm = request(s, "GET", "/v1/vm", None).unwrap().body;
        assert_eq!(vm["external_placement"], false, "{vm}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Each vCPU of VM `name` in the daemon's latest status, by vCPU index: its utilization and
/// the CPUs the daemon gave it; empty while the daemon does not report the VM.
fn daemon_view(dir: &Path, name: &str) -> Vec<(f64, String)> {
    host_status(&dir.join("run")).map_or_else(Vec::new, |status| {
        status
            .vms
            .iter()
            .filter(|vm| vm.name == name)
            .flat_map(|vm| {
                vm.vcpus.iter().map(|v| {
                    let cpus = v
                        .cpus
                        .as_ref()
                        .map_or_else(String::new, ToString::to_string);
                    (v.util, cpus)
                })
            })
            .collect()
    })
}

/// Whether the VM on `socket`, named `name`, is placed where the daemon says: pvmm reports an
/// outside balancer, and each vCPU thread's affinity in `/proc` is the daemon's CPUs for it.
fn placed_as_the_daemon_says(dir: &Path, socket: &Path, name: &str) -> bool {
    let cpus: Vec<String> = daemon_view(dir, name).into_iter().map(|v| v.1).collect();
    external(socket) == Some(true) && !cpus.is_empty() && cpus == allowed(socket)
}

#[test]
fn joined_vms_are_read_from_proc_placed_and_left_to_their_lease_by_a_killed_daemon() {
    let _serial = serial();
    if !kvm_available("host-kill") {
        return;
    }
    let dir = scratch("host-kill");
    let (_a, sa) = start_vm(&dir, "a", &SPIN, "1");
    let (_b, sb) = start_vm(&dir, "b", &HALT_LOOP, "2");
    let mut daemon = start_daemon(&dir, &[]);
    // The daemon reads each vCPU's load from its thread (a's spins, b's halt) and each pvmm
    // puts its vCPU threads on the CPUs the daemon chose.
    let loads = |name: &str| -> Vec<f64> { daemon_view(&dir, name).iter().map(|v| v.0).collect() };
    wait_for(
        "joined VMs placed",
        || {
            placed_as_the_daemon_says(&dir, &sa, "a")
                && placed_as_the_daemon_says(&dir, &sb, "b")
                && loads("a").iter().all(|&u| u > 0.5)
                && loads("b").iter().all(|&u| u < 0.2)
        },
        || {
            format!(
                "a {:?} on {:?}, b {:?} on {:?}",
                daemon_view(&dir, "a"),
                allowed(&sa),
                daemon_view(&dir, "b"),
                allowed(&sb)
            )
        },
    );
    // A pvmm that exits is dropped, though its socket stays behind.
    let (c, sc) = start_vm(&dir, "c", &HALT_LOOP, "1");
    wait_for(
        "a third VM joined",
        || placed_as_the_daemon_says(&dir, &sc, "c"),
        || format!("{:?} on {:?}", daemon_view(&dir, "c"), allowed(&sc)),
    );
    drop(c);
    assert!(sc.exists());
    wait_for(
        "the exited VM dropped",
        || daemon_view(&dir, "c").is_empty() && daemon_view(&dir, "a").len() == 1,
        || format!("{:?}", host_status(&dir.join("run"))),
    );
    // Killed outright, the daemon hands nothing back: each pvmm places itself again once its
    // lease ends without a renewal.
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    wait_for(
        "each VM places itself after its lease",
        || external(&sa) == Some(false) && external(&sb) == Some(false),
        || format!("{:?} {:?}", placement(&sa), placement(&sb)),
    );
    // A restarted daemon adopts them again.
    let _again = start_daemon(&dir, &[]);
    wait_for(
        "adopted again",
        || external(&sa) == Some(true) && external(&sb) == Some(true),
        || format!("{:?} {:?}", placement(&sa), placement(&sb)),
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_qemu_vm_is_adopted_packed_with_pvmm_and_restored_at_sigterm() {
    let _serial = serial();
    if !kvm_available("host-adopt") || !qemu_available("host-adopt") {
        return;
    }
    let dir = scratch("host-adopt");
    let kernel = dir.join("halt.elf");
    std::fs::write(&kernel, tiny_pvh_kernel(&HALT_LOOP)).unwrap();
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(qemu_tiny_args("adopt", 2, &kernel))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let qemu = Proc(qemu.spawn().expect("start QEMU"));
    let qpid = qemu.0.id();
    let threads = || process_threads(qpid);
    wait_for(
        "QEMU's vCPU threads",
        || {
            threads()
                .iter()
                .filter(|(c, _)| c.ends_with("/KVM"))
                .count()
                == 2
        },
        || format!("{:?}", threads()),
    );
    let before = threads();
    let (_vm, socket) = start_vm(&dir, "p", &HALT_LOOP, "1");
    let mut daemon = start_daemon(&dir, &["--adopt", "auto"]);
    // Idle: QEMU's vCPUs and its other threads join pvmm's vCPU on package 0 (CPU 0).
    wait_for(
        "QEMU adopted and packed",
        || {
            let t = threads();
            !t.is_empty()
                && t.iter().all(|(_, a)| a == "0")
                && external(&socket) == Some(true)
                && allowed(&socket) == ["0"]
        },
        || format!("QEMU {:?}, pvmm {:?}", threads(), allowed(&socket)),
    );
    // SAFETY: kill on a child's pid; the result is checked.
    let killed = unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    assert_eq!(killed, 0);
    assert_eq!(daemon.0.wait().unwrap().code(), Some(0));
    // Every thread is back where it was. A thread QEMU's process gained while placed (KVM's
    // NX huge page recovery worker starts when it is first needed) inherited the daemon's
    // pinning; it gets the affinity the process had at adoption.
    let original = &before[0].1;
    assert!(before.iter().all(|(_, a)| a == original), "{before:?}");
    let after = threads();
    assert!(
        after.iter().all(|(_, a)| a == original),
        "QEMU's threads' affinity is not restored: {after:?}, was {original}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
