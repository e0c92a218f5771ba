//! `cargo xtask rig-soak`: the rig booted many times, the arms (L1 variant, guest kernel and
//! its form) taking turns, and how each boot ended ([`pvmm_rig::soak`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use pvmm_rig::images;
use pvmm_rig::soak::{format_tallies, run_soak, BusyLoops, SoakOptions};
use pvmm_rig::tuning::DEFAULT_VARIANT;
use pvmm_rig::workspace::Workspace;
use pvmm_rig::{GuestKernel, InnerVmm, KernelForm, L1Tuning, Topology, VmSpec};

use super::{
    check_guest_forms, l1_images, parse_kernel_form, rig_error_exit, DEFAULT_GUEST_CMD,
    EXIT_BUILD_FAILURE,
};

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// Boots per variant.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    boots: u32,
    /// Variants, comma-separated, each presets joined with '+'.
    #[arg(long = "variant", value_delimiter = ',', default_value = DEFAULT_VARIANT, value_name = "NAME[+NAME...],...")]
    variants: Vec<L1Tuning>,
    /// The guests' kernels, comma-separated (6.1, 6.12), booted in turn with every variant like
    /// the variants; a 6.12 boot's L1 gets the CPU model 6.12 needs (EPYC-Rome). Unless the
    /// list is 6.1 alone, rows are named VARIANT@KERNEL.
    #[arg(
        long = "guest-kernel",
        value_delimiter = ',',
        default_value = "6.1",
        value_name = "6.1|6.12,..."
    )]
    guest_kernels: Vec<GuestKernel>,
    /// The guest kernel's forms, comma-separated: bzimage (the Debian bzImage), pvh (the same
    /// kernel uncompressed, entered through PVH; 6.1 only), booted in turn with every kernel.
    /// Unless the list is bzimage alone, rows end in @FORM, and every boot's L1 carries the
    /// vmlinux layer.
    #[arg(long, value_delimiter = ',', default_value = "bzimage", value_parser = parse_kernel_form, value_name = "bzimage|pvh,...")]
    kernel: Vec<KernelForm>,
    /// VMs side by side in each boot.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    vms: u32,
    /// Inner VMMs, comma-separated, used by the VMs in turn (e.g. pvmm,qemu).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pvmm",
        value_name = "pvmm|qemu,..."
    )]
    vmm: Vec<InnerVmm>,
    /// vCPUs per VM (default 4 for one VM, 2 for several).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: Option<u32>,
    /// Memory per VM in MiB (default 512 for one VM, 256 for several).
    #[arg(long, value_parser = clap::value_parser!(u64).range(64..=65536))]
    memory: Option<u64>,
    /// Busy loops to run on the host meanwhile (the rig fails more often under load).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    load: u32,
    /// L1 CPU topology.
    #[arg(long, default_value = "2x2x1", value_name = "SxCxT")]
    topology: Topology,
    /// Hard timeout of one boot in seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=3600))]
    timeout: u64,
    /// Folder for each boot's full log (default guests/out/soak/UNIX_TIME).
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
}

/// `cargo xtask rig-soak`.
pub fn run(ws: &Workspace, args: SoakArgs) -> ExitCode {
    let SoakArgs {
        boots,
        variants,
        guest_kernels,
        kernel: kernel_forms,
        vms,
        vmm,
        vcpus,
        memory,
        load,
        topology,
        timeout,
        log_dir,
    } = args;
    let one = vms == 1;
    let shape = [
        "--vcpus".to_string(),
        vcpus.unwrap_or(if one { 4 } else { 2 }).to_string(),
        "--memory".to_string(),
        memory.unwrap_or(if one { 512 } else { 256 }).to_string(),
    ];
    let specs: Vec<VmSpec> = (0..vms as usize)
        .map(|i| VmSpec {
            vmm: vmm[i % vmm.len()],
            args: shape.to_vec(),
            guest_command: Some(DEFAULT_GUEST_CMD.to_string()),
        })
        .collect();
    // One set of images per guest kernel, with the vmlinux layer when any form needs it (the
    // bzImage arms then boot the same L1 as the PVH ones).
    let form = if kernel_forms.contains(&KernelForm::Pvh) {
        KernelForm::Pvh
    } else {
        KernelForm::BzImage
    };
    for &kernel in &guest_kernels {
        if let Err(code) = check_guest_forms(kernel, &kernel_forms) {
            return code;
        }
    }
    let mut images = Vec::new();
    for &kernel in &guest_kernels {
        if images.iter().any(|(k, _)| *k == kernel) {
            continue;
        }
        match l1_images(ws, &specs, kernel, form, false) {
            Ok(built) => images.push((kernel, built)),
            Err(code) => return code,
        }
    }
    let log_dir = log_dir.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        ws.out.join("soak").join(now.to_string())
    });
    let options = SoakOptions {
        variants,
        guest_kernels,
        kernel_forms,
        boots,
        vms: specs,
        topology,
        timeout: Duration::from_secs(timeout),
        log_dir,
    };
    soak(ws, &images, &options, load)
}

/// Runs `cargo xtask rig-soak` under `load` busy loops and prints the table; `images` holds
/// the L1 images for each of the soak's guest kernels.
fn soak(
    ws: &Workspace,
    images: &[(GuestKernel, images::L1Images)],
    options: &SoakOptions,
    load: u32,
) -> ExitCode {
    let loops = match BusyLoops::start(load) {
        Ok(loops) => loops,
        Err(error) => {
            eprintln!("xtask: error: cannot start the busy loops: {error}");
            return ExitCode::from(EXIT_BUILD_FAILURE);
        }
    };
    let vms: Vec<String> = options
        .vms
        .iter()
        .map(|vm| format!("{} {}", vm.vmm.name(), vm.args.join(" ")))
        .collect();
    eprintln!(
        "xtask: soak: {} boots of each of {} arms, VMs [{}], L1 {}, {load} busy loops; logs in {}",
        options.boots,
        options.arms().len(),
        vms.join("; "),
        options.topology,
        options.log_dir.display()
    );
    for variant in &options.variants {
        eprintln!("xtask: variant {variant}");
    }
    // Every kernel of the soak has its images; a kernel without them would get the first
    // kernel's, which the rig refuses when they lack its layer.
    let images_for = |kernel: GuestKernel| {
        images
            .iter()
            .find(|(k, _)| *k == kernel)
            .map_or(&images[0].1, |(_, i)| i)
    };
    let result = run_soak(ws, images_for, options, |line| eprintln!("xtask: {line}"));
    drop(loops);
    match result {
        Ok(tallies) => {
            print!("{}", format_tallies(&tallies));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("xtask: error: {error}");
            ExitCode::from(rig_error_exit(&error))
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Task};

    fn soak_args(args: &[&str]) -> Result<SoakArgs, clap::Error> {
        let argv = ["cargo xtask", "rig-soak"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Task::RigSoak(args) => Ok(args),
            other => panic!("rig-soak parsed as {other:?}"),
        }
    }

    #[test]
    fn kernel_forms_default_to_the_bzimage_and_take_a_list() {
        assert_eq!(soak_args(&[]).unwrap().kernel, [KernelForm::BzImage]);
        assert_eq!(
            soak_args(&["--kernel", "bzimage,pvh"]).unwrap().kernel,
            [KernelForm::BzImage, KernelForm::Pvh]
        );
        assert!(soak_args(&["--kernel", "vmlinuz"]).is_err());
    }
}
