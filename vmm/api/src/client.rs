//! The client side of the control socket: one-shot requests for `pvmm-ctl` ([`request`]), a
//! kept-alive [`Connection`] for a balancer that asks every tick, answers parsed with
//! `httparse`, and readable tables for people.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

use pvmm_scheduler::table::{columns, LEFT};

use crate::messages::VcpusAnswer;
use crate::stats::{VcpuStats, VmStats};

use crate::http::{IO_TIMEOUT, MAX_BODY_BYTES, MAX_HEAD_BYTES};

/// Most response headers read.
const MAX_RESPONSE_HEADERS: usize = 32;

/// Errors talking to a pvmm.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("{path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// Sending or receiving failed.
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    /// The connection closed before the answer's head was complete.
    #[error("control socket: bad response: connection closed mid-answer")]
    Truncated,
    /// The answer is not HTTP.
    #[error("control socket: bad response: {0}")]
    NotHttp(#[source] httparse::Error),
    /// The answer's body is not JSON.
    #[error("control socket: bad response: body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
}

/// An answer: status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
}

/// Initial read buffer for an answer: every answer pvmm gives for a VM of a few dozen vCPUs.
const ANSWER_BUFFER_BYTES: usize = 16 * 1024;

/// Sends `method path` with `body` (JSON, or empty) to the pvmm at `socket`.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Answer, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: socket.display().to_string(),
        source,
    })?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let body = body.unwrap_or("");
    // One buffer, one write (`write!` to the socket would send each piece of the format
    // separately).
    let text = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let sent = stream
        .write_all(text.as_bytes())
        .and_then(|_| stream.flush());
    // pvmm answers a request it refuses from its head alone (a body over the limit) and
    // closes: the rest of the body cannot be sent, but the answer is there to read.
    if let Err(e) = sent {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    // Room for a usual answer at once: an empty Vec makes `read_to_end` start with small
    // reads, a system call each.
    let mut raw = Vec::with_capacity(ANSWER_BUFFER_BYTES);
    stream
        .take((MAX_HEAD_BYTES + MAX_BODY_BYTES * 16) as u64)
        .read_to_end(&mut raw)?;
    parse_answer(&raw)
}

/// A connection to one pvmm kept open across requests (HTTP/1.1 keep-alive), opened again
/// when pvmm closed it (an idle connection is closed after the socket's I/O timeout).
#[derive(Debug)]
pub struct Connection {
    socket: PathBuf,
    stream: Option<UnixStream>,
}

impl Connection {
    /// A connection to the pvmm at `socket`, opened at the first request.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
            stream: None,
        }
    }

    /// Sends `method path` with `body` and reads the answer. A kept connection that fails
    /// is opened again and the request sent once more (pvmm may have closed it while idle;
    /// every request the daemon sends may be repeated).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Answer, ClientError> {
        if self.stream.is_some() {
            match self.exchange(method, path, body) {
                Ok(answer) => return Ok(answer),
                Err(_) => self.stream = None,
            }
        }
        self.exchange(method, path, body).inspect_err(|_| {
            self.stream = None;
        })
    }

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Answer, ClientError> {
        if self.stream.is_none() {
            let stream =
                UnixStream::connect(&self.socket).map_err(|source| ClientError::Connect {
                    path: self.socket.display().to_string(),
                    source,
                })?;
            stream.set_read_timeout(Some(IO_TIMEOUT))?;
            stream.set_write_timeout(Some(IO_TIMEOUT))?;
            self.stream = Some(stream);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(ClientError::Truncated);
        };
        let body = body.unwrap_or("");
        let text = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(text.as_bytes())?;
        let (answer, keep) = read_framed_answer(stream)?;
        if !keep {
            self.stream = None;
        }
        Ok(answer)
    }
}

/// Reads one answer framed by its `Content-Length` (the connection stays open); with it,
/// whether pvmm keeps the connection.
fn read_framed_answer(stream: &mut UnixStream) -> Result<(Answer, bool), ClientError> {
    let mut raw = Vec::with_capacity(ANSWER_BUFFER_BYTES);
    let mut chunk = vec![0u8; ANSWER_BUFFER_BYTES];
    let limit = MAX_HEAD_BYTES + MAX_BODY_BYTES * 16;
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(ClientError::Truncated);
        }
        raw.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let head = match resp.parse(&raw) {
            Ok(httparse::Status::Complete(head)) => head,
            Ok(httparse::Status::Partial) if raw.len() < limit => continue,
            Ok(httparse::Status::Partial) => return Err(ClientError::Truncated),
            Err(e) => return Err(ClientError::NotHttp(e)),
        };
        let header = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(str::trim)
        };
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or(ClientError::Truncated)?;
        let keep = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("keep-alive"));
        let status = resp.code.unwrap_or(0);
        if head + length > limit {
            return Err(ClientError::Truncated);
        }
        while raw.len() < head + length {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(ClientError::Truncated);
            }
            raw.extend_from_slice(&chunk[..n]);
        }
        let body =
            serde_json::from_slice(&raw[head..head + length]).map_err(ClientError::NotJson)?;
        return Ok((Answer { status, body }, keep));
    }
}

/// Parses a whole HTTP response.
pub fn parse_answer(raw: &[u8]) -> Result<Answer, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err(ClientError::Truncated),
        Err(e) => return Err(ClientError::NotHttp(e)),
    };
    let status = resp.code.unwrap_or(0);
    let body = serde_json::from_slice(&raw[head..]).map_err(ClientError::NotJson)?;
    Ok(Answer { status, body })
}

/// A JSON value as a table cell: `-` for null, a string without its quotes.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A placed vCPU's cells after its index and thread: util, busy, cpus, package, capacity
/// (the columns of [`PLACED_COLUMNS`]).
fn placed_cells(v: &VcpuStats) -> [String; 5] {
    [
        v.util.to_string(),
        v.busy.to_string(),
        v.cpus.to_string(),
        v.package.map_or_else(|| "-".to_string(), |p| p.to_string()),
        v.capacity.to_string(),
    ]
}

/// The headers of [`placed_cells`].
const PLACED_COLUMNS: [&str; 5] = ["util", "busy", "cpus", "package", "capacity"];

/// `GET /v1/vcpus` for people: the vCPUs (before the first tick only their threads and run
/// states), then pvmm's own threads.
pub fn format_vcpus(answer: &VcpusAnswer) -> String {
    let mut headers = vec!["vcpu", "tid", "state"];
    if answer.vcpus.iter().any(|v| v.stats().is_some()) {
        headers.extend(PLACED_COLUMNS);
    }
    let vcpus: Vec<Vec<String>> = answer
        .vcpus
        .iter()
        .map(|v| {
            let mut row = vec![v.vcpu().to_string(), v.tid().to_string(), v.state().into()];
            row.extend(v.stats().into_iter().flat_map(placed_cells));
            row
        })
        .collect();
    let threads: Vec<[String; 2]> = answer
        .threads
        .iter()
        .map(|t| [t.tid.to_string(), t.name.clone()])
        .collect();
    let mut out = columns(LEFT, &headers, &vcpus);
    out.push('\n');
    out.push_str(&columns(LEFT, &["tid", "thread"], &threads));
    out
}

/// `GET /v1/placement` for people: a summary line, the vCPUs, the packages.
pub fn format_placement(stats: &VmStats) -> String {
    let mut out = format!(
        "t {} ms, policy {}{}, migrations {} (total {}), policy changes {}\n\n",
        stats.t_ms,
        stats.policy,
        if stats.external {
            " (external placement)"
        } else {
            ""
        },
        stats.migrations,
        stats.migrations_total,
        stats.policy_changes,
    );
    let vcpus: Vec<Vec<String>> = stats
        .vcpus
        .iter()
        .map(|v| {
            let mut row = vec![v.vcpu.to_string(), v.tid.to_string()];
            row.extend(placed_cells(v));
            row
        })
        .collect();
    let mut headers = vec!["vcpu", "tid"];
    headers.extend(PLACED_COLUMNS);
    out.push_str(&columns(LEFT, &headers, &vcpus));
    let packages: Vec<Vec<String>> = stats
        .packages
        .iter()
        .map(|p| vec![p.id.to_string(), p.util.to_string(), p.active.to_string()])
        .collect();
    out.push('\n');
    out.push_str(&columns(LEFT, &["package", "util", "active"], &packages));
    out
}

/// Any other answer for people: `key: value` lines.
pub fn format_object(body: &Value) -> String {
    match body.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| format!("{k}: {}\n", cell(v)))
            .collect(),
        None => format!("{body}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_parse_and_garbage_does_not() {
        let raw = b"HTTP/1.1 404 Not Found\r\nContent-Length: 16\r\n\r\n{\"error\":\"no\"}\n";
        let a = parse_answer(raw).unwrap();
        assert_eq!(a.status, 404);
        assert_eq!(a.body["error"], "no");
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n\r\nnot json").is_err());
        assert!(parse_answer(b"\x00\x01").is_err());
    }

    #[test]
    fn vcpu_tables_align_and_show_placement_columns_once_a_tick_placed() {
        let answer = |vcpus: Value| -> VcpusAnswer {
            serde_json::from_value(
                json!({"vcpus": vcpus, "threads": [{"tid": 100, "name": "pvmm"}]}),
            )
            .unwrap()
        };
        let before = format_vcpus(&answer(json!([
            {"vcpu": 0, "tid": 101, "state": "running"},
            {"vcpu": 1, "tid": 102, "state": "paused"},
        ])));
        let lines: Vec<&str> = before.lines().collect();
        assert_eq!(lines[0], "vcpu  tid  state");
        assert_eq!(lines[1], "0     101  running");
        assert_eq!(lines[2], "1     102  paused");
        assert_eq!(lines[4], "tid  thread");
        assert_eq!(lines[5], "100  pvmm");
        let placed = format_vcpus(&answer(json!([
            {"vcpu": 0, "tid": 101, "state": "running", "busy": true, "capacity": 512,
             "cpus": "0-1", "desired": null, "package": 0, "util": 0.75, "waited": 0.0},
            {"vcpu": 1, "tid": 102, "state": "paused"},
        ])));
        let lines: Vec<&str> = placed.lines().collect();
        assert_eq!(
            lines[0],
            "vcpu  tid  state    util  busy  cpus  package  capacity"
        );
        assert_eq!(
            lines[1],
            "0     101  running  0.75  true  0-1   0        512"
        );
        assert_eq!(lines[2], "1     102  paused");
    }
}
