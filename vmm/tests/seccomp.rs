//! Seccomp filters on a real VM: tiny guests on this machine's /dev/kvm run under the default
//! filters (`--seccomp kill`); the test hook `PVMM_SECCOMP_SELFTEST` makes one kind of thread
//! call a forbidden system call right after installing its filter, and pvmm must end with the
//! documented line and status 159. The other tests that run pvmm (the control socket's in
//! api.rs, the tiny guests' in tiny_guest.rs) run under the default filters too.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::*;

use std::process::Output;

use pvmm::exit::EXIT_SECCOMP;
use pvmm::layout::CPPC_MMIO_START;
use pvmm::seccomp::{ThreadKind, SELFTEST_ENV, SELFTEST_SYSCALL};
use pvmm_devices::cppc::CppcRegister;

/// Runs pvmm with `args` and the test hook naming `selftest`, stdin closed.
fn run(args: &[&str], selftest: Option<ThreadKind>) -> Output {
    pvmm_with(args, |command| {
        command.env_remove(SELFTEST_ENV);
        if let Some(kind) = selftest {
            command.env(SELFTEST_ENV, kind.name());
        }
    })
}

/// A guest that prints `text` and powers off.
fn print_and_power_off(text: &[u8]) -> Vec<u8> {
    let mut code = print_code(text);
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    code
}

/// The line pvmm prints when `thread`, under `kind`'s filter, makes the self-test's call.
fn violation_line(thread: &str, kind: ThreadKind) -> String {
    format!(
        "pvmm: seccomp: thread {thread} ({} filter) made forbidden system call {SELFTEST_SYSCALL}; stopping (exit 159)",
        kind.name()
    )
}

/// Runs a halting guest with every kind of pvmm thread (the control socket and a virtio
/// device too) under `--seccomp kill`, the test hook naming `kind`; checks the status and the
/// line.
fn assert_violation_ends_pvmm(kind: ThreadKind, thread: &str) {
    let dir = scratch(&format!("seccomp-{}", kind.name()));
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let socket = dir.join("api.sock");
    let out = run(
        &[
            "--memory",
            "64",
            "--rng",
            "--api-socket",
            socket.to_str().unwrap(),
            kernel.to_str().unwrap(),
        ],
        Some(kind),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_SECCOMP), "{kind:?}: {err}");
    assert_eq!(EXIT_SECCOMP, 159);
    assert!(
        err.lines().any(|l| l == violation_line(thread, kind)),
        "{kind:?}: {err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_forbidden_call_on_a_vcpu_thread_ends_pvmm_with_one_line_and_status_159() {
    if !kvm_available("seccomp_vcpu") {
        return;
    }
    assert_violation_ends_pvmm(ThreadKind::Vcpu, "vcpu0");
}

#[test]
fn every_other_kind_of_thread_is_confined_too() {
    if !kvm_available("seccomp_every_thread") {
        return;
    }
    for (kind, thread) in [
        (ThreadKind::ConsoleInput, "console-in"),
        (ThreadKind::Scheduler, "pvmm-sched"),
        (ThreadKind::Api, "pvmm-api"),
        (ThreadKind::Signals, "pvmm-signals"),
        (ThreadKind::Main, "main"),
        (ThreadKind::Device, "pvmm-rng0"),
    ] {
        assert_violation_ends_pvmm(kind, thread);
    }
}

#[test]
fn no_guest_code_runs_before_the_main_thread_is_confined() {
    if !kvm_available("seccomp_main_first") {
        return;
    }
    // The main thread installs its filter last; the test hook ends pvmm right after it. A
    // guest whose first instructions print would have printed had it run by then.
    let dir = scratch("seccomp-main-first");
    let kernel = write_kernel(&dir, &print_and_power_off(b"ran\n"));
    for _ in 0..3 {
        let out = run(
            &["--memory", "64", kernel.to_str().unwrap()],
            Some(ThreadKind::Main),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_SECCOMP), "{err}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "",
            "the guest ran before the main thread was confined"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn log_mode_and_off_let_the_forbidden_call_run() {
    if !kvm_available("seccomp_log_off") {
        return;
    }
    let dir = scratch("seccomp-log-off");
    let kernel = write_kernel(&dir, &print_and_power_off(b"ran\n"));
    for mode in ["log", "off"] {
        let out = run(
            &[
                "--memory",
                "64",
                "--seccomp",
                mode,
                kernel.to_str().unwrap(),
            ],
            Some(ThreadKind::Vcpu),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "--seccomp {mode}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
        assert!(!err.contains("seccomp"), "--seccomp {mode}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_vcpu_filter_lets_the_guest_read_its_cppc_counters() {
    // cmpxchg8b on the reference performance counter: an 8-byte MMIO read, which the CPPC
    // device answers from the vCPU thread's /proc schedstat, on the vCPU thread.
    if !kvm_available("seccomp_cppc") {
        return;
    }
    let dir = scratch("seccomp-cppc");
    let counter = CppcRegister::ReferenceCounter.address(CPPC_MMIO_START, 0) as u32;
    // xor eax,eax; xor edx,edx; xor ebx,ebx; xor ecx,ecx; cmpxchg8b [counter]
    let mut code = vec![
        0x31, 0xc0, 0x31, 0xd2, 0x31, 0xdb, 0x31, 0xc9, 0x0f, 0xc7, 0x0d,
    ];
    code.extend(counter.to_le_bytes());
    code.extend(print_and_power_off(b"counted\n"));
    let kernel = write_kernel(&dir, &code);
    let out = run(
        &["--memory", "64", "--vcpus", "2", kernel.to_str().unwrap()],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "counted\n");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_bad_mode_is_one_line_and_status_2() {
    let dir = scratch("seccomp-bad");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let out = run(&["--seccomp", "strict", kernel.to_str().unwrap()], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--seccomp"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
