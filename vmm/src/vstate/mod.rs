//! KVM objects: the VM (memory slots, in-kernel irqchip and PIT) and its vCPUs.
//!
//! Kept apart from configuration and devices: this module knows ioctls, not policies.

pub mod vcpu;
pub mod vm;
