//! KVM objects: the VM (memory slots, in-kernel irqchip and PIT), its vCPUs, their binary
//! statistics, and the lifecycle of their threads (run, pause, stop, join).
//!
//! Kept apart from configuration and devices: this module knows ioctls, not policies.

pub mod handle;
pub mod msr;
pub mod stats;
pub mod vcpu;
pub mod vm;
