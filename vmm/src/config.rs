//! A validated VM configuration: everything pvmm needs to build the VM, checked up front so
//! that bad input fails before any KVM object exists.

use std::path::PathBuf;

#[cfg(test)]
use pvmm_scheduler::Policy;
pub use pvmm_scheduler::{PlacementPolicy, DEFAULT_POLICY};
pub use pvmm_tick::settings::{
    DEFAULT_HOST_TOPOLOGY, DEFAULT_TICK_MS, MAX_TICK_MS, MIN_TICK_MS, SHARE_PACKAGE_HELP,
};

use crate::acpi::MAX_VCPUS;
use crate::layout::MAX_VIRTIO_DEVICES;
use crate::seccomp::SeccompMode;

/// The kernel command line pvmm uses when `--cmdline` is not given: the serial console on
/// COM1, reboot through the keyboard controller (pvmm also serves the ACPI reset register), a
/// panicking guest reboots at once (so pvmm exits with the reboot status instead of hanging),
/// and no PCI probing (pvmm has no PCI bus).
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 pci=off";

/// Default number of vCPUs.
pub const DEFAULT_VCPUS: u32 = 1;
/// Default guest RAM.
pub const DEFAULT_MEMORY_MIB: u64 = 512;
/// Smallest guest RAM pvmm accepts: a compressed kernel is loaded at 1 MiB and decompresses
/// itself above 16 MiB (the x86-64 default physical start), and needs room for its page
/// tables and an initrd; below 64 MiB a stock distribution kernel cannot get to init.
pub const MIN_MEMORY_MIB: u64 = 64;
/// Largest guest RAM pvmm accepts: 1 TiB, far above what one host package feeds usefully and
/// below what a 4-level identity map could describe.
pub const MAX_MEMORY_MIB: u64 = 1 << 20;
/// The KVM device.
pub const DEFAULT_KVM_DEVICE: &str = "/dev/kvm";
/// How long a shutdown waits for the guest to power off after the power button: a distribution
/// guest's orderly shutdown takes seconds; systemd's own default stop timeout is 90 s, so pvmm
/// stops well inside it.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 10;
/// How long an outside balancer's assignments hold without renewal, by default: 30 ticks of
/// 100 ms, so a balancer that misses a few ticks keeps control, and one that died gives the
/// VM back to its own policy within seconds.
pub const DEFAULT_EXTERNAL_LEASE_MS: u64 = 3000;

/// Errors in a configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Memory outside the accepted range.
    #[error(
        "--memory {0} MiB is out of range: pvmm needs {MIN_MEMORY_MIB}..={MAX_MEMORY_MIB} MiB"
    )]
    MemoryOutOfRange(u64),
    /// Tick outside the accepted range.
    #[error("--tick-ms {0} is out of range: {MIN_TICK_MS}..={MAX_TICK_MS}")]
    TickOutOfRange(u64),
    /// vCPU count outside the accepted range.
    #[error("--vcpus {0} is out of range: 1..={MAX_VCPUS}")]
    VcpusOutOfRange(u32),
    /// More virtio devices than the platform has slots for.
    #[error("{0} virtio devices (--disk, --net, --rng): pvmm has slots for {MAX_VIRTIO_DEVICES}")]
    TooManyDevices(usize),
}

/// One `--disk PATH[,readonly=on]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// The raw image.
    pub path: PathBuf,
    /// The guest may not write it.
    pub readonly: bool,
}

impl std::str::FromStr for DiskConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let path = parts.next().filter(|p| !p.is_empty());
        let path = path.ok_or_else(|| "expected PATH[,readonly=on]".to_string())?;
        let mut readonly = false;
        for option in parts {
            readonly = match option {
                "readonly=on" => true,
                "readonly=off" => false,
                other => return Err(format!("unknown disk option {other:?} (readonly=on|off)")),
            };
        }
        Ok(Self {
            path: path.into(),
            readonly,
        })
    }
}

/// One `--net tap=NAME[,mac=MAC]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// The existing tap device.
    pub tap: String,
    /// The guest's address (None: one derived from the tap's name, the same every time).
    pub mac: Option<[u8; 6]>,
}

impl std::str::FromStr for NetConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut tap = None;
        let mut mac = None;
        for option in s.split(',') {
            match option.split_once('=') {
                Some(("tap", name)) if !name.is_empty() => tap = Some(name.to_string()),
                Some(("mac", text)) => {
                    let parsed = pvmm_devices::virtio::tap::parse_mac(text);
                    mac = Some(parsed.ok_or_else(|| {
                        format!("mac={text}: expected a unicast aa:bb:cc:dd:ee:ff")
                    })?);
                }
                _ => {
                    return Err(format!(
                        "unknown net option {option:?} (tap=NAME[,mac=MAC])"
                    ))
                }
            }
        }
        let tap = tap.ok_or_else(|| "expected tap=NAME[,mac=MAC]".to_string())?;
        Ok(Self { tap, mac })
    }
}

/// The VM's virtio devices.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VirtioConfig {
    /// Disks, in order: the first is the guest's `/dev/vda`.
    pub disks: Vec<DiskConfig>,
    /// Network cards, in order: the first is the guest's first Ethernet interface.
    pub nets: Vec<NetConfig>,
    /// An entropy device (`--rng`).
    pub rng: bool,
}

impl VirtioConfig {
    /// How many devices the VM gets.
    pub fn count(&self) -> usize {
        self.disks.len() + self.nets.len() + usize::from(self.rng)
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// Kernel image (bzImage or ELF vmlinux with a PVH note).
    pub kernel: PathBuf,
    /// Optional initrd.
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    pub cmdline: String,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// The KVM device to open.
    pub kvm_device: PathBuf,
    /// Print progress and vCPU thread ids on stderr.
    pub verbose: bool,
    /// How vCPU threads are placed.
    pub placement: PlacementConfig,
    /// The control socket's path, if any.
    pub api_socket: Option<PathBuf>,
    /// How long outside placement holds without renewal.
    pub external_lease_ms: u64,
    /// How long a shutdown (SIGTERM, SIGINT, the API) waits for the guest to power off.
    pub shutdown_timeout_secs: u64,
    /// What a system call outside a thread's seccomp filter does.
    pub seccomp: SeccompMode,
    /// virtio devices.
    pub virtio: VirtioConfig,
    /// The VM's name, for the host daemon's status and metrics (`--name`).
    pub name: Option<String>,
}

/// Where stats lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsTarget {
    /// Standard error (standard output is the guest's console).
    Stderr,
    /// A file, created or truncated.
    File(PathBuf),
}

/// Live placement settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementConfig {
    /// The balancing policy, or `none`.
    pub policy: PlacementPolicy,
    /// `auto`, a spec like `2x4x2`, or a topology file.
    pub host_topology: String,
    /// Host CPUs pvmm may use (default: all CPUs of the topology).
    pub cpus: Option<String>,
    /// Placement period.
    pub tick_ms: u64,
    /// Packing policies: vCPUs share their package's CPUs in use
    /// (`pvmm_scheduler::EngineConfig::share_package`).
    pub share_package: bool,
    /// Per-tick JSON stats.
    pub stats: Option<StatsTarget>,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            policy: PlacementPolicy::default(),
            host_topology: DEFAULT_HOST_TOPOLOGY.into(),
            cpus: None,
            tick_ms: DEFAULT_TICK_MS,
            share_package: false,
            stats: None,
        }
    }
}

impl VmConfig {
    /// Checks the ranges that do not need the files or KVM.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&self.memory_mib) {
            return Err(ConfigError::MemoryOutOfRange(self.memory_mib));
        }
        if !(1..=MAX_VCPUS).contains(&self.vcpus) {
            return Err(ConfigError::VcpusOutOfRange(self.vcpus));
        }
        if !(MIN_TICK_MS..=MAX_TICK_MS).contains(&self.placement.tick_ms) {
            return Err(ConfigError::TickOutOfRange(self.placement.tick_ms));
        }
        if self.virtio.count() > MAX_VIRTIO_DEVICES {
            return Err(ConfigError::TooManyDevices(self.virtio.count()));
        }
        Ok(())
    }

    /// Guest RAM in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> VmConfig {
        VmConfig {
            kernel: "k".into(),
            initrd: None,
            cmdline: DEFAULT_CMDLINE.into(),
            vcpus: 2,
            memory_mib: DEFAULT_MEMORY_MIB,
            kvm_device: DEFAULT_KVM_DEVICE.into(),
            verbose: false,
            placement: PlacementConfig::default(),
            api_socket: None,
            external_lease_ms: DEFAULT_EXTERNAL_LEASE_MS,
            shutdown_timeout_secs: DEFAULT_SHUTDOWN_TIMEOUT_SECS,
            seccomp: SeccompMode::default(),
            virtio: VirtioConfig::default(),
            name: None,
        }
    }

    #[test]
    fn policy_names() {
        assert_eq!("none".parse::<PlacementPolicy>(), Ok(PlacementPolicy::None));
        assert_eq!(
            "powersaving:2".parse::<PlacementPolicy>(),
            Ok(PlacementPolicy::Managed(Policy::Powersaving { level: 2 }))
        );
        assert!("fastest".parse::<PlacementPolicy>().is_err());
        assert_eq!(PlacementPolicy::default().to_string(), "powersaving:1");
    }

    #[test]
    fn ranges() {
        assert_eq!(config().validate(), Ok(()));
        let mut c = config();
        c.memory_mib = MIN_MEMORY_MIB - 1;
        assert_eq!(c.validate(), Err(ConfigError::MemoryOutOfRange(63)));
        c.memory_mib = MAX_MEMORY_MIB + 1;
        assert!(c.validate().is_err());
        let mut c = config();
        c.vcpus = 0;
        assert!(c.validate().is_err());
        c.vcpus = 256;
        assert!(c.validate().is_err());
        c.vcpus = 255;
        assert!(c.validate().is_ok());
        c.placement.tick_ms = 1;
        assert_eq!(c.validate(), Err(ConfigError::TickOutOfRange(1)));
        let mut c = config();
        let disk: DiskConfig = "a.img".parse().unwrap();
        c.virtio.disks = vec![disk; MAX_VIRTIO_DEVICES];
        assert!(c.validate().is_ok());
        c.virtio.rng = true;
        assert_eq!(c.validate(), Err(ConfigError::TooManyDevices(9)));
    }

    #[test]
    fn disk_options() {
        let d: DiskConfig = "/img/root.raw,readonly=on".parse().unwrap();
        assert_eq!(d.path, PathBuf::from("/img/root.raw"));
        assert!(d.readonly);
        assert!(!"x,readonly=off".parse::<DiskConfig>().unwrap().readonly);
        assert!("".parse::<DiskConfig>().is_err());
        assert!(",readonly=on".parse::<DiskConfig>().is_err());
        assert!("x,ro".parse::<DiskConfig>().is_err());
    }

    #[test]
    fn net_options() {
        let n: NetConfig = "tap=tap0,mac=52:54:00:00:00:01".parse().unwrap();
        assert_eq!(n.tap, "tap0");
        assert_eq!(n.mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!("tap=t".parse::<NetConfig>().unwrap().mac, None);
        for bad in [
            "",
            "tap=",
            "t0",
            "tap=t,mac=01:00:00:00:00:00",
            "tap=t,speed=10",
        ] {
            assert!(bad.parse::<NetConfig>().is_err(), "{bad}");
        }
    }
}
