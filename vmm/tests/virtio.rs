//! virtio devices on a real VM: tiny guests on this machine's /dev/kvm. A guest reads the
//! devices' register windows where the DSDT puts them; the devices' worker threads are listed
//! by the control socket and confined by their seccomp filter (read from /proc); bad `--disk`
//! input ends pvmm before the guest starts, with one line and status 2.
//!
//! A Linux guest driving the devices (boot from a disk, entropy) is the QEMU-nested rig's.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::*;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pvmm::api::client::request;
use pvmm::layout::virtio_slots;
use pvmm_api::messages::{ThreadEntry, VcpusAnswer};
use serde::Deserialize as _;

/// How long a started pvmm may take to answer on its control socket.
const START_LIMIT: Duration = Duration::from_secs(30);
/// "virt": the magic value of a virtio-mmio window.
const MAGIC: u32 = 0x7472_6976;

/// 32-bit code: `mov eax, [addr]; cmp eax, value; jne +skip`.
fn expect_at(addr: u64, value: u32, skip: u8) -> Vec<u8> {
    let mut c = vec![0xa1];
    c.extend((addr as u32).to_le_bytes());
    c.push(0x3d);
    c.extend(value.to_le_bytes());
    c.extend([0x75, skip]);
    c
}

/// Prints `text` and powers off.
fn say(text: &[u8]) -> Vec<u8> {
    let mut c = print_code(text);
    c.extend(out_code(0x600, POWER_OFF_VALUE));
    c.extend(HALT_LOOP);
    c
}

fn image(dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, vec![0u8; 64 * 1024]).unwrap();
    p.to_str().unwrap().to_string()
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// Starts a halting guest with `args`, waits for its control socket at `socket`.
fn start(kernel: &Path, socket: &Path, args: &[&str]) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_pvmm"))
        .args(["--memory", "64", "--api-socket", socket.to_str().unwrap()])
        .args(args)
        .arg(kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let vm = Running(child);
    let started = Instant::now();
    while request(socket, "GET", "/v1/vm", None).is_err() {
        assert!(started.elapsed() < START_LIMIT, "pvmm did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    vm
}

#[test]
fn a_guest_finds_each_device_window_where_the_dsdt_says() {
    if !kvm_available("virtio_windows") {
        return;
    }
    let dir = scratch("virtio-windows");
    let slots = virtio_slots(2);
    let ok = say(b"ok\n");
    let bad = say(b"bad\n");
    let second = expect_at(slots[1].base + 8, 4, ok.len() as u8);
    let mut code = expect_at(slots[0].base, MAGIC, (second.len() + ok.len()) as u8);
    code.extend(second);
    code.extend(ok);
    code.extend(bad);
    let kernel = write_kernel(&dir, &code);
    let disk = image(&dir, "a.img");
    let out = pvmm(&[
        "--memory",
        "64",
        "--disk",
        &disk,
        "--rng",
        kernel.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn device_threads_are_listed_and_run_under_their_filter() {
    if !kvm_available("virtio_threads") {
        return;
    }
    let dir = scratch("virtio-threads");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let socket = dir.join("api.sock");
    let disk = image(&dir, "a.img");
    let vm = start(&kernel, &socket, &["--disk", &disk, "--rng"]);
    let threads = own_threads(&socket);
    let pid = vm.0.id();
    for name in ["pvmm-blk0", "pvmm-rng0"] {
        let t = threads.iter().find(|t| t.name == name);
        let tid = t
            .unwrap_or_else(|| panic!("{name} not listed: {threads:?}"))
            .tid;
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
        let mode = status.lines().find(|l| l.starts_with("Seccomp:")).unwrap();
        assert_eq!(mode.split_whitespace().nth(1), Some("2"), "{name}: {mode}");
    }
    drop(vm);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_disks_end_pvmm_with_one_line_and_status_2() {
    if !kvm_available("virtio_bad_disks") {
        return;
    }
    let dir = scratch("virtio-bad");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let k = kernel.to_str().unwrap();
    let disk = image(&dir, "held.img");
    let missing = dir.join("missing.img");
    let folder = dir.to_str().unwrap();
    let refused = |args: &[&str], needle: &str| {
        let mut all = vec!["--memory", "64"];
        all.extend_from_slice(args);
        all.push(k);
        let out = pvmm(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    refused(&["--disk", missing.to_str().unwrap()], "missing.img");
    refused(&["--disk", folder], "not a regular file");
    refused(&["--disk", &format!("{disk},ro")], "readonly=on|off");
    let socket = dir.join("api.sock");
    let holder = start(&kernel, &socket, &["--disk", &disk]);
    refused(&["--disk", &disk], "in use");
    refused(&["--disk", &format!("{disk},readonly=on")], "in use");
    drop(holder);
    std::fs::remove_dir_all(&dir).ok();
}

/// pvmm's own threads, from `GET /v1/vcpus` on its control socket.
fn own_threads(socket: &Path) -> Vec<ThreadEntry> {
    let answer = request(socket, "GET", "/v1/vcpus", None).expect("GET /v1/vcpus");
    VcpusAnswer::deserialize(&answer.body)
        .unwrap_or_else(|e| panic!("not a vcpus answer ({e}): {}", answer.body))
        .threads
}

/// Moves this test's thread into a network namespace of its own, which the processes it starts
/// inherit, so that the taps it makes are no one else's and no traffic reaches the machine's
/// network. False where that is not allowed (not root): the test skips loudly, or fails
/// under PVMM_REQUIRE_KVM=1 (CI, which runs as root).
fn own_network_namespace(test: &str) -> bool {
    // SAFETY: unshare changes only the calling thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
        return true;
    }
    let why = std::io::Error::last_os_error();
    require_or_skip(
        Need::Kvm,
        test,
        &format!("cannot make a network namespace: {why}"),
    );
    false
}

#[test]
fn a_network_card_opens_its_tap_and_bad_taps_are_refused() {
    if !kvm_available("virtio_net") || !own_network_namespace("virtio_net") {
        return;
    }
    let made = Command::new("ip")
        .args(["tuntap", "add", "pvmmtap0", "mode", "tap"])
        .status()
        .expect("ip (iproute2)");
    assert!(made.success());
    let dir = scratch("virtio-net");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let socket = dir.join("api.sock");
    let vm = start(&kernel, &socket, &["--net", "tap=pvmmtap0"]);
    let threads = own_threads(&socket);
    assert!(threads.iter().any(|t| t.name == "pvmm-net0"), "{threads:?}");
    drop(vm);
    for (net, needle) in [
        ("tap=pvmmtap9", "no such tap device"),
        ("tap=lo", "not a tap device"),
        ("tap=pvmmtap0,mac=01:02:03:04:05:06", "unicast"),
        ("mac=52:54:00:00:00:01", "tap=NAME"),
    ] {
        let out = pvmm(&["--memory", "64", "--net", net, kernel.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{net}: {err}");
        assert_eq!(err.lines().count(), 1, "{net}: {err}");
        assert!(err.contains(needle), "{net}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
