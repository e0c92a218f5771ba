//! A writer for "newc" cpio archives, the format the Linux kernel unpacks as an initramfs.
//!
//! Written here rather than calling a `cpio` binary (Debian machines have none by default) and
//! so that archives are reproducible: entries are written in path order, every entry is owned
//! by root, inode numbers count up from 1, and all modification times are the same fixed value.
//! Device nodes (e.g. `/dev/console`) can be added without privileges.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The newc magic ("new ASCII" format without checksums).
const NEWC_MAGIC: &str = "070701";

/// File type bits of `st_mode` (see inode(7)).
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Errors from building or writing an archive.
#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    #[error("archive path '{0}' is not a relative path of normal components")]
    BadPath(String),
    #[error("cannot read '{path}' for the archive: {source}")]
    ReadSource { path: PathBuf, source: io::Error },
    #[error("cannot write archive '{path}': {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("'{0}' is larger than 4 GiB, which newc cannot store")]
    TooLarge(String),
}

/// What an archive entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    Directory,
    FileFrom(PathBuf),
    FileBytes(Vec<u8>),
    Symlink(String),
    CharDevice { major: u32, minor: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    permissions: u32,
    content: Content,
}

/// An archive being assembled; nothing touches the disk until [`CpioArchive::write_to`].
#[derive(Debug, Default, Clone)]
pub struct CpioArchive {
    entries: BTreeMap<String, Entry>,
    mtime: u32,
}

fn normalize(path: &str) -> Result<String, CpioError> {
    let trimmed = path.trim_start_matches('/');
    let ok = !trimmed.is_empty()
        && trimmed
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if ok {
        Ok(trimmed.to_string())
    } else {
        Err(CpioError::BadPath(path.to_string()))
    }
}

impl CpioArchive {
    /// An empty archive whose entries all carry modification time `mtime` (seconds since the
    /// epoch; use a fixed value for reproducible output).
    pub fn new(mtime: u32) -> Self {
        CpioArchive {
            entries: BTreeMap::new(),
            mtime,
        }
    }

    fn insert(&mut self, path: &str, entry: Entry) -> Result<(), CpioError> {
        let path = normalize(path)?;
        // Parent directories first, so the kernel can create the entry.
        let mut parent = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            self.entries.entry(parent.clone()).or_insert(Entry {
                permissions: 0o755,
                content: Content::Directory,
            });
        }
        self.entries.insert(path, entry);
        Ok(())
    }

    /// Adds a directory (and its parents).
    pub fn add_dir(&mut self, path: &str, permissions: u32) -> Result<(), CpioError> {
        self.insert(
            path,
            Entry {
                permissions,
                content: Content::Directory,
            },
        )
    }

    /// Adds a regular file whose bytes are read from `source` (following symlinks) when the
    /// archive is written.
    pub fn add_file_from(
        &mut self,
        path: &str,
        source: &Path,
        permissions: u32,
    ) -> Result<(), CpioError> {
        self.insert(
            path,
            Entry {
                permissions,
                content: Content::FileFrom(source.to_path_buf()),
            },
        )
    }

    /// Adds a regular file with the given bytes.
    pub fn add_file_bytes(
        &mut self,
        path: &str,
        bytes: &[u8],
        permissions: u32,
    ) -> Result<(), CpioError> {
        self.insert(
            path,
            Entry {
                permissions,
                content: Content::FileBytes(bytes.to_vec()),
            },
        )
    }

    /// Adds a symbolic link pointing at `target`.
    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<(), CpioError> {
        self.insert(
            path,
            Entry {
                permissions: 0o777,
                content: Content::Symlink(target.to_string()),
            },
        )
    }

    /// Adds a character device node.
    pub fn add_char_device(
        &mut self,
        path: &str,
        permissions: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), CpioError> {
        self.insert(
            path,
            Entry {
                permissions,
                content: Content::CharDevice { major, minor },
            },
        )
    }

    /// Whether the archive has an entry at `path`.
    pub fn contains(&self, path: &str) -> bool {
        normalize(path).is_ok_and(|p| self.entries.contains_key(&p))
    }

    /// Writes the archive's directories, files and symbolic links as a tree under `dir` (which
    /// must not exist yet), for tools that take a directory (`mke2fs -d`). Device nodes are left
    /// out: creating them needs privileges, and a kernel with devtmpfs does not need them.
    pub fn extract_to(&self, dir: &Path) -> Result<(), CpioError> {
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CpioError::Write { path, source }
        };
        std::fs::create_dir(dir).map_err(werr(dir))?;
        for (name, entry) in &self.entries {
            let path = dir.join(name);
            match &entry.content {
                Content::Directory => std::fs::create_dir(&path).map_err(werr(&path))?,
                Content::FileBytes(bytes) => std::fs::write(&path, bytes).map_err(werr(&path))?,
                Content::FileFrom(source) => {
                    std::fs::copy(source, &path).map_err(|e| CpioError::ReadSource {
                        path: source.clone(),
                        source: e,
                    })?;
                }
                Content::Symlink(target) => {
                    std::os::unix::fs::symlink(target, &path).map_err(werr(&path))?;
                    continue;
                }
                Content::CharDevice { .. } => continue,
            }
            let mode = std::fs::Permissions::from_mode(entry.permissions & 0o7777);
            std::fs::set_permissions(&path, mode).map_err(werr(&path))?;
        }
        Ok(())
    }

    /// Writes the archive (with its trailer) to `out`.
    pub fn write<W: Write>(&self, out: &mut W) -> Result<u64, CpioError> {
        let mut writer = CountingWriter {
            inner: out,
            written: 0,
        };
        let werr = |source| CpioError::Write {
            path: PathBuf::from("<stream>"),
            source,
        };
        for (inode, (path, entry)) in (1u32..).zip(self.entries.iter()) {
            let data: Vec<u8> = match &entry.content {
                Content::Directory | Content::CharDevice { .. } => Vec::new(),
                Content::FileBytes(bytes) => bytes.clone(),
                Content::Symlink(target) => target.as_bytes().to_vec(),
                Content::FileFrom(source) => {
                    let mut bytes = Vec::new();
                    File::open(source)
                        .and_then(|mut f| f.read_to_end(&mut bytes))
                        .map_err(|e| CpioError::ReadSource {
                            path: source.clone(),
                            source: e,
                        })?;
                    bytes
                }
            };
            let size = u32::try_from(data.len()).map_err(|_| CpioError::TooLarge(path.clone()))?;
            let (kind, nlink, rdev) = match entry.content {
                Content::Directory => (S_IFDIR, 2, (0, 0)),
                Content::FileFrom(_) | Content::FileBytes(_) => (S_IFREG, 1, (0, 0)),
                Content::Symlink(_) => (S_IFLNK, 1, (0, 0)),
                Content::CharDevice { major, minor } => (S_IFCHR, 1, (major, minor)),
            };
            let header = Header {
                inode,
                mode: kind | (entry.permissions & 0o7777),
                nlink,
                mtime: self.mtime,
                size,
                rdev,
                name: path,
            };
            header.write(&mut writer).map_err(werr)?;
            writer.write_all(&data).map_err(werr)?;
            writer.pad4().map_err(werr)?;
        }
        let trailer = Header {
            inode: 0,
            mode: 0,
            nlink: 1,
            mtime: 0,
            size: 0,
            rdev: (0, 0),
            name: "TRAILER!!!",
        };
        trailer.write(&mut writer).map_err(werr)?;
        writer.flush().map_err(werr)?;
        Ok(writer.written)
    }

    /// Writes the archive to `path` atomically (a temporary file renamed into place).
    pub fn write_to(&self, path: &Path) -> Result<u64, CpioError> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let result = (|| {
            let file = File::create(&tmp).map_err(|source| CpioError::Write {
                path: tmp.clone(),
                source,
            })?;
            let mut out = BufWriter::new(file);
            let written = self.write(&mut out).map_err(|e| match e {
                CpioError::Write { source, .. } => CpioError::Write {
                    path: path.to_path_buf(),
                    source,
                },
                other => other,
            })?;
            drop(out);
            std::fs::rename(&tmp, path).map_err(|source| CpioError::Write {
                path: path.to_path_buf(),
                source,
            })?;
            Ok(written)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

struct Header<'a> {
    inode: u32,
    mode: u32,
    nlink: u32,
    mtime: u32,
    size: u32,
    rdev: (u32, u32),
    name: &'a str,
}

impl Header<'_> {
    fn write<W: Write>(&self, out: &mut CountingWriter<W>) -> io::Result<()> {
        let name_size = u32::try_from(self.name.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cpio name too long"))?;
        let fields = [
            self.inode,
            self.mode,
            0,
            0,
            self.nlink,
            self.mtime,
            self.size,
            0,
            0,
            self.rdev.0,
            self.rdev.1,
            name_size,
            0,
        ];
        let mut header = String::with_capacity(110);
        header.push_str(NEWC_MAGIC);
        for field in fields {
            header.push_str(&format!("{field:08x}"));
        }
        out.write_all(header.as_bytes())?;
        out.write_all(self.name.as_bytes())?;
        out.write_all(&[0])?;
        out.pad4()
    }
}

struct CountingWriter<W> {
    inner: W,
    written: u64,
}

impl<W: Write> CountingWriter<W> {
    fn pad4(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.write_all(&[0u8; 3][..pad])
    }
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn field(bytes: &[u8], offset: usize, index: usize) -> u32 {
        let start = offset + 6 + index * 8;
        u32::from_str_radix(std::str::from_utf8(&bytes[start..start + 8]).unwrap(), 16).unwrap()
    }

    #[test]
    fn writes_parents_first_and_aligned_entries() {
        let mut archive = CpioArchive::new(0);
        archive.add_file_bytes("/bin/hello", b"hi!", 0o755).unwrap();
        archive.add_char_device("dev/console", 0o600, 5, 1).unwrap();
        let mut out = Vec::new();
        let written = archive.write(&mut out).unwrap();
        assert_eq!(written as usize, out.len());
        assert_eq!(out.len() % 4, 0);
        // First entry: directory "bin".
        assert_eq!(&out[..6], b"070701");
        assert_eq!(field(&out, 0, 1) & 0o170000, S_IFDIR);
        assert_eq!(&out[110..114], b"bin\0");
        // Walk all entries and collect names.
        let mut offset = 0;
        let mut names = Vec::new();
        loop {
            let name_size = field(&out, offset, 11) as usize;
            let size = field(&out, offset, 6) as usize;
            let name =
                std::str::from_utf8(&out[offset + 110..offset + 110 + name_size - 1]).unwrap();
            names.push(name.to_string());
            if name == "TRAILER!!!" {
                break;
            }
            if name == "dev/console" {
                assert_eq!(field(&out, offset, 9), 5);
                assert_eq!(field(&out, offset, 10), 1);
            }
            let data_start = (offset + 110 + name_size).div_ceil(4) * 4;
            if name == "bin/hello" {
                assert_eq!(&out[data_start..data_start + size], b"hi!");
            }
            offset = (data_start + size).div_ceil(4) * 4;
        }
        assert_eq!(
            names,
            ["bin", "bin/hello", "dev", "dev/console", "TRAILER!!!"]
        );
    }

    #[test]
    fn extracts_a_tree_without_device_nodes() {
        let mut archive = CpioArchive::new(0);
        archive
            .add_file_bytes("bin/busybox", b"elf", 0o755)
            .unwrap();
        archive.add_symlink("bin/sh", "/bin/busybox").unwrap();
        archive.add_file_bytes("init", b"#!/bin/sh", 0o700).unwrap();
        archive.add_char_device("dev/console", 0o600, 5, 1).unwrap();
        let dir = std::env::temp_dir().join(format!("pvmm-cpio-tree-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        archive.extract_to(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join("bin/busybox")).unwrap(), b"elf");
        assert_eq!(
            std::fs::read_link(dir.join("bin/sh")).unwrap(),
            Path::new("/bin/busybox")
        );
        let mode = std::fs::metadata(dir.join("init"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o700);
        assert!(dir.join("dev").is_dir());
        assert!(!dir.join("dev/console").exists());
        // The tree must be new: a second extraction refuses to mix into it.
        assert!(archive.extract_to(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_is_reproducible_and_rejects_bad_paths() {
        let build = || {
            let mut archive = CpioArchive::new(0);
            archive.add_symlink("bin/sh", "busybox").unwrap();
            archive.add_dir("proc", 0o755).unwrap();
            let mut out = Vec::new();
            archive.write(&mut out).unwrap();
            out
        };
        assert_eq!(build(), build());
        let mut archive = CpioArchive::new(0);
        assert!(archive.add_dir("a/../b", 0o755).is_err());
        assert!(archive.add_dir("/", 0o755).is_err());
    }
}
