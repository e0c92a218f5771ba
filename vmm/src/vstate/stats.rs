//! KVM's binary statistics of one vCPU (`KVM_GET_STATS_FD`, Documentation/virt/kvm/api.rst
//! 4.133): a file with a header, self-describing descriptors, and a data block of u64 values.
//! pvmm parses the header and descriptors (no hard-coded offsets) and reads the halt counters,
//! which tell how long the guest kept the vCPU idle.

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::{
    kvm_stats_desc, kvm_stats_header, KVMIO, KVM_STATS_BASE_MASK, KVM_STATS_BASE_POW10,
    KVM_STATS_UNIT_MASK, KVM_STATS_UNIT_SECONDS,
};
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

// kvm-ioctls has no wrapper for this vCPU ioctl (include/uapi/linux/kvm.h: _IO(KVMIO, 0xce)).
ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);

/// Size of `struct kvm_stats_header`.
const HEADER_LEN: usize = size_of::<kvm_stats_header>();
/// Size of `struct kvm_stats_desc` before its name (a flexible array of `name_size` bytes).
const DESC_FIXED_LEN: usize = size_of::<kvm_stats_desc>();
/// Nanoseconds are 10^-9 seconds.
const NANO_EXPONENT: i32 = -9;
/// A descriptor table larger than this is not a KVM stats file.
const MAX_DESCRIPTOR_BYTES: usize = 1 << 20;

/// The time KVM counts while the vCPU is halted waiting for an interrupt.
pub const HALT_WAIT_NS: &str = "halt_wait_ns";
/// The time KVM spent polling (guest halted, host spinning) before a wake-up arrived.
pub const HALT_POLL_SUCCESS_NS: &str = "halt_poll_success_ns";
/// The time KVM spent polling before giving up and sleeping.
pub const HALT_POLL_FAIL_NS: &str = "halt_poll_fail_ns";

/// Errors from the stats fd.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The ioctl failed (old kernel, or not a vCPU fd).
    #[error("KVM_GET_STATS_FD: {0}")]
    Open(std::io::Error),
    /// Reading the stats file failed.
    #[error("reading KVM stats: {0}")]
    Read(std::io::Error),
    /// The file does not look like KVM stats.
    #[error("malformed KVM stats: {0}")]
    Malformed(&'static str),
    /// A counter pvmm needs is missing.
    #[error("KVM stats have no {0} counter")]
    Missing(&'static str),
}

/// One statistic's descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatDescriptor {
    /// Its name, e.g. `halt_wait_ns`.
    pub name: String,
    /// Type, unit and base flags.
    pub flags: u32,
    /// Power of the base the value is scaled by.
    pub exponent: i16,
    /// Number of u64 values.
    pub size: u16,
    /// Offset of its values from the start of the data block.
    pub offset: u32,
}

/// Parsed layout of a stats file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsLayout {
    /// Start of the data block in the file.
    pub data_offset: u64,
    /// Every descriptor.
    pub descriptors: Vec<StatDescriptor>,
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, StatsError> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(StatsError::Malformed("truncated field"))
}

fn i16_at(b: &[u8], at: usize) -> Result<i16, StatsError> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(i16::from_le_bytes)
        .ok_or(StatsError::Malformed("truncated field"))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, StatsError> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_le_bytes)
        .ok_or(StatsError::Malformed("truncated field"))
}

/// Parses the header (the first `struct kvm_stats_header` of the file) and checks that the
/// descriptor table it announces is plausible.
pub fn parse_header(b: &[u8]) -> Result<kvm_stats_header, StatsError> {
    if b.len() < HEADER_LEN {
        return Err(StatsError::Malformed("short header"));
    }
    let field = |at| u32_at(b, at);
    let header = kvm_stats_header {
        flags: field(offset_of!(kvm_stats_header, flags))?,
        name_size: field(offset_of!(kvm_stats_header, name_size))?,
        num_desc: field(offset_of!(kvm_stats_header, num_desc))?,
        id_offset: field(offset_of!(kvm_stats_header, id_offset))?,
        desc_offset: field(offset_of!(kvm_stats_header, desc_offset))?,
        data_offset: field(offset_of!(kvm_stats_header, data_offset))?,
    };
    let (name_size, num_desc) = (header.name_size as usize, header.num_desc as usize);
    if name_size == 0
        || (DESC_FIXED_LEN + name_size).saturating_mul(num_desc) > MAX_DESCRIPTOR_BYTES
    {
        return Err(StatsError::Malformed("implausible descriptor table"));
    }
    Ok(header)
}

/// Parses `num_desc` descriptors of `DESC_FIXED_LEN + name_size` bytes each.
pub fn parse_descriptors(
    b: &[u8],
    name_size: usize,
    num_desc: usize,
) -> Result<Vec<StatDescriptor>, StatsError> {
    let stride = DESC_FIXED_LEN + name_size;
    if b.len() < stride * num_desc {
        return Err(StatsError::Malformed("short descriptor table"));
    }
    (0..num_desc)
        .map(|i| {
            let d = &b[i * stride..(i + 1) * stride];
            let name_bytes = &d[offset_of!(kvm_stats_desc, name)..];
            let end = name_bytes.iter().position(|&c| c == 0).unwrap_or(name_size);
            Ok(StatDescriptor {
                name: String::from_utf8_lossy(&name_bytes[..end]).into_owned(),
                flags: u32_at(d, offset_of!(kvm_stats_desc, flags))?,
                exponent: i16_at(d, offset_of!(kvm_stats_desc, exponent))?,
                size: u16_at(d, offset_of!(kvm_stats_desc, size))?,
                offset: u32_at(d, offset_of!(kvm_stats_desc, offset))?,
            })
        })
        .collect()
}

/// A counter in nanoseconds: where it is and how to scale it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NsCounter {
    file_offset: u64,
    /// Multiply the raw value by 10^shift to get nanoseconds (shift >= 0), or divide.
    pow10_to_ns: i32,
}

impl NsCounter {
    fn from_descriptor(layout: &StatsLayout, name: &'static str) -> Result<Self, StatsError> {
        let d = layout
            .descriptors
            .iter()
            .find(|d| d.name == name)
            .ok_or(StatsError::Missing(name))?;
        if d.flags & KVM_STATS_UNIT_MASK != KVM_STATS_UNIT_SECONDS
            || d.flags & KVM_STATS_BASE_MASK != KVM_STATS_BASE_POW10
            || d.size == 0
        {
            return Err(StatsError::Malformed(
                "halt counter is not a time in seconds",
            ));
        }
        Ok(Self {
            file_offset: layout.data_offset + u64::from(d.offset),
            pow10_to_ns: i32::from(d.exponent) - NANO_EXPONENT,
        })
    }

    fn to_ns(self, raw: u64) -> u64 {
        match self.pow10_to_ns {
            0 => raw,
            p if p > 0 => raw.saturating_mul(10u64.saturating_pow(p.unsigned_abs())),
            p => raw / 10u64.saturating_pow(p.unsigned_abs()),
        }
    }
}

/// The halt counters of one vCPU.
pub struct VcpuHaltStats {
    file: File,
    wait: NsCounter,
    polls: Vec<NsCounter>,
}

impl VcpuHaltStats {
    /// Opens the stats fd of a vCPU. Must be called while no thread is in `KVM_RUN` on it
    /// (the ioctl takes the vCPU's mutex).
    pub fn open(vcpu: &impl AsRawFd) -> Result<Self, StatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1; the vCPU fd
        // is valid for the duration of the call.
        let fd = unsafe { ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(StatsError::Open(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        Self::from_file(file)
    }

    /// Parses a stats file.
    pub fn from_file(file: File) -> Result<Self, StatsError> {
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0)
            .map_err(StatsError::Read)?;
        let header = parse_header(&header)?;
        let (name_size, num_desc) = (header.name_size as usize, header.num_desc as usize);
        let mut table = vec![0u8; (DESC_FIXED_LEN + name_size) * num_desc];
        file.read_exact_at(&mut table, u64::from(header.desc_offset))
            .map_err(StatsError::Read)?;
        let layout = StatsLayout {
            data_offset: u64::from(header.data_offset),
            descriptors: parse_descriptors(&table, name_size, num_desc)?,
        };
        let wait = NsCounter::from_descriptor(&layout, HALT_WAIT_NS)?;
        // Polling counters are optional (halt polling can be compiled out).
        let polls = [HALT_POLL_SUCCESS_NS, HALT_POLL_FAIL_NS]
            .into_iter()
            .filter_map(|n| NsCounter::from_descriptor(&layout, n).ok())
            .collect();
        Ok(Self { file, wait, polls })
    }

    fn read(&self, c: NsCounter) -> Result<u64, StatsError> {
        let mut v = [0u8; 8];
        self.file
            .read_exact_at(&mut v, c.file_offset)
            .map_err(StatsError::Read)?;
        Ok(c.to_ns(u64::from_le_bytes(v)))
    }

    /// Cumulative nanoseconds the guest kept this vCPU halted: waiting plus polling (while KVM
    /// polls, the host CPU spins but the guest has nothing to run).
    pub fn halted_ns(&self) -> Result<u64, StatsError> {
        Ok(self.read(self.wait)?.saturating_add(self.polled_ns()?))
    }

    /// Cumulative nanoseconds KVM spent polling for a wake-up of this halted vCPU (0 when the
    /// kernel has no halt polling counters).
    pub fn polled_ns(&self) -> Result<u64, StatsError> {
        let mut total = 0u64;
        for p in &self.polls {
            total = total.saturating_add(self.read(*p)?);
        }
        Ok(total)
    }
}

/// Stats file images for tests of this module and of the idle sources.
#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
pub(crate) mod fake {
    use super::*;

    /// Builds a stats file image the way KVM lays it out: (name, flags, exponent, value).
    pub(crate) fn image(stats: &[(&str, u32, i16, u64)]) -> Vec<u8> {
        let name_size = 48usize;
        let desc_offset = HEADER_LEN + 16; // an id string sits between header and descriptors
        let stride = DESC_FIXED_LEN + name_size;
        let data_offset = desc_offset + stride * stats.len();
        let mut f = vec![0u8; data_offset + 8 * stats.len()];
        let put =
            |f: &mut Vec<u8>, at: usize, v: u32| f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put(&mut f, 4, name_size as u32);
        put(&mut f, 8, stats.len() as u32);
        put(&mut f, 12, HEADER_LEN as u32);
        put(&mut f, 16, desc_offset as u32);
        put(&mut f, 20, data_offset as u32);
        for (i, (name, flags, exp, value)) in stats.iter().enumerate() {
            let d = desc_offset + i * stride;
            put(&mut f, d, *flags);
            f[d + 4..d + 6].copy_from_slice(&exp.to_le_bytes());
            f[d + 6..d + 8].copy_from_slice(&1u16.to_le_bytes());
            put(&mut f, d + 8, (i * 8) as u32);
            f[d + 16..d + 16 + name.len()].copy_from_slice(name.as_bytes());
            f[data_offset + i * 8..data_offset + i * 8 + 8].copy_from_slice(&value.to_le_bytes());
        }
        f
    }

    /// An open, already unlinked file holding `bytes`. Each call gets its own
    /// name: tests run in parallel threads of one process.
    pub(crate) fn file_with(bytes: &[u8]) -> File {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("pvmm-stats-{}-{n}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{file_with, image};
    use super::*;

    #[test]
    fn reads_halt_counters_by_name_with_scaling() {
        let secs = KVM_STATS_UNIT_SECONDS;
        let img = image(&[
            ("halt_exits", 0, 0, 99),
            (HALT_WAIT_NS, secs, -9, 5_000),
            (HALT_POLL_SUCCESS_NS, secs, -9, 300),
            // Microseconds: scaled up to ns.
            (HALT_POLL_FAIL_NS, secs, -6, 2),
        ]);
        let s = VcpuHaltStats::from_file(file_with(&img)).unwrap();
        assert_eq!(s.halted_ns().unwrap(), 5_000 + 300 + 2_000);
        assert_eq!(s.polled_ns().unwrap(), 300 + 2_000);
    }

    #[test]
    fn missing_or_wrong_unit_counter_is_an_error() {
        let img = image(&[("halt_exits", 0, 0, 1)]);
        assert!(matches!(
            VcpuHaltStats::from_file(file_with(&img)),
            Err(StatsError::Missing(HALT_WAIT_NS))
        ));
        let img = image(&[(HALT_WAIT_NS, 0, 0, 1)]);
        assert!(matches!(
            VcpuHaltStats::from_file(file_with(&img)),
            Err(StatsError::Malformed(_))
        ));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert!(VcpuHaltStats::from_file(file_with(&[1, 2, 3])).is_err());
        let mut img = image(&[(HALT_WAIT_NS, KVM_STATS_UNIT_SECONDS, -9, 1)]);
        img[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(VcpuHaltStats::from_file(file_with(&img)).is_err());
    }
}
