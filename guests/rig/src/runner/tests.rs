//! Unit tests of the runner, on a fake benchmark whose boots return canned outcomes.

use std::cell::RefCell;

use super::*;
use crate::figures::{median, table};
use crate::rig::{RigEnd, RigEvent};

/// A fake benchmark: case `c` of round `r` measures `10 * c + r`. Each boot ends as the next
/// of `ends`, its first `ended` runs having exited (the next one started, then cut off);
/// boots past the list complete every run.
struct Fake {
    sections: Vec<usize>,
    rounds: u32,
    boots: Boots,
    ends: RefCell<Vec<(RigEnd, usize)>>,
    booted: RefCell<Vec<Vec<String>>>,
}

impl Fake {
    fn new(sections: &[usize], rounds: u32, boots: Boots, ends: &[(RigEnd, usize)]) -> Fake {
        Fake {
            sections: sections.to_vec(),
            rounds,
            boots,
            ends: RefCell::new(ends.iter().rev().copied().collect()),
            booted: RefCell::new(Vec::new()),
        }
    }
}

fn event(kind: &str, label: &str, value: &str) -> RigEvent {
    RigEvent {
        kind: kind.into(),
        label: label.into(),
        value: value.into(),
    }
}

impl Benchmark for Fake {
    type Figures = f64;

    fn name(&self) -> &str {
        "bench-fake"
    }

    fn sections(&self) -> Vec<usize> {
        self.sections.clone()
    }

    fn rounds(&self) -> u32 {
        self.rounds
    }

    fn boots(&self) -> Boots {
        self.boots
    }

    fn label(&self, case: usize, round: u32) -> String {
        format!("c{case}-r{round}")
    }

    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError> {
        self.booted
            .borrow_mut()
            .push(runs.iter().map(|r| r.label.clone()).collect());
        let (end, ended) = self
            .ends
            .borrow_mut()
            .pop()
            .unwrap_or((RigEnd::Completed, runs.len()));
        let mut outcome = RigOutcome::empty(end);
        for (i, run) in runs.iter().enumerate().take(ended + 1) {
            outcome.events.push(event("vmm-start", &run.label, "1.0"));
            if i < ended {
                outcome.events.push(event("vmm-exit", &run.label, "0"));
            }
        }
        Ok(outcome)
    }

    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<f64, String> {
        match run_ended(outcome, &run.label) {
            true => Ok(10.0 * run.case as f64 + f64::from(run.round)),
            false => Err("the run never ended".into()),
        }
    }

    fn summary(&self, figures: &f64) -> String {
        format!("{figures:.0} units")
    }

    fn tables(&self, results: &[Measured<f64>]) -> String {
        let cases: usize = self.sections.iter().sum();
        let rows: Vec<[String; 3]> = (0..cases)
            .map(|case| {
                let mine = figures_of(results, |c| c == case);
                [
                    format!("case {case}"),
                    mine.len().to_string(),
                    median(mine.iter().map(|&&f| Some(f)))
                        .map_or("-".into(), |m| format!("{m:.1}")),
                ]
            })
            .collect();
        table(["Case", "Runs", "Median"], &rows)
    }
}

/// Runs `fake`, returning its report and progress lines.
fn run_fake(fake: &Fake) -> (Report<f64>, Vec<String>) {
    let mut lines = Vec::new();
    let report = run_with(fake, &mut |line| lines.push(line.to_string())).expect("no rig error");
    (report, lines)
}

fn labels(report: &Report<f64>) -> Vec<&str> {
    report
        .results
        .iter()
        .map(|m| m.run.label.as_str())
        .collect()
}

#[test]
fn each_round_turns_each_sections_order_by_one_place() {
    assert_eq!(plan(&[3], 1), [(0, 0), (1, 0), (2, 0)]);
    let turned = plan(&[3, 2], 3);
    assert_eq!(turned.len(), 15);
    // Round 1: the first section starts at its second case, the second at its second.
    assert_eq!(turned[5..10], [(1, 1), (2, 1), (0, 1), (4, 1), (3, 1)]);
    // Over as many rounds as a section has cases, each case takes each of its places once.
    for place in 0..3 {
        let mut seen: Vec<usize> = (0..3).map(|round| turned[round * 5 + place].0).collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2], "place {place}");
    }
    assert!(plan(&[], 2).is_empty());
    assert!(plan(&[2], 0).is_empty());
}

#[test]
fn a_shared_boot_runs_every_round_in_one_boot() {
    let fake = Fake::new(&[2], 2, Boots::Shared, &[]);
    let (report, lines) = run_fake(&fake);
    assert_eq!(
        *fake.booted.borrow(),
        [vec!["c0-r0", "c1-r0", "c1-r1", "c0-r1"]]
    );
    assert_eq!(report.boots.len(), 1);
    assert!(report.all_measured());
    assert_eq!(labels(&report), ["c0-r0", "c1-r0", "c1-r1", "c0-r1"]);
    assert_eq!(report.results[2].figures, Ok(11.0));
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0], "bench-fake: run 1 of 4, c0-r0: 0 units");
    assert_eq!(lines[3], "bench-fake: run 4 of 4, c0-r1: 1 units");
}

#[test]
fn per_run_boots_give_each_run_its_own_boot() {
    let fake = Fake::new(&[2], 2, Boots::PerRun, &[]);
    let (report, _) = run_fake(&fake);
    assert_eq!(fake.booted.borrow().len(), 4);
    assert_eq!(fake.booted.borrow()[2], ["c1-r1"]);
    assert_eq!(report.boots.len(), 4);
}

#[test]
fn an_l1_failure_mid_boot_keeps_the_ended_runs_and_boots_again_for_the_rest() {
    // L1 freezes during the third run: two runs are kept, three run again.
    let fake = Fake::new(&[5], 1, Boots::Shared, &[(RigEnd::L1Frozen, 2)]);
    let (report, lines) = run_fake(&fake);
    assert_eq!(
        *fake.booted.borrow(),
        [
            vec!["c0-r0", "c1-r0", "c2-r0", "c3-r0", "c4-r0"],
            vec!["c2-r0", "c3-r0", "c4-r0"]
        ]
    );
    assert_eq!(report.boots.len(), 2);
    assert_eq!(report.boots[0].end, RigEnd::L1Frozen);
    assert!(report.all_measured(), "{:?}", report.results);
    assert_eq!(
        labels(&report),
        ["c0-r0", "c1-r0", "c2-r0", "c3-r0", "c4-r0"]
    );
    assert_eq!(lines[4], "bench-fake: run 5 of 5, c4-r0: 40 units");
}

#[test]
fn a_per_run_boot_is_booted_again_when_l1_fails_before_its_run_ended() {
    let fake = Fake::new(&[2], 1, Boots::PerRun, &[(RigEnd::L1Lockup, 0)]);
    let (report, _) = run_fake(&fake);
    assert_eq!(
        *fake.booted.borrow(),
        [vec!["c0-r0"], vec!["c0-r0"], vec!["c1-r0"]]
    );
    assert!(report.all_measured());
    assert_eq!(report.boots.len(), 3);
}

#[test]
fn a_failure_that_is_not_l1s_is_reported_not_run_again() {
    let fake = Fake::new(&[3], 1, Boots::Shared, &[(RigEnd::TimedOut, 1)]);
    let (report, lines) = run_fake(&fake);
    assert_eq!(fake.booted.borrow().len(), 1);
    let failures: Vec<(&str, &str)> = report
        .failures()
        .map(|(run, why)| (run.label.as_str(), why))
        .collect();
    assert_eq!(
        failures,
        [
            ("c1-r0", "the run never ended"),
            ("c2-r0", "the run never ended")
        ]
    );
    assert!(!report.all_measured());
    assert_eq!(
        lines[1],
        "bench-fake: run 2 of 3, c1-r0: not measured: the run never ended"
    );
}

#[test]
fn the_tables_take_every_runs_figures() {
    let fake = Fake::new(&[2], 3, Boots::Shared, &[(RigEnd::L1Panic, 4)]);
    let (report, _) = run_fake(&fake);
    assert_eq!(
        fake.tables(&report.results),
        "Case    Runs  Median\ncase 0     3     1.0\ncase 1     3    11.0\n"
    );
}

#[test]
fn only_a_run_whose_vmm_exited_0_is_measured() {
    let mut outcome = RigOutcome::empty(RigEnd::Completed);
    outcome.events.extend([
        event("vmm-start", "ok", "1.0"),
        event("vmm-exit", "ok", "0"),
        event("vmm-start", "failed", "2.0"),
        event("vmm-exit", "failed", "4"),
        event("vmm-start", "killed", "3.0"),
    ]);
    assert!(clean_run(&outcome, "ok").is_ok());
    assert_eq!(
        clean_run(&outcome, "failed").err().as_deref(),
        Some("run failed: VMM exit status Some(4)")
    );
    assert_eq!(
        clean_run(&outcome, "killed").err().as_deref(),
        Some("run killed: VMM exit status None")
    );
    assert_eq!(
        clean_run(&outcome, "absent").err().as_deref(),
        Some("run absent never started")
    );
}
