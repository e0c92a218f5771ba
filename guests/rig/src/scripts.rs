//! The shell scripts the rig runs in L1 and in its guests, and the text helpers that build
//! the commands they run (shell quoting, base64 for the guest command).
//!
//! The scripts are files in `guests/rig/scripts/` (busybox sh, checked by shellcheck in CI),
//! compiled in with `include_str!`. A script that needs values from Rust reads them as shell
//! variables, which [`assemble`] (and [`guest_command`], for a guest's command line) sets in
//! lines of their own ahead of the script's parts: no script text is formatted in Rust.
//!
//! Protocol between the L1 scripts and [`crate::rig`]: every line the L1 init writes for the
//! host on its console starts with `@@TAG@@ `: `@@guest/LABEL@@` for the stdout of the inner
//! VMM run labelled LABEL (the guest's serial console), `@@vmm/LABEL@@` for its stderr,
//! `@@probe/LABEL@@` for the optional L1 probe script run alongside it, and
//! `@@rig@@ EVENT LABEL VALUE` for events (`vmm-start` and `guest-init`
//! with L1's uptime in seconds, `guest-uptime` with the guest's own uptime at its init,
//! (guest lines with `pvmm-mark: TEXT` are also logged as `<L1 uptime> TEXT` in L1's
//! `/tmp/rig-marks` for probes),
//! `vmm-exit` with the exit status). All other console lines are
//! L1's own (its kernel and init).

/// The guest's `/init`. Linux hands unknown `name=value` kernel parameters to init as
/// environment variables, so the command arrives as `pvmm_cmd_b64=<base64>` (robust: no
/// spaces, quotes or shell characters survive the kernel's parameter parser unharmed
/// otherwise) or, typed by hand, `pvmm_cmd="..."` (the kernel strips the double quotes; the
/// command itself cannot contain a double quote).
pub const GUEST_INIT: &str = include_str!("../scripts/guest-init.sh");

/// L1's `/init`: mounts, loads the KVM modules, runs `/rig/job.sh` (from the per-run layer),
/// and powers L1 off.
pub const L1_INIT: &str = include_str!("../scripts/l1-init.sh");

/// Shell functions for the per-run job (`rig_tag`, `rig_run`), sourced by [`L1_INIT`].
pub const L1_LIB: &str = include_str!("../scripts/l1-lib.sh");

/// Defines `probe_sample`, one placement-probe sample (see [`crate::probe`]).
pub const PROBE_SAMPLE_LIB: &str = include_str!("../scripts/probe-sample.sh");

/// Defines `print_topology` and `sample_cpus`, the benchmarks' CPU activity lines (see
/// [`crate::activity`]).
pub const CPU_ACTIVITY_LIB: &str = include_str!("../scripts/cpu-activity.sh");

/// The placement tests' L1 probe, after [`PROBE_SAMPLE_LIB`] (see
/// [`crate::probe::placement_probe`]).
pub const PLACEMENT_PROBE: &str = include_str!("../scripts/placement-probe.sh");

/// The placement benchmark's L1 probe, after [`CPU_ACTIVITY_LIB`].
pub const BENCH_PROBE: &str = include_str!("../scripts/bench-probe.sh");

/// The host-wide benchmark's L1 probe, after [`CPU_ACTIVITY_LIB`].
pub const HOST_BENCH_PROBE: &str = include_str!("../scripts/host-bench-probe.sh");

/// The host-wide benchmark's guest command.
pub const HOST_BENCH_GUEST: &str = include_str!("../scripts/host-bench-guest.sh");

/// The placement benchmark's guest command.
pub const PLACEMENT_BENCH_GUEST: &str = include_str!("../scripts/placement-bench-guest.sh");

/// The guest soak's L1 probe.
pub const GUEST_SOAK_PROBE: &str = include_str!("../scripts/guest-soak-probe.sh");

/// The I/O benchmark's guest command ([`crate::io_bench`]).
pub const IO_BENCH_GUEST: &str = include_str!("../scripts/io-bench-guest.sh");

/// The I/O benchmark's L1 probe beside each VM.
pub const IO_BENCH_PROBE: &str = include_str!("../scripts/io-bench-probe.sh");

/// The I/O benchmark's L1 setup (the scratch disk).
pub const IO_BENCH_SETUP: &str = include_str!("../scripts/io-bench-setup.sh");

/// The kernbench benchmark's guest command ([`crate::kernbench`]).
pub const KERNBENCH_GUEST: &str = include_str!("../scripts/kernbench-guest.sh");

/// Every script file of the rig, by file name (checked by shellcheck in CI).
pub const ALL: &[(&str, &str)] = &[
    ("guest-init.sh", GUEST_INIT),
    ("l1-init.sh", L1_INIT),
    ("l1-lib.sh", L1_LIB),
    ("probe-sample.sh", PROBE_SAMPLE_LIB),
    ("cpu-activity.sh", CPU_ACTIVITY_LIB),
    ("placement-probe.sh", PLACEMENT_PROBE),
    ("bench-probe.sh", BENCH_PROBE),
    ("host-bench-probe.sh", HOST_BENCH_PROBE),
    ("host-bench-guest.sh", HOST_BENCH_GUEST),
    ("placement-bench-guest.sh", PLACEMENT_BENCH_GUEST),
    ("guest-soak-probe.sh", GUEST_SOAK_PROBE),
    ("io-bench-guest.sh", IO_BENCH_GUEST),
    ("io-bench-probe.sh", IO_BENCH_PROBE),
    ("io-bench-setup.sh", IO_BENCH_SETUP),
    ("kernbench-guest.sh", KERNBENCH_GUEST),
];

/// The source file of the script `name` (one of [`ALL`]): the image builder rewrites an
/// archive holding a script when its file is newer than the archive.
pub fn source(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// One script from script files: `#!/bin/sh`, then a `NAME=value` line for each of `vars`
/// (the value shell-quoted), then `parts` in order. The parts read the values as shell
/// variables, so a script file takes its parameters from Rust without being formatted.
pub fn assemble(vars: &[(&str, &str)], parts: &[&str]) -> String {
    let mut script = String::from("#!/bin/sh\n");
    for (name, value) in vars {
        script.push_str(name);
        script.push('=');
        script.push_str(&shell_quote(value));
        script.push('\n');
    }
    for part in parts {
        script.push_str(part);
        if !part.ends_with('\n') {
            script.push('\n');
        }
    }
    script
}

/// A guest command from script files: [`assemble`] without indentation and without the lines
/// that hold only a comment (the shebang included), since the command travels on the guest's
/// kernel command line, whose length is bounded (2047 bytes on x86). The script files that
/// guests run hold no string that spans lines.
pub fn guest_command(vars: &[(&str, &str)], parts: &[&str]) -> String {
    assemble(vars, parts)
        .lines()
        .map(str::trim_start)
        .filter(|line| !line.starts_with('#'))
        .fold(String::new(), |mut script, line| {
            script.push_str(line);
            script.push('\n');
            script
        })
}

/// What is wrong with the script files of folder `dir` against their list `all` (file name,
/// text), each in a line: a `.sh` file that is not listed or a listed one that is not there,
/// and a script that does not start with `#!/bin/sh` and a comment on what it does. Empty
/// when all is well.
pub fn check_files(dir: &std::path::Path, all: &[(&str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.ends_with(".sh"))
                .collect()
        })
        .unwrap_or_default();
    on_disk.sort();
    let mut listed: Vec<String> = all.iter().map(|(name, _)| name.to_string()).collect();
    listed.sort();
    if on_disk != listed {
        problems.push(format!(
            "{}: {on_disk:?} on disk, {listed:?} listed",
            dir.display()
        ));
    }
    for (name, text) in all {
        if !text.starts_with("#!/bin/sh\n# ") || text.lines().count() <= 2 {
            problems.push(format!("{name}: not #!/bin/sh, a comment and a body"));
        }
    }
    problems
}

/// Quotes `word` for a POSIX shell (single quotes, embedded ones escaped).
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Quotes and joins a command line for a POSIX shell.
pub fn shell_join<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Standard base64 (RFC 4648, with padding), as busybox `base64 -d` reads it.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_file_is_listed_and_starts_with_a_shebang() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
        assert_eq!(check_files(&dir, ALL), Vec::<String>::new());
        assert_eq!(check_files(&dir, &ALL[1..]).len(), 1);
    }

    #[test]
    fn assembled_variables_reach_the_parts() {
        let script = assemble(
            &[("A", "two words"), ("B", "it's")],
            &["#!/bin/sh\n# prints\nprintf '%s|%s' \"$A\" \"$B\""],
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "two words|it's");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn shell_quoting_survives_sh() {
        let words = ["plain", "two words", "it's", "", "$HOME `x` \"q\""];
        let script = format!("printf '%s\\n' {}", shell_join(&words));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let printed = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            printed,
            words.iter().map(|w| format!("{w}\n")).collect::<String>()
        );
    }
}
