//! Booting the rig again when it fails by itself, and keeping a boot's whole log: shared by
//! the rig tests and the benchmarks of `cargo xtask`.

use std::io::Write;

use crate::rig::RigOutcome;
use crate::soak::{l1_kind, BootKind};

/// Where the rig's failure rates and their causes are described.
pub const RELIABILITY_DOC: &str = "docs/rig.md, Rig reliability";

/// Rig boots one outcome may use. The nested rig itself (QEMU TCG emulating SVM for L1's KVM)
/// now and then crashes a guest mid-boot: a triple fault under pvmm, a reset (QEMU exits 0
/// under `-no-reboot`) under QEMU as the inner VMM, at similar points of the guest's boot
/// (about one pvmm boot in seven), a guest kernel panic, a guest that stalls (its kernel
/// reports a soft lockup, an RCU stall or a hung task) until L1 kills its VMM at the run's
/// time limit, and L1 failing ([`crate::RigEnd::is_l1_failure`]). Such an outcome is run
/// again, with a loud `!!! rig retry` line naming its kind, up to 3 boots in all; a third
/// crash is returned like any other outcome, and so is, at once, an outcome of a kind not seen
/// before ([`retry_boots`]). Three, not two: on a loaded 2-CPU machine (CI's speed) about one
/// sequence boot in four ends in an L1 failure, so two in a row would fail about one CI run in
/// six over the three rig test binaries; a retried sequence costs its failure point plus at
/// most 90 s, so CI stays well inside its limit.
pub const RIG_ATTEMPTS: u32 = 3;

/// Runs `boot` up to [`RIG_ATTEMPTS`] times while `kind` says it ended in a known failure of
/// the nested rig ([`BootKind::is_known_rig_failure`]; its answer also says what happened).
/// Every rerun is logged on one `!!! rig retry` line with its kind, so the rig's failure rate
/// stays visible. Any other outcome is returned at once: a clean one to check, and a failure
/// of a kind the rig has not shown before ([`BootKind::Other`]) to fail on, not to hide by
/// booting again. An error from `boot` (the rig could not run) ends the retries.
pub fn retry_boots<T, E>(
    name: &str,
    mut boot: impl FnMut() -> Result<T, E>,
    kind: impl Fn(&T) -> (BootKind, String),
) -> Result<T, E> {
    let mut attempt = 1;
    loop {
        let outcome = boot()?;
        let (found, what) = kind(&outcome);
        if !found.is_known_rig_failure() {
            if found == BootKind::Other {
                shout(&format!(
                    "!!! {name}: not a known rig failure, not run again: {what}"
                ));
            }
            return Ok(outcome);
        }
        if attempt == RIG_ATTEMPTS {
            shout(&format!(
                "!!! rig retry: {name}: {} in boot {attempt} of {RIG_ATTEMPTS}, the last: {what}",
                found.name()
            ));
            return Ok(outcome);
        }
        attempt += 1;
        shout(&format!(
            "!!! rig retry: {name}: {} ({RELIABILITY_DOC}): {what}; booting again \
             (attempt {attempt} of {RIG_ATTEMPTS})",
            found.name()
        ));
    }
}

/// One L1 boot of a sequence run over several boots ([`resume_boots`]): the runs it answers
/// for, and how it ended.
#[derive(Debug)]
pub struct ResumedBoot<T> {
    /// The runs whose results this boot holds.
    pub runs: Vec<T>,
    /// How the boot ended, with every run's lines.
    pub outcome: RigOutcome,
}

/// Runs a sequence of `runs` in as few L1 boots as the rig allows: boots L1 for all of them
/// and, when L1 fails by itself ([`l1_failure_kind`]) before the last has ended, again for
/// those that had not ended (`ended`), up to [`RIG_ATTEMPTS`] boots. A run that ended before
/// the failure keeps its results: each run is its own VM, measured over its own span, so what
/// L1 did after it cannot change them, and a long benchmark does not lose its finished runs to
/// a late failure. Each boot answers for the runs that ended in it, the last for all it was
/// given; every reboot is logged on one `!!! rig retry` line, as [`retry_boots`]'s are, and
/// every boot's log is kept as `NAME-bootB` ([`dump_outcome`]) as soon as it ends.
pub fn resume_boots<T, E>(
    name: &str,
    runs: Vec<T>,
    mut boot: impl FnMut(&[T]) -> Result<RigOutcome, E>,
    ended: impl Fn(&RigOutcome, &T) -> bool,
) -> Result<Vec<ResumedBoot<T>>, E> {
    let mut boots = Vec::new();
    let mut pending = runs;
    let mut attempt = 1;
    loop {
        let outcome = boot(&pending)?;
        dump_outcome(&format!("{name}-boot{attempt}"), &outcome);
        let (found, what) = l1_failure_kind(&outcome);
        if !found.is_known_rig_failure() || attempt == RIG_ATTEMPTS {
            if found.is_known_rig_failure() {
                shout(&format!(
                    "!!! rig retry: {name}: {} in boot {attempt} of {RIG_ATTEMPTS}, the last: {what}",
                    found.name()
                ));
            }
            boots.push(ResumedBoot {
                runs: pending,
                outcome,
            });
            return Ok(boots);
        }
        let (done, left): (Vec<T>, Vec<T>) =
            pending.into_iter().partition(|run| ended(&outcome, run));
        let kept = done.len();
        boots.push(ResumedBoot {
            runs: done,
            outcome,
        });
        if left.is_empty() {
            return Ok(boots);
        }
        attempt += 1;
        shout(&format!(
            "!!! rig retry: {name}: {} ({RELIABILITY_DOC}): {what}; {kept} run(s) ended before \
             it and are kept, booting again for the {} left (attempt {attempt} of {RIG_ATTEMPTS})",
            found.name(),
            left.len()
        ));
        pending = left;
    }
}

/// Writes `line` straight to the process's standard error, past a test harness's capture of
/// `eprintln!` (which shows a passing test's output only on request): a rig test that passed
/// after booting again still says so in CI's log, so the rig's failure rate stays in sight.
/// This crate's own unit tests fake such failures: theirs stay in the capture.
fn shout(line: &str) {
    if cfg!(test) {
        eprintln!("{line}");
    } else {
        // Nothing is left to tell if standard error itself cannot be written.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// A benchmark's boot for [`retry_boots`] and [`resume_boots`]: L1 failing by itself is its
/// kind (the benchmark, whole or what is left of it, runs again on a fresh L1); any other end
/// counts as clean, for the benchmark to report.
pub fn l1_failure_kind(outcome: &RigOutcome) -> (BootKind, String) {
    match l1_kind(outcome.end).filter(|_| outcome.end.is_l1_failure()) {
        Some(kind) => (kind, outcome.summary("last VMM")),
        None => (BootKind::Clean, String::new()),
    }
}

/// With `PVMM_RIG_DUMP=DIR` set, writes every classified line of `outcome`
/// ([`RigOutcome::log_text`]) to `DIR/<name>.log`: a failure's post-mortem, since a test's or
/// a benchmark's own message shows only what it checked.
pub fn dump_outcome(name: &str, outcome: &RigOutcome) {
    let Some(dir) = std::env::var_os("PVMM_RIG_DUMP") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{name}.log"));
    if let Err(error) = std::fs::write(&path, outcome.log_text()) {
        eprintln!("PVMM_RIG_DUMP: cannot write {}: {error}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RigEnd;

    /// (boots made, the boot returned) when boot `b` (from 1) ends as `kind_of(b)`.
    fn retried(kind_of: impl Fn(u32) -> BootKind) -> (u32, u32) {
        let mut boots = 0;
        let last = retry_boots::<_, ()>(
            "t",
            || {
                boots += 1;
                Ok(boots)
            },
            |&b| (kind_of(b), "what".to_string()),
        );
        (boots, last.unwrap())
    }

    #[test]
    fn crashes_are_run_again_up_to_the_limit_and_a_clean_outcome_is_kept() {
        assert_eq!(
            retried(|_| BootKind::TripleFault),
            (RIG_ATTEMPTS, RIG_ATTEMPTS)
        );
        let first = |b| {
            if b == 1 {
                BootKind::L1Lockup
            } else {
                BootKind::Clean
            }
        };
        assert_eq!(retried(first), (2, 2));
        let until_last = |b| {
            if b < RIG_ATTEMPTS {
                BootKind::L1Frozen
            } else {
                BootKind::Clean
            }
        };
        assert_eq!(retried(until_last), (RIG_ATTEMPTS, RIG_ATTEMPTS));
        assert_eq!(retried(|_| BootKind::Clean), (1, 1));
    }

    #[test]
    fn a_failure_of_a_new_kind_is_not_run_again() {
        assert_eq!(retried(|_| BootKind::Other), (1, 1));
        let then_new = |b| {
            if b == 1 {
                BootKind::GuestPanic
            } else {
                BootKind::Other
            }
        };
        assert_eq!(retried(then_new), (2, 2));
    }

    /// The runs each boot answers for when boot `b` (from 1) ends as `ends[b - 1]` and only
    /// run 1 ever ends before a failure.
    fn resumed(ends: Vec<RigEnd>) -> Vec<Vec<u32>> {
        let mut ends = ends.into_iter();
        let boots = resume_boots::<_, ()>(
            "test",
            vec![1, 2, 3],
            |_| Ok(RigOutcome::empty(ends.next().expect("one end per boot"))),
            |_, &run| run == 1,
        )
        .expect("no rig error");
        boots.into_iter().map(|b| b.runs).collect()
    }

    #[test]
    fn a_resumed_sequence_keeps_the_runs_that_ended_and_boots_again_for_the_rest() {
        assert_eq!(resumed(vec![RigEnd::Completed]), vec![vec![1, 2, 3]]);
        assert_eq!(
            resumed(vec![RigEnd::L1Frozen, RigEnd::Completed]),
            vec![vec![1], vec![2, 3]]
        );
        assert_eq!(
            resumed(vec![RigEnd::L1Panic, RigEnd::L1Lockup, RigEnd::L1Reset]),
            vec![vec![1], vec![], vec![2, 3]]
        );
        // A failure that is not L1's own is the benchmark's to report, not to boot again for.
        assert_eq!(resumed(vec![RigEnd::TimedOut]), vec![vec![1, 2, 3]]);
    }

    #[test]
    fn a_resumed_sequence_whose_runs_all_ended_is_not_booted_again() {
        let boots = resume_boots::<_, ()>(
            "test",
            vec![1, 2],
            |_| Ok(RigOutcome::empty(RigEnd::L1Panic)),
            |_, _| true,
        )
        .expect("no rig error");
        assert_eq!(boots.len(), 1);
        assert_eq!(boots[0].runs, vec![1, 2]);
    }

    #[test]
    fn a_benchmark_is_run_again_only_when_l1_failed_by_itself() {
        let run = |ends: Vec<RigEnd>| {
            let mut ends = ends.into_iter();
            let mut boots = 0;
            let last = retry_boots::<_, ()>(
                "test",
                || {
                    boots += 1;
                    Ok(RigOutcome::empty(ends.next().expect("one end per boot")))
                },
                l1_failure_kind,
            )
            .expect("no rig error");
            (boots, last.end)
        };
        assert_eq!(
            run(vec![RigEnd::L1Lockup, RigEnd::Completed]),
            (2, RigEnd::Completed)
        );
        assert_eq!(run(vec![RigEnd::TimedOut]), (1, RigEnd::TimedOut));
        assert_eq!(
            run(vec![RigEnd::L1Frozen, RigEnd::L1Reset, RigEnd::L1Panic]),
            (RIG_ATTEMPTS, RigEnd::L1Panic)
        );
        let error = retry_boots::<RigOutcome, _>("test", || Err("x"), l1_failure_kind);
        assert!(error.is_err());
    }
}
