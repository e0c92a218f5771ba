//! pvmm devices.
