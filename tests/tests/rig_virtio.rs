//! pvmm's virtio devices under a real Linux guest in the rig: two pvmm VMs side by side in one
//! L1 boot, each booting from its own root disk (`--root-disk`: an ext4 image of the guest's
//! userland, `root=/dev/vda`) with a tap network to L1 (`--tap`), everything checked where it
//! really is: the image from L1 with e2fsprogs after pvmm is gone, the network by checksums at
//! both ends, the threads' seccomp mode from L1's `/proc`.
//!
//! - VM 0 (also a read-only second disk and `--rng`): reads entropy from virtio-rng; fails to
//!   write the read-only disk both through the kernel and past the kernel's read-only flag
//!   (the device refuses), and the image is unchanged; pings L1 and moves [`NET_BYTES`] each
//!   way over TCP (busybox nc) with the same checksum at both ends; writes a file, syncs and
//!   powers off: L1 reads the file back from the image, which e2fsck finds clean. Every pvmm
//!   thread L1 saw, the device threads included, ran under its seccomp filter (mode 2).
//! - VM 1: writes a file and syncs (a flush), then L1 kills its pvmm with SIGKILL: after a
//!   journal replay the file is in the image.

use pvmm_rig::rig::tap_network;
use pvmm_rig::{InnerVmm, Rig, RigOutcome, RunLines, VmSpec};
use pvmm_tests::{boot_rig, exit_report, prepare_rig, rig_lock, scripts, SharedOutcome};

/// Bytes moved each way over TCP: the 64 MiB, many times every buffer on the way (the
/// virtqueues, the tap's queue, the sockets').
const NET_BYTES: u64 = 64 << 20;
/// The read-only disk's size: a few requests' worth.
const RO_BYTES: u64 = 1 << 20;
/// What VM 0's guest writes to its root disk before powering off.
const WRITTEN: &str = "written by guest 0 before its poweroff";
/// What VM 1's guest writes and flushes before its pvmm is killed.
const FLUSHED: &str = "flushed by guest 1 before SIGKILL";
/// pvmm's exit status when L1 kills it with SIGKILL (the shell's 128 + 9).
const KILLED_STATUS: i32 = 137;
/// md5 of nothing: what a checksum of a stream that never came reads.
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";
/// Hard limit of the boot: two guests booting, 128 MiB through the nested network and a
/// CI machine several times slower than an idle one.
const RIG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn vms() -> Vec<VmSpec> {
    let gateway = tap_network(0).l1;
    let bytes = NET_BYTES.to_string();
    let main = pvmm_rig::scripts::guest_command(
        &[("GW", &gateway), ("BYTES", &bytes), ("DATA", WRITTEN)],
        &[scripts::VIRTIO_GUEST],
    );
    let kill =
        pvmm_rig::scripts::guest_command(&[("DATA", FLUSHED)], &[scripts::VIRTIO_KILL_GUEST]);
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect();
    vec![
        VmSpec {
            vmm: InnerVmm::Pvmm,
            args: args(&[
                "--vcpus",
                "2",
                "--memory",
                "256",
                "--rng",
                "--disk",
                "/tmp/rig-ro.img,readonly=on",
            ]),
            guest_command: Some(main),
        },
        VmSpec {
            vmm: InnerVmm::Pvmm,
            args: args(&["--vcpus", "1", "--memory", "192"]),
            guest_command: Some(kill),
        },
    ]
}

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        let test = "rig_virtio";
        let _lock = rig_lock();
        let needs = pvmm_rig::images::L1Needs {
            pvmm: true,
            root_disk: true,
            ..Default::default()
        };
        let (ws, images) = prepare_rig(test, needs)?;
        let vms = vms();
        let probe = pvmm_rig::scripts::assemble(
            &[
                ("BYTES", &NET_BYTES.to_string()),
                ("GUEST", &tap_network(0).guest),
            ],
            &[scripts::VIRTIO_PROBE],
        );
        let setup = pvmm_rig::scripts::assemble(
            &[("RO_BYTES", &RO_BYTES.to_string())],
            &[scripts::VIRTIO_SETUP],
        );
        // Quiet guests: their kernels' boot logs would cost two nested boots many UART exits.
        let rig = Rig::with_vms(vms.clone())
            .quiet(true)
            .root_disk(true)
            .tap(true)
            .l1_setup(setup)
            .l1_probe(probe)
            .timeout(RIG_TIMEOUT)
            .echo(std::env::var_os("PVMM_RIG_ECHO").is_some());
        // VM 1 ends killed by design: only VM 0's end tells a rig failure worth a new boot.
        Some(boot_rig(test, &ws, &images, &rig, &vms[..1]))
    })
}

/// VM `label`'s lines.
fn run<'a>(outcome: &'a RigOutcome, label: &str) -> RunLines<'a> {
    outcome
        .run(label)
        .unwrap_or_else(|| panic!("VM {label} never started: {}", outcome.summary("pvmm")))
}

/// The rest of the first line of `lines` that starts with `prefix` and a space.
fn value<'a>(lines: &'a [String], prefix: &str) -> Option<&'a str> {
    let prefix = format!("{prefix} ");
    lines.iter().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// Like [`value`], failing with everything `lines` hold when it is not there.
fn expect<'a>(lines: &'a [String], prefix: &str, whose: &str) -> &'a str {
    value(lines, prefix)
        .unwrap_or_else(|| panic!("no '{prefix}' line from the {whose}:\n{}", lines.join("\n")))
}

/// The md5 in a `md5sum` output line (`HASH  -`).
fn md5(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or("")
}

/// VM 0 ran its command to the end and exited 0.
fn main_run(outcome: &RigOutcome) -> RunLines<'_> {
    let run = run(outcome, "0");
    assert_eq!(
        (run.status, run.command_status()),
        (Some(0), Some(0)),
        "VM 0 did not finish: {}",
        exit_report(outcome, &run)
    );
    run
}

#[test]
fn the_guest_boots_from_its_disk_and_its_data_is_in_the_image() {
    let Some(outcome) = outcome() else {
        return;
    };
    let run = main_run(outcome);
    assert_eq!(expect(run.guest, "ROOT", "guest"), "/dev/vda ext4");
    assert_eq!(
        expect(run.guest, "DISK written", "guest"),
        "0",
        "remount read-only"
    );
    assert_eq!(
        expect(run.probe, "FSCK", "L1 probe"),
        "0",
        "e2fsck -fn: clean"
    );
    assert_eq!(expect(run.probe, "READ", "L1 probe"), WRITTEN);
}

#[test]
fn a_read_only_disk_refuses_writes_and_stays_unchanged() {
    let Some(outcome) = outcome() else {
        return;
    };
    let run = main_run(outcome);
    assert_eq!(expect(run.guest, "RO", "guest"), format!("1 {RO_BYTES}"));
    for write in ["RO kernel-write", "RO device-write"] {
        assert!(
            value(run.guest, write).is_none(),
            "{write} went through:\n{}",
            run.guest.join("\n")
        );
    }
    let before = md5(expect(run.probe, "RO before", "L1 probe"));
    assert_eq!(md5(expect(run.probe, "RO after", "L1 probe")), before);
    assert_eq!(
        md5(expect(run.guest, "RO sum", "guest")),
        before,
        "what the guest read"
    );
}

#[test]
fn the_guest_reaches_l1_and_moves_data_both_ways_intact() {
    let Some(outcome) = outcome() else {
        return;
    };
    let run = main_run(outcome);
    let ping = expect(run.guest, "PING", "guest");
    assert!(ping.contains(" 0% packet loss"), "{ping}");
    let guest_sent = md5(expect(run.guest, "NET tx", "guest"));
    assert_ne!(guest_sent, EMPTY_MD5, "the guest sent nothing");
    assert_eq!(md5(expect(run.probe, "NET rx", "L1 probe")), guest_sent);
    let l1_sent = md5(expect(run.probe, "NET tx", "L1 probe"));
    assert_ne!(l1_sent, EMPTY_MD5, "L1 sent nothing");
    assert_eq!(md5(expect(run.guest, "NET rx", "guest")), l1_sent);
}

#[test]
fn virtio_rng_feeds_the_guest() {
    let Some(outcome) = outcome() else {
        return;
    };
    let run = main_run(outcome);
    assert_eq!(expect(run.guest, "RNG", "guest"), "virtio_rng.0 64");
}

#[test]
fn every_pvmm_thread_with_the_device_threads_runs_under_seccomp() {
    let Some(outcome) = outcome() else {
        return;
    };
    let run = main_run(outcome);
    let threads: Vec<(&str, &str)> = run
        .probe
        .iter()
        .filter_map(|l| l.strip_prefix("THREAD "))
        .filter_map(|l| l.rsplit_once(' '))
        .collect();
    for device in ["pvmm-blk0", "pvmm-blk1", "pvmm-net0", "pvmm-rng0"] {
        assert!(
            threads.iter().any(|(name, _)| *name == device),
            "L1 never saw {device}: {threads:?}"
        );
    }
    // A thread installs its filter as it starts: a sample may catch it just before.
    let unfiltered: Vec<&str> = threads
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !threads.contains(&(name, "2")))
        .collect();
    assert!(
        unfiltered.is_empty(),
        "threads never seen in seccomp mode 2: {unfiltered:?}; every line seen: {threads:?}"
    );
}

#[test]
fn data_flushed_before_sigkill_is_in_the_image() {
    let Some(outcome) = outcome() else {
        return;
    };
    let run = run(outcome, "1");
    assert_eq!(
        run.status,
        Some(KILLED_STATUS),
        "{}",
        exit_report(outcome, &run)
    );
    let fsck: i32 = expect(run.probe, "FSCK", "L1 probe").parse().unwrap_or(-1);
    // 0: clean, 1: errors corrected (the journal replayed).
    assert!((0..=1).contains(&fsck), "e2fsck -fy exited {fsck}");
    assert_eq!(expect(run.probe, "READ", "L1 probe"), FLUSHED);
}
