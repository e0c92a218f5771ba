//! Result tables in the format of the kernbench tables of
//! "Re: [PATCH v7 0/8] Tunable sched_mc_power_savings=n" (Vaidyanathan Srinivasan, LKML, 2008-12-30):
//! one row per policy, absolute run time
//! and per-package idle percentages, energy and power relative to the
//! reference policy (`performance` = 1.00), plus absolute energy and power,
//! migrations and perf/W.
//!
//! That thread reports kernbench as
//!
//! ```text
//! SchedMC Run Time     Package Idle(%)    Energy(J)  Power(W)
//! 0       217.37       73.30 76.93        1.00       1.00
//! ```
//!
//! and Alex Shi ("Re: [PATCH 0/18] sched: simplified fork, enable load
//! average into LB and power awareness scheduling", LKML, 2012-12-11)
//! scales performance per watt as
//! `1e6 / time / watts`. Columns here:
//!
//! | column | meaning |
//! |---|---|
//! | Run Time(s) | when every VM's job was done (`>` = not done by the duration cap); without jobs, `Work Done(s)`: CPU-seconds of work done |
//! | Package Idle(%) | per package, share of the time all its CPUs were idle |
//! | Energy | energy for the same work (J per CPU-second done) relative to the reference |
//! | Power | average power relative to the reference |
//! | Energy(J), Power(W) | absolute energy of the run and average power |
//! | Migrations | vCPU moves between CPUs |
//! | Perf/W | with jobs: `1e6 / run time / average power` (Alex Shi's scale); without: `1e6 x work done / energy` |
//! | Energy/bound | energy over the clairvoyant bound for the same work ([`crate::bound`]) |
//!
//! With a bound, a `bound` row follows the policies: the bound's run time
//! (`T_min`) or, without jobs, the most work a row did, and its energy and
//! power for that work; it has no package idle or migrations.

use std::fmt::Write as _;

use super::bound::Bound;
use super::run::{Placement, RunResult};
use pvmm_scheduler::policy::Policy;
use pvmm_scheduler::table::aligned_columns;

/// Index of the reference row: the `performance` row, else the first.
pub fn reference_index(results: &[RunResult]) -> usize {
    results
        .iter()
        .position(|r| r.placement == Placement::Engine(Policy::Performance))
        .unwrap_or(0)
}

/// Perf/W of one run (module docs).
pub fn perf_per_watt(r: &RunResult) -> f64 {
    perf_per_watt_of(r.has_jobs, r.elapsed_s, r.work_done_s, r.energy_j)
}

/// Perf/W of `energy_j` spent over `time_s` doing `work_s` (module docs).
fn perf_per_watt_of(jobs: bool, time_s: f64, work_s: f64, energy_j: f64) -> f64 {
    if jobs {
        let power = if time_s > 0.0 { energy_j / time_s } else { 0.0 };
        if time_s > 0.0 && power > 0.0 {
            1e6 / time_s / power
        } else {
            0.0
        }
    } else if energy_j > 0.0 {
        1e6 * work_s / energy_j
    } else {
        0.0
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        format!("{:.2}", a / b)
    } else {
        "-".to_string()
    }
}

/// Columns of the table.
const COLUMNS: usize = 10;

/// Formats `results` as a table under `title` (title lines are printed as
/// given; the header names the reference policy), with a `bound` row and
/// each row's energy over the bound when `bound` is given.
pub fn format_table(title: &str, results: &[RunResult], bound: Option<&Bound>) -> String {
    let mut out = String::new();
    if !title.is_empty() {
        out.push_str(title);
        if !title.ends_with('\n') {
            out.push('\n');
        }
    }
    if results.is_empty() {
        out.push_str("(no runs)\n");
        return out;
    }
    let reference = &results[reference_index(results)];
    let jobs = results.iter().all(|r| r.has_jobs);
    let headers = table_headers(jobs);
    let mut rows: Vec<[String; COLUMNS]> = results
        .iter()
        .map(|r| table_row(r, reference, jobs, bound))
        .collect();
    if let Some(b) = bound {
        rows.push(bound_row(b, results, reference, jobs));
    }
    out.push_str(&aligned_columns(&headers, &rows));
    let _ = writeln!(
        out,
        "(Energy, Power: relative to {} = 1.00; Energy is for the same work)",
        reference.placement
    );
    if bound.is_some() {
        out.push_str(
            "(bound: no placement uses less energy for the same work; \
             Energy/bound: each row's energy over the bound for the work it did)\n",
        );
    }
    out
}

/// The header line: run time with jobs, work done without.
fn table_headers(jobs: bool) -> [String; COLUMNS] {
    [
        "Policy".to_string(),
        if jobs { "Run Time(s)" } else { "Work Done(s)" }.to_string(),
        "Package Idle(%)".to_string(),
        "Energy".to_string(),
        "Power".to_string(),
        "Energy(J)".to_string(),
        "Power(W)".to_string(),
        "Migrations".to_string(),
        "Perf/W".to_string(),
        "Energy/bound".to_string(),
    ]
}

/// One run's cells, energy and power relative to `reference`, energy over
/// `bound` for the work it did.
fn table_row(
    r: &RunResult,
    reference: &RunResult,
    jobs: bool,
    bound: Option<&Bound>,
) -> [String; COLUMNS] {
    let first = if jobs {
        let mark = if r.finished { "" } else { ">" };
        format!("{mark}{:.2}", r.elapsed_s)
    } else {
        format!("{:.2}", r.work_done_s)
    };
    let idle = r
        .package_idle
        .iter()
        .map(|f| format!("{:6.2}", f * 100.0))
        .collect::<Vec<_>>()
        .join(" ");
    [
        r.placement.to_string(),
        first,
        idle,
        ratio(r.energy_per_work(), reference.energy_per_work()),
        ratio(r.avg_power_w(), reference.avg_power_w()),
        format!("{:.1}", r.energy_j),
        format!("{:.2}", r.avg_power_w()),
        r.migrations.to_string(),
        format!("{:.2}", perf_per_watt(r)),
        bound.map_or_else(
            || "-".to_string(),
            |b| ratio(r.energy_j, b.energy_j(r.work_done_s)),
        ),
    ]
}

/// The bound's cells: for the bound's run time with jobs, for the most work
/// a row did without.
fn bound_row(
    b: &Bound,
    results: &[RunResult],
    reference: &RunResult,
    jobs: bool,
) -> [String; COLUMNS] {
    let work_s = results.iter().map(|r| r.work_done_s).fold(0.0, f64::max);
    let energy_j = b.energy_j(work_s);
    let time_s = if jobs {
        b.run_time_s
    } else {
        reference.elapsed_s
    };
    let power_w = if time_s > 0.0 { energy_j / time_s } else { 0.0 };
    let energy_per_work = if work_s > 0.0 {
        energy_j / work_s
    } else {
        f64::INFINITY
    };
    [
        "bound".to_string(),
        format!("{:.2}", if jobs { time_s } else { work_s }),
        "-".to_string(),
        ratio(energy_per_work, reference.energy_per_work()),
        ratio(power_w, reference.avg_power_w()),
        format!("{energy_j:.1}"),
        format!("{power_w:.2}"),
        "-".to_string(),
        format!("{:.2}", perf_per_watt_of(jobs, time_s, work_s, energy_j)),
        ratio(energy_j, energy_j),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(placement: Placement, time: f64, energy: f64, idle: [f64; 2]) -> RunResult {
        RunResult {
            placement,
            package_ids: vec![0, 1],
            elapsed_s: time,
            has_jobs: true,
            finished: true,
            vm_done_s: vec![Some(time)],
            work_done_s: 100.0,
            backlog_s: 0.0,
            package_idle: idle.to_vec(),
            energy_j: energy,
            migrations: 3,
            ticks: 10,
            timeline: None,
        }
    }

    #[test]
    fn performance_is_the_reference_and_ratios_follow() {
        let results = vec![
            result(Placement::Unpinned, 100.0, 30_000.0, [0.5, 0.5]),
            result(
                Placement::Engine(Policy::Performance),
                200.0,
                40_000.0,
                [0.7330, 0.7693],
            ),
            result(
                Placement::Engine(Policy::Powersaving { level: 1 }),
                100.0,
                18_000.0,
                [0.5086, 0.9991],
            ),
        ];
        assert_eq!(reference_index(&results), 1);
        let table = format_table("Title line", &results, None);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "Title line");
        assert!(lines[1].starts_with("Policy"));
        assert!(lines[1].contains("Run Time(s)"));
        assert!(lines[1].contains("Package Idle(%)"));
        // performance row: 1.00 / 1.00, 200 W, perf/W = 1e6 / 200 / 200 = 25.
        let perf = lines[3];
        assert!(perf.starts_with("performance"), "{perf}");
        let cells: Vec<&str> = perf.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "performance",
                "200.00",
                "73.30",
                "76.93",
                "1.00",
                "1.00",
                "40000.0",
                "200.00",
                "3",
                "25.00",
                "-"
            ]
        );
        // unpinned: 0.75 energy, 300 W / 200 W = 1.50 power.
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(cells[4], "0.75");
        assert_eq!(cells[5], "1.50");
        // powersaving:1: 0.45 energy, 0.90 power, idle 50.86 99.91.
        let cells: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(
            &cells[..6],
            ["powersaving:1", "100.00", "50.86", "99.91", "0.45", "0.90"]
        );
        assert!(lines[5].contains("relative to performance = 1.00"));
        // Columns line up: every row as long as its header up to the last column.
        let header_end = lines[1].find("Energy/bound").unwrap() + "Energy/bound".len();
        for row in &lines[2..5] {
            assert_eq!(row.len(), header_end, "{row}");
        }
    }

    #[test]
    fn bound_row_and_ratios() {
        // One always-busy vCPU on a one-CPU host for 10 s: the bound is the
        // platform, one awake package and one busy core, 164 W.
        let topology = pvmm_scheduler::topology::HostTopology::from_spec("1x1x1").unwrap();
        let vm = crate::VmSpec::uniform(1, crate::LoadSpec::Constant { demand: 1.0 }, None);
        let config = crate::SimConfig {
            duration_ms: 10_000,
            ..crate::SimConfig::default()
        };
        let bound = crate::clairvoyant(&topology, &[vm], &config).unwrap();
        let row = |placement, energy, work| {
            let mut r = result(placement, 10.0, energy, [0.0, 0.0]);
            r.package_idle = vec![0.0];
            r.has_jobs = false;
            r.work_done_s = work;
            r
        };
        let results = [
            row(Placement::Engine(Policy::Performance), 1804.0, 10.0),
            row(Placement::Unpinned, 1640.0, 5.0),
        ];
        let table = format_table("", &results, Some(&bound));
        let lines: Vec<&str> = table.lines().collect();
        let cells = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
        assert_eq!(cells(1).last(), Some(&"1.10"), "{table}");
        // Half the work: the bound for 5 CPU-seconds is the floor for 10 s
        // and the package awake for 5 s, below 1640 J.
        assert!(
            cells(2).last().unwrap().parse::<f64>().unwrap() > 1.0,
            "{table}"
        );
        assert_eq!(
            cells(3),
            ["bound", "10.00", "-", "0.91", "0.91", "1640.0", "164.00", "-", "6097.56", "1.00"],
            "{table}"
        );
        assert!(
            lines[5].starts_with("(bound: no placement uses less energy"),
            "{table}"
        );
    }

    #[test]
    fn unfinished_and_open_ended_runs() {
        let mut r = result(
            Placement::Engine(Policy::Balance),
            50.0,
            5_000.0,
            [0.1, 0.2],
        );
        r.finished = false;
        let table = format_table("", std::slice::from_ref(&r), None);
        assert!(table.contains(">50.00"), "{table}");
        assert!(table.contains("relative to balance"));
        r.has_jobs = false;
        let table = format_table("", &[r], None);
        assert!(table.contains("Work Done(s)"));
        // 1e6 x 100 CPU-s / 5000 J.
        assert!(table.contains("20000.00"), "{table}");
        assert_eq!(format_table("t", &[], None), "t\n(no runs)\n");
    }

    #[test]
    fn zero_reference_prints_dashes() {
        let zero = result(Placement::Engine(Policy::Performance), 0.0, 0.0, [1.0, 1.0]);
        let table = format_table("", &[zero], None);
        assert!(table.lines().nth(1).unwrap().contains(" - "), "{table}");
    }
}
