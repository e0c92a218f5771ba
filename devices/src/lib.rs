//! pvmm's emulated devices.
//!
//! Each device is a small state machine behind the [`bus::BusDevice`] trait, so the vCPU run
//! loop in `pvmm` can dispatch port I/O and MMIO exits without knowing what sits behind an
//! address. Devices never panic on guest input: what they cannot serve (odd sizes and offsets,
//! writes to read-only registers, addresses no device claims) is ignored and reported through
//! [`events::GuestEvents`].
//!
//! - [`bus`]: the address-range bus that routes guest accesses to devices.
//! - [`events`]: the one trait through which the bus and the devices report guest mistakes.
//! - [`serial`]: the 16550A UART console on COM1 (vm-superio), wired to an interrupt.
//! - [`cppc`]: per-vCPU ACPI CPPC registers: the performance each vCPU really has, live.
//! - [`ged`]: the ACPI Generic Event Device that notifies the guest of capacity changes.
//! - [`power`]: the ACPI hardware-reduced sleep control/status and reset registers, plus the
//!   i8042 reset line, turning guest power-off and reboot into [`power::PowerEvent`]s.
//! - [`virtio`]: virtio 1.x devices (disk, entropy) on the virtio-mmio transport.

pub mod bus;
pub mod cppc;
pub mod events;
pub mod ged;
pub mod power;
pub mod serial;
pub mod virtio;
