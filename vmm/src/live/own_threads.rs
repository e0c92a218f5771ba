//! pvmm's own threads (everything but the vCPUs: main, console, scheduler, API): where they
//! may run.
//!
//! A package reaches its deep idle state only when every CPU in it is idle, so a VMM thread
//! that wakes every tick on a package the placement keeps empty costs that package its sleep.
//! pvmm's own threads therefore follow the lowest-numbered package that holds vCPUs. The
//! threads are listed from `/proc/self/task` at each tick rather than registered, so threads
//! a library starts (the API's connection threads) are covered too.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use pvmm_scheduler::{CpuSet, Executor};

/// One of pvmm's own threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnThread {
    /// Linux thread id.
    pub tid: i32,
    /// Its name (`/proc/self/task/<tid>/comm`).
    pub name: String,
}

/// Lists and pins the process's threads other than its vCPUs.
#[derive(Debug)]
pub struct OwnThreads {
    task_dir: PathBuf,
    vcpu_tids: Vec<i32>,
    pinned: HashMap<i32, CpuSet>,
    /// Threads whose affinity the host refused: tried once, not every tick.
    refused: HashSet<i32>,
}

impl OwnThreads {
    /// The threads of this process other than `vcpu_tids`.
    pub fn new(vcpu_tids: Vec<i32>) -> Self {
        Self::in_dir("/proc/self/task".into(), vcpu_tids)
    }

    /// The same, listing threads from `task_dir` (tests point it at a fake tree).
    pub fn in_dir(task_dir: PathBuf, vcpu_tids: Vec<i32>) -> Self {
        Self {
            task_dir,
            vcpu_tids,
            pinned: HashMap::new(),
            refused: HashSet::new(),
        }
    }

    /// The ids of the threads alive now (no names: this runs every tick).
    fn tids(&self) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir(&self.task_dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|tid| !self.vcpu_tids.contains(tid))
            .collect()
    }

    /// The threads alive now, by thread id; a thread that ends while being listed is left out.
    pub fn list(&self) -> Vec<OwnThread> {
        let mut threads: Vec<OwnThread> = self
            .tids()
            .into_iter()
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
        let alive = self.tids();
        self.pinned.retain(|tid, _| alive.contains(tid));
        self.refused.retain(|tid| alive.contains(tid));
        let mut refused = 0;
        for &tid in &alive {
            if self.pinned.get(&tid) == Some(cpus) || self.refused.contains(&tid) {
                continue;
            }
            match executor.apply(tid, cpus) {
                Ok(()) => {
                    self.pinned.insert(tid, cpus.clone());
                }
                Err(_) => {
                    self.refused.insert(tid);
                    refused += 1;
                }
            }
        }
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvmm_scheduler::RecordingExecutor;

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
