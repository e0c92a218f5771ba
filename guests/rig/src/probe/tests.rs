//! Unit tests of the probe lines' parser and of [`PlacementTrace`].

use super::*;

/// A whole `--stats` line (every schema field) with these ticks' values: `(vcpu, cpus,
/// capacity, busy)` per vCPU. Its boot clock reads 10 s more than `t_ms` (pvmm started at L1
/// uptime 10.0, as the traces' `START 10.0` lines say).
fn stats_line(t_ms: u64, vcpus: &[(u32, &str, u32, bool)], notes: u64, external: bool) -> String {
    let vcpus: Vec<String> = vcpus
        .iter()
        .map(|(vcpu, cpus, capacity, busy)| {
            format!(
                r#"{{"busy":{busy},"capacity":{capacity},"cpus":"{cpus}","desired":null,"package":0,"tid":1,"util":0.5,"vcpu":{vcpu},"waited":0.0}}"#
            )
        })
        .collect();
    format!(
        r#"{{"boot_ms":{boot_ms},"capacity_notifications":{notes},"cppc_enabled":0,"external":{external},"external_renewed_ms":{renewed},"guest_register_errors":0,"migrations":0,"migrations_total":0,"packages":[],"policy":"powersaving:1","policy_changes":0,"t_ms":{t_ms},"vcpus":[{}]}}"#,
        vcpus.join(","),
        boot_ms = 10_000 + t_ms,
        renewed = if external { "150" } else { "null" },
    )
}

fn parse(line: &str) -> Option<ProbeLine> {
    ProbeLine::parse(line).unwrap()
}

#[test]
fn every_kind_parses() {
    assert_eq!(parse("START 12.5"), Some(ProbeLine::Start(12.5)));
    assert_eq!(
        parse("PKG 3 1"),
        Some(ProbeLine::Package {
            cpu: 3,
            package: 1,
            core: None
        })
    );
    assert_eq!(
        parse("PKG 3 1 0"),
        Some(ProbeLine::Package {
            cpu: 3,
            package: 1,
            core: Some(0)
        })
    );
    assert_eq!(parse("T 13.01"), Some(ProbeLine::Sample(13.01)));
    assert_eq!(
        parse("C cpu2 10 0 5 100 7 0 1 0 0 0"),
        Some(ProbeLine::Cpu(
            2,
            CpuTimes {
                idle: 107,
                total: 123
            }
        ))
    );
    assert_eq!(
        parse("V vcpu1 120 0-1,3 40 2 3"),
        Some(ProbeLine::Thread(ThreadSample {
            vcpu: 1,
            tid: 120,
            allowed: vec![0, 1, 3],
            cpu_ticks: 42,
            last_cpu: 3
        }))
    );
    assert_eq!(
        parse("M 20.25 load-begin"),
        Some(ProbeLine::Mark(20.25, "load-begin".into()))
    );
    assert_eq!(
        parse("K 31.40 17"),
        Some(ProbeLine::KernelMigrations {
            up: 31.4,
            total: 17
        })
    );
    let Some(ProbeLine::Stats(tick)) = parse(&stats_line(200, &[(0, "1", 1024, true)], 2, true))
    else {
        panic!("a stats line");
    };
    assert_eq!(
        (
            tick.t_ms,
            tick.vcpus.len(),
            tick.capacity_notifications,
            tick.external,
            tick.external_renewed_ms,
            tick.up
        ),
        (200, 1, 2, true, Some(150), 10.2)
    );
}

#[test]
fn a_whole_stats_line_reads_as_the_schema_type() {
    let line = stats_line(18330, &[(0, "1", 1024, true)], 2, false)
        .replace(r#""migrations_total":0"#, r#""migrations_total":24"#);
    let stats = read_stats(&line).expect("a stats line");
    assert_eq!((stats.t_ms, stats.migrations_total), (18330, 24));
    assert_eq!(stats.vcpus.len(), 1);
    assert!(read_stats(r#"{"not":"stats"}"#).is_none());
    assert!(read_stats("S 18330 24").is_none());
}

#[test]
fn other_lines_are_none_and_bad_fields_malformed() {
    assert_eq!(parse("probe: cannot pin to CPU 0"), None);
    assert_eq!(parse("M 20.25"), None);
    assert_eq!(parse("V vcpu1 120"), None);
    assert_eq!(parse("S 18330 24"), None, "stats come whole, as JSON");
    assert_eq!(parse(r#"{"not":"stats"}"#), None);
    for bad in [
        "START",
        "START x",
        "T soon",
        "V cpu1 120 0 1 2 3",
        "K 31.40 -1",
        "C cpu1 a 0 0 0 0 0 0 0",
    ] {
        assert_eq!(
            ProbeLine::parse(bad),
            Err(MalformedLine(bad.into())),
            "{bad}"
        );
    }
}

#[test]
fn a_trace_keeps_complete_samples_in_order() {
    let lines: Vec<String> = [
        "START 10.0",
        "PKG 0 0",
        "PKG 1 1",
        "T 10.1",
        "C cpu1 0 0 0 50 0 0 0 0",
        "C cpu0 0 0 0 50 0 0 0 0",
        "V vcpu1 101 1 5 0 1",
        "V vcpu0 100 0 5 0 0",
        "T 10.2",
        "C cpu0 0 0 0 60 0 0 0 0",
        "V vcpu0 100 0 9 0 0",
        "M 10.15 go",
    ]
    .map(String::from)
    .to_vec();
    let trace = PlacementTrace::parse(&lines);
    assert_eq!(trace.start, 10.0);
    assert_eq!(trace.package_cpus(1), vec![1]);
    // The second sample lost a thread (pvmm exiting): dropped.
    assert_eq!(trace.samples.len(), 1);
    let threads: Vec<u32> = trace.samples[0].threads.iter().map(|t| t.vcpu).collect();
    assert_eq!(threads, vec![0, 1]);
    assert_eq!(trace.samples[0].cpus[0].0, 0);
    assert_eq!(trace.mark("go"), Some(10.15));
}

#[test]
fn the_guest_reads_the_capacities_on_its_own_scale() {
    let lines: Vec<String> = vec![
        "START 10.0".to_string(),
        stats_line(
            100,
            &[(0, "0", 1024, false), (1, "0", 1024, false)],
            0,
            false,
        ),
        stats_line(200, &[(0, "0", 512, true), (1, "1", 1024, true)], 2, false),
    ];
    let trace = PlacementTrace::parse(&lines);
    assert_eq!(
        trace.capacities_around(10.15, 1, 1),
        [vec![1024, 1024], vec![512, 1024]]
    );
    // Equal vCPUs are told apart by one step; otherwise 1024 -> 254, 512 -> 127.
    assert_eq!(
        trace.guest_perfs_around(10.15, 1, 1),
        [vec![254, 253], vec![127, 254]]
    );
}

#[test]
#[should_panic(expected = "malformed probe line")]
fn a_sample_line_before_any_sample_is_malformed() {
    PlacementTrace::parse(&["V vcpu0 100 0 5 0 0".to_string()]);
}

#[test]
fn seccomp_lines_name_the_threads_never_filtered() {
    assert_eq!(
        parse("F 120 2 CPU 0/KVM"),
        Some(ProbeLine::Seccomp(ThreadSeccomp {
            tid: 120,
            mode: 2,
            name: "CPU 0/KVM".into()
        }))
    );
    assert_eq!(
        ProbeLine::parse("F x 2 pvmm"),
        Err(MalformedLine("F x 2 pvmm".into()))
    );
    let lines: Vec<String> = [
        "F 100 0 pvmm",
        "F 100 2 pvmm",
        "F 101 2 vcpu0",
        "F 102 0 pvmm-sched",
        "F 103 0 pvmm-signals",
    ]
    .map(String::from)
    .to_vec();
    let trace = PlacementTrace::parse(&lines);
    assert_eq!(
        trace.thread_names(),
        ["pvmm", "pvmm-sched", "pvmm-signals", "vcpu0"]
    );
    // pvmm's main thread was seen before and after its filter: filtered.
    assert_eq!(
        trace.threads_without_filter(),
        ["pvmm-sched/102", "pvmm-signals/103"]
    );
}

#[test]
fn a_mark_with_pvmms_last_tick_reads_that_tick() {
    let tick = stats_line(400, &[(0, "1", 1024, false)], 0, true);
    let lines = vec![
        "START 10.0".to_string(),
        format!("M 11.0 host-killed {tick}"),
        "M 12.0 host-restarted".to_string(),
    ];
    let trace = PlacementTrace::parse(&lines);
    let (up, at) = trace
        .mark_with_tick("host-killed")
        .expect("the kill's tick");
    assert_eq!((up, at.t_ms, at.external, at.up), (11.0, 400, true, 10.4));
    // A mark without a whole stats line after its text has no tick.
    assert_eq!(trace.mark_with_tick("host-restarted"), None);
    assert_eq!(trace.mark_with_tick("host"), None);
}

#[test]
fn ticks_are_counted_on_l1s_clock() {
    let lines = vec![
        "START 10.0".to_string(),
        stats_line(100, &[(0, "0", 1024, false)], 0, false),
        stats_line(200, &[(0, "0", 1024, false)], 0, false),
        stats_line(300, &[(0, "0", 1024, false)], 0, false),
    ];
    let trace = PlacementTrace::parse(&lines);
    // Ticks at L1 uptimes 10.1, 10.2 and 10.3; (from, to] holds the ends' right side only.
    assert_eq!(trace.ticks_between(10.1, 10.3), 2);
    assert_eq!(trace.ticks_between(10.0, 10.1), 1);
    let last = trace.ticks_in(10.0, 11.0).next_back().map(|k| k.t_ms);
    assert_eq!(last, Some(300));
}
