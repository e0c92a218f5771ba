//! A pvmm VM, joined through its control socket: sampled from `/proc` like any VM, placed by
//! asking pvmm to place itself.
//!
//! At join the daemon asks pvmm twice: `GET /v1/vm` (its pid, name and lease) and
//! `GET /v1/vcpus` (each vCPU's thread). pvmm creates its vCPU threads before it serves its
//! socket and keeps them until it exits, so that mapping holds for the VM's life. From then on
//! the vCPU threads are read from `/proc` by the [`ThreadSampler`] foreign VMs use, and pvmm is
//! asked nothing per tick: the only requests are placements.
//!
//! Placement is sent when the assignments change and, unchanged, once a part of the lease has
//! passed ([`RENEWALS_PER_LEASE`]): pvmm holds it as long as the lease, then places itself
//! again, so a daemon that dies leaves nothing behind. Whether pvmm still honours the
//! placement is known from those answers and from the lease's arithmetic, not from pvmm's
//! stats: a renewal is due at the latest a third of the lease after the last placement taken,
//! so a lease can only lapse when the daemon stopped ticking, and the next tick then sends the
//! placement again whatever it is. A placement refused ([`MemberError::Refused`]) is sent again
//! at the next tick, the member kept and its sampling with it; one unanswered drops the member,
//! which discovery joins again while its socket answers.
//!
//! What `/proc` gives differs from pvmm's own tick in two ways, both accepted for a request-free
//! tick. A vCPU's demand is its thread's schedstat: time KVM spends polling before a halt
//! counts as running there, where pvmm's idle signal (with KVM's halt statistics) counts it
//! idle, so a vCPU that halt-polls reads somewhat busier. And an operator who hands a pvmm's
//! placement back (`DELETE /v1/placement/external`) behind the daemon's back is seen at the
//! next renewal, not at the next tick. The CPUs pvmm placed a vCPU on before the daemon did
//! are its thread's affinity, read like any thread's. The rest of pvmm's stats (its own
//! threads' load, its CPPC counters) is nothing the engine takes from any VM: pvmm keeps its
//! own threads with its vCPUs, and the capacities it publishes are the daemon's own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvmm_api::client::Connection;
use pvmm_api::messages::{AssignmentBody, ExternalAnswer, ExternalBody, VcpusAnswer, VmInfo};
use pvmm_api::stats::VmKind;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Member, MemberError, MemberVcpu, Placer, ThreadSampler, VcpuPlacement};
use crate::discover::task_path;
use crate::names::pvmm_name;

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
    /// The assignments last sent and when, while pvmm holds them.
    sent: Option<(Vec<VcpuPlacement>, Instant)>,
    /// Its vCPU threads' sampling.
    sampler: ThreadSampler,
    /// The task directory of its first vCPU thread: gone once pvmm exits, also when its pid
    /// is taken again by another process.
    alive: PathBuf,
}

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
    let answer = conn
        .request(method, path, body)
        .map_err(|e| MemberError::Socket {
            socket: socket.to_path_buf(),
            why: e.to_string(),
        })?;
    if answer.status >= 300 {
        return Err(MemberError::Refused {
            socket: socket.to_path_buf(),
            why: format!("{method} {path}: {} {}", answer.status, answer.body),
        });
    }
    Ok(answer.body)
}

/// [`call`], its answer read as a `T`.
fn typed<T: DeserializeOwned>(
    conn: &mut Connection,
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<T, MemberError> {
    let answer = call(conn, socket, method, path, body)?;
    serde_json::from_value(answer).map_err(|e| MemberError::Socket {
        socket: socket.to_path_buf(),
        why: format!("{method} {path}: {e}"),
    })
}

impl PvmmMember {
    /// Joins the pvmm serving `socket`, whose threads are read from `proc`: learns its pid,
    /// lease and vCPU threads, the only reads it asks pvmm for.
    pub fn join(socket: &Path, proc: &Path) -> Result<Self, MemberError> {
        let mut conn = Connection::new(socket);
        let info: VmInfo = typed(&mut conn, socket, "GET", "/v1/vm", None)?;
        let answer: VcpusAnswer = typed(&mut conn, socket, "GET", "/v1/vcpus", None)?;
        let tids: BTreeMap<u32, i32> = answer.vcpus.iter().map(|v| (v.vcpu(), v.tid())).collect();
        let first = match tids.values().next() {
            Some(&tid) if tids.len() == answer.vcpus.len() => tid,
            _ => {
                return Err(MemberError::Socket {
                    socket: socket.to_path_buf(),
                    why: format!("GET /v1/vcpus: no distinct vCPUs in {answer:?}"),
                })
            }
        };
        let mut sampler = ThreadSampler::new(proc, info.pid);
        sampler.follow(&tids, proc);
        Ok(Self {
            socket: socket.to_path_buf(),
            pid: info.pid,
            name: pvmm_name(info.name.as_deref(), socket),
            conn,
            lease: Duration::from_millis(info.external_lease_ms),
            sent: None,
            sampler,
            alive: task_path(proc, info.pid, first),
        })
    }
}

impl Member for PvmmMember {
    fn kind(&self) -> VmKind {
        VmKind::Pvmm
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn describe(&self, pid: i32) -> String {
        format!(
            "pvmm VM {} pid {pid} ({})",
            self.name,
            self.socket.display()
        )
    }

    fn socket(&self) -> Option<&Path> {
        Some(&self.socket)
    }

    fn placer(&self) -> Placer {
        Placer::Vmm
    }

    /// Its vCPUs now, sampled from `/proc` ([`ThreadSampler`]) without a request to pvmm. A
    /// pvmm whose process is gone is an error: the daemon drops it.
    fn read(&mut self, now_ns: u64) -> Result<Vec<MemberVcpu>, MemberError> {
        if !self.alive.exists() {
            return Err(MemberError::Gone { pid: self.pid });
        }
        Ok(self.sampler.sample(now_ns))
    }

    /// Places its vCPUs (and renews the lease): sends `assignments` when they differ from the
    /// last sent or a [`RENEWALS_PER_LEASE`]th of the lease has passed since (so also once
    /// the lease lapsed, when pvmm placed itself again).
    fn place(&mut self, assignments: &[VcpuPlacement]) -> Result<(), MemberError> {
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
        let answer: ExternalAnswer = typed(
            &mut self.conn,
            &self.socket,
            "PUT",
            "/v1/placement/external",
            Some(&body),
        )?;
        if !answer.external {
            return Err(MemberError::Refused {
                socket: self.socket.clone(),
                why: "PUT /v1/placement/external: placement not taken".into(),
            });
        }
        self.sent = Some((assignments.to_vec(), now));
        Ok(())
    }

    /// Hands placement back to the pvmm's own policy.
    fn release(&mut self) -> Result<(), MemberError> {
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

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::discover::fake::FakeHost;
    use pvmm_api::messages::VcpuEntry;
    use pvmm_scheduler::CpuSet;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::mpsc;

    /// A placement on a CPU the fake pvmm does not have, which it refuses (409) as pvmm does.
    const REFUSED: &str = r#""cpus":"9""#;

    /// The pid of the process the fake pvmm says it is, and its vCPU threads' ids.
    const PID: i32 = 40;
    const VCPU_TIDS: [i32; 2] = [41, 42];

    /// A pvmm in `host`'s `/proc` (process [`PID`], vCPU threads [`VCPU_TIDS`]) and its
    /// control socket, which answers `GET /v1/vm` with `lease_ms`, `GET /v1/vcpus` with those
    /// threads, `PUT` and `DELETE /v1/placement/external` as pvmm does (refusing [`REFUSED`]),
    /// and any other request with `{}`, sending each request's method and path to the test.
    fn fake_pvmm(host: &FakeHost, lease_ms: u64) -> (PathBuf, mpsc::Receiver<String>) {
        let threads: Vec<(i32, &str)> = std::iter::once((PID, "pvmm"))
            .chain(VCPU_TIDS.iter().map(|&t| (t, "vcpu")))
            .collect();
        host.process(PID, &threads, &[]);
        for tid in VCPU_TIDS {
            let task = host.roots.proc.join(format!("{PID}/task/{tid}"));
            std::fs::write(task.join("schedstat"), "0 0 1\n").unwrap();
        }
        let socket = host.roots.proc.parent().unwrap().join("vm.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let info = VmInfo {
            external_placement: false,
            external_lease_ms: lease_ms,
            kernel: "k".into(),
            memory_mib: 64,
            name: None,
            pid: PID,
            policy: Default::default(),
            power_button_listening: false,
            state: "running".into(),
            uptime_ms: 0,
            vcpus: 2,
        };
        let vcpus = VcpusAnswer {
            threads: vec![],
            vcpus: (0..)
                .zip(VCPU_TIDS)
                .map(|(vcpu, tid)| VcpuEntry::Unplaced {
                    vcpu,
                    tid,
                    state: "running".into(),
                })
                .collect(),
        };
        let answers = [
            ("GET /v1/vm", serde_json::to_string(&info).unwrap()),
            ("GET /v1/vcpus", serde_json::to_string(&vcpus).unwrap()),
            (
                "PUT /v1/placement/external",
                r#"{"assignments":1,"external":true}"#.into(),
            ),
            (
                "DELETE /v1/placement/external",
                r#"{"external":false,"was_external":true}"#.into(),
            ),
        ];
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
                    let mut sent = vec![0; length];
                    reader.read_exact(&mut sent).unwrap();
                    // Sent before the answer, so the client has it once answered.
                    let _ = tx.send(request.clone());
                    let (status, body) = if String::from_utf8_lossy(&sent).contains(REFUSED) {
                        ("409 Conflict", r#"{"error":"no such CPU"}"#)
                    } else {
                        let known = answers.iter().find(|(r, _)| *r == request);
                        ("200 OK", known.map_or("{}", |(_, body)| body.as_str()))
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{body}",
                        body.len()
                    );
                    reader.get_mut().write_all(answer.as_bytes()).unwrap();
                    line.clear();
                }
            }
        });
        (socket, rx)
    }

    fn joined(host: &FakeHost, lease: Duration) -> (PvmmMember, mpsc::Receiver<String>) {
        let (socket, requests) = fake_pvmm(host, lease.as_millis() as u64);
        let member = PvmmMember::join(&socket, &host.roots.proc).unwrap();
        let join: Vec<String> = requests.try_iter().collect();
        assert_eq!(join, ["GET /v1/vm", "GET /v1/vcpus"]);
        assert_eq!(member.lease, lease);
        (member, requests)
    }

    fn placed(cpus: &str) -> Vec<VcpuPlacement> {
        vec![(0, cpus.parse::<CpuSet>().unwrap(), 1024)]
    }

    #[test]
    fn unchanged_assignments_are_sent_again_only_once_a_part_of_the_lease_has_passed() {
        let host = FakeHost::new("pvmm-renewals");
        let lease = Duration::from_millis(600);
        let (mut member, requests) = joined(&host, lease);
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
    fn a_refused_placement_is_an_error_that_sends_the_next_one_whatever_it_is() {
        let host = FakeHost::new("pvmm-refused");
        let (mut member, requests) = joined(&host, Duration::from_millis(600));
        member.place(&placed("0")).unwrap();
        assert!(matches!(
            member.place(&placed("9")),
            Err(MemberError::Refused { .. })
        ));
        member.place(&placed("0")).unwrap();
        assert_eq!(requests.try_iter().count(), 3, "the last one sent again");
        assert_eq!(member.read(0).unwrap().len(), VCPU_TIDS.len());
    }

    /// Ticks read and placed over this many leases in the request-count test.
    const LEASES_TICKED: u32 = 2;

    #[test]
    fn a_joined_pvmm_is_sampled_from_proc_and_asked_only_to_renew_its_placement() {
        let host = FakeHost::new("pvmm-requests");
        let lease = Duration::from_millis(300);
        let (mut member, requests) = joined(&host, lease);
        let tick = Duration::from_millis(10);
        let vcpu0 = host
            .roots
            .proc
            .join(format!("{PID}/task/{}/schedstat", VCPU_TIDS[0]));
        let start = Instant::now();
        let mut puts = Vec::new();
        let mut last = Vec::new();
        let mut ticks = 0u64;
        while start.elapsed() < lease * LEASES_TICKED {
            // vCPU 0 runs all the time, vCPU 1 never.
            let now_ns = ticks * tick.as_nanos() as u64;
            std::fs::write(&vcpu0, format!("{now_ns} 0 1\n")).unwrap();
            last = member.read(now_ns).unwrap();
            member.place(&placed("0")).unwrap();
            for request in requests.try_iter() {
                assert_eq!(request, "PUT /v1/placement/external", "tick {ticks}");
                puts.push(start.elapsed());
            }
            ticks += 1;
            std::thread::sleep(tick);
        }
        assert!(ticks > 20, "{ticks} ticks");
        assert!(last[0].util > 900 && last[0].busy, "{last:?}");
        assert!(last[1].util < 50 && !last[1].busy, "{last:?}");
        // The first placement, then one renewal per part of the lease, none earlier (each
        // noted after its answer, a tick at most after it was due).
        let part = lease / RENEWALS_PER_LEASE;
        assert!(
            puts.windows(2).all(|w| w[1] - w[0] >= part - tick),
            "{puts:?}"
        );
        let most = 1 + LEASES_TICKED * RENEWALS_PER_LEASE;
        assert!(
            (2..=most as usize).contains(&puts.len()),
            "{} placements over {ticks} ticks: {puts:?}",
            puts.len()
        );
    }

    #[test]
    fn a_pvmm_whose_process_is_gone_is_an_error() {
        let host = FakeHost::new("pvmm-gone");
        let (mut member, _requests) = joined(&host, Duration::from_millis(600));
        assert_eq!(member.read(0).unwrap().len(), VCPU_TIDS.len());
        std::fs::remove_dir_all(host.roots.proc.join(PID.to_string())).unwrap();
        assert!(matches!(
            member.read(1),
            Err(MemberError::Gone { pid: PID })
        ));
    }
}
