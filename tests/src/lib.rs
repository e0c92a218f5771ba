//! Helpers for pvmm end-to-end tests.
