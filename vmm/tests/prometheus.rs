//! `pvmm host --metrics` scraped by a real Prometheus, as users run it: the test starts two
//! pvmm VMs (tiny guests; one vCPU spinning, so that energy is shared out to a VM), the daemon
//! with `--metrics` on a free loopback port, and Debian's `prometheus` scraping it every
//! second (its own free loopback port, its TSDB in the test's scratch folder). Through
//! Prometheus's HTTP API (`/api/v1/targets`, `/api/v1/query`) it checks that
//!
//! - every VM's vCPUs appear under the VM's name (`pvmm_vcpu_utilization_ratio{vm, vcpu}`);
//! - the per-VM energy series and the packages' idle series add up to the packages' energy
//!   series, within rounding, in one scrape.
//!
//! Without `prometheus` the test skips loudly, or fails under PVMM_REQUIRE_PROMTOOL=1 (CI,
//! which installs Debian's `prometheus` package for promtool and prometheus both).

mod common;
use common::*;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Prometheus's start, its first scrapes, and the daemon's first ticks on a loaded machine.
const SETTLE: Duration = Duration::from_secs(120);
/// The test's VMs: name, guest, vCPUs.
const VMS: [(&str, &[u8], u32); 2] = [("busy", &SPIN, 1), ("idle", &HALT_LOOP, 2)];
/// Energy series as the daemon names them, from RAPL or (`_model_`) from its power model.
const VM_ENERGY: &str = r#"{__name__=~"pvmm_vm_energy(_model)?_joules_total"}"#;
const IDLE_ENERGY: &str = r#"{__name__=~"pvmm_package_idle_energy(_model)?_joules_total"}"#;
const PACKAGE_ENERGY: &str = r#"{__name__=~"pvmm_package_energy(_model)?_joules_total"}"#;

fn prometheus_available() -> bool {
    let ok = Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        require_or_skip(
            Need::Promtool,
            "prometheus",
            "prometheus (Debian package prometheus) is not installed",
        );
    }
    ok
}

/// A loopback port free now.
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// `GET path` on `127.0.0.1:port`, the body parsed as JSON; `Null` on any failure. HTTP/1.0,
/// so that the answer is neither chunked nor kept alive: its body runs to the close.
fn get_json(port: u16, path: &str) -> Value {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return Value::Null;
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut answer = Vec::new();
    if stream.write_all(request.as_bytes()).is_err() || stream.read_to_end(&mut answer).is_err() {
        return Value::Null;
    }
    let text = String::from_utf8_lossy(&answer);
    text.split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str(body).ok())
        .unwrap_or(Value::Null)
}

/// Percent-encodes a PromQL expression for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The result vector of instant query `expr` (at `time`, Prometheus's seconds, if given).
fn query(port: u16, expr: &str, time: Option<&str>) -> Vec<Value> {
    let at = time.map(|t| format!("&time={t}")).unwrap_or_default();
    let answer = get_json(port, &format!("/api/v1/query?query={}{at}", encode(expr)));
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The one value of a query's result, as a number.
fn value(result: &[Value]) -> Option<f64> {
    match result {
        [one] => one["value"][1].as_str()?.parse().ok(),
        _ => None,
    }
}

fn until<T>(what: &str, get: impl Fn() -> Option<T>, show: impl Fn() -> String) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = get() {
            return t;
        }
        assert!(start.elapsed() < SETTLE, "{what}: {}", show());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Prometheus's configuration: the daemon on `target`, every second.
fn config(target: u16) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n  - job_name: pvmm-host\n    static_configs:\n      \
         - targets: ['127.0.0.1:{target}']\n"
    )
}

fn start_prometheus(dir: &Path, target: u16, port: u16) -> Proc {
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, config(target)).expect("write prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("prometheus.log");
    Proc(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    )
}

#[test]
fn prometheus_scrapes_every_vms_vcpus_and_energy_that_adds_up() {
    if !kvm_available("prometheus") || !prometheus_available() {
        return;
    }
    let dir = scratch("prometheus");
    let vms: Vec<Proc> = VMS
        .iter()
        .map(|(name, code, vcpus)| start_pvmm_vm(&dir, name, code, &vcpus.to_string(), "600").0)
        .collect();
    let metrics_port = free_port();
    let daemon = Proc(
        host_command()
            .args(["--host-topology", "2x1x1", "--tick-ms", "100"])
            .arg(format!("--metrics=127.0.0.1:{metrics_port}"))
            .arg("--runtime-dir")
            .arg(dir.join("run"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pvmm host"),
    );
    let port = free_port();
    let prometheus = start_prometheus(&dir, metrics_port, port);
    let log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();

    // The target is up.
    until(
        "the daemon's target up in Prometheus",
        || {
            let targets = get_json(port, "/api/v1/targets");
            let active = targets["data"]["activeTargets"].as_array()?.clone();
            active.iter().any(|t| t["health"] == "up").then_some(())
        },
        || format!("{}\n{}", get_json(port, "/api/v1/targets"), log()),
    );

    // Every VM's vCPUs, under the VM's name.
    let expected: BTreeSet<(String, String)> = VMS
        .iter()
        .flat_map(|(name, _, vcpus)| (0..*vcpus).map(|i| (name.to_string(), i.to_string())))
        .collect();
    let seen = || -> BTreeSet<(String, String)> {
        query(port, "pvmm_vcpu_utilization_ratio", None)
            .iter()
            .map(|r| {
                let m = &r["metric"];
                let label = |k: &str| m[k].as_str().unwrap_or("?").to_string();
                (label("vm"), label("vcpu"))
            })
            .collect()
    };
    until(
        "every VM's vCPUs under its name",
        || (seen() == expected).then_some(()),
        || format!("{:?}, expected {expected:?}", seen()),
    );

    // Energy adds up, in one scrape: the busy VM has used some, and the packages too.
    let (vm_joules, idle, packages) = until(
        "energy series with energy in them",
        || {
            // Every series of one scrape carries that scrape's time.
            let t = value(&query(port, "timestamp(pvmm_vms)", None))?.to_string();
            let sum = |series: &str| value(&query(port, &format!("sum({series})"), Some(&t)));
            let busy = query(port, VM_ENERGY, Some(&t))
                .iter()
                .find(|r| r["metric"]["vm"] == "busy")
                .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())?;
            let all = (sum(VM_ENERGY)?, sum(IDLE_ENERGY)?, sum(PACKAGE_ENERGY)?);
            (busy > 0.0 && all.2 > 0.0).then_some(all)
        },
        || {
            query(port, r#"{__name__=~"pvmm_.*energy.*"}"#, None)
                .len()
                .to_string()
        },
    );
    eprintln!("one scrape: VMs {vm_joules} J + idle {idle} J, packages {packages} J");
    // Rounding: the exposition's decimal text and Prometheus's float sums.
    let tolerance = packages * 1e-9;
    assert!(
        (vm_joules + idle - packages).abs() <= tolerance,
        "VMs {vm_joules} J + idle {idle} J != packages {packages} J"
    );
    drop(prometheus);
    drop(daemon);
    drop(vms);
    std::fs::remove_dir_all(&dir).ok();
}
