//! Which Linux the guest boots: Debian 12's cloud kernel (6.1, the default) or Debian 13's
//! (6.12).
//!
//! L1 always runs Debian 12's 6.1 cloud kernel with that package's KVM modules, and its base
//! layer holds the same kernel for the guests ([`inside::GUEST_KERNEL`]). 6.12 is there for
//! what 6.1 lacks: its amd-pstate driver reads each CPU's CPPC highest performance and, when
//! they differ, ranks the cores (`amd_pstate_prefcore_ranking`) and hands the ranking to the
//! scheduler as ITMT core priorities (`CONFIG_SCHED_MC_PRIO`), so the guest's own scheduler
//! acts on the capacities pvmm publishes. Choosing it changes four things:
//!
//! - its kernel comes from Debian `trixie`, through a private apt ([`crate::private_apt`]):
//!   the package `linux-image-cloud-amd64` depends on there, unpacked, checked for
//!   [`REQUIRED_612_CONFIG`], and kept as `guests/out/guest/vmlinuz-6.12`;
//! - L1 gets a layer holding it at [`inside::GUEST_KERNEL_612`], built only for rigs that
//!   boot it;
//! - the guest's command line gets [`GUEST_612_CMDLINE`];
//! - L1's CPU becomes a Zen 2 model ([`crate::tuning::L1Tuning::for_guest_kernel`]), which
//!   the guest inherits through KVM.
//!
//! Its bzImage compresses the kernel with zstd, which the rig does not unpack, so 6.12 boots
//! as a bzImage only (no PVH form).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::cache::copy_if_newer;
use crate::debian::{find_deb, find_one, unpack_kernel, KERNEL_METAPACKAGE};
use crate::error::{io_err, ImageError, RigError};
use crate::host::progress;
use crate::inside;
use crate::private_apt::PrivateApt;
use crate::workspace::Workspace;

/// The form of the guest kernel an inner VMM boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelForm {
    /// The Debian bzImage, which decompresses itself.
    #[default]
    BzImage,
    /// The same kernel uncompressed (an ELF vmlinux), entered through PVH: pvmm's PVH boot,
    /// QEMU's `-kernel` with its PVH option ROM. L1 needs the vmlinux layer
    /// (`L1Needs::vmlinux`).
    Pvh,
}

impl KernelForm {
    /// Its path in L1 for L1's own kernel, 6.1 (every guest kernel's:
    /// [`GuestKernel::l1_path`]).
    pub fn path(self) -> &'static str {
        match self {
            KernelForm::BzImage => inside::GUEST_KERNEL,
            KernelForm::Pvh => inside::GUEST_VMLINUX,
        }
    }

    /// Its name in labels and tables.
    pub fn name(self) -> &'static str {
        match self {
            KernelForm::BzImage => "bzImage",
            KernelForm::Pvh => "pvh",
        }
    }
}

/// The Debian suite the 6.12 kernel comes from.
pub const TRIXIE_SUITE: &str = "trixie";

/// Added to a 6.12 guest's command line. Without a mode on its command line, 6.12 leaves
/// amd-pstate off on machines whose ACPI FADT names no PM profile or a server one (below CPU
/// family 0x1A), as pvmm's and QEMU's do. `passive`: the cpufreq governor picks each CPU's
/// performance and amd-pstate writes it as the CPPC desired performance; the `active` (EPP)
/// mode would hand that choice to an energy-performance preference the VM's CPPC does not
/// model. The preferred-core ranking is the same in both modes.
pub const GUEST_612_CMDLINE: &[&str] = &["amd_pstate=passive"];

/// What a 6.12 kernel package must be built with to rank cores: the amd-pstate driver, the
/// ACPI CPPC library it reads the performance levels with, and ITMT core priorities.
pub const REQUIRED_612_CONFIG: [&str; 3] = [
    "CONFIG_X86_AMD_PSTATE",
    "CONFIG_ACPI_CPPC_LIB",
    "CONFIG_SCHED_MC_PRIO",
];

/// The guest's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GuestKernel {
    /// Debian 12's cloud kernel, L1's own.
    #[default]
    Linux6_1,
    /// Debian 13's cloud kernel.
    Linux6_12,
}

impl GuestKernel {
    /// Every choice, in `--guest-kernel`'s order.
    pub const ALL: [GuestKernel; 2] = [GuestKernel::Linux6_1, GuestKernel::Linux6_12];

    /// Its name on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            GuestKernel::Linux6_1 => "6.1",
            GuestKernel::Linux6_12 => "6.12",
        }
    }

    /// Words its guests' command lines get besides the rig's own.
    pub fn cmdline_extra(self) -> &'static [&'static str] {
        match self {
            GuestKernel::Linux6_1 => &[],
            GuestKernel::Linux6_12 => GUEST_612_CMDLINE,
        }
    }

    /// Whether L1's CPU must be a model amd-pstate accepts: it refuses CPU family 0x17 below
    /// model 0x30 (Zen 1, as QEMU's `EPYC`) without a word (`amd_cppc_supported()`).
    pub fn needs_cppc_cpu(self) -> bool {
        self == GuestKernel::Linux6_12
    }

    /// Its path in L1 in `form`; an error for a form the rig does not build for it.
    pub fn l1_path(self, form: KernelForm) -> Result<&'static str, RigError> {
        match (self, form) {
            (GuestKernel::Linux6_1, form) => Ok(form.path()),
            (GuestKernel::Linux6_12, KernelForm::BzImage) => Ok(inside::GUEST_KERNEL_612),
            (GuestKernel::Linux6_12, KernelForm::Pvh) => Err(RigError::BadArgs(
                "guest kernel 6.12 boots as a bzImage only (xtask: --kernel bzimage, \
                 --kernels bzimage): its payload is zstd-compressed and the rig unpacks LZ4 \
                 payloads only, so there is no PVH form of it"
                    .into(),
            )),
        }
    }
}

impl FromStr for GuestKernel {
    type Err = RigError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        GuestKernel::ALL
            .into_iter()
            .find(|k| k.name() == text)
            .ok_or_else(|| {
                RigError::BadArgs(format!(
                    "invalid guest kernel '{text}': expected {}",
                    GuestKernel::ALL.map(GuestKernel::name).join(" or ")
                ))
            })
    }
}

impl fmt::Display for GuestKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel fetched for the guests.
#[derive(Debug, Clone)]
pub struct KernelImage {
    /// The Debian package it came from.
    pub package: String,
    /// The bzImage.
    pub kernel: PathBuf,
    /// The package's `boot/config-*`.
    pub config: PathBuf,
}

/// The 6.12 kernel package: the one the suite's metapackage depends on. Offline when the lists
/// fetched before name a package already downloaded; otherwise the lists are fetched again
/// first (a download needs the network anyway, and stale lists name packages the mirror has
/// dropped).
fn resolve_612(apt: &PrivateApt) -> Result<String, ImageError> {
    if let Some(package) = apt
        .kernel_dependency(KERNEL_METAPACKAGE)
        .filter(|package| find_deb(&apt.debs(), package).is_some())
    {
        return Ok(package);
    }
    progress(&format!(
        "guest kernel 6.12: apt-get update for Debian {TRIXIE_SUITE} (private lists; the machine's apt setup is untouched)"
    ));
    apt.update()?;
    apt.kernel_dependency(KERNEL_METAPACKAGE)
        .ok_or_else(|| ImageError::Apt {
            action: "depends",
            suite: TRIXIE_SUITE.into(),
            why: format!("{KERNEL_METAPACKAGE} names no linux-image package"),
        })
}

/// Fetches (once per package) and unpacks the 6.12 kernel package, checks its configuration,
/// and copies its bzImage to `guest_dir/vmlinuz-6.12`.
pub fn fetch_612(ws: &Workspace, guest_dir: &Path) -> Result<KernelImage, ImageError> {
    let apt = PrivateApt::new(TRIXIE_SUITE, ws.out.join("trixie-apt"));
    let _lock = apt.prepare()?;
    let package = resolve_612(&apt)?;
    let debs = apt.debs();
    let deb = match find_deb(&debs, &package) {
        Some(deb) => deb,
        None => {
            progress(&format!("guest kernel 6.12 {package}: apt-get download"));
            apt.download(&[&package])?;
            find_deb(&debs, &package)
                .ok_or_else(|| ImageError::Missing(debs.join(format!("{package}_*.deb"))))?
        }
    };
    let unpacked = unpack_kernel(ws, &package, &deb)?;
    let boot = unpacked.join("boot");
    let config = find_one(&boot, "config-")?;
    let text = std::fs::read_to_string(&config).map_err(io_err(&config))?;
    let missing = missing_config(&text, &REQUIRED_612_CONFIG);
    if !missing.is_empty() {
        return Err(ImageError::KernelConfig {
            package,
            config,
            missing,
        });
    }
    let kernel = guest_dir.join("vmlinuz-6.12");
    copy_if_newer(&find_one(&boot, "vmlinuz-")?, &kernel)?;
    progress(&format!(
        "guest kernel 6.12: {package} ({})",
        kernel.display()
    ));
    Ok(KernelImage {
        package,
        kernel,
        config,
    })
}

/// The options of `required` that the kernel configuration `config` does not build in
/// (`CONFIG_X=y`).
fn missing_config(config: &str, required: &[&'static str]) -> Vec<&'static str> {
    required
        .iter()
        .filter(|option| {
            !config
                .lines()
                .any(|line| line.strip_prefix(**option) == Some("=y"))
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        for kernel in GuestKernel::ALL {
            assert_eq!(kernel.name().parse::<GuestKernel>().unwrap(), kernel);
            assert_eq!(kernel.to_string(), kernel.name());
        }
        assert_eq!(GuestKernel::default(), GuestKernel::Linux6_1);
        for bad in ["", "6", "6.12.1", "trixie"] {
            assert!(bad.parse::<GuestKernel>().is_err(), "{bad}");
        }
    }

    #[test]
    fn each_kernel_has_its_path_cmdline_and_cpu_need() {
        let (old, new) = (GuestKernel::Linux6_1, GuestKernel::Linux6_12);
        assert_eq!(
            old.l1_path(KernelForm::BzImage).unwrap(),
            inside::GUEST_KERNEL
        );
        assert_eq!(old.l1_path(KernelForm::Pvh).unwrap(), inside::GUEST_VMLINUX);
        assert_eq!(
            new.l1_path(KernelForm::BzImage).unwrap(),
            inside::GUEST_KERNEL_612
        );
        assert!(new.l1_path(KernelForm::Pvh).is_err());
        assert!(old.cmdline_extra().is_empty());
        assert_eq!(new.cmdline_extra(), ["amd_pstate=passive"]);
        assert!(!old.needs_cppc_cpu());
        assert!(new.needs_cppc_cpu());
    }

    #[test]
    fn finds_options_not_built_in() {
        let config = "CONFIG_X86_AMD_PSTATE=y\nCONFIG_X86_AMD_PSTATE_DEFAULT_MODE=3\n\
                      CONFIG_ACPI_CPPC_LIB=m\n# CONFIG_SCHED_MC_PRIO is not set\n";
        assert_eq!(
            missing_config(config, &REQUIRED_612_CONFIG),
            ["CONFIG_ACPI_CPPC_LIB", "CONFIG_SCHED_MC_PRIO"]
        );
        let full = "CONFIG_SCHED_MC_PRIO=y\nCONFIG_ACPI_CPPC_LIB=y\nCONFIG_X86_AMD_PSTATE=y\n";
        assert!(missing_config(full, &REQUIRED_612_CONFIG).is_empty());
    }

    #[test]
    fn the_trixie_metapackage_dependency_is_read() {
        // `apt-cache depends linux-image-cloud-amd64` on Debian 13's lists.
        let listing =
            "linux-image-cloud-amd64\n  Depends: linux-image-6.12.117+deb13-cloud-amd64\n";
        assert_eq!(
            crate::debian::kernel_dependency(listing).as_deref(),
            Some("linux-image-6.12.117+deb13-cloud-amd64")
        );
    }
}
