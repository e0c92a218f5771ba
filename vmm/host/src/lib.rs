//! `pvmm-host`: one placement engine for every VM on the host.
//!
//! Each pvmm process places only its own vCPUs, so two of them under `powersaving` both pick
//! the lowest package and its lowest CPUs and stack their busy vCPUs there. The daemon runs
//! the same [`Engine`](pvmm_scheduler::Engine) as pvmm and `pvmm-sim`, over the vCPUs of all VMs at once: pvmm VMs
//! found by their control sockets in the runtime directory, and (with `--adopt auto`) VMs of
//! other VMMs found by their KVM vCPU file descriptors ([`discover`], [`members`]).
//!
//! Every tick: discover, read each vCPU's utilization (every VM's vCPU threads from `/proc`;
//! a pvmm VM is asked for its threads once, when it joins), decide, apply (pvmm VMs through
//! `PUT /v1/placement/external`, which renews their lease; foreign VMs by thread affinity),
//! pin foreign VMMs' housekeeping threads to the active packages, and report. A daemon that
//! dies leaves pvmm VMs to their lease: they place themselves again. One that is told to stop
//! (SIGTERM, SIGINT) hands placement back and restores foreign threads' affinity first.
//!
//! This module holds the daemon ([`HostDaemon`]: its lock, its loop, its stop); the loop's
//! members over every VM are `host_members`, each VM a [`members::Member`], each thread's
//! bookkeeping a [`threads::ThreadRecord`], and each tick's snapshot [`status`].

pub mod cgroup;
pub mod cli;
pub mod command;
pub mod discover;
pub mod energy;
mod host_members;
pub mod members;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod qmp;
pub mod status;
pub mod threads;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pvmm_api::stats::TickUs;
use pvmm_scheduler::{
    EngineConfig, Executor, HostTopology, LinuxExecutor, PlacementPolicy, Policy,
};
use pvmm_tick::hotplug::OnlineCpus;
use pvmm_tick::{PhaseClock, Tick};

use self::discover::Roots;
use self::host_members::HostMembers;
use self::status::tick_us;

/// The lock file in the runtime directory that keeps a second daemon out.
pub const LOCK_FILE: &str = "pvmm-host.lock";
/// The daemon's own socket in the runtime directory (`GET /v1/host`, `GET /metrics`; what
/// `pvmm-host status` reads). Not `*.sock`, which names pvmm VMs.
pub const STATUS_SOCKET: &str = "pvmm-host.api";

/// What the daemon is asked to do.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The balancing policy.
    pub policy: Policy,
    /// The host CPUs it places on (topology restricted to `--cpus`).
    pub topology: HostTopology,
    /// Placement period.
    pub tick: Duration,
    /// Packing policies: vCPUs share their package's CPUs in use
    /// (`pvmm_scheduler::EngineConfig::share_package`).
    pub share_package: bool,
    /// Where pvmm control sockets are.
    pub runtime_dir: PathBuf,
    /// Whether to adopt VMs of other VMMs.
    pub adopt: bool,
    /// Where `/proc` and debugfs are.
    pub roots: Roots,
    /// Log on stderr each VM that joins or leaves, and each decision that moves vCPUs.
    pub verbose: bool,
    /// Serve `GET /metrics` (Prometheus text) over TCP here.
    pub metrics: Option<std::net::SocketAddr>,
}

impl HostConfig {
    /// The engine's settings: its defaults, with the sharing asked for.
    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            share_package: self.share_package,
            ..EngineConfig::default()
        }
    }
}

/// Errors that stop the daemon before it runs.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Another daemon holds the runtime directory.
    #[error("{0}: another pvmm-host is running on this runtime directory")]
    AlreadyRunning(PathBuf),
    /// The runtime directory or lock file is unusable.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Error.
        source: std::io::Error,
    },
}

/// Set by SIGTERM and SIGINT: stop at the end of the tick.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP.store(true, Ordering::Relaxed);
}

/// The daemon: the placement loop ([`Tick`], the loop pvmm and `pvmm-sim` run) over every VM
/// on the host.
pub struct HostDaemon {
    tick: Tick,
    host: HostMembers,
    start: Instant,
    /// The runtime directory's lock, held while the daemon lives.
    _lock: std::fs::File,
}

/// Takes the runtime directory's lock (flock), so that one daemon manages a host.
fn lock(dir: &std::path::Path) -> Result<std::fs::File, HostError> {
    use std::os::unix::io::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let io = |source| HostError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    // SAFETY: flock on a file descriptor this function owns; the result is checked.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(HostError::AlreadyRunning(path));
    }
    Ok(file)
}

impl HostDaemon {
    /// A daemon for `config`, holding its runtime directory's lock, writing a JSON line per
    /// tick to `stats`.
    pub fn new(config: HostConfig, stats: Option<Box<dyn Write>>) -> Result<Self, HostError> {
        Self::with_executor(config, stats, Box::new(LinuxExecutor))
    }

    /// [`HostDaemon::new`] applying affinity through `executor` (a recording one in tests and
    /// the scale benchmark).
    pub fn with_executor(
        config: HostConfig,
        stats: Option<Box<dyn Write>>,
        executor: Box<dyn Executor>,
    ) -> Result<Self, HostError> {
        let lock = lock(&config.runtime_dir)?;
        let mut tick = Tick::new(
            PlacementPolicy::Managed(config.policy),
            config.topology.clone(),
            config.engine_config(),
            PhaseClock::Wall,
        );
        if let Some(online) =
            OnlineCpus::watch(config.topology.clone(), config.roots.cpu_online.clone())
        {
            tick = tick.with_online_cpus(online, "pvmm-host");
        }
        Ok(Self {
            tick,
            host: HostMembers::new(config, stats, executor),
            start: Instant::now(),
            _lock: lock,
        })
    }

    /// Where the last tick's time went.
    pub fn last_cost(&self) -> TickUs {
        tick_us(&self.tick.totals().last)
    }

    /// VMs and vCPUs managed at the last tick.
    pub fn managed(&self) -> (usize, usize) {
        self.host.managed()
    }

    /// One tick of the placement loop over every VM: discover, read, decide, apply, report.
    pub fn tick(&mut self) -> Result<(), String> {
        // u64 nanoseconds last 584 years.
        #[allow(clippy::cast_possible_truncation)]
        let now_ns = self.start.elapsed().as_nanos() as u64;
        self.tick
            .run(now_ns, &mut self.host)
            .map_err(|e| format!("placement engine: {e}"))?;
        Ok(())
    }

    /// Hands placement back: each pvmm VM to its own policy, each foreign thread to the
    /// affinity it had before.
    pub fn release(&mut self) {
        self.host.release();
    }

    /// Ticks until SIGTERM or SIGINT, then releases everything.
    pub fn run(&mut self) -> Result<(), String> {
        for signal in [libc::SIGTERM, libc::SIGINT] {
            vmm_sys_util::signal::register_signal_handler(signal, on_stop)
                .map_err(|e| format!("signal handler: {e}"))?;
        }
        self.host.serve()?;
        let mut next = Instant::now();
        while !STOP.load(Ordering::Relaxed) {
            self.tick()?;
            next += self.host.config().tick;
            // std's sleep resumes after a signal; a stop waits out at most one tick.
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        self.release();
        let _ = std::fs::remove_file(self.host.config().runtime_dir.join(STATUS_SOCKET));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
