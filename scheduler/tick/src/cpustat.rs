//! Per-CPU idle time of the host from `/proc/stat`, to report how idle each package really
//! was (measured, not what pvmm intended).

/// Cumulative jiffies of one CPU: idle (idle + iowait) and total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// idle + iowait.
    pub idle: u64,
    /// All fields.
    pub total: u64,
}

impl CpuTimes {
    /// The times of one CPU from the counters of its `/proc/stat` line, the fields after
    /// `cpuN`: user nice system idle iowait irq softirq steal (guest time is inside user, so
    /// the counters after steal are not added again). Missing counters count as 0.
    pub fn from_counters(counters: &[u64]) -> CpuTimes {
        let counter = |i: usize| counters.get(i).copied().unwrap_or(0);
        CpuTimes {
            idle: counter(3) + counter(4),
            total: counters.iter().take(8).sum(),
        }
    }

    /// The share (0..=1) of the time from `before` to these times that the CPU was idle; None
    /// when no time passed between the two.
    pub fn idle_fraction_since(&self, before: &CpuTimes) -> Option<f64> {
        let total = self.total.saturating_sub(before.total);
        let idle = self.idle.saturating_sub(before.idle).min(total);
        (total > 0).then(|| idle as f64 / total as f64)
    }
}

/// Parses the `cpuN` lines of /proc/stat into (cpu id, times).
pub fn parse_proc_stat(text: &str) -> Vec<(u32, CpuTimes)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id: u32 = fields.next()?.strip_prefix("cpu")?.parse().ok()?;
            let values: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
            Some((id, CpuTimes::from_counters(&values)))
        })
        .collect()
}

/// Reads /proc/stat now; empty when it cannot be read.
pub fn read_proc_stat() -> Vec<(u32, CpuTimes)> {
    std::fs::read_to_string("/proc/stat")
        .map(|t| parse_proc_stat(&t))
        .unwrap_or_default()
}

/// Idle share (0..=1) of the CPUs in `cpus` between two readings; None without data.
pub fn idle_share(
    before: &[(u32, CpuTimes)],
    after: &[(u32, CpuTimes)],
    cpus: impl Iterator<Item = u32>,
) -> Option<f64> {
    let (mut idle, mut total) = (0u64, 0u64);
    for cpu in cpus {
        let b = before.iter().find(|(c, _)| *c == cpu)?.1;
        let a = after.iter().find(|(c, _)| *c == cpu)?.1;
        idle += a.idle.saturating_sub(b.idle);
        total += a.total.saturating_sub(b.total);
    }
    (total > 0).then(|| idle as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 10 0 10 80 0 0 0 0 0 0\ncpu1 50 0 0 50 0 0 0 0 0 0\nintr 1 2\n";
    const B: &str = "cpu0 20 0 10 170 0 0 0 0 0 0\ncpu1 150 0 0 50 0 0 0 0 0 0\n";

    #[test]
    fn idle_shares() {
        let a = parse_proc_stat(A);
        let b = parse_proc_stat(B);
        assert_eq!(a.len(), 2);
        assert_eq!(idle_share(&a, &b, [0].into_iter()), Some(0.9));
        assert_eq!(idle_share(&a, &b, [1].into_iter()), Some(0.0));
        assert_eq!(idle_share(&a, &b, [0, 1].into_iter()), Some(0.45));
        assert_eq!(idle_share(&a, &b, [7].into_iter()), None);
    }

    #[test]
    fn times_from_counters_and_idle_fraction() {
        let before = CpuTimes::from_counters(&[10, 0, 5, 100, 7, 0, 1, 0, 9, 9]);
        assert_eq!(
            before,
            CpuTimes {
                idle: 107,
                total: 123
            }
        );
        assert_eq!(
            CpuTimes::from_counters(&[1, 2]),
            CpuTimes { idle: 0, total: 3 }
        );
        let after = CpuTimes {
            idle: 137,
            total: 163,
        };
        assert_eq!(after.idle_fraction_since(&before), Some(0.75));
        assert_eq!(before.idle_fraction_since(&before), None);
    }
}
