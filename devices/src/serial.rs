//! The COM1 console: a 16550A UART (vm-superio) whose interrupt is an eventfd that the VMM
//! registers with KVM as an irqfd.

use std::io::Write;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// COM1's I/O port base.
pub const COM1_PORT_BASE: u16 = 0x3f8;
/// A UART occupies eight consecutive ports.
pub const COM_PORT_LEN: u16 = 8;
/// COM1's ISA interrupt line.
pub const COM1_IRQ: u32 = 4;

/// Raises the UART interrupt by signalling an eventfd.
pub struct EventFdTrigger(EventFd);

impl EventFdTrigger {
    /// Wraps `fd`; the VMM registers a clone of it as the interrupt's irqfd.
    pub fn new(fd: EventFd) -> Self {
        Self(fd)
    }
}

impl Trigger for EventFdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// Errors from the serial console.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// The interrupt eventfd could not be signalled.
    #[error("serial interrupt: {0}")]
    Interrupt(std::io::Error),
}

/// The COM1 console device.
pub struct SerialConsole {
    uart: Serial<EventFdTrigger, NoEvents, Box<dyn Write + Send>>,
}

impl SerialConsole {
    /// A console writing guest output to `out`, raising its interrupt through `irq`.
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: Serial::new(EventFdTrigger::new(irq), out),
        }
    }

    /// Queues host input for the guest; returns how many bytes fit in the receive FIFO.
    pub fn enqueue_input(&mut self, input: &[u8]) -> Result<usize, SerialError> {
        let room = self.uart.fifo_capacity();
        let take = input.len().min(room);
        if take == 0 {
            return Ok(0);
        }
        self.uart
            .enqueue_raw_bytes(&input[..take])
            .map_err(|e| match e {
                vm_superio::serial::Error::Trigger(e) => SerialError::Interrupt(e),
                vm_superio::serial::Error::IOError(e) => SerialError::Interrupt(e),
                vm_superio::serial::Error::FullFifo => {
                    SerialError::Interrupt(std::io::Error::other("receive FIFO full"))
                }
            })
    }
}

impl BusDevice for SerialConsole {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(b), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *b = self.uart.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&b), Ok(off)) = (data.first(), u8::try_from(offset)) {
            // A failed console write (closed stdout) must not stop the guest.
            let _ = self.uart.write(off, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmits_to_output_and_receives_input() {
        let out = Sink::default();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut com = SerialConsole::new(irq.try_clone().unwrap(), Box::new(out.clone()));
        for b in b"hi" {
            com.write(0, &[*b]);
        }
        assert_eq!(&*out.0.lock().unwrap(), b"hi");
        // Enable the "received data available" interrupt, then feed input.
        com.write(1, &[1]);
        assert_eq!(com.enqueue_input(b"ok").unwrap(), 2);
        assert!(irq.read().unwrap() >= 1);
        let mut b = [0u8];
        com.read(0, &mut b);
        assert_eq!(b, [b'o']);
        // Out-of-range offsets are harmless.
        com.write(u64::MAX, &[1]);
        com.read(u64::MAX, &mut b);
    }
}
