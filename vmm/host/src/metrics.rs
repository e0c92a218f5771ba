//! What `pvmm-host` shows operators: each tick's snapshot as JSON (`GET /v1/host`, the
//! `--stats` line, `pvmm-host status`, an aligned table) and as metrics (`GET /metrics`,
//! the Prometheus text format written by the `prometheus` crate), named in the style of node_exporter and
//! Kepler and labelled with each VM's stable name. Cluster engines (OpenStack Watcher, oVirt)
//! read such metrics to move whole VMs between hosts; pvmm-host places vCPUs within one host.
//!
//! Energy ([`crate::energy`]): each package's, each VM's share and the idle remainder, from
//! RAPL where the host exposes it; everywhere else from the simulator's power model applied to
//! the placement, with `_model` in the names so that nobody takes it for a measurement
//! (`pvmm_package_power_model_watts` is always the model's).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use pvmm_scheduler::power::{thread_overlap, PowerModel};
use pvmm_scheduler::table::{columns, LEFT};
use pvmm_scheduler::HostTopology;

use prometheus::{CounterVec, Encoder, GaugeVec, Opts, Registry, TextEncoder};
use pvmm_api::http::{read_request, write_response, HttpResponse, ReadFailure, IO_TIMEOUT};
use pvmm_api::stats::{EnergySource, HostStatus};

/// The exposition's content type: the Prometheus text format, version 0.0.4.
const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

/// A family of gauges with `labels`, registered in `r`.
fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    let family = GaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(family.clone()))?;
    Ok(family)
}

/// A counter family with `labels`, registered in `r`.
fn counters(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<CounterVec> {
    let family = CounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(family.clone()))?;
    Ok(family)
}

/// Energy: each package's, each VM's share of it and the idle remainder, since the daemon
/// started; `_model_` in the names where the packages' energy is the power model's.
fn energy_families(r: &Registry, status: &HostStatus) -> prometheus::Result<()> {
    let (kind, what) = match status.energy_source {
        EnergySource::Rapl => ("", "from RAPL"),
        EnergySource::Model => ("_model", "from the package power model (not a measurement)"),
    };
    let package = counters(
        r,
        &format!("pvmm_package_energy{kind}_joules_total"),
        &format!("Package energy since the daemon started, {what}"),
        &["package"],
    )?;
    let idle = counters(
        r,
        &format!("pvmm_package_idle_energy{kind}_joules_total"),
        &format!("The part of the package's energy no VM's vCPUs used, {what}"),
        &["package"],
    )?;
    for p in &status.packages {
        let id = p.id.to_string();
        package.with_label_values(&[&id]).inc_by(p.energy_joules);
        idle.with_label_values(&[&id]).inc_by(p.idle_energy_joules);
    }
    let vm = counters(
        r,
        &format!("pvmm_vm_energy{kind}_joules_total"),
        &format!("The VM's share of its packages' energy by its vCPUs' CPU time, {what}"),
        &["vm"],
    )?;
    for v in &status.vms {
        vm.with_label_values(&[&v.name]).inc_by(v.energy_joules);
    }
    Ok(())
}

/// The metrics of a daemon tick's status, in the
/// Prometheus text format (the `prometheus` crate's encoder: the format `promtool check
/// metrics` reads, which prometheus-client's OpenMetrics output is not, its counters' help
/// being on the name without `_total`): names in node_exporter's and Kepler's style, base
/// units, counters ending in `_total`, each VM labelled with its stable name.
pub fn prometheus_text(status: &HostStatus) -> prometheus::Result<String> {
    let r = Registry::new();
    package_families(&r, status)?;
    energy_families(&r, status)?;
    vcpu_families(&r, status)?;
    let moves = counters(&r, "pvmm_migrations_total", "vCPU moves between CPUs", &[])?;
    moves
        .with_label_values(&[] as &[&str])
        .inc_by(status.migrations_total as f64);
    let vms = gauges(&r, "pvmm_vms", "VMs managed", &[])?;
    vms.with_label_values(&[] as &[&str])
        .set(status.vms.len() as f64);
    let mut out = Vec::new();
    TextEncoder::new().encode(&r.gather(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Each package's gauges: active, utilization, modelled power.
fn package_families(r: &Registry, status: &HostStatus) -> prometheus::Result<()> {
    let pkg = ["package"];
    let active = gauges(
        r,
        "pvmm_package_active",
        "1 when the placement puts vCPUs on the package",
        &pkg,
    )?;
    let util = gauges(
        r,
        "pvmm_package_utilization_ratio",
        "Summed utilization of the vCPUs on the package over its CPUs",
        &pkg,
    )?;
    let power = gauges(
        r,
        "pvmm_package_power_model_watts",
        "Modelled package power for the current placement (a model, not a measurement)",
        &pkg,
    )?;
    for p in &status.packages {
        let id = p.id.to_string();
        active
            .with_label_values(&[&id])
            .set(f64::from(u8::from(p.active)));
        util.with_label_values(&[&id]).set(p.util);
        power.with_label_values(&[&id]).set(p.power_w_model);
    }
    Ok(())
}

/// Each vCPU's gauges (utilization, package, capacity, operator's pin) and each VM's vCPUs.
fn vcpu_families(r: &Registry, status: &HostStatus) -> prometheus::Result<()> {
    let vcpu = ["vm", "vcpu"];
    let vcpu_util = gauges(
        r,
        "pvmm_vcpu_utilization_ratio",
        "Decayed vCPU utilization, in CPUs",
        &vcpu,
    )?;
    let vcpu_package = gauges(
        r,
        "pvmm_vcpu_package",
        "The package the vCPU is placed on",
        &vcpu,
    )?;
    let vcpu_capacity = gauges(
        r,
        "pvmm_vcpu_capacity",
        "The capacity the placement gives the vCPU, 1..1024",
        &vcpu,
    )?;
    let pinned = gauges(
        r,
        "pvmm_vcpu_operator_pinned",
        "1 when an operator pinned the vCPU's thread and the daemon leaves it alone",
        &vcpu,
    )?;
    let vm_vcpus = gauges(r, "pvmm_vm_vcpus", "vCPUs of the VM", &["vm"])?;
    for vm in &status.vms {
        vm_vcpus
            .with_label_values(&[&vm.name])
            .set(vm.vcpus.len() as f64);
        for v in &vm.vcpus {
            let index = v.vcpu.to_string();
            let labels = [vm.name.as_str(), index.as_str()];
            vcpu_util.with_label_values(&labels).set(v.util);
            pinned
                .with_label_values(&labels)
                .set(f64::from(u8::from(v.pinned)));
            if let Some(p) = v.package {
                vcpu_package.with_label_values(&labels).set(f64::from(p));
            }
            if let Some(c) = v.capacity {
                vcpu_capacity.with_label_values(&labels).set(f64::from(c));
            }
        }
    }
    Ok(())
}

/// Answers one request on `stream`: `GET /v1/host` (JSON) or `GET /metrics` (text).
pub fn serve_stream<S: Read + Write>(mut stream: S, latest: &Latest) {
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
            let text = match prometheus_text(&s) {
                Ok(text) => text,
                Err(e) => {
                    let answer = HttpResponse::error(500, format!("metrics: {e}"));
                    let _ = write_response(&mut stream, &answer, false);
                    return;
                }
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: {METRICS_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
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
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    L: Acceptor + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            if let Some(stream) = listener.accept_one() {
                serve_stream(stream, &latest);
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

/// `pvmm-host status` for people: packages, then every vCPU of every VM, in aligned columns.
pub fn format_status(status: &HostStatus) -> String {
    let table = |header: &[&str], rows: Vec<Vec<String>>| columns(LEFT, header, &rows);
    let packages = status
        .packages
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.active.to_string(),
                p.vcpus.to_string(),
                format!("{:.3}", p.util),
                format!("{:.1}", p.power_w_model),
            ]
        })
        .collect();
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let vcpus = status
        .vms
        .iter()
        .flat_map(|vm| {
            vm.vcpus.iter().map(move |v| {
                vec![
                    vm.name.clone(),
                    vm.kind.name().to_string(),
                    vm.pid.to_string(),
                    v.vcpu.to_string(),
                    v.tid.to_string(),
                    format!("{:.3}", v.util),
                    v.busy.to_string(),
                    or_dash(v.cpus.as_ref().map(ToString::to_string)),
                    or_dash(v.package.map(|p| p.to_string())),
                    or_dash(v.capacity.map(|c| c.to_string())),
                    if v.pinned { "operator" } else { "-" }.to_string(),
                ]
            })
        })
        .collect();
    format!(
        "policy {}, {} VMs, migrations {}\n\n{}\n{}",
        status.policy,
        status.vms.len(),
        status.migrations_total,
        table(&["package", "active", "vcpus", "util", "model W"], packages),
        table(
            &[
                "vm", "kind", "pid", "vcpu", "tid", "util", "busy", "cpus", "package", "capacity",
                "pinned",
            ],
            vcpus
        ),
    )
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
            "vms": [{"id": 3, "kind": "pvmm", "name": "a", "pid": 9, "vcpus": [
                {"vcpu": 0, "tid": 10, "util": 0.9, "busy": true, "cpus": "0", "package": 0,
                 "capacity": 1024, "waited": 0.0},
            ]}],
        }))
        .unwrap();
        let mut snap = snap;
        snap.energy_source = EnergySource::Rapl;
        snap.packages[0].energy_joules = 12.5;
        let text = prometheus_text(&snap).unwrap();
        for line in [
            "pvmm_package_active{package=\"0\"} 1",
            "pvmm_package_active{package=\"1\"} 0",
            "pvmm_package_utilization_ratio{package=\"0\"} 0.5",
            "pvmm_package_power_model_watts{package=\"1\"} 10",
            "pvmm_package_energy_joules_total{package=\"0\"} 12.5",
            "pvmm_vcpu_utilization_ratio{vcpu=\"0\",vm=\"a\"} 0.9",
            "pvmm_vcpu_package{vcpu=\"0\",vm=\"a\"} 0",
            "pvmm_vcpu_capacity{vcpu=\"0\",vm=\"a\"} 1024",
            "pvmm_vm_vcpus{vm=\"a\"} 1",
            "pvmm_migrations_total 7",
            "pvmm_vms 1",
            "# TYPE pvmm_migrations_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        snap.energy_source = EnergySource::Model;
        let model = prometheus_text(&snap).unwrap();
        assert!(!model.contains("pvmm_package_energy_joules"), "{model}");
        let vm = "pvmm_vm_energy_model_joules_total{vm=\"a\"} 0";
        assert!(model.lines().any(|l| l == vm), "{model}");
        let status = format_status(&snap);
        assert!(status.contains("pvmm"), "{status}");
    }

    #[test]
    fn status_columns_line_up_under_their_headers() {
        let mut snap: HostStatus = serde_json::from_value(serde_json::json!({
            "apply_errors": 0, "migrations": 0, "policy": "balance", "migrations_total": 0,
            "t_ms": 1, "tick_us": {"apply": 0, "decide": 0, "discover": 0, "read": 0},
            "packages": [], "vms": [{"id": 0, "kind": "foreign", "name": "a-long-vm-name",
                "pid": 123456, "vcpus": [{"vcpu": 0, "tid": 9, "util": 0.5, "busy": true,
                "cpus": "0-15", "package": 10, "capacity": 1024, "waited": 0.0}]}],
        }))
        .unwrap();
        let mut short = snap.vms[0].clone();
        short.name = "b".into();
        short.vcpus[0].cpus = None;
        short.vcpus[0].package = None;
        snap.vms.push(short);
        let text = format_status(&snap);
        let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("vm ")).collect();
        let starts: Vec<usize> = table[0]
            .split_whitespace()
            .map(|h| table[0].find(h).unwrap())
            .collect();
        assert_eq!(table.len(), 3, "{text}");
        for row in &table[1..] {
            let cells: Vec<usize> = row
                .char_indices()
                .filter(|&(i, c)| c != ' ' && (i == 0 || row.as_bytes()[i - 1] == b' '))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(cells, starts, "{text}");
        }
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
}
