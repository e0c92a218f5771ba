//! Applying a placement: set and read the CPU affinity of vCPU threads.

use std::collections::BTreeMap;
use std::io;

use thiserror::Error;

use crate::cpuset::{CpuSet, MAX_CPU_ID};

/// Errors applying or reading an affinity.
#[derive(Debug, Error)]
pub enum ExecutorError {
    /// An empty CPU set cannot be an affinity.
    #[error("refusing to set an empty CPU affinity for thread {tid}")]
    EmptySet {
        /// The thread.
        tid: i32,
    },
    /// The kernel refused (no such thread, CPUs not allowed, no permission).
    #[error("{op} for thread {tid} failed: {source}")]
    Os {
        /// `sched_setaffinity` or `sched_getaffinity`.
        op: &'static str,
        /// The thread.
        tid: i32,
        /// The OS error.
        source: io::Error,
    },
    /// The recording executor was asked about a thread it never saw.
    #[error("no affinity recorded for thread {tid}")]
    Unknown {
        /// The thread.
        tid: i32,
    },
}

/// Something that can pin a thread to a set of host CPUs.
pub trait Executor {
    /// Restricts thread `tid` to `cpus`.
    fn apply(&mut self, tid: i32, cpus: &CpuSet) -> Result<(), ExecutorError>;
    /// The CPUs thread `tid` may run on now.
    fn read(&self, tid: i32) -> Result<CpuSet, ExecutorError>;
}

/// Linux implementation over `sched_setaffinity(2)` / `sched_getaffinity(2)`
/// on thread ids (`gettid()`, as the VMM records them for vCPU threads).
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxExecutor;

/// Mask size tried first by `read` (bits): glibc's `CPU_SETSIZE`.
const INITIAL_MASK_BITS: usize = 1024;
/// Masks `apply` builds on the stack (bits); larger CPU ids take a heap buffer.
const STACK_MASK_BITS: usize = 1024;

impl Executor for LinuxExecutor {
    fn apply(&mut self, tid: i32, cpus: &CpuSet) -> Result<(), ExecutorError> {
        let Some(last) = cpus.last() else {
            return Err(ExecutorError::EmptySet { tid });
        };
        let words = (last as usize / 64) + 1;
        // Masks of up to STACK_MASK_BITS CPUs live on the stack: placing allocates nothing.
        let mut on_stack = [0u64; STACK_MASK_BITS / 64];
        let mut on_heap = Vec::new();
        let mask: &mut [u64] = if words <= on_stack.len() {
            &mut on_stack[..words]
        } else {
            on_heap.resize(words, 0);
            &mut on_heap
        };
        for cpu in cpus {
            mask[cpu as usize / 64] |= 1u64 << (cpu % 64);
        }
        // SAFETY: `mask` is a live buffer of exactly the size passed; the kernel
        // reads that many bytes as a CPU bitmap (LSB-first per word, which is
        // its layout on little- and big-endian for unsigned long words).
        let rc = unsafe {
            libc::sched_setaffinity(
                tid,
                std::mem::size_of_val(mask),
                mask.as_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        if rc != 0 {
            return Err(ExecutorError::Os {
                op: "sched_setaffinity",
                tid,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    fn read(&self, tid: i32) -> Result<CpuSet, ExecutorError> {
        let mut bits = INITIAL_MASK_BITS;
        loop {
            let mut mask = vec![0u64; bits / 64];
            // SAFETY: `mask` is a live, writable buffer of the size passed.
            let rc = unsafe {
                libc::sched_getaffinity(
                    tid,
                    mask.len() * std::mem::size_of::<u64>(),
                    mask.as_mut_ptr().cast::<libc::cpu_set_t>(),
                )
            };
            if rc == 0 {
                let mut set = CpuSet::new();
                for (w, word) in mask.iter().enumerate() {
                    // The mask grows to at most twice MAX_CPU_ID bits: its CPUs fit a u32.
                    #[allow(clippy::cast_possible_truncation)]
                    let base = w as u32 * 64;
                    let mut rest = *word;
                    while rest != 0 {
                        let bit = rest.trailing_zeros();
                        rest &= rest - 1;
                        set.insert(base + bit);
                    }
                }
                return Ok(set);
            }
            let err = io::Error::last_os_error();
            // EINVAL: the buffer is smaller than the kernel's cpumask; grow it.
            if err.raw_os_error() == Some(libc::EINVAL) && bits <= MAX_CPU_ID as usize {
                bits *= 2;
                continue;
            }
            return Err(ExecutorError::Os {
                op: "sched_getaffinity",
                tid,
                source: err,
            });
        }
    }
}

/// Records every `apply` and answers `read` from what it recorded: for tests
/// and the simulator.
#[derive(Debug, Clone, Default)]
pub struct RecordingExecutor {
    calls: Vec<(i32, CpuSet)>,
    current: BTreeMap<i32, CpuSet>,
}

impl RecordingExecutor {
    /// An executor with nothing recorded.
    pub fn new() -> Self {
        RecordingExecutor::default()
    }

    /// Every `apply` call in order.
    pub fn calls(&self) -> &[(i32, CpuSet)] {
        &self.calls
    }

    /// The latest affinity of each thread.
    pub fn current(&self) -> &BTreeMap<i32, CpuSet> {
        &self.current
    }

    /// Forgets the recorded calls (keeps the current affinities).
    pub fn clear_calls(&mut self) {
        self.calls.clear();
    }
}

impl Executor for RecordingExecutor {
    fn apply(&mut self, tid: i32, cpus: &CpuSet) -> Result<(), ExecutorError> {
        if cpus.is_empty() {
            return Err(ExecutorError::EmptySet { tid });
        }
        self.calls.push((tid, cpus.clone()));
        self.current.insert(tid, cpus.clone());
        Ok(())
    }

    fn read(&self, tid: i32) -> Result<CpuSet, ExecutorError> {
        self.current
            .get(&tid)
            .cloned()
            .ok_or(ExecutorError::Unknown { tid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_executor_records() {
        let mut ex = RecordingExecutor::new();
        ex.apply(7, &CpuSet::single(3)).unwrap();
        ex.apply(7, &"4-5".parse().unwrap()).unwrap();
        assert_eq!(ex.calls().len(), 2);
        assert_eq!(ex.read(7).unwrap().to_string(), "4-5");
        assert!(matches!(ex.read(8), Err(ExecutorError::Unknown { tid: 8 })));
        assert!(matches!(
            ex.apply(7, &CpuSet::new()),
            Err(ExecutorError::EmptySet { .. })
        ));
    }

    #[test]
    fn linux_executor_round_trips_on_this_thread() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let mut ex = LinuxExecutor;
        let original = ex.read(tid).unwrap();
        let first = original.first().unwrap();
        ex.apply(tid, &CpuSet::single(first)).unwrap();
        assert_eq!(ex.read(tid).unwrap(), CpuSet::single(first));
        ex.apply(tid, &original).unwrap();
        assert_eq!(ex.read(tid).unwrap(), original);
        assert!(matches!(
            ex.apply(tid, &CpuSet::new()),
            Err(ExecutorError::EmptySet { .. })
        ));
        // A thread id that cannot exist (above pid_max's hard limit of 2^22).
        assert!(matches!(ex.read(i32::MAX), Err(ExecutorError::Os { .. })));
    }
}
