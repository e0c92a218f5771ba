//! An existing tap device, opened as virtio-net's backend: `/dev/net/tun` with `TUNSETIFF`
//! (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`), so that each read or write is one Ethernet frame
//! behind a virtio-net header of the size the guest uses (`TUNSETVNETHDRSZ`). pvmm never
//! creates a tap: one that does not exist is the user's mistake, reported as such.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// `_IOW('T', 202, int)`: attach to (or create) a tun/tap interface.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `_IOW('T', 216, int)`: the virtio-net header size the tap reads and writes.
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
/// `_IOW('T', 208, unsigned int)`: the offloads the tap may hand to its reader.
pub const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// `TUNSETOFFLOAD` flags: frames whose checksum is left to the reader, and TCP segments of up
/// to 64 KiB (IPv4, IPv6) that the reader need not cut to the MTU.
pub const TUN_F_CSUM: u32 = 0x01;
/// See [`TUN_F_CSUM`].
pub const TUN_F_TSO4: u32 = 0x02;
/// See [`TUN_F_CSUM`].
pub const TUN_F_TSO6: u32 = 0x04;
/// Interface flags: a tap (Ethernet frames), no packet-information prefix, a virtio-net
/// header on each frame.
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// Longest interface name, with its terminating zero (IFNAMSIZ).
const IFNAMSIZ: usize = 16;

/// Why a tap cannot back a network device.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name is empty or too long for an interface.
    #[error("--net tap={0}: not an interface name (1 to 15 bytes)")]
    BadName(String),
    /// No such interface.
    #[error(
        "--net tap={0}: no such tap device (create it first, e.g. ip tuntap add {0} mode tap)"
    )]
    Missing(String),
    /// An interface that is not a tap.
    #[error("--net tap={0}: not a tap device")]
    NotATap(String),
    /// Opening `/dev/net/tun` or attaching to the tap failed.
    #[error("--net tap={name}: {source}")]
    Open {
        /// The tap.
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// An open tap.
#[derive(Debug)]
pub struct Tap {
    file: File,
}

/// The `ifreq` of `TUNSETIFF`: the name, then the flags (the rest of the union unused).
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

impl Tap {
    /// Opens the existing tap `name`, non-blocking, with virtio-net headers of `header_len`
    /// bytes on its frames.
    pub fn open(name: &str, header_len: usize) -> Result<Self, TapError> {
        if name.is_empty() || name.len() >= IFNAMSIZ || name.contains('/') {
            return Err(TapError::BadName(name.into()));
        }
        // Asked of the kernel, not of sysfs, which shows the network namespace it was mounted
        // in rather than pvmm's. TUNSETIFF would create a missing tap: pvmm never does.
        let c_name = std::ffi::CString::new(name).map_err(|_| TapError::BadName(name.into()))?;
        // SAFETY: `c_name` is a valid C string.
        if unsafe { libc::if_nametoindex(c_name.as_ptr()) } == 0 {
            return Err(TapError::Missing(name.into()));
        }
        let err = |source| TapError::Open {
            name: name.into(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(err)?;
        let mut req = IfReq {
            name: [0; IFNAMSIZ],
            flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
            _rest: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes an `ifreq`, which `req` is laid out as.
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) } != 0 {
            let e = std::io::Error::last_os_error();
            // An interface of that name that is not a tap (a tun, a NIC) is refused with EINVAL.
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(TapError::NotATap(name.into()));
            }
            return Err(err(e));
        }
        let len = libc::c_int::try_from(header_len)
            .map_err(|_| err(std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: TUNSETVNETHDRSZ reads one int.
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETVNETHDRSZ, &len) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(Self { file })
    }

    /// The frames' file.
    pub fn into_file(self) -> File {
        self.file
    }
}

/// Sets the offloads (`TUN_F_*`) the tap `file` may use on the frames it hands to pvmm. Frames
/// pvmm writes may always carry checksum and segmentation requests in their header: the tap
/// completes them itself.
pub fn set_offload(file: &File, flags: u32) -> std::io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its flags as the ioctl's argument, not through a pointer.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD, libc::c_ulong::from(flags)) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// A MAC address for `tap` that stays the same for that tap: locally administered, unicast,
/// its other 46 bits from a hash (FNV-1a) of the name.
pub fn stable_mac(tap: &str) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tap.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_le_bytes();
    [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

/// Parses `aa:bb:cc:dd:ee:ff`, a unicast address.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    let unicast = mac[0] & 1 == 0;
    (parts.next().is_none() && unicast).then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_stable_local_unicast_and_parsed_strictly() {
        let a = stable_mac("tap0");
        assert_eq!(a, stable_mac("tap0"));
        assert_ne!(a, stable_mac("tap1"));
        assert_eq!(a[0] & 0x03, 0x02, "locally administered, unicast");
        assert_eq!(
            parse_mac("52:54:00:12:34:56"),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        for bad in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "01:00:5e:00:00:01",
            "zz:54:00:12:34:56",
            "5:54:00:12:34:56",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn missing_or_badly_named_taps_are_refused() {
        assert!(matches!(Tap::open("", 12), Err(TapError::BadName(_))));
        assert!(matches!(
            Tap::open("a-very-long-name-x", 12),
            Err(TapError::BadName(_))
        ));
        assert!(matches!(
            Tap::open("pvmm-none0", 12),
            Err(TapError::Missing(_))
        ));
        let lo = Tap::open("lo", 12).unwrap_err();
        assert!(
            matches!(lo, TapError::NotATap(_) | TapError::Open { .. }),
            "{lo}"
        );
    }
}
