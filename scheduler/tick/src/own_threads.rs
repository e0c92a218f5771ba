//! pvmm's own threads (everything but the vCPUs: main, console, scheduler, API, the virtio
//! devices' threads): where they may run, and how much CPU time they use.
//!
//! A package reaches its deep idle state only when every CPU in it is idle, so a VMM thread
//! that wakes every tick on a package the placement keeps empty costs that package its sleep.
//! pvmm's own threads therefore follow the lowest-numbered package that holds vCPUs (or, while
//! placement counts their own load on a lower package, stay there: see below). The
//! threads are listed from `/proc/self/task` at each tick rather than registered, so threads
//! a library starts (the API's connection threads) are covered too.
//!
//! What the device threads run there is load on that package like the vCPUs': a guest doing
//! heavy I/O keeps them busy. [`OwnThreads::sample_load`] adds up their time on CPU (each
//! thread's `schedstat`, kept open; [`OwnThreads::counting_load_of`] names them) for the
//! placement engine to count on their package. vCPUs
//! may leave that package to make room for them; the threads then stay where their load is
//! counted rather than follow those vCPUs, which would move back to make room again.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use pvmm_scheduler::capacity::CAPACITY_SCALE;
use pvmm_scheduler::{CpuSet, Executor};

use crate::procfs::{parse_schedstat, ProcFile};

/// Room for `getdents64` records: at most 32 bytes for a thread id's entry, so one call lists
/// about 500 threads.
const DIRENTS_BUF: usize = 16 * 1024;
/// Where a `linux_dirent64`'s name starts (after inode, offset, record length and type).
const DIRENT_NAME_AT: usize = 19;

/// One of pvmm's own threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnThread {
    /// Linux thread id.
    pub tid: i32,
    /// Its name (`/proc/self/task/<tid>/comm`).
    pub name: String,
}

/// Lists and pins the process's threads other than its vCPUs.
///
/// Pinning runs every tick, so it keeps what it needs: the task directory open (read again
/// from its start with `getdents64` into a kept buffer) and sorted lists of thread ids that are
/// reused, so that a tick where no thread started allocates nothing.
#[derive(Debug)]
pub struct OwnThreads {
    task_dir: PathBuf,
    /// `task_dir`, opened at the first pinning (again after a failed read).
    dir: Option<File>,
    dirents: Vec<u8>,
    /// The vCPU threads, sorted.
    vcpu_tids: Vec<i32>,
    /// The threads alive at the last listing, sorted.
    alive: Vec<i32>,
    /// The CPUs the threads in `pinned` are restricted to.
    target: CpuSet,
    /// Threads restricted to `target`, sorted.
    pinned: Vec<i32>,
    /// Threads whose affinity the host refused, sorted: tried once, not every tick.
    refused: Vec<i32>,
    /// The CPU time of the threads alive at the last [`OwnThreads::sample_load`], by thread id.
    clocks: Vec<ThreadClock>,
    /// When [`OwnThreads::sample_load`] last read them.
    sampled_ns: Option<u64>,
    /// Name prefixes of the threads whose time counts as load (none: every own thread's).
    load_of: &'static [&'static str],
}

/// One thread's time on CPU, from its `schedstat` kept open.
#[derive(Debug)]
struct ThreadClock {
    tid: i32,
    schedstat: ProcFile,
    /// Its time on CPU at the last reading, in ns.
    ran_ns: Option<u64>,
    /// Whether its time counts as load (its name has one of the prefixes asked for).
    counts: bool,
}

impl ThreadClock {
    /// Reads the thread's time on CPU; returns how much it grew since the last reading (0 at
    /// the first), or None when the thread has ended.
    fn read(&mut self) -> Option<u64> {
        let (_, ran) = parse_schedstat(self.schedstat.read()?)?;
        let before = self.ran_ns.replace(ran);
        Some(before.map_or(0, |b| ran.saturating_sub(b)))
    }
}

impl OwnThreads {
    /// The threads of this process other than `vcpu_tids`.
    pub fn new(vcpu_tids: Vec<i32>) -> Self {
        Self::in_dir("/proc/self/task".into(), vcpu_tids)
    }

    /// The same, listing threads from `task_dir` (tests point it at a fake tree).
    pub fn in_dir(task_dir: PathBuf, mut vcpu_tids: Vec<i32>) -> Self {
        vcpu_tids.sort_unstable();
        Self {
            task_dir,
            dir: None,
            dirents: Vec::new(),
            vcpu_tids,
            alive: Vec::new(),
            target: CpuSet::new(),
            pinned: Vec::new(),
            refused: Vec::new(),
            clocks: Vec::new(),
            sampled_ns: None,
            load_of: &[],
        }
    }

    /// Counts only the threads whose names start with one of `prefixes` in
    /// [`OwnThreads::sample_load`]: the threads whose work grows with the guest's (its
    /// devices'), not the VMM's fixed bookkeeping, which a nested host inflates many times. A
    /// thread's name is read when it is first seen; a thread is named before it runs.
    pub fn counting_load_of(mut self, prefixes: &'static [&'static str]) -> Self {
        self.load_of = prefixes;
        self
    }

    /// The threads alive now, by thread id; a thread that ends while being listed is left out.
    pub fn list(&self) -> Vec<OwnThread> {
        let Ok(entries) = std::fs::read_dir(&self.task_dir) else {
            return Vec::new();
        };
        let mut threads: Vec<OwnThread> = entries
            .filter_map(|e| parse_tid(e.ok()?.file_name().as_encoded_bytes()))
            .filter(|tid| self.vcpu_tids.binary_search(tid).is_err())
            .filter_map(|tid| {
                let comm =
                    std::fs::read_to_string(self.task_dir.join(tid.to_string()).join("comm"));
                Some(OwnThread {
                    tid,
                    name: comm.ok()?.trim_end().to_string(),
                })
            })
            .collect();
        threads.sort_by_key(|t| t.tid);
        threads
    }

    /// Restricts every own thread to `cpus`, touching only threads not already there.
    /// Returns how many threads the host newly refused; a refused thread is not tried again.
    pub fn pin(&mut self, cpus: &CpuSet, executor: &mut dyn Executor) -> u64 {
        if !self.read_alive() {
            return 0;
        }
        if self.target != *cpus {
            self.target.clone_from(cpus);
            self.pinned.clear();
        }
        let alive = &self.alive;
        self.pinned.retain(|tid| alive.binary_search(tid).is_ok());
        self.refused.retain(|tid| alive.binary_search(tid).is_ok());
        let mut refused = 0;
        for &tid in &self.alive {
            let Err(at) = self.pinned.binary_search(&tid) else {
                continue;
            };
            let Err(refused_at) = self.refused.binary_search(&tid) else {
                continue;
            };
            match executor.apply(tid, cpus) {
                Ok(()) => self.pinned.insert(at, tid),
                Err(_) => {
                    self.refused.insert(refused_at, tid);
                    refused += 1;
                }
            }
        }
        refused
    }

    /// The CPU time the threads used since the last call, over the time since then (`now_ns`
    /// on any monotonic clock): 1024 = one CPU, so several busy threads make more than 1024.
    /// 0 at the first call and when the task directory cannot be read. A thread counts from
    /// its second reading, so one that starts or ends between two calls counts for only part
    /// of that interval. Allocates only for threads that started since the last call.
    pub fn sample_load(&mut self, now_ns: u64) -> u32 {
        let since = self
            .sampled_ns
            .replace(now_ns)
            .map(|then| now_ns.saturating_sub(then));
        if !self.read_alive() {
            self.clocks.clear();
            return 0;
        }
        self.follow_clocks();
        let mut ran_ns = 0u64;
        // A thread whose schedstat cannot be read has ended (or its id was reused since: the
        // next call opens the new thread's file). Threads that do not count are not read: the
        // listing alone keeps their clocks in step.
        self.clocks.retain_mut(|c| {
            if !c.counts {
                return true;
            }
            match c.read() {
                Some(ran) => {
                    ran_ns = ran_ns.saturating_add(ran);
                    true
                }
                None => false,
            }
        });
        match since {
            Some(dt) if dt > 0 => {
                let util = u128::from(ran_ns) * u128::from(CAPACITY_SCALE) / u128::from(dt);
                u32::try_from(util).unwrap_or(u32::MAX)
            }
            _ => 0,
        }
    }

    /// Keeps a clock for every thread in `self.alive`, and none for the others.
    fn follow_clocks(&mut self) {
        let alive = &self.alive;
        self.clocks.retain(|c| alive.binary_search(&c.tid).is_ok());
        for &tid in alive {
            if let Err(at) = self.clocks.binary_search_by_key(&tid, |c| c.tid) {
                let thread = self.task_dir.join(tid.to_string());
                let counts = self.load_of.is_empty() || {
                    let name = std::fs::read_to_string(thread.join("comm")).unwrap_or_default();
                    self.load_of.iter().any(|p| name.starts_with(p))
                };
                self.clocks.insert(
                    at,
                    ThreadClock {
                        tid,
                        schedstat: ProcFile::new(thread.join("schedstat")),
                        ran_ns: None,
                        counts,
                    },
                );
            }
        }
    }

    /// Lists the threads alive now, but the vCPUs, into `self.alive`; false when the task
    /// directory cannot be read.
    fn read_alive(&mut self) -> bool {
        self.alive.clear();
        if self.dir.is_none() {
            self.dir = File::open(&self.task_dir).ok();
            self.dirents.resize(DIRENTS_BUF, 0);
        }
        let Some(dir) = &self.dir else {
            return false;
        };
        let fd = dir.as_raw_fd();
        // SAFETY: lseek on a descriptor this struct owns; no memory is involved.
        let mut ok = unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } == 0;
        while ok {
            // SAFETY: the kernel writes at most `dirents.len()` bytes into the live buffer.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    fd,
                    self.dirents.as_mut_ptr(),
                    self.dirents.len(),
                )
            };
            // Negative on an error, 0 at the directory's end, else the bytes written.
            let n = match usize::try_from(n) {
                Ok(0) => break,
                Ok(n) => n,
                Err(_) => {
                    ok = false;
                    break;
                }
            };
            let records = &self.dirents[..n];
            for name in DirentNames(records) {
                match parse_tid(name) {
                    Some(tid) if self.vcpu_tids.binary_search(&tid).is_err() => {
                        self.alive.push(tid)
                    }
                    _ => {}
                }
            }
        }
        if !ok {
            // Opened again at the next pinning.
            self.dir = None;
            self.alive.clear();
            return false;
        }
        self.alive.sort_unstable();
        true
    }
}

/// The names in a buffer of `linux_dirent64` records, as `getdents64` returns them.
struct DirentNames<'a>(&'a [u8]);

impl<'a> Iterator for DirentNames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let len = usize::from(u16::from_ne_bytes([*self.0.get(16)?, *self.0.get(17)?]));
        if len <= DIRENT_NAME_AT || len > self.0.len() {
            return None;
        }
        let (record, rest) = self.0.split_at(len);
        self.0 = rest;
        let name = &record[DIRENT_NAME_AT..];
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Some(&name[..end])
    }
}

/// A thread id from a directory entry's name (None for `.`, `..` and anything else).
fn parse_tid(name: &[u8]) -> Option<i32> {
    if name.is_empty() || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(name).ok()?.parse().ok()
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use pvmm_scheduler::RecordingExecutor;

    /// A thread of a fake tree: its schedstat says it ran `ran_ns`.
    fn set_ran(dir: &std::path::Path, tid: i32, ran_ns: u64) {
        std::fs::write(
            dir.join(tid.to_string()).join("schedstat"),
            format!("{ran_ns} 0 1\n"),
        )
        .unwrap();
    }

    #[test]
    fn the_load_is_the_own_threads_time_on_cpu_over_the_interval() {
        let dir = fake_tree(
            "load",
            &[
                (10, "pvmm"),
                (11, "vcpu0"),
                (12, "pvmm-blk0"),
                (13, "pvmm-net0"),
            ],
        );
        for tid in 10..=13 {
            set_ran(&dir, tid, 1_000_000);
        }
        let mut own = OwnThreads::in_dir(dir.clone(), vec![11]);
        assert_eq!(own.sample_load(0), 0, "the first reading has no interval");
        set_ran(&dir, 10, 1_000_000 + 10_000_000);
        set_ran(&dir, 11, 1_000_000 + 100_000_000);
        set_ran(&dir, 12, 1_000_000 + 90_000_000);
        set_ran(&dir, 13, 1_000_000 + 50_000_000);
        // 150 ms of own threads' time (the vCPU's left out) in 100 ms: 1.5 CPUs.
        assert_eq!(own.sample_load(100_000_000), 1536);
        assert_eq!(own.sample_load(200_000_000), 0, "no time since");
        // An ended thread is dropped; a new one counts from its second reading.
        std::fs::remove_dir_all(dir.join("13")).unwrap();
        std::fs::create_dir_all(dir.join("14")).unwrap();
        set_ran(&dir, 14, 7_000_000_000);
        set_ran(&dir, 12, 1_000_000 + 90_000_000 + 25_000_000);
        assert_eq!(own.sample_load(300_000_000), 256);
        assert_eq!(
            own.clocks.iter().map(|c| c.tid).collect::<Vec<_>>(),
            [10, 12, 14]
        );
        set_ran(&dir, 14, 7_000_000_000 + 100_000_000);
        assert_eq!(own.sample_load(400_000_000), 1024);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn only_the_threads_asked_for_count_as_load() {
        let dir = fake_tree(
            "devices",
            &[(10, "pvmm-sched"), (12, "pvmm-blk0"), (13, "pvmm-net0")],
        );
        for tid in [10, 12, 13] {
            set_ran(&dir, tid, 0);
        }
        let mut own = OwnThreads::in_dir(dir.clone(), vec![]).counting_load_of(&["pvmm-blk"]);
        own.sample_load(0);
        for tid in [10, 12, 13] {
            set_ran(&dir, tid, 50_000_000);
        }
        // Only pvmm-blk0's 50 ms in 100 ms.
        assert_eq!(own.sample_load(100_000_000), 512);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_busy_thread_of_this_process_shows_in_its_load() {
        let mut own = OwnThreads::new(vec![]);
        let start = std::time::Instant::now();
        own.sample_load(0);
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let spinner = std::thread::spawn(move || {
            while let Err(std::sync::mpsc::TryRecvError::Empty) = finish.try_recv() {
                std::hint::spin_loop();
            }
        });
        // The spinner's first reading, then an interval of spinning.
        std::thread::sleep(std::time::Duration::from_millis(20));
        own.sample_load(start.elapsed().as_nanos() as u64);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let load = own.sample_load(start.elapsed().as_nanos() as u64);
        drop(done);
        spinner.join().unwrap();
        assert!(load > 0, "{load}");
    }

    fn fake_tree(name: &str, threads: &[(i32, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pvmm-own-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        for (tid, comm) in threads {
            let t = dir.join(tid.to_string());
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn vcpus_are_left_out_and_pinning_is_applied_once_per_change() {
        let dir = fake_tree("pin", &[(10, "pvmm"), (11, "vcpu0"), (12, "pvmm-sched")]);
        let mut own = OwnThreads::in_dir(dir.clone(), vec![11]);
        let names: Vec<String> = own.list().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["pvmm", "pvmm-sched"]);
        let mut exec = RecordingExecutor::new();
        let p0 = CpuSet::range(0, 1);
        assert_eq!(own.pin(&p0, &mut exec), 0);
        assert_eq!(own.pin(&p0, &mut exec), 0);
        assert_eq!(exec.read(10).unwrap(), p0);
        assert_eq!(exec.read(12).unwrap(), p0);
        assert!(exec.read(11).is_err(), "a vCPU thread was pinned");
        let applied = exec.calls().len();
        assert_eq!(applied, 2, "unchanged threads were re-pinned");
        let p1 = CpuSet::range(2, 3);
        own.pin(&p1, &mut exec);
        assert_eq!(exec.read(12).unwrap(), p1);
        assert_eq!(exec.calls().len(), 4);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The kept-open task directory, read again from its start, sees threads that started
    /// and ended since the last pinning.
    #[test]
    fn pinning_follows_threads_started_and_ended_since_the_last_tick() {
        let mut own = OwnThreads::new(vec![]);
        let mut exec = RecordingExecutor::new();
        let cpus = CpuSet::single(0);
        own.pin(&cpus, &mut exec);
        let (up, is_up) = std::sync::mpsc::channel();
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            up.send(unsafe { libc::gettid() }).unwrap();
            finish.recv().ok();
        });
        let tid = is_up.recv().unwrap();
        assert!(exec.read(tid).is_err());
        own.pin(&cpus, &mut exec);
        assert_eq!(exec.read(tid).unwrap(), cpus, "a new thread is pinned");
        assert!(own.pinned.contains(&tid));
        drop(done);
        t.join().unwrap();
        let ended = std::time::Instant::now();
        while own.pinned.contains(&tid) {
            assert!(ended.elapsed() < std::time::Duration::from_secs(5));
            own.pin(&cpus, &mut exec);
        }
    }

    #[test]
    fn this_process_lists_its_own_named_threads() {
        let own = OwnThreads::new(vec![]);
        let (up, is_up) = std::sync::mpsc::channel();
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("own-test".into())
            .spawn(move || {
                // The name is set by the thread itself as it starts.
                up.send(()).unwrap();
                finish.recv().ok();
            })
            .unwrap();
        is_up.recv().unwrap();
        let names: Vec<String> = own.list().into_iter().map(|t| t.name).collect();
        drop(done);
        t.join().unwrap();
        assert!(names.iter().any(|n| n == "own-test"), "{names:?}");
    }
}
