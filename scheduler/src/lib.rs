//! pvmm's placement engine: which host CPUs each vCPU thread may run on.
//!
//! This crate has no KVM dependency. The live VMM (`pvmm`) and the trace-driven
//! simulator (`pvmm-sim`, module [`sim`]) run the same placement code.

pub mod sim;
