//! Property-based fuzzing of the control socket: its HTTP framing fed random bytes over a real
//! socket in pieces of any size, its router fed random methods, paths and bodies, and a live
//! pvmm (a tiny guest on this machine's /dev/kvm) fed random bytes and random requests by one
//! hostile client after another.
//!
//! Properties: never a panic; a request is either read whole (its body within the bound) or
//! refused with 400, or the client is gone; the router answers a bad request with 400, 404 or
//! 405, and what it accepts is within the VM's shape; a live pvmm answers every request it can
//! frame with a 2xx or 4xx, keeps running and answering, and a refused request changes
//! nothing it reports.
//!
//! Seeded and bounded for CI; a longer run:
//! `PROPTEST_CASES=100000 cargo test -p pvmm --test fuzz_api` (and `PROPTEST_RNG_SEED=N`
//! for another seed).

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_wrap)]

mod common;
use common::*;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use pvmm::api::client::request;
use pvmm::api::http::{read_request, HttpRequest, ReadFailure, MAX_BODY_BYTES};
use pvmm::api::routes::{parse_request, ApiRequest, VmShape, ROUTES};
use pvmm_scheduler::CpuSet;
use serde_json::Value;

/// Cases per property in CI.
const CI_CASES: u32 = 256;
/// Hostile clients of the live pvmm in CI (each a connection and a round trip).
const CI_LIVE_CASES: u32 = 96;
/// The fixed seed of CI runs.
const CI_SEED: u64 = 0x6170_695f_6675_7a7a;
/// How long a started pvmm may take to serve its socket.
const SOCKET_WAIT: Duration = Duration::from_secs(20);
/// How long a client that has sent all it will send waits for pvmm to answer or close:
/// pvmm closes a connection at once when its client is gone, and a silent one after 5 s.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Paths the live fuzzer never sends a framed request to: a valid one stops or pauses the
/// VM, which is their job, not a failure.
const LIVE_SKIPPED_PATHS: [&str; 2] = ["/v1/vm/shutdown", "/v1/vm/pause"];

fn shape() -> VmShape {
    VmShape {
        vcpus: 4,
        cpus: CpuSet::range(0, 3),
    }
}

/// `data` sent over a socket pair in writes of `piece` bytes, then the write side closed;
/// what pvmm's reader makes of it.
fn read_over_a_socket(data: Vec<u8>, piece: usize) -> Result<HttpRequest, ReadFailure> {
    let (mut ours, mut theirs) = UnixStream::pair().expect("socket pair");
    let writer = std::thread::spawn(move || {
        for chunk in data.chunks(piece) {
            // pvmm's reader may stop reading (a request refused early): that ends the writes.
            if ours.write_all(chunk).is_err() {
                return;
            }
        }
        let _ = ours.shutdown(std::net::Shutdown::Write);
    });
    let read = read_request(&mut theirs);
    drop(theirs);
    writer.join().expect("writer thread");
    read
}

proptest! {
    #![proptest_config(common::fuzz_config(CI_CASES, CI_SEED))]

    #[test]
    fn any_bytes_give_a_request_or_a_clean_failure(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..2048),
            framed_request().prop_map(String::into_bytes),
        ],
        piece in 1usize..64,
    ) {
        match read_over_a_socket(data, piece) {
            Ok(r) => prop_assert!(r.body.len() <= MAX_BODY_BYTES),
            Err(ReadFailure::Bad(resp)) => prop_assert_eq!(resp.status, 400),
            Err(ReadFailure::Gone) => {}
        }
    }

    #[test]
    fn random_requests_never_panic_and_errors_are_4xx(
        method in method(),
        path in path(),
        body in body(),
    ) {
        let req = HttpRequest { method: method.into(), path, body: body.into_bytes(), keep_alive: false };
        match parse_request(&req, &shape()) {
            Ok(ApiRequest::SetExternal(a)) => {
                for x in a {
                    prop_assert!(x.vcpu < 4 && x.cpus.is_subset(&shape().cpus));
                    prop_assert!((1..=1024).contains(&x.capacity));
                }
            }
            Ok(_) => {}
            Err(r) => prop_assert!([400, 404, 405].contains(&r.status), "{r:?}"),
        }
    }
}

fn method() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["GET", "PUT", "DELETE", "POST", "PATCH", ""])
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(ROUTES.iter().map(|r| r.0.to_string()).collect::<Vec<_>>()),
        ".{0,40}",
    ]
}

/// Bodies: random text, or assignments of outside placement with random (often bad) fields.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,200}",
        "\\{\"policy\":\"[a-z:0-9]{0,16}\"\\}",
        prop::collection::vec((0u32..8, "[0-9,-]{0,6}", 0u32..2000), 0..6).prop_map(|v| {
            let a: Vec<String> = v
                .iter()
                .map(|(vcpu, cpus, cap)| {
                    format!(r#"{{"vcpu":{vcpu},"cpus":"{cpus}","capacity":{cap}}}"#)
                })
                .collect();
            format!(r#"{{"assignments":[{}]}}"#, a.join(","))
        }),
    ]
}

/// A whole HTTP/1.1 request with a random method, path and body, and a `Content-Length`
/// that is absent, right, or a few bytes off either way (negative included).
fn framed_request() -> impl Strategy<Value = String> {
    (method(), path(), body(), prop_oneof![Just(None), (-3i64..3).prop_map(Some)]).prop_map(
        |(method, path, body, length)| {
            let length = length.map_or(String::new(), |off| {
                format!("Content-Length: {}\r\n", body.len() as i64 + off)
            });
            format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{length}\r\n{body}")
        },
    )
}

/// A framed request to any path but [`LIVE_SKIPPED_PATHS`], or random bytes.
fn hostile_client() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..4096),
        framed_request()
            .prop_filter("stops or pauses the VM", |r| {
                !LIVE_SKIPPED_PATHS
                    .iter()
                    .any(|p| r.contains(&format!(" {p} ")))
            })
            .prop_map(String::into_bytes),
    ]
}

/// A 2-vCPU pvmm running a halting guest, serving `socket`; killed when dropped.
struct LivePvmm(Child);

impl Drop for LivePvmm {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn start_pvmm(kernel: &Path, socket: &Path) -> LivePvmm {
    let child = Command::new(env!("CARGO_BIN_EXE_pvmm"))
        .args(["--vcpus", "2", "--memory", "64", "--api-socket"])
        .arg(socket)
        .arg(kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pvmm");
    let pvmm = LivePvmm(child);
    let start = Instant::now();
    while request(socket, "GET", "/v1/vm", None).is_err() {
        assert!(start.elapsed() < SOCKET_WAIT, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    pvmm
}

/// Sends `bytes` on a connection of its own and closes the write side; returns the status of
/// the answer if pvmm framed one (`Ok(None)`: it closed the connection without one), or an
/// error if pvmm neither answered nor closed the connection in time.
fn send_raw(socket: &Path, bytes: &[u8]) -> Result<Option<u16>, TestCaseError> {
    let mut stream = UnixStream::connect(socket).expect("connect to the control socket");
    stream.set_read_timeout(Some(CLOSE_WAIT)).ok();
    // pvmm may refuse the request and close before reading all of it.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    if let Err(e) = stream.read_to_end(&mut answer) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            return Err(TestCaseError::fail(format!(
                "connection neither answered nor closed within {CLOSE_WAIT:?}"
            )));
        }
    }
    let line = String::from_utf8_lossy(&answer);
    Ok(line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok()))
}

/// What `GET /v1/vm` reports that a request could change.
fn reported_state(socket: &Path) -> Result<(Value, Value, Value), TestCaseError> {
    let a = request(socket, "GET", "/v1/vm", None)
        .map_err(|e| TestCaseError::fail(format!("pvmm stopped answering: {e}")))?;
    prop_assert_eq!(a.status, 200);
    Ok((
        a.body["state"].clone(),
        a.body["policy"].clone(),
        a.body["external_placement"].clone(),
    ))
}

#[test]
fn a_live_control_socket_survives_hostile_clients_and_refusals_change_nothing() {
    if !kvm_available("fuzz_api_live") {
        return;
    }
    let dir = scratch("fuzz-api-live");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let socket = dir.join("api.sock");
    let mut pvmm = start_pvmm(&kernel, &socket);
    let mut runner = TestRunner::new(common::fuzz_config(CI_LIVE_CASES, CI_SEED));
    let result = runner.run(&hostile_client(), |bytes| {
        let before = reported_state(&socket)?;
        let status = send_raw(&socket, &bytes)?;
        let after = reported_state(&socket)?;
        match status {
            Some(s) if (200..300).contains(&s) => {}
            Some(s) => {
                prop_assert!((400..500).contains(&s), "answered {s}");
                prop_assert_eq!(&before, &after, "a refused request changed the VM");
            }
            None => prop_assert_eq!(&before, &after, "an unframed request changed the VM"),
        }
        prop_assert_eq!(&after.0, &Value::from("running"));
        Ok(())
    });
    assert!(
        pvmm.0.try_wait().expect("wait").is_none(),
        "pvmm exited under hostile clients"
    );
    drop(pvmm);
    std::fs::remove_dir_all(&dir).ok();
    if let Err(e) = result {
        panic!("{e}");
    }
}
