//! Building the images: the Debian cloud kernel and its KVM modules, the guest initramfs, the
//! static `pvmm` and `pvmm-load` binaries, and the L1 initramfs layers.
//!
//! Everything goes into the git-ignored `guests/out/`. Steps whose outputs are newer than their
//! inputs are skipped. Archives are reproducible (see [`crate::cpio`]): entries are sorted,
//! owned by root and stamped with `SOURCE_DATE_EPOCH` (0 when unset). The kernel package is the
//! one `linux-image-cloud-amd64` depends on at build time (recorded in
//! `guests/out/guest/manifest.txt`); set `PVMM_GUEST_KERNEL_PACKAGE` to pin another. A guest
//! may boot Debian 13's 6.12 kernel instead ([`crate::guest_kernel`]), in an L1 layer of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cache::{copy_if_newer, up_to_date};
use crate::cpio::CpioArchive;
use crate::debian::{find_deb, find_one, resolve_kernel_package, unpack_kernel};
use crate::error::{io_err, ImageError};
use crate::guest_kernel::{self, GuestKernel, KernelImage};
use crate::host::{is_static_elf, progress, run_tool, shared_libraries, which, BUSYBOX, QEMU};
use crate::inside;
use crate::packages;
use crate::root_disk;
use crate::scripts;
use crate::workspace::Workspace;

/// The rust target the static binaries are built for (the only std installed on our machines).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The kernel modules L1 loads, in load order (kvm.ko needs irqbypass.ko).
const KVM_MODULES: [(&str, &str); 3] = [
    ("irqbypass", "kernel/virt/lib/irqbypass.ko"),
    ("kvm", "kernel/arch/x86/kvm/kvm.ko"),
    ("kvm-amd", "kernel/arch/x86/kvm/kvm-amd.ko"),
];

/// L1's tap driver, loaded by runs with a tap network ([`crate::rig::Rig::tap`]).
const TUN_MODULE: (&str, &str) = ("tun", "kernel/drivers/net/tun.ko");

/// The guest's virtio drivers, in load order (each needs those before it). Debian's 6.1 cloud
/// kernel builds the whole virtio stack as modules (`CONFIG_VIRTIO=m`): the MMIO transport that
/// pvmm's devices use (bound through their DSDT entries, `LNRO0005`), the PCI transport that
/// QEMU's use, and the block, network and entropy drivers. The guest's init loads them when the
/// VM has virtio devices ([`crate::scripts::GUEST_INIT`]).
const GUEST_VIRTIO_MODULES: [(&str, &str); 11] = [
    ("virtio_ring", "kernel/drivers/virtio/virtio_ring.ko"),
    ("virtio", "kernel/drivers/virtio/virtio.ko"),
    ("virtio_mmio", "kernel/drivers/virtio/virtio_mmio.ko"),
    (
        "virtio_pci_legacy_dev",
        "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
    ),
    (
        "virtio_pci_modern_dev",
        "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
    ),
    ("virtio_pci", "kernel/drivers/virtio/virtio_pci.ko"),
    ("virtio_blk", "kernel/drivers/block/virtio_blk.ko"),
    ("failover", "kernel/net/core/failover.ko"),
    ("net_failover", "kernel/drivers/net/net_failover.ko"),
    ("virtio_net", "kernel/drivers/net/virtio_net.ko"),
    ("virtio-rng", "kernel/drivers/char/hw_random/virtio-rng.ko"),
];

/// QEMU firmware files the inner QEMU needs for `-kernel` boots with `-nodefaults`, looked up in
/// QEMU's Debian firmware path. `bios-256k.bin` is SeaBIOS; the option ROMs load the kernel.
const QEMU_FIRMWARE: [&str; 6] = [
    "/usr/share/seabios/bios-256k.bin",
    "/usr/share/seabios/bios.bin",
    "/usr/share/qemu/linuxboot_dma.bin",
    "/usr/share/qemu/linuxboot.bin",
    "/usr/share/qemu/kvmvapic.bin",
    "/usr/share/qemu/pvh.bin",
];

/// The guest images and the kernel modules of the same kernel package.
#[derive(Debug, Clone)]
pub struct GuestImages {
    /// The Debian package the kernel came from.
    pub kernel_package: String,
    /// The guest (and L1) kernel, a bzImage.
    pub kernel: PathBuf,
    /// The 6.12 guest kernel, when asked for.
    pub kernel_612: Option<KernelImage>,
    /// The guest initramfs (uncompressed newc cpio).
    pub initrd: PathBuf,
    /// irqbypass.ko, kvm.ko, kvm-amd.ko, in load order.
    pub kvm_modules: Vec<PathBuf>,
    /// tun.ko, for L1's taps.
    pub tun_module: PathBuf,
    /// The guest's virtio drivers, in load order (in the initramfs).
    pub virtio_modules: Vec<PathBuf>,
    /// The static pvmm-load in the guest's userland.
    pub load: PathBuf,
}

/// The files the image build takes from the kernel package.
struct KernelFiles {
    package: String,
    kernel: PathBuf,
    kvm_modules: Vec<PathBuf>,
    tun_module: PathBuf,
    virtio_modules: Vec<PathBuf>,
}

/// The fixed modification time of archive entries: `SOURCE_DATE_EPOCH`, else 0.
fn archive_mtime() -> u32 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Downloads and unpacks the kernel package; returns the kernel and the modules the rig uses.
fn fetch_kernel(ws: &Workspace) -> Result<KernelFiles, ImageError> {
    let package = resolve_kernel_package()?;
    let debs = ws.dir("debs")?;
    let deb = match find_deb(&debs, &package) {
        Some(deb) => {
            progress(&format!("kernel package {package}: have {}", deb.display()));
            deb
        }
        None => {
            progress(&format!("kernel package {package}: apt-get download"));
            run_tool(
                Command::new("apt-get")
                    .arg("download")
                    .arg(&package)
                    .current_dir(&debs),
                "apt",
            )?;
            find_deb(&debs, &package)
                .ok_or_else(|| ImageError::Missing(debs.join(format!("{package}_*.deb"))))?
        }
    };
    let unpacked = unpack_kernel(ws, &package, &deb)?;
    let kernel = find_one(&unpacked.join("boot"), "vmlinuz-")?;
    let modules_root = find_one(&unpacked.join("lib").join("modules"), "")?;
    let module = |relative: &str| {
        let path = modules_root.join(relative);
        if path.is_file() {
            Ok(path)
        } else {
            Err(ImageError::Missing(path))
        }
    };
    let modules = |list: &[(&str, &str)]| -> Result<Vec<PathBuf>, ImageError> {
        list.iter().map(|(_, r)| module(r)).collect()
    };
    Ok(KernelFiles {
        package,
        kernel,
        kvm_modules: modules(&KVM_MODULES)?,
        tun_module: module(TUN_MODULE.1)?,
        virtio_modules: modules(&GUEST_VIRTIO_MODULES)?,
    })
}

/// Adds busybox and a symlink per applet (from `busybox --list-full`).
fn add_busybox(archive: &mut CpioArchive) -> Result<(), ImageError> {
    let busybox = Path::new(BUSYBOX);
    if !is_static_elf(busybox)? {
        return Err(ImageError::BusyboxNotStatic(BUSYBOX.to_string()));
    }
    archive.add_file_from("bin/busybox", busybox, 0o755)?;
    let applets = run_tool(Command::new(BUSYBOX).arg("--list-full"), "busybox-static")?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        if applet == "bin/busybox" {
            continue;
        }
        archive.add_symlink(applet, "/bin/busybox")?;
    }
    Ok(())
}

/// The directories and device node every initramfs of ours starts with.
fn base_archive() -> Result<CpioArchive, ImageError> {
    let mut archive = CpioArchive::new(archive_mtime());
    for dir in ["dev", "proc", "sys", "tmp", "root", "etc"] {
        archive.add_dir(dir, 0o755)?;
    }
    // The kernel opens /dev/console for init's stdio before init mounts devtmpfs.
    archive.add_char_device("dev/console", 0o600, 5, 1)?;
    Ok(archive)
}

/// Builds a binary of this workspace as a static executable; returns its path.
pub fn build_static(ws: &Workspace, package: &str, binary: &str) -> Result<PathBuf, ImageError> {
    progress(&format!(
        "building static {binary} (cargo build --release --target {STATIC_TARGET} -p {package})"
    ));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            STATIC_TARGET,
            "-p",
            package,
        ])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(&ws.root)
        .status()
        .map_err(|source| ImageError::ToolMissing {
            program: "cargo".into(),
            package: "rust toolchain",
            source,
        })?;
    if !status.success() {
        return Err(ImageError::ToolFailed {
            command: format!("cargo build --release --target {STATIC_TARGET} -p {package}"),
            status,
            stderr: "see the compiler output above".into(),
        });
    }
    let path = ws
        .target_dir()
        .join(STATIC_TARGET)
        .join("release")
        .join(binary);
    if !path.is_file() {
        return Err(ImageError::Missing(path));
    }
    Ok(path)
}

/// Builds the guest images (`cargo xtask guest`): the kernel (and L1's KVM modules) from the
/// Debian package, and the busybox initramfs with `/init` and `pvmm-load`. Every rig entry
/// point comes through here, so the Debian packages are made available first
/// ([`packages::ensure`]). With `guest_kernel` 6.12 its kernel is fetched too
/// ([`guest_kernel::fetch_612`]); L1's kernel and the default guest's stay 6.1.
pub fn build_guest(ws: &Workspace, guest_kernel: GuestKernel) -> Result<GuestImages, ImageError> {
    packages::ensure()?;
    let files = fetch_kernel(ws)?;
    let guest_dir = ws.dir("guest")?;
    let kernel = guest_dir.join("vmlinuz");
    copy_if_newer(&files.kernel, &kernel)?;
    let kernel_612 = match guest_kernel {
        GuestKernel::Linux6_1 => None,
        GuestKernel::Linux6_12 => Some(guest_kernel::fetch_612(ws, &guest_dir)?),
    };
    let load = build_static(ws, "pvmm-load", "pvmm-load")?;
    let initrd = guest_dir.join("initrd.cpio");
    let init = scripts::source("guest-init.sh");
    let mut inputs: Vec<&Path> = vec![&load, Path::new(BUSYBOX), &init];
    inputs.extend(files.virtio_modules.iter().map(PathBuf::as_path));
    if up_to_date(&initrd, &inputs) {
        progress(&format!("guest initramfs up to date: {}", initrd.display()));
    } else {
        progress(&format!("writing guest initramfs {}", initrd.display()));
        guest_userland(&load, &files.virtio_modules)?.write_to(&initrd)?;
    }
    let manifest = guest_dir.join("manifest.txt");
    let mut text = format!(
        "kernel package: {}\nkernel: {}\ninitrd: {}\nmodules: {}\n",
        files.package,
        files.kernel.display(),
        initrd.display(),
        files
            .kvm_modules
            .iter()
            .chain([&files.tun_module])
            .chain(&files.virtio_modules)
            .map(|m| m.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    if let Some(image) = &kernel_612 {
        text.push_str(&format!(
            "guest kernel 6.12 package: {}\nguest kernel 6.12: {}\nguest kernel 6.12 config: {}\n",
            image.package,
            image.kernel.display(),
            image.config.display()
        ));
    }
    std::fs::write(&manifest, text).map_err(io_err(&manifest))?;
    Ok(GuestImages {
        kernel_package: files.package,
        kernel,
        kernel_612,
        initrd,
        kvm_modules: files.kvm_modules,
        tun_module: files.tun_module,
        virtio_modules: files.virtio_modules,
        load,
    })
}

/// The guest's userland, as its initramfs holds it and its root disk
/// ([`crate::root_disk`]) too: busybox, `/init`, `pvmm-load`, and the virtio drivers with
/// their load order in [`inside::GUEST_VIRTIO_ORDER`].
pub fn guest_userland(load: &Path, virtio_modules: &[PathBuf]) -> Result<CpioArchive, ImageError> {
    let mut archive = base_archive()?;
    add_busybox(&mut archive)?;
    archive.add_file_bytes("init", scripts::GUEST_INIT.as_bytes(), 0o755)?;
    archive.add_file_from(inside::PVMM_LOAD, load, 0o755)?;
    let mut order = String::new();
    for ((name, _), module) in GUEST_VIRTIO_MODULES.iter().zip(virtio_modules) {
        let path = format!("{}/{name}.ko", inside::GUEST_VIRTIO_MODULES);
        archive.add_file_from(&path, module, 0o644)?;
        order.push_str(&path);
        order.push('\n');
    }
    archive.add_file_bytes(inside::GUEST_VIRTIO_ORDER, order.as_bytes(), 0o644)?;
    Ok(archive)
}

/// Which optional L1 layers to build.
#[derive(Debug, Clone, Copy, Default)]
pub struct L1Needs {
    /// The static pvmm (`/bin/pvmm`).
    pub pvmm: bool,
    /// QEMU with its libraries and firmware (`--vmm qemu`, the boot benchmark).
    pub qemu: bool,
    /// The guest kernel uncompressed, for PVH boots (the boot benchmark).
    pub vmlinux: bool,
    /// The guest kernel the VMs boot: 6.1 is always there (the base layer holds it: it is
    /// L1's own kernel); 6.12 is fetched and gets a layer of its own.
    pub guest_kernel: GuestKernel,
    /// The guest's root disk image and e2fsprogs to read it back ([`crate::root_disk`]).
    pub root_disk: bool,
    /// The kernbench disk: a toolchain and a source tree ([`crate::kernbench_disk`]).
    pub kernbench: bool,
}

/// The L1 initramfs layers; the rig concatenates them with a per-run job layer (Linux unpacks
/// concatenated cpio archives in order).
#[derive(Debug, Clone)]
pub struct L1Images {
    /// The guest images (the kernel doubles as L1's kernel).
    pub guest: GuestImages,
    /// busybox, init, the KVM modules, the guest kernel and initramfs.
    pub base: PathBuf,
    /// The static pvmm, when built.
    pub pvmm: Option<PathBuf>,
    /// QEMU and what it needs, when built.
    pub qemu: Option<PathBuf>,
    /// The uncompressed guest kernel, when built.
    pub vmlinux: Option<PathBuf>,
    /// The 6.12 guest kernel ([`inside::GUEST_KERNEL_612`]), when built.
    pub kernel_612: Option<PathBuf>,
    /// The guest's root disk and e2fsprogs, when built.
    pub root_disk: Option<PathBuf>,
    /// The kernbench disk, when built.
    pub kernbench: Option<PathBuf>,
}

impl L1Images {
    /// The layer files in order.
    pub fn layers(&self) -> Vec<PathBuf> {
        let mut layers = vec![self.base.clone()];
        layers.extend(self.pvmm.iter().cloned());
        layers.extend(self.qemu.iter().cloned());
        layers.extend(self.vmlinux.iter().cloned());
        layers.extend(self.kernel_612.iter().cloned());
        layers.extend(self.root_disk.iter().cloned());
        layers.extend(self.kernbench.iter().cloned());
        layers
    }

    /// Whether the layers hold `kernel` for the guests.
    pub fn has_guest_kernel(&self, kernel: GuestKernel) -> bool {
        match kernel {
            GuestKernel::Linux6_1 => true,
            GuestKernel::Linux6_12 => self.kernel_612.is_some(),
        }
    }
}

/// The L1 layer `name` holding the one file `source` at `inside` (mode `mode`), written when
/// `source` is newer than it.
fn file_layer(
    l1_dir: &Path,
    name: &str,
    inside: &str,
    source: &Path,
    mode: u32,
) -> Result<PathBuf, ImageError> {
    let layer = l1_dir.join(name);
    if up_to_date(&layer, &[source]) {
        progress(&format!("L1 layer up to date: {}", layer.display()));
    } else {
        progress(&format!("writing L1 layer {} ({inside})", layer.display()));
        let mut archive = CpioArchive::new(archive_mtime());
        archive.add_file_from(inside, source, mode)?;
        archive.write_to(&layer)?;
    }
    Ok(layer)
}

/// The L1 layer holding the guest kernel uncompressed ([`inside::GUEST_VMLINUX`]), unpacked
/// from the bzImage `kernel` when it is newer than the layer.
fn vmlinux_layer(kernel: &Path, l1_dir: &Path) -> Result<PathBuf, ImageError> {
    let layer = l1_dir.join("vmlinux.cpio");
    if up_to_date(&layer, &[kernel]) {
        progress(&format!("L1 vmlinux layer up to date: {}", layer.display()));
        return Ok(layer);
    }
    progress(&format!(
        "writing L1 vmlinux layer {} (the guest kernel unpacked for PVH)",
        layer.display()
    ));
    let bzimage = std::fs::read(kernel).map_err(io_err(kernel))?;
    let vmlinux = crate::vmlinux::extract(&bzimage).map_err(|source| ImageError::Vmlinux {
        kernel: kernel.to_path_buf(),
        source,
    })?;
    let mut archive = CpioArchive::new(archive_mtime());
    archive.add_file_bytes(inside::GUEST_VMLINUX, &vmlinux, 0o644)?;
    archive.write_to(&layer)?;
    Ok(layer)
}

/// The L1 layer with QEMU, the libraries `ldd` lists for it and its firmware (`--vmm qemu`),
/// written when the host's QEMU is newer than it.
fn qemu_layer(l1_dir: &Path) -> Result<PathBuf, ImageError> {
    let binary = which(QEMU).ok_or_else(|| ImageError::ToolMissing {
        program: QEMU.into(),
        package: "qemu-system-x86",
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    let layer = l1_dir.join("qemu.cpio");
    if up_to_date(&layer, &[&binary]) {
        progress(&format!("L1 qemu layer up to date: {}", layer.display()));
    } else {
        progress(&format!(
            "writing L1 qemu layer {} (qemu, its libraries, firmware)",
            layer.display()
        ));
        let mut archive = CpioArchive::new(archive_mtime());
        archive.add_file_from(inside::QEMU, &binary, 0o755)?;
        for library in shared_libraries(&binary)? {
            let path = library.to_string_lossy().into_owned();
            archive.add_file_from(&path, &library, 0o755)?;
        }
        for firmware in QEMU_FIRMWARE {
            let source = Path::new(firmware);
            if !source.exists() {
                return Err(ImageError::Missing(source.to_path_buf()));
            }
            archive.add_file_from(firmware, source, 0o644)?;
        }
        archive.write_to(&layer)?;
    }
    Ok(layer)
}

/// Builds the L1 layers (and the guest images first).
pub fn build_l1(ws: &Workspace, needs: L1Needs) -> Result<L1Images, ImageError> {
    let guest = build_guest(ws, needs.guest_kernel)?;
    let l1_dir = ws.dir("l1")?;
    let (init, lib) = (scripts::source("l1-init.sh"), scripts::source("l1-lib.sh"));

    let base = l1_dir.join("base.cpio");
    let mut inputs: Vec<&Path> = vec![
        &guest.kernel,
        &guest.initrd,
        Path::new(BUSYBOX),
        &init,
        &lib,
    ];
    inputs.extend(guest.kvm_modules.iter().map(PathBuf::as_path));
    inputs.push(&guest.tun_module);
    if up_to_date(&base, &inputs) {
        progress(&format!("L1 base layer up to date: {}", base.display()));
    } else {
        progress(&format!("writing L1 base layer {}", base.display()));
        let mut archive = base_archive()?;
        add_busybox(&mut archive)?;
        archive.add_file_bytes("init", scripts::L1_INIT.as_bytes(), 0o755)?;
        archive.add_file_bytes("rig/lib.sh", scripts::L1_LIB.as_bytes(), 0o644)?;
        for ((name, _), module) in KVM_MODULES.iter().zip(&guest.kvm_modules) {
            archive.add_file_from(&format!("lib/modules/rig/{name}.ko"), module, 0o644)?;
        }
        archive.add_file_from(inside::L1_TUN_MODULE, &guest.tun_module, 0o644)?;
        archive.add_file_from(inside::GUEST_KERNEL, &guest.kernel, 0o644)?;
        archive.add_file_from(inside::GUEST_INITRD, &guest.initrd, 0o644)?;
        archive.write_to(&base)?;
    }

    let pvmm = if needs.pvmm {
        let binary = build_static(ws, "pvmm", "pvmm")?;
        Some(file_layer(
            &l1_dir,
            "pvmm.cpio",
            inside::PVMM,
            &binary,
            0o755,
        )?)
    } else {
        None
    };
    let kernel_612 = match &guest.kernel_612 {
        Some(image) => Some(file_layer(
            &l1_dir,
            "kernel-6.12.cpio",
            inside::GUEST_KERNEL_612,
            &image.kernel,
            0o644,
        )?),
        None => None,
    };

    let qemu = if needs.qemu {
        Some(qemu_layer(&l1_dir)?)
    } else {
        None
    };

    let vmlinux = if needs.vmlinux {
        Some(vmlinux_layer(&guest.kernel, &l1_dir)?)
    } else {
        None
    };

    let root_disk = if needs.root_disk {
        let userland = guest_userland(&guest.load, &guest.virtio_modules)?;
        Some(root_disk::build_layer(
            &ws.dir("guest")?,
            &l1_dir,
            userland,
            &[&guest.initrd],
            archive_mtime(),
        )?)
    } else {
        None
    };

    let kernbench = if needs.kernbench {
        Some(crate::kernbench_disk::build_layer(
            &ws.dir("kernbench")?,
            &ws.dir("guest")?,
            &l1_dir,
            archive_mtime(),
        )?)
    } else {
        None
    };

    Ok(L1Images {
        guest,
        base,
        pvmm,
        qemu,
        vmlinux,
        kernel_612,
        root_disk,
        kernbench,
    })
}
