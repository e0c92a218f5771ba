//! How L1 is run: QEMU's `-cpu` and TCG settings, extra words for L1's kernel command line, the
//! parameters L1's init gives the KVM modules, and extra pvmm arguments. A tuning is named by presets joined with
//! `+` (e.g. `single+nothp`), each applied in order on top of the base settings ([`BASE_CPU`]), so soak runs and rig
//! tests can name exactly what they ran.

use std::fmt;
use std::str::FromStr;

use crate::error::RigError;
use crate::guest_kernel::GuestKernel;
use crate::l1_qemu::{L1Qemu, NEWER_MAJOR};

/// QEMU's `-cpu` for L1 before any preset changes it: an EPYC with SVM and nested paging.
/// QEMU's `EPYC` is a first-generation Zen (family 23, model 1).
pub const BASE_CPU: &str = "EPYC,+svm,+npt";

/// The CPU model of [`BASE_CPU`].
const BASE_MODEL: &str = "EPYC";

/// The preset that makes L1's CPU a Zen 2 (QEMU's `EPYC-Rome`: family 23, model 49, known to
/// Debian 12's QEMU 7.2), keeping the `-cpu` flags. It exists for 6.12 guests: amd-pstate
/// refuses CPU family 23 below model 0x30 without a word (`amd_cppc_supported()` in
/// drivers/cpufreq/amd-pstate.c), and the guest sees L1's CPU model through KVM (QEMU's
/// `-cpu host`, pvmm's CPUID passthrough), so on the base `EPYC` a 6.12 guest would never
/// load the driver that ranks its cores. The rig adds it by itself for a 6.12 guest
/// ([`L1Tuning::for_guest_kernel`]).
pub const ZEN2_PRESET: &str = "epyc-rome";

/// [`ZEN2_PRESET`]'s CPU model.
const ZEN2_MODEL: &str = "EPYC-Rome";

/// The preset the rig uses when none is named (`cargo xtask rig`, the rig tests, the
/// benchmarks): L1's KVM shadows L2's page tables instead of using the emulated CPU's nested
/// paging. Measured side by side with `base` (docs/rig.md, "Rig reliability"): no guest triple
/// fault where `base` had them, and guests reach init sooner.
pub const DEFAULT_VARIANT: &str = "npt0";

/// One named change to L1's settings.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    /// The name used in `--variant`.
    pub name: &'static str,
    /// What it changes, for `--help` and reports.
    pub about: &'static str,
    change: Change,
}

#[derive(Debug, Clone, Copy)]
enum Change {
    Nothing,
    Cpu(&'static str),
    /// The model part of `-cpu` (before the first `,`), the flags kept ([`BASE_CPU`]'s when
    /// there are none, as after `cpu-max`).
    CpuModel(&'static str),
    SingleThread,
    TbSize(u32),
    Cmdline(&'static [&'static str]),
    Kvm(&'static [&'static str]),
    KvmAmd(&'static [&'static str]),
    Pvmm(&'static [&'static str]),
    Qemu(L1Qemu),
}

/// The presets, in the order `rig-soak --help` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "base",
        about: "the rig's settings before any tuning (EPYC,+svm,+npt, tcg thread=multi)",
        change: Change::Nothing,
    },
    Preset {
        name: "qemu10",
        about: "QEMU 10 runs L1: the host's when it is that new, else fetched from Debian bookworm-backports",
        change: Change::Qemu(L1Qemu::Newer),
    },
    Preset {
        name: "single",
        about: "-accel tcg,thread=single: one host thread runs all L1 vCPUs in turn",
        change: Change::SingleThread,
    },
    Preset {
        name: "tb256",
        about: "-accel tcg,tb-size=256 (MiB of translated code; QEMU's default is 1024)",
        change: Change::TbSize(256),
    },
    Preset {
        name: "cpu-max",
        about: "-cpu max: every feature TCG implements (its SVM features included)",
        change: Change::Cpu("max"),
    },
    Preset {
        name: ZEN2_PRESET,
        about: "-cpu EPYC-Rome (flags kept): a Zen 2, whose model amd-pstate accepts; added by itself for 6.12 guests",
        change: Change::CpuModel(ZEN2_MODEL),
    },
    Preset {
        name: "no-x2apic",
        about: "-cpu EPYC,+svm,+npt,-x2apic",
        change: Change::Cpu("EPYC,+svm,+npt,-x2apic"),
    },
    Preset {
        name: "svm-lean",
        about: "kvm_amd vgif=0 vls=0 avic=0 pause_filter_count=0",
        change: Change::KvmAmd(&["vgif=0", "vls=0", "avic=0", "pause_filter_count=0"]),
    },
    Preset {
        name: "npt0",
        about: "kvm_amd npt=0: L1's KVM shadows L2's page tables (no emulated nested paging)",
        change: Change::KvmAmd(&["npt=0"]),
    },
    Preset {
        name: "hpoll0",
        about: "kvm halt_poll_ns=0: L1's KVM blocks a halted vCPU at once instead of polling",
        change: Change::Kvm(&["halt_poll_ns=0"]),
    },
    Preset {
        name: "nothp",
        about: "L1 transparent_hugepage=never: no huge pages, no khugepaged collapses under L2",
        change: Change::Cmdline(&["transparent_hugepage=never"]),
    },
    Preset {
        name: "quiet-clock",
        about: "L1 nmi_watchdog=0 clocksource=tsc tsc=reliable nohz=off",
        change: Change::Cmdline(&[
            "nmi_watchdog=0",
            "clocksource=tsc",
            "tsc=reliable",
            "nohz=off",
        ]),
    },
    Preset {
        name: "policy-none",
        about: "pvmm --policy none: pvmm never moves its vCPU threads between L1 CPUs",
        change: Change::Pvmm(&["--policy", "none"]),
    },
];

/// L1's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L1Tuning {
    /// The name it was parsed from (`base`, `single+nothp`).
    pub name: String,
    /// The QEMU that runs L1.
    pub qemu: L1Qemu,
    /// QEMU's `-cpu`.
    pub cpu: String,
    /// `-accel tcg,thread=multi` (true) or `thread=single`.
    pub tcg_multi_thread: bool,
    /// `-accel tcg,tb-size=N` in MiB, when set.
    pub tb_size_mib: Option<u32>,
    /// Words appended to L1's kernel command line.
    pub cmdline_extra: Vec<String>,
    /// `name=value` parameters for kvm.ko.
    pub kvm_params: Vec<String>,
    /// `name=value` parameters for kvm-amd.ko.
    pub kvm_amd_params: Vec<String>,
    /// Arguments appended to every pvmm VM's own (the inner VMM's choices that change what
    /// the emulated SVM sees).
    pub pvmm_args: Vec<String>,
}

impl L1Tuning {
    /// The settings before any preset: [`BASE_CPU`], multi-threaded TCG, nothing else.
    pub fn base() -> L1Tuning {
        L1Tuning {
            name: "base".into(),
            qemu: L1Qemu::System,
            cpu: BASE_CPU.into(),
            tcg_multi_thread: true,
            tb_size_mib: None,
            cmdline_extra: Vec::new(),
            kvm_params: Vec::new(),
            kvm_amd_params: Vec::new(),
            pvmm_args: Vec::new(),
        }
    }

    /// QEMU's `-accel` value.
    pub fn accel(&self) -> String {
        let mut accel = format!(
            "tcg,thread={}",
            if self.tcg_multi_thread {
                "multi"
            } else {
                "single"
            }
        );
        if let Some(size) = self.tb_size_mib {
            accel.push_str(&format!(",tb-size={size}"));
        }
        accel
    }

    /// Shell assignments L1's init sources before loading the KVM modules.
    pub fn module_script(&self) -> String {
        crate::scripts::assemble(
            &[
                ("RIG_KVM_PARAMS", &self.kvm_params.join(" ")),
                ("RIG_KVM_AMD_PARAMS", &self.kvm_amd_params.join(" ")),
            ],
            &[],
        )
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Nothing => {}
            Change::Cpu(cpu) => self.cpu = cpu.into(),
            Change::CpuModel(model) => {
                let flags = match self.cpu.split_once(',') {
                    Some((_, flags)) => flags,
                    None => BASE_CPU.split_once(',').map_or("", |(_, flags)| flags),
                };
                self.cpu = format!("{model},{flags}");
            }
            Change::SingleThread => self.tcg_multi_thread = false,
            Change::TbSize(size) => self.tb_size_mib = Some(size),
            Change::Cmdline(words) => extend(&mut self.cmdline_extra, words),
            Change::Kvm(params) => extend(&mut self.kvm_params, params),
            Change::KvmAmd(params) => extend(&mut self.kvm_amd_params, params),
            Change::Pvmm(args) => extend(&mut self.pvmm_args, args),
            Change::Qemu(qemu) => self.qemu = qemu,
        }
    }
}

impl L1Tuning {
    /// These settings for a rig whose guests boot `kernel`: with [`ZEN2_PRESET`] added
    /// (`npt0+epyc-rome`) when the kernel needs a CPU amd-pstate accepts
    /// ([`GuestKernel::needs_cppc_cpu`]) and L1's CPU is still the base `EPYC` model; as they
    /// are otherwise (another model was asked for: the asker's choice stands).
    pub fn for_guest_kernel(&self, kernel: GuestKernel) -> L1Tuning {
        let model = self.cpu.split(',').next().unwrap_or_default();
        let mut tuning = self.clone();
        if kernel.needs_cppc_cpu() && model == BASE_MODEL {
            tuning.apply(Change::CpuModel(ZEN2_MODEL));
            tuning.name = format!("{}+{ZEN2_PRESET}", self.name);
        }
        tuning
    }
}

fn extend(list: &mut Vec<String>, words: &[&str]) {
    list.extend(words.iter().map(|w| w.to_string()));
}

impl Default for L1Tuning {
    /// [`DEFAULT_VARIANT`].
    fn default() -> Self {
        DEFAULT_VARIANT.parse().unwrap_or_else(|_| L1Tuning::base())
    }
}

impl FromStr for L1Tuning {
    type Err = RigError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut tuning = L1Tuning::base();
        for part in text.split('+') {
            let preset = PRESETS.iter().find(|p| p.name == part).ok_or_else(|| {
                RigError::BadArgs(format!(
                    "unknown variant '{part}' in '{text}': expected presets joined with '+', from {}",
                    PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
                ))
            })?;
            tuning.apply(preset.change);
        }
        tuning.name = text.into();
        Ok(tuning)
    }
}

impl fmt::Display for L1Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (-cpu {} -accel {}",
            self.name,
            self.cpu,
            self.accel()
        )?;
        for (what, words) in [
            ("L1 cmdline +", &self.cmdline_extra),
            ("kvm", &self.kvm_params),
            ("kvm_amd", &self.kvm_amd_params),
            ("pvmm", &self.pvmm_args),
        ] {
            if !words.is_empty() {
                write!(f, "; {what} {}", words.join(" "))?;
            }
        }
        if self.qemu == L1Qemu::Newer {
            write!(f, "; QEMU {NEWER_MAJOR} or newer")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu10_changes_only_the_qemu() {
        let t: L1Tuning = "qemu10".parse().unwrap();
        assert_eq!(t.qemu, L1Qemu::Newer);
        assert_eq!(
            L1Tuning {
                name: "base".into(),
                qemu: L1Qemu::System,
                ..t.clone()
            },
            L1Tuning::base()
        );
        assert!(t.to_string().ends_with("; QEMU 10 or newer)"));
    }

    #[test]
    fn presets_combine_in_order() {
        let t: L1Tuning = "single+svm-lean+hpoll0+nothp+tb256".parse().unwrap();
        assert_eq!(t.accel(), "tcg,thread=single,tb-size=256");
        assert_eq!(t.cpu, BASE_CPU);
        assert_eq!(t.kvm_params, ["halt_poll_ns=0"]);
        assert_eq!(t.kvm_amd_params.len(), 4);
        assert_eq!(t.cmdline_extra, ["transparent_hugepage=never"]);
        assert_eq!(
            t.module_script(),
            "#!/bin/sh\nRIG_KVM_PARAMS=halt_poll_ns=0\n\
             RIG_KVM_AMD_PARAMS='vgif=0 vls=0 avic=0 pause_filter_count=0'\n"
        );
        let base: L1Tuning = "base".parse().unwrap();
        assert_eq!(base, L1Tuning::base());
        assert_eq!(base.accel(), "tcg,thread=multi");
        assert_eq!("cpu-max".parse::<L1Tuning>().unwrap().cpu, "max");
        let pinned: L1Tuning = "policy-none".parse().unwrap();
        assert_eq!(pinned.pvmm_args, ["--policy", "none"]);
    }

    #[test]
    fn a_612_guest_gets_a_zen2_l1_and_a_61_guest_the_default() {
        let default = L1Tuning::default();
        assert_eq!(default.for_guest_kernel(GuestKernel::Linux6_1), default);
        let zen2 = default.for_guest_kernel(GuestKernel::Linux6_12);
        assert_eq!(zen2.cpu, "EPYC-Rome,+svm,+npt");
        assert_eq!(zen2.name, "npt0+epyc-rome");
        assert_eq!(zen2, "npt0+epyc-rome".parse::<L1Tuning>().unwrap());
        assert_eq!(zen2.kvm_amd_params, ["npt=0"]);
        // Already Zen 2, or another model asked for: left alone.
        assert_eq!(zen2.for_guest_kernel(GuestKernel::Linux6_12), zen2);
        let max: L1Tuning = "cpu-max".parse().unwrap();
        assert_eq!(max.for_guest_kernel(GuestKernel::Linux6_12), max);
        let lean = "no-x2apic"
            .parse::<L1Tuning>()
            .unwrap()
            .for_guest_kernel(GuestKernel::Linux6_12);
        assert_eq!(lean.cpu, "EPYC-Rome,+svm,+npt,-x2apic");
        assert_eq!(
            "cpu-max+epyc-rome".parse::<L1Tuning>().unwrap().cpu,
            "EPYC-Rome,+svm,+npt"
        );
    }

    #[test]
    fn unknown_presets_are_refused() {
        for bad in ["", "fast", "single+", "base+single+x"] {
            assert!(bad.parse::<L1Tuning>().is_err(), "{bad}");
        }
        assert!(PRESETS.iter().all(|p| p.name.parse::<L1Tuning>().is_ok()));
        assert!(DEFAULT_VARIANT.parse::<L1Tuning>().is_ok());
    }
}
