//! End-to-end tests of the simulator: work accounting against hand-computed
//! values, the engine path (utilization from simulated busy time), the
//! kernbench scenario and the command line.

use std::path::Path;

use super::cli::{main_with_args, EXIT_BAD_INPUT, EXIT_FAILURE};
use super::load::LoadSpec;
use super::run::{simulate, Placement, RunResult, SimConfig, CACHE_SHARING_SPEEDUP};
use super::scenario::{kernbench_topology, kernbench_vm};
use super::spec::VmSpec;
use pvmm_scheduler::policy::Policy;
use pvmm_scheduler::power::PowerModel;
use pvmm_scheduler::topology::HostTopology;

const PERFORMANCE: Placement = Placement::Engine(Policy::Performance);
const POWERSAVING_1: Placement = Placement::Engine(Policy::Powersaving { level: 1 });

fn topo(spec: &str) -> HostTopology {
    HostTopology::from_spec(spec).unwrap()
}

fn config(duration_ms: u64) -> SimConfig {
    SimConfig {
        duration_ms,
        ..SimConfig::default()
    }
}

fn sim(topology: &str, vms: &[VmSpec], placement: Placement, cfg: &SimConfig) -> RunResult {
    simulate(&topo(topology), vms, placement, cfg, &mut |_| {}).unwrap()
}

fn constant(count: usize, demand: f64) -> VmSpec {
    VmSpec::uniform(count, LoadSpec::Constant { demand }, None)
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-9)
}

#[test]
fn a_shared_cpu_is_time_sliced() {
    // Two always-busy vCPUs on a one-CPU host: one CPU-second per second.
    let r = sim("1x1x1", &[constant(2, 1.0)], PERFORMANCE, &config(10_000));
    assert!(close(r.work_done_s, 10.0, 1e-6), "{}", r.work_done_s);
    assert!(close(r.backlog_s, 10.0, 1e-6), "{}", r.backlog_s);
    assert_eq!(r.package_idle, vec![0.0]);
    assert_eq!(r.migrations, 0);
    assert!(!r.has_jobs);
}

#[test]
fn smt_siblings_share_a_core() {
    // Two busy vCPUs on one 2-thread core: 2 x 589 / 1024 of a CPU each second.
    let r = sim("1x1x2", &[constant(2, 1.0)], PERFORMANCE, &config(10_000));
    let expected = 10.0 * 2.0 * 589.0 / 1024.0;
    assert!(
        close(r.work_done_s, expected, 1e-6),
        "{} vs {expected}",
        r.work_done_s
    );
    // Power: the package awake, one core with two busy threads.
    let m = PowerModel::default();
    let watts = m.platform_w + m.package_active_w + m.core_w * (1.0 + m.smt_factor);
    assert!(close(r.avg_power_w(), watts, 1e-9), "{}", r.avg_power_w());
}

#[test]
fn cache_sharing_slows_a_vm_split_across_packages() {
    // One VM whose two busy vCPUs must be on different packages (1 CPU each).
    let split = sim("2x1x1", &[constant(2, 1.0)], PERFORMANCE, &config(10_000));
    let expected = 20.0 / (1.0 + CACHE_SHARING_SPEEDUP);
    assert!(
        close(split.work_done_s, expected, 1e-6),
        "{}",
        split.work_done_s
    );
    // Two one-vCPU VMs: nothing to share, full speed.
    let separate = sim(
        "2x1x1",
        &[constant(1, 1.0), constant(1, 1.0)],
        PERFORMANCE,
        &config(10_000),
    );
    assert!(close(separate.work_done_s, 20.0, 1e-6));
}

#[test]
fn power_of_idle_and_one_busy_package() {
    let m = PowerModel::default();
    let idle = sim("2x4x1", &[constant(4, 0.0)], PERFORMANCE, &config(5_000));
    assert_eq!(idle.package_idle, vec![1.0, 1.0]);
    let floor = m.platform_w + 2.0 * m.package_idle_w;
    assert!(close(idle.energy_j, floor * 5.0, 1e-9), "{}", idle.energy_j);
    // One busy vCPU: Len Brown's 1-task figure, 174 W.
    let one = sim("2x1x1", &[constant(1, 1.0)], PERFORMANCE, &config(10_000));
    assert!(
        close(one.avg_power_w(), 174.0, 1e-9),
        "{}",
        one.avg_power_w()
    );
    assert!(close(one.energy_j, 1740.0, 1e-9));
    assert_eq!(one.migrations, 0);
}

#[test]
fn engine_sees_utilization_from_simulated_busy_time() {
    // 8 busy vCPUs under powersaving. At t = 0 the trackers know nothing and
    // the engine may stack them; only utilization measured from the simulated
    // busy time can make it spread them over all 8 CPUs afterwards (at the
    // second tick that sees them busy: the engine's demand average).
    let r = sim("2x4x1", &[constant(8, 1.0)], POWERSAVING_1, &config(10_000));
    let speed = 1.0 / (1.0 + CACHE_SHARING_SPEEDUP * 4.0 / 7.0);
    assert!(
        r.work_done_s > 0.9 * 8.0 * 10.0 * speed,
        "work {} (stacked vCPUs would do about 10)",
        r.work_done_s
    );
    assert!(
        r.package_idle.iter().all(|&i| i < 0.05),
        "{:?}",
        r.package_idle
    );
    assert_eq!(r.ticks, 100);
}

#[test]
fn vcpus_waiting_for_a_shared_cpu_are_packed_on_what_they_ran() {
    // Two vCPUs with 30 ms bursts in step every 100 ms: 0.6 of a CPU, which fits one CPU with
    // the fit rule's headroom. Packed together, each waits for the other through every
    // burst: not halted 60 % of the time, but running 30 %. The engine packs on what they
    // ran (the live VMM reads the wait from the threads' scheduler statistics), so the pair
    // stays on package 0; counted whole, the wait would make the shared CPU look full and
    // open package 1 again and again.
    let duty = VmSpec::uniform(
        2,
        LoadSpec::Duty {
            busy_ms: 30,
            period_ms: 100,
            phase_ms: 0,
        },
        None,
    );
    let r = sim("2x1x1", &[duty], POWERSAVING_1, &config(30_000));
    assert!(r.migrations <= 1, "{} migrations", r.migrations);
    assert!(r.package_idle[1] > 0.99, "{:?}", r.package_idle);
    assert!(close(r.work_done_s, 18.0, 1e-3), "{}", r.work_done_s);
}

#[test]
fn a_job_ends_the_run() {
    // 2 CPU-seconds shared by two busy vCPUs on two cores of one package.
    let vm = VmSpec::uniform(2, LoadSpec::Constant { demand: 1.0 }, Some(2.0));
    let r = sim("1x2x1", &[vm], PERFORMANCE, &config(60_000));
    assert!(r.has_jobs && r.finished);
    assert!(close(r.elapsed_s, 1.0, 1e-3), "{}", r.elapsed_s);
    assert!(close(r.work_done_s, 2.0, 1e-6));
    assert_eq!(r.vm_done_s, vec![Some(r.elapsed_s)]);
    // A job larger than the cap is reported unfinished.
    let vm = VmSpec::uniform(1, LoadSpec::Constant { demand: 1.0 }, Some(100.0));
    let r = sim("1x1x1", &[vm], PERFORMANCE, &config(1_000));
    assert!(r.has_jobs && !r.finished);
    assert_eq!(r.vm_done_s, vec![None]);
}

#[test]
fn open_loop_generators_are_served_on_an_idle_host() {
    // One package, so no cache slowdown: every vCPU can be served in full.
    let vm = VmSpec::parse("load=duty:30/100+ramp:0/1/4000+bursty:10/30").unwrap();
    let r = sim("1x4x1", &[vm], PERFORMANCE, &config(8_000));
    // Duty 2.4 s + ramp 2 + 4 s, + bursty about 2 s.
    assert!(
        r.work_done_s > 9.9 && r.work_done_s < 10.9,
        "{}",
        r.work_done_s
    );
    assert!(r.backlog_s < 0.1, "{}", r.backlog_s);
}

#[test]
fn trace_file_drives_a_vm() {
    let dir = std::env::temp_dir().join(format!("pvmm-sim-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("load.trace");
    std::fs::write(&path, "# t d0 d1\n0 1 0.5\n1000 0 0.5\n3000 0 0\n").unwrap();
    let vm = VmSpec::parse(&format!("trace={}", path.display())).unwrap();
    // Separate VMs are not what a trace gives: both columns are one VM, on
    // one package of a 1x2x1 host, so no cache slowdown.
    let r = sim("1x2x1", &[vm], PERFORMANCE, &config(4_000));
    assert!(close(r.work_done_s, 1.0 + 1.5, 1e-6), "{}", r.work_done_s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn runs_are_deterministic() {
    let vms = [kernbench_vm(4, 0.02)];
    let cfg = config(600_000);
    for placement in [PERFORMANCE, Placement::Unpinned] {
        let a = sim("2x4x1", &vms, placement, &cfg);
        let b = sim("2x4x1", &vms, placement, &cfg);
        assert_eq!(a, b);
        let tl = a.timeline.as_ref().unwrap();
        assert_eq!(tl.cells.len(), 4);
        assert!(tl.cells.iter().all(|row| row.len() as u64 == a.ticks));
        assert!(tl
            .cells
            .iter()
            .flatten()
            .all(|c| c.package.is_none_or(|p| p < 2) && (0.0..=1.0).contains(&c.busy)));
    }
    let other_seed = SimConfig { seed: 2, ..cfg };
    assert_ne!(
        sim("2x4x1", &vms, PERFORMANCE, &config(600_000)).elapsed_s,
        sim("2x4x1", &vms, PERFORMANCE, &other_seed).elapsed_s
    );
}

/// The kernbench scenario with `n` vCPUs at a tenth of its work, run to the end.
fn kernbench(n: usize, placement: Placement, cfg: &SimConfig) -> RunResult {
    let topology = kernbench_topology().unwrap();
    let vms = [kernbench_vm(n, 0.1)];
    simulate(&topology, &vms, placement, cfg, &mut |_| {}).unwrap()
}

#[test]
fn kernbench_two_vcpus_powersaving_packs_and_unpinned_wanders() {
    let cfg = config(3_600_000);
    let run = |p| kernbench(2, p, &cfg);
    let perf = run(PERFORMANCE);
    let unpinned = run(Placement::Unpinned);
    // Packages in use: idle less than 99 % of the run.
    let used = |r: &RunResult| r.package_idle.iter().filter(|&&i| i < 0.99).count();
    assert!(perf.finished && unpinned.finished);
    assert_eq!(
        used(&perf),
        2,
        "performance spreads: {:?}",
        perf.package_idle
    );
    for policy in [
        Policy::Balance,
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
    ] {
        let packed = run(Placement::Engine(policy));
        assert!(packed.finished);
        assert_eq!(used(&packed), 1, "{policy}: {:?}", packed.package_idle);
        // The threads run about 29 % of the time: packing saves the wake-up
        // power of the time the second package was awake on its own.
        let awake = |r: &RunResult| r.package_idle.iter().map(|i| 1.0 - i).sum::<f64>();
        assert!(
            awake(&packed) < awake(&perf) - 0.05,
            "{policy}: packages awake {} vs {}",
            awake(&packed),
            awake(&perf)
        );
        assert!(
            packed.avg_power_w() < perf.avg_power_w(),
            "{policy}: {} W vs {} W",
            packed.avg_power_w(),
            perf.avg_power_w()
        );
        assert!(packed.migrations < unpinned.migrations / 10);
    }
    // Unpinned: threads wander, between packages too.
    assert!(unpinned.migrations > 100, "{}", unpinned.migrations);
    let tl = unpinned.timeline.as_ref().unwrap();
    for row in &tl.cells {
        let on = |p: u16| row.iter().filter(|c| c.package == Some(p)).count();
        assert!(on(0) > 0 && on(1) > 0, "a vCPU never changed package");
    }
    assert_eq!(used(&unpinned), 2);
}

fn cli(args: &[&str]) -> (u8, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut argv = vec!["pvmm-sim"];
    argv.extend_from_slice(args);
    let code = main_with_args(argv, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn cli_help_explains_everything() {
    let (code, out, err) = cli(&["--help"]);
    assert_eq!(code, 0);
    assert!(err.is_empty());
    for needle in [
        "--scenario",
        "--vm",
        "VM SPEC",
        "bursty:B/I",
        "TRACE FILE",
        "POWER MODEL",
        "EXIT STATUS",
        "unpinned",
        "oracle",
        "--svg",
    ] {
        assert!(out.contains(needle), "help lacks {needle}");
    }
}

#[test]
fn cli_bad_input_is_one_line_and_exit_2() {
    for args in [
        &[][..],
        &["--bogus"],
        &["--scenario", "nope"],
        &["--scenario", "kernbench", "--vm", "vcpus=1"],
        &["--scenario", "kernbench", "--scale", "-1"],
        &["--scenario", "kernbench", "--vcpus", "2,x"],
        &["--scenario", "busyloop", "--scale", "2"],
        &["--scenario", "busyloop", "--vm", "vcpus=1"],
        &["--vm", "vcpus=0"],
        &["--vm", "load=sine:1"],
        &["--vm", "trace=/nonexistent/t.trace"],
        &["--vm", "vcpus=1", "--topology", "2x0x1"],
        &["--vm", "vcpus=1", "--topology", "/nonexistent/topology"],
        &["--vm", "vcpus=1", "--policy", "fastest"],
        &["--vm", "vcpus=1", "--policy", "balance,balance"],
        &["--vm", "vcpus=1", "--duration", "-1"],
        &["--vm", "vcpus=1", "--duration", "0"],
        &["--vm", "vcpus=1", "--tick-ms", "0"],
        &["--vm", "vcpus=1", "--step-us", "3000"],
        &["--vm", "vcpus=1", "--power", "core=-1"],
        &["--vm", "vcpus=1", "--vcpus", "2"],
        &["--tick-ms", "abc"],
    ] {
        let (code, out, err) = cli(args);
        assert_eq!(code, EXIT_BAD_INPUT, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("pvmm-sim: "), "{err}");
    }
}

#[test]
fn cli_generic_run_prints_a_table() {
    let (code, out, err) = cli(&[
        "--topology",
        "1x2x1",
        "--vm",
        "vcpus=2,load=constant:0.5",
        "--duration",
        "2",
        "--policy",
        "performance,unpinned",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Work Done(s)"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("performance") || l.starts_with("unpinned"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    // 2 x 0.5 CPU for 2 s.
    assert_eq!(rows[0].split_whitespace().nth(1), Some("2.00"), "{out}");
    assert!(err.contains("simulating performance"), "progress: {err}");
}

#[test]
fn cli_scenario_writes_tables_and_svg() {
    let dir = std::env::temp_dir().join(format!("pvmm-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg_path = dir.join("timeline.svg");
    let svg_arg = svg_path.to_str().unwrap();
    let (code, out, err) = cli(&[
        "--scenario",
        "kernbench",
        "--vcpus",
        "2,4",
        "--scale",
        "0.02",
        "--svg",
        svg_arg,
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "--quiet: {err}");
    assert!(out.contains("Kernbench-like load, 2 busy vCPUs (1 VM)"));
    assert!(out.contains("Kernbench-like load, 4 busy vCPUs (1 VM)"));
    for policy in [
        "performance",
        "balance",
        "powersaving:1",
        "powersaving:2",
        "unpinned",
        "oracle",
    ] {
        assert_eq!(
            out.lines().filter(|l| l.starts_with(policy)).count(),
            2,
            "{policy}: {out}"
        );
    }
    // Each table ends with the bound, and every row has its ratio to it.
    assert_eq!(out.lines().filter(|l| l.starts_with("bound ")).count(), 2);
    assert_eq!(out.matches("Energy/bound").count(), 4, "{out}");
    let text = std::fs::read_to_string(&svg_path).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .filter(|t| t.starts_with("N="))
        .collect();
    assert_eq!(titles.len(), 12, "{titles:?}");
    // An unwritable SVG is a run failure, not bad input.
    let (code, _, err) = cli(&[
        "--vm",
        "vcpus=1",
        "--duration",
        "0.5",
        "--svg",
        "/nonexistent/dir/x.svg",
        "--quiet",
    ]);
    assert_eq!(code, EXIT_FAILURE);
    assert!(err.starts_with("pvmm-sim: cannot write SVG"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!Path::new(svg_arg).exists());
}

#[test]
fn unpinned_busy_threads_wander_and_pay_for_it() {
    // One always-busy vCPU on an otherwise idle 2x2x1 host: it never sleeps,
    // so only displacement moves it (mean residency 100 ms).
    let cfg = config(10_000);
    let r = sim("2x2x1", &[constant(1, 1.0)], Placement::Unpinned, &cfg);
    assert!(r.migrations > 20, "{}", r.migrations);
    let tl = r.timeline.as_ref().unwrap();
    assert!(tl.cells[0].iter().any(|c| c.package == Some(0)));
    assert!(tl.cells[0].iter().any(|c| c.package == Some(1)));
    // Each move costs 50 µs (same package) or 500 µs (other package) of work.
    let lost = 10.0 - r.work_done_s;
    let moves = r.migrations as f64;
    assert!(
        lost >= moves * 50e-6 - 1e-9,
        "lost {lost} for {moves} moves"
    );
    assert!(
        lost <= moves * 500e-6 + 1e-9,
        "lost {lost} for {moves} moves"
    );
    // Without migration costs nothing is lost; pinned by the engine, nothing moves.
    let free = SimConfig {
        migration_cost_same_package_us: 0.0,
        migration_cost_cross_package_us: 0.0,
        ..cfg.clone()
    };
    let r = sim("2x2x1", &[constant(1, 1.0)], Placement::Unpinned, &free);
    assert!(close(r.work_done_s, 10.0, 1e-9), "{}", r.work_done_s);
    let r = sim("2x2x1", &[constant(1, 1.0)], PERFORMANCE, &cfg);
    assert_eq!(r.migrations, 0);
    assert!(close(r.work_done_s, 10.0, 1e-9));
}

#[test]
fn bad_config_is_an_error_not_a_panic() {
    let vms = [constant(1, 1.0)];
    for bad in [
        SimConfig {
            tick_ms: 0,
            ..SimConfig::default()
        },
        SimConfig {
            step_us: 0,
            ..SimConfig::default()
        },
        SimConfig {
            step_us: 300,
            tick_ms: 1,
            ..SimConfig::default()
        },
        SimConfig {
            duration_ms: 0,
            ..SimConfig::default()
        },
        SimConfig {
            cache_sharing_speedup: f64::NAN,
            ..SimConfig::default()
        },
        SimConfig {
            migration_cost_same_package_us: -1.0,
            ..SimConfig::default()
        },
    ] {
        let err = simulate(&topo("1x1x1"), &vms, PERFORMANCE, &bad, &mut |_| {}).unwrap_err();
        assert!(matches!(err, super::SimError::BadConfig(_)), "{err}");
    }
    let err = simulate(
        &topo("1x1x1"),
        &[],
        PERFORMANCE,
        &SimConfig::default(),
        &mut |_| {},
    );
    assert!(matches!(err, Err(super::SimError::NoVcpus)));
}

#[test]
fn progress_is_reported_every_simulated_second() {
    let mut seen = Vec::new();
    let vm = VmSpec::uniform(1, LoadSpec::Constant { demand: 1.0 }, Some(2.5));
    simulate(
        &topo("1x1x1"),
        &[vm],
        PERFORMANCE,
        &config(60_000),
        &mut |p| seen.push(p),
    )
    .unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(close(seen[0].simulated_s, 1.0, 1e-9));
    assert!(close(seen[1].work_fraction.unwrap(), 0.8, 1e-6));
}

#[test]
fn cli_busy_loop_scenario_prints_len_browns_watts() {
    let (code, out, err) = cli(&[
        "--scenario",
        "busyloop",
        "--vcpus",
        "2",
        "--duration",
        "2",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("host: 2x8x2 (2 packages, 16 cores, 32 CPUs"),
        "{out}"
    );
    assert!(out.contains("Busy loops: 2 always-busy tasks, one one-vCPU VM each"));
    assert!(
        out.contains("powersaving 175 W  performance 211 W"),
        "{out}"
    );
    // performance wakes both packages for two busy cores: his 211 W.
    let perf: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("performance"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(perf[7], "211.00", "{out}");
    let bound = out.lines().find(|l| l.starts_with("bound ")).unwrap();
    assert!(bound.ends_with("1.00"), "{bound}");
}

#[test]
fn the_oracle_packs_every_step_on_the_fewest_packages() {
    let cfg = config(2_000);
    // Three busy vCPUs fit package 0's cores: package 1 never wakes, each
    // vCPU has a core of its own, and nothing moves once placed.
    let r = sim("2x4x1", &[constant(3, 1.0)], Placement::Oracle, &cfg);
    assert_eq!(r.package_idle, vec![0.0, 1.0]);
    assert!(close(r.work_done_s, 6.0, 1e-6), "{}", r.work_done_s);
    assert_eq!(r.migrations, 0);
    // Six need both packages, still a core each (six one-vCPU VMs, so no
    // VM pays for spanning packages).
    let six: Vec<VmSpec> = (0..6).map(|_| constant(1, 1.0)).collect();
    let r = sim("2x4x1", &six, Placement::Oracle, &cfg);
    assert_eq!(r.package_idle, vec![0.0, 0.0]);
    assert!(close(r.work_done_s, 12.0, 1e-6), "{}", r.work_done_s);
    // SMT: a core each before any sibling; siblings before sharing a CPU.
    let r = sim("1x2x2", &[constant(2, 1.0)], Placement::Oracle, &cfg);
    assert!(close(r.work_done_s, 4.0, 1e-6), "{}", r.work_done_s);
    let r = sim("1x2x2", &[constant(3, 1.0)], Placement::Oracle, &cfg);
    let expected = 2.0 * (1.0 + 2.0 * 589.0 / 1024.0);
    assert!(
        close(r.work_done_s, expected, 1e-6),
        "{} vs {expected}",
        r.work_done_s
    );
}

#[test]
fn the_oracle_follows_bursts_that_a_placement_tick_cannot() {
    // Eight bursty vCPUs swing around one package's four cores: the oracle
    // opens package 1 only for the steps that need it, and moves vCPUs
    // between packages step by step for free.
    let cfg = config(3_600_000);
    let run = |p| kernbench(8, p, &cfg);
    let oracle = run(Placement::Oracle);
    assert!(oracle.finished);
    for placement in [PERFORMANCE, POWERSAVING_1] {
        let other = run(placement);
        assert!(
            oracle.energy_j < other.energy_j,
            "{placement}: {} J vs the oracle's {} J",
            other.energy_j,
            oracle.energy_j
        );
        assert!(oracle.elapsed_s <= other.elapsed_s);
    }
    assert!(oracle.package_idle[1] > 0.85, "{:?}", oracle.package_idle);
    assert!(oracle.migrations > 100, "{}", oracle.migrations);
}

#[test]
fn sharing_the_package_lets_a_waking_vcpu_run_on_an_idle_cpu_beside_it() {
    // Six bursty vCPUs packed into package 0's four CPUs: pinned, a vCPU that wakes behind
    // another on its CPU waits; sharing the package, it runs on an idle CPU of it.
    let pinned_cfg = config(3_600_000);
    let mut shared_cfg = pinned_cfg.clone();
    shared_cfg.engine.share_package = true;
    let run = |p, cfg: &SimConfig| kernbench(6, p, cfg);
    let balance = Placement::Engine(Policy::Balance);
    let perf = run(PERFORMANCE, &pinned_cfg);
    let pinned = run(balance, &pinned_cfg);
    let shared = run(balance, &shared_cfg);
    assert!(pinned.finished && shared.finished);
    assert!(
        shared.energy_j < pinned.energy_j,
        "{} J shared vs {} J pinned",
        shared.energy_j,
        pinned.energy_j
    );
    assert!(
        shared.elapsed_s < pinned.elapsed_s && shared.elapsed_s <= perf.elapsed_s * 1.01,
        "run time {} s shared, {} s pinned, {} s performance",
        shared.elapsed_s,
        pinned.elapsed_s,
        perf.elapsed_s
    );
    // The host's wake-ups move vCPUs inside the package, not the engine between packages.
    assert!(shared.migrations > pinned.migrations);
    assert!(shared.package_idle[1] >= pinned.package_idle[1]);
    // performance spreads one vCPU to a CPU: sharing changes nothing there.
    let perf_shared = run(PERFORMANCE, &shared_cfg);
    assert_eq!(perf_shared.energy_j, perf.energy_j);
    assert_eq!(perf_shared.migrations, perf.migrations);
}
