//! What runs in L1: its CPU topology, the inner VMM, the guest's command line, and the VM specs
//! (`VMM [ARGS...] [-- COMMAND]`) of a rig run.

use std::str::FromStr;

use crate::error::RigError;
use crate::guest_kernel::{GuestKernel, KernelForm};
use crate::inside;
use crate::scripts::base64_encode;

/// Added to the guest's command line unless it is `quiet`: the decompressor and the kernel
/// print on the serial port from their first instructions instead of from the console's
/// registration, so a guest that hangs early shows how far it got (the boot log is no
/// longer: the real console does not repeat what the early one printed).
pub const GUEST_EARLY_CONSOLE: &str = "earlyprintk=ttyS0";

/// pvmm's default guest command line; the rig appends the command.
pub const GUEST_BASE_CMDLINE: &str = pvmm::config::DEFAULT_CMDLINE;

/// x86's COMMAND_LINE_SIZE including the terminating NUL: longer guest command lines are cut
/// by the guest kernel, so the rig refuses them.
pub const MAX_GUEST_CMDLINE: usize = 2047;

/// pvmm's defaults for `--vcpus` and `--memory`, used to size `--vmm qemu` the same way.
pub const PVMM_DEFAULT_VCPUS: u32 = pvmm::config::DEFAULT_VCPUS;
/// See [`PVMM_DEFAULT_VCPUS`].
pub const PVMM_DEFAULT_MEMORY_MIB: u64 = pvmm::config::DEFAULT_MEMORY_MIB;

/// L1's CPU topology: sockets x cores per socket x threads per core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// Packages.
    pub sockets: u32,
    /// Cores per package.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// Most of any one topology dimension accepted: far above what TCG on two host CPUs can run.
const MAX_TOPOLOGY_DIMENSION: u32 = 64;

impl Topology {
    /// Total logical CPUs.
    pub fn cpus(&self) -> u32 {
        self.sockets * self.cores * self.threads
    }
}

impl Default for Topology {
    /// 2 sockets x 2 cores x 1 thread: the smallest host with two packages and a choice of
    /// cores within each.
    fn default() -> Self {
        Topology {
            sockets: 2,
            cores: 2,
            threads: 1,
        }
    }
}

impl FromStr for Topology {
    type Err = RigError;
    /// Parses `SxCxT` with pvmm's spec parser; QEMU's `-smp` takes no dies here, and no
    /// dimension may pass `MAX_TOPOLOGY_DIMENSION`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || RigError::BadTopology(text.into());
        let counts = pvmm_scheduler::parse_spec(text).map_err(|_| bad())?;
        let dimension = |n: u64| {
            u32::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_TOPOLOGY_DIMENSION)
                .ok_or_else(bad)
        };
        if counts.dies != 1 {
            return Err(bad());
        }
        Ok(Topology {
            sockets: dimension(counts.sockets)?,
            cores: dimension(counts.cores)?,
            threads: dimension(counts.threads)?,
        })
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.sockets, self.cores, self.threads)
    }
}

/// Which VMM runs the guest inside L1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InnerVmm {
    /// The static pvmm built from this workspace.
    Pvmm,
    /// `qemu-system-x86_64 -enable-kvm`, the baseline.
    Qemu,
}

impl FromStr for InnerVmm {
    type Err = RigError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "pvmm" => Ok(InnerVmm::Pvmm),
            "qemu" => Ok(InnerVmm::Qemu),
            _ => Err(RigError::BadArgs(format!(
                "invalid --vmm '{text}': expected pvmm or qemu"
            ))),
        }
    }
}

impl InnerVmm {
    /// The name used in prefixes and reports.
    pub fn name(&self) -> &'static str {
        match self {
            InnerVmm::Pvmm => "pvmm",
            InnerVmm::Qemu => "qemu-kvm",
        }
    }
}

/// The guest's command line: pvmm's default, what `guest` needs
/// ([`GuestKernel::cmdline_extra`]), and the command, base64-encoded (see
/// [`crate::scripts::GUEST_INIT`]).
///
/// For [`InnerVmm::Qemu`] `pci=off` is left out: QEMU's PC machine has a PCI bus, and with
/// `pci=off` its ACPI PCI-link methods fail with a screenful of errors that slow the guest's
/// serial console and would handicap QEMU in the boot benchmark. `quiet` (used by the
/// benchmark) keeps the kernel's boot log off the emulated UART, whose per-byte exits
/// otherwise dominate boot time in the nested rig.
pub fn guest_cmdline(
    vmm: InnerVmm,
    guest: GuestKernel,
    command: Option<&str>,
    quiet: bool,
) -> Result<String, RigError> {
    let mut cmdline = match vmm {
        InnerVmm::Pvmm => GUEST_BASE_CMDLINE.to_string(),
        InnerVmm::Qemu => GUEST_BASE_CMDLINE.replace(" pci=off", ""),
    };
    for word in guest.cmdline_extra() {
        cmdline.push(' ');
        cmdline.push_str(word);
    }
    if quiet {
        cmdline.push_str(" quiet");
    } else {
        cmdline.push(' ');
        cmdline.push_str(GUEST_EARLY_CONSOLE);
    }
    if let Some(command) = command {
        cmdline.push_str(" pvmm_cmd_b64=");
        cmdline.push_str(&base64_encode(command.as_bytes()));
    }
    fits(cmdline)
}

/// `cmdline` when the guest kernel takes it whole.
fn fits(cmdline: String) -> Result<String, RigError> {
    if cmdline.len() > MAX_GUEST_CMDLINE {
        return Err(RigError::BadArgs(format!(
            "the guest command is too long: the kernel command line would be {} bytes, the limit is {MAX_GUEST_CMDLINE}",
            cmdline.len()
        )));
    }
    Ok(cmdline)
}

/// `cmdline` with `params` added (`root=/dev/vda`, `pvmm_net=...`: see
/// [`crate::scripts::GUEST_INIT`]).
pub fn with_params(mut cmdline: String, params: &[String]) -> Result<String, RigError> {
    for param in params {
        cmdline.push(' ');
        cmdline.push_str(param);
    }
    fits(cmdline)
}

/// vCPUs and memory (MiB) that pvmm arguments ask for, with pvmm's defaults.
pub fn vm_shape(pvmm_args: &[String]) -> Result<(u32, u64), RigError> {
    let mut vcpus = PVMM_DEFAULT_VCPUS;
    let mut memory = PVMM_DEFAULT_MEMORY_MIB;
    let mut args = pvmm_args.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        if name == "--vcpus" || name == "--memory" {
            let value = inline
                .or_else(|| args.next().cloned())
                .ok_or_else(|| RigError::BadArgs(format!("pvmm argument {name} needs a value")))?;
            let bad =
                || RigError::BadArgs(format!("pvmm argument {name} has a bad value '{value}'"));
            if name == "--vcpus" {
                vcpus = value.parse().map_err(|_| bad())?;
            } else {
                memory = value.parse().map_err(|_| bad())?;
            }
        }
    }
    Ok((vcpus, memory))
}

/// The command line that runs `vmm` in L1 on the guest images: the kernel `guest` in `form`.
pub fn inner_vmm_command(
    vmm: InnerVmm,
    guest: GuestKernel,
    form: KernelForm,
    pvmm_args: &[String],
    cmdline: &str,
) -> Result<Vec<String>, RigError> {
    let kernel = guest.l1_path(form)?;
    for reserved in ["--initrd", "--cmdline"] {
        if pvmm_args
            .iter()
            .any(|a| a == reserved || a.starts_with(&format!("{reserved}=")))
        {
            return Err(RigError::BadArgs(format!(
                "pvmm argument {reserved} is set by the rig (use --guest-cmd for the guest's command)"
            )));
        }
    }
    let (vcpus, memory) = vm_shape(pvmm_args)?;
    let words: Vec<String> = match vmm {
        InnerVmm::Pvmm => {
            let mut words = vec![inside::PVMM.to_string()];
            words.extend(pvmm_args.iter().cloned());
            words.extend(
                [
                    "--initrd",
                    inside::GUEST_INITRD,
                    "--cmdline",
                    cmdline,
                    kernel,
                ]
                .map(String::from),
            );
            words
        }
        InnerVmm::Qemu => {
            let (vcpus, memory) = (vcpus.to_string(), memory.to_string());
            let mut words: Vec<String> = [
                inside::QEMU,
                // Thread names ("CPU 0/KVM") let L1 probes find the vCPU threads.
                "-name",
                "pvmm-baseline,debug-threads=on",
                "-enable-kvm",
                "-cpu",
                "host",
                "-smp",
                &vcpus,
                "-m",
                &memory,
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-serial",
                "stdio",
                "-no-reboot",
                "-kernel",
                kernel,
                "-initrd",
                inside::GUEST_INITRD,
                "-append",
                cmdline,
            ]
            .map(String::from)
            .to_vec();
            words.extend(qemu_virtio_args(pvmm_args)?);
            words
        }
    };
    Ok(words)
}

/// QEMU's options for the virtio devices that pvmm arguments ask for (`--disk`, `--net`,
/// `--rng`), so that both VMMs run the same devices on the same images and taps: virtio-pci
/// devices, which QEMU's PC machine has a bus for, with QEMU's defaults otherwise (its page
/// cache use matches pvmm's buffered image; its network device offers the offloads pvmm does
/// not).
pub fn qemu_virtio_args(pvmm_args: &[String]) -> Result<Vec<String>, RigError> {
    let mut words = Vec::new();
    let (mut disks, mut nets) = (0, 0);
    let mut args = pvmm_args.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next().cloned())
                .ok_or_else(|| RigError::BadArgs(format!("pvmm argument {name} needs a value")))
        };
        let bad = |why: String| RigError::BadArgs(format!("pvmm argument {name}: {why}"));
        match name {
            "--disk" => {
                let disk: pvmm::config::DiskConfig = value(name)?.parse().map_err(bad)?;
                let readonly = if disk.readonly { ",readonly=on" } else { "" };
                words.push("-drive".into());
                words.push(format!(
                    "file={},format=raw,if=none,id=disk{disks}{readonly}",
                    disk.path.display()
                ));
                words.push("-device".into());
                words.push(format!("virtio-blk-pci,drive=disk{disks}"));
                disks += 1;
            }
            "--net" => {
                let net: pvmm::config::NetConfig = value(name)?.parse().map_err(bad)?;
                words.push("-netdev".into());
                words.push(format!(
                    "tap,id=net{nets},ifname={},script=no,downscript=no",
                    net.tap
                ));
                words.push("-device".into());
                // No option ROM: the rig boots the kernel directly, and L1 holds no iPXE ROMs.
                words.push(format!("virtio-net-pci,netdev=net{nets},romfile="));
                nets += 1;
            }
            "--rng" => {
                words.push("-device".into());
                words.push("virtio-rng-pci".into());
            }
            _ => {}
        }
    }
    Ok(words)
}

/// One VM of a rig run: its VMM, that VMM's arguments and the guest's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    /// The VMM that runs it in L1.
    pub vmm: InnerVmm,
    /// pvmm's arguments (with [`InnerVmm::Qemu`] only `--vcpus`, `--memory` and the virtio
    /// devices are used: [`qemu_virtio_args`]).
    pub args: Vec<String>,
    /// Shell command (or script) the guest's init runs before powering off.
    pub guest_command: Option<String>,
}

impl VmSpec {
    /// A VM of `vmm` with pvmm's default shape and no command.
    pub fn new(vmm: InnerVmm) -> VmSpec {
        VmSpec {
            vmm,
            args: Vec::new(),
            guest_command: None,
        }
    }
}

impl FromStr for VmSpec {
    type Err = RigError;
    /// `VMM [ARGS...] [-- COMMAND]`, e.g. `pvmm --vcpus 2 --memory 256 -- nproc`: the VMM
    /// (`pvmm` or `qemu`), its arguments split at white space, and the guest's command (the
    /// rest, verbatim).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (head, command) = match text.split_once(" -- ") {
            Some((head, command)) => (head, Some(command.trim().to_string())),
            None => (text.strip_suffix(" --").unwrap_or(text), None),
        };
        let mut words = head.split_whitespace();
        let vmm: InnerVmm = words
            .next()
            .ok_or_else(|| RigError::BadArgs(format!("invalid VM '{text}': no VMM named")))?
            .parse()?;
        let args: Vec<String> = words.map(String::from).collect();
        vm_shape(&args)?;
        Ok(VmSpec {
            vmm,
            args,
            guest_command: command.filter(|c| !c.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_parses_and_rejects() {
        let t: Topology = "2x2x2".parse().unwrap();
        assert_eq!(t.cpus(), 8);
        assert_eq!(t.to_string(), "2x2x2");
        // A spec with dies parses when it declares one die: QEMU's -smp here takes none.
        assert_eq!("2x1x2x2".parse::<Topology>().unwrap(), t);
        for bad in ["2x2", "0x1x1", "axbxc", "1x2x1x1", "", "65x1x1"] {
            assert!(bad.parse::<Topology>().is_err(), "{bad}");
        }
    }

    #[test]
    fn vm_shape_reads_pvmm_flags() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(vm_shape(&[]).unwrap(), (1, 512));
        assert_eq!(
            vm_shape(&args(&["--vcpus", "4", "--memory=1024", "-v"])).unwrap(),
            (4, 1024)
        );
        assert!(vm_shape(&args(&["--vcpus"])).is_err());
        assert!(vm_shape(&args(&["--vcpus", "x"])).is_err());
    }

    #[test]
    fn inner_commands_carry_images_and_cmdline() {
        const OLD: GuestKernel = GuestKernel::Linux6_1;
        let cmdline = guest_cmdline(InnerVmm::Pvmm, OLD, Some("nproc"), false).unwrap();
        assert!(cmdline.starts_with(GUEST_BASE_CMDLINE));
        let qemu_cmdline = guest_cmdline(InnerVmm::Qemu, OLD, None, true).unwrap();
        assert_eq!(qemu_cmdline, "console=ttyS0 reboot=k panic=-1 quiet");
        assert!(cmdline.ends_with(" pvmm_cmd_b64=bnByb2M="));
        let bz = KernelForm::BzImage;
        let pvmm = inner_vmm_command(
            InnerVmm::Pvmm,
            OLD,
            bz,
            &["--vcpus".into(), "4".into()],
            &cmdline,
        )
        .unwrap();
        assert_eq!(pvmm.first().map(String::as_str), Some(inside::PVMM));
        assert_eq!(pvmm.last().map(String::as_str), Some(inside::GUEST_KERNEL));
        let qemu =
            inner_vmm_command(InnerVmm::Qemu, OLD, bz, &["--vcpus=4".into()], &cmdline).unwrap();
        assert!(qemu.windows(2).any(|w| w[0] == "-smp" && w[1] == "4"));
        assert!(qemu.windows(2).any(|w| w[0] == "-m" && w[1] == "512"));
        assert!(qemu
            .windows(2)
            .any(|w| w[0] == "-kernel" && w[1] == inside::GUEST_KERNEL));
        let pvh = KernelForm::Pvh;
        let pvmm = inner_vmm_command(InnerVmm::Pvmm, OLD, pvh, &[], &cmdline).unwrap();
        assert_eq!(pvmm.last().map(String::as_str), Some(inside::GUEST_VMLINUX));
        let qemu = inner_vmm_command(InnerVmm::Qemu, OLD, pvh, &[], &cmdline).unwrap();
        assert!(qemu
            .windows(2)
            .any(|w| w[0] == "-kernel" && w[1] == inside::GUEST_VMLINUX));
        assert!(
            inner_vmm_command(InnerVmm::Pvmm, OLD, bz, &["--cmdline=x".into()], &cmdline).is_err()
        );
        assert!(guest_cmdline(InnerVmm::Pvmm, OLD, Some(&"x".repeat(2000)), false).is_err());
    }

    #[test]
    fn a_612_guest_gets_amd_pstate_and_its_own_kernel() {
        let new = GuestKernel::Linux6_12;
        for vmm in [InnerVmm::Pvmm, InnerVmm::Qemu] {
            let cmdline = guest_cmdline(vmm, new, Some("nproc"), true).unwrap();
            assert!(cmdline.contains(" amd_pstate=passive "), "{cmdline}");
            let old = guest_cmdline(vmm, GuestKernel::Linux6_1, Some("nproc"), true).unwrap();
            assert!(!old.contains("amd_pstate"), "{old}");
            let words = inner_vmm_command(vmm, new, KernelForm::BzImage, &[], &cmdline).unwrap();
            assert!(words.iter().any(|w| w == inside::GUEST_KERNEL_612));
            assert!(words.iter().any(|w| w == &cmdline));
            assert!(inner_vmm_command(vmm, new, KernelForm::Pvh, &[], &cmdline).is_err());
        }
        assert_eq!(
            guest_cmdline(InnerVmm::Pvmm, new, None, true).unwrap(),
            format!("{GUEST_BASE_CMDLINE} amd_pstate=passive quiet")
        );
    }

    #[test]
    fn vm_specs_parse_and_refuse() {
        let vm: VmSpec = "pvmm --vcpus 2 --memory 256 -- echo a -- b"
            .parse()
            .unwrap();
        assert_eq!(vm.vmm, InnerVmm::Pvmm);
        assert_eq!(vm.args, ["--vcpus", "2", "--memory", "256"]);
        assert_eq!(vm.guest_command.as_deref(), Some("echo a -- b"));
        let bare: VmSpec = "qemu".parse().unwrap();
        assert_eq!(bare, VmSpec::new(InnerVmm::Qemu));
        for bad in ["", "kvmtool", "pvmm --vcpus", "pvmm --memory x -- nproc"] {
            assert!(bad.parse::<VmSpec>().is_err(), "{bad}");
        }
    }
}
