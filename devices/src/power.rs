//! Guest power-off and reset.
//!
//! pvmm describes a hardware-reduced ACPI platform: there are no PM1 blocks, so the guest
//! powers off by writing `SLP_TYP << 2 | SLP_EN` to the FADT's sleep control register, and
//! resets by writing the FADT's reset value to its reset register. Both registers live in one
//! small I/O port block served by [`AcpiPowerDevice`]. Guests booted with `reboot=k` reset
//! through the i8042 keyboard controller instead, served by [`I8042ResetDevice`].

use crate::bus::BusDevice;
use crate::events::SharedEvents;

/// First I/O port of the ACPI power block (sleep control, sleep status, reset).
pub const ACPI_POWER_PORT_BASE: u16 = 0x600;
/// Number of ports in the ACPI power block.
pub const ACPI_POWER_PORT_LEN: u16 = 3;
/// Offset of the sleep control register in the block.
pub const SLEEP_CONTROL_OFFSET: u64 = 0;
/// Offset of the sleep status register in the block.
pub const SLEEP_STATUS_OFFSET: u64 = 1;
/// Offset of the reset register in the block.
pub const RESET_OFFSET: u64 = 2;
/// The value the guest writes to the reset register (FADT RESET_VALUE).
pub const RESET_VALUE: u8 = 1;
/// The sleep type pvmm's DSDT gives for S5 (`\_S5_`): any value works as long as the DSDT
/// and this device agree; 5 mirrors the state number.
pub const S5_SLEEP_TYPE: u8 = 5;
/// SLP_EN bit of the sleep control register (ACPI 6.x, 4.8.3.7).
const SLP_EN: u8 = 1 << 5;
/// SLP_TYP field of the sleep control register: bits 2..=4.
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0b111;
/// WAK_STS bit of the sleep status register: set when the platform has woken.
const WAK_STS: u8 = 1 << 7;

/// The i8042 command/status port.
pub const I8042_COMMAND_PORT: u16 = 0x64;
/// The i8042 command that pulses the CPU reset line.
const I8042_CMD_RESET_CPU: u8 = 0xfe;

/// What the guest asked the platform to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerEvent {
    /// The guest entered S5 (soft off).
    PowerOff,
    /// The guest asked for a platform reset (reboot).
    Reset,
}

/// Receives power events raised by devices.
pub type PowerEventSink = Box<dyn Fn(PowerEvent) + Send>;

/// The ACPI hardware-reduced sleep control/status and reset registers. Writes that ask for
/// nothing pvmm implements (other sleep states, a wrong reset value, other registers) are
/// ignored and reported as [`GuestEvents::ignored_power_write`]; clearing WAK_STS in the
/// status register (write 1 to clear) is accepted silently. Reads never count: the status
/// register reads awake, the others read 0.
///
/// [`GuestEvents::ignored_power_write`]: crate::events::GuestEvents::ignored_power_write
pub struct AcpiPowerDevice {
    sink: PowerEventSink,
    events: SharedEvents,
}

impl AcpiPowerDevice {
    /// A device that reports power events to `sink` and guest mistakes to `events`.
    pub fn new(sink: PowerEventSink, events: SharedEvents) -> Self {
        Self { sink, events }
    }
}

impl BusDevice for AcpiPowerDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == SLEEP_STATUS_OFFSET {
            // pvmm never suspends; report "awake" so a guest polling WAK_STS proceeds.
            if let Some(b) = data.first_mut() {
                *b = WAK_STS;
            }
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            self.events.ignored_power_write();
            return;
        };
        match offset {
            SLEEP_CONTROL_OFFSET if value & SLP_EN != 0 => {
                let sleep_type = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
                if sleep_type == S5_SLEEP_TYPE {
                    (self.sink)(PowerEvent::PowerOff);
                } else {
                    self.events.ignored_power_write();
                }
            }
            RESET_OFFSET if value == RESET_VALUE => (self.sink)(PowerEvent::Reset),
            // WAK_STS is write-1-to-clear; ACPICA clears it before every sleep, S5 included,
            // so this write is part of a normal power-off, not a mistake.
            SLEEP_STATUS_OFFSET if value & !WAK_STS == 0 => {}
            _ => self.events.ignored_power_write(),
        }
    }
}

/// The reset line of an i8042 keyboard controller (port 0x64, command 0xFE) and nothing else.
///
/// Status reads return 0 ("input buffer empty") so Linux's `reboot=k` path does not spin
/// waiting for a controller that is not there. Other commands are ignored and reported as
/// [`GuestEvents::ignored_power_write`].
///
/// [`GuestEvents::ignored_power_write`]: crate::events::GuestEvents::ignored_power_write
pub struct I8042ResetDevice {
    sink: PowerEventSink,
    events: SharedEvents,
}

impl I8042ResetDevice {
    /// A device that reports resets to `sink` and guest mistakes to `events`.
    pub fn new(sink: PowerEventSink, events: SharedEvents) -> Self {
        Self { sink, events }
    }
}

impl BusDevice for I8042ResetDevice {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.first() == Some(&I8042_CMD_RESET_CPU) {
            (self.sink)(PowerEvent::Reset);
        } else {
            self.events.ignored_power_write();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{GuestErrorCounter, NoEvents};
    use std::sync::{Arc, Mutex};

    fn recording() -> (PowerEventSink, Arc<Mutex<Vec<PowerEvent>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        (Box::new(move |e| l.lock().unwrap().push(e)), log)
    }

    #[test]
    fn s5_with_slp_en_powers_off() {
        let (sink, log) = recording();
        let mut dev = AcpiPowerDevice::new(sink, Arc::new(NoEvents));
        dev.write(SLEEP_CONTROL_OFFSET, &[S5_SLEEP_TYPE << SLP_TYP_SHIFT]); // no SLP_EN
        assert!(log.lock().unwrap().is_empty());
        dev.write(
            SLEEP_CONTROL_OFFSET,
            &[(S5_SLEEP_TYPE << SLP_TYP_SHIFT) | SLP_EN],
        );
        assert_eq!(*log.lock().unwrap(), vec![PowerEvent::PowerOff]);
    }

    #[test]
    fn other_sleep_states_and_bad_writes_are_ignored() {
        let (sink, log) = recording();
        let errors = Arc::new(GuestErrorCounter::default());
        let mut dev = AcpiPowerDevice::new(sink, errors.clone());
        dev.write(SLEEP_CONTROL_OFFSET, &[(3 << SLP_TYP_SHIFT) | SLP_EN]);
        dev.write(RESET_OFFSET, &[RESET_VALUE + 1]);
        dev.write(RESET_OFFSET, &[]);
        dev.write(99, &[1, 2, 3, 4]);
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(errors.total(), 4);
        dev.write(RESET_OFFSET, &[RESET_VALUE, 0]);
        assert_eq!(*log.lock().unwrap(), vec![PowerEvent::Reset]);
    }

    #[test]
    fn clearing_wak_sts_before_power_off_is_no_mistake() {
        let (sink, log) = recording();
        let errors = Arc::new(GuestErrorCounter::default());
        let mut dev = AcpiPowerDevice::new(sink, errors.clone());
        dev.write(SLEEP_STATUS_OFFSET, &[WAK_STS]);
        dev.write(
            SLEEP_CONTROL_OFFSET,
            &[(S5_SLEEP_TYPE << SLP_TYP_SHIFT) | SLP_EN],
        );
        assert_eq!(errors.total(), 0);
        assert_eq!(*log.lock().unwrap(), vec![PowerEvent::PowerOff]);
        dev.write(SLEEP_STATUS_OFFSET, &[WAK_STS | 1]);
        assert_eq!(errors.total(), 1);
    }

    #[test]
    fn status_reads_awake() {
        let (sink, _) = recording();
        let mut dev = AcpiPowerDevice::new(sink, Arc::new(NoEvents));
        let mut b = [0u8; 2];
        dev.read(SLEEP_STATUS_OFFSET, &mut b);
        assert_eq!(b, [WAK_STS, 0]);
    }

    #[test]
    fn i8042_reset_command() {
        let (sink, log) = recording();
        let errors = Arc::new(GuestErrorCounter::default());
        let mut dev = I8042ResetDevice::new(sink, errors.clone());
        dev.write(0, &[0xaa]);
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(errors.total(), 1);
        dev.write(0, &[0xfe]);
        assert_eq!(*log.lock().unwrap(), vec![PowerEvent::Reset]);
    }
}
