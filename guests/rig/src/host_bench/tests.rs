//! Unit tests of the host-wide benchmark's scripts, parsing, order and tables.

use super::*;

fn options(build_jobs: Option<u32>) -> HostBenchOptions {
    HostBenchOptions {
        vms: vec![2],
        regimes: Regime::ALL.to_vec(),
        seconds: 20,
        duty_percent: 29,
        period_ms: 70,
        build_jobs,
        mycflags: "-O0".into(),
        rounds: 1,
        topology: Topology::default(),
        echo: false,
    }
}

#[test]
fn a_vms_samples_end_where_a_vcpu_thread_exited() {
    let sample = |t, migrations, process_ticks, vcpu_ticks| VmSample {
        t,
        migrations,
        process_ticks,
        vcpu_ticks,
    };
    let live = [sample(1.0, 2, 100, 90), sample(2.0, 3, 200, 180)];
    assert_eq!(while_all_vcpus_live(&live), live.to_vec());
    // One of two vCPU threads gone: the sums fall, and the sample is left out with the rest.
    let ending = [
        live[0],
        live[1],
        sample(3.0, 2, 210, 95),
        sample(4.0, 3, 400, 200),
    ];
    assert_eq!(while_all_vcpus_live(&ending), live.to_vec());
    assert_eq!(while_all_vcpus_live(&[]), Vec::new());
}

#[test]
fn regimes_parse_and_the_probe_and_guest_say_what_the_parser_reads() {
    assert_eq!("pvmm-host".parse::<Regime>(), Ok(Regime::Daemon));
    assert!("numad".parse::<Regime>().is_err());
    assert!(probe(Regime::Daemon).contains("\nSTART_DAEMON=1\nRUNTIME_DIR=/tmp\n"));
    assert!(probe(Regime::Daemon).contains("pvmm host --runtime-dir \"$RUNTIME_DIR\" --adopt auto"));
    assert!(probe(Regime::PerVm).contains("\nSTART_DAEMON=0\n"));
    assert!(probe(Regime::Qemu).contains("nr_migrations"));
    let options = options(None);
    let guest = guest_command(&options, 1);
    assert!(guest.starts_with("VM=1\n"));
    assert!(guest.contains("pvmm-mark: load-begin-$VM"));
    assert!(guest.contains("pvmm-mark: work-$VM $c"));
    assert!(guest.contains("\nDUTY=29\nPERIOD_MS=70\nSECONDS_LOAD=20\n"));
    assert!(guest.contains("--seconds \"$SECONDS_LOAD\" \\\n--progress-ms 1000"));
    // Both scripts are valid shell for L1's and the guest's busybox.
    if std::path::Path::new(crate::host::BUSYBOX).is_file() {
        for script in [probe(Regime::Daemon), guest.clone()] {
            let check = std::process::Command::new(crate::host::BUSYBOX)
                .args(["sh", "-n", "-c", &script])
                .output()
                .expect("busybox runs");
            assert!(check.status.success(), "{check:?}\n{script}");
        }
    }
    let spec = vm(Regime::Daemon, &options, 1);
    assert!(spec.args.contains(&"/tmp/vm1.sock".to_string()));
    assert_eq!(vm(Regime::Qemu, &options, 0).vmm, InnerVmm::Qemu);
}

fn case(regime: Regime, work: u64, energy_j: f64, build_s: Vec<f64>) -> HostCase {
    HostCase {
        regime,
        vms: 2,
        window_s: 20.0,
        work,
        package_idle: vec![0.5, 0.9],
        energy_j,
        migrations: 4,
        vmm_other_cpu: 0.01,
        daemon_cpu: (regime == Regime::Daemon).then_some(0.2),
        build_s,
    }
}

fn cells(table: &str, row: usize) -> Vec<String> {
    let line = table.lines().nth(row).unwrap_or_default();
    line.split_whitespace().map(String::from).collect()
}

#[test]
fn the_table_is_relative_to_its_first_regime() {
    let q = case(Regime::Qemu, 1000, 100.0, Vec::new());
    let d = case(Regime::Daemon, 1000, 80.0, Vec::new());
    let table = format_table(2, &Regime::ALL, &[&d, &q]);
    let (q, d) = (cells(&table, 2), cells(&table, 3));
    assert_eq!((q[0].as_str(), q[11].as_str()), ("qemu", "1.00"), "{table}");
    assert_eq!(
        (d[0].as_str(), d[11].as_str()),
        ("pvmm-host", "0.80"),
        "{table}"
    );
    assert_eq!((d[12].as_str(), d[13].as_str()), ("1.0", "20.0"), "{table}");
    assert_eq!(
        table.lines().count(),
        5,
        "no row for a regime not run: {table}"
    );
}

#[test]
fn several_runs_give_each_regime_its_medians() {
    let runs = [
        case(Regime::Qemu, 1, 100.0, vec![100.0, 110.0]),
        case(Regime::Qemu, 1, 300.0, vec![300.0, 310.0]),
        case(Regime::Qemu, 1, 200.0, vec![200.0, 210.0]),
        case(Regime::PerVm, 1, 150.0, vec![150.0, 150.0]),
        case(Regime::PerVm, 1, 170.0, vec![170.0, 190.0]),
    ];
    let refs: Vec<&HostCase> = runs.iter().collect();
    let table = format_table(2, &[Regime::Qemu, Regime::PerVm], &refs);
    let (q, p) = (cells(&table, 2), cells(&table, 3));
    assert_eq!(
        q[..6],
        ["qemu", "3", "20.0", "205.0", "210.0", "1.00"],
        "{table}"
    );
    assert_eq!(
        p[..6],
        ["pvmm", "2", "20.0", "165.0", "170.0", "0.80"],
        "{table}"
    );
    assert_eq!(p[11], "0.80", "{table}");
}

#[test]
fn each_round_turns_the_regimes_order_within_each_vm_count() {
    let regimes = Regime::ALL;
    let order: Vec<(Regime, usize)> = crate::runner::plan(&[3, 3], 3)
        .into_iter()
        .map(|(case, _)| {
            let (section, place) = grid_case(case, regimes.len());
            (regimes[place], [1, 2][section])
        })
        .collect();
    assert_eq!(order.len(), 18);
    assert_eq!(
        order[..3],
        [(Regime::Qemu, 1), (Regime::PerVm, 1), (Regime::Daemon, 1)]
    );
    assert_eq!(
        order[6..9],
        [(Regime::PerVm, 1), (Regime::Daemon, 1), (Regime::Qemu, 1)]
    );
    for position in 0..3 {
        let mut seen: Vec<Regime> = (0..3).map(|r| order[r * 6 + position].0).collect();
        seen.sort_by_key(|r| r.name());
        seen.dedup();
        assert_eq!(seen.len(), 3, "each regime once in position {position}");
    }
    // Each case boots its own L1: one label per VM of its rig.
    let rig = case_rig(&options(None), Regime::Daemon, 2);
    assert_eq!(rig.labels(), ["0", "1"]);
}

#[test]
fn builds_get_their_times_and_the_disk() {
    let options = options(Some(2));
    let guest = guest_command(&options, 1);
    assert!(
        guest.contains("\nJOBS=2\n")
            && guest.contains("\nMARK=-1\n")
            && guest.contains("\nMYCFLAGS=-O0\n"),
        "{guest}"
    );
    for regime in Regime::ALL {
        let spec = vm(regime, &options, 1);
        assert!(
            spec.args.contains(&crate::kernbench::disk_arg()),
            "{spec:?}"
        );
    }
    let q = case(Regime::Qemu, 2, 1000.0, vec![200.0, 240.0]);
    let p = case(Regime::PerVm, 2, 900.0, vec![230.0, 230.0]);
    let table = format_table(2, &Regime::ALL, &[&q, &p]);
    assert!(
        table.starts_with("2 VM(s) of 2 vCPUs, one build each:"),
        "{table}"
    );
    let cells = cells(&table, 3);
    assert_eq!(
        cells[..7],
        ["pvmm", "1", "20.0", "230.0", "230.0", "1.05", "2"],
        "{table}"
    );
    assert_eq!(cells[11], "0.90", "{table}");
}
