//! The `--stats` line of a tick (also the control socket's `GET /v1/placement`), written into
//! a buffer the scheduler reuses every tick, so that reporting allocates nothing once warm.
//!
//! The text is exactly what `serde_json` prints for the same values as a `Value` (the schema's
//! documented form): keys in byte order at every level (`serde_json`'s map without
//! `preserve_order`), no spaces, integers in decimal, floats as `serde_json` writes an `f64`
//! (non-finite ones as `null`), `None` as `null`, strings escaped as `serde_json` escapes them.

use std::fmt::{self, Write as _};
use std::io::Write as _;

use pvmm_scheduler::capacity::CAPACITY_SCALE;

use super::{round3, LiveScheduler};

/// Writes JSON pieces into a byte buffer. Writing to a `Vec` cannot fail, and a `Vec` that is
/// large enough already does not allocate.
struct Json<'a>(&'a mut Vec<u8>);

impl Json<'_> {
    fn raw(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }

    /// `"name":`, preceded by a comma unless it is the object's first member.
    fn key(&mut self, name: &str, first: bool) {
        if !first {
            self.0.push(b',');
        }
        self.0.push(b'"');
        self.0.extend_from_slice(name.as_bytes());
        self.raw("\":");
    }

    fn int(&mut self, v: impl fmt::Display) {
        let _ = write!(self.0, "{v}");
    }

    fn opt_int(&mut self, v: Option<impl fmt::Display>) {
        match v {
            Some(v) => self.int(v),
            None => self.raw("null"),
        }
    }

    fn bool(&mut self, v: bool) {
        self.raw(if v { "true" } else { "false" });
    }

    fn float(&mut self, v: f64) {
        if serde_json::to_writer(&mut *self.0, &v).is_err() {
            self.raw("null");
        }
    }

    /// `v`'s text as a JSON string.
    fn string(&mut self, v: impl fmt::Display) {
        self.0.push(b'"');
        let _ = write!(Escaped(self.0), "{v}");
        self.0.push(b'"');
    }
}

/// Text escaped as `serde_json` escapes a string's characters.
struct Escaped<'a>(&'a mut Vec<u8>);

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for &b in s.as_bytes() {
            match b {
                b'"' => self.0.extend_from_slice(b"\\\""),
                b'\\' => self.0.extend_from_slice(b"\\\\"),
                b'\n' => self.0.extend_from_slice(b"\\n"),
                b'\r' => self.0.extend_from_slice(b"\\r"),
                b'\t' => self.0.extend_from_slice(b"\\t"),
                0x08 => self.0.extend_from_slice(b"\\b"),
                0x0c => self.0.extend_from_slice(b"\\f"),
                0..0x20 => {
                    self.0.extend_from_slice(b"\\u00");
                    self.0.push(HEX[usize::from(b >> 4)]);
                    self.0.push(HEX[usize::from(b & 0xf)]);
                }
                _ => self.0.push(b),
            }
        }
        Ok(())
    }
}

/// `v` as a JSON string.
#[cfg(test)]
pub(super) fn json_string(v: &str) -> String {
    let mut out = Vec::new();
    Json(&mut out).string(v);
    String::from_utf8(out).expect("escaping keeps UTF-8")
}

fn fraction(v: u32) -> f64 {
    round3(f64::from(v) / f64::from(CAPACITY_SCALE))
}

impl LiveScheduler {
    /// Writes this tick's `--stats` line (without its newline) into `out`, replacing what it
    /// held.
    pub(super) fn write_snapshot(&self, out: &mut Vec<u8>, now_ns: u64, moved: u64) {
        out.clear();
        let mut j = Json(out);
        let totals = self.totals.lock().map(|t| t.clone()).unwrap_or_default();
        let capacity = self.capacity.as_ref();
        j.raw("{");
        j.key("capacity_notifications", true);
        j.opt_int(capacity.map(|r| r.notifications()));
        j.key("cppc_enabled", false);
        j.opt_int(capacity.map(|r| r.guest_enabled()));
        j.key("external", false);
        j.bool(self.external);
        j.key("guest_register_errors", false);
        j.opt_int(self.guest_errors.as_ref().map(|e| e.total()));
        j.key("migrations", false);
        j.int(moved);
        j.key("migrations_total", false);
        j.int(totals.migrations);
        j.key("packages", false);
        self.write_packages(&mut j);
        j.key("policy", false);
        j.string(self.policy);
        j.key("policy_changes", false);
        j.int(totals.policy_changes);
        j.key("t_ms", false);
        j.int(now_ns / 1_000_000);
        j.key("vcpus", false);
        self.write_vcpus(&mut j);
        j.raw("}");
    }

    /// Per package: whether it holds vCPUs, and their demand over its capacity.
    fn write_packages(&self, j: &mut Json<'_>) {
        j.raw("[");
        let packages = self.topology.packages().iter().zip(&self.package_capacity);
        for (i, (p, &capacity)) in packages.enumerate() {
            let on = || self.vcpus.iter().filter(|v| v.package == Some(p.id));
            let demand: u32 = on().map(|v| v.tracker.util().util()).sum();
            if i > 0 {
                j.raw(",");
            }
            j.raw("{");
            j.key("active", true);
            j.bool(on().next().is_some());
            j.key("id", false);
            j.int(p.id);
            j.key("util", false);
            j.float(round3(f64::from(demand) / f64::from(capacity.max(1))));
            j.raw("}");
        }
        j.raw("]");
    }

    fn write_vcpus(&self, j: &mut Json<'_>) {
        j.raw("[");
        for (i, v) in self.vcpus.iter().enumerate() {
            if i > 0 {
                j.raw(",");
            }
            j.raw("{");
            j.key("busy", true);
            j.bool(v.tracker.util().is_busy());
            j.key("capacity", false);
            j.int(v.capacity);
            j.key("cpus", false);
            j.string(v.last_cpus.as_ref().unwrap_or(&self.all_cpus));
            j.key("desired", false);
            j.opt_int(self.capacity.as_ref().map(|r| r.guest_desired(v.index)));
            j.key("package", false);
            j.opt_int(v.package);
            j.key("tid", false);
            j.int(v.tid);
            j.key("util", false);
            j.float(fraction(v.tracker.util().util()));
            j.key("vcpu", false);
            j.int(v.index);
            j.key("waited", false);
            j.float(fraction(v.tracker.waited()));
            j.raw("}");
        }
        j.raw("]");
    }
}
