//! A VM's stable name: what operators call it, the `vm` label of its metrics and the first
//! column of `pvmm-host status`. It comes from the VM's own configuration, so it stays the
//! same when the daemon restarts (the daemon's ids do not):
//!
//! - QEMU (and so libvirt, which passes the domain name): `-name guest=NAME,...` or
//!   `-name NAME[,...]`;
//! - Firecracker: `--id ID`;
//! - cloud-hypervisor: its `--api-socket` (`path=PATH` or `PATH`), by file name;
//! - crosvm: its `--socket PATH`, by file name;
//! - a pvmm VM: its `--name`, else its control socket's file name without `.sock`;
//! - anything else: its pid.

use std::path::Path;

/// The name a foreign VMM started with `cmdline` (its `/proc/<pid>/cmdline` arguments) gives
/// its VM, or its pid.
pub fn foreign_name(cmdline: &[String], pid: i32) -> String {
    let program = cmdline
        .first()
        .and_then(|p| Path::new(p).file_name())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let value = |flag: &str| {
        let at = cmdline.iter().position(|a| a == flag)?;
        cmdline.get(at + 1).map(String::as_str)
    };
    let named = if program.starts_with("qemu") {
        value("-name").and_then(qemu_name)
    } else if program.starts_with("firecracker") {
        value("--id").map(str::to_string)
    } else if program.starts_with("cloud-hypervisor") {
        value("--api-socket").and_then(|s| file_name(s.strip_prefix("path=").unwrap_or(s)))
    } else if program.starts_with("crosvm") {
        value("--socket").and_then(file_name)
    } else {
        None
    };
    named
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| pid.to_string())
}

/// QEMU's `-name` value: `guest=NAME` among its options, or a first option without `=`.
/// A `,,` is QEMU's escaped comma.
fn qemu_name(value: &str) -> Option<String> {
    let options: Vec<String> = split_qemu_options(value);
    let guest = options.iter().find_map(|o| o.strip_prefix("guest="));
    match guest {
        Some(name) => Some(name.to_string()),
        None => options.first().filter(|o| !o.contains('=')).cloned(),
    }
}

/// QEMU's option list split at single commas, `,,` kept as a comma.
fn split_qemu_options(value: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (',', Some(',')) => {
                chars.next();
                if let Some(s) = out.last_mut() {
                    s.push(',');
                }
            }
            (',', _) => out.push(String::new()),
            (c, _) => {
                if let Some(s) = out.last_mut() {
                    s.push(c);
                }
            }
        }
    }
    out
}

fn file_name(path: &str) -> Option<String> {
    let name = Path::new(path).file_name()?.to_string_lossy().into_owned();
    Some(name.strip_suffix(".sock").unwrap_or(&name).to_string())
}

/// A pvmm VM's name: the one it was given (`--name`), else its socket's file name.
pub fn pvmm_name(given: Option<&str>, socket: &Path) -> String {
    match given {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => file_name(&socket.to_string_lossy()).unwrap_or_default(),
    }
}

/// A process's command line from its `/proc/<pid>/cmdline` (NUL-separated arguments).
pub fn read_cmdline(proc_pid: &Path) -> Vec<String> {
    std::fs::read(proc_pid.join("cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn each_vmm_names_its_vm_its_own_way() {
        let libvirt = "/usr/bin/qemu-system-x86_64 -name guest=web-1,debug-threads=on -S";
        assert_eq!(foreign_name(&args(libvirt), 7), "web-1");
        assert_eq!(
            foreign_name(&args("qemu-system-x86_64 -name db,debug-threads=on"), 7),
            "db"
        );
        assert_eq!(
            foreign_name(&args("qemu-system-x86_64 -name a,,b,process=x"), 7),
            "a,b"
        );
        assert_eq!(
            foreign_name(&args("firecracker --api-sock /run/fc.sock --id fc-7"), 7),
            "fc-7"
        );
        assert_eq!(
            foreign_name(
                &args("cloud-hypervisor --api-socket path=/run/ch/vm3.sock --cpus boot=2"),
                7
            ),
            "vm3"
        );
        assert_eq!(
            foreign_name(&args("crosvm run --socket /run/crosvm/x.sock vmlinux"), 7),
            "x"
        );
    }

    #[test]
    fn without_a_name_the_pid_is_the_name() {
        assert_eq!(foreign_name(&args("qemu-system-x86_64 -m 64"), 42), "42");
        assert_eq!(foreign_name(&args("qemu-system-x86_64 -name"), 42), "42");
        assert_eq!(
            foreign_name(&args("qemu-system-x86_64 -name process=q"), 42),
            "42"
        );
        assert_eq!(foreign_name(&[], 42), "42");
        assert_eq!(foreign_name(&args("myvmm --id z"), 42), "42");
    }

    #[test]
    fn a_pvmm_vm_is_its_name_or_its_socket() {
        let socket = Path::new("/run/pvmm/web.sock");
        assert_eq!(pvmm_name(Some("db"), socket), "db");
        assert_eq!(pvmm_name(None, socket), "web");
        assert_eq!(pvmm_name(Some(""), socket), "web");
    }
}
