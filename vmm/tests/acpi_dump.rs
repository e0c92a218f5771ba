//! `pvmm --dump-acpi DIR` writes tables that `iasl -d` (acpica-tools) disassembles without
//! errors, with one 23-entry `_CPC` per vCPU. Needs iasl: skipped loudly without it, unless
//! PVMM_REQUIRE_IASL=1 (CI), where its absence fails the test.

mod common;
use common::*;
use std::process::Command;

fn iasl_available() -> bool {
    let ok = Command::new("iasl").arg("-v").output().is_ok();
    if !ok {
        if std::env::var("PVMM_REQUIRE_IASL").as_deref() == Ok("1") {
            panic!("iasl (acpica-tools) is not installed and PVMM_REQUIRE_IASL=1");
        }
        eprintln!(
            "\n!!! SKIPPED acpi_dump: iasl (Debian package acpica-tools) is not installed !!!\n"
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

#[test]
fn dump_to_an_unwritable_place_is_bad_input() {
    let out = pvmm(&["--dump-acpi", "/proc/pvmm-cannot-write-here"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}
