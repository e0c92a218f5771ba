//! End-to-end tests in the QEMU-nested rig: L1 (QEMU TCG, emulated multi-socket AMD CPU with
//! SVM) runs pvmm on the Debian cloud kernel and the busybox initramfs.
//!
//! An L1 boot costs far more than a guest's, so the tests share boots, each test checking its
//! own VM's run of one (a [`SharedOutcome`]: the first test to ask boots L1, the others wait
//! for it and read the same outcome):
//!
//! - [`SIDE_BY_SIDE`], 2x2x1: pvmm (bzImage, 4 vCPUs) and QEMU (2 vCPUs) at the same time,
//!   the L1 probe beside each. `pvmm_4_vcpu_guest_reports_4_cpus_and_exits_0` checks pvmm's
//!   run, `rig_self_check_qemu_2_vcpus_with_l1_probe` QEMU's and its probe (the rig checked
//!   with QEMU as the inner VMM, so a pvmm failure can be told apart from a broken rig), and
//!   `two_vms_pvmm_and_qemu_side_by_side_report_apart` that the two are reported apart. The
//!   vCPU counts differ on purpose: each guest must see its own VM's.
//! - [`IN_TURN`], 2x2x2: pvmm booting the uncompressed kernel through PVH with 1 vCPU, then
//!   with 8, one after the other, so the 8-vCPU guest has L1's 8 CPUs to itself as it would
//!   in a boot of its own: `pvmm_1_vcpu_guest_boots_through_pvh_on_2x2x2` and
//!   `pvmm_8_vcpu_guest_boots_on_2x2x2`. pvmm's bzImage path is [`SIDE_BY_SIDE`]'s.
//! - `rig_timeout_kills_qemu_and_reports_it` and `rig_ends_a_run_when_l1_reports_a_soft_lockup`
//!   end their L1 by design, so each has a boot of its own; so does the ignored QEMU self-check
//!   on 2x2x2.
//!
//! Without QEMU or the images these tests skip loudly, or fail when PVMM_REQUIRE_RIG=1. A boot
//! takes tens of seconds; boots run one at a time.

use std::time::Duration;

use pvmm_rig::images::L1Needs;
use pvmm_rig::rig::EXIT_TIMEOUT;
use pvmm_rig::soak::{classify, BootKind};
use pvmm_rig::{InnerVmm, KernelForm, Rig, RigEnd, RigOutcome, RunLines, Topology, VmSpec};
use pvmm_tests::{boot_rig, l1_failed, prepare_rig, rig_lock, SharedOutcome};

/// How the guest's CPU report line starts; the VM's run label follows, then [`CPU_REPORT`]'s
/// output.
const CPU_REPORT_PREFIX: &str = "pvmm-rig-test: ";

/// The guest's online CPUs, two ways (for `echo`).
const CPU_REPORT: &str = "nproc $(nproc) online $(cat /sys/devices/system/cpu/online)";

/// Hard timeout per VM run of a boot: a 4-vCPU run takes about 15-25 s, an 8-vCPU run on a
/// 2x2x2 L1 about twice that, on an idle machine; CI machines are shared, so allow a wide
/// margin. A boot gets it once per VM ([`SharedBoot::timeout`]): runs in turn follow each
/// other, and runs side by side share L1's CPUs and the host's, so together they take about
/// as long as one after the other. A boot that hits it is a failure either way.
const RIG_TIMEOUT: Duration = Duration::from_secs(420);

/// The rig images a boot of `vmms` booting the kernel in `kernel` form needs.
fn needs(vmms: &[InnerVmm], kernel: KernelForm) -> L1Needs {
    L1Needs {
        pvmm: vmms.contains(&InnerVmm::Pvmm),
        qemu: vmms.contains(&InnerVmm::Qemu),
        vmlinux: kernel == KernelForm::Pvh,
        ..Default::default()
    }
}

/// One VM of a shared boot.
struct TestVm {
    /// Its run's label, which also tags its guest's CPU report: a word no guest prints
    /// otherwise, so finding it on another VM's console means the consoles mixed.
    label: &'static str,
    vmm: InnerVmm,
    vcpus: u32,
    memory_mib: u32,
}

impl TestVm {
    /// Its VMM's arguments and its guest's command, which prints its CPU report.
    /// pvmm gets `-v` on a PVH boot: its log then names the kernel's format.
    fn spec(&self, kernel: KernelForm) -> VmSpec {
        let mut args = vec![
            "--vcpus".to_string(),
            self.vcpus.to_string(),
            "--memory".to_string(),
            self.memory_mib.to_string(),
        ];
        if self.vmm == InnerVmm::Pvmm && kernel == KernelForm::Pvh {
            args.push("-v".into());
        }
        VmSpec {
            vmm: self.vmm,
            args,
            guest_command: Some(format!(
                "echo \"{CPU_REPORT_PREFIX}{} {CPU_REPORT}\"",
                self.label
            )),
        }
    }

    /// The CPU report its guest must print: all its vCPUs online.
    fn report(&self) -> String {
        let online = if self.vcpus == 1 {
            "0".to_string()
        } else {
            format!("0-{}", self.vcpus - 1)
        };
        format!(
            "{CPU_REPORT_PREFIX}{} nproc {} online {online}",
            self.label, self.vcpus
        )
    }
}

/// One L1 boot of several VMs, shared by the tests that check its runs.
struct SharedBoot {
    /// Its name in the rig's messages and dumps.
    name: &'static str,
    topology: &'static str,
    kernel: KernelForm,
    /// The VMs one after another instead of side by side.
    in_turn: bool,
    /// The L1 probe beside each VMM.
    probe: Option<&'static str>,
    vms: &'static [TestVm],
    outcome: SharedOutcome,
}

impl SharedBoot {
    /// The outcome, booting L1 for the first test that asks; None if the rig is unavailable
    /// (and not required). Rig failures are booted again ([`boot_rig`]).
    fn outcome(&'static self) -> Option<&'static RigOutcome> {
        self.outcome.get_or_boot(|| {
            let _lock = rig_lock();
            let vmms: Vec<InnerVmm> = self.vms.iter().map(|vm| vm.vmm).collect();
            let (ws, images) = prepare_rig(self.name, needs(&vmms, self.kernel))?;
            let specs: Vec<VmSpec> = self.vms.iter().map(|vm| vm.spec(self.kernel)).collect();
            let mut rig = Rig::with_vms(specs.clone())
                .run_labels(self.labels())
                .kernel(self.kernel)
                .topology(self.topology.parse::<Topology>().expect("valid topology"))
                .in_turn(self.in_turn)
                .timeout(self.timeout())
                .echo(true);
            if let Some(probe) = self.probe {
                rig = rig.l1_probe(probe);
            }
            Some(boot_rig(self.name, &ws, &images, &rig, &specs))
        })
    }

    fn labels(&self) -> Vec<String> {
        self.vms.iter().map(|vm| vm.label.to_string()).collect()
    }

    /// [`RIG_TIMEOUT`] for each of its runs.
    fn timeout(&self) -> Duration {
        RIG_TIMEOUT * u32::try_from(self.vms.len()).expect("a handful of VMs")
    }
}

/// pvmm's VM of [`SIDE_BY_SIDE`], with pvmm's default memory.
const PVMM_SIDE: TestVm = TestVm {
    label: "pvmm-side",
    vmm: InnerVmm::Pvmm,
    vcpus: 4,
    memory_mib: 512,
};

/// QEMU's VM of [`SIDE_BY_SIDE`]: fewer vCPUs than pvmm's, so each guest's count shows it
/// sees its own VM's, and less memory, which keeps L1's down.
const QEMU_SIDE: TestVm = TestVm {
    label: "qemu-side",
    vmm: InnerVmm::Qemu,
    vcpus: 2,
    memory_mib: 256,
};

/// pvmm and QEMU side by side on 2x2x1, each VM with its own vCPUs, memory and command, the
/// QEMU probe beside each VMM.
static SIDE_BY_SIDE: SharedBoot = SharedBoot {
    name: "rig_side_by_side",
    topology: "2x2x1",
    kernel: KernelForm::BzImage,
    in_turn: false,
    probe: Some(pvmm_tests::scripts::BOOT_QEMU_PROBE),
    vms: &[PVMM_SIDE, QEMU_SIDE],
    outcome: SharedOutcome::new(),
};

/// [`IN_TURN`]'s first VM.
const PVH_1_VCPU: TestVm = TestVm {
    label: "pvh-1-vcpu",
    vmm: InnerVmm::Pvmm,
    vcpus: 1,
    memory_mib: 512,
};

/// [`IN_TURN`]'s second VM: a vCPU for each of L1's CPUs.
const PVH_8_VCPUS: TestVm = TestVm {
    label: "pvh-8-vcpus",
    vmm: InnerVmm::Pvmm,
    vcpus: 8,
    memory_mib: 512,
};

/// pvmm through PVH on 2x2x2, one VM after the other.
static IN_TURN: SharedBoot = SharedBoot {
    name: "rig_pvh_in_turn",
    topology: "2x2x2",
    kernel: KernelForm::Pvh,
    in_turn: true,
    probe: None,
    vms: &[PVH_1_VCPU, PVH_8_VCPUS],
    outcome: SharedOutcome::new(),
};

/// [`QEMU_2X2X2`]'s VM.
const QEMU_8_VCPUS: TestVm = TestVm {
    label: "qemu-8-vcpus",
    vmm: InnerVmm::Qemu,
    vcpus: 8,
    memory_mib: 512,
};

/// QEMU alone with 8 vCPUs on 2x2x2, for the ignored self-check.
static QEMU_2X2X2: SharedBoot = SharedBoot {
    name: "rig_qemu_8_vcpus",
    topology: "2x2x2",
    kernel: KernelForm::BzImage,
    in_turn: false,
    probe: None,
    vms: &[QEMU_8_VCPUS],
    outcome: SharedOutcome::new(),
};

/// Checks `vm`'s run of `boot`: its guest printed its CPU report with all its vCPUs online,
/// and none of another VM's lines; it reached its power-off; its VMM exited 0; and on a PVH
/// boot pvmm says it booted the vmlinux through PVH. Returns the run's lines.
fn assert_run_booted<'a>(boot: &SharedBoot, outcome: &'a RigOutcome, vm: &TestVm) -> RunLines<'a> {
    let label = vm.label;
    let summary = || outcome.summary(vm.vmm.name());
    assert_ne!(outcome.end, RigEnd::TimedOut, "{}", summary());
    let run = outcome
        .run(label)
        .unwrap_or_else(|| panic!("VM {label} never started; {}", summary()));
    let tag = format!("{CPU_REPORT_PREFIX}{label} ");
    let report = run
        .guest
        .iter()
        .find(|l| l.starts_with(&tag))
        .unwrap_or_else(|| {
            panic!(
                "VM {label}'s guest never printed its CPU report; {}; its console:\n{}",
                summary(),
                run.guest.join("\n")
            )
        });
    assert_eq!(*report, vm.report(), "VM {label}");
    for other in boot.vms.iter().filter(|other| other.label != label) {
        assert!(
            !run.guest.iter().any(|l| l.contains(other.label)),
            "VM {label}'s console holds VM {}'s lines:\n{}",
            other.label,
            run.guest.join("\n")
        );
    }
    assert!(
        run.guest.iter().any(|l| l == "pvmm-guest: powering off"),
        "VM {label}'s guest did not reach its power-off"
    );
    assert_eq!(
        run.status,
        Some(0),
        "VM {label}; {}; its VMM's stderr:\n{}",
        summary(),
        run.vmm.join("\n")
    );
    if boot.kernel == KernelForm::Pvh && vm.vmm == InnerVmm::Pvmm {
        assert!(
            run.vmm
                .iter()
                .any(|l| l.contains("/guest/vmlinux (ElfPvh)")),
            "VM {label}: pvmm should say it boots the vmlinux through PVH; its stderr:\n{}",
            run.vmm.join("\n")
        );
    }
    run
}

/// The probe's line beside a VMM: the most QEMU vCPU threads it saw at once.
fn threads_seen(count: u32) -> String {
    format!("vcpu threads seen: {count}")
}

#[test]
fn pvmm_4_vcpu_guest_reports_4_cpus_and_exits_0() {
    if let Some(outcome) = SIDE_BY_SIDE.outcome() {
        assert_run_booted(&SIDE_BY_SIDE, outcome, &PVMM_SIDE);
    }
}

/// The uncompressed kernel (ELF vmlinux) through its PVH entry: pvmm's other boot path (the
/// PVH check is [`assert_run_booted`]'s on this boot).
#[test]
fn pvmm_1_vcpu_guest_boots_through_pvh_on_2x2x2() {
    if let Some(outcome) = IN_TURN.outcome() {
        assert_run_booted(&IN_TURN, outcome, &PVH_1_VCPU);
    }
}

#[test]
fn pvmm_8_vcpu_guest_boots_on_2x2x2() {
    if let Some(outcome) = IN_TURN.outcome() {
        assert_run_booted(&IN_TURN, outcome, &PVH_8_VCPUS);
    }
}

/// The rig itself, with QEMU as the inner VMM, including an L1 probe that sees the VMM's
/// threads while it runs (what the placement tests build on). The probe beside pvmm, whose
/// vCPU threads are named `vcpuN`, counts none: each run's probe watches its own VMM, not the
/// QEMU running at the same time.
#[test]
fn rig_self_check_qemu_2_vcpus_with_l1_probe() {
    let Some(outcome) = SIDE_BY_SIDE.outcome() else {
        return;
    };
    let qemu = assert_run_booted(&SIDE_BY_SIDE, outcome, &QEMU_SIDE);
    assert!(
        qemu.probe.contains(&threads_seen(QEMU_SIDE.vcpus)),
        "the probe beside QEMU: {:?}",
        qemu.probe
    );
    assert!(outcome.boot_to_init_seconds(QEMU_SIDE.label).is_some());
    let pvmm = outcome.run(PVMM_SIDE.label).expect("pvmm's run started");
    assert_eq!(
        pvmm.probe,
        [threads_seen(0)],
        "the probe beside pvmm: {:?}",
        pvmm.probe
    );
}

/// The rig on the 2x2x2 topology with QEMU (slow; run with --ignored to check the rig).
#[test]
#[ignore = "rig self-check, about a minute; run with --ignored"]
fn rig_self_check_qemu_8_vcpus_on_2x2x2() {
    if let Some(outcome) = QEMU_2X2X2.outcome() {
        assert_run_booted(&QEMU_2X2X2, outcome, &QEMU_8_VCPUS);
    }
}

/// Two VMs side by side in one L1, pvmm and QEMU, each with its own vCPUs, memory and
/// command: each one's console, exit status and boot time are reported apart.
#[test]
fn two_vms_pvmm_and_qemu_side_by_side_report_apart() {
    let Some(outcome) = SIDE_BY_SIDE.outcome() else {
        return;
    };
    let vms: Vec<VmSpec> = SIDE_BY_SIDE
        .vms
        .iter()
        .map(|vm| vm.spec(SIDE_BY_SIDE.kernel))
        .collect();
    let labels = SIDE_BY_SIDE.labels();
    assert_eq!(
        classify(outcome, &vms, &labels).0,
        BootKind::Clean,
        "{}",
        outcome.summary("pvmm")
    );
    // Both ran, under their own labels, and nothing else did.
    let mut started: Vec<&str> = outcome
        .events_of("vmm-start")
        .map(|e| e.label.as_str())
        .collect();
    started.sort_unstable();
    assert_eq!(started, ["pvmm-side", "qemu-side"]);
    for vm in SIDE_BY_SIDE.vms {
        let run = assert_run_booted(&SIDE_BY_SIDE, outcome, vm);
        let label = vm.label;
        assert_eq!(run.command_output(), [vm.report().as_str()], "VM {label}");
        assert_eq!(
            (run.status, run.command_status()),
            (Some(0), Some(0)),
            "VM {label}"
        );
        assert!(outcome.boot_to_init_seconds(label).is_some(), "VM {label}");
    }
    // QEMU's stderr holds none of pvmm's.
    let qemu = outcome.run(QEMU_SIDE.label).expect("QEMU's run started");
    assert!(
        qemu.vmm.iter().all(|l| !l.contains("pvmm:")),
        "{:?}",
        qemu.vmm
    );
    assert_eq!(outcome.vmm_status, Some(0));
}

/// The rig's hard timeout kills QEMU and says so: an L1 given one second cannot finish.
#[test]
fn rig_timeout_kills_qemu_and_reports_it() {
    let _lock = rig_lock();
    let Some((ws, images)) =
        prepare_rig("rig_timeout", needs(&[InnerVmm::Qemu], KernelForm::BzImage))
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
    let Some((ws, images)) = prepare_rig(
        "rig_l1_lockup",
        needs(&[InnerVmm::Pvmm], KernelForm::BzImage),
    ) else {
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
