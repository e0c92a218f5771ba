//! The control socket: `pvmm --api-socket PATH` serves HTTP/1.1 with JSON bodies on a Unix
//! socket, so `curl --unix-socket PATH http://localhost/v1/vm` works.
//!
//! - [`http`]: framing (httparse), limits, responses;
//! - [`routes`]: paths, methods and bodies turned into checked [`routes::ApiRequest`]s;
//! - this module: the socket itself, a thread per connection, and [`VmControl`], the seam
//!   between requests and the running VM.
//!
//! A request is checked completely before anything changes, so a bad one changes nothing.

pub mod ctl;

pub use pvmm_api::{client, http, routes};

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pvmm_api::messages::{
    ExternalAnswer, PolicyAnswer, ShutdownAnswer, StateAnswer, VcpusAnswer, VmInfo,
};
use pvmm_api::stats::VmStats;
use serde::Serialize;

use self::http::{read_request, write_response, HttpResponse, ReadFailure, IO_TIMEOUT};
use self::routes::{parse_request, ApiRequest, VmShape};
use crate::config::PlacementPolicy;
use crate::live::control::ExternalAssignment;
use crate::seccomp::{SeccompFilters, ThreadKind};
use crate::vstate::handle::HandleError;

/// Connections served at once; more are answered 503 at once. A few clients (an operator, a
/// host balancer) are expected; the bound keeps a flood to a fixed number of threads.
const MAX_CONNECTIONS: usize = 16;
/// What a connection may still send after its answer before pvmm closes it anyway.
const LINGER_BYTES: usize = 1 << 20;
/// How long pvmm waits for that.
const LINGER_TIMEOUT: Duration = Duration::from_secs(1);
/// How long stopping the server waits for requests already read to be answered: dispatching
/// and writing one takes well under a millisecond; the bound only keeps a wedged client from
/// delaying pvmm's exit.
const ANSWER_GRACE: Duration = Duration::from_secs(1);
/// Poll interval of that wait.
const ANSWER_POLL: Duration = Duration::from_millis(2);
/// How long stopping the server waits for connection threads to end once their sockets are
/// shut down: a blocked read or write returns at once; a request still being dispatched (a
/// pause waits up to 2 s for each vCPU that does not answer) is left to end by itself after
/// this, so that it cannot hold up pvmm's exit.
const CONNECTION_END_GRACE: Duration = Duration::from_secs(3);
/// The socket file's mode: only its owner (pvmm runs as root) may connect.
const SOCKET_MODE: u32 = 0o600;

/// What the control socket can ask of the running VM.
pub trait VmControl: Send + Sync {
    /// What requests are checked against.
    fn shape(&self) -> VmShape;
    /// `GET /v1/vm`.
    fn info(&self) -> VmInfo;
    /// `GET /v1/placement`: the latest tick's snapshot, if a tick has run.
    fn placement(&self) -> Option<VmStats>;
    /// `GET /v1/vcpus`.
    fn vcpus(&self) -> VcpusAnswer;
    /// Switches the placement policy from the next tick.
    fn set_policy(&self, policy: PlacementPolicy);
    /// Hands placement to an outside balancer (or renews its lease).
    fn set_external(&self, assignments: Vec<ExternalAssignment>);
    /// Takes placement back; `true` if an outside balancer had it.
    fn clear_external(&self) -> bool;
    /// Stops running guest code.
    fn pause(&self) -> Result<(), HandleError>;
    /// Runs guest code again.
    fn resume(&self) -> Result<(), HandleError>;
    /// Power button, then a hard stop after `timeout` (None: the VM's `--shutdown-timeout`);
    /// says which was done.
    fn shutdown(&self, timeout: Option<Duration>) -> ShutdownAnswer;
    /// Ends the VM now, without asking the guest: pvmm stops it (exit 6) unless the guest
    /// ended it first.
    fn stop_now(&self);
}

/// An answer with `body`, the status it is sent with.
fn answer<T: Serialize>(status: u16, body: &T) -> HttpResponse {
    match serde_json::to_value(body) {
        Ok(v) => HttpResponse::new(status, v),
        // The answer types have no maps with non-text keys: serializing them cannot fail.
        Err(e) => HttpResponse::error(500, format!("answer not written: {e}")),
    }
}

/// Answers one checked request.
pub fn dispatch(request: ApiRequest, vm: &dyn VmControl) -> HttpResponse {
    let state = |state: &str| {
        answer(
            200,
            &StateAnswer {
                state: state.into(),
            },
        )
    };
    match request {
        ApiRequest::GetVm => answer(200, &vm.info()),
        ApiRequest::GetPlacement => match vm.placement() {
            Some(snapshot) => answer(200, &snapshot),
            None => HttpResponse::error(503, "no placement tick has run yet"),
        },
        ApiRequest::GetVcpus => answer(200, &vm.vcpus()),
        ApiRequest::SetPolicy(policy) => {
            vm.set_policy(policy);
            let applies = "next tick".into();
            answer(200, &PolicyAnswer { applies, policy })
        }
        ApiRequest::SetExternal(assignments) => {
            let n = assignments.len();
            vm.set_external(assignments);
            answer(
                200,
                &ExternalAnswer {
                    assignments: Some(n),
                    external: true,
                    was_external: None,
                },
            )
        }
        ApiRequest::ClearExternal => {
            let was = vm.clear_external();
            answer(
                200,
                &ExternalAnswer {
                    assignments: None,
                    external: false,
                    was_external: Some(was),
                },
            )
        }
        ApiRequest::Pause => match vm.pause() {
            Ok(()) => state("paused"),
            Err(e) => HttpResponse::error(409, e.to_string()),
        },
        ApiRequest::Resume => match vm.resume() {
            Ok(()) => state("running"),
            Err(e) => HttpResponse::error(409, e.to_string()),
        },
        ApiRequest::Shutdown(timeout) => answer(202, &vm.shutdown(timeout)),
    }
}

/// Errors in setting up the socket.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Another process is listening on the path.
    #[error("--api-socket {0}: another process is listening on it")]
    InUse(PathBuf),
    /// The path exists and is not a socket: pvmm will not remove it.
    #[error("--api-socket {0}: exists and is not a socket")]
    NotASocket(PathBuf),
    /// Binding or setting up the socket failed.
    #[error("--api-socket {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Error.
        source: std::io::Error,
    },
}

/// A bound control socket, not yet serving; dropped unserved (pvmm failed to start), it
/// removes its file.
pub struct ApiSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        if self.listener.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl ApiSocket {
    /// Binds `path` with mode 0600. A stale socket file (nobody listening) is replaced; a live
    /// one, or a file that is not a socket, is refused.
    pub fn bind(path: &Path) -> Result<Self, ApiError> {
        let io = |source| ApiError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(ApiError::NotASocket(path.to_path_buf()));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(ApiError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(io)?;
        }
        // The socket file is created with mode 0600 (umask 0177 around bind), so that there is
        // no moment at which others may connect; pvmm binds before it starts any thread, so
        // the process-wide umask changes under no one else.
        // SAFETY: umask has no preconditions and cannot fail.
        let old = unsafe { libc::umask(0o777 & !SOCKET_MODE) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above; restores the previous mask.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(io)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(io)?;
        Ok(Self {
            listener: Some(listener),
            path: path.to_path_buf(),
        })
    }

    /// Serves requests against `vm` on a thread named `pvmm-api`, confined by the API seccomp
    /// filter (which its connection threads inherit), until the returned server is stopped.
    pub fn serve(
        mut self,
        vm: Arc<dyn VmControl>,
        seccomp: Arc<SeccompFilters>,
    ) -> std::io::Result<ApiServer> {
        let stop = Arc::new(AtomicBool::new(false));
        let accept_stop = stop.clone();
        let answering = Arc::new(AtomicUsize::new(0));
        let Some(listener) = self.listener.take() else {
            return Err(std::io::Error::other("control socket already served"));
        };
        let thread = std::thread::Builder::new()
            .name("pvmm-api".into())
            .spawn(move || {
                seccomp.confine(ThreadKind::Api);
                accept_loop(&listener, vm, &accept_stop, &answering);
            })?;
        Ok(ApiServer {
            path: std::mem::take(&mut self.path),
            stop,
            thread: Some(thread),
        })
    }
}

/// A serving control socket; stopping it removes the socket file.
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Stops accepting and joins the accept thread, which first ends every connection and
    /// joins its thread (see `Connections::close`), then removes the socket file. When this
    /// returns, no thread of the control socket is left and no connection holds the VM, but
    /// for a request still being dispatched after the grace, which is named on stderr.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept call with a connection of our own.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A connection being served: its thread, and the socket it shares with that thread, through
/// which stopping the server ends a connection blocked reading its client's next request.
/// The socket is shared (not duplicated), so its descriptor stays open, and its number
/// taken, until both are done with it.
struct Connection {
    stream: Arc<UnixStream>,
    thread: std::thread::JoinHandle<()>,
}

/// The accept thread's connections, which it alone starts, ends and joins.
#[derive(Default)]
struct Connections(Vec<Connection>);

impl Connections {
    /// Joins the connections whose clients have gone (their threads have ended), so that
    /// the list holds live connections only.
    fn reap(&mut self) {
        let (done, live): (Vec<Connection>, Vec<Connection>) = std::mem::take(&mut self.0)
            .into_iter()
            .partition(|c| c.thread.is_finished());
        for c in done {
            let _ = c.thread.join();
        }
        self.0 = live;
    }

    /// Ends every connection: lets requests already read get their answers (for at most
    /// [`ANSWER_GRACE`]: the request that stopped the VM may be one of them), then shuts each
    /// socket down, which returns its thread from a blocked read or write at once, and joins
    /// the threads. A thread still busy after [`CONNECTION_END_GRACE`] is named on stderr and
    /// left to end by itself.
    fn close(mut self, answering: &AtomicUsize) {
        let start = std::time::Instant::now();
        while answering.load(Ordering::Acquire) > 0 && start.elapsed() < ANSWER_GRACE {
            std::thread::sleep(ANSWER_POLL);
        }
        for c in &self.0 {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        let start = std::time::Instant::now();
        while self.0.iter().any(|c| !c.thread.is_finished())
            && start.elapsed() < CONNECTION_END_GRACE
        {
            std::thread::sleep(ANSWER_POLL);
        }
        let stuck = self.0.iter().filter(|c| !c.thread.is_finished()).count();
        if stuck > 0 {
            eprintln!(
                "pvmm: {stuck} control connection thread(s) did not end within {} ms; left running",
                CONNECTION_END_GRACE.as_millis()
            );
        }
        self.reap();
    }
}

fn accept_loop(
    listener: &UnixListener,
    vm: Arc<dyn VmControl>,
    stop: &AtomicBool,
    answering: &Arc<AtomicUsize>,
) {
    let mut connections = Connections::default();
    for stream in listener.incoming() {
        connections.reap();
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut stream) = stream else {
            continue;
        };
        if connections.0.len() >= MAX_CONNECTIONS {
            let busy = HttpResponse::error(503, "too many connections; try again");
            let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
            let _ = write_response(&mut stream, &busy, false);
            continue;
        }
        let stream = Arc::new(stream);
        let served = stream.clone();
        let vm = vm.clone();
        let answering = answering.clone();
        let spawned = std::thread::Builder::new()
            .name("pvmm-api-conn".into())
            .spawn(move || serve_connection(&served, vm.as_ref(), &answering));
        if let Ok(thread) = spawned {
            connections.0.push(Connection { stream, thread });
        }
    }
    connections.close(answering);
}

/// Answers the connection's requests one after another until the client asks to close, sends
/// something pvmm refuses to frame, goes away, is silent for [`IO_TIMEOUT`], or the server
/// stops (which shuts the socket down under it).
fn serve_connection(stream: &UnixStream, vm: &dyn VmControl, answering: &AtomicUsize) {
    serve_requests(stream, vm, answering);
    // The accept thread holds the socket until it reaps the connection, which may be long
    // after: shut it down now, so that a client that went quiet or left mid-request sees its
    // connection end.
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// [`serve_connection`]'s requests, until one of the ends it lists.
fn serve_requests(stream: &UnixStream, vm: &dyn VmControl, answering: &AtomicUsize) {
    if stream.set_read_timeout(Some(IO_TIMEOUT)).is_err()
        || stream.set_write_timeout(Some(IO_TIMEOUT)).is_err()
    {
        return;
    }
    // `&UnixStream` reads and writes: the accept thread keeps the other reference.
    let mut stream = stream;
    loop {
        let request = match read_request(&mut stream) {
            Ok(request) => Ok(request),
            Err(ReadFailure::Bad(answer)) => Err(answer),
            Err(ReadFailure::Gone) => return,
        };
        answering.fetch_add(1, Ordering::AcqRel);
        let (response, keep_alive) = match request {
            Ok(request) => {
                let response = match parse_request(&request, &vm.shape()) {
                    Ok(api) => dispatch(api, vm),
                    Err(answer) => answer,
                };
                (response, request.keep_alive)
            }
            Err(answer) => (answer, false),
        };
        // A client that went away before reading its answer costs nothing more.
        let written = write_response(&mut stream, &response, keep_alive);
        answering.fetch_sub(1, Ordering::AcqRel);
        if written.is_err() {
            return;
        }
        if !keep_alive {
            linger(stream);
            return;
        }
    }
}

/// After answering, reads and drops what the client may still be sending (a body pvmm refused
/// from its head alone), bounded in bytes and time: closing a Unix socket with unread data
/// resets it, and the client would lose the answer.
fn linger(mut stream: &UnixStream) {
    use std::io::Read;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(LINGER_TIMEOUT));
    let mut sink = [0u8; 4096];
    let mut left = LINGER_BYTES;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}
