//! Diagnostics of a stalled L1: QEMU's threads and the CPU time each used while the rig
//! watched, before it killed QEMU.

use std::time::Duration;

/// How long the rig watches QEMU's threads before killing a stalled L1.
pub const STALL_SAMPLE: Duration = Duration::from_secs(1);

/// `NAME STATE CPU_MS` for each thread of process `pid`, CPU_MS being the CPU time it used
/// over [`STALL_SAMPLE`] (from `/proc/PID/task/TID/stat`); empty when /proc cannot tell.
pub(super) fn sample_threads(pid: u32) -> Vec<String> {
    let read = || -> Vec<(String, String, u64)> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut threads: Vec<(String, String, u64)> = tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            .filter_map(|stat| parse_task_stat(&stat))
            .collect();
        threads.sort();
        threads
    };
    let before = read();
    std::thread::sleep(STALL_SAMPLE);
    // Clock ticks are 10 ms on the Linux hosts the rig runs on (USER_HZ = 100).
    read()
        .into_iter()
        .map(|(name, state, ticks)| {
            let earlier = before
                .iter()
                .find(|(n, _, _)| *n == name)
                .map_or(ticks, |b| b.2);
            format!("{name} {state} {}", ticks.saturating_sub(earlier) * 10)
        })
        .collect()
}

/// (`comm`, state, utime + stime in clock ticks) from a `/proc/PID/task/TID/stat` line. The
/// thread id is kept in front of the name so threads with the same name stay apart.
fn parse_task_stat(stat: &str) -> Option<(String, String, u64)> {
    let (tid, rest) = stat.split_once(" (")?;
    let (name, rest) = rest.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the line, utime 14 and stime 15.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((format!("{tid}:{name}"), fields.first()?.to_string(), ticks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_stat_lines_parse() {
        let line = "4321 (CPU 1/TCG) R 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 1";
        assert_eq!(
            parse_task_stat(line),
            Some(("4321:CPU 1/TCG".into(), "R".into(), 290))
        );
        assert_eq!(parse_task_stat("garbage"), None);
        let own = sample_threads(std::process::id());
        assert!(
            !own.is_empty() && own.iter().all(|l| l.split(' ').count() >= 3),
            "{own:?}"
        );
    }
}
