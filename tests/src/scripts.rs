//! The rig tests' shell scripts, held as files in `tests/scripts/` (checked by shellcheck in
//! CI) and given their parameters as shell variables through [`pvmm_rig::scripts::assemble`].

use pvmm_rig::scripts;

/// Guest shell helpers the tests' guest commands start with: `l CPU SECS` starts one
/// 100 %-busy pvmm-load thread pinned to guest CPU `CPU` in the background (so the test knows
/// which vCPU is busy); `e SECS` sets the deadline `$E`, SECS whole seconds of uptime from now
/// (less the current second's fraction), and `u CPU` starts the same thread, ending at `$E`:
/// threads started one after another (a process start can take the guest a second under load)
/// end together, so a phase of several busy vCPUs ends as one; `r LABEL` prints the mark
/// `pvmm-mark: cppc-LABEL` (L1 timestamps it), then `CPPC LABEL <highest_perf of each CPU>
/// GED <ACPI:Ged interrupts>`.
pub const GUEST_HELPERS: &str = include_str!("../scripts/guest-helpers.sh");

/// `rig_api`'s guest command.
pub const API_GUEST: &str = include_str!("../scripts/api-guest.sh");
/// `rig_api`'s L1 side, before the placement probe.
pub const API_PROBE: &str = include_str!("../scripts/api-probe.sh");
/// `rig_asym_packing`'s guest command.
pub const ASYM_GUEST: &str = include_str!("../scripts/asym-guest.sh");
/// `rig_boot`'s probe beside each VMM: the most QEMU vCPU threads it saw at once.
pub const BOOT_QEMU_PROBE: &str = include_str!("../scripts/boot-qemu-probe.sh");
/// `rig_boot`'s probe that fakes an L1 soft lockup.
pub const BOOT_LOCKUP_PROBE: &str = include_str!("../scripts/boot-lockup-probe.sh");
/// `rig_cppc`'s live-capacity guest command.
pub const CPPC_LIVE_GUEST: &str = include_str!("../scripts/cppc-live-guest.sh");
/// `rig_cppc`'s shared-CPU guest command.
pub const CPPC_SHARED_GUEST: &str = include_str!("../scripts/cppc-shared-guest.sh");
/// `rig_host`'s guest command of each VM.
pub const HOST_GUEST: &str = include_str!("../scripts/host-guest.sh");
/// `rig_host`'s rise-and-fall guest command.
pub const HOST_RISE_FALL_GUEST: &str = include_str!("../scripts/host-rise-fall-guest.sh");
/// `rig_host`'s probe, before the placement probe.
pub const HOST_PROBE_BEGIN: &str = include_str!("../scripts/host-probe-begin.sh");
/// `rig_host`'s probe, after the placement probe.
pub const HOST_PROBE_END: &str = include_str!("../scripts/host-probe-end.sh");
/// `rig_hotplug`'s guest command.
pub const HOTPLUG_GUEST: &str = include_str!("../scripts/hotplug-guest.sh");
/// `rig_hotplug`'s L1 side, before the placement probe.
pub const HOTPLUG_PROBE: &str = include_str!("../scripts/hotplug-probe.sh");
/// `rig_placement`'s powersaving guest command.
pub const PLACEMENT_POWERSAVING_GUEST: &str =
    include_str!("../scripts/placement-powersaving-guest.sh");
/// `rig_placement`'s guest command for the other policies.
pub const PLACEMENT_SPREAD_GUEST: &str = include_str!("../scripts/placement-spread-guest.sh");
/// `rig_prefcore`'s guest command.
pub const PREFCORE_GUEST: &str = include_str!("../scripts/prefcore-guest.sh");

/// `rig_cgroup`'s guest command (every vCPU busy).
pub const CGROUP_GUEST: &str = include_str!("../scripts/cgroup-guest.sh");
/// `rig_cgroup`'s L1 probe.
pub const CGROUP_PROBE: &str = include_str!("../scripts/cgroup-probe.sh");
/// `rig_cgroup`'s L1 setup (the cgroup, the daemon).
pub const CGROUP_SETUP: &str = include_str!("../scripts/cgroup-setup.sh");
/// `rig_virtio`'s first guest (disks, network, entropy).
pub const VIRTIO_GUEST: &str = include_str!("../scripts/virtio-guest.sh");
/// `rig_virtio`'s second guest, killed after a flush.
pub const VIRTIO_KILL_GUEST: &str = include_str!("../scripts/virtio-kill-guest.sh");
/// `rig_virtio`'s L1 probe beside each VM.
pub const VIRTIO_PROBE: &str = include_str!("../scripts/virtio-probe.sh");
/// `rig_virtio`'s L1 setup (the read-only image).
pub const VIRTIO_SETUP: &str = include_str!("../scripts/virtio-setup.sh");

/// Every script file of the tests, by file name.
pub const ALL: &[(&str, &str)] = &[
    ("guest-helpers.sh", GUEST_HELPERS),
    ("api-guest.sh", API_GUEST),
    ("api-probe.sh", API_PROBE),
    ("asym-guest.sh", ASYM_GUEST),
    ("cgroup-guest.sh", CGROUP_GUEST),
    ("cgroup-probe.sh", CGROUP_PROBE),
    ("cgroup-setup.sh", CGROUP_SETUP),
    ("boot-qemu-probe.sh", BOOT_QEMU_PROBE),
    ("boot-lockup-probe.sh", BOOT_LOCKUP_PROBE),
    ("cppc-live-guest.sh", CPPC_LIVE_GUEST),
    ("cppc-shared-guest.sh", CPPC_SHARED_GUEST),
    ("host-guest.sh", HOST_GUEST),
    ("host-rise-fall-guest.sh", HOST_RISE_FALL_GUEST),
    ("host-probe-begin.sh", HOST_PROBE_BEGIN),
    ("host-probe-end.sh", HOST_PROBE_END),
    ("hotplug-guest.sh", HOTPLUG_GUEST),
    ("hotplug-probe.sh", HOTPLUG_PROBE),
    (
        "placement-powersaving-guest.sh",
        PLACEMENT_POWERSAVING_GUEST,
    ),
    ("placement-spread-guest.sh", PLACEMENT_SPREAD_GUEST),
    ("prefcore-guest.sh", PREFCORE_GUEST),
    ("virtio-guest.sh", VIRTIO_GUEST),
    ("virtio-kill-guest.sh", VIRTIO_KILL_GUEST),
    ("virtio-probe.sh", VIRTIO_PROBE),
    ("virtio-setup.sh", VIRTIO_SETUP),
];

/// A guest command: [`GUEST_HELPERS`], then `script` with `vars` set.
pub fn guest(vars: &[(&str, &str)], script: &str) -> String {
    scripts::guest_command(vars, &[GUEST_HELPERS, script])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_file_is_listed_and_starts_with_a_shebang() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
        assert_eq!(scripts::check_files(&dir, ALL), Vec::<String>::new());
    }

    #[test]
    fn every_guest_command_fits_the_kernel_command_line() {
        // Each guest script with its variables at their longest (a few digits each).
        let vars: Vec<(&str, &str)> = ["A", "B", "C", "D", "E", "F", "G"]
            .into_iter()
            .map(|name| (name, "1234567"))
            .collect();
        for (name, text) in ALL.iter().filter(|(n, _)| n.ends_with("-guest.sh")) {
            let command = guest(&vars, text);
            for kernel in pvmm_rig::GuestKernel::ALL {
                let cmdline = pvmm_rig::rig::guest_cmdline(
                    pvmm_rig::InnerVmm::Pvmm,
                    kernel,
                    Some(&command),
                    false,
                );
                assert!(cmdline.is_ok(), "{name}: {cmdline:?}");
            }
        }
    }
}
