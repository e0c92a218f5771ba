//! The lifecycle of a running vCPU thread, seen from both sides.
//!
//! The VMM asks for a state (running, paused, stopped) through a [`VcpuHandle`]; the vCPU
//! thread checks the request before every `KVM_RUN` through its [`RunControl`] and reports the
//! state it reached. A vCPU blocked inside `KVM_RUN` (a halted guest sleeps there for as long
//! as it likes) is got out by a kick: a real-time signal whose handler does nothing, so that
//! `KVM_RUN` returns `EINTR`. A kick that lands just before the thread enters `KVM_RUN` is
//! lost, so the VMM repeats it until the thread reports the state it asked for.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// Offset of the kick signal from `SIGRTMIN`: the first real-time signal, which glibc leaves
/// to applications.
const KICK_SIGNAL_OFFSET: i32 = 0;
/// How long to wait for a kicked thread before kicking it again (the kick may have landed
/// just before `KVM_RUN`).
const KICK_RETRY: Duration = Duration::from_millis(10);

/// The kick signal's number.
pub fn kick_signal() -> i32 {
    SIGRTMIN() + KICK_SIGNAL_OFFSET
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: being delivered is what interrupts KVM_RUN.
}

/// Installs the kick handler for the whole process (once, before vCPU threads start).
pub fn register_kick_handler() -> Result<(), vmm_sys_util::errno::Error> {
    register_signal_handler(kick_signal(), on_kick)
}

/// What a vCPU thread does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RunState {
    /// Running guest code.
    Running = 0,
    /// Not running guest code, waiting (using no CPU) to run again.
    Paused = 1,
    /// Ended: its thread returns and can be joined.
    Stopped = 2,
}

impl RunState {
    fn from_u8(v: u8) -> RunState {
        match v {
            0 => RunState::Running,
            1 => RunState::Paused,
            _ => RunState::Stopped,
        }
    }

    /// The state's name in the API (`running`, `paused`, `stopped`).
    pub fn name(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Stopped => "stopped",
        }
    }
}

/// The state shared by one vCPU thread and the VMM.
#[derive(Debug)]
pub struct RunControl {
    /// What the VMM asked for; read without the lock on every exit from `KVM_RUN`.
    requested: AtomicU8,
    /// What the thread last reached.
    reached: Mutex<RunState>,
    changed: Condvar,
}

impl Default for RunControl {
    fn default() -> Self {
        Self {
            requested: AtomicU8::new(RunState::Running as u8),
            reached: Mutex::new(RunState::Running),
            changed: Condvar::new(),
        }
    }
}

impl RunControl {
    fn reached(&self) -> MutexGuard<'_, RunState> {
        self.reached.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_reached(&self, guard: &mut MutexGuard<'_, RunState>, state: RunState) {
        if **guard != state {
            **guard = state;
            self.changed.notify_all();
        }
    }

    /// The vCPU thread's check before entering the guest: `true` to run, `false` to end the
    /// thread. While a pause is requested it reports `Paused` and sleeps until asked otherwise.
    pub fn may_run(&self) -> bool {
        if self.requested.load(Ordering::Acquire) == RunState::Running as u8 {
            return true;
        }
        let mut reached = self.reached();
        loop {
            match RunState::from_u8(self.requested.load(Ordering::Acquire)) {
                RunState::Running => {
                    self.set_reached(&mut reached, RunState::Running);
                    return true;
                }
                RunState::Stopped => {
                    self.set_reached(&mut reached, RunState::Stopped);
                    return false;
                }
                RunState::Paused => {
                    self.set_reached(&mut reached, RunState::Paused);
                    reached = self
                        .changed
                        .wait(reached)
                        .unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// The vCPU thread ended on its own (the guest ended the VM).
    pub fn thread_ended(&self) {
        let mut reached = self.reached();
        self.set_reached(&mut reached, RunState::Stopped);
    }

    /// Asks for `state`; a thread that has stopped stays stopped.
    fn request(&self, state: RunState) {
        let _guard = self.reached();
        if self.requested.load(Ordering::Acquire) != RunState::Stopped as u8 {
            self.requested.store(state as u8, Ordering::Release);
        }
        // Wake a paused thread so that it sees the new request.
        self.changed.notify_all();
    }

    /// Waits up to `timeout` for the thread to reach `state` (or to stop).
    fn wait_for(&self, state: RunState, timeout: Duration) -> RunState {
        let reached = self.reached();
        let (reached, _) = self
            .changed
            .wait_timeout_while(reached, timeout, |r| *r != state && *r != RunState::Stopped)
            .unwrap_or_else(|p| p.into_inner());
        *reached
    }

    /// The state the thread reached last.
    pub fn state(&self) -> RunState {
        *self.reached()
    }
}

/// The gate vCPU threads wait at between their start and their first `KVM_RUN`, so that the
/// VMM can place them, and confine every thread of its own, before any guest code runs.
/// [`VcpuGate::open`] lets them run; a gate dropped unopened (the VM failed to start) lets
/// them go with a stop request, so that they end without entering the guest.
pub struct VcpuGate {
    barrier: Arc<Barrier>,
    controls: Vec<Arc<RunControl>>,
    opened: bool,
}

impl VcpuGate {
    /// The gate of the threads that run under `controls` and have reached, or are about to
    /// reach, `barrier` (one wait each; the barrier counts them and this gate).
    pub fn new(barrier: Arc<Barrier>, controls: Vec<Arc<RunControl>>) -> Self {
        Self {
            barrier,
            controls,
            opened: false,
        }
    }

    /// Lets the vCPU threads run the guest.
    pub fn open(mut self) {
        self.opened = true;
        self.barrier.wait();
    }
}

impl Drop for VcpuGate {
    fn drop(&mut self) {
        if !self.opened {
            for control in &self.controls {
                control.request(RunState::Stopped);
            }
            self.barrier.wait();
        }
    }
}

/// Errors from driving a vCPU thread.
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    /// The thread did not reach the state in time.
    #[error("vCPU {index} did not become {wanted} within {ms} ms (it is {now})")]
    Timeout {
        /// vCPU index.
        index: u32,
        /// The state asked for.
        wanted: &'static str,
        /// The state it is in.
        now: &'static str,
        /// How long pvmm waited.
        ms: u128,
    },
    /// The thread has ended and cannot run again.
    #[error("vCPU {index} has stopped")]
    Stopped {
        /// vCPU index.
        index: u32,
    },
    /// The kick signal could not be sent.
    #[error("vCPU {index}: cannot signal its thread: {source}")]
    Kick {
        /// vCPU index.
        index: u32,
        /// Error.
        source: vmm_sys_util::errno::Error,
    },
}

/// The VMM's handle on one running vCPU thread.
pub struct VcpuHandle {
    index: u32,
    tid: i32,
    control: std::sync::Arc<RunControl>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl VcpuHandle {
    /// A handle on vCPU `index`'s thread `thread` (Linux thread id `tid`).
    pub fn new(
        index: u32,
        tid: i32,
        control: std::sync::Arc<RunControl>,
        thread: JoinHandle<()>,
    ) -> Self {
        Self {
            index,
            tid,
            control,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// vCPU index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Linux thread id.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// The state the thread reached last.
    pub fn state(&self) -> RunState {
        self.control.state()
    }

    fn kick(&self) -> Result<(), HandleError> {
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        match thread.as_ref() {
            Some(t) if !t.is_finished() => {
                t.kill(kick_signal()).map_err(|source| HandleError::Kick {
                    index: self.index,
                    source,
                })
            }
            // A thread that has returned needs no kick.
            _ => Ok(()),
        }
    }

    /// Asks the thread for `state` and kicks it until it gets there or `timeout` passes.
    pub fn set_state(&self, state: RunState, timeout: Duration) -> Result<(), HandleError> {
        self.control.request(state);
        let deadline = Instant::now() + timeout;
        loop {
            self.kick()?;
            let now = self.control.wait_for(state, KICK_RETRY);
            if now == state || (now == RunState::Stopped && state != RunState::Running) {
                return Ok(());
            }
            if now == RunState::Stopped {
                return Err(HandleError::Stopped { index: self.index });
            }
            if Instant::now() >= deadline {
                return Err(HandleError::Timeout {
                    index: self.index,
                    wanted: state.name(),
                    now: now.name(),
                    ms: timeout.as_millis(),
                });
            }
        }
    }

    /// Joins the thread once it has stopped (a no-op for a thread already joined).
    pub fn join(&self) {
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            // A vCPU thread that panicked has nothing more to report.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A stand-in vCPU loop: "runs" by sleeping in short slices, as a vCPU in KVM_RUN would
    /// until an exit, and checks the control between slices.
    fn fake_vcpu(control: Arc<RunControl>) -> JoinHandle<()> {
        std::thread::spawn(move || {
            while control.may_run() {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    }

    #[test]
    fn pause_resume_stop_and_join() {
        register_kick_handler().unwrap();
        let control = Arc::new(RunControl::default());
        let h = VcpuHandle::new(0, 0, control.clone(), fake_vcpu(control.clone()));
        let t = Duration::from_secs(5);
        assert_eq!(h.state(), RunState::Running);
        h.set_state(RunState::Paused, t).unwrap();
        assert_eq!(h.state(), RunState::Paused);
        h.set_state(RunState::Running, t).unwrap();
        assert_eq!(h.state(), RunState::Running);
        h.set_state(RunState::Stopped, t).unwrap();
        assert_eq!(h.state(), RunState::Stopped);
        h.join();
        h.join();
        // A stopped thread stays stopped: asking it to run fails, it does not restart.
        let err = h.set_state(RunState::Running, Duration::from_millis(30));
        assert!(matches!(err, Err(HandleError::Stopped { .. })), "{err:?}");
    }

    #[test]
    fn a_thread_that_ended_on_its_own_counts_as_stopped() {
        let control = Arc::new(RunControl::default());
        let c = control.clone();
        let thread = std::thread::spawn(move || c.thread_ended());
        let h = VcpuHandle::new(1, 0, control, thread);
        h.join();
        assert_eq!(h.state(), RunState::Stopped);
        h.set_state(RunState::Paused, Duration::from_millis(50))
            .unwrap();
        h.set_state(RunState::Stopped, Duration::from_millis(50))
            .unwrap();
    }

    /// Two stand-in vCPU threads at a gate; returns the gate and, per thread, whether it
    /// would have entered the guest.
    fn gated_threads() -> (VcpuGate, Vec<JoinHandle<bool>>) {
        let barrier = Arc::new(Barrier::new(3));
        let controls: Vec<_> = (0..2).map(|_| Arc::new(RunControl::default())).collect();
        let threads = controls
            .iter()
            .map(|c| {
                let (c, b) = (c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    c.may_run()
                })
            })
            .collect();
        (VcpuGate::new(barrier, controls), threads)
    }

    #[test]
    fn an_opened_gate_lets_the_vcpus_run_and_a_dropped_one_stops_them_first() {
        let (gate, threads) = gated_threads();
        gate.open();
        for t in threads {
            assert!(
                t.join().unwrap(),
                "an opened gate let a vCPU through stopped"
            );
        }
        let (gate, threads) = gated_threads();
        drop(gate);
        for t in threads {
            assert!(
                !t.join().unwrap(),
                "a vCPU entered the guest of a VM that failed to start"
            );
        }
    }
}
