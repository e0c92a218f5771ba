//! Boots tiny hand-written guests on this machine's /dev/kvm: power-off, reboot, triple fault,
//! and several vCPUs. The guest code is a few 32-bit instructions entered through PVH, so it
//! runs quickly even where KVM emulates kernel-mode code.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::*;

fn run_tiny(name: &str, code: &[u8], extra: &[&str]) -> Option<std::process::Output> {
    if !kvm_available(name) {
        return None;
    }
    let dir = scratch(name);
    let k = write_kernel(&dir, code);
    let mut args: Vec<&str> = extra.to_vec();
    let ks = k.to_str().unwrap().to_string();
    args.push(&ks);
    let out = pvmm(&args);
    std::fs::remove_dir_all(&dir).ok();
    Some(out)
}

#[test]
fn guest_output_reaches_stdout_and_poweroff_exits_0() {
    let mut code = print_code(b"hello from pvmm\n");
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    let Some(out) = run_tiny("poweroff", &code, &["--memory", "64"]) else {
        return;
    };
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from pvmm\n");
    // Power-off is the normal end: the only stderr line is the placement summary.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("placement summary"), "{err}");
}

#[test]
fn four_vcpus_with_named_threads_power_off() {
    let mut code = print_code(b"smp\n");
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    let Some(out) = run_tiny("smp", &code, &["--vcpus", "4", "--memory", "64", "-v"]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    for i in 0..4 {
        assert!(err.contains(&format!("vcpu{i} tid ")), "{err}");
    }
}

#[test]
fn acpi_reset_register_exits_3() {
    let mut code = out_code(0x602, 1);
    code.extend(HALT_LOOP);
    let Some(out) = run_tiny("acpi-reset", &code, &[]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().next().unwrap().contains("reboot"), "{err}");
}

#[test]
fn keyboard_controller_reset_exits_3() {
    let mut code = out_code(0x64, 0xfe);
    code.extend(HALT_LOOP);
    let Some(out) = run_tiny("kbd-reset", &code, &[]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn triple_fault_exits_4() {
    // ud2 with an IDT that holds no usable gate: #UD -> #GP -> #DF -> triple fault.
    let code = [0x0f, 0x0b];
    let Some(out) = run_tiny("triple", &code, &[]) else {
        return;
    };
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().next().unwrap().contains("triple fault"),
        "{err}"
    );
}

#[test]
fn unhandled_ports_do_not_stop_the_guest() {
    // Reads and writes to ports nothing serves, then power off.
    let mut code = vec![0x66, 0xba, 0x34, 0x12, 0xec, 0xee]; // mov dx,0x1234; in al,dx; out dx,al
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    let Some(out) = run_tiny("unhandled", &code, &[]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn stats_lines_describe_every_vcpu() {
    // The guest spins for a while, then powers off, so several ticks run.
    // mov ecx, 0x400000; loop: dec ecx; jnz loop (about a second where KVM emulates CPL 0)
    if !kvm_available("stats_lines") {
        return;
    }
    let dir = scratch("stats");
    let mut code = vec![0xb9, 0x00, 0x00, 0x40, 0x00, 0x49, 0x75, 0xfd];
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    let k = write_kernel(&dir, &code);
    let stats = dir.join("stats.jsonl");
    let out = pvmm(&[
        "--vcpus",
        "2",
        "--memory",
        "64",
        "--tick-ms",
        "10",
        "--policy",
        "performance",
        "--stats",
        stats.to_str().unwrap(),
        k.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&stats).unwrap();
    let first = text
        .lines()
        .next()
        .expect("at least the initial placement line");
    for key in [
        "\"t_ms\"",
        "\"vcpus\"",
        "\"packages\"",
        "\"migrations\"",
        "\"capacity\"",
        "\"tid\"",
        "\"util\"",
        "\"cpus\"",
        "\"package\"",
    ] {
        assert!(first.contains(key), "{key} missing: {first}");
    }
    assert_eq!(first.matches("\"vcpu\":").count(), 2, "{first}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn stats_dash_goes_to_stderr_and_stdout_stays_the_console() {
    let mut code = print_code(b"console only\n");
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    let Some(out) = run_tiny("stats-stderr", &code, &["--memory", "64", "--stats", "-"]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "console only\n");
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().next().unwrap_or_default();
    let line: pvmm_api::stats::VmStats = serde_json::from_str(first).expect("a stats line first");
    assert_eq!(line.vcpus.len(), 1, "{first}");
}

#[test]
fn console_input_reaches_the_guest_and_an_open_stdin_does_not_hold_pvmm() {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    if !kvm_available("console_input") {
        return;
    }
    // Echo what COM1 receives until a newline, then power off:
    //   0: mov dx, 0x3fd; 4: in al, dx; test al, 1; jz 4      (wait for Data Ready)
    //   9: mov dx, 0x3f8; in al, dx; out dx, al; cmp al, 10; jne 0
    let mut code = vec![
        0x66, 0xba, 0xfd, 0x03, 0xec, 0xa8, 0x01, 0x74, 0xfb, 0x66, 0xba, 0xf8, 0x03, 0xec, 0xee,
        0x3c, 0x0a, 0x75, 0xed,
    ];
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    let dir = scratch("console-input");
    let k = write_kernel(&dir, &code);
    // Default seccomp (kill): the console thread's filter allows what it waits with.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvmm"))
        .args(["--memory", "64", k.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pvmm");
    // stdin stays open after the line: pvmm must end when the guest powers off all the same.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"typed\n").unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().ok();
            child.wait().ok();
            panic!("pvmm did not exit with its stdin open");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    drop(stdin);
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(out, "typed\n");
    std::fs::remove_dir_all(&dir).ok();
}

/// 32-bit code: `wrmsr` of 0 to MSR `index`, then `rdmsr` of it; prints `ok` if the read gave
/// 0, `bad` otherwise, and powers off.
fn msr_write_then_read(index: u32) -> Vec<u8> {
    let i = index.to_le_bytes();
    let mut code = vec![0xb9, i[0], i[1], i[2], i[3]]; // mov ecx, index
    code.extend([0x31, 0xc0, 0x31, 0xd2, 0x0f, 0x30]); // xor eax, eax; xor edx, edx; wrmsr
    code.extend([0xb8, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x32]); // mov eax, -1; rdmsr
    let mut ok = print_code(b"ok\n");
    ok.extend(out_code(0x600, POWER_OFF_VALUE));
    ok.extend(HALT_LOOP);
    code.extend([0x85, 0xc0, 0x75, ok.len() as u8]); // test eax, eax; jnz bad
    code.extend(ok);
    code.extend(print_code(b"bad\n"));
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    code
}

#[test]
fn amd_pstate_control_writes_are_taken_and_other_unknown_msrs_still_fault() {
    // Linux's amd-pstate writes P0 to MSR_AMD_PERF_CTL as it starts; KVM knows no such MSR
    // and hands the access to pvmm, which takes it (a read gives P0).
    let code = msr_write_then_read(pvmm::vstate::msr::MSR_AMD_PERF_CTL);
    let Some(out) = run_tiny("msr-perf-ctl", &code, &[]) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    // The next AMD P-state register is not answered: the write faults (#GP, no IDT: a triple
    // fault), as it does without pvmm's MSR exits.
    let code = msr_write_then_read(pvmm::vstate::msr::MSR_AMD_PERF_CTL + 1);
    let Some(out) = run_tiny("msr-unknown", &code, &[]) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
}
