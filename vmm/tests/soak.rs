//! No leaks over many VM lifetimes: creates and destroys `PVMM_SOAK_VMS` (default 1,000) tiny
//! VMs in this one process, through the library ([`pvmm::vmm::start`]), and checks that open
//! file descriptors, threads and resident memory are flat after a warm-up of 50 VMs.
//!
//! Half the VMs power themselves off (the guest writes S5 to the ACPI power port); the other
//! half halt forever and are stopped by the host, which kicks their vCPUs out of `KVM_RUN`.
//! Both are waited for and stopped (every thread joined), then dropped. Each has 2 vCPUs, 64
//! MiB (the least pvmm accepts), the default placement policy with a 10 ms tick, no stats,
//! and seccomp off (filters are per thread, and the main thread's, installed
//! at the end of `start`, would confine this test's thread). Stdin is a pipe that never ends,
//! as under a terminal or a service manager, so each VM's console thread must end with it.
//! The host-stopped half serve a control socket, and a client keeps a connection open to it
//! (HTTP keep-alive, one request answered) across the stop, as `pvmm-host` does: when `stop`
//! returns, the socket's threads must be gone and the client's connection closed.
//!
//! Counts are exact: pvmm joins every thread it starts, and KVM's own per-VM worker
//! (`kvm-nx-lpage-recovery`, a task of this process where NX huge pages are on) ends when the
//! VM's last descriptor closes. This file holds one test, so nothing else runs in the process.
//! After each VM the test waits (boundedly) for those threads to leave `/proc/self/task`: the
//! kernel lists an exiting thread a little after `join` has returned.
//!
//! 30-38 ms per VM (debug build, 2 shared CPUs): 1,000 VMs take 31-40 s, which CI runs.
//! A longer run: `PVMM_REQUIRE_KVM=1 PVMM_SOAK_VMS=10000 cargo test -p pvmm --test soak --
//! --nocapture` (the figures are printed on stderr).

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_wrap)]

mod common;
use common::*;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pvmm::api::client::Connection;
use pvmm::api::VmControl;

use pvmm::config::{
    PlacementConfig, VmConfig, DEFAULT_CMDLINE, DEFAULT_EXTERNAL_LEASE_MS, DEFAULT_KVM_DEVICE,
    MIN_MEMORY_MIB, MIN_TICK_MS,
};
use pvmm::exit::VmExit;
use pvmm::seccomp::SeccompMode;

/// VMs started before the first sample: the allocator's arenas, the signal-hook and seccomp
/// globals, the kick handler and the lazily opened host files reach their steady state.
const WARM_UP: usize = 50;
/// VMs after the warm-up, unless `PVMM_SOAK_VMS` says otherwise.
const DEFAULT_VMS: usize = 1000;
/// How far RSS may grow between the samples. What legitimately moves is the allocator's free
/// lists and arenas (glibc keeps the arenas of threads that ended, for later threads, and
/// trims lazily): observed +80..216 KiB over 1,000 VMs and +256 KiB over 3,000, flattening.
/// A leak of one guest page (4 KiB) per VM shows as 4 MiB over 1,000 VMs; the console thread
/// that outlived its VM (fixed) cost about 11 KiB per VM, 11 MiB; a guest's memory is 64 MiB.
const RSS_BOUND_KIB: u64 = 4 * 1024;
/// How long a halt-forever guest runs before the host stops it: its vCPUs have entered the
/// guest by then, and the scheduler has ticked at least once (tick = 10 ms).
const HALTED_RUN: Duration = Duration::from_millis(12);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    fds: usize,
    threads: usize,
    rss_kib: u64,
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

fn sample() -> Sample {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    Sample {
        fds: count("/proc/self/fd"),
        threads: count("/proc/self/task"),
        rss_kib,
    }
}

/// Name prefixes of the threads a VM starts (vCPUs, scheduler, console, signals, control
/// socket and its connections), and of KVM's per-VM worker.
const VM_THREADS: [&str; 4] = ["vcpu", "pvmm-", "console-in", "kvm-nx"];
/// How long a joined thread may still be listed in `/proc/self/task`. `join` returns when the
/// kernel clears the thread's TID on its way out (as it releases the thread's memory map),
/// and the task is removed from `/proc` later in the same exit; under load the exiting thread
/// can be preempted in between. A thread that was not joined stays listed however long this
/// test waits.
const REAP_WAIT: Duration = Duration::from_secs(2);
/// How often the wait looks again: the task is usually gone within a millisecond, and the
/// soak's VMs take tens of milliseconds each, so polling this often costs it little.
const REAP_POLL: Duration = Duration::from_millis(1);

/// Waits (at most [`REAP_WAIT`]) until no thread of this process has a name starting with one
/// of `prefixes`; returns how many are still listed.
fn wait_threads_gone(prefixes: &[&str]) -> usize {
    let started = Instant::now();
    loop {
        let left: usize = prefixes
            .iter()
            .map(|p| {
                common::thread_names("self")
                    .iter()
                    .filter(|n| n.starts_with(p))
                    .count()
            })
            .sum();
        if left == 0 || started.elapsed() >= REAP_WAIT {
            return left;
        }
        std::thread::sleep(REAP_POLL);
    }
}

fn config(kernel: &std::path::Path, vcpus: u32, api_socket: Option<PathBuf>) -> VmConfig {
    VmConfig {
        kernel: kernel.into(),
        initrd: None,
        cmdline: DEFAULT_CMDLINE.into(),
        vcpus,
        memory_mib: MIN_MEMORY_MIB,
        kvm_device: DEFAULT_KVM_DEVICE.into(),
        verbose: false,
        placement: PlacementConfig {
            tick_ms: MIN_TICK_MS,
            ..PlacementConfig::default()
        },
        api_socket,
        external_lease_ms: DEFAULT_EXTERNAL_LEASE_MS,
        shutdown_timeout_secs: 1,
        // Filters are per thread and the main thread's would confine this test's thread.
        seccomp: SeccompMode::Off,
        virtio: Default::default(),
        name: None,
    }
}

/// Makes this process's stdin a pipe that never ends (its write end stays open until the
/// returned file is dropped), as a terminal or a service manager's pipe would be: each VM's
/// console thread, blocked reading it, must still end with its VM.
fn stdin_that_never_ends() -> std::fs::File {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are open; fd 0 is replaced atomically.
    assert_eq!(unsafe { libc::dup2(fds[0], 0) }, 0);
    // SAFETY: the read end was duplicated onto fd 0 and is no longer needed.
    unsafe { libc::close(fds[0]) };
    // SAFETY: the write end is open and owned by nothing else.
    unsafe { std::fs::File::from_raw_fd(fds[1]) }
}

/// One VM's whole life: start, let the guest run, stop, join, drop.
fn one_vm(i: usize, power_off: &VmConfig, halted: &VmConfig) {
    let (config, want) = if i.is_multiple_of(2) {
        (power_off, VmExit::PowerOff)
    } else {
        (halted, VmExit::Stopped)
    };
    let mut vm = pvmm::vmm::start(config).unwrap_or_else(|e| panic!("VM {i}: start: {e}"));
    let mut client = config.api_socket.as_deref().map(Connection::new);
    if let Some(client) = client.as_mut() {
        let answer = client.request("GET", "/v1/vm", None);
        assert!(
            answer.as_ref().is_ok_and(|a| a.status == 200),
            "VM {i}: GET /v1/vm: {answer:?}"
        );
    }
    if want == VmExit::Stopped {
        std::thread::sleep(HALTED_RUN);
        vm.core.stop_now();
    }
    let exit = vm.wait();
    assert_eq!(exit, want, "VM {i}");
    vm.stop();
    if let Some(client) = client.as_mut() {
        assert_eq!(
            wait_threads_gone(&["pvmm-api"]),
            0,
            "VM {i}: a control-socket thread outlived the VM's stop"
        );
        assert!(
            client.request("GET", "/v1/vm", None).is_err(),
            "VM {i}: the kept connection still answers after the VM's stop"
        );
    }
    drop(vm);
    assert_eq!(
        wait_threads_gone(&VM_THREADS),
        0,
        "VM {i}: a thread outlived the VM's drop"
    );
}

#[test]
fn a_thousand_vms_leak_no_fds_threads_or_memory() {
    if !kvm_available("soak") {
        return;
    }
    let vms = std::env::var("PVMM_SOAK_VMS")
        .ok()
        .map(|v| v.parse::<usize>().expect("PVMM_SOAK_VMS is a number"))
        .unwrap_or(DEFAULT_VMS);
    let dir = scratch("soak");
    let mut code = out_code(0x600, POWER_OFF_VALUE);
    code.extend(HALT_LOOP);
    let off_kernel = dir.join("off.elf");
    std::fs::write(&off_kernel, tiny_pvh_kernel(&code)).unwrap();
    let halt_kernel = dir.join("halt.elf");
    std::fs::write(&halt_kernel, tiny_pvh_kernel(&HALT_LOOP)).unwrap();
    let power_off = config(&off_kernel, 2, None);
    let halted = config(&halt_kernel, 2, Some(dir.join("api.sock")));
    let _stdin = stdin_that_never_ends();

    let before_any = sample();
    for i in 0..WARM_UP {
        one_vm(i, &power_off, &halted);
    }
    let warm = sample();
    let started = Instant::now();
    for i in WARM_UP..WARM_UP + vms {
        one_vm(i, &power_off, &halted);
    }
    let elapsed = started.elapsed();
    let after = sample();
    std::fs::remove_dir_all(&dir).ok();

    eprintln!(
        "soak: {vms} VMs after {WARM_UP} warm-up in {:.1} s ({:.1} ms per VM)\n\
         soak: before any VM: {before_any:?}\n\
         soak: after warm-up: {warm:?}\n\
         soak: after {vms} VMs: {after:?} (RSS {:+} KiB)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / vms as f64,
        after.rss_kib as i64 - warm.rss_kib as i64,
    );
    assert_eq!(after.fds, warm.fds, "open file descriptors grew");
    assert_eq!(after.threads, warm.threads, "threads grew");
    assert!(
        after.rss_kib <= warm.rss_kib + RSS_BOUND_KIB,
        "RSS grew by {} KiB over {vms} VMs (bound {RSS_BOUND_KIB} KiB)",
        after.rss_kib - warm.rss_kib
    );
}
