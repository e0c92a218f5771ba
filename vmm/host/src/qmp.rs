//! QEMU's machine protocol (QMP), for the one thing discovery needs from it: the thread of
//! each vCPU (`query-cpus-fast`). It maps the vCPUs of a QEMU started without
//! `debug-threads=on` on a host without debugfs, given the QMP socket (`-qmp
//! unix:PATH,server=on,wait=off`, or a second monitor next to libvirt's own).
//!
//! QMP is one JSON object per line: QEMU greets, the client leaves capabilities negotiation
//! with `qmp_capabilities`, then each command gets a `return` (or an `error`); asynchronous
//! `event` lines may come in between and are skipped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// How long one QMP exchange may take: QEMU answers from its main loop at once, so a socket
/// slower than this is not serving QMP (or QEMU is stuck), and discovery goes on without it.
const QMP_TIMEOUT: Duration = Duration::from_secs(1);

/// Lines read while waiting for one answer before giving up: bounds what a flood of events
/// (or something that is not QEMU) can make discovery read.
const MAX_LINES_PER_ANSWER: usize = 64;

/// Errors talking to a QMP socket.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting, reading or writing failed (timeouts included).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// QEMU answered with an error, or with something that is not QMP.
    #[error("{0}")]
    Protocol(String),
}

/// The vCPU index -> thread id map QEMU reports on the QMP socket at `socket`.
pub fn vcpu_threads(socket: &Path) -> Result<BTreeMap<u32, i32>, QmpError> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(QMP_TIMEOUT))?;
    stream.set_write_timeout(Some(QMP_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let greeting = read_object(&mut reader)?;
    if greeting.get("QMP").is_none() {
        return Err(QmpError::Protocol(format!("no QMP greeting: {greeting}")));
    }
    execute(&mut writer, &mut reader, "qmp_capabilities")?;
    let cpus = execute(&mut writer, &mut reader, "query-cpus-fast")?;
    let cpus = cpus
        .as_array()
        .ok_or_else(|| QmpError::Protocol(format!("query-cpus-fast returned {cpus}")))?;
    Ok(cpus
        .iter()
        .filter_map(|cpu| {
            let index = u32::try_from(cpu.get("cpu-index")?.as_u64()?).ok()?;
            let tid = i32::try_from(cpu.get("thread-id")?.as_i64()?).ok()?;
            Some((index, tid))
        })
        .collect())
}

/// Sends `command` and returns its `return` value.
fn execute(
    writer: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    command: &str,
) -> Result<Value, QmpError> {
    writeln!(writer, "{}", serde_json::json!({ "execute": command }))?;
    for _ in 0..MAX_LINES_PER_ANSWER {
        let mut answer = read_object(reader)?;
        if let Some(value) = answer.get_mut("return") {
            return Ok(value.take());
        }
        if let Some(error) = answer.get("error") {
            return Err(QmpError::Protocol(format!("{command}: {error}")));
        }
    }
    Err(QmpError::Protocol(format!("{command}: no answer")))
}

fn read_object(reader: &mut BufReader<UnixStream>) -> Result<Value, QmpError> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(QmpError::Protocol("the socket closed".into()));
    }
    serde_json::from_str(&line).map_err(|e| QmpError::Protocol(format!("not JSON ({e})")))
}

#[cfg(test)]
pub mod fake {
    //! A QMP server speaking just enough of the protocol for discovery tests.
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::path::Path;

    /// Serves QMP on `socket` for `connections` clients, reporting `cpus` as (index, thread
    /// id), with an event before each answer.
    pub fn serve(
        socket: &Path,
        cpus: Vec<(u32, i32)>,
        connections: usize,
    ) -> std::thread::JoinHandle<()> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            for _ in 0..connections {
                let (stream, _) = listener.accept().unwrap();
                let mut out = stream.try_clone().unwrap();
                writeln!(out, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
                for line in BufReader::new(stream).lines() {
                    let line = line.unwrap();
                    writeln!(out, r#"{{"event": "RTC_CHANGE", "data": {{}}}}"#).unwrap();
                    if line.contains("query-cpus-fast") {
                        let list: Vec<String> = cpus
                            .iter()
                            .map(|(i, t)| {
                                format!(
                                    r#"{{"cpu-index": {i}, "thread-id": {t}, "target": "x86_64"}}"#
                                )
                            })
                            .collect();
                        writeln!(out, r#"{{"return": [{}]}}"#, list.join(", ")).unwrap();
                        break;
                    } else if line.contains("qmp_capabilities") {
                        writeln!(out, r#"{{"return": {{}}}}"#).unwrap();
                    } else {
                        writeln!(out, r#"{{"error": {{"class": "CommandNotFound"}}}}"#).unwrap();
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vcpu_threads_and_refuses_what_is_not_qmp() {
        let dir = std::env::temp_dir().join(format!("pvmm-qmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("qmp.sock");
        let _ = std::fs::remove_file(&socket);
        let server = fake::serve(&socket, vec![(0, 4001), (1, 4002)], 1);
        assert_eq!(
            vcpu_threads(&socket).unwrap(),
            BTreeMap::from([(0, 4001), (1, 4002)])
        );
        server.join().unwrap();
        // Something else on a socket: not QMP, an error, no hang.
        let other = dir.join("other.sock");
        let _ = std::fs::remove_file(&other);
        let listener = std::os::unix::net::UnixListener::bind(&other).unwrap();
        let talker = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            writeln!(s, "HTTP/1.1 400 Bad Request").unwrap();
        });
        assert!(matches!(vcpu_threads(&other), Err(QmpError::Protocol(_))));
        talker.join().unwrap();
        assert!(vcpu_threads(&dir.join("missing.sock")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
