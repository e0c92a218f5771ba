//! This machine: its programs, running them, and progress lines.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{io_err, ImageError};

/// Where Debian's busybox-static installs busybox.
pub const BUSYBOX: &str = "/bin/busybox";

/// The QEMU binary used for L1 (on the host) and as the inner VMM in L1 (`--vmm qemu`).
pub const QEMU: &str = "qemu-system-x86_64";

/// Prints a progress line on stderr.
pub fn progress(message: &str) {
    eprintln!("pvmm-rig: {message}");
}

/// Runs `command` (from the Debian package `package`) and returns its stdout; a failure
/// carries its stderr.
pub(crate) fn run_tool(command: &mut Command, package: &'static str) -> Result<String, ImageError> {
    let rendered = format!("{command:?}").replace('"', "");
    let output = command.output().map_err(|source| ImageError::ToolMissing {
        program: command.get_program().to_string_lossy().into_owned(),
        package,
        source,
    })?;
    if !output.status.success() {
        return Err(ImageError::ToolFailed {
            command: rendered,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `program` on `PATH`.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// Libraries `ldd` lists for `binary` (absolute paths, including the dynamic loader).
pub(crate) fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let listing = run_tool(Command::new("ldd").arg(binary), "libc-bin")?;
    let mut libraries = Vec::new();
    for line in listing.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// Checks that `path` is an ELF executable without a program interpreter (static).
pub(crate) fn is_static_elf(path: &Path) -> Result<bool, ImageError> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return Ok(false);
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[32..40].try_into().unwrap_or([0; 8]));
    // A table past usize is past the file too.
    let phoff = usize::try_from(phoff).unwrap_or(usize::MAX);
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    for index in 0..phnum {
        let kind = phoff
            .checked_add(index * phentsize)
            .and_then(|offset| bytes.get(offset..offset.checked_add(4)?));
        let Some(kind) = kind else {
            return Ok(false);
        };
        if u32::from_le_bytes([kind[0], kind[1], kind[2], kind[3]]) == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_static_and_dynamic_executables() {
        // /bin/sh on Debian is dynamically linked (dash); the test binary itself is too.
        let this = std::env::current_exe().unwrap();
        assert!(!is_static_elf(&this).unwrap());
        let not_elf = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert!(!is_static_elf(&not_elf).unwrap());
    }

    #[test]
    fn program_headers_past_the_end_are_not_static() {
        // An ELF64 header whose program header table starts at the last byte offset there is.
        let mut elf = vec![0u8; 64];
        elf[..5].copy_from_slice(b"\x7fELF\x02");
        elf[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        let path = std::env::temp_dir().join(format!("pvmm-rig-elf-{}", std::process::id()));
        std::fs::write(&path, &elf).unwrap();
        let result = is_static_elf(&path);
        std::fs::remove_file(&path).unwrap();
        assert!(!result.unwrap());
    }
}
