//! Property-based fuzzing of the kernel and initrd loaders with hostile files: ELF (PVH) and
//! bzImage kernels built field by field from valid and hostile values, then truncated and
//! overwritten at random; initrds sized around the room left after the kernel; guest memory
//! from 2 MiB up, so that kernels larger than memory are common.
//!
//! Properties: loading never panics; a refused file is one non-empty line that pvmm reports
//! with exit status 2; a loaded kernel and its entry point lie in guest RAM above 1 MiB, and the
//! initrd lies after the kernel, page aligned, below the end of low RAM.
//!
//! Seeded and bounded for CI (a few seconds); a longer run:
//! `PROPTEST_CASES=100000 cargo test -p pvmm --test fuzz_loaders` (and `PROPTEST_RNG_SEED=N`
//! for another seed).

// Casts here build and parse test files field by field: cutting a value to its field's
// width is what the format does, and a u64 offset is a usize on the 64-bit hosts pvmm runs on.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use pvmm::boot::{load_kernel, BootError, BootSpec, EntryPoint};
use pvmm::layout::{ACPI_TABLES_START, HIMEM_START, PVH_MODLIST_START, ZERO_PAGE_START};
use pvmm::memory::{create_guest_memory, low_ram_end};
use pvmm::vmm::VmmError;
use vm_memory::{Bytes, GuestAddress};

/// Cases per property in CI.
const CI_CASES: u32 = 256;
/// The fixed seed of CI runs.
const CI_SEED: u64 = 0x7076_6d6d_6675_7a7a;

fn fuzz_config() -> ProptestConfig {
    common::fuzz_config(CI_CASES, CI_SEED)
}

const PAGE: u64 = 0x1000;
const ELF_HEADER: usize = 64;
const PROGRAM_HEADER: usize = 56;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
const SETUP_HEADER: usize = 0x1f1;

/// A scratch directory per test thread (proptest cases of one test share it in turn).
fn scratch() -> PathBuf {
    common::scratch(&format!("fuzz-loaders-{:?}", std::thread::current().id()))
}

fn le16(b: &[u8], at: usize) -> u64 {
    b.get(at..at.saturating_add(2))
        .map_or(0, |s| u64::from(u16::from_le_bytes(s.try_into().unwrap())))
}
fn le32(b: &[u8], at: usize) -> u64 {
    b.get(at..at.saturating_add(4))
        .map_or(0, |s| u64::from(u32::from_le_bytes(s.try_into().unwrap())))
}
fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at.saturating_add(8))
        .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
}

/// The fields of a PVH ELF kernel: one segment, or two.
#[derive(Debug, Clone)]
struct ElfKernel {
    /// A second 16-byte segment's load address.
    second: Option<u64>,
    code_len: usize,
    paddr: u64,
    filesz: Option<u64>,
    memsz: u64,
    entry: u64,
    pvh_entry: u64,
    note_type: u32,
    note_namesz: u32,
    note_descsz: u32,
    /// How many program headers the header claims (default: as many as there are).
    phnum: Option<u16>,
    phoff: u64,
}

impl ElfKernel {
    fn bytes(&self) -> Vec<u8> {
        let code_off = 0x1000usize;
        // Room for three program headers before the note.
        let note_off = 0x100;
        let mut note = Vec::new();
        note.extend_from_slice(&self.note_namesz.to_le_bytes());
        note.extend_from_slice(&self.note_descsz.to_le_bytes());
        note.extend_from_slice(&self.note_type.to_le_bytes());
        note.extend_from_slice(b"Xen\0");
        note.extend_from_slice(&(self.pvh_entry as u32).to_le_bytes());
        let mut f = vec![0u8; code_off];
        f[0..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&62u16.to_le_bytes());
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..32].copy_from_slice(&self.entry.to_le_bytes());
        f[32..40].copy_from_slice(&self.phoff.to_le_bytes());
        f[52..54].copy_from_slice(&(ELF_HEADER as u16).to_le_bytes());
        f[54..56].copy_from_slice(&(PROGRAM_HEADER as u16).to_le_bytes());
        let phnum = self.phnum.unwrap_or(2 + u16::from(self.second.is_some()));
        f[56..58].copy_from_slice(&phnum.to_le_bytes());
        let filesz = self.filesz.unwrap_or(self.code_len as u64);
        let mut phdr = |at: usize, kind: u32, off: u64, addr: u64, filesz: u64, memsz: u64| {
            common::write_program_header(&mut f, at, kind, off, addr, filesz, memsz)
        };
        phdr(
            ELF_HEADER,
            PT_LOAD,
            code_off as u64,
            self.paddr,
            filesz,
            self.memsz,
        );
        phdr(
            ELF_HEADER + PROGRAM_HEADER,
            PT_NOTE,
            note_off as u64,
            0,
            note.len() as u64,
            note.len() as u64,
        );
        if let Some(paddr) = self.second {
            phdr(
                ELF_HEADER + 2 * PROGRAM_HEADER,
                PT_LOAD,
                code_off as u64,
                paddr,
                16,
                16,
            );
        }
        f[note_off..note_off + note.len()].copy_from_slice(&note);
        f.extend(std::iter::repeat_n(0xf4u8, self.code_len));
        f
    }
}

/// Where a (possibly damaged) ELF file's loadable segments end, as the loader computes it.
fn elf_kernel_end(f: &[u8]) -> u64 {
    let phoff = le64(f, 32) as usize;
    let phnum = le16(f, 56) as usize;
    (0..phnum)
        .filter_map(|i| {
            let at = phoff.checked_add(i.checked_mul(PROGRAM_HEADER)?)?;
            let kind = le32(f, at);
            let filesz = le64(f, at.saturating_add(32));
            (kind == u64::from(PT_LOAD) && filesz != 0).then(|| {
                le64(f, at.saturating_add(24)).saturating_add(le64(f, at.saturating_add(40)))
            })
        })
        .max()
        .unwrap_or(0)
}

/// Where a (possibly damaged) ELF file's lowest loadable segment starts.
fn elf_kernel_start(f: &[u8]) -> u64 {
    let phoff = le64(f, 32) as usize;
    let phnum = le16(f, 56) as usize;
    (0..phnum)
        .filter_map(|i| {
            let at = phoff.checked_add(i.checked_mul(PROGRAM_HEADER)?)?;
            let loads = le32(f, at) == u64::from(PT_LOAD) && le64(f, at.saturating_add(32)) != 0;
            loads.then(|| le64(f, at.saturating_add(24)))
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// Values around the boundaries that matter for an address or a size.
fn hostile_u64(valid: u64, mem: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        40 => Just(valid),
        1 => Just(0u64),
        1 => Just(u64::MAX),
        1 => Just(mem),
        1 => (0u64..16).prop_map(move |d| mem.saturating_sub(d * PAGE)),
        1 => 0u64..0x20_0000,
        1 => any::<u64>(),
        1 => 0u64..(1 << 32),
    ]
}

fn mem_size() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![2u64 << 20, 3 << 20, 16 << 20])
}

fn elf_kernel(mem: u64) -> impl Strategy<Value = ElfKernel> {
    (
        prop_oneof![4 => Just(16usize), 4 => 0usize..0x3000, 1 => Just(0x20_0000)],
        hostile_u64(HIMEM_START, mem),
        prop_oneof![10 => Just(None), 1 => hostile_u64(16, mem).prop_map(Some)],
        hostile_u64(16, mem),
        hostile_u64(HIMEM_START, mem),
        hostile_u64(HIMEM_START, mem),
        prop_oneof![20 => Just(XEN_ELFNOTE_PHYS32_ENTRY), 1 => any::<u32>()],
        prop_oneof![20 => Just(4u32), 1 => any::<u32>(), 1 => 0u32..64],
        prop_oneof![20 => Just(4u32), 1 => any::<u32>(), 1 => 0u32..64],
        prop_oneof![20 => Just(None), 1 => any::<u16>().prop_map(Some), 1 => (0u16..8).prop_map(Some)],
        hostile_u64(ELF_HEADER as u64, 0x1000),
        prop_oneof![6 => Just(None), 1 => hostile_u64(HIMEM_START + 0x1000, mem).prop_map(Some)],
    )
        .prop_map(
            |(
                code_len,
                paddr,
                filesz,
                memsz,
                entry,
                pvh_entry,
                note_type,
                note_namesz,
                note_descsz,
                phnum,
                phoff,
                second,
            )| ElfKernel {
                second,
                code_len,
                paddr,
                filesz,
                memsz: memsz.max(code_len as u64),
                entry,
                pvh_entry,
                note_type,
                note_namesz,
                note_descsz,
                phnum,
                phoff,
            },
        )
}

/// The fields of a bzImage: boot protocol header and a protected-mode payload.
#[derive(Debug, Clone)]
struct BzKernel {
    setup_sects: u8,
    payload: usize,
    magic: u32,
    version: u16,
    loadflags: u8,
    xloadflags: u16,
    code32_start: u32,
    initrd_addr_max: u32,
    cmdline_size: u32,
}

impl BzKernel {
    fn bytes(&self) -> Vec<u8> {
        let sects = if self.setup_sects == 0 {
            4
        } else {
            self.setup_sects as usize
        };
        let setup = (sects + 1) * 512;
        // A hostile setup size may lie past the end of the file: the payload is short then.
        let mut f = vec![0u8; setup.clamp(0x280, 0x1000) + self.payload];
        f[SETUP_HEADER] = self.setup_sects;
        f[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        f[0x202..0x206].copy_from_slice(&self.magic.to_le_bytes());
        f[0x206..0x208].copy_from_slice(&self.version.to_le_bytes());
        f[0x211] = self.loadflags;
        f[0x214..0x218].copy_from_slice(&self.code32_start.to_le_bytes());
        f[0x22c..0x230].copy_from_slice(&self.initrd_addr_max.to_le_bytes());
        f[0x236..0x238].copy_from_slice(&self.xloadflags.to_le_bytes());
        f[0x238..0x23c].copy_from_slice(&self.cmdline_size.to_le_bytes());
        f
    }
}

/// Where a (possibly damaged) bzImage's payload ends, as the loader computes it.
fn bz_kernel_end(f: &[u8]) -> u64 {
    let sects = match f.get(SETUP_HEADER).copied().unwrap_or(0) {
        0 => 4,
        n => u64::from(n),
    };
    let payload = (f.len() as u64).saturating_sub((sects + 1) * 512);
    le32(f, 0x214) + payload
}

fn bz_kernel(mem: u64) -> impl Strategy<Value = BzKernel> {
    (
        prop_oneof![10 => Just(4u8), 1 => any::<u8>()],
        prop_oneof![1 => Just(0usize), 8 => 0usize..0x4000, 1 => Just(mem as usize)],
        prop_oneof![20 => Just(0x5372_6448u32), 1 => any::<u32>()],
        prop_oneof![10 => Just(0x020fu16), 1 => any::<u16>()],
        prop_oneof![10 => Just(1u8), 1 => any::<u8>()],
        prop_oneof![10 => Just(1u16), 1 => any::<u16>()],
        hostile_u64(HIMEM_START, mem).prop_map(|v| v as u32),
        prop_oneof![Just(0x7fff_ffffu32), any::<u32>(), 0u32..(4 << 20)],
        prop_oneof![Just(2048u32), any::<u32>(), 0u32..64],
    )
        .prop_map(
            |(
                setup_sects,
                payload,
                magic,
                version,
                loadflags,
                xloadflags,
                code32_start,
                initrd_addr_max,
                cmdline_size,
            )| BzKernel {
                setup_sects,
                payload,
                magic,
                version,
                loadflags,
                xloadflags,
                code32_start,
                initrd_addr_max,
                cmdline_size,
            },
        )
}

/// Damage to a file: cut it at a random length and overwrite a few random bytes.
#[derive(Debug, Clone)]
struct Damage {
    truncate: Option<prop::sample::Index>,
    writes: Vec<(prop::sample::Index, u8)>,
}

fn damage() -> impl Strategy<Value = Damage> {
    (
        prop::option::weighted(0.1, any::<prop::sample::Index>()),
        prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ],
    )
        .prop_map(|(truncate, writes)| Damage { truncate, writes })
}

impl Damage {
    /// Applies the damage to the first `header` bytes (where the formats' fields live).
    fn apply(&self, mut f: Vec<u8>, header: usize) -> Vec<u8> {
        for (at, value) in &self.writes {
            let n = header.min(f.len());
            if n > 0 {
                f[at.index(n)] = *value;
            }
        }
        if let Some(at) = &self.truncate {
            let len = at.index(f.len() + 1);
            f.truncate(len);
        }
        f
    }
}

/// Writes the files, loads them, and checks the properties; `kernel_end` says where the
/// file's kernel ends, as the loader sees it.
fn load_and_check(
    kernel: &[u8],
    (kernel_start, kernel_end): (u64, u64),
    initrd_size: Option<u64>,
    mem_size: u64,
) -> Result<(), TestCaseError> {
    let dir = scratch();
    let kernel_path = dir.join("kernel");
    std::fs::write(&kernel_path, kernel).unwrap();
    let initrd_path = dir.join("initrd");
    if let Some(size) = initrd_size {
        let f = std::fs::File::create(&initrd_path).unwrap();
        f.set_len(size).unwrap();
    }
    let mem = create_guest_memory(mem_size).unwrap();
    let spec = BootSpec {
        kernel: &kernel_path,
        initrd: initrd_size.map(|_| initrd_path.as_path()),
        cmdline: "console=ttyS0",
        mem_size,
        rsdp_addr: ACPI_TABLES_START,
    };
    let loaded = load_kernel(&mem, &spec);
    let checked = check_outcome(
        &mem,
        loaded,
        (kernel_start, kernel_end),
        initrd_size,
        mem_size,
        &kernel_path,
    );
    std::fs::remove_dir_all(&dir).ok();
    checked
}

fn check_outcome(
    mem: &pvmm::memory::GuestMemory,
    loaded: Result<EntryPoint, BootError>,
    (kernel_start, kernel_end): (u64, u64),
    initrd_size: Option<u64>,
    mem_size: u64,
    path: &Path,
) -> Result<(), TestCaseError> {
    let _ = path;
    let ram_end = low_ram_end(mem_size);
    let entry = match loaded {
        Err(e) => {
            let line = e.to_string();
            prop_assert!(!line.is_empty());
            prop_assert!(!line.contains('\n'), "{line}");
            let status = VmmError::from(e).status();
            prop_assert_eq!(status, 2, "{}", line);
            return Ok(());
        }
        Ok(entry) => entry,
    };
    prop_assert!(
        kernel_end <= ram_end,
        "kernel ends at {kernel_end:#x}, RAM at {ram_end:#x}"
    );
    prop_assert!(
        kernel_start >= HIMEM_START,
        "a segment loads at {kernel_start:#x}, below 1 MiB"
    );
    let (eip, initrd_at) = match entry {
        EntryPoint::Linux64 { rip, zero_page } => {
            prop_assert_eq!(zero_page, ZERO_PAGE_START);
            // boot_params.hdr.ramdisk_image / ramdisk_size.
            let image: u32 = mem.read_obj(GuestAddress(ZERO_PAGE_START + 0x218)).unwrap();
            let size: u32 = mem.read_obj(GuestAddress(ZERO_PAGE_START + 0x21c)).unwrap();
            (rip, (u64::from(image), u64::from(size)))
        }
        EntryPoint::Pvh32 { eip, .. } => {
            let addr: u64 = mem.read_obj(GuestAddress(PVH_MODLIST_START)).unwrap();
            let size: u64 = mem.read_obj(GuestAddress(PVH_MODLIST_START + 8)).unwrap();
            (eip, (addr, size))
        }
    };
    prop_assert!(
        (HIMEM_START..kernel_end).contains(&eip),
        "entry {eip:#x} outside the kernel [{HIMEM_START:#x}, {kernel_end:#x})"
    );
    if let Some(size) = initrd_size {
        let (addr, got) = initrd_at;
        prop_assert_eq!(got, size);
        prop_assert_eq!(addr % PAGE, 0);
        prop_assert!(
            addr >= kernel_end,
            "initrd at {addr:#x} overlaps the kernel ending at {kernel_end:#x}"
        );
        prop_assert!(addr + size <= ram_end);
    }
    Ok(())
}

/// An initrd size around the room left between `kernel_end` and the end of RAM.
fn initrd_size(mem: u64) -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        2 => Just(None),
        1 => (0u64..0x4000).prop_map(Some),
        1 => (0u64..=mem).prop_map(Some),
        1 => (0u64..64).prop_map(move |d| Some(mem.saturating_sub(HIMEM_START + d * PAGE / 2))),
    ]
}

proptest! {
    #![proptest_config(fuzz_config())]

    #[test]
    fn hostile_elf_kernels_load_or_fail_with_one_line(
        (mem, kernel, damage, initrd) in mem_size().prop_flat_map(|mem| {
            (Just(mem), elf_kernel(mem), damage(), initrd_size(mem))
        })
    ) {
        let f = damage.apply(kernel.bytes(), 0x100 + 24);
        load_and_check(&f, (elf_kernel_start(&f), elf_kernel_end(&f)), initrd, mem)?;
    }

    #[test]
    fn hostile_bzimages_load_or_fail_with_one_line(
        (mem, kernel, damage, initrd) in mem_size().prop_flat_map(|mem| {
            (Just(mem), bz_kernel(mem), damage(), initrd_size(mem))
        })
    ) {
        let f = damage.apply(kernel.bytes(), 0x280);
        load_and_check(&f, (le32(&f, 0x214), bz_kernel_end(&f)), initrd, mem)?;
    }

    #[test]
    fn random_bytes_are_not_kernels(bytes in prop::collection::vec(any::<u8>(), 0..0x400)) {
        load_and_check(&bytes, (u64::MAX, 0), None, 16 << 20)?;
    }
}

/// The hand-picked cases the issue names, once each, so that a failure reads plainly.
#[test]
fn named_hostile_kernels_are_refused() {
    let valid = ElfKernel {
        code_len: 16,
        paddr: HIMEM_START,
        filesz: None,
        memsz: 16,
        entry: HIMEM_START,
        pvh_entry: HIMEM_START,
        note_type: XEN_ELFNOTE_PHYS32_ENTRY,
        note_namesz: 4,
        note_descsz: 4,
        second: None,
        phnum: None,
        phoff: ELF_HEADER as u64,
    };
    let mem = 16 << 20;
    let refused = |f: &[u8], initrd: Option<u64>, what: &str| {
        let dir = scratch();
        let kernel_path = dir.join(format!("named-{what}"));
        std::fs::write(&kernel_path, f).unwrap();
        let initrd_path = dir.join("named-initrd");
        if let Some(size) = initrd {
            std::fs::File::create(&initrd_path)
                .unwrap()
                .set_len(size)
                .unwrap();
        }
        let memory = create_guest_memory(mem).unwrap();
        let spec = BootSpec {
            kernel: &kernel_path,
            initrd: initrd.map(|_| initrd_path.as_path()),
            cmdline: "console=ttyS0",
            mem_size: mem,
            rsdp_addr: ACPI_TABLES_START,
        };
        let loaded = load_kernel(&memory, &spec);
        std::fs::remove_dir_all(&dir).ok();
        match loaded {
            Ok(entry) => panic!("{what}: loaded, entry {entry:x?}"),
            Err(e) => {
                let line = e.to_string();
                assert!(!line.contains('\n'), "{what}: {line}");
                assert_eq!(VmmError::from(e).status(), 2, "{what}: {line}");
            }
        }
    };
    // The valid one loads.
    load_and_check(
        &valid.bytes(),
        (HIMEM_START, HIMEM_START + 16),
        Some(PAGE),
        mem,
    )
    .unwrap();
    let full = valid.bytes();
    refused(&full[..40], None, "truncated-elf");
    refused(
        &full[..ELF_HEADER + PROGRAM_HEADER],
        None,
        "truncated-phdrs",
    );
    let mut wrong = full.clone();
    wrong[1] = b'L';
    refused(&wrong, None, "wrong-magic");
    let pvh_outside = ElfKernel {
        pvh_entry: mem + 0x1000,
        ..valid.clone()
    };
    refused(&pvh_outside.bytes(), None, "pvh-entry-outside-memory");
    let too_big = ElfKernel {
        memsz: mem,
        ..valid.clone()
    };
    refused(&too_big.bytes(), None, "kernel-larger-than-memory");
    refused(
        &valid.bytes(),
        Some(mem - HIMEM_START),
        "initrd-overlapping-kernel",
    );
    let over_acpi = ElfKernel {
        paddr: 0xe_0000,
        ..valid.clone()
    };
    refused(&over_acpi.bytes(), None, "segment-over-the-acpi-tables");
    let second_over_acpi = ElfKernel {
        second: Some(0xe_0000),
        ..valid.clone()
    };
    refused(
        &second_over_acpi.bytes(),
        None,
        "second-segment-over-the-acpi-tables",
    );
    let bz = BzKernel {
        setup_sects: 4,
        payload: 0x1000,
        magic: 0x5372_6448,
        version: 0x020f,
        loadflags: 1,
        xloadflags: 1,
        code32_start: HIMEM_START as u32,
        initrd_addr_max: 0x7fff_ffff,
        cmdline_size: 2048,
    };
    load_and_check(
        &bz.bytes(),
        (HIMEM_START, bz_kernel_end(&bz.bytes())),
        None,
        mem,
    )
    .unwrap();
    let past_end = BzKernel {
        setup_sects: 200,
        ..bz.clone()
    };
    refused(&past_end.bytes(), None, "setup-size-past-the-end");
    refused(&bz.bytes()[..0x250], None, "truncated-bzimage");
    let big_bz = BzKernel {
        payload: mem as usize,
        ..bz.clone()
    };
    refused(&big_bz.bytes(), None, "bzimage-larger-than-memory");
    let tiny_payload = BzKernel {
        payload: 0x100,
        ..bz
    };
    refused(
        &tiny_payload.bytes(),
        None,
        "bzimage-entry-past-its-payload",
    );
}

/// The same files through the `pvmm` binary: exit status 2 and one line on stderr.
#[test]
fn pvmm_refuses_hostile_kernels_with_one_line_and_status_2() {
    if !common::kvm_available("fuzz_loaders_binary") {
        return;
    }
    let dir = common::scratch("fuzz-loaders-binary");
    let tiny = common::tiny_pvh_kernel(&common::HALT_LOOP);
    // The PVH note (after the two program headers) holds its entry 16 bytes in.
    let note_entry = ELF_HEADER + 2 * PROGRAM_HEADER + 16;
    let mut outside = tiny.clone();
    outside[note_entry..note_entry + 4].copy_from_slice(&0x7000_0000u32.to_le_bytes());
    let mut too_big = tiny.clone();
    // PT_LOAD's p_memsz: 1 GiB, more than the 64 MiB guest.
    let memsz = ELF_HEADER + 40;
    too_big[memsz..memsz + 8].copy_from_slice(&(1u64 << 30).to_le_bytes());
    let no_payload = BzKernel {
        setup_sects: 4,
        payload: 0,
        magic: 0x5372_6448,
        version: 0x020f,
        loadflags: 1,
        xloadflags: 1,
        code32_start: HIMEM_START as u32,
        initrd_addr_max: 0x7fff_ffff,
        cmdline_size: 2048,
    };
    for (name, bytes) in [
        ("pvh-outside", outside),
        ("too-big", too_big),
        ("no-payload", no_payload.bytes()),
        ("truncated", tiny[..100].to_vec()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = common::pvmm(&["--memory", "64", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with("pvmm: "), "{name}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
