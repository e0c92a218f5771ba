//! pvmm-host next to a real libvirtd, as an operator runs it: the test starts libvirtd (and
//! virtlogd) itself when none runs, defines two small KVM domains whose kernel is the tiny
//! halting PVH guest, and runs `pvmm host --adopt auto` with a 2-package topology over this
//! machine's 2 CPUs. Checked from `/proc` and from the daemon's status and metrics:
//!
//! - the domains' names are the VMs' names in status and metrics;
//! - after `virsh vcpupin` on one vCPU the daemon reports it pinned by the operator, leaves
//!   its thread's affinity alone (read from /proc), makes no apply error, and keeps placing
//!   the other vCPUs, packed: once the load settles, every other vCPU thread's affinity in
//!   /proc is the CPU status gives it, all within one package, for 20 samples in a row;
//! - after the pin is widened again the daemon takes the vCPU back;
//! - after `virsh destroy` of a domain the daemon drops it: status no longer lists it and no
//!   metric carries its `vm` label.
//!
//! It needs root and Debian's libvirt-daemon, libvirt-daemon-driver-qemu and libvirt-clients
//! (`.ci/run` installs them); without them it skips loudly, or fails under
//! PVMM_REQUIRE_LIBVIRT=1. The domains have no network interface.

mod common;
use common::*;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pvmm_api::stats::{HostStatus, HostVcpu};

/// libvirt's system connection.
const URI: &str = "qemu:///system";
/// QEMU's firmware runs a while in KVM's emulator on this machine before a PVH kernel starts,
/// and the daemon needs a few ticks after that.
const SETTLE: Duration = Duration::from_secs(180);
/// The domains.
const DOMAINS: [&str; 2] = ["pvmm-lv-a", "pvmm-lv-b"];

/// Whether `program` is in one of `PATH`'s folders.
fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}

fn libvirt_available() -> bool {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["libvirtd", "virtlogd", "virsh"].iter().all(|t| on_path(t));
    if root && tools {
        return true;
    }
    let why = if root {
        "libvirtd, virtlogd or virsh is not installed"
    } else {
        "not root"
    };
    require_or_skip(Need::Libvirt, "libvirt", why);
    false
}

fn virsh(args: &[&str]) -> String {
    let out = Command::new("virsh")
        .args(["-c", URI])
        .args(args)
        .output()
        .expect("virsh");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "virsh {args:?}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Starts virtlogd and libvirtd unless a libvirtd already answers; returns what it started.
fn start_libvirtd() -> Vec<Child> {
    let answers = || {
        Command::new("virsh")
            .args(["-c", URI, "version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if answers() {
        return Vec::new();
    }
    for dir in ["/var/log/libvirt", "/run/libvirt", "/var/lib/libvirt/qemu"] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let daemon = |program: &str| {
        Command::new(program)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    };
    let started = vec![daemon("virtlogd"), daemon("libvirtd")];
    let start = Instant::now();
    while !answers() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "libvirtd does not answer"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    started
}

/// Destroys the test's domains, and stops what the test started, at the end either way.
struct Cleanup {
    daemons: Vec<Child>,
    host: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut h) = self.host.take() {
            h.kill().ok();
            h.wait().ok();
        }
        for d in DOMAINS {
            let _ = Command::new("virsh")
                .args(["-c", URI, "destroy", d])
                .output();
        }
        for mut d in self.daemons.drain(..).rev() {
            d.kill().ok();
            d.wait().ok();
        }
    }
}

fn domain_xml(name: &str, kernel: &Path) -> String {
    format!(
        "<domain type='kvm'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>2</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type><kernel>{}</kernel></os>\
         <features><acpi/></features><devices></devices></domain>",
        kernel.display()
    )
}

/// Polls `cond` on the daemon's status until it holds.
fn until(run: &Path, what: &str, cond: impl Fn(&HostStatus) -> bool) -> HostStatus {
    let start = Instant::now();
    loop {
        match host_status(run) {
            Some(s) if cond(&s) => return s,
            last => assert!(start.elapsed() < SETTLE, "{what}: {last:?}"),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The daemon's status, which it answers once [`until`] has seen it.
fn status(run: &Path) -> HostStatus {
    host_status(run).expect("the daemon answers its status")
}

/// The status's vCPU `index` of VM `name`.
fn vcpu<'a>(s: &'a HostStatus, name: &str, index: u32) -> Option<&'a HostVcpu> {
    s.vm(name)?.vcpu(index)
}

/// Whether the status places vCPU `index` of VM `name` on a package.
fn placed(s: &HostStatus, name: &str, index: u32) -> bool {
    vcpu(s, name, index).is_some_and(|v| v.package.is_some())
}

/// The CPUs the status gives vCPU `index` of VM `name`.
fn given(s: &HostStatus, name: &str, index: u32) -> Option<String> {
    Some(vcpu(s, name, index)?.cpus.as_ref()?.to_string())
}

/// A thread's `Cpus_allowed_list`, from /proc.
fn affinity(tid: i32) -> String {
    cpus_allowed(tid.into())
}

/// The package every vCPU but `pinned_tid` is on, if it is one package and each of those
/// threads' affinity in /proc is the CPU status gives it (with `--host-topology 2x1x1`,
/// package N is CPU N).
fn packed_package(s: &HostStatus, pinned_tid: i32) -> Option<u32> {
    let mut packages = Vec::new();
    for d in DOMAINS {
        for i in 0..2 {
            let v = vcpu(s, d, i)?;
            if v.tid == pinned_tid {
                continue;
            }
            let package = v.package?;
            let cpus = v.cpus.as_ref()?.to_string();
            if affinity(v.tid) != cpus || cpus.parse::<u32>().ok() != Some(package) {
                return None;
            }
            packages.push(package);
        }
    }
    packages.dedup();
    match packages[..] {
        [one] => Some(one),
        _ => None,
    }
}

#[test]
fn pvmm_host_names_libvirt_domains_and_never_fights_an_operators_pin() {
    if !kvm_available("libvirt") || !libvirt_available() {
        return;
    }
    let dir = scratch("libvirt");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let mut cleanup = Cleanup {
        daemons: start_libvirtd(),
        host: None,
    };
    for name in DOMAINS {
        let xml = dir.join(format!("{name}.xml"));
        std::fs::write(&xml, domain_xml(name, &kernel)).unwrap();
        virsh(&["create", xml.to_str().unwrap()]);
    }
    let run = dir.join("run");
    cleanup.host = Some(spawn_host(
        &run,
        &[
            "--adopt",
            "auto",
            "--host-topology",
            "2x1x1",
            "--tick-ms",
            "100",
        ],
    ));
    // Named by their domain names, every vCPU placed.
    let s = until(&run, "both domains adopted under their names", |s| {
        DOMAINS.iter().all(|d| (0..2).all(|i| placed(s, d, i)))
    });
    assert_eq!(s.apply_errors, 0, "{s:?}");
    let metrics = host_metrics(&run);
    for d in DOMAINS {
        assert!(
            metrics.contains(&format!("pvmm_vm_vcpus{{vm=\"{d}\"}} 2")),
            "{metrics}"
        );
    }
    // The operator pins vCPU 0 of the first domain to CPU 1.
    let name = DOMAINS[0];
    let pinned_tid = vcpu(&s, name, 0).expect("a placed vCPU 0").tid;
    virsh(&["vcpupin", name, "0", "1"]);
    let pinned = |s: &HostStatus| vcpu(s, name, 0).is_some_and(|v| v.pinned);
    let s = until(&run, "the pin seen", pinned);
    assert_eq!(affinity(pinned_tid), "1", "the operator's pin stays");
    assert_eq!(
        given(&s, name, 0).as_deref(),
        Some("1"),
        "status matches /proc: {s:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let s = status(&run);
    assert_eq!(
        affinity(pinned_tid),
        "1",
        "still the operator's, ticks later"
    );
    assert_eq!(s.apply_errors, 0, "{s:?}");
    // The other vCPUs stay packed. QEMU's firmware keeps a domain's vCPU 0 busy for a while
    // after start, and the engine may then move the others to join the pinned vCPU's package;
    // once the load settles, every other vCPU is on one package and stays there, sample after
    // sample (status and /proc agreeing), while the pin holds and no apply error occurs.
    let start = Instant::now();
    let (mut package, mut streak) = (None, 0);
    while streak < 20 {
        let s = status(&run);
        assert_eq!(affinity(pinned_tid), "1", "the operator's pin stays");
        assert!(pinned(&s), "{s:?}");
        assert_eq!(s.apply_errors, 0, "{s:?}");
        let now = packed_package(&s, pinned_tid);
        streak = if now.is_some() && now == package {
            streak + 1
        } else {
            0
        };
        package = now;
        assert!(
            start.elapsed() < SETTLE,
            "the other vCPUs not packed: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the other vCPUs packed on package {package:?}");
    // Widened to both CPUs again: the daemon takes the vCPU back.
    virsh(&["vcpupin", name, "0", "0-1"]);
    let s = until(&run, "the vCPU taken back", |s| {
        !pinned(s) && given(s, name, 0) == Some(affinity(pinned_tid))
    });
    assert_eq!(s.apply_errors, 0, "{s:?}");
    // The operator destroys the second domain: the daemon drops it.
    let (gone, kept) = (DOMAINS[1], DOMAINS[0]);
    virsh(&["destroy", gone]);
    let s = until(&run, "the destroyed domain dropped", |s| {
        s.vm(gone).is_none()
    });
    assert!(placed(&s, kept, 1), "{s:?}");
    let label = format!("vm=\"{gone}\"");
    let start = Instant::now();
    while host_metrics(&run).contains(&label) {
        assert!(start.elapsed() < SETTLE, "{}", host_metrics(&run));
        std::thread::sleep(Duration::from_millis(250));
    }
    let metrics = host_metrics(&run);
    assert!(
        metrics.contains(&format!("pvmm_vm_vcpus{{vm=\"{kept}\"}} 2")),
        "{metrics}"
    );
    drop(cleanup);
    std::fs::remove_dir_all(&dir).ok();
}
