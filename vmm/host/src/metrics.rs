//! What `pvmm-host` shows operators: each tick's snapshot as JSON (`GET /v1/host`, the
//! `--stats` line, `pvmm-host status`) and as Prometheus text (`GET /metrics`), named in the
//! style of node_exporter and Kepler. Cluster engines (OpenStack Watcher, oVirt) read such
//! metrics to move whole VMs between hosts; pvmm-host places vCPUs within one host.
//!
//! Energy: `pvmm_package_energy_joules_total` comes from powercap RAPL where the host exposes
//! it; everywhere else only `pvmm_package_power_watts_model` is given, the simulator's power
//! model applied to the placement, named as a model so nobody takes it for a measurement.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pvmm_scheduler::power::{thread_overlap, PowerModel};
use pvmm_scheduler::HostTopology;

use pvmm_api::http::{read_request, write_response, HttpResponse, ReadFailure, IO_TIMEOUT};
use pvmm_api::stats::{HostPackage, HostStatus, HostVcpu};

/// Where RAPL's package domains are.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";

/// The latest snapshot, shared by the tick loop and the servers.
pub type Latest = Arc<Mutex<Option<HostStatus>>>;

/// Per-package modelled power (W) for per-CPU loads (`load[cpu]`, 0..1 of a CPU): a package
/// is awake while any of its CPUs is busy (so at least the busiest CPU's share of the time),
/// and each core adds its threads' overlap ([`PowerModel::package_power`]).
pub fn package_power_model(topology: &HostTopology, load: &dyn Fn(u32) -> f64) -> Vec<(u32, f64)> {
    let model = PowerModel::default();
    let mut levels = Vec::new();
    topology
        .packages()
        .iter()
        .map(|p| {
            let awake = p.cpus().iter().map(load).fold(0.0, f64::max);
            let cores: Vec<Vec<f64>> = p
                .cores()
                .map(|c| {
                    let busy: Vec<f64> = c.cpus.iter().map(|&cpu| load(cpu)).collect();
                    thread_overlap(&busy, &mut levels);
                    levels.clone()
                })
                .collect();
            (
                p.id,
                model.package_power(awake, cores.iter().map(Vec::as_slice)),
            )
        })
        .collect()
}

/// RAPL package energy counters (`intel-rapl:N/energy_uj`, package N; AMD exposes the same
/// names), in joules; empty where none is readable.
pub fn rapl_energy(root: &Path) -> Vec<(u32, f64)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, f64)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("intel-rapl:")?.parse().ok()?;
            let uj: f64 = std::fs::read_to_string(e.path().join("energy_uj"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((n, uj / 1e6))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// A package family's value: the package's field it shows.
type PackageValue = fn(&HostPackage) -> Option<f64>;
/// A vCPU family's value: the vCPU's field it shows (None: not placed, no sample).
type VcpuValue = fn(&HostVcpu) -> Option<f64>;

/// Per-package families: name, help, and the status field they show.
const PACKAGE_FAMILIES: &[(&str, &str, PackageValue)] = &[
    (
        "pvmm_package_active",
        "1 when the placement puts vCPUs on the package.",
        |p| Some(f64::from(u8::from(p.active))),
    ),
    (
        "pvmm_package_utilization",
        "Summed utilization of the vCPUs on the package over its CPUs, 0..1.",
        |p| Some(p.util),
    ),
    (
        "pvmm_package_power_watts_model",
        "Modelled package power for the current placement (a model, not a measurement).",
        |p| Some(p.power_w_model),
    ),
];

/// Per-vCPU families: name, help, and the status field they show.
const VCPU_FAMILIES: &[(&str, &str, VcpuValue)] = &[
    (
        "pvmm_vcpu_utilization",
        "Decayed vCPU utilization, 0..1 of a CPU.",
        |v| Some(v.util),
    ),
    (
        "pvmm_vcpu_package",
        "The package the vCPU is placed on.",
        |v| v.package.map(f64::from),
    ),
    (
        "pvmm_vcpu_capacity",
        "The capacity the placement gives the vCPU, 1..1024.",
        |v| v.capacity.map(f64::from),
    ),
];

/// Appends one metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str, rows: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in rows {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// The Prometheus text exposition of a daemon tick's status plus RAPL counters.
pub fn prometheus_text(status: &HostStatus, rapl: &[(u32, f64)]) -> String {
    let mut out = String::new();
    for (name, help, value) in PACKAGE_FAMILIES {
        let rows: Vec<(String, f64)> = status
            .packages
            .iter()
            .filter_map(|p| Some((format!("{{package=\"{}\"}}", p.id), value(p)?)))
            .collect();
        family(&mut out, name, "gauge", help, &rows);
    }
    if !rapl.is_empty() {
        let rows: Vec<(String, f64)> = rapl
            .iter()
            .map(|(n, j)| (format!("{{package=\"{n}\"}}"), *j))
            .collect();
        let help = "Package energy from powercap RAPL.";
        family(
            &mut out,
            "pvmm_package_energy_joules_total",
            "counter",
            help,
            &rows,
        );
    }
    for (name, help, value) in VCPU_FAMILIES {
        let rows: Vec<(String, f64)> = status
            .vms
            .iter()
            .flat_map(|vm| {
                vm.vcpus.iter().filter_map(move |v| {
                    let labels = format!("{{vm=\"{}\",vcpu=\"{}\"}}", vm.id, v.vcpu);
                    Some((labels, value(v)?))
                })
            })
            .collect();
        family(&mut out, name, "gauge", help, &rows);
    }
    let moves = [(String::new(), status.migrations_total as f64)];
    family(
        &mut out,
        "pvmm_migrations_total",
        "counter",
        "vCPU moves between CPUs.",
        &moves,
    );
    let count = [(String::new(), status.vms.len() as f64)];
    family(&mut out, "pvmm_vms", "gauge", "VMs managed.", &count);
    out
}

/// Answers one request on `stream`: `GET /v1/host` (JSON) or `GET /metrics` (text).
pub fn serve_stream<S: Read + Write>(mut stream: S, latest: &Latest, powercap: &Path) {
    let request = match read_request(&mut stream) {
        Ok(r) => r,
        Err(ReadFailure::Bad(answer)) => {
            let _ = write_response(&mut stream, &answer, false);
            return;
        }
        Err(ReadFailure::Gone) => return,
    };
    let snapshot = latest.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let answer = match (request.method.as_str(), request.path.as_str(), snapshot) {
        ("GET", "/v1/host" | "/metrics", None) => {
            HttpResponse::error(503, "no placement tick has run yet")
        }
        ("GET", "/v1/host", Some(s)) => match serde_json::to_value(&s) {
            Ok(body) => HttpResponse::new(200, body),
            Err(e) => HttpResponse::error(500, format!("status not written: {e}")),
        },
        ("GET", "/metrics", Some(s)) => {
            let text = prometheus_text(&s, &rapl_energy(powercap));
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
            return;
        }
        (_, "/v1/host" | "/metrics", _) => {
            let mut r = HttpResponse::error(405, format!("{} is not allowed", request.method));
            r.allow = Some("GET");
            r
        }
        (_, path, _) => HttpResponse::error(404, format!("no such path: {path}")),
    };
    let _ = write_response(&mut stream, &answer, false);
}

/// Serves `listener`'s connections one at a time on a thread named `name` (a scrape or a
/// status query is one short request; a stalled client is dropped after the I/O timeout).
pub fn spawn_server<L>(
    name: &str,
    listener: L,
    latest: Latest,
    powercap: PathBuf,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    L: Acceptor + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            if let Some(stream) = listener.accept_one() {
                serve_stream(stream, &latest, &powercap);
            }
        })
}

/// A listener the servers accept from (TCP for `--metrics`, Unix for the status socket).
pub trait Acceptor {
    /// The stream type.
    type Stream: Read + Write;
    /// Accepts one connection with I/O timeouts set; None on a failed accept.
    fn accept_one(&self) -> Option<Self::Stream>;
}

impl Acceptor for std::net::TcpListener {
    type Stream = std::net::TcpStream;
    fn accept_one(&self) -> Option<Self::Stream> {
        let (s, _) = self.accept().ok()?;
        s.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
        s.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
        Some(s)
    }
}

impl Acceptor for std::os::unix::net::UnixListener {
    type Stream = std::os::unix::net::UnixStream;
    fn accept_one(&self) -> Option<Self::Stream> {
        let (s, _) = self.accept().ok()?;
        s.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
        s.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
        Some(s)
    }
}

/// `pvmm-host status` for people: packages, then every vCPU of every VM.
pub fn format_status(status: &HostStatus) -> String {
    let mut out = format!(
        "policy {}, {} VMs, migrations {}\n\npackage  active  vcpus  util   model W\n",
        status.policy,
        status.vms.len(),
        status.migrations_total
    );
    for p in &status.packages {
        let _ = writeln!(
            out,
            "{:<8} {:<7} {:<6} {:<6.3} {:.1}",
            p.id, p.active, p.vcpus, p.util, p.power_w_model
        );
    }
    out.push_str("\nvm  kind     pid      vcpu  tid      util   busy   cpus  package  capacity\n");
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for vm in &status.vms {
        for v in &vm.vcpus {
            let _ = writeln!(
                out,
                "{:<3} {:<8} {:<8} {:<5} {:<8} {:<6.3} {:<6} {:<5} {:<8} {}",
                vm.id,
                vm.kind.name(),
                vm.pid,
                v.vcpu,
                v.tid,
                v.util,
                v.busy,
                or_dash(v.cpus.as_ref().map(ToString::to_string)),
                or_dash(v.package.map(|p| p.to_string())),
                or_dash(v.capacity.map(|c| c.to_string())),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_every_family_and_label_each_vcpu() {
        let snap: HostStatus = serde_json::from_value(serde_json::json!({
            "apply_errors": 0, "migrations": 0, "policy": "powersaving:1", "migrations_total": 7,
            "t_ms": 1, "tick_us": {"apply": 0, "decide": 0, "discover": 0, "read": 0},
            "packages": [
                {"id": 0, "active": true, "vcpus": 2, "util": 0.5, "power_w_model": 60.0},
                {"id": 1, "active": false, "vcpus": 0, "util": 0.0, "power_w_model": 10.0},
            ],
            "vms": [{"id": 3, "kind": "pvmm", "name": "a.sock", "pid": 9, "vcpus": [
                {"vcpu": 0, "tid": 10, "util": 0.9, "busy": true, "cpus": "0", "package": 0,
                 "capacity": 1024, "waited": 0.0},
            ]}],
        }))
        .unwrap();
        let text = prometheus_text(&snap, &[(0, 12.5)]);
        for line in [
            "pvmm_package_active{package=\"0\"} 1",
            "pvmm_package_active{package=\"1\"} 0",
            "pvmm_package_utilization{package=\"0\"} 0.5",
            "pvmm_package_power_watts_model{package=\"1\"} 10",
            "pvmm_package_energy_joules_total{package=\"0\"} 12.5",
            "pvmm_vcpu_utilization{vm=\"3\",vcpu=\"0\"} 0.9",
            "pvmm_vcpu_package{vm=\"3\",vcpu=\"0\"} 0",
            "pvmm_vcpu_capacity{vm=\"3\",vcpu=\"0\"} 1024",
            "pvmm_migrations_total 7",
            "pvmm_vms 1",
            "# TYPE pvmm_migrations_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(!prometheus_text(&snap, &[]).contains("energy_joules"));
        let status = format_status(&snap);
        assert!(status.contains("pvmm"), "{status}");
    }

    #[test]
    fn the_model_wakes_only_packages_with_load() {
        let topo = HostTopology::from_spec("2x2x1").unwrap();
        let p = package_power_model(&topo, &|cpu| if cpu == 0 { 1.0 } else { 0.0 });
        let model = PowerModel::default();
        assert_eq!(p[1].1, model.package_idle_w);
        assert!(
            (p[0].1 - (model.package_active_w + model.core_w)).abs() < 1e-9,
            "{p:?}"
        );
    }

    #[test]
    fn rapl_counters_are_read_where_present() {
        let dir = std::env::temp_dir().join(format!("pvmm-rapl-{}", std::process::id()));
        let d = dir.join("intel-rapl:1");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("energy_uj"), "2500000\n").unwrap();
        std::fs::create_dir_all(dir.join("intel-rapl:1:0")).unwrap();
        assert_eq!(rapl_energy(&dir), vec![(1, 2.5)]);
        assert!(rapl_energy(Path::new("/nonexistent")).is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }
}
