//! Bad input: every case gets exit status 2 and one line on stderr, never a panic.
//! None of these needs /dev/kvm except where noted.

mod common;
use common::*;

fn assert_bad_input(args: &[&str], expect: &str) {
    let out = pvmm(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.starts_with("pvmm: "), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(
        err.to_lowercase().contains(&expect.to_lowercase()),
        "{args:?}: expected {expect:?} in {err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn help_and_version_exit_0() {
    let out = pvmm(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--vcpus",
        "--memory",
        "--initrd",
        "--cmdline",
        "Exit status",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
    assert_eq!(pvmm(&["--version"]).status.code(), Some(0));
}

#[test]
fn flags() {
    assert_bad_input(&["--vcpus", "0", "k"], "--vcpus");
    assert_bad_input(&["--vcpus", "256", "k"], "--vcpus");
    assert_bad_input(&["--vcpus", "many", "k"], "--vcpus");
    assert_bad_input(&["--frobnicate", "k"], "--frobnicate");
    assert_bad_input(&[], "KERNEL");
    assert_bad_input(&["--memory", "lots", "k"], "--memory");
}

#[test]
fn memory_too_small_or_large() {
    let dir = scratch("mem");
    let k = write_kernel(&dir, &HALT_LOOP);
    let k = k.to_str().unwrap();
    assert_bad_input(&["--memory", "16", k], "--memory 16");
    assert_bad_input(&["--memory", "99999999999", k], "out of range");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kernel_files() {
    let dir = scratch("kernel");
    assert_bad_input(
        &[dir.join("missing").to_str().unwrap()],
        "cannot read kernel",
    );
    assert_bad_input(&[dir.to_str().unwrap()], "is a directory");
    let junk = dir.join("junk");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    assert_bad_input(&[junk.to_str().unwrap()], "not an x86-64 Linux kernel");
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_bad_input(&[empty.to_str().unwrap()], "not an x86-64 Linux kernel");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn initrd_files() {
    let dir = scratch("initrd");
    let k = write_kernel(&dir, &HALT_LOOP);
    let k = k.to_str().unwrap();
    let missing = dir.join("missing.cpio");
    assert_bad_input(
        &["--initrd", missing.to_str().unwrap(), k],
        "cannot read initrd",
    );
    // A sparse 100 MiB initrd cannot fit in 64 MiB of RAM.
    let big = dir.join("big.cpio");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    assert_bad_input(
        &["--memory", "64", "--initrd", big.to_str().unwrap(), k],
        "does not fit",
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kvm_device_missing_or_not_kvm() {
    let dir = scratch("kvmdev");
    let k = write_kernel(&dir, &HALT_LOOP);
    let k = k.to_str().unwrap();
    assert_bad_input(
        &["--kvm", "/nonexistent/kvm", k],
        "cannot open /nonexistent/kvm",
    );
    assert_bad_input(&["--kvm", "/dev/null", k], "not a usable KVM device");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn elf_without_pvh_note_is_refused() {
    if !kvm_available("elf_without_pvh_note_is_refused") {
        return;
    }
    let dir = scratch("nopvh");
    let mut elf = tiny_pvh_kernel(&HALT_LOOP);
    // Turn the PT_NOTE program header into PT_NULL: no PVH entry left.
    elf[64 + 56..64 + 56 + 4].copy_from_slice(&0u32.to_le_bytes());
    let k = dir.join("nopvh.elf");
    std::fs::write(&k, elf).unwrap();
    assert_bad_input(&[k.to_str().unwrap()], "no PVH entry point");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn initrd_that_does_not_fit_after_the_kernel() {
    if !kvm_available("initrd_that_does_not_fit_after_the_kernel") {
        return;
    }
    // Smaller than RAM (passes the early check), larger than the room above the kernel.
    let dir = scratch("initrd-fit");
    // If the initrd wrongly loads, the guest powers off at once instead of hanging the test.
    let mut code = out_code(0x600, POWER_OFF_VALUE);
    code.extend(HALT_LOOP);
    let k = write_kernel(&dir, &code);
    let big = dir.join("big.cpio");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((64 << 20) - (1 << 20) - 16)
        .unwrap();
    assert_bad_input(
        &[
            "--memory",
            "64",
            "--initrd",
            big.to_str().unwrap(),
            k.to_str().unwrap(),
        ],
        "does not fit",
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn placement_flags() {
    let dir = scratch("placement");
    let k = write_kernel(&dir, &HALT_LOOP);
    let k = k.to_str().unwrap();
    assert_bad_input(&["--policy", "fastest", k], "--policy");
    assert_bad_input(&["--policy", "powersaving:3", k], "--policy");
    assert_bad_input(&["--host-topology", "3xx", k], "--host-topology");
    assert_bad_input(
        &[
            "--host-topology",
            dir.join("nope.topo").to_str().unwrap(),
            k,
        ],
        "--host-topology",
    );
    assert_bad_input(&["--host-topology", "1x2x1", "--cpus", "7", k], "--cpus 7");
    assert_bad_input(
        &["--host-topology", "1x2x1", "--cpus", "1-0", k],
        "--cpus 1-0",
    );
    assert_bad_input(&["--tick-ms", "1", k], "--tick-ms");
    assert_bad_input(&["--tick-ms", "soon", k], "--tick-ms");
    // More CPUs than any machine this runs on: pinning there would fail.
    assert_bad_input(&["--host-topology", "64x64x1", k], "may not run on");
    assert_bad_input(
        &["--stats", "/nonexistent-dir/stats.jsonl", k],
        "--stats /nonexistent-dir/stats.jsonl",
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn pvmm_carries_ctl_and_host_as_subcommands() {
    let out = pvmm(&["ctl", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("control socket"));
    let out = pvmm(&["host", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("runtime directory"));
    // Bad flags of either: one line, exit 2.
    for tool in ["ctl", "host"] {
        let out = pvmm(&[tool, "--frobnicate"]);
        assert_eq!(out.status.code(), Some(2), "{tool}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).lines().count(),
            1,
            "{tool}"
        );
    }
}
