//! Where pvmm's own share of a boot goes: the wall time of each step of [`super::start`]
//! up to the guest's first instruction, printed on one line with `-v`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// The steps of a start, timed one after another.
pub(super) struct Phases {
    started: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    /// Starts timing now.
    pub(super) fn start() -> Self {
        let now = Instant::now();
        Self {
            started: now,
            last: now,
            done: Vec::new(),
        }
    }

    /// Ends the step `name` (begun where the previous one ended).
    pub(super) fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done.push((name, now - self.last));
        self.last = now;
    }

    /// `setup took T ms before the guest's first instruction: step t, step t, ...`.
    pub(super) fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mut line = format!(
            "setup took {:.1} ms before the guest's first instruction:",
            ms(self.last - self.started)
        );
        for (i, (name, d)) in self.done.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(line, "{sep}{name} {:.1}", ms(*d));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_to_the_total_and_keep_their_order() {
        let mut phases = Phases::start();
        std::thread::sleep(Duration::from_millis(2));
        phases.mark("memory");
        phases.mark("vcpus");
        let line = phases.summary();
        assert!(line.starts_with("setup took "), "{line}");
        let memory = line.find("memory ").expect("memory step");
        let vcpus = line.find(", vcpus ").expect("vcpus step");
        assert!(memory < vcpus, "{line}");
        let total: Duration = phases.done.iter().map(|(_, d)| *d).sum();
        assert_eq!(total, phases.last - phases.started);
        assert!(phases.done[0].1 >= Duration::from_millis(2));
    }
}
