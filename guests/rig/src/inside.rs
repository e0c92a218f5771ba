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
