//! What the guest's CPPC registers say: pvmm's capacities on the guest's performance scale,
//! and the frequencies that scale stands for.
//!
//! The placement engine counts capacity from 1 to [`CAPACITY_SCALE`] (1024 = a host CPU of
//! the vCPU's own); the `--stats` lines and the control socket keep that scale. The guest sees
//! it mapped onto 1..[`CPPC_HIGHEST_PERF`] by [`perf_of_capacity`], because Linux's amd-pstate
//! turns a CPU's highest performance into the scheduler's ITMT priority (its "preferred core"
//! ranking) only when it is below 255 (`CPPC_MAX_PERF` in drivers/cpufreq/amd-pstate.c,
//! `amd_pstate_update_limits`), and newer kernels keep performance levels in 8 bits.
//!
//! amd-pstate also decides once, when it starts, whether preferred cores exist at all: only
//! when at least two CPUs report different highest performance (`amd_detect_prefcore` in
//! arch/x86/kernel/acpi/cppc.c). Every vCPU starts with the same capacity, so
//! [`guest_perfs`] breaks that tie (see [`TIE_BREAK_STEP`]).

use std::path::Path;

use pvmm_devices::cppc::CPPC_LOWEST_PERF;
use pvmm_scheduler::capacity::CAPACITY_SCALE;

/// The top of the guest's performance scale: the performance of a vCPU with a host CPU of
/// its own (capacity [`CAPACITY_SCALE`]). 254, the largest value amd-pstate passes on to the
/// scheduler's ITMT priorities (it ignores 255, `CPPC_MAX_PERF`).
pub const CPPC_HIGHEST_PERF: u32 = 254;
const _: () = assert!(CPPC_HIGHEST_PERF < 255, "amd-pstate ignores 255 and above");

/// How far [`guest_perfs`] moves a vCPU to break a tie between all vCPUs: one step of the
/// scale, the smallest difference the guest can see, so no vCPU is shown more than one step
/// away from its capacity.
pub const TIE_BREAK_STEP: u32 = 1;

/// Nominal frequency when the host says nothing (no cpufreq driver, no CPUID leaf 0x16, as in
/// most VMs): 2 GHz, a base clock within the range of current x86 server CPUs. The guest only
/// shows it (cpufreq's `cpuinfo_max_freq`) and scales the lowest frequency from it; nothing in
/// pvmm's placement depends on it.
pub const DEFAULT_NOMINAL_FREQ_MHZ: u32 = 2000;

/// A nominal frequency below this is not one (x86 CPUs that run KVM have base clocks well
/// above it) and is ignored: a reading of a few MHz would also leave no room for amd-pstate's
/// check that the lowest-nonlinear frequency lies above the lowest frequency.
pub const MIN_NOMINAL_FREQ_MHZ: u32 = 500;

/// The host's cpufreq directory for CPU 0.
pub const SYSFS_CPUFREQ: &str = "/sys/devices/system/cpu/cpu0/cpufreq";

/// cpufreq files giving the nominal frequency in kHz, best first: the base (non-turbo)
/// frequency, which Intel's and AMD's drivers export, else the highest frequency.
const NOMINAL_FREQ_FILES: [&str; 2] = ["base_frequency", "cpuinfo_max_freq"];

/// kHz per MHz.
const KHZ_PER_MHZ: u32 = 1000;

/// CPUID leaf 0x16 (processor frequency information): EAX bits 15:0 are the base frequency
/// in MHz, 0 when not reported.
const CPUID_FREQ_LEAF: u32 = 0x16;
const CPUID_FREQ_MASK: u32 = 0xffff;

/// The guest performance of `capacity`: capacity x [`CPPC_HIGHEST_PERF`] / [`CAPACITY_SCALE`],
/// rounded to the nearest step (so 1024 -> 254 and 512 -> 127), never below
/// [`CPPC_LOWEST_PERF`]; capacities above the scale count as a full CPU. Monotone: a larger
/// capacity never shows a lower performance.
pub const fn perf_of_capacity(capacity: u32) -> u32 {
    let capacity = if capacity > CAPACITY_SCALE {
        CAPACITY_SCALE
    } else {
        capacity
    };
    let perf = (capacity * CPPC_HIGHEST_PERF + CAPACITY_SCALE / 2) / CAPACITY_SCALE;
    if perf < CPPC_LOWEST_PERF {
        CPPC_LOWEST_PERF
    } else {
        perf
    }
}

/// The performance each vCPU shows the guest for `capacities` (by vCPU index): its
/// [`perf_of_capacity`], except when every vCPU (two or more) would show the same value. Then
/// vCPU 0 keeps it and every other vCPU shows [`TIE_BREAK_STEP`] less (or, at the bottom of
/// the scale, vCPU 0 shows one step more), so the guest's amd-pstate, whenever it starts,
/// finds two different highest performances and enables preferred cores. That is always the
/// case at start, when every vCPU has a full CPU; otherwise it is a moment of equal
/// capacities, where any order is right. Ties among some of the vCPUs are left alone: the
/// guest's scheduler treats equal priorities as equal.
pub fn guest_perfs(capacities: &[u32]) -> Vec<u32> {
    let mut perfs = Vec::with_capacity(capacities.len());
    guest_perfs_into(capacities, &mut perfs);
    perfs
}

/// [`guest_perfs`] written into `perfs`, whose room is reused.
pub fn guest_perfs_into(capacities: &[u32], perfs: &mut Vec<u32>) {
    perfs.clear();
    perfs.extend(capacities.iter().map(|&c| perf_of_capacity(c)));
    if let [first, rest @ ..] = perfs.as_mut_slice() {
        if !rest.is_empty() && rest.iter().all(|p| p == first) {
            if *first > CPPC_LOWEST_PERF {
                rest.iter_mut().for_each(|p| *p -= TIE_BREAK_STEP);
            } else {
                *first += TIE_BREAK_STEP;
            }
        }
    }
}

/// The frequencies `_CPC` gives the guest: its "Lowest Frequency" and "Nominal Frequency"
/// entries, in MHz.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CppcFrequencies {
    /// The frequency of [`CPPC_LOWEST_PERF`].
    pub lowest_mhz: u32,
    /// The frequency of [`CPPC_HIGHEST_PERF`]: what a vCPU with a host CPU of its own runs at.
    pub nominal_mhz: u32,
}

impl CppcFrequencies {
    /// The frequencies of a host whose CPUs run at `nominal_mhz`. The lowest frequency is
    /// the nominal one scaled like the performance (lowest / highest performance), not the
    /// host's lowest clock: a vCPU's performance is a share of a CPU that goes down to one
    /// step of the scale, and amd-pstate computes frequencies proportionally to performance
    /// (nominal frequency x performance / nominal performance) and refuses a CPU whose
    /// lowest-nonlinear frequency is not above the lowest frequency
    /// (drivers/cpufreq/amd-pstate.c, `amd_pstate_init_freq`).
    pub fn from_nominal(nominal_mhz: u32) -> Self {
        Self {
            lowest_mhz: (nominal_mhz * CPPC_LOWEST_PERF / CPPC_HIGHEST_PERF).max(1),
            nominal_mhz,
        }
    }

    /// The host's, read once when a VM starts: the nominal frequency from cpufreq in
    /// `cpufreq_dir` (`NOMINAL_FREQ_FILES`), else CPUID leaf 0x16, else
    /// [`DEFAULT_NOMINAL_FREQ_MHZ`]; a value below [`MIN_NOMINAL_FREQ_MHZ`] counts as none.
    pub fn host(cpufreq_dir: &Path) -> Self {
        let plausible = |mhz: u32| (mhz >= MIN_NOMINAL_FREQ_MHZ).then_some(mhz);
        let nominal = NOMINAL_FREQ_FILES
            .iter()
            .filter_map(|f| read_khz(&cpufreq_dir.join(f)))
            .find_map(|khz| plausible(khz / KHZ_PER_MHZ))
            .or_else(|| cpuid_base_mhz().and_then(plausible))
            .unwrap_or(DEFAULT_NOMINAL_FREQ_MHZ);
        Self::from_nominal(nominal)
    }
}

/// A cpufreq file's frequency in kHz.
fn read_khz(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The host CPU's base frequency from CPUID leaf 0x16 (Intel, from Skylake), if reported.
#[cfg(target_arch = "x86_64")]
fn cpuid_base_mhz() -> Option<u32> {
    use std::arch::x86_64::__cpuid;
    // Older toolchains declare `__cpuid` unsafe, newer ones safe.
    #[allow(unused_unsafe)]
    // SAFETY: `__cpuid` only runs the CPUID instruction, which every x86_64 CPU has.
    let (max_leaf, base) = unsafe { (__cpuid(0).eax, __cpuid(CPUID_FREQ_LEAF).eax) };
    let base = base & CPUID_FREQ_MASK;
    (max_leaf >= CPUID_FREQ_LEAF && base != 0).then_some(base)
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_base_mhz() -> Option<u32> {
    None
}

/// Demand counters of this process's threads, from their schedstat files: what the CPPC
/// feedback counters report to the guest.
pub struct ProcSchedstat;

impl pvmm_devices::cppc::DemandCounters for ProcSchedstat {
    fn read(&self, tid: i32) -> Option<(u64, u64)> {
        pvmm_tick::procfs::thread_demand(tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvmm_devices::cppc::CPPC_LOWEST_NONLINEAR_PERF;

    #[test]
    fn the_mapping_is_monotone_within_the_scale_and_keeps_its_ends() {
        assert_eq!(perf_of_capacity(CAPACITY_SCALE), CPPC_HIGHEST_PERF);
        assert_eq!(perf_of_capacity(1), CPPC_LOWEST_PERF);
        assert_eq!(perf_of_capacity(0), CPPC_LOWEST_PERF);
        assert_eq!(perf_of_capacity(512), 127);
        assert_eq!(perf_of_capacity(5000), CPPC_HIGHEST_PERF);
        let mut last = 0;
        for capacity in 1..=CAPACITY_SCALE {
            let perf = perf_of_capacity(capacity);
            assert!((CPPC_LOWEST_PERF..=CPPC_HIGHEST_PERF).contains(&perf));
            assert!(perf >= last, "{capacity}: {perf} < {last}");
            assert!(perf - last <= 1, "steps of the scale are not skipped");
            last = perf;
        }
    }

    #[test]
    fn equal_vcpus_are_told_apart_by_one_step() {
        let full = CAPACITY_SCALE;
        assert_eq!(guest_perfs(&[full; 4]), [254, 253, 253, 253]);
        assert_eq!(guest_perfs(&[512, 512]), [127, 126]);
        // Capacities that differ but map to the same step tie as well.
        assert_eq!(guest_perfs(&[1024, 1023, 1022]), [254, 253, 253]);
        // At the bottom of the scale vCPU 0 goes up instead of the others going to 0.
        assert_eq!(guest_perfs(&[1, 1]), [2, 1]);
        // Any real difference: nothing is changed.
        assert_eq!(guest_perfs(&[full, full, 512]), [254, 254, 127]);
        assert_eq!(guest_perfs(&[512, full]), [127, 254]);
        assert_eq!(guest_perfs(&[full]), [254]);
        assert!(guest_perfs(&[]).is_empty());
        for n in 2..=255usize {
            for capacity in [1, 7, 300, 512, 1000, full] {
                let perfs = guest_perfs(&vec![capacity; n]);
                let exact = perf_of_capacity(capacity);
                assert!(perfs.iter().all(|p| p.abs_diff(exact) <= TIE_BREAK_STEP));
                assert!(perfs.iter().any(|p| *p != perfs[0]), "{n} x {capacity}");
            }
        }
    }

    /// amd-pstate's frequency checks (drivers/cpufreq/amd-pstate.c, `amd_pstate_init_freq`,
    /// both the 6.12 arithmetic and the earlier one with a 10-bit fixed-point ratio) pass for
    /// every nominal frequency pvmm may use and every nominal performance from the
    /// lowest-nonlinear one up (nominal performance is live: it is what the vCPU has when the
    /// driver starts; highest performance equals it, so the maximum frequency is the nominal
    /// one, above the lowest).
    #[test]
    fn the_frequencies_pass_amd_pstate_checks() {
        let lnp = u64::from(CPPC_LOWEST_NONLINEAR_PERF);
        for nominal_mhz in (MIN_NOMINAL_FREQ_MHZ..=10_000).step_by(7) {
            let f = CppcFrequencies::from_nominal(nominal_mhz);
            let (low, nom) = (u64::from(f.lowest_mhz), u64::from(f.nominal_mhz));
            assert!(low > 0 && low < nom);
            for np in lnp..=u64::from(CPPC_HIGHEST_PERF) {
                let lowest_nonlinear = nom * lnp / np;
                assert!(
                    lowest_nonlinear > low && lowest_nonlinear <= nom,
                    "{nominal_mhz} {np}"
                );
                let ratio = (lnp << 10) / np;
                let lowest_nonlinear = (nom * ratio) >> 10;
                assert!(
                    lowest_nonlinear > low && lowest_nonlinear <= nom,
                    "{nominal_mhz} {np}"
                );
            }
        }
    }

    #[test]
    fn host_frequencies_come_from_cpufreq_else_a_default() {
        let dir = std::env::temp_dir().join(format!("pvmm-cpufreq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = CppcFrequencies::host(&dir);
        assert!(
            empty.nominal_mhz >= MIN_NOMINAL_FREQ_MHZ,
            "CPUID or the default"
        );
        if cpuid_base_mhz().is_none() {
            assert_eq!(empty.nominal_mhz, DEFAULT_NOMINAL_FREQ_MHZ);
        }
        std::fs::write(dir.join("cpuinfo_max_freq"), "3500000\n").unwrap();
        assert_eq!(CppcFrequencies::host(&dir).nominal_mhz, 3500);
        std::fs::write(dir.join("base_frequency"), "2450000\n").unwrap();
        let f = CppcFrequencies::host(&dir);
        assert_eq!(f, CppcFrequencies::from_nominal(2450));
        assert_eq!(f.lowest_mhz, 9);
        // An implausible base frequency falls back to the next source.
        std::fs::write(dir.join("base_frequency"), "100\n").unwrap();
        assert_eq!(CppcFrequencies::host(&dir).nominal_mhz, 3500);
        std::fs::remove_dir_all(&dir).ok();
    }
}
