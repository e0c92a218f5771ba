//! Tests of the energy ledger: the shares and the idle remainder add up to each package's
//! energy, from the model and from RAPL counters.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use super::*;

/// Two packages of two CPUs; VM 10 busy on package 0 at `a` CPUs, VM 20 at `b`.
fn status(a: f64, b: f64) -> HostStatus {
    serde_json::from_value(serde_json::json!({
        "apply_errors": 0, "migrations": 0, "migrations_total": 0, "policy": "balance",
        "t_ms": 0, "tick_us": {"apply": 0, "decide": 0, "discover": 0, "read": 0},
        "packages": [
            {"id": 0, "active": true, "vcpus": 2, "util": 0.5, "power_w_model": 50.0},
            {"id": 1, "active": false, "vcpus": 0, "util": 0.0, "power_w_model": 10.0},
        ],
        "vms": [
            {"id": 0, "kind": "foreign", "name": "a", "pid": 10, "vcpus": [
                {"vcpu": 0, "tid": 11, "util": a, "busy": true, "cpus": "0", "package": 0,
                 "capacity": 1024, "waited": 0.0}]},
            {"id": 1, "kind": "pvmm", "name": "b", "pid": 20, "vcpus": [
                {"vcpu": 0, "tid": 21, "util": b, "busy": true, "cpus": "1", "package": 0,
                 "capacity": 1024, "waited": 0.0},
                {"vcpu": 1, "tid": 22, "util": 0.0, "busy": false, "cpus": null,
                 "package": null, "capacity": null, "waited": 0.0}]},
        ],
    }))
    .unwrap()
}

fn topology() -> HostTopology {
    HostTopology::from_spec("2x2x1").unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Checks that every package's VMs and idle remainder add up to its energy.
fn adds_up(s: &HostStatus) {
    let vms: f64 = s.vms.iter().map(|v| v.energy_joules).sum();
    let packages: f64 = s.packages.iter().map(|p| p.energy_joules).sum();
    let idle: f64 = s.packages.iter().map(|p| p.idle_energy_joules).sum();
    assert!(close(vms + idle, packages), "{vms} + {idle} != {packages}");
}

#[test]
fn the_model_is_shared_by_cpu_time_and_the_rest_is_idle() {
    let mut ledger = EnergyLedger::new("/nonexistent".into());
    let mut s = status(1.0, 0.5);
    ledger.account(0, &topology(), &mut s);
    assert_eq!(s.energy_source, EnergySource::Model);
    assert_eq!(
        s.packages[0].energy_joules, 0.0,
        "the first tick has no length"
    );
    let mut s = status(1.0, 0.5);
    ledger.account(2_000_000_000, &topology(), &mut s);
    // Package 0: 50 W for 2 s = 100 J over 2 CPUs: a used half, b a quarter.
    assert!(close(s.packages[0].energy_joules, 100.0));
    assert!(close(s.vms[0].energy_joules, 50.0));
    assert!(close(s.vms[1].energy_joules, 25.0));
    assert!(close(s.packages[0].idle_energy_joules, 25.0));
    assert!(close(s.packages[1].idle_energy_joules, 20.0));
    adds_up(&s);
}

#[test]
fn more_demand_than_cpus_leaves_no_idle_and_still_adds_up() {
    let mut ledger = EnergyLedger::new("/nonexistent".into());
    ledger.account(0, &topology(), &mut status(1.5, 1.5));
    let mut s = status(1.5, 1.5);
    ledger.account(1_000_000_000, &topology(), &mut s);
    assert!(close(s.packages[0].idle_energy_joules, 0.0));
    assert!(close(s.vms[0].energy_joules + s.vms[1].energy_joules, 50.0));
    adds_up(&s);
}

#[test]
fn rapl_counters_are_the_packages_energy_where_readable() {
    let dir = std::env::temp_dir().join(format!("pvmm-rapl-{}", std::process::id()));
    let write = |package: u32, joules: f64| {
        let d = dir.join(format!("intel-rapl:{package}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("energy_uj"), format!("{}\n", (joules * 1e6) as u64)).unwrap();
    };
    std::fs::create_dir_all(dir.join("intel-rapl:1:0")).unwrap();
    write(0, 1000.0);
    write(1, 500.0);
    assert_eq!(rapl_energy(&dir), vec![(0, 1000.0), (1, 500.0)]);
    assert!(rapl_energy(Path::new("/nonexistent")).is_empty());
    let mut ledger = EnergyLedger::new(dir.clone());
    ledger.account(0, &topology(), &mut status(1.0, 0.0));
    write(0, 1040.0);
    write(1, 505.0);
    let mut s = status(1.0, 0.0);
    ledger.account(1_000_000_000, &topology(), &mut s);
    assert_eq!(s.energy_source, EnergySource::Rapl);
    assert!(close(s.packages[0].energy_joules, 40.0));
    assert!(close(s.vms[0].energy_joules, 20.0));
    assert!(close(s.packages[1].idle_energy_joules, 5.0));
    adds_up(&s);
    // A counter that wrapped adds nothing that tick.
    write(0, 10.0);
    let mut s = status(1.0, 0.0);
    ledger.account(2_000_000_000, &topology(), &mut s);
    assert!(close(s.packages[0].energy_joules, 40.0));
    adds_up(&s);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_vm_that_ends_leaves_the_ledger() {
    let mut ledger = EnergyLedger::new("/nonexistent".into());
    ledger.account(0, &topology(), &mut status(1.0, 1.0));
    ledger.account(1_000_000_000, &topology(), &mut status(1.0, 1.0));
    let mut s = status(1.0, 1.0);
    s.vms.remove(1);
    ledger.account(2_000_000_000, &topology(), &mut s);
    assert_eq!(ledger.vms.len(), 1);
}
