//! The metrics exposition as Prometheus users check it: `promtool check metrics` (Debian's
//! `prometheus` package) must pass on it with no lint. Without promtool the test skips with a
//! loud message, or fails under PVMM_REQUIRE_PROMTOOL=1 (CI, which installs it).

use std::io::Write;
use std::process::{Command, Stdio};

use pvmm_api::stats::{EnergySource, HostStatus};
use pvmm_host::metrics::prometheus_text;
use pvmm_testutil::{require_or_skip, Need};

fn promtool_available() -> bool {
    let ok = Command::new("promtool").arg("--version").output().is_ok();
    if !ok {
        require_or_skip(
            Need::Promtool,
            "promtool",
            "promtool (Debian package prometheus) is not installed",
        );
    }
    ok
}

/// A daemon tick with two VMs, one of them placed.
fn status() -> HostStatus {
    serde_json::from_value(serde_json::json!({
        "apply_errors": 0, "migrations": 1, "migrations_total": 9, "policy": "powersaving:1",
        "t_ms": 5000, "tick_us": {"apply": 10, "decide": 20, "discover": 30, "read": 40},
        "packages": [
            {"id": 0, "active": true, "vcpus": 2, "util": 0.75, "power_w_model": 61.5,
             "energy_joules": 120.0, "idle_energy_joules": 30.0},
            {"id": 1, "active": false, "vcpus": 0, "util": 0.0, "power_w_model": 10.0,
             "energy_joules": 20.0, "idle_energy_joules": 20.0},
        ],
        "vms": [
            {"id": 0, "kind": "foreign", "name": "web \"1\"", "pid": 10, "energy_joules": 90.0, "vcpus": [
                {"vcpu": 0, "tid": 11, "util": 0.9, "busy": true, "cpus": "0", "package": 0,
                 "capacity": 1024, "waited": 0.0},
            ]},
            {"id": 1, "kind": "pvmm", "name": "db", "pid": 20, "vcpus": [
                {"vcpu": 0, "tid": 21, "util": 0.0, "busy": false, "cpus": null,
                 "package": null, "capacity": null, "waited": 0.0},
            ]},
        ],
    }))
    .unwrap()
}

#[test]
fn promtool_finds_nothing_to_fix() {
    if !promtool_available() {
        return;
    }
    for source in [EnergySource::Model, EnergySource::Rapl] {
        let mut status = status();
        status.energy_source = source;
        let text = prometheus_text(&status).unwrap();
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{said}\n{text}");
        assert_eq!(said.trim(), "", "{text}");
    }
}

/// Runs promtool with `args` in the rules' folder; returns what it said, failing on an error.
fn promtool_in_rules(args: &[&str]) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {said}");
    said
}

#[test]
fn the_recording_rules_check_and_pass_their_tests() {
    if !promtool_available() {
        return;
    }
    let checked = promtool_in_rules(&["check", "rules", "pvmm-rules.yml"]);
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    promtool_in_rules(&["test", "rules", "pvmm-rules.test.yml"]);
}
