//! A pvmm VM, joined through its control socket: read from pvmm's latest tick, placed by
//! asking pvmm to place itself.
//!
//! The connection is kept open, so that a request costs neither side a connection. Placement
//! is sent when the assignments change and, unchanged, once a part of the lease has passed
//! ([`RENEWALS_PER_LEASE`]): pvmm holds it as long as the lease, then places itself again, so
//! a daemon that dies leaves nothing behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvmm_api::client::Connection;
use pvmm_api::messages::{AssignmentBody, ExternalBody, VmInfo};
use pvmm_api::stats::{share_of_1024, VmKind, VmStats};
use serde_json::Value;

use super::{Member, MemberError, MemberVcpu, Placer, VcpuPlacement};
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
    /// The assignments last sent and when, while pvmm reports them held.
    sent: Option<(Vec<VcpuPlacement>, Instant)>,
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

    /// Its vCPUs now, from its latest tick (`GET /v1/placement`, the `--stats` snapshot: no
    /// `/proc` reading in pvmm per request, which `GET /v1/vcpus` does to list its threads).
    /// No vCPUs before pvmm's first tick.
    fn read(&mut self, _now_ns: u64) -> Result<Vec<MemberVcpu>, MemberError> {
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
    use pvmm_scheduler::CpuSet;
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
}
