//! L1's console: QEMU's output read line by line, the lines sorted by their tags into a
//! [`RigOutcome`], and the L1 kernel reports (soft lockups, panics) that end a run early.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{
    L1Options, RigEnd, RigEvent, RigOutcome, RunOutput, RunStart, L1_LOCKUP_LIMIT, L1_PANIC_MARK,
    L1_SILENCE_LIMIT, POWEROFF_GRACE,
};

/// L1's heartbeat event (not kept in [`RigOutcome::events`]).
const L1_ALIVE_EVENT: &str = "l1-alive";

/// Warnings QEMU prints for every CPUID feature TCG lacks; the rig counts them instead of
/// printing hundreds of lines.
const QEMU_FEATURE_WARNING: &str = "doesn't support requested feature";

pub(super) enum Stream {
    Stdout,
    Stderr,
}

pub(super) fn spawn_reader<R: Read + Send + 'static>(
    reader: R,
    stream: Stream,
    sender: mpsc::Sender<(Stream, String)>,
) {
    let tag = matches!(stream, Stream::Stdout);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer);
                    let line = line.trim_end_matches(['\n', '\r']).replace('\r', "");
                    let stream = if tag { Stream::Stdout } else { Stream::Stderr };
                    if sender.send((stream, line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

/// Kinds of tagged lines: an inner VMM run's guest console, its stderr, its probe, and events.
const TAG_KINDS: [&str; 4] = ["guest", "vmm", "probe", "rig"];

/// A tagged console line: `@@KIND@@ TEXT` or `@@KIND/LABEL@@ TEXT`.
#[derive(Debug, PartialEq)]
struct Tagged<'a> {
    kind: &'a str,
    label: Option<&'a str>,
    text: &'a str,
}

/// The tag and text of a line that starts with a tag.
fn parse_tag(line: &str) -> Option<Tagged<'_>> {
    let (tag, text) = line.strip_prefix("@@")?.split_once("@@ ")?;
    let (kind, label) = match tag.split_once('/') {
        Some((kind, label)) => (kind, Some(label)),
        None => (tag, None),
    };
    let label_ok = label.is_none_or(|l| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    });
    (TAG_KINDS.contains(&kind) && label_ok).then_some(Tagged { kind, label, text })
}

/// The tagged part of a console line. A tag is normally at the start, but the first line of
/// L1's init can follow the firmware's and kernel's terminal-control output on the same line.
fn tagged_tail(line: &str) -> Option<&str> {
    let mut search = 0;
    while let Some(found) = line[search..].find("@@") {
        let tail = &line[search + found..];
        if parse_tag(tail).is_some() {
            return Some(tail);
        }
        search += found + 2;
    }
    None
}

/// Removes ANSI escape sequences (SeaBIOS clears the screen) and other control characters.
fn strip_terminal_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // CSI: parameters and intermediates up to a final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

/// Sorts L1's console lines into a [`RigOutcome`] as they arrive and says how to show each.
pub(super) struct Collector<'a> {
    options: &'a L1Options,
    pub(super) outcome: RigOutcome,
    pub(super) feature_warnings: usize,
    poweroff_deadline: Option<Instant>,
    last_output: Instant,
}

impl<'a> Collector<'a> {
    pub(super) fn new(options: &'a L1Options, start: Instant) -> Collector<'a> {
        Collector {
            options,
            outcome: RigOutcome {
                end: RigEnd::Completed,
                vmm_status: None,
                qemu_status: None,
                l1_lines: Vec::new(),
                guest_lines: Vec::new(),
                vmm_lines: Vec::new(),
                probe_lines: Vec::new(),
                qemu_lines: Vec::new(),
                events: Vec::new(),
                elapsed: Duration::ZERO,
                timeout: options.timeout,
                run_starts: Vec::new(),
                runs: Vec::new(),
                stall_threads: Vec::new(),
            },
            feature_warnings: 0,
            poweroff_deadline: None,
            last_output: start,
        }
    }

    /// Takes QEMU's lines until it exits, a limit passes, or L1 locks up or panics; sets
    /// `outcome.end` for all but a plain exit.
    pub(super) fn watch(&mut self, receiver: &mpsc::Receiver<(Stream, String)>, deadline: Instant) {
        loop {
            let limit = self.poweroff_deadline.map_or(deadline, |p| p.min(deadline));
            let silent_at = self.last_output + L1_SILENCE_LIMIT;
            let now = Instant::now();
            if now >= limit {
                let hung = self.poweroff_deadline.is_some_and(|p| p <= now)
                    && self.outcome.vmm_status.is_some();
                self.outcome.end = if hung {
                    RigEnd::HungAtPowerOff
                } else {
                    RigEnd::TimedOut
                };
                return;
            }
            if now >= silent_at {
                self.outcome.end = RigEnd::L1Frozen;
                return;
            }
            let (stream, line) = match receiver.recv_timeout(limit.min(silent_at) - now) {
                Ok(item) => item,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let shown = match stream {
                Stream::Stderr => self.stderr_line(line),
                Stream::Stdout => self.stdout_line(&line),
            };
            if let (true, Some(shown)) = (self.options.echo, shown) {
                println!("{shown}");
            }
            if matches!(self.outcome.end, RigEnd::L1Lockup | RigEnd::L1Panic) {
                return;
            }
        }
    }

    /// A line of QEMU's stderr.
    fn stderr_line(&mut self, line: String) -> Option<String> {
        if line.contains(QEMU_FEATURE_WARNING) {
            self.feature_warnings += 1;
            return None;
        }
        let shown = format!("[qemu] {line}");
        self.outcome.qemu_lines.push(line);
        Some(shown)
    }

    /// A line of L1's console (QEMU's stdout).
    fn stdout_line(&mut self, raw: &str) -> Option<String> {
        self.last_output = Instant::now();
        let line = tagged_tail(raw).map_or_else(|| strip_terminal_controls(raw), str::to_string);
        match parse_tag(&line) {
            Some(Tagged {
                kind: "rig", text, ..
            }) => self.event(text),
            Some(tagged) => Some(self.run_line(tagged)),
            None => Some(self.l1_line(line)),
        }
    }

    fn event(&mut self, text: &str) -> Option<String> {
        let mut parts = text.splitn(3, ' ');
        let event = RigEvent {
            kind: parts.next().unwrap_or_default().to_string(),
            label: parts.next().unwrap_or_default().to_string(),
            value: parts.next().unwrap_or_default().to_string(),
        };
        let outcome = &mut self.outcome;
        match event.kind.as_str() {
            "vmm-start" => outcome.run_starts.push(RunStart {
                label: event.label.clone(),
                guest: outcome.guest_lines.len(),
                vmm: outcome.vmm_lines.len(),
                probe: outcome.probe_lines.len(),
            }),
            "vmm-exit" => outcome.vmm_status = event.value.trim().parse().ok(),
            "l1-poweroff" if self.poweroff_deadline.is_none() => {
                self.poweroff_deadline = Some(Instant::now() + POWEROFF_GRACE);
            }
            // Only its arrival counts (last_output).
            L1_ALIVE_EVENT => return None,
            _ => {}
        }
        outcome.events.push(event);
        if self.options.progress && !self.options.echo {
            eprintln!("[rig] {text}");
        }
        Some(format!("[rig] {text}"))
    }

    /// A line of an inner VMM run: the guest's console, the VMM's stderr or the probe's.
    fn run_line(&mut self, tagged: Tagged<'_>) -> String {
        let outcome = &mut self.outcome;
        let text = tagged.text.to_string();
        let all = match tagged.kind {
            "guest" => &mut outcome.guest_lines,
            "vmm" => &mut outcome.vmm_lines,
            _ => &mut outcome.probe_lines,
        };
        all.push(text.clone());
        let label = tagged.label.unwrap_or("-");
        let index = match outcome.runs.iter().position(|r| r.label == label) {
            Some(index) => index,
            None => {
                outcome.runs.push(RunOutput {
                    label: label.to_string(),
                    ..RunOutput::default()
                });
                outcome.runs.len() - 1
            }
        };
        let run = &mut outcome.runs[index];
        let own = match tagged.kind {
            "guest" => &mut run.guest,
            "vmm" => &mut run.vmm,
            _ => &mut run.probe,
        };
        own.push(text);
        let labelled = self.options.vm_names.iter().find(|(l, _)| l == label);
        let name = match tagged.kind {
            "vmm" => labelled.map_or(self.options.vmm_name, |(_, name)| name),
            kind => kind,
        };
        match labelled {
            Some(_) => format!("[{name}{label}] {}", tagged.text),
            None => format!("[{name}] {}", tagged.text),
        }
    }

    /// L1's own line (its kernel and init).
    fn l1_line(&mut self, line: String) -> String {
        if soft_lockup_seconds(&line).is_some_and(|s| s >= L1_LOCKUP_LIMIT.as_secs()) {
            self.outcome.end = RigEnd::L1Lockup;
        }
        if line.contains(L1_PANIC_MARK) {
            self.outcome.end = RigEnd::L1Panic;
        }
        let shown = format!("[L1] {line}");
        self.outcome.l1_lines.push(line);
        shown
    }
}

/// The seconds in an L1 kernel soft-lockup report (`watchdog: BUG: soft lockup - CPU#2 stuck
/// for 130s! [vcpu3:120]`), or None for any other line.
pub fn soft_lockup_seconds(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("soft lockup - CPU#")?;
    let (_, rest) = rest.split_once(" stuck for ")?;
    let digits = rest.split_once("s!")?.0;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rig::{combined_status, Topology};
    use crate::tuning::L1Tuning;

    #[test]
    fn soft_lockup_lines_are_recognised() {
        assert_eq!(
            soft_lockup_seconds(
                "[  365.1] watchdog: BUG: soft lockup - CPU#3 stuck for 130s! [vcpu3:120]"
            ),
            Some(130)
        );
        assert_eq!(
            soft_lockup_seconds("watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [CPU 0/KVM:99]"),
            Some(22)
        );
        for other in [
            "rcu: INFO: rcu_sched self-detected stall on CPU",
            "soft lockup - CPU#0 stuck for lots! [x:1]",
            "watchdog: BUG: soft lockup - CPU#1 stuck for",
            "",
        ] {
            assert_eq!(soft_lockup_seconds(other), None, "{other}");
        }
    }

    #[test]
    fn finds_tags_after_terminal_noise() {
        assert_eq!(
            tagged_tail("oc\u{1b}[?7l\u{1b}[2J@@rig@@ l1-init - 2.21"),
            Some("@@rig@@ l1-init - 2.21")
        );
        assert_eq!(
            tagged_tail("@@guest@@ hello @@rig@@ x"),
            Some("@@guest@@ hello @@rig@@ x")
        );
        assert_eq!(tagged_tail("email@@host"), None);
        assert_eq!(
            strip_terminal_controls("\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS"),
            "SeaBIOS"
        );
    }

    #[test]
    fn labelled_tags_split_runs_apart() {
        assert_eq!(
            parse_tag("@@guest/1@@ hello"),
            Some(Tagged {
                kind: "guest",
                label: Some("1"),
                text: "hello"
            })
        );
        assert_eq!(
            parse_tag("@@rig@@ vmm-exit 0 4").map(|t| t.kind),
            Some("rig")
        );
        for other in [
            "@@guest/a b@@ x",
            "@@other@@ x",
            "@@guest/@@ x",
            "guest@@ x",
        ] {
            assert_eq!(parse_tag(other), None, "{other}");
        }
        let options = L1Options {
            topology: Topology::default(),
            timeout: Duration::from_secs(1),
            echo: false,
            progress: false,
            tuning: L1Tuning::base(),
            vmm_name: "pvmm",
            vm_names: vec![("0".into(), "pvmm"), ("1".into(), "qemu-kvm")],
        };
        let mut collector = Collector::new(&options, Instant::now());
        let shown: Vec<Option<String>> = [
            "@@rig@@ vmm-start 0 1.0",
            "@@rig@@ vmm-start 1 1.1",
            "@@guest/1@@ from one",
            "@@guest/0@@ from zero",
            "@@vmm/1@@ qemu says",
            "@@rig@@ l1-alive - 2.0",
            "@@rig@@ vmm-exit 1 0",
            "plain L1 line",
        ]
        .iter()
        .map(|l| collector.stdout_line(l))
        .collect();
        assert_eq!(shown[2].as_deref(), Some("[guest1] from one"));
        assert_eq!(shown[4].as_deref(), Some("[qemu-kvm1] qemu says"));
        assert_eq!(shown[5], None);
        assert_eq!(shown[7].as_deref(), Some("[L1] plain L1 line"));
        let outcome = collector.outcome;
        let one = outcome.run("1").unwrap();
        assert_eq!(
            (one.guest, one.vmm, one.status),
            (
                &["from one".to_string()][..],
                &["qemu says".to_string()][..],
                Some(0)
            )
        );
        let zero = outcome.run("0").unwrap();
        assert_eq!((zero.guest.len(), zero.status), (1, None));
        assert!(outcome.run_in_progress());
        assert_eq!(combined_status(&outcome, &["1".into()]), Some(0));
        assert_eq!(combined_status(&outcome, &["0".into(), "1".into()]), None);
        assert_eq!(outcome.guest_lines.len(), 2);
    }
}
