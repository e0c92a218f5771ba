//! A running VM: waiting for its end, stopping and joining its threads, and answering the
//! control socket ([`VmControl`]).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{never, select, Receiver, Sender};
use pvmm_api::messages::{ShutdownAnswer, ThreadEntry, VcpuEntry, VcpusAnswer, VmInfo};
use pvmm_api::stats::VmStats;
use pvmm_devices::ged::GedShared;

use crate::api::routes::VmShape;
use crate::api::{ApiServer, VmControl};
use crate::config::PlacementPolicy;
use crate::console::ConsoleInput;
use crate::exit::VmExit;
use crate::live::control::{ExternalAssignment, PlacementControl};
use crate::live::scheduler::{LiveScheduler, PlacementTotals};
use crate::signals::SignalThread;
use crate::vmm::VirtioWorkers;
use crate::vstate::handle::{HandleError, RunState, VcpuHandle};
use pvmm_scheduler::HostTopology;
use pvmm_tick::cpustat::CpuTimes;
use pvmm_tick::own_threads::OwnThreads;

/// How long pause, resume and stop wait for each vCPU thread: far longer than a kick takes
/// (microseconds), short enough that a stuck thread is reported rather than waited on.
const VCPU_STATE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the exit summary needs from the live scheduler.
pub struct PlacementReport {
    /// The host topology placed on.
    pub topology: HostTopology,
    /// Running totals.
    pub totals: Arc<Mutex<PlacementTotals>>,
    /// /proc/stat when the guest started.
    pub host_stat_at_start: Vec<(u32, CpuTimes)>,
    /// When the guest started.
    pub started: Instant,
}

/// What a VM was started as, for `GET /v1/vm`.
pub struct VmDescription {
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Guest memory.
    pub memory_mib: u64,
    /// The kernel image booted.
    pub kernel: String,
    /// The name it was given (`--name`).
    pub name: Option<String>,
}

/// The parts of a VM that requests act on; shared by the main thread and the API.
pub struct VmCore {
    /// vCPU threads, in vCPU order.
    pub vcpus: Vec<VcpuHandle>,
    /// Placement requests and the latest snapshot.
    pub control: Arc<PlacementControl>,
    /// The GED, for the power button.
    pub ged: Arc<GedShared>,
    /// `GET /v1/vm`'s fixed part: kernel, memory, vCPU count.
    pub description: VmDescription,
    /// The VM's shape for checking requests.
    pub shape: VmShape,
    /// Where shutdown deadlines go (the main thread waits on them).
    pub deadlines: Sender<Instant>,
    /// The placement report (policy and uptime).
    pub report: PlacementReport,
    /// The current policy as last asked for.
    pub policy: Mutex<PlacementPolicy>,
    /// How long a shutdown waits for the guest to power off (`--shutdown-timeout`).
    pub shutdown_timeout: Duration,
    /// Whether the guest's GED interrupt is unmasked (it listens for the power button); holds
    /// the KVM VM, which outlives every vCPU thread.
    pub ged_listening: Box<dyn Fn() -> bool + Send + Sync>,
}

/// This process's id, as the API reports it.
// Linux pids are at most PID_MAX_LIMIT (2^22): always a positive i32.
#[allow(clippy::cast_possible_wrap)]
fn own_pid() -> i32 {
    std::process::id() as i32
}

impl VmCore {
    fn set_all(&self, state: RunState) -> Result<(), HandleError> {
        for v in &self.vcpus {
            v.set_state(state, VCPU_STATE_TIMEOUT)?;
        }
        Ok(())
    }

    fn state(&self) -> &'static str {
        let paused = self.vcpus.iter().any(|v| v.state() == RunState::Paused);
        if paused {
            RunState::Paused.name()
        } else {
            RunState::Running.name()
        }
    }
}

impl VmControl for VmCore {
    fn shape(&self) -> VmShape {
        self.shape.clone()
    }

    fn info(&self) -> VmInfo {
        let d = &self.description;
        VmInfo {
            external_placement: self.control.external_active(),
            external_lease_ms: u64::try_from(self.control.lease().as_millis()).unwrap_or(u64::MAX),
            kernel: d.kernel.clone(),
            memory_mib: d.memory_mib,
            name: d.name.clone(),
            pid: own_pid(),
            policy: *self.policy.lock().unwrap_or_else(|p| p.into_inner()),
            power_button_listening: (self.ged_listening)(),
            state: self.state().into(),
            uptime_ms: u64::try_from(self.report.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            vcpus: d.vcpus,
        }
    }

    fn placement(&self) -> Option<VmStats> {
        self.control.snapshot()
    }

    fn vcpus(&self) -> VcpusAnswer {
        let placed = self.control.snapshot().map(|s| s.vcpus);
        let vcpus = self
            .vcpus
            .iter()
            .map(|h| {
                let state = h.state().name().to_string();
                let tick = placed.as_ref().and_then(|all| all.get(h.index() as usize));
                match tick {
                    Some(stats) => VcpuEntry::Placed {
                        stats: stats.clone(),
                        state,
                    },
                    None => VcpuEntry::Unplaced {
                        vcpu: h.index(),
                        tid: h.tid(),
                        state,
                    },
                }
            })
            .collect();
        let tids: Vec<i32> = self.vcpus.iter().map(VcpuHandle::tid).collect();
        let threads = OwnThreads::new(tids)
            .list()
            .into_iter()
            .map(|t| ThreadEntry {
                tid: t.tid,
                name: t.name,
            })
            .collect();
        VcpusAnswer { threads, vcpus }
    }

    fn set_policy(&self, policy: PlacementPolicy) {
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
        self.control.request_policy(policy);
    }

    fn set_external(&self, assignments: Vec<ExternalAssignment>) {
        self.control.set_external(assignments);
    }

    fn clear_external(&self) -> bool {
        self.control.clear_external()
    }

    fn pause(&self) -> Result<(), HandleError> {
        self.set_all(RunState::Paused)
    }

    fn resume(&self) -> Result<(), HandleError> {
        self.set_all(RunState::Running)
    }

    fn stop_now(&self) {
        let _ = self.deadlines.send(Instant::now());
    }

    fn shutdown(&self, timeout: Option<Duration>) -> ShutdownAnswer {
        let timeout = timeout.unwrap_or(self.shutdown_timeout);
        // A paused guest cannot answer the power button.
        let _ = self.set_all(RunState::Running);
        let listening = (self.ged_listening)();
        let pressed = listening && self.ged.press_power_button().is_ok();
        let wait = if pressed { timeout } else { Duration::ZERO };
        // The main thread may already be ending the VM; then there is nothing to stop.
        let _ = self.deadlines.send(Instant::now() + wait);
        ShutdownAnswer {
            power_button: pressed,
            stop_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// A running VM and everything that ends with it.
pub struct RunningVm {
    /// The VM's shared core (also the API's view of it).
    pub core: Arc<VmCore>,
    exits: Receiver<VmExit>,
    deadlines: Receiver<Instant>,
    scheduler_stop: Option<Sender<()>>,
    scheduler: Option<JoinHandle<()>>,
    api: Option<ApiServer>,
    signals: SignalThread,
    console: Option<ConsoleInput>,
    virtio: VirtioWorkers,
    // Guest memory outlives the vCPU threads, which are joined before it is dropped.
    _mem: crate::memory::GuestMemory,
}

impl RunningVm {
    /// Assembles a running VM from its started parts.
    pub fn new(
        core: Arc<VmCore>,
        exits: Receiver<VmExit>,
        deadlines: Receiver<Instant>,
        scheduler: (Sender<()>, JoinHandle<()>),
        (api, signals): (Option<ApiServer>, SignalThread),
        (console, virtio): (Option<ConsoleInput>, VirtioWorkers),
        mem: crate::memory::GuestMemory,
    ) -> Self {
        Self {
            core,
            exits,
            deadlines,
            scheduler_stop: Some(scheduler.0),
            scheduler: Some(scheduler.1),
            api,
            signals,
            console,
            virtio,
            _mem: mem,
        }
    }

    /// Blocks until the VM ends (the guest, or a shutdown request whose time ran out) and
    /// says why.
    pub fn wait(&self) -> VmExit {
        let mut deadline: Option<Instant> = None;
        loop {
            let timer = deadline.map_or_else(never, crossbeam::channel::at);
            select! {
                recv(self.exits) -> exit => {
                    return exit.unwrap_or_else(|_| {
                        VmExit::HostError("every vCPU thread ended unexpectedly".into())
                    })
                }
                recv(self.deadlines) -> at => {
                    if let Ok(at) = at {
                        deadline = Some(deadline.map_or(at, |d| d.min(at)));
                    }
                }
                recv(timer) -> _ => return VmExit::Stopped,
            }
        }
    }

    /// Stops the control socket (removing its file), the signal thread and the console-input
    /// thread, then every vCPU, joining its thread, then the scheduler. A vCPU that does not
    /// stop is reported, not waited on forever.
    pub fn stop(&mut self) {
        if let Some(api) = self.api.as_mut() {
            api.stop();
        }
        self.signals.stop();
        if let Some(console) = self.console.as_mut() {
            console.stop();
        }
        for v in &self.core.vcpus {
            match v.set_state(RunState::Stopped, VCPU_STATE_TIMEOUT) {
                Ok(()) => v.join(),
                Err(e) => eprintln!("pvmm: {e}"),
            }
        }
        // No vCPU notifies any more: each device finishes the request it is serving.
        self.virtio.stop();
        drop(self.scheduler_stop.take());
        if let Some(t) = self.scheduler.take() {
            let _ = t.join();
        }
    }

    /// The scheduler's CPU time per tick, by phase (one line, for `-v`).
    pub fn tick_cost(&self) -> String {
        let totals = self.core.report.totals.lock();
        totals.map(|t| t.cost_line()).unwrap_or_default()
    }

    /// The one-line placement summary (migrations, measured package idle share).
    pub fn placement_summary(&self) -> String {
        let p = &self.core.report;
        let totals = p.totals.lock().map(|t| t.clone()).unwrap_or_default();
        let policy = *self.core.policy.lock().unwrap_or_else(|e| e.into_inner());
        LiveScheduler::summary_line(
            policy,
            &p.topology,
            &totals,
            &p.host_stat_at_start,
            p.started.elapsed(),
        )
    }
}
