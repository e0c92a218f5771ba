//! `pvmm --dump-acpi DIR` writes tables that `iasl -d` (acpica-tools) disassembles without
//! errors, with one 23-entry `_CPC` per vCPU (its CPPC enable register in pvmm's window, the
//! host's frequencies). Needs iasl: skipped loudly without it, unless PVMM_REQUIRE_IASL=1
//! (CI), where its absence fails the test.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

use pvmm::cppc::{CppcFrequencies, CPPC_HIGHEST_PERF, SYSFS_CPUFREQ};
use pvmm::layout::CPPC_MMIO_START;
use pvmm_devices::cppc::CppcRegister;

fn iasl_available() -> bool {
    let ok = Command::new("iasl").arg("-v").output().is_ok();
    if !ok {
        require_or_skip(
            Need::Iasl,
            "acpi_dump",
            "iasl (Debian package acpica-tools) is not installed",
        );
    }
    ok
}

#[test]
fn dumped_tables_disassemble_cleanly() {
    for vcpus in [1u32, 4, 255] {
        let dir = scratch(&format!("acpi-{vcpus}"));
        let out = pvmm(&[
            "--vcpus",
            &vcpus.to_string(),
            "--dump-acpi",
            dir.to_str().unwrap(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in ["rsdp", "xsdt", "facp", "apic", "dsdt"] {
            assert!(
                dir.join(format!("{name}.dat")).exists(),
                "{name}.dat missing"
            );
        }
        if !iasl_available() {
            return;
        }
        for name in ["xsdt", "facp", "apic", "dsdt"] {
            let out = Command::new("iasl")
                .arg("-d")
                .arg(format!("{name}.dat"))
                .current_dir(&dir)
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "iasl -d {name}.dat failed: {text}");
            assert!(!text.contains("Error"), "iasl -d {name}.dat: {text}");
        }
        let dsl = std::fs::read_to_string(dir.join("dsdt.dsl")).unwrap();
        assert_eq!(
            dsl.matches("Name (_CPC, Package (0x17)").count() as u32,
            vcpus
        );
        assert_eq!(dsl.matches("Name (_PSD, Package").count() as u32, vcpus);
        // Every register in the packages decodes as a Register descriptor, none as raw data.
        // 23 entries: count, revision, 5 integers, and 16 registers (8 live, 8 null).
        assert_eq!(
            dsl.matches("Register (SystemMemory").count() as u32,
            vcpus * 16
        );
        check_cpc_entries(&dsl, vcpus);
        assert!(dsl.contains("Method (_OSC, 4"));
        assert!(dsl.contains("\"ACPI0013\""));
        assert!(dsl.contains("Method (_EVT, 1"));
        // The control-method power button the GED notifies (0x80) on a shutdown request.
        assert!(dsl.contains("Device (PWRB)"), "{dsl}");
        assert!(dsl.contains("EisaId (\"PNP0C0C\")"), "{dsl}");
        assert!(dsl.contains("Notify (\\_SB.PWRB, 0x80)"), "{dsl}");
        let madt = Command::new("iasl")
            .arg("-d")
            .arg("apic.dat")
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(madt.status.success());
        let madt = std::fs::read_to_string(dir.join("apic.dsl")).unwrap();
        assert_eq!(
            madt.matches("Subtable Type : 00 [Processor Local APIC]")
                .count() as u32,
            vcpus
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Each vCPU's `_CPC` points its CPPC enable register at its block in pvmm's window and
/// ends with the reference performance (the guest's scale) and the lowest and nominal
/// frequencies pvmm computes for this host.
fn check_cpc_entries(dsl: &str, vcpus: u32) {
    for vcpu in 0..vcpus {
        let enable = CppcRegister::Enable.address(CPPC_MMIO_START, vcpu);
        let line = format!("0x{enable:016X}, // Address");
        assert_eq!(dsl.matches(&line).count(), 1, "{line}");
    }
    let freqs = CppcFrequencies::host(Path::new(SYSFS_CPUFREQ));
    let want = [
        u64::from(CPPC_HIGHEST_PERF),
        u64::from(freqs.lowest_mhz),
        u64::from(freqs.nominal_mhz),
    ];
    let packages: Vec<&str> = dsl.split("Name (_CPC").skip(1).collect();
    assert_eq!(packages.len() as u32, vcpus);
    for package in packages {
        let body = package.split("})").next().unwrap();
        let last: Vec<u64> = body
            .lines()
            .map(|l| l.trim().trim_end_matches(',').trim())
            .filter(|l| !l.is_empty())
            .rev()
            .take(3)
            .map(|l| u64::from_str_radix(l.trim_start_matches("0x"), 16).unwrap())
            .collect();
        assert_eq!(
            last,
            want.iter().rev().copied().collect::<Vec<_>>(),
            "{body}"
        );
    }
}

#[test]
fn dump_to_an_unwritable_place_is_bad_input() {
    let out = pvmm(&["--dump-acpi", "/proc/pvmm-cannot-write-here"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn virtio_devices_are_described_where_their_windows_are() {
    let dir = scratch("acpi-virtio");
    let out = pvmm(&[
        "--disk",
        "a.img",
        "--disk",
        "b.img,readonly=on",
        "--rng",
        "--dump-acpi",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !iasl_available() {
        return;
    }
    let out = Command::new("iasl")
        .args(["-d", "dsdt.dat"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let dsl = std::fs::read_to_string(dir.join("dsdt.dsl")).unwrap();
    assert_eq!(dsl.matches("\"LNRO0005\"").count(), 3, "{dsl}");
    for (i, slot) in pvmm::layout::virtio_slots(3).iter().enumerate() {
        let device = dsl
            .split(&format!("Device (VR{i:02X})"))
            .nth(1)
            .unwrap_or_else(|| panic!("VR{i:02X} missing: {dsl}"));
        let device = device.split("Device (").next().unwrap();
        assert!(
            device.contains(&format!("0x{:08X},", slot.base)),
            "{device}"
        );
        assert!(device.contains("0x00001000,"), "{device}");
        assert!(device.contains(&format!("0x{:08X},", slot.irq)), "{device}");
        assert!(device.contains("Edge, ActiveHigh, Exclusive"), "{device}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
