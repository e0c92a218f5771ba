//! What the placement loop reads about threads from `/proc/<pid>/task/<tid>/`: the kernel
//! scheduler's accounting of each vCPU thread (schedstat) and where it last ran (stat). pvmm's
//! idle signal and CPPC feedback counters, and the host daemon's readings of adopted VMs, read
//! the same files through this module.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// The most a [`ProcFile`] reads: a `stat` line is about 300 bytes, a `schedstat` line 40.
const PROC_FILE_MAX: usize = 1024;

/// A `/proc` (or sysfs) file kept open and read again from its start at each reading. procfs
/// and sysfs build the text anew for every read at offset 0, so a reading costs one `pread`
/// instead of a path walk, an open, a read and a close: pvmm reads one such file per vCPU per
/// tick, and the daemon one per watched vCPU.
/// The descriptor stays bound to the task it was opened for: once that thread or process has
/// ended, its reads fail, and the file stays failed even if the id is reused (discovery, not
/// this file, follows new threads).
#[derive(Debug)]
pub struct ProcFile {
    path: PathBuf,
    state: ProcFileState,
    buf: Vec<u8>,
}

#[derive(Debug)]
enum ProcFileState {
    /// Not open yet (or the open failed, e.g. for want of descriptors: tried again next time).
    Closed,
    Open(File),
    /// A read of the open file failed: its task is gone.
    Gone,
}

impl ProcFile {
    /// The file at `path`, opened at its first reading.
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            state: ProcFileState::Closed,
            buf: Vec::new(),
        }
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The file's text now; None when it cannot be opened or its task has ended.
    pub fn read(&mut self) -> Option<&str> {
        if let ProcFileState::Closed = self.state {
            self.state = ProcFileState::Open(File::open(&self.path).ok()?);
        }
        let ProcFileState::Open(file) = &self.state else {
            return None;
        };
        self.buf.resize(PROC_FILE_MAX, 0);
        match file.read_at(&mut self.buf, 0) {
            Ok(n) => {
                self.buf.truncate(n);
                std::str::from_utf8(&self.buf).ok()
            }
            Err(_) => {
                self.state = ProcFileState::Gone;
                None
            }
        }
    }
}

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

/// `/proc/self/task/<tid>/stat` of thread `tid`.
pub fn stat_path(tid: i32) -> String {
    format!("/proc/self/task/{tid}/stat")
}

/// The CPU thread `tid` of this process last ran on (field 39 of its `stat`).
pub fn last_cpu_of_thread(tid: i32) -> Option<u32> {
    let text = std::fs::read_to_string(stat_path(tid)).ok()?;
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
    fn a_kept_proc_file_reads_fresh_text_and_fails_for_good_once_its_thread_ends() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let mut mine = ProcFile::new(schedstat_path(me).into());
        let (first, _) = parse_schedstat(mine.read().unwrap()).unwrap();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(20) {}
        let (second, _) = parse_schedstat(mine.read().unwrap()).unwrap();
        assert!(
            second > first,
            "{first} -> {second}: the text is built anew"
        );

        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let mut theirs = ProcFile::new(schedstat_path(tid).into());
        assert!(theirs.read().is_some());
        stop_tx.send(()).unwrap();
        thread.join().unwrap();
        // A joined thread may still be in its last steps of exit for a moment.
        let ended = std::time::Instant::now();
        while theirs.read().is_some() {
            assert!(ended.elapsed() < std::time::Duration::from_secs(5));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(theirs.read(), None);
        assert!(matches!(theirs.state, ProcFileState::Gone));
    }

    #[test]
    fn a_missing_proc_file_is_tried_again() {
        let dir = std::env::temp_dir().join(format!("pvmm-procfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("schedstat");
        let _ = std::fs::remove_file(&path);
        let mut file = ProcFile::new(path.clone());
        assert_eq!(file.read(), None);
        std::fs::write(&path, "5 6 7\n").unwrap();
        assert_eq!(file.read(), Some("5 6 7\n"));
        std::fs::write(&path, "8 9 10\n").unwrap();
        assert_eq!(file.read(), Some("8 9 10\n"));
        std::fs::remove_dir_all(&dir).unwrap();
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
