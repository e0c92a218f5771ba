//! pvmm: a power-aware KVM virtual machine monitor.
//!
//! The binary (`src/main.rs`) parses flags ([`cli`]) into a [`config::VmConfig`], and
//! [`vmm::start`] builds the VM: guest memory ([`memory`], [`layout`]), ACPI tables
//! ([`acpi`], with the guest's CPPC performance scale and frequencies from [`cppc`]), the
//! kernel ([`boot`]), KVM objects ([`vstate`]) with per-vCPU CPUID ([`cpuid`]), and the devices from the `pvmm-devices` crate. How a run ends and its exit
//! status are in [`exit`]. A started VM is a [`running::RunningVm`]; the control socket
//! ([`api`], on the `pvmm-api` crate's protocol) acts on it through [`api::VmControl`].
//! `pvmm host` runs the `pvmm-host` crate's daemon, which places every VM of the host with one
//! engine.
//!
//! Dependencies point one way: [`config`] and [`vstate`] (KVM objects) know nothing of
//! [`live`] placement; [`live`] reads KVM statistics through [`vstate`] and the vCPU threads'
//! accounting through the `pvmm-tick` crate's `procfs`, which the CPPC device's feedback
//! counters share.

pub mod acpi;
pub mod api;
pub mod boot;
pub mod cli;
pub mod config;
pub mod console;
pub mod cppc;
pub mod cpuid;
pub mod exit;
pub mod layout;
pub mod live;
pub mod memory;
pub mod running;
pub mod seccomp;
pub mod signals;
pub mod vmm;
pub mod vstate;
