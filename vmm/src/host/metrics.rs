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
use serde_json::{json, Value};

use crate::api::http::{read_request, write_response, HttpResponse, ReadFailure, IO_TIMEOUT};

/// Where RAPL's package domains are.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";

/// The latest snapshot, shared by the tick loop and the servers.
pub type Latest = Arc<Mutex<Option<Value>>>;

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

fn label_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.replace('\\', "\\\\").replace('"', "\\\""),
        other => other.to_string(),
    }
}

/// Per-package families: name, help, and the snapshot's package key they show.
const PACKAGE_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "pvmm_package_active",
        "1 when the placement puts vCPUs on the package.",
        "active",
    ),
    (
        "pvmm_package_utilization",
        "Summed utilization of the vCPUs on the package over its CPUs, 0..1.",
        "util",
    ),
    (
        "pvmm_package_power_watts_model",
        "Modelled package power for the current placement (a model, not a measurement).",
        "power_w_model",
    ),
];

/// Per-vCPU families: name, help, and the snapshot's vCPU key they show.
const VCPU_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "pvmm_vcpu_utilization",
        "Decayed vCPU utilization, 0..1 of a CPU.",
        "util",
    ),
    (
        "pvmm_vcpu_package",
        "The package the vCPU is placed on.",
        "package",
    ),
    (
        "pvmm_vcpu_capacity",
        "The capacity the placement gives the vCPU, 1..1024.",
        "capacity",
    ),
];

/// Appends one metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str, rows: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in rows {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        other => other.as_f64(),
    }
}

/// The Prometheus text exposition of `snapshot` (a `--stats` line) plus RAPL counters.
pub fn prometheus_text(snapshot: &Value, rapl: &[(u32, f64)]) -> String {
    let empty = Vec::new();
    let mut out = String::new();
    let packages = snapshot["packages"].as_array().unwrap_or(&empty);
    for (name, help, key) in PACKAGE_FAMILIES {
        let rows: Vec<(String, f64)> = packages
            .iter()
            .filter_map(|p| {
                let labels = format!("{{package=\"{}\"}}", label_value(&p["id"]));
                Some((labels, number(&p[*key])?))
            })
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
    let vms = snapshot["vms"].as_array().unwrap_or(&empty);
    for (name, help, key) in VCPU_FAMILIES {
        let rows: Vec<(String, f64)> = vms
            .iter()
            .flat_map(|vm| {
                let id = label_value(&vm["id"]);
                vm["vcpus"]
                    .as_array()
                    .unwrap_or(&empty)
                    .iter()
                    .filter_map(move |v| {
                        let labels =
                            format!("{{vm=\"{id}\",vcpu=\"{}\"}}", label_value(&v["vcpu"]));
                        Some((labels, number(&v[*key])?))
                    })
            })
            .collect();
        family(&mut out, name, "gauge", help, &rows);
    }
    let total = number(&snapshot["migrations_total"]).unwrap_or(0.0);
    let moves = [(String::new(), total)];
    family(
        &mut out,
        "pvmm_migrations_total",
        "counter",
        "vCPU moves between CPUs.",
        &moves,
    );
    let count = [(String::new(), vms.len() as f64)];
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
        ("GET", "/v1/host", Some(s)) => HttpResponse::new(200, s),
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
pub fn format_status(snapshot: &Value) -> String {
    let empty = Vec::new();
    let mut out = format!(
        "policy {}, {} VMs, migrations {}\n\npackage  active  vcpus  util   model W\n",
        snapshot["policy"].as_str().unwrap_or("?"),
        snapshot["vms"].as_array().map_or(0, Vec::len),
        snapshot["migrations_total"]
    );
    for p in snapshot["packages"].as_array().unwrap_or(&empty) {
        let _ = writeln!(
            out,
            "{:<8} {:<7} {:<6} {:<6.3} {:.1}",
            p["id"],
            p["active"],
            p["vcpus"],
            p["util"].as_f64().unwrap_or(0.0),
            p["power_w_model"].as_f64().unwrap_or(0.0)
        );
    }
    out.push_str("\nvm  kind     pid      vcpu  tid      util   busy   cpus  package  capacity\n");
    for vm in snapshot["vms"].as_array().unwrap_or(&empty) {
        for v in vm["vcpus"].as_array().unwrap_or(&empty) {
            let _ = writeln!(
                out,
                "{:<3} {:<8} {:<8} {:<5} {:<8} {:<6.3} {:<6} {:<5} {:<8} {}",
                vm["id"],
                vm["kind"].as_str().unwrap_or("?"),
                vm["pid"],
                v["vcpu"],
                v["tid"],
                v["util"].as_f64().unwrap_or(0.0),
                v["busy"],
                v["cpus"].as_str().unwrap_or("-"),
                v["package"],
                v["capacity"]
            );
        }
    }
    out
}

/// A package entry of the snapshot.
pub fn package_json(id: u32, vcpus: usize, util: f64, power_w_model: f64) -> Value {
    json!({
        "id": id,
        "active": vcpus > 0,
        "vcpus": vcpus,
        "util": (util * 1000.0).round() / 1000.0,
        "power_w_model": (power_w_model * 10.0).round() / 10.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_every_family_and_label_each_vcpu() {
        let snap = json!({
            "policy": "powersaving:1", "migrations_total": 7,
            "packages": [package_json(0, 2, 0.5, 60.0), package_json(1, 0, 0.0, 10.0)],
            "vms": [{"id": 3, "kind": "pvmm", "pid": 9, "vcpus": [
                {"vcpu": 0, "tid": 10, "util": 0.9, "busy": true, "cpus": "0", "package": 0, "capacity": 1024},
            ]}],
        });
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
