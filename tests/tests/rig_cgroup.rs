//! The host daemon keeps a VM inside its cgroup v2 cpuset, in the rig: L1 (2 packages x 2
//! cores) mounts cgroup2 with the cpuset controller and puts a 4-vCPU pvmm VM in a cgroup whose
//! cpuset is package 0 only, while `pvmm host` runs outside it under the performance policy,
//! which would spread the VM's four busy vCPUs over both packages. Read from L1's `/proc`, no
//! thread of the VM is ever allowed or run outside the cpuset, and the daemon places every vCPU
//! inside it without a refused affinity change (the kernel refuses one outside the cpuset).

use pvmm_api::stats::HostStatus;
use pvmm_rig::images::L1Needs;
use pvmm_rig::{InnerVmm, Rig, RigOutcome, VmSpec};
use pvmm_tests::{boot_rig, exit_report, prepare_rig, rig_lock, scripts, CpuSet, SharedOutcome};

/// The cgroup the VM runs in.
const CGROUP: &str = "vms";
/// Its cpuset: L1's package 0.
const CPUS: &str = "0-1";
/// Where the VM's control socket and the daemon's files are.
const RUNTIME_DIR: &str = "/tmp/pvmm-rt";
/// Seconds the guest keeps every vCPU busy.
const LOAD_SECS: u32 = 30;
/// Seconds into the load the daemon's status is taken: the VM has joined and been placed.
const STATUS_AFTER_SECS: u32 = 15;
/// The run's limit: a boot and the load, several times over on a loaded machine.
const RIG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(360);

static OUTCOME: SharedOutcome = SharedOutcome::new();

fn outcome() -> Option<&'static RigOutcome> {
    OUTCOME.get_or_boot(|| {
        let test = "rig_cgroup";
        let _lock = rig_lock();
        let needs = L1Needs {
            pvmm: true,
            ..Default::default()
        };
        let (ws, images) = prepare_rig(test, needs)?;
        let socket = format!("{RUNTIME_DIR}/vm0.sock");
        let vms = vec![VmSpec {
            vmm: InnerVmm::Pvmm,
            // pvmm refuses host CPUs it may not run on: its own are the cpuset's.
            args: [
                "--vcpus",
                "4",
                "--memory",
                "256",
                "--cpus",
                CPUS,
                "--api-socket",
                &socket,
            ]
            .map(String::from)
            .to_vec(),
            guest_command: Some(pvmm_rig::scripts::guest_command(
                &[("LOAD_SECS", &LOAD_SECS.to_string())],
                &[scripts::CGROUP_GUEST],
            )),
        }];
        let vars = [
            ("CGROUP", CGROUP),
            ("CPUS", CPUS),
            ("RUNTIME_DIR", RUNTIME_DIR),
        ];
        let status_after = STATUS_AFTER_SECS.to_string();
        let mut probe_vars = vars.to_vec();
        probe_vars.push(("STATUS_AFTER_SECS", &status_after));
        let rig = Rig::with_vms(vms.clone())
            .quiet(true)
            .l1_setup(pvmm_rig::scripts::assemble(&vars, &[scripts::CGROUP_SETUP]))
            .l1_probe(pvmm_rig::scripts::assemble(
                &probe_vars,
                &[scripts::CGROUP_PROBE],
            ))
            .timeout(RIG_TIMEOUT)
            .echo(std::env::var_os("PVMM_RIG_ECHO").is_some());
        Some(boot_rig(test, &ws, &images, &rig, &vms))
    })
}

/// The run's probe lines, after checking the VM ran its load to the end.
fn probe(outcome: &RigOutcome) -> &[String] {
    let run = outcome
        .run(pvmm_rig::rig::SINGLE_RUN_LABEL)
        .unwrap_or_else(|| panic!("the VM never started: {}", outcome.summary("pvmm")));
    assert_eq!(
        (run.status, run.command_status()),
        (Some(0), Some(0)),
        "the VM did not finish: {}",
        exit_report(outcome, &run)
    );
    run.probe
}

fn cpuset() -> CpuSet {
    CPUS.parse().expect("a CPU list")
}

#[test]
fn the_vm_runs_in_a_cgroup_v2_cpuset_of_one_package() {
    let Some(outcome) = outcome() else {
        return;
    };
    let probe = probe(outcome);
    let setup: Vec<&String> = probe.iter().filter(|l| l.starts_with("SETUP ")).collect();
    assert!(setup.is_empty(), "the cgroup setup failed: {setup:?}");
    let line = probe
        .iter()
        .find_map(|l| l.strip_prefix("CGROUP "))
        .unwrap_or_else(|| panic!("no CGROUP line: {probe:?}"));
    assert_eq!(
        line,
        format!("0::/{CGROUP} {CPUS}"),
        "cgroup v2 and its cpuset"
    );
}

#[test]
fn no_thread_is_ever_allowed_or_run_outside_the_cpuset() {
    let Some(outcome) = outcome() else {
        return;
    };
    let probe = probe(outcome);
    let allowed = cpuset();
    let samples: Vec<Vec<&str>> = probe
        .iter()
        .filter_map(|l| l.strip_prefix("T "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    for vcpu in ["vcpu0", "vcpu1", "vcpu2", "vcpu3"] {
        assert!(
            samples.iter().any(|s| s[0] == vcpu),
            "L1 never saw {vcpu}: {samples:?}"
        );
    }
    for sample in &samples {
        let [name, cpus, last] = sample[..] else {
            panic!("a bad sample: {sample:?}");
        };
        let cpus: CpuSet = cpus.parse().expect("a CPU list");
        assert!(
            cpus.iter().all(|c| allowed.contains(c)),
            "{name} allowed {cpus} outside {allowed}"
        );
        let last: u32 = last.parse().expect("a CPU number");
        assert!(allowed.contains(last), "{name} ran on CPU {last}");
    }
}

#[test]
fn the_daemon_places_every_vcpu_inside_the_cpuset_without_a_refusal() {
    let Some(outcome) = outcome() else {
        return;
    };
    let probe = probe(outcome);
    let json = probe
        .iter()
        .find_map(|l| l.strip_prefix("STATUS "))
        .unwrap_or_else(|| panic!("no STATUS line: {probe:?}"));
    let status: HostStatus = serde_json::from_str(json).expect("the daemon's status");
    assert_eq!(status.apply_errors, 0, "{status:?}");
    let vm = status
        .vm("vm0")
        .unwrap_or_else(|| panic!("the VM did not join the daemon: {status:?}"));
    assert_eq!(vm.vcpus.len(), 4, "{vm:?}");
    let allowed = cpuset();
    for v in &vm.vcpus {
        let cpus = v
            .cpus
            .as_ref()
            .unwrap_or_else(|| panic!("vCPU {} unplaced: {status:?}", v.vcpu));
        assert!(
            cpus.iter().all(|c| allowed.contains(c)),
            "vCPU {} placed on {cpus}: {status:?}",
            v.vcpu
        );
    }
}
