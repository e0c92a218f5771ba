//! The control socket and signals against a real VM: a tiny guest that halts forever on this
//! machine's /dev/kvm, driven through `--api-socket` as an operator or a host balancer would,
//! and signalled as a service manager would.

// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pvmm::api::client::{request, Answer};
use pvmm_api::messages::{VcpuEntry, VcpusAnswer};
use pvmm_api::stats::VmStats;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// How long a started pvmm may take to create its socket.
const SOCKET_WAIT: Duration = Duration::from_secs(20);
/// pvmm's own threads that are there once a VM serves its socket (console-in ends at once:
/// stdin is /dev/null).
const OWN_THREADS: [&str; 3] = ["pvmm", "pvmm-sched", "pvmm-api"];
/// How long to wait for a state that the next few ticks should reach.
const TICKS_WAIT: Duration = Duration::from_secs(10);

struct Vmm {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl Vmm {
    fn start(name: &str, extra: &[&str]) -> Option<Vmm> {
        Vmm::start_with(name, &HALT_LOOP, extra)
    }

    /// A 2-vCPU pvmm running the tiny guest `code`, serving its control socket.
    fn start_with(name: &str, code: &[u8], extra: &[&str]) -> Option<Vmm> {
        if !kvm_available(name) {
            return None;
        }
        let dir = scratch(name);
        let kernel = write_kernel(&dir, code);
        let socket = dir.join("api.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_pvmm"))
            .args(["--vcpus", "2", "--memory", "64", "--api-socket"])
            .arg(&socket)
            .args(extra)
            .arg(&kernel)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pvmm");
        let mut vmm = Vmm { child, socket, dir };
        let start = Instant::now();
        while request(&vmm.socket, "GET", "/v1/vm", None).is_err() {
            if let Ok(Some(status)) = vmm.child.try_wait() {
                panic!("pvmm exited before serving its socket: {status}");
            }
            assert!(
                start.elapsed() < SOCKET_WAIT,
                "no control socket after {SOCKET_WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // A thread names itself when it first runs, so on a busy host one just started may
        // still show its parent's name; the tests read names, so they wait for them.
        vmm.until(
            "/v1/vcpus",
            "pvmm's own threads named",
            |v: &VcpusAnswer| {
                OWN_THREADS
                    .iter()
                    .all(|want| v.threads.iter().any(|t| t.name == *want))
            },
        );
        Some(vmm)
    }

    fn call(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        request(&self.socket, method, path, body).expect("control socket request")
    }

    fn ok(&self, method: &str, path: &str, body: Option<&str>) -> Value {
        let a = self.call(method, path, body);
        assert!(a.status < 300, "{method} {path}: {} {}", a.status, a.body);
        a.body
    }

    /// `GET path`'s answer, read as the type that `path` answers.
    fn get<T: DeserializeOwned>(&self, path: &str) -> T {
        let body = self.ok("GET", path, None);
        T::deserialize(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// Polls `GET path`, read as the type that `path` answers, until `cond` holds.
    fn until<T: DeserializeOwned + std::fmt::Debug>(
        &self,
        path: &str,
        what: &str,
        cond: impl Fn(&T) -> bool,
    ) -> T {
        let start = Instant::now();
        loop {
            let body = self.get(path);
            if cond(&body) {
                return body;
            }
            assert!(
                start.elapsed() < TICKS_WAIT,
                "{what}: last {path}: {body:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for pvmm to exit; returns its status and stderr.
    fn finish(self) -> (Option<i32>, String) {
        self.finish_within(TICKS_WAIT)
    }

    /// [`Vmm::finish`], failing the test if pvmm has not exited within `limit`.
    fn finish_within(mut self, limit: Duration) -> (Option<i32>, String) {
        use std::io::Read;
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if start.elapsed() > limit {
                self.child.kill().ok();
                panic!("pvmm did not exit after shutdown");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            e.read_to_string(&mut err).ok();
        }
        (status.code(), err)
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn thread_state(tid: i32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    after.split_whitespace().next().unwrap_or("?").to_string()
}

fn cpus_allowed(tid: i64) -> String {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn socket_mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn query_change_policy_pause_resume_and_shut_down() {
    let Some(vmm) = Vmm::start("api-lifecycle", &["--policy", "powersaving"]) else {
        return;
    };
    assert_eq!(socket_mode(&vmm.socket), 0o600);
    let vm = vmm.ok("GET", "/v1/vm", None);
    assert_eq!(vm["power_button_listening"], false);
    assert_eq!(vm["vcpus"], 2);
    assert_eq!(vm["memory_mib"], 64);
    assert_eq!(vm["state"], "running");
    assert_eq!(vm["policy"], "powersaving:1");
    assert_eq!(vm["pid"], vmm.child.id());
    assert_eq!(
        vm["external_lease_ms"], 3000,
        "the default --external-lease-ms"
    );

    let vcpus: VcpusAnswer = vmm.get("/v1/vcpus");
    let tids: Vec<i32> = vcpus.vcpus.iter().map(VcpuEntry::tid).collect();
    assert_eq!(tids.len(), 2, "{vcpus:?}");
    let names: Vec<&str> = vcpus.threads.iter().map(|t| t.name.as_str()).collect();
    for want in OWN_THREADS {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }

    vmm.ok("PUT", "/v1/policy", Some(r#"{"policy":"performance"}"#));
    let p = vmm.until("/v1/placement", "policy change", |p: &VmStats| {
        p.policy.to_string() == "performance"
    });
    assert_eq!(p.policy_changes, 1, "{p:?}");
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["policy"], "performance");

    vmm.ok("PUT", "/v1/vm/pause", None);
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["state"], "paused");
    for tid in &tids {
        // Paused vCPU threads sleep on a condition variable: state S, no CPU used (a thread
        // that has just acknowledged the pause may still be on its way there).
        let start = Instant::now();
        while thread_state(*tid) != "S" {
            assert!(
                start.elapsed() < TICKS_WAIT,
                "vCPU thread {tid} is {} while paused",
                thread_state(*tid)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let v: VcpusAnswer = vmm.get("/v1/vcpus");
    assert!(v.vcpus.iter().all(|v| v.state() == "paused"), "{v:?}");
    vmm.ok("PUT", "/v1/vm/resume", None);
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["state"], "running");

    let answer = vmm.call("PUT", "/v1/vm/shutdown", Some(r#"{"timeout_ms":200}"#));
    assert_eq!(answer.status, 202, "{}", answer.body);
    // The tiny guest has no ACPI driver (its GED interrupt stays masked): no power button,
    // a stop at once.
    assert_eq!(answer.body["power_button"], false);
    let socket = vmm.socket.clone();
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(6), "{err}");
    assert!(err.contains("stopped on request"), "{err}");
    assert!(
        err.contains("placement summary: policy performance"),
        "{err}"
    );
    assert!(!socket.exists(), "socket file left behind");
}

#[test]
fn bad_requests_are_4xx_and_change_nothing() {
    let Some(vmm) = Vmm::start("api-bad", &["--policy", "balance"]) else {
        return;
    };
    let before = vmm.ok("GET", "/v1/vm", None);
    let cases: &[(&str, &str, &str, u16)] = &[
        ("GET", "/v1/nothing", "", 404),
        ("POST", "/v1/vm", "", 405),
        ("PUT", "/v1/policy", "{", 400),
        ("PUT", "/v1/policy", r#"{"policy":"fastest"}"#, 400),
        (
            "PUT",
            "/v1/placement/external",
            r#"{"assignments":[{"vcpu":2,"cpus":"0","capacity":9}]}"#,
            400,
        ),
        (
            "PUT",
            "/v1/placement/external",
            r#"{"assignments":[{"vcpu":0,"cpus":"999","capacity":9}]}"#,
            400,
        ),
        (
            "PUT",
            "/v1/placement/external",
            r#"{"assignments":[{"vcpu":0,"cpus":"0","capacity":2000}]}"#,
            400,
        ),
    ];
    for (method, path, body, want) in cases {
        let a = vmm.call(method, path, (!body.is_empty()).then_some(*body));
        assert_eq!(a.status, *want, "{method} {path} {body}: {}", a.body);
        assert!(a.body["error"].is_string(), "{}", a.body);
    }
    let huge = format!(r#"{{"policy":"{}"}}"#, "x".repeat(70_000));
    assert_eq!(vmm.call("PUT", "/v1/policy", Some(&huge)).status, 400);
    // Clients that connect and send nothing, or leave mid-request, cost only themselves.
    let idle = std::os::unix::net::UnixStream::connect(&vmm.socket).unwrap();
    {
        use std::io::Write;
        let mut half = std::os::unix::net::UnixStream::connect(&vmm.socket).unwrap();
        half.write_all(b"PUT /v1/policy HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"po")
            .unwrap();
    }
    let after = vmm.ok("GET", "/v1/vm", None);
    drop(idle);
    assert_eq!(after["policy"], before["policy"]);
    assert_eq!(after["state"], "running");
    assert_eq!(after["external_placement"], false);
    let p: VmStats = vmm.get("/v1/placement");
    assert_eq!(p.policy_changes, 0, "{p:?}");
}

#[test]
fn external_placement_moves_threads_and_lapses_without_renewal() {
    let Some(vmm) = Vmm::start("api-external", &["--external-lease-ms", "600"]) else {
        return;
    };
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let target = (host_cpus - 1).to_string();
    let body = format!(
        r#"{{"assignments":[{{"vcpu":0,"cpus":"{target}","capacity":300}},{{"vcpu":1,"cpus":"{target}","capacity":301}}]}}"#
    );
    vmm.ok("PUT", "/v1/placement/external", Some(&body));
    let p = vmm.until("/v1/placement", "external placement", |p: &VmStats| {
        p.external && p.vcpus.get(1).is_some_and(|v| v.capacity == 301)
    });
    for v in &p.vcpus {
        let tid = v.tid;
        assert_eq!(
            cpus_allowed(tid.into()),
            target,
            "vCPU thread {tid} (from /proc)"
        );
    }
    assert_eq!(p.vcpus[0].capacity, 300);
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["external_placement"], true);
    // No renewal: pvmm takes placement back after the lease.
    vmm.until("/v1/placement", "lease expiry", |p: &VmStats| !p.external);
    vmm.ok("PUT", "/v1/placement/external", Some(&body));
    vmm.until("/v1/placement", "external again", |p: &VmStats| p.external);
    let released = vmm.ok("DELETE", "/v1/placement/external", None);
    assert_eq!(released["was_external"], true);
    vmm.until("/v1/placement", "released", |p: &VmStats| !p.external);
    vmm.ok("PUT", "/v1/vm/shutdown", Some(r#"{"timeout_ms":0}"#));
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(6), "{err}");
    assert_eq!(
        err.matches("external placement lease expired").count(),
        1,
        "the expiry is logged once: {err}"
    );
}

#[test]
fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let Some(vmm) = Vmm::start("api-socket-owner", &[]) else {
        return;
    };
    let kernel = write_kernel(&vmm.dir, &HALT_LOOP);
    let sock = vmm.socket.to_str().unwrap().to_string();
    let k = kernel.to_str().unwrap().to_string();
    let second = pvmm(&["--memory", "64", "--api-socket", &sock, &k]);
    assert_eq!(second.status.code(), Some(2));
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("another process is listening"), "{err}");
    // A stale socket file (its listener gone) is replaced.
    let stale = vmm.dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let name = "api-socket-stale";
    let third = Command::new(env!("CARGO_BIN_EXE_pvmm"))
        .args(["--memory", "64", "--api-socket"])
        .arg(&stale)
        .arg(&kernel)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect(name);
    let other = Vmm {
        child: third,
        socket: stale,
        dir: scratch(name),
    };
    let start = Instant::now();
    while request(&other.socket, "GET", "/v1/vm", None).is_err() {
        assert!(start.elapsed() < SOCKET_WAIT, "stale socket not replaced");
        std::thread::sleep(Duration::from_millis(20));
    }
    other.ok("PUT", "/v1/vm/shutdown", None);
    assert_eq!(other.finish().0, Some(6));
}

#[test]
fn pvmm_ctl_prints_tables_and_reports_refusals() {
    let Some(vmm) = Vmm::start("api-ctl", &[]) else {
        return;
    };
    let ctl = |bin: &str, args: &[&str]| {
        let mut cmd = Command::new(bin);
        if bin.ends_with("/pvmm") {
            cmd.arg("ctl");
        }
        cmd.arg("--socket").arg(&vmm.socket).args(args);
        cmd.output().expect("run the client")
    };
    let ctl_bin = env!("CARGO_BIN_EXE_pvmm-ctl");
    let out = ctl(ctl_bin, &["vcpus"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("vcpu  tid"), "{text}");
    assert!(text.contains("pvmm-sched"), "{text}");
    let out = ctl(env!("CARGO_BIN_EXE_pvmm"), &["--json", "vm"]);
    assert!(out.status.success(), "{out:?}");
    let vm: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(vm["vcpus"], 2);
    let out = ctl(ctl_bin, &["policy", "fastest"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("400"), "{err}");
    let out = ctl(ctl_bin, &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    vmm.ok("PUT", "/v1/vm/shutdown", None);
    assert_eq!(vmm.finish().0, Some(6));
}

#[test]
fn a_failed_start_leaves_no_socket_and_bad_paths_are_one_line() {
    let dir = scratch("api-failed-start");
    let kernel = write_kernel(&dir, &HALT_LOOP);
    let sock = dir.join("s.sock");
    let (k, s) = (kernel.to_str().unwrap(), sock.to_str().unwrap());
    let out = pvmm(&[
        "--memory",
        "64",
        "--kvm",
        "/nonexistent-kvm",
        "--api-socket",
        s,
        k,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!sock.exists(), "socket file left after a failed start");
    // A path that is not a socket is never removed.
    let out = pvmm(&["--memory", "64", "--api-socket", k, k]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a socket"), "{err}");
    assert!(kernel.exists());
    let out = pvmm(&[
        "--memory",
        "64",
        "--api-socket",
        "/nonexistent-dir/s.sock",
        k,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// 32-bit code: unmask IOAPIC pin 5 (the GED's interrupt), as an ACPI driver would: the guest
/// then "listens" for the power button (it never takes the interrupt: it halts with
/// interrupts off).
const LISTEN_FOR_GED: [u8; 20] = [
    0xc7, 0x05, 0x00, 0x00, 0xc0, 0xfe, 0x1a, 0x00, 0x00,
    0x00, // IOREGSEL = redirection 5 low
    0xc7, 0x05, 0x10, 0x00, 0xc0, 0xfe, 0x25, 0x00, 0x00,
    0x00, // IOWIN = vector 0x25, unmasked
];

/// 32-bit code: listen for the power button, then poll the GED's status register until it
/// reports the button, and power off (S5), as an ACPI guest does on the button's notification.
fn power_off_on_the_button() -> Vec<u8> {
    let status = (pvmm::layout::GED_MMIO_START as u32).to_le_bytes();
    let button = pvmm_devices::ged::POWER_BUTTON_STATUS.to_le_bytes();
    let mut code = LISTEN_FOR_GED.to_vec();
    code.extend([0xa1, status[0], status[1], status[2], status[3]]); // mov eax, [status]
    code.extend([0x3d, button[0], button[1], button[2], button[3]]); // cmp eax, button
    code.extend([0x75, 0xf4]); // jne back to the read
    code.extend(out_code(0x600, POWER_OFF_VALUE));
    code.extend(HALT_LOOP);
    code
}

/// A pvmm running `code`, once its guest listens for the power button.
fn listening_vmm(name: &str, code: &[u8], extra: &[&str]) -> Option<Vmm> {
    let vmm = Vmm::start_with(name, code, extra)?;
    // The guest unmasks its GED interrupt almost at once (a few emulated instructions); a
    // shutdown asked before that would stop the VM, so wait until it listens.
    vmm.until("/v1/vm", "the guest listening to its GED", |v: &Value| {
        v["power_button_listening"] == true
    });
    Some(vmm)
}

/// A guest that listens for the power button and ignores it.
fn ignoring_the_button() -> Vec<u8> {
    let mut code = LISTEN_FOR_GED.to_vec();
    code.extend(HALT_LOOP);
    code
}

fn signal(vmm: &Vmm, sig: i32) {
    // SAFETY: kill on a child's pid; the result is checked.
    assert_eq!(unsafe { libc::kill(vmm.child.id() as i32, sig) }, 0);
}

#[test]
fn sigterm_stops_a_guest_that_does_not_listen_and_sighup_is_ignored() {
    let Some(vmm) = Vmm::start("signals-term", &[]) else {
        return;
    };
    // stdin is not a terminal: SIGHUP changes nothing.
    signal(&vmm, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["state"], "running");
    signal(&vmm, libc::SIGTERM);
    let socket = vmm.socket.clone();
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(6), "{err}");
    assert!(err.contains("SIGTERM: the guest does not listen"), "{err}");
    assert!(err.contains("placement summary"), "{err}");
    assert!(!socket.exists());
}

#[test]
fn a_listening_guest_gets_the_power_button_and_a_second_sigint_stops_at_once() {
    let Some(vmm) = listening_vmm(
        "signals-int",
        &ignoring_the_button(),
        &["--shutdown-timeout", "600"],
    ) else {
        return;
    };
    let a = vmm.call("PUT", "/v1/vm/shutdown", Some(r#"{"timeout_ms":600000}"#));
    assert_eq!(a.status, 202);
    assert_eq!(a.body["power_button"], true, "{}", a.body);
    // The guest ignores the button; one SIGINT only presses it again, a second stops the VM.
    signal(&vmm, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["state"], "running");
    signal(&vmm, libc::SIGINT);
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(6), "{err}");
    assert!(
        err.contains("SIGINT: pressed the guest's power button"),
        "{err}"
    );
    assert!(err.contains("SIGINT again: stopping the VM now"), "{err}");
}

#[test]
fn sigterm_presses_the_power_button_and_a_guest_that_powers_off_ends_pvmm_with_0() {
    let Some(vmm) = listening_vmm("signals-term-off", &power_off_on_the_button(), &[]) else {
        return;
    };
    assert_eq!(vmm.ok("GET", "/v1/vm", None)["state"], "running");
    signal(&vmm, libc::SIGTERM);
    let socket = vmm.socket.clone();
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(0), "{err}");
    assert!(
        err.contains("SIGTERM: pressed the guest's power button"),
        "{err}"
    );
    assert!(err.contains("placement summary"), "{err}");
    assert!(!socket.exists());
}

#[test]
fn sigint_stops_a_guest_that_ignores_the_button_once_the_shutdown_timeout_has_passed() {
    let Some(vmm) = listening_vmm(
        "signals-int-timeout",
        &ignoring_the_button(),
        &["--shutdown-timeout", "1"],
    ) else {
        return;
    };
    let asked = Instant::now();
    signal(&vmm, libc::SIGINT);
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(6), "{err}");
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "stopped before --shutdown-timeout 1 had passed: {err}"
    );
    assert!(
        err.contains("SIGINT: pressed the guest's power button; stopping it in 1000 ms"),
        "{err}"
    );
    assert!(err.contains("placement summary"), "{err}");
}

#[test]
fn without_shutdown_timeout_a_signalled_guest_gets_10_s_to_power_off() {
    let Some(vmm) = listening_vmm("signals-default-timeout", &ignoring_the_button(), &[]) else {
        return;
    };
    let asked = Instant::now();
    signal(&vmm, libc::SIGTERM);
    let (status, err) = vmm.finish_within(Duration::from_secs(40));
    assert_eq!(status, Some(6), "{err}");
    assert!(
        asked.elapsed() >= Duration::from_secs(10),
        "stopped before the default 10 s had passed: {err}"
    );
    assert!(err.contains("stopping it in 10000 ms"), "{err}");
}

#[test]
fn a_kept_connection_serves_request_after_request_on_one_thread() {
    let Some(vmm) = Vmm::start("api-keepalive", &[]) else {
        return;
    };
    // The start-up probe's one-shot connections end once their client has closed.
    let start = Instant::now();
    while api_conn_threads(vmm.child.id()) > 0 {
        assert!(start.elapsed() < SOCKET_WAIT, "one-shot connections linger");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut conn = pvmm::api::client::Connection::new(&vmm.socket);
    for _ in 0..20 {
        let a = conn
            .request("GET", "/v1/vm", None)
            .expect("kept connection");
        assert_eq!(a.status, 200, "{}", a.body);
        let a = conn
            .request("PUT", "/v1/policy", Some(r#"{"policy":"balance"}"#))
            .expect("kept connection");
        assert_eq!(a.status, 200, "{}", a.body);
        // One connection, one thread serving it, whatever the number of requests.
        assert_eq!(api_conn_threads(vmm.child.id()), 1);
    }
    // A one-shot client still gets its answer and a closed connection.
    assert_eq!(vmm.call("GET", "/v1/vm", None).status, 200);
    vmm.ok("PUT", "/v1/vm/shutdown", Some(r#"{"timeout_ms":0}"#));
    let (status, err) = vmm.finish();
    assert_eq!(status, Some(6), "{err}");
}

/// pvmm's API connection threads, from /proc.
fn api_conn_threads(pid: u32) -> usize {
    common::thread_names(&pid.to_string())
        .iter()
        .filter(|n| *n == "pvmm-api-conn")
        .count()
}
