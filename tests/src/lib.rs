//! Helpers for pvmm end-to-end tests.
//!
//! The rig tests need QEMU, busybox-static, apt access to the Debian kernel package and a
//! buildable pvmm. When something is missing they skip with a loud message on stderr, unless
//! `PVMM_REQUIRE_RIG=1` (CI sets it), in which case they fail.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use pvmm_rig::images::{self, L1Images, L1Needs, Workspace, BUSYBOX, QEMU};

/// Environment variable that turns a rig test's skip into a failure.
pub const REQUIRE_RIG_ENV: &str = "PVMM_REQUIRE_RIG";

/// Serializes rig runs: each L1 already keeps both host CPUs busy, so parallel rigs only
/// slow each other down (and would race on rebuilding the images).
static RIG_LOCK: Mutex<()> = Mutex::new(());

/// Whether rig tests must run (fail instead of skipping).
pub fn rig_required() -> bool {
    std::env::var(REQUIRE_RIG_ENV).is_ok_and(|v| v == "1")
}

/// Takes the rig lock for the rest of a test (a panicking test does not poison it for others).
pub fn rig_lock() -> MutexGuard<'static, ()> {
    RIG_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reports that the rig is unavailable: panics when [`rig_required`], else prints a loud
/// SKIPPED banner on stderr.
pub fn rig_unavailable(test: &str, reason: &str) {
    if rig_required() {
        panic!("{test}: the QEMU-nested rig is required ({REQUIRE_RIG_ENV}=1) but unavailable: {reason}");
    }
    eprintln!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !!! SKIPPED {test}: QEMU-nested rig unavailable\n\
         !!! {reason}\n\
         !!! (install qemu-system-x86 busybox-static; set {REQUIRE_RIG_ENV}=1 to fail instead)\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Builds (or reuses) the rig's images, or reports why it cannot and returns None.
/// Call with the [`rig_lock`] held.
pub fn prepare_rig(test: &str, needs: L1Needs) -> Option<(Workspace, L1Images)> {
    if !on_path(QEMU) {
        rig_unavailable(test, &format!("{QEMU} is not on PATH"));
        return None;
    }
    if !Path::new(BUSYBOX).is_file() {
        rig_unavailable(test, &format!("{BUSYBOX} is missing"));
        return None;
    }
    let ws = match Workspace::locate() {
        Ok(ws) => ws,
        Err(error) => {
            rig_unavailable(test, &error.to_string());
            return None;
        }
    };
    match images::build_l1(&ws, needs) {
        Ok(l1) => Some((ws, l1)),
        Err(error) => {
            rig_unavailable(test, &format!("building the rig images failed: {error}"));
            None
        }
    }
}
