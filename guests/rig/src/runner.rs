//! The benchmarks' one runner: a benchmark is data (its cases, in sections, and how a case
//! boots, is measured and is tabled), and this module runs it.
//!
//! Every case runs once per round. Within each section (the cases of one table: one N, one VM
//! count) each round turns the cases' order by one place, so that over as many rounds as a
//! section has cases each case runs in each place of the section once, and the place a run
//! had in its boot (a warmer L1, the page cache and placement the run before left) cancels
//! out of the medians. The sections stay in their order, round after round.
//!
//! Runs share as few L1 boots as the benchmark allows ([`Boots`]): all in one boot, or each
//! run in its own where its VMs need an L1 of their own. Every boot goes through
//! [`resume_boots`]: when L1 fails by itself, the runs that ended before the failure keep
//! their results and L1 boots again for the rest only, and every boot's log is kept
//! (`PVMM_RIG_DUMP`). A failure that is not L1's own is the benchmark's to report, never
//! booted again for.
//!
//! Each run is measured in the boot it ran in and reported on one progress line (its figures
//! in one line, or why it gave none); the tables come from [`Benchmark::tables`], written by
//! [`crate::figures::table`].

use crate::retry::{resume_boots, ResumedBoot};
use crate::rig::{RigError, RigOutcome, RunLines};

/// One run: a case in a round, under its run label in L1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The case, as an index into the benchmark's cases (sections in order).
    pub case: usize,
    /// The round, from 0.
    pub round: u32,
    /// Its label in L1 ([`Benchmark::label`]).
    pub label: String,
}

/// How a benchmark's runs share L1 boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boots {
    /// Every run of every round in one L1 boot, one after another.
    Shared,
    /// Each run in an L1 boot of its own (its VMs run side by side and need L1 to themselves).
    PerRun,
}

/// A benchmark, as data for [`run`]: its cases and what each needs from a boot.
pub trait Benchmark {
    /// What one run measures.
    type Figures;

    /// Its name in progress, retry and log-file names (`bench-kernbench`).
    fn name(&self) -> &str;

    /// The number of cases in each section, in order; case indexes count through them.
    fn sections(&self) -> Vec<usize>;

    /// Rounds: every case runs once per round.
    fn rounds(&self) -> u32;

    /// How the runs share L1 boots.
    fn boots(&self) -> Boots;

    /// The label of `case`'s run in `round`, unique among all runs.
    fn label(&self, case: usize, round: u32) -> String;

    /// Boots L1 once for `runs`, in this order.
    fn boot(&self, runs: &[Run]) -> Result<RigOutcome, RigError>;

    /// Whether `run` ended in `outcome` (its results hold whatever L1 did after): by default
    /// when L1 reported its VMM's exit status.
    fn ended(&self, outcome: &RigOutcome, run: &Run) -> bool {
        run_ended(outcome, &run.label)
    }

    /// `run`'s figures from the boot it ran in, or why there are none.
    fn measure(&self, outcome: &RigOutcome, run: &Run) -> Result<Self::Figures, String>;

    /// One run's figures in a few words, for its progress line.
    fn summary(&self, figures: &Self::Figures) -> String;

    /// The tables of every run's results (failed runs included, for the tables to count or
    /// skip).
    fn tables(&self, results: &[Measured<Self::Figures>]) -> String;
}

/// Whether L1 reported the exit status of the run labelled `label`.
pub fn run_ended(outcome: &RigOutcome, label: &str) -> bool {
    outcome.run(label).is_some_and(|run| run.status.is_some())
}

/// The lines of the run labelled `label` when its VMM exited 0, or why there is nothing to
/// measure: it never started, or its VMM failed (a status of None: killed at its limit, or
/// cut off by L1's end).
pub fn clean_run<'a>(outcome: &'a RigOutcome, label: &str) -> Result<RunLines<'a>, String> {
    let run = outcome
        .run(label)
        .ok_or_else(|| format!("run {label} never started"))?;
    match run.status {
        Some(0) => Ok(run),
        status => Err(format!("run {label}: VMM exit status {status:?}")),
    }
}

/// One run's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured<F> {
    /// The run.
    pub run: Run,
    /// Its figures, or why there are none.
    pub figures: Result<F, String>,
}

/// A benchmark's results.
#[derive(Debug)]
pub struct Report<F> {
    /// Every run's result, in the order the runs were measured.
    pub results: Vec<Measured<F>>,
    /// Every L1 boot, in order.
    pub boots: Vec<RigOutcome>,
}

impl<F> Report<F> {
    /// The runs that gave no figures, with why.
    pub fn failures(&self) -> impl Iterator<Item = (&Run, &str)> {
        self.results
            .iter()
            .filter_map(|m| m.figures.as_ref().err().map(|why| (&m.run, why.as_str())))
    }

    /// Whether every run gave its figures.
    pub fn all_measured(&self) -> bool {
        self.failures().next().is_none()
    }
}

/// The figures of the measured runs among `results` whose case `select` accepts.
pub fn figures_of<F>(results: &[Measured<F>], select: impl Fn(usize) -> bool) -> Vec<&F> {
    results
        .iter()
        .filter(|m| select(m.run.case))
        .filter_map(|m| m.figures.as_ref().ok())
        .collect()
}

/// Case `case` of a benchmark whose sections all hold `per_section` cases (one section per
/// load, its cases the policies): its section and its place in it.
pub fn grid_case(case: usize, per_section: usize) -> (usize, usize) {
    (case / per_section, case % per_section)
}

/// The cases of section `section` when every section holds `per_section` cases.
pub fn grid_section(section: usize, per_section: usize) -> std::ops::Range<usize> {
    section * per_section..(section + 1) * per_section
}

/// Every run as (case, round), in order: round by round, each section in order, each
/// section's cases turned by `round` places.
pub fn plan(sections: &[usize], rounds: u32) -> Vec<(usize, u32)> {
    let mut runs = Vec::new();
    for round in 0..rounds {
        let mut first = 0;
        for &count in sections {
            runs.extend((0..count).map(|i| (first + (i + round as usize) % count, round)));
            first += count;
        }
    }
    runs
}

/// One run's progress line: its place among all runs, its label, and its summary or why it
/// gave no figures.
pub fn progress_line(
    name: &str,
    done: usize,
    total: usize,
    label: &str,
    summary: &Result<String, String>,
) -> String {
    match summary {
        Ok(summary) => format!("{name}: run {done} of {total}, {label}: {summary}"),
        Err(why) => format!("{name}: run {done} of {total}, {label}: not measured: {why}"),
    }
}

/// Runs `bench`, each run's progress line on stderr ([`crate::host::progress`]).
pub fn run<B: Benchmark>(bench: &B) -> Result<Report<B::Figures>, RigError> {
    run_with(bench, &mut |line| crate::host::progress(line))
}

/// Runs `bench`, handing each run's progress line to `progress` as the run is measured; an
/// error from a boot (the rig could not run) ends it.
pub fn run_with<B: Benchmark>(
    bench: &B,
    progress: &mut dyn FnMut(&str),
) -> Result<Report<B::Figures>, RigError> {
    let runs: Vec<Run> = plan(&bench.sections(), bench.rounds())
        .into_iter()
        .map(|(case, round)| Run {
            case,
            round,
            label: bench.label(case, round),
        })
        .collect();
    let total = runs.len();
    let groups: Vec<(String, Vec<Run>)> = match bench.boots() {
        Boots::Shared => vec![(bench.name().to_string(), runs)],
        Boots::PerRun => runs
            .into_iter()
            .map(|run| (format!("{}-{}", bench.name(), run.label), vec![run]))
            .collect(),
    };
    let mut report = Report {
        results: Vec::new(),
        boots: Vec::new(),
    };
    for (name, group) in groups {
        let boots = resume_boots(
            &name,
            group,
            |pending| bench.boot(pending),
            |outcome, run| bench.ended(outcome, run),
        )?;
        for ResumedBoot { runs, outcome } in boots {
            for run in runs {
                let figures = bench.measure(&outcome, &run);
                let summary = figures
                    .as_ref()
                    .map(|f| bench.summary(f))
                    .map_err(Clone::clone);
                let done = report.results.len() + 1;
                progress(&progress_line(
                    bench.name(),
                    done,
                    total,
                    &run.label,
                    &summary,
                ));
                report.results.push(Measured { run, figures });
            }
            report.boots.push(outcome);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
