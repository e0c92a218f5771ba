//! Loading an x86-64 Linux kernel and describing the machine to it.
//!
//! Two entry paths:
//! - a bzImage enters its 64-bit entry point (`startup_64`, 0x200 past the protected-mode code)
//!   with `RSI` pointing at a filled-in zero page (`struct boot_params`), per
//!   Documentation/arch/x86/boot.rst;
//! - an ELF vmlinux enters its PVH entry point (the `XEN_ELFNOTE_PHYS32_ENTRY` note) in 32-bit
//!   protected mode with `EBX` pointing at a `hvm_start_info` block.
//!
//! Both receive the same e820 map, command line, initrd and ACPI RSDP address.

pub mod regs;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::boot_params;
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{BzImage, Cmdline, KernelLoader, KernelLoaderResult};
use vm_memory::{Bytes, GuestAddress};

use crate::layout::{
    CMDLINE_MAX_SIZE, CMDLINE_START, HIMEM_START, PVH_INFO_START, PVH_MEMMAP_START,
    PVH_MODLIST_START, ZERO_PAGE_START,
};
use crate::memory::{e820_map, low_ram_end, E820Entry, GuestMemory};

/// The bzImage header magic "HdrS" (boot protocol).
const BZIMAGE_HEADER_MAGIC: u32 = 0x5372_6448;
/// Offset of the setup header in a bzImage.
const BZIMAGE_SETUP_HEADER_OFFSET: u64 = 0x1f1;
/// Offset of the "HdrS" magic in a bzImage.
const BZIMAGE_MAGIC_OFFSET: u64 = 0x202;
/// The 64-bit entry point sits this far past the start of the protected-mode kernel.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// `xloadflags` bit: the kernel has a 64-bit entry point at +0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// `type_of_loader` value for a boot loader without an assigned id.
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// The boot sector signature the zero page must carry.
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// Oldest boot protocol pvmm drives: 2.12 added `xloadflags` (64-bit entry), 2.14 added
/// `acpi_rsdp_addr`; older kernels still find the RSDP by scanning the BIOS area.
const MIN_BOOT_PROTOCOL: u16 = 0x020c;
/// PVH `hvm_start_info` magic (xen/include/public/arch-x86/hvm/start_info.h).
const PVH_START_MAGIC: u32 = 0x336e_c578;
/// The `hvm_start_info` version that carries a memory map.
const PVH_START_VERSION: u32 = 1;
/// initrds are page aligned.
const PAGE_SIZE: u64 = 0x1000;
/// The ELF magic.
const ELF_MAGIC: [u8; 4] = *b"\x7fELF";

/// Errors from loading the kernel and initrd. All are the user's input problems (exit status 2)
/// except [`BootError::GuestMemory`] and [`BootError::E820TooLong`].
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel file cannot be opened or read.
    #[error("cannot read kernel {path}: {source}")]
    KernelRead {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is neither a bzImage nor an ELF.
    #[error("{0} is not an x86-64 Linux kernel (neither a bzImage nor an ELF vmlinux)")]
    NotAKernel(PathBuf),
    /// The bzImage is too old or has no 64-bit entry point.
    #[error("{path}: unsupported bzImage ({why})")]
    UnsupportedBzImage {
        /// The file.
        path: PathBuf,
        /// What is missing.
        why: &'static str,
    },
    /// The ELF kernel has no PVH entry note.
    #[error(
        "{0}: ELF kernel has no PVH entry point (build it with CONFIG_PVH=y, or boot the bzImage)"
    )]
    NoPvhEntry(PathBuf),
    /// linux-loader rejected the image.
    #[error("cannot load kernel {path}: {source}")]
    Load {
        /// The file.
        path: PathBuf,
        /// The loader's reason.
        source: linux_loader::loader::Error,
    },
    /// The kernel's segments end past guest RAM (below the 32-bit MMIO hole).
    #[error("kernel {path} does not fit in guest memory: it ends at {end:#x}, above {limit:#x}; give the guest more --memory")]
    KernelTooBig {
        /// The file.
        path: PathBuf,
        /// Where its highest segment ends.
        end: u64,
        /// The end of low guest RAM.
        limit: u64,
    },
    /// The entry point lies outside what the kernel loads.
    #[error(
        "{path}: entry point {entry:#x} lies outside the kernel it loads ({start:#x}..{end:#x})"
    )]
    EntryOutsideKernel {
        /// The file.
        path: PathBuf,
        /// The entry point.
        entry: u64,
        /// The lowest address a kernel may load at (1 MiB).
        start: u64,
        /// Where the kernel ends.
        end: u64,
    },
    /// An ELF segment loads below 1 MiB, over the boot data and ACPI tables pvmm writes there.
    #[error(
        "{path}: a segment loads at {start:#x}..{end:#x}, below guest RAM for kernels ({min:#x})"
    )]
    SegmentBelowKernelRam {
        /// The file.
        path: PathBuf,
        /// Where the segment starts.
        start: u64,
        /// Where it ends.
        end: u64,
        /// The lowest address a kernel may load at (1 MiB).
        min: u64,
    },
    /// The initrd cannot be read.
    #[error("cannot read initrd {path}: {source}")]
    InitrdRead {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The initrd does not fit between the kernel and the top of low memory.
    #[error("initrd {path} ({size} bytes) does not fit in guest memory below {limit:#x} after the kernel; give the guest more --memory")]
    InitrdTooBig {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The highest address it may end at.
        limit: u64,
    },
    /// The initrd could not be copied into guest memory.
    #[error("cannot read initrd {path}: {source}")]
    InitrdLoad {
        /// The file.
        path: PathBuf,
        /// Why.
        source: vm_memory::GuestMemoryError,
    },
    /// The command line is longer than pvmm passes.
    #[error("invalid kernel command line: {len} bytes, the most pvmm passes is {max}")]
    CmdlineTooLong {
        /// Its length.
        len: usize,
        /// The most pvmm passes.
        max: usize,
    },
    /// The command line is longer than the kernel's setup header accepts.
    #[error("invalid kernel command line: {len} bytes, this kernel accepts at most {max}")]
    CmdlineTooLongForKernel {
        /// Its length.
        len: u32,
        /// The most the kernel accepts.
        max: u32,
    },
    /// linux-loader refused the command line.
    #[error("invalid kernel command line: {0}")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    /// The command line could not be written into guest memory.
    #[error("invalid kernel command line: {0}")]
    CmdlineLoad(#[source] linux_loader::loader::Error),
    /// Writing boot structures into guest memory failed (a pvmm bug or too little memory).
    #[error("cannot write boot data into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// The e820 map has more entries than the zero page holds (a pvmm bug).
    #[error("cannot write boot data into guest memory: e820 map too long")]
    E820TooLong,
}

/// The two kernel formats pvmm boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// A compressed bzImage, entered at its 64-bit entry point.
    BzImage,
    /// An uncompressed ELF vmlinux, entered through PVH.
    ElfPvh,
}

/// Opens a file that must be a readable regular file (not a directory), with its size.
pub fn open_input_file(path: &Path) -> std::io::Result<(File, u64)> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(std::io::Error::other("is a directory"));
    }
    Ok((file, meta.len()))
}

/// Looks at a kernel file's magic numbers without loading it.
pub fn detect_kernel_format(path: &Path) -> Result<KernelFormat, BootError> {
    let read_err = |source| BootError::KernelRead {
        path: path.to_path_buf(),
        source,
    };
    let (mut file, _) = open_input_file(path).map_err(read_err)?;
    let mut magic = [0u8; 4];
    if file.read_exact(&mut magic).is_ok() && magic == ELF_MAGIC {
        return Ok(KernelFormat::ElfPvh);
    }
    let mut hdrs = [0u8; 4];
    file.seek(SeekFrom::Start(BZIMAGE_MAGIC_OFFSET))
        .map_err(read_err)?;
    if file.read_exact(&mut hdrs).is_ok() && u32::from_le_bytes(hdrs) == BZIMAGE_HEADER_MAGIC {
        return Ok(KernelFormat::BzImage);
    }
    Err(BootError::NotAKernel(path.to_path_buf()))
}

/// Where and how the boot vCPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryPoint {
    /// 64-bit long mode at `rip`, `rsi` = zero page.
    Linux64 {
        /// Entry address.
        rip: u64,
        /// Zero page address.
        zero_page: u64,
    },
    /// 32-bit protected mode at `eip`, `ebx` = hvm_start_info.
    Pvh32 {
        /// Entry address.
        eip: u64,
        /// Start info address.
        start_info: u64,
    },
}

/// What the boot code needs besides the files.
#[derive(Debug, Clone)]
pub struct BootSpec<'a> {
    /// Kernel image path.
    pub kernel: &'a Path,
    /// Optional initrd path.
    pub initrd: Option<&'a Path>,
    /// Kernel command line.
    pub cmdline: &'a str,
    /// Guest RAM size in bytes.
    pub mem_size: u64,
    /// Address of the ACPI RSDP pvmm wrote.
    pub rsdp_addr: u64,
}

/// Loads the kernel, initrd and command line and writes the boot information.
pub fn load_kernel(mem: &GuestMemory, spec: &BootSpec<'_>) -> Result<EntryPoint, BootError> {
    let format = detect_kernel_format(spec.kernel)?;
    let read_err = |source| BootError::KernelRead {
        path: spec.kernel.to_path_buf(),
        source,
    };
    let mut file = File::open(spec.kernel).map_err(read_err)?;
    let load_err = |source| BootError::Load {
        path: spec.kernel.to_path_buf(),
        source,
    };
    let cmdline = build_cmdline(spec.cmdline)?;
    linux_loader::loader::load_cmdline(mem, GuestAddress(CMDLINE_START), &cmdline)
        .map_err(BootError::CmdlineLoad)?;
    let cmdline_len =
        u32::try_from(spec.cmdline.len() + 1).map_err(|_| BootError::CmdlineTooLong {
            len: spec.cmdline.len(),
            max: CMDLINE_MAX_SIZE - 1,
        })?;

    match format {
        KernelFormat::BzImage => {
            let header = read_setup_header(&mut file, spec.kernel)?;
            let loaded = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let rip = loaded.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET;
            check_kernel_fits(spec, &loaded, rip)?;
            let initrd = load_initrd(mem, spec, &loaded, header.initrd_addr_max as u64)?;
            let zero_page =
                build_zero_page(&loaded, spec, initrd, cmdline_len, header.cmdline_size)?;
            mem.write_obj(zero_page, GuestAddress(ZERO_PAGE_START))?;
            Ok(EntryPoint::Linux64 {
                rip,
                zero_page: ZERO_PAGE_START,
            })
        }
        KernelFormat::ElfPvh => {
            let loaded = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
                return Err(BootError::NoPvhEntry(spec.kernel.to_path_buf()));
            };
            check_kernel_fits(spec, &loaded, entry.0)?;
            check_elf_segments(&mut file, spec)?;
            // PVH kernels have no header limit; they accept an initrd anywhere in low RAM.
            let initrd = load_initrd(mem, spec, &loaded, u64::from(u32::MAX))?;
            write_pvh_start_info(mem, spec, initrd)?;
            Ok(EntryPoint::Pvh32 {
                eip: entry.0,
                start_info: PVH_INFO_START,
            })
        }
    }
}

/// A loaded kernel must end within low guest RAM and be entered inside what it loaded: a
/// hostile or damaged file (a PVH note pointing anywhere, a bzImage without a payload, a
/// segment larger than memory) is refused here rather than run.
fn check_kernel_fits(
    spec: &BootSpec<'_>,
    loaded: &KernelLoaderResult,
    entry: u64,
) -> Result<(), BootError> {
    let limit = low_ram_end(spec.mem_size);
    if loaded.kernel_end > limit {
        return Err(BootError::KernelTooBig {
            path: spec.kernel.to_path_buf(),
            end: loaded.kernel_end,
            limit,
        });
    }
    if !(HIMEM_START..loaded.kernel_end).contains(&entry) {
        return Err(BootError::EntryOutsideKernel {
            path: spec.kernel.to_path_buf(),
            entry,
            start: HIMEM_START,
            end: loaded.kernel_end,
        });
    }
    Ok(())
}

/// Every loaded segment of an ELF kernel (linux-loader has already checked its headers) must
/// lie at 1 MiB or above: below are the zero page, the boot page tables and the ACPI tables,
/// which a segment there would overwrite.
fn check_elf_segments(file: &mut File, spec: &BootSpec<'_>) -> Result<(), BootError> {
    const PT_LOAD: u32 = 1;
    const PHDR_SIZE: usize = 56;
    let read_err = |source| BootError::KernelRead {
        path: spec.kernel.to_path_buf(),
        source,
    };
    let mut ehdr = [0u8; 64];
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    file.read_exact(&mut ehdr).map_err(read_err)?;
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let phoff = u64_at(&ehdr, 32);
    let phnum = u16_at(&ehdr, 56);
    file.seek(SeekFrom::Start(phoff)).map_err(read_err)?;
    let mut phdr = [0u8; PHDR_SIZE];
    for _ in 0..phnum {
        file.read_exact(&mut phdr).map_err(read_err)?;
        let (start, filesz, memsz) = (u64_at(&phdr, 24), u64_at(&phdr, 32), u64_at(&phdr, 40));
        if u32_at(&phdr, 0) == PT_LOAD && filesz != 0 && start < HIMEM_START {
            return Err(BootError::SegmentBelowKernelRam {
                path: spec.kernel.to_path_buf(),
                start,
                end: start.saturating_add(memsz),
                min: HIMEM_START,
            });
        }
    }
    Ok(())
}

fn build_cmdline(text: &str) -> Result<Cmdline, BootError> {
    if text.len() >= CMDLINE_MAX_SIZE {
        return Err(BootError::CmdlineTooLong {
            len: text.len(),
            max: CMDLINE_MAX_SIZE - 1,
        });
    }
    Cmdline::try_from(text, CMDLINE_MAX_SIZE).map_err(BootError::Cmdline)
}

/// The fields of the bzImage setup header pvmm checks before loading.
struct SetupHeaderInfo {
    initrd_addr_max: u32,
    cmdline_size: u32,
}

fn read_setup_header(file: &mut File, path: &Path) -> Result<SetupHeaderInfo, BootError> {
    let read_err = |source| BootError::KernelRead {
        path: path.to_path_buf(),
        source,
    };
    let mut params = boot_params::default();
    let mut raw = vec![0u8; std::mem::size_of_val(&params.hdr)];
    file.seek(SeekFrom::Start(BZIMAGE_SETUP_HEADER_OFFSET))
        .map_err(read_err)?;
    file.read_exact(&mut raw).map_err(read_err)?;
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    // SAFETY: setup_header is a plain-old-data, packed struct of integers; any byte pattern of
    // its size is a valid value, and `raw` has exactly that size.
    params.hdr = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
    let hdr = params.hdr;
    let unsupported = |why| BootError::UnsupportedBzImage {
        path: path.to_path_buf(),
        why,
    };
    if hdr.version < MIN_BOOT_PROTOCOL {
        return Err(unsupported("boot protocol older than 2.12"));
    }
    if hdr.xloadflags & XLF_KERNEL_64 == 0 {
        return Err(unsupported("no 64-bit entry point"));
    }
    Ok(SetupHeaderInfo {
        initrd_addr_max: hdr.initrd_addr_max,
        cmdline_size: hdr.cmdline_size,
    })
}

/// Where the initrd went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitrdPlacement {
    /// Guest address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Picks the initrd address: as high as possible below `limit`, page aligned, after the kernel.
/// Loaders place it high so the kernel's decompression area below stays free.
pub fn place_initrd(size: u64, kernel_end: u64, limit: u64) -> Option<u64> {
    let top = limit.checked_sub(size)?;
    let addr = top & !(PAGE_SIZE - 1);
    (addr >= kernel_end).then_some(addr)
}

fn load_initrd(
    mem: &GuestMemory,
    spec: &BootSpec<'_>,
    kernel: &KernelLoaderResult,
    initrd_addr_max: u64,
) -> Result<Option<InitrdPlacement>, BootError> {
    let Some(path) = spec.initrd else {
        return Ok(None);
    };
    let read_err = |source| BootError::InitrdRead {
        path: path.to_path_buf(),
        source,
    };
    let (mut file, size) = open_input_file(path).map_err(read_err)?;
    let limit = low_ram_end(spec.mem_size).min(initrd_addr_max.saturating_add(1));
    let too_big = || BootError::InitrdTooBig {
        path: path.to_path_buf(),
        size,
        limit,
    };
    let addr = place_initrd(size, kernel.kernel_end, limit).ok_or_else(too_big)?;
    let len = usize::try_from(size).map_err(|_| too_big())?;
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, len)
        .map_err(|source| BootError::InitrdLoad {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(Some(InitrdPlacement { addr, size }))
}

/// Fills in the zero page for a bzImage.
pub fn build_zero_page(
    loaded: &KernelLoaderResult,
    spec: &BootSpec<'_>,
    initrd: Option<InitrdPlacement>,
    cmdline_len: u32,
    kernel_cmdline_size: u32,
) -> Result<boot_params, BootError> {
    if kernel_cmdline_size != 0 && cmdline_len > kernel_cmdline_size {
        return Err(BootError::CmdlineTooLongForKernel {
            len: cmdline_len - 1,
            max: kernel_cmdline_size.saturating_sub(1),
        });
    }
    let mut params = boot_params::default();
    if let Some(hdr) = loaded.setup_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.header = BZIMAGE_HEADER_MAGIC;
    // A constant in the first MiB of guest memory.
    #[allow(clippy::cast_possible_truncation)]
    let cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmd_line_ptr = cmd_line_ptr;
    params.hdr.cmdline_size = cmdline_len;
    if let Some(initrd) = initrd {
        // `load_initrd` placed it to end below the kernel's `initrd_addr_max` + 1, a u32.
        #[allow(clippy::cast_possible_truncation)]
        let (image, size) = (initrd.addr as u32, initrd.size as u32);
        params.hdr.ramdisk_image = image;
        params.hdr.ramdisk_size = size;
    }
    params.acpi_rsdp_addr = spec.rsdp_addr;
    let map = e820_map(spec.mem_size);
    if map.len() > params.e820_table.len() {
        return Err(BootError::E820TooLong);
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(&map) {
        slot.addr = entry.addr;
        slot.size = entry.size;
        slot.r#type = entry.kind as u32;
    }
    params.e820_entries = u8::try_from(map.len()).map_err(|_| BootError::E820TooLong)?;
    Ok(params)
}

/// Writes `hvm_start_info`, its module list (the initrd) and memory map for a PVH kernel.
fn write_pvh_start_info(
    mem: &GuestMemory,
    spec: &BootSpec<'_>,
    initrd: Option<InitrdPlacement>,
) -> Result<(), BootError> {
    let map = e820_map(spec.mem_size);
    let entries = u32::try_from(map.len()).map_err(|_| BootError::E820TooLong)?;
    let bytes = pvh_start_info_bytes(spec.rsdp_addr, initrd.is_some(), entries);
    let write = |data: &[u8], at: u64| {
        mem.write_slice(data, GuestAddress(at))
            .map_err(BootError::GuestMemory)
    };
    write(&bytes, PVH_INFO_START)?;
    if let Some(initrd) = initrd {
        let mut module = Vec::with_capacity(32);
        module.extend_from_slice(&initrd.addr.to_le_bytes());
        module.extend_from_slice(&initrd.size.to_le_bytes());
        module.extend_from_slice(&0u64.to_le_bytes()); // no module command line
        module.extend_from_slice(&0u64.to_le_bytes()); // reserved
        write(&module, PVH_MODLIST_START)?;
    }
    write(&pvh_memmap_bytes(&map), PVH_MEMMAP_START)
}

/// The 56-byte `hvm_start_info` (version 1) pvmm hands a PVH kernel.
pub fn pvh_start_info_bytes(rsdp_addr: u64, has_initrd: bool, memmap_entries: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(56);
    b.extend_from_slice(&PVH_START_MAGIC.to_le_bytes());
    b.extend_from_slice(&PVH_START_VERSION.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // flags
    b.extend_from_slice(&u32::from(has_initrd).to_le_bytes()); // nr_modules
    let modlist = if has_initrd { PVH_MODLIST_START } else { 0 };
    b.extend_from_slice(&modlist.to_le_bytes());
    b.extend_from_slice(&CMDLINE_START.to_le_bytes());
    b.extend_from_slice(&rsdp_addr.to_le_bytes());
    b.extend_from_slice(&PVH_MEMMAP_START.to_le_bytes());
    b.extend_from_slice(&memmap_entries.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // reserved
    b
}

/// The PVH memory map: 24 bytes per entry (addr, size, type, reserved).
pub fn pvh_memmap_bytes(map: &[E820Entry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(map.len() * 24);
    for e in map {
        b.extend_from_slice(&e.addr.to_le_bytes());
        b.extend_from_slice(&e.size.to_le_bytes());
        b.extend_from_slice(&(e.kind as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
    }
    b
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::layout::ACPI_TABLES_START;
    use crate::memory::{create_guest_memory, E820Type};

    fn spec<'a>(kernel: &'a Path, initrd: Option<&'a Path>) -> BootSpec<'a> {
        BootSpec {
            kernel,
            initrd,
            cmdline: "console=ttyS0",
            mem_size: 256 << 20,
            rsdp_addr: ACPI_TABLES_START,
        }
    }

    #[test]
    fn initrd_goes_high_page_aligned_and_after_the_kernel() {
        assert_eq!(
            place_initrd(0x1800, 0x200_0000, 0x1000_0000),
            Some(0xfffe000)
        );
        assert_eq!(
            place_initrd(0x1000, 0x200_0000, 0x1000_0000),
            Some(0xffff000)
        );
        // Too big: would overlap the kernel, or underflow.
        assert_eq!(place_initrd(0x0fff_0000, 0x200_0000, 0x1000_0000), None);
        assert_eq!(place_initrd(u64::MAX, 0, 0x1000_0000), None);
    }

    #[test]
    fn zero_page_carries_cmdline_initrd_rsdp_and_e820() {
        let k = Path::new("k");
        let loaded = KernelLoaderResult {
            kernel_load: GuestAddress(HIMEM_START),
            kernel_end: 0x80_0000,
            setup_header: Some(Default::default()),
            ..Default::default()
        };
        let initrd = InitrdPlacement {
            addr: 0x0f00_0000,
            size: 1234,
        };
        let p = build_zero_page(&loaded, &spec(k, None), Some(initrd), 14, 2048).unwrap();
        let hdr = p.hdr;
        assert_eq!({ hdr.boot_flag }, BOOT_FLAG_MAGIC);
        assert_eq!({ hdr.header }, BZIMAGE_HEADER_MAGIC);
        assert_eq!(hdr.type_of_loader, LOADER_TYPE_UNDEFINED);
        assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ hdr.cmdline_size }, 14);
        assert_eq!({ hdr.ramdisk_image }, 0x0f00_0000);
        assert_eq!({ hdr.ramdisk_size }, 1234);
        assert_eq!({ p.acpi_rsdp_addr }, ACPI_TABLES_START);
        assert_eq!(p.e820_entries, 3);
        let last = p.e820_table[2];
        assert_eq!({ last.addr }, HIMEM_START);
        assert_eq!({ last.size }, (256 << 20) - HIMEM_START);
        assert_eq!({ last.r#type }, E820Type::Ram as u32);
        // A command line longer than the kernel accepts is refused.
        assert!(matches!(
            build_zero_page(&loaded, &spec(k, None), None, 4000, 2048),
            Err(BootError::CmdlineTooLongForKernel { .. })
        ));
    }

    #[test]
    fn pvh_start_info_layout() {
        let b = pvh_start_info_bytes(0xe0000, true, 3);
        assert_eq!(b.len(), 56);
        assert_eq!(&b[0..4], &PVH_START_MAGIC.to_le_bytes());
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 1);
        assert_eq!(
            u64::from_le_bytes(b[16..24].try_into().unwrap()),
            PVH_MODLIST_START
        );
        assert_eq!(u64::from_le_bytes(b[32..40].try_into().unwrap()), 0xe0000);
        assert_eq!(u32::from_le_bytes(b[48..52].try_into().unwrap()), 3);
        let map = e820_map(256 << 20);
        assert_eq!(pvh_memmap_bytes(&map).len(), 72);
    }

    #[test]
    fn format_detection_rejects_non_kernels() {
        let dir = std::env::temp_dir().join(format!("pvmm-boot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk");
        std::fs::write(&junk, vec![0u8; 4096]).unwrap();
        assert!(matches!(
            detect_kernel_format(&junk),
            Err(BootError::NotAKernel(_))
        ));
        let tiny = dir.join("tiny");
        std::fs::write(&tiny, b"MZ").unwrap();
        assert!(matches!(
            detect_kernel_format(&tiny),
            Err(BootError::NotAKernel(_))
        ));
        let mut bz = vec![0u8; 4096];
        bz[0x202..0x206].copy_from_slice(&BZIMAGE_HEADER_MAGIC.to_le_bytes());
        let bzf = dir.join("bz");
        std::fs::write(&bzf, &bz).unwrap();
        assert_eq!(detect_kernel_format(&bzf).unwrap(), KernelFormat::BzImage);
        let elf = dir.join("elf");
        std::fs::write(&elf, b"\x7fELF\x02\x01\x01").unwrap();
        assert_eq!(detect_kernel_format(&elf).unwrap(), KernelFormat::ElfPvh);
        assert!(matches!(
            detect_kernel_format(&dir.join("missing")),
            Err(BootError::KernelRead { .. })
        ));
        assert!(matches!(
            detect_kernel_format(&dir),
            Err(BootError::KernelRead { .. })
        ));
        // An ELF that is not a PVH kernel fails to load with an error, not a panic.
        let mem = create_guest_memory(64 << 20).unwrap();
        assert!(load_kernel(&mem, &spec(&elf, None)).is_err());
        // A bzImage header of protocol 0 is refused as unsupported.
        assert!(matches!(
            load_kernel(&mem, &spec(&bzf, None)),
            Err(BootError::UnsupportedBzImage { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
