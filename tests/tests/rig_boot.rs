//! End-to-end tests in the QEMU-nested rig: L1 (QEMU TCG, emulated multi-socket AMD CPU with
//! SVM) runs pvmm on the Debian cloud kernel and the busybox initramfs.
//!
//! The QEMU-as-inner-VMM tests check the rig itself, so a pvmm failure can be told apart from
//! a broken rig. Without QEMU or the images these tests skip loudly, or fail when
//! PVMM_REQUIRE_RIG=1. They take tens of seconds each; they run one at a time.

use std::time::Duration;

use pvmm_rig::images::L1Needs;
use pvmm_rig::rig::EXIT_TIMEOUT;
use pvmm_rig::soak::{classify, BootKind};
use pvmm_rig::{InnerVmm, KernelForm, Rig, RigEnd, RigOutcome, Topology, VmSpec};
use pvmm_tests::{l1_failed, prepare_rig, retry_boots, rig_lock};

/// How the guest's CPU report line starts.
const CPU_REPORT_PREFIX: &str = "pvmm-rig-test: ";

/// Guest command: report the online CPUs two ways.
const CPU_REPORT: &str =
    "echo \"pvmm-rig-test: nproc $(nproc) online $(cat /sys/devices/system/cpu/online)\"";

/// Hard timeout per rig run. A 4-vCPU run takes about 15-25 s, an 8-vCPU run on a 2x2x2 L1
/// about twice that, on an idle machine; CI machines are shared, so allow a wide margin. A run
/// that hits it is a failure either way.
const RIG_TIMEOUT: Duration = Duration::from_secs(420);

fn needs(vmm: InnerVmm, kernel: KernelForm) -> L1Needs {
    L1Needs {
        pvmm: vmm == InnerVmm::Pvmm,
        qemu: vmm == InnerVmm::Qemu,
        vmlinux: kernel == KernelForm::Pvh,
        ..Default::default()
    }
}

/// pvmm's arguments: `vcpus`, and `-v` for a PVH boot, whose log names the kernel's format.
fn pvmm_args(kernel: KernelForm, vcpus: u32) -> Vec<String> {
    let mut args = vec!["--vcpus".to_string(), vcpus.to_string()];
    if kernel == KernelForm::Pvh {
        args.push("-v".into());
    }
    args
}

/// Boots a `vcpus`-vCPU guest under `vmm` on an L1 of `topology`, from the kernel in `kernel`
/// form; None if the rig is unavailable (and not required).
fn boot(
    test: &str,
    (vmm, kernel): (InnerVmm, KernelForm),
    topology: &str,
    vcpus: u32,
    probe: Option<&str>,
) -> Option<RigOutcome> {
    let _lock = rig_lock();
    let (ws, images) = prepare_rig(test, needs(vmm, kernel))?;
    let topology: Topology = topology.parse().expect("valid topology");
    let mut rig = Rig::new(vmm)
        .kernel(kernel)
        .topology(topology)
        .timeout(RIG_TIMEOUT)
        .guest_command(CPU_REPORT)
        .pvmm_args(pvmm_args(kernel, vcpus))
        .echo(true);
    if let Some(probe) = probe {
        rig = rig.l1_probe(probe);
    }
    let outcome = retry_boots(
        test,
        || {
            let outcome = rig.run(&ws, &images)?;
            eprintln!("{test}: {}", outcome.summary(vmm.name()));
            Ok::<_, pvmm_rig::RigError>(outcome)
        },
        |outcome| classify(outcome, &[VmSpec::new(vmm)], &rig.labels()),
    )
    .expect("the rig runs");
    Some(outcome)
}

/// Checks that the guest saw `vcpus` online CPUs and the VMM exited 0 after the guest's
/// power-off.
fn assert_booted_with(outcome: &RigOutcome, vmm: InnerVmm, vcpus: u32) {
    assert_ne!(
        outcome.end,
        RigEnd::TimedOut,
        "{}",
        outcome.summary(vmm.name())
    );
    let report = outcome
        .guest_lines
        .iter()
        .find_map(|l| l.strip_prefix(CPU_REPORT_PREFIX))
        .unwrap_or_else(|| {
            panic!(
                "the guest never printed its CPU report; {}",
                outcome.summary(vmm.name())
            )
        });
    let expected_online = if vcpus == 1 {
        "0".to_string()
    } else {
        format!("0-{}", vcpus - 1)
    };
    assert_eq!(report, format!("nproc {vcpus} online {expected_online}"));
    assert!(
        outcome
            .guest_lines
            .iter()
            .any(|l| l == "pvmm-guest: powering off"),
        "the guest did not reach its power-off"
    );
    assert_eq!(
        outcome.vmm_status,
        Some(0),
        "{}",
        outcome.summary(vmm.name())
    );
}

const PVMM_BZIMAGE: (InnerVmm, KernelForm) = (InnerVmm::Pvmm, KernelForm::BzImage);

#[test]
fn pvmm_4_vcpu_guest_reports_4_cpus_and_exits_0() {
    if let Some(outcome) = boot("pvmm_4_vcpu", PVMM_BZIMAGE, "2x2x1", 4, None) {
        assert_booted_with(&outcome, InnerVmm::Pvmm, 4);
    }
}

/// The uncompressed kernel (ELF vmlinux) through its PVH entry: pvmm's other boot path.
#[test]
fn pvmm_1_vcpu_guest_boots_through_pvh_on_2x2x2() {
    let pvh = (InnerVmm::Pvmm, KernelForm::Pvh);
    if let Some(outcome) = boot("pvmm_1_vcpu_pvh", pvh, "2x2x2", 1, None) {
        assert_booted_with(&outcome, InnerVmm::Pvmm, 1);
        assert!(
            outcome
                .vmm_lines
                .iter()
                .any(|l| l.contains("/guest/vmlinux (ElfPvh)")),
            "pvmm should say it boots the vmlinux through PVH; its stderr:\n{}",
            outcome.vmm_lines.join("\n")
        );
    }
}

#[test]
fn pvmm_8_vcpu_guest_boots_on_2x2x2() {
    if let Some(outcome) = boot("pvmm_8_vcpu", PVMM_BZIMAGE, "2x2x2", 8, None) {
        assert_booted_with(&outcome, InnerVmm::Pvmm, 8);
    }
}

/// The rig itself, with QEMU as the inner VMM, including an L1 probe that sees the VMM's
/// threads while it runs (what the placement tests build on).
#[test]
fn rig_self_check_qemu_4_vcpus_with_l1_probe() {
    let probe = pvmm_tests::scripts::BOOT_QEMU_PROBE;
    if let Some(outcome) = boot(
        "qemu_4_vcpu",
        (InnerVmm::Qemu, KernelForm::BzImage),
        "2x2x1",
        4,
        Some(probe),
    ) {
        assert_booted_with(&outcome, InnerVmm::Qemu, 4);
        assert!(
            outcome
                .probe_lines
                .iter()
                .any(|l| l == "vcpu threads seen: 4"),
            "probe output: {:?}",
            outcome.probe_lines
        );
        assert!(outcome.boot_to_init_seconds("main").is_some());
    }
}

/// The rig on the 2x2x2 topology with QEMU (slow; run with --ignored to check the rig).
#[test]
#[ignore = "rig self-check, about a minute; run with --ignored"]
fn rig_self_check_qemu_8_vcpus_on_2x2x2() {
    if let Some(outcome) = boot(
        "qemu_8_vcpu",
        (InnerVmm::Qemu, KernelForm::BzImage),
        "2x2x2",
        8,
        None,
    ) {
        assert_booted_with(&outcome, InnerVmm::Qemu, 8);
    }
}

/// Two VMs side by side in one L1, pvmm and QEMU, each with its own vCPUs, memory and
/// command: each one's console, exit status and boot time are reported apart.
#[test]
fn two_vms_pvmm_and_qemu_side_by_side_report_apart() {
    let _lock = rig_lock();
    let needs = L1Needs {
        pvmm: true,
        qemu: true,
        vmlinux: false,
        ..Default::default()
    };
    let Some((ws, images)) = prepare_rig("rig_two_vms", needs) else {
        return;
    };
    let vm = |vmm, vcpus: &str, command: &str| VmSpec {
        vmm,
        args: ["--vcpus", vcpus, "--memory", "256"]
            .map(String::from)
            .to_vec(),
        guest_command: Some(format!("echo \"{CPU_REPORT_PREFIX}{command} $(nproc)\"")),
    };
    let vms = vec![
        vm(InnerVmm::Pvmm, "1", "pvmm-side"),
        vm(InnerVmm::Qemu, "2", "qemu-side"),
    ];
    let rig = Rig::with_vms(vms.clone()).timeout(RIG_TIMEOUT).echo(true);
    let labels = rig.labels();
    assert_eq!(labels, ["0", "1"]);
    let outcome = retry_boots(
        "rig_two_vms",
        || rig.run(&ws, &images),
        |outcome| classify(outcome, &vms, &labels),
    )
    .expect("the rig runs");
    assert_eq!(
        classify(&outcome, &vms, &labels).0,
        BootKind::Clean,
        "{}",
        outcome.summary("pvmm")
    );
    for (label, expected) in [("0", "pvmm-side 1"), ("1", "qemu-side 2")] {
        let run = outcome.run(label).expect("the run started");
        let report = format!("{CPU_REPORT_PREFIX}{expected}");
        assert_eq!(run.command_output(), [report.as_str()], "VM {label}");
        assert_eq!((run.status, run.command_status()), (Some(0), Some(0)));
        assert!(outcome.boot_to_init_seconds(label).is_some());
        // Each VM's console holds only its own guest's lines.
        let other = if label == "0" {
            "qemu-side"
        } else {
            "pvmm-side"
        };
        assert!(!run.guest.iter().any(|l| l.contains(other)), "VM {label}");
    }
    assert!(outcome
        .run("1")
        .is_some_and(|r| r.vmm.iter().all(|l| !l.contains("pvmm:"))));
    assert_eq!(outcome.vmm_status, Some(0));
}

/// The rig's hard timeout kills QEMU and says so: an L1 given one second cannot finish.
#[test]
fn rig_timeout_kills_qemu_and_reports_it() {
    let _lock = rig_lock();
    let Some((ws, images)) = prepare_rig("rig_timeout", needs(InnerVmm::Qemu, KernelForm::BzImage))
    else {
        return;
    };
    let outcome = Rig::new(InnerVmm::Qemu)
        .timeout(Duration::from_secs(1))
        .guest_command("sleep 1000")
        .run(&ws, &images)
        .expect("the rig runs");
    assert_eq!(outcome.end, RigEnd::TimedOut);
    assert_eq!(outcome.exit_code(), EXIT_TIMEOUT);
    assert!(outcome.summary("qemu-kvm").starts_with("TIMEOUT"));
    assert_eq!(outcome.vmm_status, None);
    assert!(outcome.qemu_status.is_none(), "QEMU was killed, not exited");
}

/// The rig ends a run as soon as L1's kernel reports a CPU stuck for
/// [`pvmm_rig::rig::L1_LOCKUP_LIMIT`] or longer, instead of waiting for its time limit. The
/// report is written to L1's kernel log from the probe at an emergency level, so it reaches L1's
/// console like the watchdog's own; the guest would sleep far past the time limit.
#[test]
fn rig_ends_a_run_when_l1_reports_a_soft_lockup() {
    let _lock = rig_lock();
    let Some((ws, images)) =
        prepare_rig("rig_l1_lockup", needs(InnerVmm::Pvmm, KernelForm::BzImage))
    else {
        return;
    };
    let stuck = pvmm_rig::rig::L1_LOCKUP_LIMIT.as_secs() + 3;
    let probe = pvmm_rig::scripts::assemble(
        &[("STUCK", &stuck.to_string())],
        &[pvmm_tests::scripts::BOOT_LOCKUP_PROBE],
    );
    let outcome = Rig::new(InnerVmm::Pvmm)
        .timeout(RIG_TIMEOUT)
        .guest_command("sleep 1000")
        .l1_probe(&probe)
        .run(&ws, &images)
        .expect("the rig runs");
    assert_eq!(outcome.end, RigEnd::L1Lockup, "{}", outcome.summary("pvmm"));
    assert_eq!(outcome.exit_code(), pvmm_rig::rig::EXIT_RIG_FAILURE);
    let summary = outcome.summary("pvmm");
    assert!(
        summary.starts_with("L1 LOCKUP") && summary.contains(&format!("stuck for {stuck}s")),
        "{summary}"
    );
    assert!(l1_failed(&outcome));
    assert!(outcome.qemu_status.is_none(), "QEMU was killed, not exited");
}
