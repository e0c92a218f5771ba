//! The serial console's input: pvmm's stdin fed to the guest's UART on a thread of its own
//! (`console-in`), which ends with its VM.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pvmm_devices::serial::SerialConsole;
use vmm_sys_util::eventfd::EventFd;

use crate::seccomp::{SeccompFilters, ThreadKind};

/// How long to wait for a retry when the UART's receive FIFO is full.
const SERIAL_INPUT_RETRY: Duration = Duration::from_millis(10);
/// Host input is read in chunks of this size.
const SERIAL_INPUT_CHUNK: usize = 64;

/// The console-input thread and what ends it.
pub struct ConsoleInput {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl ConsoleInput {
    /// Ends and joins the thread, which lets go of the serial console (and its interrupt
    /// eventfd). Reading stdin stops; anything typed later stays in stdin.
    pub fn stop(&mut self) {
        // An eventfd write fails only when its counter would overflow: it is readable then.
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Feeds pvmm's stdin to the guest's serial console until stdin ends or the VM stops, on a
/// thread confined by the console seccomp filter. The thread waits in `poll` on stdin and on an
/// eventfd that [`ConsoleInput::stop`] writes, so it ends with its VM even while stdin stays
/// open (a terminal, a service manager's pipe): a process that runs VM after VM keeps no
/// thread, and no serial console, of a VM that has ended. `None` when the thread could not be
/// started: the guest still runs, without console input.
pub fn spawn_console_input(
    serial: Arc<Mutex<SerialConsole>>,
    seccomp: Arc<SeccompFilters>,
) -> Option<ConsoleInput> {
    let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK).ok()?);
    let thread_stop = stop.clone();
    let thread = std::thread::Builder::new()
        .name("console-in".into())
        .spawn(move || {
            seccomp.confine(ThreadKind::ConsoleInput);
            copy_input(&serial, &thread_stop);
        })
        .ok()?;
    Some(ConsoleInput {
        stop,
        thread: Some(thread),
    })
}

/// What woke the console thread.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// The VM is stopping (or `poll` itself failed): the thread ends.
    Stop,
    /// Stdin has input, has ended or is in error: `read` says which.
    Input,
    /// The timeout passed.
    Timeout,
}

/// Waits for the stop eventfd and, with `stdin`, for stdin; `timeout_ms` -1 waits forever.
fn wait(stop: &EventFd, stdin: bool, timeout_ms: libc::c_int) -> Wake {
    let mut fds = [
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let count: libc::nfds_t = if stdin { 2 } else { 1 };
    loop {
        // SAFETY: `fds` holds at least `count` initialized entries.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout_ms) };
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Wake::Stop;
        }
        return if fds[0].revents != 0 {
            Wake::Stop
        } else if ready == 0 {
            Wake::Timeout
        } else {
            Wake::Input
        };
    }
}

/// The console thread: copies stdin to the UART's receive FIFO, waiting for room when it is
/// full, until stdin ends or `stop` is written. Stdin is read directly, not through Rust's
/// buffered `Stdin`, so that `poll` sees everything not yet copied.
fn copy_input(serial: &Mutex<SerialConsole>, stop: &EventFd) {
    let mut buf = [0u8; SERIAL_INPUT_CHUNK];
    let retry_ms =
        libc::c_int::try_from(SERIAL_INPUT_RETRY.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        if wait(stop, true, -1) == Wake::Stop {
            return;
        }
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        // Negative on an error, else the bytes read.
        let Ok(n) = usize::try_from(n) else {
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                _ => return,
            }
        };
        if n == 0 {
            return;
        }
        let mut pending = &buf[..n];
        while !pending.is_empty() {
            let taken = match serial.lock() {
                Ok(mut s) => s.enqueue_input(pending).unwrap_or(0),
                Err(_) => return,
            };
            pending = &pending[taken..];
            if !pending.is_empty() && wait(stop, false, retry_ms) == Wake::Stop {
                return;
            }
        }
    }
}
