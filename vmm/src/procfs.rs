//! What pvmm reads about its own threads from `/proc/self/task/<tid>/`: the scheduler's
//! accounting of each vCPU thread. The idle signal (`live::idle`) and the CPPC
//! feedback counters (through [`pvmm_devices::cppc::DemandCounters`]) read the same files
//! through this module.

use pvmm_devices::cppc::DemandCounters;

/// Parses a schedstat line (`<ns on CPU> <ns waiting on a run queue> <timeslices>`) into
/// (wanted, ran): how long the thread wanted to run (on CPU or waiting for one) and how long
/// it ran.
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace();
    let ran: u64 = f.next()?.parse().ok()?;
    let waited: u64 = f.next()?.parse().ok()?;
    Some((ran.saturating_add(waited), ran))
}

/// `/proc/self/task/<tid>/schedstat` of thread `tid`.
pub fn schedstat_path(tid: i32) -> String {
    format!("/proc/self/task/{tid}/schedstat")
}

/// How long thread `tid` of this process wanted to run (on a CPU or waiting for one) and how
/// long it ran, in ns since it started; None when its schedstat is unreadable.
pub fn thread_demand(tid: i32) -> Option<(u64, u64)> {
    parse_schedstat(&std::fs::read_to_string(schedstat_path(tid)).ok()?)
}

/// Demand counters of this process's threads, from their schedstat files.
pub struct ProcSchedstat;

impl DemandCounters for ProcSchedstat {
    fn read(&self, tid: i32) -> Option<(u64, u64)> {
        thread_demand(tid)
    }
}

/// The CPU thread `tid` of this process last ran on (field 39 of its `stat`).
pub fn last_cpu_of_thread(tid: i32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    parse_last_cpu(&text)
}

/// Parses field 39 (`processor`) of a /proc stat line; the command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its closing parenthesis.
pub fn parse_last_cpu(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3.. ; processor is field 39, i.e. index 36 here.
    after.split_whitespace().nth(36)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn schedstat_parsing() {
        assert_eq!(
            parse_schedstat("123456 789 10\n"),
            Some((123456 + 789, 123456))
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        assert_eq!(parse_schedstat("5"), None);
    }

    use super::*;

    #[test]
    fn last_cpu_parsing_survives_odd_names() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[36] = "7".into(); // field 39
        let line = format!("123 (vcpu (0) x) {}", fields.join(" "));
        assert_eq!(parse_last_cpu(&line), Some(7));
        assert_eq!(parse_last_cpu("garbage"), None);
    }

    #[test]
    fn own_thread_is_readable() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let (wanted, ran) = thread_demand(tid).unwrap();
        assert!(wanted >= ran);
        assert!(last_cpu_of_thread(tid).is_some());
    }
}
