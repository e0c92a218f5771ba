//! The [`Rig`] builder: one or more VMs side by side in one L1 boot.

use std::time::Duration;

use super::{
    guest_cmdline, inner_vmm_command, run_l1, vm_shape, with_params, InnerVmm, KernelForm, L1Job,
    L1Options, RigError, RigOutcome, Topology, VmSpec,
};
use crate::guest_kernel::GuestKernel;
use crate::images::L1Images;
use crate::inside;
use crate::root_disk::ROOT_DISK_MIB;
use crate::scripts::shell_join;
use crate::sequence::valid_label;
use crate::tuning::L1Tuning;
use crate::workspace::Workspace;

/// Default hard timeout of a rig run: L1 boots in about 5 s and a 4-vCPU guest in about 10 s
/// more on an idle machine; our machines are shared and noisy, so allow 20x that.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A rig run of one or more VMs at the same time in one L1 boot: the builder behind
/// `cargo xtask rig`.
///
/// ```no_run
/// use pvmm_rig::{images, Rig, InnerVmm};
/// let ws = pvmm_rig::workspace::Workspace::locate()?;
/// let l1 = images::build_l1(&ws, images::L1Needs { pvmm: true, ..Default::default() })?;
/// let outcome = Rig::new(InnerVmm::Pvmm)
///     .guest_command("nproc")
///     .pvmm_args(["--vcpus", "4"])
///     .run(&ws, &l1)?;
/// assert_eq!(outcome.vmm_status, Some(0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// With several VMs ([`Rig::with_vms`]) run `i` (from 0) is labelled `i` (unless
/// [`Rig::run_labels`] names them): its lines are in
/// [`RigOutcome::run`]`("i")` and shown as `[guest i]`, `[pvmm i]` (without the space), and
/// [`RigOutcome::vmm_status`] is the first non-zero VM status, 0 when all exited 0, None when
/// one never reported.
#[derive(Debug, Clone)]
pub struct Rig {
    vms: Vec<VmSpec>,
    topology: Topology,
    timeout: Duration,
    probe: Option<String>,
    echo: bool,
    progress: bool,
    tuning: L1Tuning,
    kernel: KernelForm,
    guest_kernel: GuestKernel,
    quiet: bool,
    root_disk: bool,
    tap: bool,
    setup: Option<String>,
    in_turn: bool,
    console_input: bool,
    l1_extra_mib: u64,
    labels: Option<Vec<String>>,
}

/// The label of the only run of a one-VM rig.
pub const SINGLE_RUN_LABEL: &str = "main";

impl Rig {
    /// A rig with the default topology (2x2x1), timeout and tuning, running one VM of `vmm`.
    pub fn new(vmm: InnerVmm) -> Rig {
        Rig::with_vms(vec![VmSpec::new(vmm)])
    }

    /// A rig running `vms` side by side in one L1.
    pub fn with_vms(vms: Vec<VmSpec>) -> Rig {
        Rig {
            vms,
            topology: Topology::default(),
            timeout: DEFAULT_TIMEOUT,
            probe: None,
            echo: false,
            progress: false,
            tuning: L1Tuning::default(),
            kernel: KernelForm::default(),
            guest_kernel: GuestKernel::default(),
            quiet: false,
            root_disk: false,
            tap: false,
            setup: None,
            in_turn: false,
            console_input: false,
            l1_extra_mib: 0,
            labels: None,
        }
    }

    /// Boot the guests with `quiet` instead of the early console (see
    /// [`crate::rig::guest_cmdline`]): their kernels print warnings and errors only, each
    /// byte of console output being a VM exit or two.
    pub fn quiet(mut self, quiet: bool) -> Rig {
        self.quiet = quiet;
        self
    }

    /// The form of the guest kernel every VM boots (default: the bzImage); the PVH form needs
    /// L1 images with the vmlinux layer.
    pub fn kernel(mut self, kernel: KernelForm) -> Rig {
        self.kernel = kernel;
        self
    }

    /// The kernel every VM boots (default: 6.1, L1's own); 6.12 needs L1 images with its
    /// layer ([`crate::images::L1Needs::guest_kernel`]) and runs L1 on a Zen 2 CPU
    /// ([`L1Tuning::for_guest_kernel`]).
    pub fn guest_kernel(mut self, kernel: GuestKernel) -> Rig {
        self.guest_kernel = kernel;
        self
    }

    /// L1's CPU topology.
    pub fn topology(mut self, topology: Topology) -> Rig {
        self.topology = topology;
        self
    }

    /// Hard timeout of the whole run.
    pub fn timeout(mut self, timeout: Duration) -> Rig {
        self.timeout = timeout;
        self
    }

    /// Shell command (or script) every VM's guest runs before powering off.
    pub fn guest_command(mut self, command: impl Into<String>) -> Rig {
        let command = command.into();
        for vm in &mut self.vms {
            vm.guest_command = Some(command.clone());
        }
        self
    }

    /// Arguments for every VM's pvmm (before `--initrd`, `--cmdline` and the kernel, which the
    /// rig adds). With [`InnerVmm::Qemu`] only `--vcpus` and `--memory` are used.
    pub fn pvmm_args<I, S>(mut self, args: I) -> Rig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        for vm in &mut self.vms {
            vm.args = args.clone();
        }
        self
    }

    /// A shell script L1 runs alongside each inner VMM, with `PVMM_PID` set to its pid; its
    /// output lands in [`RigOutcome::probe_lines`]. L1 waits for it after the VMM exits, so
    /// it should end by itself (e.g. loop while `kill -0 $PVMM_PID`).
    pub fn l1_probe(mut self, script: impl Into<String>) -> Rig {
        self.probe = Some(script.into());
        self
    }

    /// Boot every VM from a root disk: a copy of the guest's userland as an ext4 image
    /// ([`crate::root_disk`]), its first disk (`/dev/vda`, `root=/dev/vda`), at
    /// [`root_disk_path`]`(label)` in L1. Needs L1 images with the root disk layer and the 6.1
    /// guest kernel (whose virtio drivers the images hold).
    pub fn root_disk(mut self, root_disk: bool) -> Rig {
        self.root_disk = root_disk;
        self
    }

    /// Give every VM a network to L1: VM `i` gets the tap [`tap_network`]`(i)`, which L1
    /// creates with its address there, and the guest configures eth0 with L1 as its default
    /// gateway. Needs the 6.1 guest kernel (whose virtio drivers the images hold).
    pub fn tap(mut self, tap: bool) -> Rig {
        self.tap = tap;
        self
    }

    /// A shell script L1 runs once before the VMs start (files or devices their arguments
    /// name).
    pub fn l1_setup(mut self, script: impl Into<String>) -> Rig {
        self.setup = Some(script.into());
        self
    }

    /// Run the VMs one after another, in order, instead of side by side (a benchmark's
    /// contenders, each on an otherwise idle L1).
    pub fn in_turn(mut self, in_turn: bool) -> Rig {
        self.in_turn = in_turn;
        self
    }

    /// L1 memory (MiB) for files the setup or the probes keep in L1's RAM-backed root, on top
    /// of what the VMs need.
    pub fn l1_extra_memory(mut self, mib: u64) -> Rig {
        self.l1_extra_mib = mib;
        self
    }

    /// Print lines with `[L1] `, `[guest] `, ... prefixes on stdout as they arrive.
    pub fn echo(mut self, echo: bool) -> Rig {
        self.echo = echo;
        self
    }

    /// Print the rig's events (a VMM's start and exit, a guest reaching init) on stderr as they
    /// arrive, without the rest: progress for long runs.
    pub fn progress(mut self, progress: bool) -> Rig {
        self.progress = progress;
        self
    }

    /// Use `-accel tcg,thread=multi` (true) or `thread=single` for L1, on top of the tuning.
    pub fn tcg_multi_thread(mut self, multi: bool) -> Rig {
        self.tuning.tcg_multi_thread = multi;
        self
    }

    /// QEMU's and L1's settings (default: [`crate::tuning::DEFAULT_VARIANT`]).
    pub fn tuning(mut self, tuning: L1Tuning) -> Rig {
        self.tuning = tuning;
        self
    }

    /// Give each VM's guest console an input from L1: the fifo `/tmp/rig-run-LABEL/in`
    /// (`rig_run` in the L1 scripts), which a probe writes lines to, e.g. to start the guests'
    /// loads at set times once all of them are up. Without it the VMMs' stdin is `/dev/null`.
    pub fn console_input(mut self, console_input: bool) -> Rig {
        self.console_input = console_input;
        self
    }

    /// Names the VMs' runs, one label per VM in VM order (letters, digits, `-`, `_`, `.`, `:`),
    /// instead of their indexes: a benchmark that boots L1 again for the VMs a failed L1 cut
    /// off keeps each VM's label across its boots.
    pub fn run_labels(mut self, labels: Vec<String>) -> Rig {
        self.labels = Some(labels);
        self
    }

    /// The run labels, in VM order.
    pub fn labels(&self) -> Vec<String> {
        if let Some(labels) = &self.labels {
            return labels.clone();
        }
        match self.vms.len() {
            1 => vec![SINGLE_RUN_LABEL.to_string()],
            n => (0..n).map(|i| i.to_string()).collect(),
        }
    }

    /// The L1 job: one `rig_run` per VM, in the background when there are several.
    fn job(&self) -> Result<L1Job, RigError> {
        if (self.root_disk || self.tap) && self.guest_kernel != GuestKernel::Linux6_1 {
            return Err(RigError::BadArgs(format!(
                "--root-disk and --tap need guest kernel 6.1: the images hold its virtio \
                 drivers, not {}'s",
                self.guest_kernel
            )));
        }
        let labels = self.labels();
        if labels.len() != self.vms.len() || !labels.iter().all(|l| valid_label(l)) {
            return Err(RigError::BadArgs(format!(
                "run labels {labels:?}: one per VM, of letters, digits, '-', '_', '.', ':'"
            )));
        }
        let (mut script, mut waits, mut memory) = (String::new(), String::new(), 0);
        if self.console_input {
            script.push_str("RIG_CONSOLE_INPUT=1\n");
        }
        script.push_str(self.setup.as_deref().unwrap_or_default());
        for (index, (vm, label)) in self.vms.iter().zip(&labels).enumerate() {
            let mut args = vm.args.clone();
            let mut params = Vec::new();
            if self.root_disk {
                let image = root_disk_path(label);
                script.push_str(&format!("cp {} {image}\n", inside::GUEST_ROOT_DISK));
                args.splice(0..0, ["--disk".to_string(), image]);
                params.push("root=/dev/vda".to_string());
            }
            if self.tap {
                let net = tap_network(index);
                script.push_str(&format!("rig_tap {} {}/24\n", net.tap, net.l1));
                args.extend(["--net".to_string(), format!("tap={}", net.tap)]);
                params.push(format!("pvmm_net={}/24,{}", net.guest, net.l1));
            }
            let cmdline = with_params(
                guest_cmdline(
                    vm.vmm,
                    self.guest_kernel,
                    vm.guest_command.as_deref(),
                    self.quiet,
                )?,
                &params,
            )?;
            if vm.vmm == InnerVmm::Pvmm {
                args.extend(self.tuning.pvmm_args.iter().cloned());
            }
            let command = shell_join(&inner_vmm_command(
                vm.vmm,
                self.guest_kernel,
                self.kernel,
                &args,
                &cmdline,
            )?);
            let vm_memory = vm_shape(&args)?.1 + if self.root_disk { ROOT_DISK_MIB } else { 0 };
            memory = if self.in_turn {
                memory.max(vm_memory)
            } else {
                memory + vm_memory
            };
            if self.vms.len() == 1 || self.in_turn {
                script.push_str(&format!("rig_run {label} 0 {command}\n"));
            } else {
                // The VM's index, not its label, names its variable: a label may hold
                // characters a shell name may not.
                script.push_str(&format!(
                    "rig_run {label} 0 {command} &\nrig_vm_{index}=$!\n"
                ));
                waits.push_str(&format!(" $rig_vm_{index}"));
            }
        }
        if !waits.is_empty() {
            script.push_str(&format!("wait{waits}\n"));
        }
        Ok(L1Job {
            script,
            probe: self.probe.clone(),
            guest_memory_mib: memory + self.l1_extra_mib,
            guest_kernel: self.guest_kernel,
        })
    }

    /// Runs the rig once; needs L1 images with the layers for this rig's VMMs.
    pub fn run(&self, ws: &Workspace, images: &L1Images) -> Result<RigOutcome, RigError> {
        if self.vms.is_empty() {
            return Err(RigError::BadArgs("a rig run needs at least one VM".into()));
        }
        if self.root_disk && images.root_disk.is_none() {
            return Err(RigError::BadArgs(
                "the L1 images were built without the root disk".into(),
            ));
        }
        for vm in &self.vms {
            if vm.vmm == InnerVmm::Pvmm && images.pvmm.is_none() {
                return Err(RigError::BadArgs(
                    "the L1 images were built without pvmm".into(),
                ));
            }
            if vm.vmm == InnerVmm::Qemu && images.qemu.is_none() {
                return Err(RigError::BadArgs(
                    "the L1 images were built without qemu".into(),
                ));
            }
        }
        let labels = self.labels();
        let several = self.vms.len() > 1;
        let options = L1Options {
            topology: self.topology,
            timeout: self.timeout,
            echo: self.echo,
            progress: self.progress,
            tuning: self.tuning.clone(),
            vmm_name: self.vms[0].vmm.name(),
            vm_names: if several {
                labels
                    .iter()
                    .zip(&self.vms)
                    .map(|(label, vm)| (label.clone(), vm.vmm.name()))
                    .collect()
            } else {
                Vec::new()
            },
        };
        let mut outcome = run_l1(ws, images, &options, &self.job()?)?;
        if several {
            outcome.vmm_status = combined_status(&outcome, &labels);
        }
        Ok(outcome)
    }
}

/// Where L1 keeps the root disk of the run `label` ([`Rig::root_disk`]).
pub fn root_disk_path(label: &str) -> String {
    format!("/tmp/rig-root-{label}.ext4")
}

/// The tap network of a rig's VM ([`Rig::tap`]): a /24 of its own per VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapNetwork {
    /// The tap's name in L1.
    pub tap: String,
    /// L1's address on it, the guest's gateway.
    pub l1: String,
    /// The guest's address (eth0).
    pub guest: String,
}

/// The tap network of VM `index` (from 0): `rigtapI`, 10.0.I.1 in L1 and 10.0.I.2 in the guest.
pub fn tap_network(index: usize) -> TapNetwork {
    TapNetwork {
        tap: format!("rigtap{index}"),
        l1: format!("10.0.{index}.1"),
        guest: format!("10.0.{index}.2"),
    }
}

/// The first non-zero exit status of the runs `labels`, 0 when all exited 0, None when one did
/// not report.
pub fn combined_status(outcome: &RigOutcome, labels: &[String]) -> Option<i32> {
    let statuses: Option<Vec<i32>> = labels
        .iter()
        .map(|l| outcome.run(l).and_then(|r| r.status))
        .collect();
    statuses.map(|s| s.into_iter().find(|&s| s != 0).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inside;

    #[test]
    fn several_vms_start_together_with_their_own_labels_and_memory() {
        let vm = |text: &str| text.parse::<VmSpec>().unwrap();
        let rig = Rig::with_vms(vec![
            vm("pvmm --vcpus 2 --memory 256 -- nproc"),
            vm("qemu --vcpus 1 --memory 300 -- uname"),
        ])
        .tuning("policy-none".parse().unwrap());
        assert_eq!(rig.labels(), ["0", "1"]);
        let job = rig.job().unwrap();
        assert_eq!(job.guest_memory_mib, 556);
        let lines: Vec<&str> = job.script.lines().collect();
        assert_eq!(lines.len(), 5, "{}", job.script);
        assert!(lines[0].starts_with("rig_run 0 0 /bin/pvmm --vcpus 2 --memory 256 --policy none"));
        assert!(lines[0].ends_with(" &"));
        assert_eq!(lines[1], "rig_vm_0=$!");
        assert!(lines[2].starts_with(&format!("rig_run 1 0 {} ", inside::QEMU)));
        assert!(!lines[2].contains("--policy"));
        assert_eq!(lines[4], "wait $rig_vm_0 $rig_vm_1");
        // Named runs keep their names; the shell's variables stay by index.
        let named = rig
            .clone()
            .run_labels(vec!["pvmm-1".into(), "qemu-kvm-1".into()]);
        assert_eq!(named.labels(), ["pvmm-1", "qemu-kvm-1"]);
        let script = named.job().unwrap().script;
        assert!(script.starts_with("rig_run pvmm-1 0 "), "{script}");
        assert!(
            script.contains("\nrig_vm_1=$!\nwait $rig_vm_0 $rig_vm_1\n"),
            "{script}"
        );
        for bad in [vec!["a".to_string()], vec!["a b".into(), "c".into()]] {
            assert!(rig.clone().run_labels(bad).job().is_err());
        }
        // Console input is asked of L1's rig_run for every run of the boot, before the first.
        let fed = rig.clone().console_input(true).job().unwrap().script;
        assert!(
            fed.starts_with("RIG_CONSOLE_INPUT=1\nrig_run 0 0 "),
            "{fed}"
        );
        assert!(!script.contains("RIG_CONSOLE_INPUT"), "{script}");
        let one = Rig::new(InnerVmm::Pvmm)
            .guest_command("nproc")
            .job()
            .unwrap();
        assert!(one.script.starts_with("rig_run main 0 /bin/pvmm --initrd"));
        assert_eq!(one.script.lines().count(), 1);
        assert_eq!(one.guest_kernel, GuestKernel::Linux6_1);
        let new = Rig::new(InnerVmm::Qemu)
            .guest_kernel(GuestKernel::Linux6_12)
            .job()
            .unwrap();
        assert_eq!(new.guest_kernel, GuestKernel::Linux6_12);
        assert!(new.script.contains(inside::GUEST_KERNEL_612));
        assert!(new.script.contains("amd_pstate=passive"));
    }

    #[test]
    fn root_disks_and_taps_are_one_per_vm_and_reach_both_vmms() {
        let vm = |text: &str| text.parse::<VmSpec>().unwrap();
        let rig = Rig::with_vms(vec![
            vm("pvmm --vcpus 2 --memory 256 --rng -- true"),
            vm("qemu --vcpus 2 --memory 256 --rng -- true"),
        ])
        .root_disk(true)
        .tap(true)
        .l1_setup("echo setup\n");
        let job = rig.job().unwrap();
        assert_eq!(job.guest_memory_mib, 2 * (256 + ROOT_DISK_MIB));
        let lines: Vec<&str> = job.script.lines().collect();
        assert_eq!(lines[0], "echo setup");
        assert_eq!(lines[1], "cp /guest/root.ext4 /tmp/rig-root-0.ext4");
        assert_eq!(lines[2], "rig_tap rigtap0 10.0.0.1/24");
        assert!(
            lines[3].contains(" --disk /tmp/rig-root-0.ext4 --vcpus 2"),
            "{}",
            lines[3]
        );
        assert!(lines[3].contains(" --net tap=rigtap0 "), "{}", lines[3]);
        assert!(lines[3].contains("root=/dev/vda pvmm_net=10.0.0.2/24,10.0.0.1"));
        assert_eq!(lines[6], "rig_tap rigtap1 10.0.1.1/24");
        for want in [
            "-drive file=/tmp/rig-root-1.ext4,format=raw,if=none,id=disk0",
            "-device virtio-blk-pci,drive=disk0",
            "-netdev tap,id=net0,ifname=rigtap1,script=no,downscript=no",
            "-device virtio-rng-pci",
        ] {
            assert!(lines[7].contains(want), "{want}: {}", lines[7]);
        }
        let in_turn = rig
            .clone()
            .in_turn(true)
            .l1_extra_memory(100)
            .job()
            .unwrap();
        assert_eq!(in_turn.guest_memory_mib, 256 + ROOT_DISK_MIB + 100);
        assert!(!in_turn.script.contains(" &\n"), "{}", in_turn.script);
        assert!(!in_turn.script.contains("wait"), "{}", in_turn.script);
        assert!(Rig::new(InnerVmm::Pvmm)
            .guest_kernel(GuestKernel::Linux6_12)
            .tap(true)
            .job()
            .is_err());
    }
}
