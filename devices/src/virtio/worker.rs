//! A device's worker thread: it waits on its queues' notify eventfds and serves the queue
//! that was notified, then interrupts the guest if the driver wants to know.
//!
//! The VMM registers the same eventfds with KVM as ioeventfds on the QueueNotify register, so
//! a guest's notification wakes this thread straight from the kernel: the vCPU never returns
//! to pvmm for it. Device work thus runs on a thread of its own (`pvmm-blk0`, `pvmm-rng0`),
//! which pvmm confines with its own seccomp filter and places with its other threads.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use virtio_queue::QueueT;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::{MmioTransport, Transport, INT_USED_BUFFER};

/// The epoll token of the stop eventfd; queue `i` is token `i`.
const STOP_TOKEN: u64 = u64::MAX;
/// The epoll token of the device's backend file.
const BACKEND_TOKEN: u64 = u64::MAX - 1;
/// Events taken from epoll per wait: one per queue is plenty for these devices.
const EVENTS_PER_WAIT: usize = 8;

/// A running worker and what stops it.
pub struct Worker {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts serving `transport`'s queues on a thread named `name`; `confine` runs first on
    /// that thread (pvmm's seccomp filter).
    pub fn spawn(
        name: &str,
        transport: MmioTransport,
        confine: Box<dyn FnOnce() + Send>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let epoll = Epoll::new()?;
        for (i, fd) in transport.notifiers().iter().enumerate() {
            epoll.ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, i as u64),
            )?;
        }
        epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP_TOKEN),
        )?;
        let backend = transport.lock().device.backend();
        if let Some((fd, _)) = backend {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, BACKEND_TOKEN),
            )?;
        }
        let backend_queue = backend.map(|(_, queue)| queue);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                confine();
                serve(&epoll, &transport, backend_queue);
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the worker once the request it is serving (if any) is done, and joins it.
    pub fn stop(&mut self) {
        // A full counter is already readable: the thread wakes either way.
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The worker's loop: until the stop eventfd is written.
fn serve(epoll: &Epoll, transport: &MmioTransport, backend_queue: Option<usize>) {
    let mut events = [EpollEvent::default(); EVENTS_PER_WAIT];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        for e in &events[..n] {
            if e.data() == STOP_TOKEN {
                return;
            }
            if e.data() == BACKEND_TOKEN {
                if let Some(index) = backend_queue {
                    backend_ready(transport, index);
                }
                continue;
            }
            // Past usize (a 32-bit host) is no queue's token either.
            let index = usize::try_from(e.data()).unwrap_or(usize::MAX);
            if let Some(fd) = transport.notifiers().get(index) {
                // Reading resets the counter; several notifications are one wake-up.
                let _ = fd.read();
                notified(transport, index);
            }
        }
    }
}

/// Queue `index` was notified: serve it if the device is live, else count the mistake.
pub fn notified(transport: &MmioTransport, index: usize) {
    serve_queue(transport, index, true);
}

/// The device's backend has work for queue `index`: serve it if the device is live (before
/// that, the work waits in the backend).
pub fn backend_ready(transport: &MmioTransport, index: usize) {
    serve_queue(transport, index, false);
}

/// Serves queue `index`; `by_guest`: a notification, which is a mistake unless the device is
/// live and the queue ready.
fn serve_queue(transport: &MmioTransport, index: usize, by_guest: bool) {
    let events = transport.events().clone();
    let mut t = transport.lock();
    if !t.live() {
        if by_guest {
            events.virtio_error();
        }
        return;
    }
    let Transport {
        device,
        queues,
        mem,
        ..
    } = &mut *t;
    let Some(queue) = queues.get_mut(index).filter(|q| q.ready()) else {
        if by_guest {
            events.virtio_error();
        }
        return;
    };
    let mut used = false;
    let served = loop {
        let progress = match device.process_queue(index, queue, mem, events.as_ref()) {
            Ok(progress) => progress,
            Err(e) => break Err(e),
        };
        used |= progress;
        // With event indexes the driver notifies only once it passes the available index the
        // device names: name the next one, and serve what the driver added while this pass
        // ran, for which it may not notify. A pass that used nothing (a receive queue with
        // buffers but no frames) ends the round: the backend's readiness brings the next.
        match queue.enable_notification(mem) {
            Ok(true) if progress => continue,
            Ok(_) => break Ok(()),
            Err(e) => break Err(e.into()),
        }
    };
    match served {
        Ok(()) => {
            if used && queue.needs_notification(mem).unwrap_or(true) {
                transport.interrupt().raise(INT_USED_BUFFER);
            }
        }
        Err(_) => {
            events.virtio_error();
            t.needs_reset(transport.interrupt());
        }
    }
}
