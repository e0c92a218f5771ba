//! Every guest mistake reaches one counter: a tiny guest touches a port nothing serves, asks
//! for a sleep state pvmm does not implement and sends the i8042 a command other than reset;
//! `--stats` reports each of them in `guest_register_errors`.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_wrap)]

mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the guest's mistakes may take to show in a stats line.
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn bus_misses_and_ignored_power_writes_are_counted() {
    if !kvm_available("guest_errors") {
        return;
    }
    let dir = scratch("guest-errors");
    // mov dx, 0x1234; in al, dx; out dx, al: two accesses no device claims.
    let mut code = vec![0x66, 0xba, 0x34, 0x12, 0xec, 0xee];
    // S3 (sleep type 3 with SLP_EN): a sleep state pvmm does not implement.
    code.extend(out_code(0x600, (3 << 2) | (1 << 5)));
    // An i8042 command other than the CPU reset pulse.
    code.extend(out_code(0x64, 0xaa));
    code.extend(HALT_LOOP);
    let kernel = write_kernel(&dir, &code);
    let stats = dir.join("stats.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvmm"))
        .args([
            "--memory",
            "64",
            "--tick-ms",
            "10",
            "--shutdown-timeout",
            "0",
        ])
        .arg("--stats")
        .arg(&stats)
        .arg(&kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run pvmm");
    let start = Instant::now();
    let counted = loop {
        let last = std::fs::read_to_string(&stats)
            .ok()
            .and_then(|t| t.lines().last().map(str::to_string))
            .and_then(|l| serde_json::from_str::<pvmm_api::stats::VmStats>(&l).ok());
        let errors = last.and_then(|v| v.guest_register_errors);
        if errors == Some(4) || start.elapsed() > WAIT {
            break errors;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: kill on our own child's pid; the result is checked.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().expect("reap pvmm");
    assert_eq!(counted, Some(4));
    std::fs::remove_dir_all(&dir).ok();
}
