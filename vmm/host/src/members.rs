//! The VMs a host daemon manages, and how each kind is read and placed.
//!
//! - A pvmm VM is read through its control socket (`GET /v1/placement`: each vCPU's utilization
//!   from pvmm's own idle signal, which includes KVM's halt statistics) and placed through it
//!   (`PUT /v1/placement/external`, which also publishes the capacities to the guest through
//!   CPPC and renews the lease), sent when the assignments change and, unchanged, once a
//!   third of the lease has passed. pvmm keeps its own threads with its vCPUs.
//! - A foreign VM is read from `/proc` (each vCPU thread's schedstat: time wanted on a CPU;
//!   the rest is time blocked in the guest's halts) and placed by thread affinity; its other
//!   threads are housekeeping, pinned to the active packages. Affinity is all such a VM gets:
//!   it has no CPPC registers pvmm could serve.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::names::pvmm_name;
use pvmm_api::messages::{AssignmentBody, ExternalBody, VmInfo};
use pvmm_api::stats::{share_of_1024, VmStats};
use pvmm_scheduler::{CpuSet, IdleSample, LoadTracker, UtilConfig};
use serde_json::Value;

use super::discover::{
    parse_process_ran_ns, process_stat_path, schedstat_path, thread_ids, ForeignVm,
};
use pvmm_api::client::Connection;
use pvmm_tick::procfs::{parse_schedstat, ProcFile};

/// One vCPU of a managed VM, as read at this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberVcpu {
    /// vCPU index.
    pub vcpu: u32,
    /// Its thread.
    pub tid: i32,
    /// Decayed utilization, 0..=1024.
    pub util: u32,
    /// Ran at least half of the last tick.
    pub busy: bool,
    /// The part of `util` spent waiting for a host CPU, 0..=1024.
    pub waited: u32,
    /// The CPUs its VMM reports it placed on (pvmm VMs; None for others, whose threads'
    /// affinity is read from `/proc`).
    pub cpus: Option<CpuSet>,
}

/// Errors reading or placing a member.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The pvmm's control socket could not be used (the VM may have ended).
    #[error("{socket}: {why}")]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// What failed.
        why: String,
    },
}

/// A pvmm VM joined through its control socket.
#[derive(Debug)]
pub struct PvmmMember {
    /// Its control socket.
    pub socket: PathBuf,
    /// Its pid.
    pub pid: i32,
    /// Its stable name ([`crate::names`]).
    pub name: String,
    /// The connection kept open to it: its requests cost no connection, and pvmm no thread,
    /// each.
    conn: Connection,
    /// How long its placement holds without a renewal (`--external-lease-ms`).
    lease: Duration,
    /// The assignments last sent and when, while pvmm reports them held.
    sent: Option<(Vec<VcpuPlacement>, Instant)>,
}

/// One vCPU's placement as sent: (vCPU, CPUs, capacity).
pub type VcpuPlacement = (u32, CpuSet, u32);

/// Unchanged assignments are sent again once this fraction of the lease has passed: the
/// request costs both the daemon and pvmm a turn each, so it is not sent every tick, and at a
/// third two more renewals fit in the lease, so one slow tick or one failed request does not
/// hand the VM back to its own policy.
pub const RENEWALS_PER_LEASE: u32 = 3;

fn call(
    conn: &mut Connection,
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Value, MemberError> {
    let err = |why: String| MemberError::Socket {
        socket: socket.to_path_buf(),
        why,
    };
    let answer = conn
        .request(method, path, body)
        .map_err(|e| err(e.to_string()))?;
    if answer.status >= 300 {
        return Err(err(format!(
            "{method} {path}: {} {}",
            answer.status, answer.body
        )));
    }
    Ok(answer.body)
}

impl PvmmMember {
    /// Joins the pvmm serving `socket`.
    pub fn join(socket: &Path) -> Result<Self, MemberError> {
        let mut conn = Connection::new(socket);
        let vm = call(&mut conn, socket, "GET", "/v1/vm", None)?;
        let info: VmInfo = serde_json::from_value(vm).map_err(|e| MemberError::Socket {
            socket: socket.to_path_buf(),
            why: format!("GET /v1/vm: {e}"),
        })?;
        Ok(Self {
            socket: socket.to_path_buf(),
            pid: info.pid,
            name: pvmm_name(info.name.as_deref(), socket),
            conn,
            lease: Duration::from_millis(info.external_lease_ms),
            sent: None,
        })
    }

    /// Its vCPUs now, from its latest tick (`GET /v1/placement`, the `--stats` snapshot: no
    /// `/proc` reading in pvmm per request, which `GET /v1/vcpus` does to list its threads).
    /// None before pvmm's first tick.
    pub fn read(&mut self) -> Result<Vec<MemberVcpu>, MemberError> {
        let answer = self
            .conn
            .request("GET", "/v1/placement", None)
            .map_err(|e| MemberError::Socket {
                socket: self.socket.clone(),
                why: e.to_string(),
            })?;
        let body = match answer.status {
            200 => answer.body,
            // No tick has run yet: no vCPUs to place this tick.
            503 => return Ok(Vec::new()),
            status => {
                return Err(MemberError::Socket {
                    socket: self.socket.clone(),
                    why: format!("GET /v1/placement: {status} {}", answer.body),
                })
            }
        };
        let stats: VmStats = serde_json::from_value(body).map_err(|e| MemberError::Socket {
            socket: self.socket.clone(),
            why: format!("GET /v1/placement: {e}"),
        })?;
        if !stats.external {
            // Its placement is its own again (the lease lapsed, or someone released it): the
            // next assignments are sent whatever they are.
            self.sent = None;
        }
        Ok(stats
            .vcpus
            .into_iter()
            .map(|v| MemberVcpu {
                vcpu: v.vcpu,
                tid: v.tid,
                util: share_of_1024(v.util),
                busy: v.busy,
                waited: share_of_1024(v.waited),
                cpus: Some(v.cpus),
            })
            .collect())
    }

    /// Places its vCPUs (and renews the lease): sends `assignments` when they differ from the
    /// last sent or a [`RENEWALS_PER_LEASE`]th of the lease has passed since.
    pub fn place(&mut self, assignments: &[VcpuPlacement]) -> Result<(), MemberError> {
        let now = Instant::now();
        if let Some((sent, at)) = &self.sent {
            let fresh = now.saturating_duration_since(*at) < self.lease / RENEWALS_PER_LEASE;
            if fresh && sent.as_slice() == assignments {
                return Ok(());
            }
        }
        let body = ExternalBody {
            assignments: assignments
                .iter()
                .map(|(vcpu, cpus, capacity)| AssignmentBody {
                    vcpu: *vcpu,
                    cpus: cpus.to_string(),
                    capacity: *capacity,
                })
                .collect(),
        };
        let body = serde_json::to_string(&body).map_err(|e| MemberError::Socket {
            socket: self.socket.clone(),
            why: format!("PUT /v1/placement/external: {e}"),
        })?;
        self.sent = None;
        call(
            &mut self.conn,
            &self.socket,
            "PUT",
            "/v1/placement/external",
            Some(&body),
        )?;
        self.sent = Some((assignments.to_vec(), now));
        Ok(())
    }

    /// Hands placement back to the pvmm's own policy.
    pub fn release(&mut self) -> Result<(), MemberError> {
        self.sent = None;
        call(
            &mut self.conn,
            &self.socket,
            "DELETE",
            "/v1/placement/external",
            None,
        )
        .map(|_| ())
    }
}

/// A vCPU whose decayed utilization is at least this (of 1024) is read every tick: it may be
/// running or just stopped, and its utilization must follow it. Below it the vCPU is idle and
/// read only when its process's CPU time says that something other than the watched vCPUs
/// ran, or every [`IDLE_REREAD_TICKS`]. 32 is 3 % of a CPU: a value the engine treats as idle.
const WATCH_UTIL: u32 = 32;
/// An idle vCPU is read at least every this many ticks (1 s at the default tick), so that its
/// utilization keeps decaying and a wake-up too small to show in the process's CPU time is
/// still seen. The reads are staggered over vCPU indices, to spread their cost over ticks.
const IDLE_REREAD_TICKS: u64 = 10;
/// The idle vCPUs of a process are all read at once when it ran, since the last read, at
/// least this share of the elapsed time beyond what its watched vCPUs ran: a quarter of a
/// CPU is more than its housekeeping threads take, and a vCPU that wakes to run takes more.
/// `/proc/<pid>/stat` counts in clock ticks (10 ms), so one stray tick never triggers it at
/// the default 100 ms tick.
const WAKE_SHARE_DIVISOR: u64 = 4;

/// Per-vCPU utilization tracking of a foreign VM.
#[derive(Debug)]
struct ForeignVcpu {
    tid: i32,
    /// Its thread's `schedstat`, kept open.
    schedstat: ProcFile,
    tracker: LoadTracker,
    /// The counters at adoption.
    origin: Option<Origin>,
    /// Its last reading.
    last: Option<LastRead>,
}

/// A foreign vCPU's counters at adoption: its readings count from them.
#[derive(Debug, Clone, Copy)]
struct Origin {
    /// Time wanted on a CPU (running or waiting).
    wanted: u64,
    /// Time waiting for one.
    waited: u64,
    /// When.
    t_ns: u64,
}

/// What a vCPU's last reading found.
#[derive(Debug, Clone, Copy)]
struct LastRead {
    /// The member's read count then.
    read: u64,
    /// When.
    t_ns: u64,
    /// Demand since the origin, as fed to the tracker.
    busy_ns: u64,
    /// The part of it spent waiting for a CPU.
    waited_ns: u64,
    /// Run time (schedstat's first field).
    ran_ns: u64,
}

impl ForeignVcpu {
    /// Reads the thread at `now_ns` (the member's read number `read`); its run time since the
    /// previous read when that was the member's read `read - 1`.
    ///
    /// After reads it was skipped in, the vCPU was idle as far as its process's CPU time could
    /// tell, so the demand it shows now is placed at the end of the interval: idle first, then
    /// busy. Spread over the whole interval, a vCPU that just woke would read as a fraction of
    /// what it now runs.
    fn read(&mut self, now_ns: u64, read: u64) -> Option<u64> {
        let (wanted, ran_ns) = parse_schedstat(self.schedstat.read()?)?;
        let waiting = wanted.saturating_sub(ran_ns);
        let origin = *self.origin.get_or_insert(Origin {
            wanted,
            waited: waiting,
            t_ns: now_ns,
        });
        let elapsed = now_ns.saturating_sub(origin.t_ns);
        let busy_ns = wanted.saturating_sub(origin.wanted).min(elapsed);
        let waited_ns = waiting.saturating_sub(origin.waited).min(busy_ns);
        if let Some(last) = self.last.filter(|l| l.read + 1 < read && l.t_ns < now_ns) {
            let recent = busy_ns.saturating_sub(last.busy_ns).min(now_ns - last.t_ns);
            let idle_until = now_ns - recent;
            self.tracker.update(
                IdleSample {
                    t_ns: idle_until,
                    busy_ns: last.busy_ns,
                    idle_ns: idle_until
                        .saturating_sub(origin.t_ns)
                        .saturating_sub(last.busy_ns),
                },
                last.waited_ns,
            );
        }
        self.tracker.update(
            IdleSample {
                t_ns: now_ns,
                busy_ns,
                idle_ns: elapsed - busy_ns,
            },
            waited_ns,
        );
        let previous = self.last.replace(LastRead {
            read,
            t_ns: now_ns,
            busy_ns,
            waited_ns,
            ran_ns,
        });
        previous
            .filter(|l| l.read + 1 == read)
            .map(|l| ran_ns.saturating_sub(l.ran_ns))
    }

    fn watched(&self) -> bool {
        self.origin.is_none()
            || self.tracker.util().util() >= WATCH_UTIL
            || self.tracker.util().is_busy()
    }
}

/// A VM of another VMM, adopted from `/proc`.
#[derive(Debug)]
pub struct ForeignMember {
    /// What discovery found.
    pub found: ForeignVm,
    vcpus: BTreeMap<u32, ForeignVcpu>,
    /// Every thread of the process at the last discovery, sorted.
    threads: Vec<i32>,
    /// Reads so far.
    reads: u64,
    /// The process's CPU time at the last read, and when.
    process_ran: Option<(u64, u64)>,
    /// Its `stat`, kept open.
    stat: ProcFile,
}

impl ForeignMember {
    /// Adopts `found`, whose threads are read from `proc`.
    pub fn adopt(found: ForeignVm, proc: &Path) -> Self {
        let mut m = Self {
            found: ForeignVm {
                vcpu_tids: BTreeMap::new(),
                ..found.clone()
            },
            vcpus: BTreeMap::new(),
            threads: Vec::new(),
            reads: 0,
            process_ran: None,
            stat: ProcFile::new(process_stat_path(proc, found.pid)),
        };
        m.update(found, proc);
        m
    }

    /// Takes a fresh discovery of the same process (vCPU threads may come and go).
    pub fn update(&mut self, found: ForeignVm, proc: &Path) {
        self.vcpus
            .retain(|n, v| found.vcpu_tids.get(n) == Some(&v.tid));
        for (&n, &tid) in &found.vcpu_tids {
            self.vcpus.entry(n).or_insert_with(|| ForeignVcpu {
                tid,
                schedstat: ProcFile::new(schedstat_path(proc, found.pid, tid)),
                tracker: LoadTracker::new(UtilConfig::default()),
                origin: None,
                last: None,
            });
        }
        self.threads = sorted_thread_ids(proc, found.pid);
        self.found = found;
    }

    /// Whether the process's threads are still those of the last discovery: then its vCPU
    /// mapping holds, and discovery need not examine its file descriptors again.
    pub fn unchanged(&self, proc: &Path) -> bool {
        sorted_thread_ids(proc, self.found.pid) == self.threads
    }

    /// Samples the vCPU threads' demand at `now_ns` and returns the vCPUs. Watched vCPUs are
    /// read every time; idle ones when the process's CPU time shows unexplained running, or
    /// in their turn every `IDLE_REREAD_TICKS`.
    pub fn read(&mut self, now_ns: u64) -> Vec<MemberVcpu> {
        self.reads += 1;
        let read = self.reads;
        let mut explained = 0u64;
        let mut deferred = Vec::new();
        for (&vcpu, v) in &mut self.vcpus {
            if v.watched() || (read + u64::from(vcpu)).is_multiple_of(IDLE_REREAD_TICKS) {
                explained += v.read(now_ns, read).unwrap_or(0);
            } else {
                deferred.push(vcpu);
            }
        }
        // With every vCPU read already, the process's CPU time has nothing to decide (and the
        // next tick that defers one reads everything once, for want of a baseline).
        let process = if deferred.is_empty() {
            None
        } else {
            self.stat
                .read()
                .and_then(parse_process_ran_ns)
                .map(|ran| (ran, now_ns))
        };
        let woke = match (self.process_ran, process) {
            (Some((ran0, t0)), Some((ran1, t1))) => {
                let unexplained = ran1.saturating_sub(ran0).saturating_sub(explained);
                unexplained >= t1.saturating_sub(t0) / WAKE_SHARE_DIVISOR
            }
            // No reading to compare with: read everything.
            _ => true,
        };
        self.process_ran = process;
        if woke {
            for vcpu in deferred {
                if let Some(v) = self.vcpus.get_mut(&vcpu) {
                    v.read(now_ns, read);
                }
            }
        }
        self.vcpus
            .iter()
            .map(|(&vcpu, v)| MemberVcpu {
                vcpu,
                tid: v.tid,
                util: v.tracker.util().util(),
                busy: v.tracker.util().is_busy(),
                waited: v.tracker.waited(),
                cpus: None,
            })
            .collect()
    }

    /// Its threads that are not vCPUs (the VMM's main loop, I/O and worker threads), as of
    /// the last discovery.
    pub fn housekeeping(&self) -> Vec<i32> {
        self.threads
            .iter()
            .copied()
            .filter(|tid| !self.found.vcpu_tids.values().any(|t| t == tid))
            .collect()
    }
}

fn sorted_thread_ids(proc: &Path, pid: i32) -> Vec<i32> {
    let mut tids = thread_ids(proc, pid);
    tids.sort_unstable();
    tids
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::super::discover::fake::FakeHost;
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::mpsc;

    /// A pvmm's control socket that answers `GET /v1/vm` with `lease_ms` and any other request
    /// with `{}`, sending each request's method and path to the test.
    fn fake_pvmm(name: &str, lease_ms: u64) -> (PathBuf, mpsc::Receiver<String>) {
        let dir = std::env::temp_dir().join(format!("pvmm-host-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("vm.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let info = VmInfo {
            external_placement: false,
            external_lease_ms: lease_ms,
            kernel: "k".into(),
            memory_mib: 64,
            name: None,
            pid: 1,
            policy: Default::default(),
            power_button_listening: false,
            state: "running".into(),
            uptime_ms: 0,
            vcpus: 2,
        };
        let info = serde_json::to_string(&info).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut reader = BufReader::new(stream.unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    let request = line.trim().rsplit_once(' ').unwrap().0.to_string();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some(v) = header.to_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    reader.read_exact(&mut vec![0; length]).unwrap();
                    // Sent before the answer, so the client has it once answered.
                    let _ = tx.send(request.clone());
                    let body = if request == "GET /v1/vm" {
                        info.as_str()
                    } else {
                        "{}"
                    };
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{body}",
                        body.len()
                    );
                    reader.get_mut().write_all(answer.as_bytes()).unwrap();
                    line.clear();
                }
            }
        });
        (socket, rx)
    }

    #[test]
    fn unchanged_assignments_are_sent_again_only_once_a_part_of_the_lease_has_passed() {
        let lease = Duration::from_millis(600);
        let (socket, requests) = fake_pvmm("renewals", lease.as_millis() as u64);
        let mut member = PvmmMember::join(&socket).unwrap();
        assert_eq!(requests.recv().unwrap(), "GET /v1/vm");
        assert_eq!(member.lease, lease);
        let placed = |cpus: &str| vec![(0, cpus.parse::<CpuSet>().unwrap(), 1024)];
        let sent = |member: &mut PvmmMember, list: &[VcpuPlacement]| {
            member.place(list).unwrap();
            requests.try_iter().count()
        };
        assert_eq!(sent(&mut member, &placed("0")), 1, "the first placement");
        assert_eq!(
            sent(&mut member, &placed("0")),
            0,
            "unchanged, within the lease's part"
        );
        assert_eq!(sent(&mut member, &placed("1")), 1, "changed");
        std::thread::sleep(lease / RENEWALS_PER_LEASE);
        assert_eq!(sent(&mut member, &placed("1")), 1, "renewed");
        assert_eq!(sent(&mut member, &placed("1")), 0);
        member.release().unwrap();
        assert_eq!(requests.recv().unwrap(), "DELETE /v1/placement/external");
        assert_eq!(
            sent(&mut member, &placed("1")),
            1,
            "placed again after a release"
        );
    }

    #[test]
    fn a_foreign_vm_follows_its_threads_and_reads_their_demand() {
        let host = FakeHost::new("members");
        host.process(
            50,
            &[(50, "qemu"), (51, "CPU 0/KVM"), (52, "CPU 1/KVM")],
            &[
                (3, "anon_inode:kvm-vm"),
                (4, "anon_inode:kvm-vcpu:0"),
                (5, "anon_inode:kvm-vcpu:1"),
            ],
        );
        let schedstat = |tid: i32, ns: u64| {
            let d = host.roots.proc.join("50/task").join(tid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("schedstat"), format!("{ns} 0 1\n")).unwrap();
        };
        let found = super::super::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone(), &host.roots.proc);
        assert_eq!(m.housekeeping(), vec![50]);
        // vCPU 0 runs all the time, vCPU 1 never.
        let tick = 100_000_000u64;
        for i in 0..20u64 {
            schedstat(51, i * tick);
            schedstat(52, 0);
            m.read(i * tick);
        }
        schedstat(51, 20 * tick);
        let v = m.read(20 * tick);
        assert!(v[0].util > 900 && v[0].busy, "{v:?}");
        assert!(v[1].util < 50 && !v[1].busy, "{v:?}");
        // vCPU 1's thread went away: it is dropped.
        let mut again = m.found.clone();
        again.vcpu_tids.remove(&1);
        m.update(again, &host.roots.proc);
        assert_eq!(m.read(21 * tick).len(), 1);
    }

    #[test]
    fn a_foreign_vcpu_waiting_for_a_cpu_reports_the_wait_apart() {
        let host = FakeHost::new("members-wait");
        host.process(
            70,
            &[(70, "qemu"), (71, "CPU 0/KVM")],
            &[(3, "anon_inode:kvm-vm"), (4, "anon_inode:kvm-vcpu:0")],
        );
        let found = super::super::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone(), &host.roots.proc);
        let stat = host.roots.proc.join("70/task/71/schedstat");
        // Each 100 ms tick it ran 30 ms and waited 30 ms for a CPU.
        let tick = 100_000_000u64;
        let mut v = Vec::new();
        for i in 0..20u64 {
            std::fs::write(
                &stat,
                format!("{} {} 1\n", i * 3 * tick / 10, i * 3 * tick / 10),
            )
            .unwrap();
            v = m.read(i * tick);
        }
        assert!((v[0].util as i64 - 614).abs() < 10, "{v:?}");
        assert!((v[0].waited as i64 - 307).abs() < 10, "{v:?}");
    }

    #[test]
    fn idle_vcpus_are_read_when_their_process_ran_or_in_their_turn() {
        let host = FakeHost::new("members-idle");
        host.process(
            60,
            &[(60, "qemu"), (61, "CPU 0/KVM"), (62, "CPU 1/KVM")],
            &[
                (3, "anon_inode:kvm-vm"),
                (4, "anon_inode:kvm-vcpu:0"),
                (5, "anon_inode:kvm-vcpu:1"),
            ],
        );
        let proc = host.roots.proc.clone();
        let schedstat = |tid: i32, ns: u64| {
            let d = proc.join("60/task").join(tid.to_string());
            std::fs::write(d.join("schedstat"), format!("{ns} 0 1\n")).unwrap();
        };
        // `comm` with a space and parentheses: fields count from the last ')'.
        let stat = |ns: u64| {
            let ticks = ns * super::super::discover::test_clock_ticks_per_s() / 1_000_000_000;
            let line = format!("60 (qemu (x) y) S 1 60 60 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 4\n");
            std::fs::write(proc.join("60/stat"), line).unwrap();
        };
        let tick = 100_000_000u64;
        schedstat(61, 0);
        schedstat(62, 0);
        stat(0);
        let found = super::super::discover::foreign_vms(&host.roots, &[]);
        let mut m = ForeignMember::adopt(found[0].clone(), &proc);
        for i in 0..5 {
            m.read(i * tick);
        }
        // vCPU 1 runs, but the process's CPU time does not show it yet, and it is not vCPU 1's
        // turn: it is not read, and still idle.
        schedstat(62, tick);
        let v = m.read(5 * tick);
        assert!(v[1].util < WATCH_UTIL, "{v:?}");
        // The process ran a whole tick that vCPU 0 (watched or not) does not explain: every
        // vCPU is read, and vCPU 1's two ticks of running show.
        schedstat(62, 2 * tick);
        stat(2 * tick);
        let v = m.read(6 * tick);
        assert!(v[1].util > 900 && v[1].busy, "{v:?}");
        assert!(v[0].util < WATCH_UTIL && !v[0].busy, "{v:?}");
        // It stops: watched, it is read every tick and its utilization falls at once.
        let busy = v[1].util;
        let v = m.read(7 * tick);
        assert!(v[1].util < busy / 2 && !v[1].busy, "{v:?}");
        // vCPU 0 runs a little, too little for the process's CPU time to tell: read in its
        // turn only, at the member's read 10 (reads count from 1; vCPU 0's turn is every 10th).
        schedstat(61, tick / 50);
        assert_eq!(m.read(8 * tick)[0].util, 0, "read 9");
        schedstat(61, 2 * tick / 50);
        assert!(m.read(9 * tick)[0].util > 0, "read 10");
    }
}
