//! pvmm's guest images and QEMU-nested test rig, as a library for `cargo xtask` and the
//! end-to-end tests.
//!
//! - [`packages`]: the Debian packages the rig and the tests need, installed when missing
//!   (as root) or named in the one command to run.
//! - [`guest_kernel`]: which Linux the guests boot (Debian 12's 6.1, L1's own, or Debian 13's
//!   6.12) and fetching 6.12.
//! - [`private_apt`]: apt on a Debian suite the machine's apt setup does not name.
//! - [`images`]: builds the Debian cloud kernel, the busybox guest initramfs (with
//!   `pvmm-load`), static binaries and the L1 initramfs layers into `guests/out/`, on:
//!   [`workspace`] (the workspace and `guests/out/`), [`cache`] (skipping steps whose outputs
//!   are up to date), [`debian`] (the kernel package and `.deb` files), [`host`] (this
//!   machine's programs and progress lines) and [`inside`] (file paths inside the images).
//! - [`error`]: the crate's error types.
//! - [`rig`]: boots L1 under QEMU TCG with an emulated multi-socket AMD CPU with SVM, runs pvmm
//!   (or QEMU with KVM) inside it on the guest images, and classifies the console output.
//! - [`activity`]: L1's package idle time and modelled energy from a probe's samples.
//! - [`bench`](mod@bench): the boot-time benchmark, pvmm vs QEMU in one L1 boot.
//! - [`host_bench`]: several VMs under `pvmm host`, each pvmm on its own, and QEMU unpinned
//!   (`cargo xtask bench-host`).
//! - [`probe`]: the L1 probes' lines and their parser (the placement tests' probe and trace).
//! - [`kernbench`], [`kernbench_disk`]: a real compile in the guests under each policy, and
//!   the disk with its toolchain and source tree (`cargo xtask bench-kernbench`).
//! - [`placement_bench`]: the kernbench-like placement benchmark (`cargo xtask bench-placement`).
//! - [`sequence`]: several pvmm runs (policies, loads) in one L1 boot.
//! - [`tuning`]: L1's QEMU, kernel and KVM-module settings, by preset name.
//! - [`soak`]: counting rig outcomes by kind over many boots (`cargo xtask rig-soak`).
//! - [`guest_soak`]: many guests one after another in one L1, and what each leaves behind in
//!   it (`cargo xtask rig-guest-soak`).
//! - [`runner`]: the benchmarks' one runner: cases, rounds, shared boots, resuming after L1
//!   fails, progress lines and tables.
//! - [`retry`]: booting the rig again when it fails by itself, and a boot's whole log.
//! - [`vmlinux`]: the uncompressed kernel inside a bzImage, for PVH boots.
//! - [`figures`]: medians and aligned tables for the benchmarks' reports.
//! - [`cpio`], [`scripts`]: the initramfs writer and the init scripts.

pub mod activity;
pub mod bench;
pub mod cache;
pub mod cpio;
pub mod debian;
pub mod error;
pub mod figures;
pub mod guest_kernel;
pub mod guest_soak;
pub mod host;
pub mod host_bench;
pub mod images;
pub mod inside;
pub mod io_bench;
pub mod kernbench;
pub mod kernbench_disk;
pub mod l1_qemu;
pub mod packages;
pub mod placement_bench;
pub mod private_apt;
pub mod probe;
pub mod retry;
pub mod rig;
pub mod root_disk;
pub mod runner;
pub mod scripts;
pub mod sequence;
pub mod soak;
pub mod tuning;
pub mod vmlinux;
pub mod workspace;

pub use guest_kernel::GuestKernel;
pub use rig::{
    InnerVmm, KernelForm, Rig, RigEnd, RigError, RigOutcome, RunLines, Topology, VmSpec,
};
pub use sequence::{run_pvmm_sequence, PvmmRun, SequenceOptions};
pub use tuning::L1Tuning;
