//! Load trace files: recorded per-vCPU demand over time.
//!
//! # Format
//!
//! Plain text, one sample per line, whitespace-separated columns:
//!
//! ```text
//! # pvmm-sim trace: time_ms, then one demand per vCPU
//! # demand = fraction of one full host CPU the vCPU wants, 0..1
//! 0      1.0   0.25
//! 1500   0.0   0.25
//! 4000   0.5   0.5
//! ```
//!
//! - The first column is a time in milliseconds (a non-negative integer); the
//!   first line must be at time 0 and times must strictly increase.
//! - Every line has the same number of demand columns, one per vCPU of the VM
//!   (at least one). A demand is a number from 0 to 1: the fraction of one full
//!   CPU (capacity 1024) the vCPU wants from that time on.
//! - A line's demands hold until the next line's time; the last line's hold
//!   until the simulation ends (end a trace with a line of zeros to stop).
//! - `#` starts a comment (to the end of the line); blank lines are ignored.
//!
//! Demand is *open loop*: work the vCPU is not given when it wants it (its CPU
//! is shared or slowed) stays queued and keeps it runnable, so a trace
//! describes work arriving, not the busy time a particular host produced.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Errors from reading or parsing a trace file.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error, as text.
        reason: String,
    },
    /// A malformed line.
    #[error("trace {path} line {line}: {reason}")]
    BadLine {
        /// The file (or `<input>` for in-memory text).
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// No sample lines at all.
    #[error("trace {path} has no samples")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// A parsed trace: piecewise-constant demand per vCPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Sample times in milliseconds, strictly increasing, starting at 0.
    times_ms: Vec<u64>,
    /// Demands, `vcpus` per sample, row-major.
    demands: Vec<f64>,
    vcpus: usize,
}

impl Trace {
    /// Reads and parses a trace file.
    pub fn from_file(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|e| TraceError::Unreadable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Parses trace text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, TraceError> {
        let bad = |line: usize, reason: String| TraceError::BadLine {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let mut times_ms: Vec<u64> = Vec::new();
        let mut demands = Vec::new();
        let mut vcpus = 0usize;
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let mut fields = content.split_whitespace();
            let time_text = fields.next().unwrap_or("");
            let time: u64 = time_text.parse().map_err(|_| {
                bad(
                    line_no,
                    format!("time '{time_text}' is not a whole number of milliseconds"),
                )
            })?;
            match times_ms.last() {
                None if time != 0 => {
                    return Err(bad(
                        line_no,
                        format!("the first sample must be at time 0, not {time}"),
                    ))
                }
                Some(&prev) if time <= prev => {
                    return Err(bad(
                        line_no,
                        format!("time {time} ms does not increase (previous {prev} ms)"),
                    ))
                }
                _ => {}
            }
            let start = demands.len();
            for field in fields {
                let d: f64 = field
                    .parse()
                    .ok()
                    .filter(|d: &f64| d.is_finite() && (0.0..=1.0).contains(d))
                    .ok_or_else(|| {
                        bad(
                            line_no,
                            format!("demand '{field}' is not a number from 0 to 1"),
                        )
                    })?;
                demands.push(d);
            }
            let count = demands.len() - start;
            if count == 0 {
                return Err(bad(line_no, "no demand columns after the time".into()));
            }
            if times_ms.is_empty() {
                vcpus = count;
            } else if count != vcpus {
                return Err(bad(
                    line_no,
                    format!("{count} demand columns, but the first sample has {vcpus}"),
                ));
            }
            times_ms.push(time);
        }
        if times_ms.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(Trace {
            times_ms,
            demands,
            vcpus,
        })
    }

    /// Number of vCPU columns.
    pub fn vcpus(&self) -> usize {
        self.vcpus
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.times_ms.len()
    }

    /// Never true for a parsed trace (parsing rejects empty traces).
    pub fn is_empty(&self) -> bool {
        self.times_ms.is_empty()
    }

    /// Time of the last sample (ms).
    pub fn last_time_ms(&self) -> u64 {
        self.times_ms.last().copied().unwrap_or(0)
    }

    /// Index of the sample in force at `t_ms`, searching forward from `hint`
    /// (callers walk time forward, so this is O(1) amortized).
    pub fn sample_at(&self, t_ms: u64, hint: usize) -> usize {
        let mut i = hint.min(self.times_ms.len().saturating_sub(1));
        if self.times_ms.get(i).is_some_and(|&t| t > t_ms) {
            i = 0;
        }
        while i + 1 < self.times_ms.len() && self.times_ms[i + 1] <= t_ms {
            i += 1;
        }
        i
    }

    /// Demand of vCPU `column` in sample `sample` (0 when out of range).
    pub fn demand(&self, sample: usize, column: usize) -> f64 {
        if column >= self.vcpus {
            return 0.0;
        }
        self.demands
            .get(sample * self.vcpus + column)
            .copied()
            .unwrap_or(0.0)
    }

    /// Time at which sample `sample` starts (ms; 0 when out of range).
    pub fn time_ms(&self, sample: usize) -> u64 {
        self.times_ms.get(sample).copied().unwrap_or(0)
    }

    /// Time at which sample `sample + 1` starts, if any (ms).
    pub fn next_change_ms(&self, sample: usize) -> Option<u64> {
        self.times_ms.get(sample + 1).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(text, Path::new("t.trace"))
    }

    fn line_of(err: TraceError) -> usize {
        match err {
            TraceError::BadLine { line, .. } => line,
            other => panic!("expected BadLine, got {other:?}"),
        }
    }

    #[test]
    fn parses_comments_and_columns() {
        let t = parse("# header\n\n0 1.0 0.25 # busy\n1500\t0 0.25\n4000 0.5 .5\n").unwrap();
        assert_eq!(t.vcpus(), 2);
        assert_eq!(t.len(), 3);
        assert_eq!(t.last_time_ms(), 4000);
        assert_eq!(t.demand(0, 0), 1.0);
        assert_eq!(t.demand(1, 0), 0.0);
        assert_eq!(t.demand(2, 1), 0.5);
        assert_eq!(t.demand(2, 7), 0.0);
        assert_eq!(t.sample_at(0, 0), 0);
        assert_eq!(t.sample_at(1499, 0), 0);
        assert_eq!(t.sample_at(1500, 0), 1);
        assert_eq!(t.sample_at(99_999, 1), 2);
        assert_eq!(t.sample_at(10, 2), 0, "a hint past t restarts the search");
        assert_eq!(t.next_change_ms(0), Some(1500));
        assert_eq!(t.next_change_ms(2), None);
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(line_of(parse("5 1.0\n").unwrap_err()), 1);
        assert_eq!(line_of(parse("0 1.0\n0 0.5\n").unwrap_err()), 2);
        assert_eq!(line_of(parse("0 1.0\n10 0.5\n5 0.5\n").unwrap_err()), 3);
        assert_eq!(line_of(parse("0 1.0 1.0\n# c\n10 0.5\n").unwrap_err()), 3);
        assert_eq!(line_of(parse("0 1.5\n").unwrap_err()), 1);
        assert_eq!(line_of(parse("0 -0.1\n").unwrap_err()), 1);
        assert_eq!(line_of(parse("0 abc\n").unwrap_err()), 1);
        assert_eq!(line_of(parse("0 NaN\n").unwrap_err()), 1);
        assert_eq!(line_of(parse("1.5 0.2\n").unwrap_err()), 1);
        assert_eq!(line_of(parse("0\n").unwrap_err()), 1);
        assert!(matches!(
            parse("# only comments\n\n"),
            Err(TraceError::Empty { .. })
        ));
        let msg = parse("0 1\n10 2\n").unwrap_err().to_string();
        assert_eq!(
            msg,
            "trace t.trace line 2: demand '2' is not a number from 0 to 1"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn unreadable_file() {
        let err = Trace::from_file(Path::new("/nonexistent/pvmm-sim.trace")).unwrap_err();
        assert!(matches!(err, TraceError::Unreadable { .. }));
        assert!(err
            .to_string()
            .starts_with("cannot read trace /nonexistent"));
    }
}
