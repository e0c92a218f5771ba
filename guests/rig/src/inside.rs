//! Paths of files inside the rig's images, shared by the image builder and the rig's
//! command lines.

/// The guest kernel in L1 (L1's own, Debian 12's 6.1).
pub const GUEST_KERNEL: &str = "/guest/vmlinuz";
/// The 6.12 guest kernel in L1, when its layer is there.
pub const GUEST_KERNEL_612: &str = "/guest/vmlinuz-6.12";
/// The guest initramfs in L1.
pub const GUEST_INITRD: &str = "/guest/initrd.cpio";
/// The guest kernel uncompressed (an ELF vmlinux for PVH boots) in L1.
pub const GUEST_VMLINUX: &str = "/guest/vmlinux";
/// pvmm in L1.
pub const PVMM: &str = "/bin/pvmm";
/// QEMU in L1.
pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";
/// pvmm-load in the guest.
pub const PVMM_LOAD: &str = "/bin/pvmm-load";
/// The guest's virtio drivers (in its initramfs and on its root disk).
pub const GUEST_VIRTIO_MODULES: &str = "/lib/modules/virtio";
/// The guest's virtio drivers' paths, one per line, in load order.
pub const GUEST_VIRTIO_ORDER: &str = "/lib/modules/virtio/order";
/// The guest's root disk image in L1 (an ext4 image of the guest's userland).
pub const GUEST_ROOT_DISK: &str = "/guest/root.ext4";
/// A file only the guest's root disk holds: the guest's init runs from the disk when it is there.
pub const GUEST_ROOT_DISK_MARK: &str = "/etc/pvmm-root-disk";
/// L1's tap driver.
pub const L1_TUN_MODULE: &str = "/lib/modules/rig/tun.ko";
/// e2fsprogs' fsck in L1 (with the root disk's layer): replays the journal of an image a
/// killed VMM left.
pub const E2FSCK: &str = "/sbin/e2fsck";
/// e2fsprogs' debugfs in L1 (with the root disk's layer): reads files out of an image.
pub const DEBUGFS: &str = "/sbin/debugfs";

/// The kernbench disk in L1 ([`crate::kernbench_disk`]).
pub const KERNBENCH_DISK: &str = "/guest/kernbench.ext4";
