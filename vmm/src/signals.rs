//! What pvmm does with the signals an operator or a service manager sends.
//!
//! - SIGTERM, SIGINT: a clean shutdown, as `PUT /v1/vm/shutdown` does it: the ACPI power button
//!   if the guest listens for it, a stop after `--shutdown-timeout` if it has not powered off
//!   (or at once if it does not listen). pvmm then exits with its usual status (0 when the
//!   guest powered off, 6 when pvmm stopped it) and prints its summary line.
//! - A second SIGINT (a user pressing Ctrl-C again): stop at once.
//! - SIGHUP: ignored while stdin is not a terminal (pvmm under a service manager or `nohup`);
//!   with a terminal, whose hang-up ends the session, it is SIGTERM.
//!
//! The signals are received on a thread of their own (`pvmm-signals`, through signal-hook's
//! self-pipe), so nothing but a pipe write runs in signal context.

use std::io::IsTerminal;
use std::sync::Arc;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

use crate::api::VmControl;
use crate::seccomp::{SeccompFilters, ThreadKind};

/// The signal thread and the handle that ends it.
pub struct SignalThread {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl SignalThread {
    /// Starts answering SIGTERM, SIGINT and SIGHUP for `vm`, on a thread confined by the
    /// signals seccomp filter.
    pub fn spawn(
        vm: Arc<dyn VmControl>,
        seccomp: Arc<SeccompFilters>,
    ) -> std::io::Result<SignalThread> {
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])?;
        let handle = signals.handle();
        let hup_is_term = std::io::stdin().is_terminal();
        let thread = std::thread::Builder::new()
            .name("pvmm-signals".into())
            .spawn(move || {
                seccomp.confine(ThreadKind::Signals);
                let mut interrupts = 0;
                for signal in signals.forever() {
                    let name = match signal {
                        SIGINT => "SIGINT",
                        SIGHUP if !hup_is_term => continue,
                        SIGHUP => "SIGHUP",
                        _ => "SIGTERM",
                    };
                    if signal == SIGINT {
                        interrupts += 1;
                        if interrupts > 1 {
                            eprintln!("pvmm: SIGINT again: stopping the VM now");
                            vm.stop_now();
                            continue;
                        }
                    }
                    let done = vm.shutdown(None);
                    if done.power_button {
                        eprintln!(
                            "pvmm: {name}: pressed the guest's power button; stopping it in {} ms if it has not powered off",
                            done.stop_after_ms
                        );
                    } else {
                        eprintln!("pvmm: {name}: the guest does not listen for the power button; stopping it");
                    }
                }
            })?;
        Ok(SignalThread {
            handle,
            thread: Some(thread),
        })
    }

    /// Ends and joins the thread.
    pub fn stop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
