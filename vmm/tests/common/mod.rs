//! Helpers for pvmm's own integration tests: tiny guest kernels and running the binary.

#![allow(dead_code)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#![allow(clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

// The skip-or-fail rule of every test that needs something of the machine (each test binary
// uses a part of this module, as with its functions).
#[allow(unused_imports)]
pub use pvmm_testutil::{found_or_skip, require_or_skip, Need};

/// Where the tiny kernel's code is loaded (and entered, through PVH).
pub const TINY_LOAD_ADDR: u64 = 0x10_0000;

/// Writes an ELF64 program header at `at` of `f`: type `kind`, R+X, file offset `off`,
/// virtual and physical address `addr`, sizes in the file and in memory, 4-byte alignment.
pub fn write_program_header(
    f: &mut [u8],
    at: usize,
    kind: u32,
    off: u64,
    addr: u64,
    filesz: u64,
    memsz: u64,
) {
    f[at..at + 4].copy_from_slice(&kind.to_le_bytes());
    f[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    f[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
    f[at + 16..at + 24].copy_from_slice(&addr.to_le_bytes());
    f[at + 24..at + 32].copy_from_slice(&addr.to_le_bytes());
    f[at + 32..at + 40].copy_from_slice(&filesz.to_le_bytes());
    f[at + 40..at + 48].copy_from_slice(&memsz.to_le_bytes());
    f[at + 48..at + 56].copy_from_slice(&4u64.to_le_bytes());
}

/// A minimal ELF64 "kernel" with a PVH entry note whose 32-bit code is `code`.
pub fn tiny_pvh_kernel(code: &[u8]) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    let note_off = EHDR + 2 * PHDR;
    let mut note = Vec::new();
    note.extend_from_slice(&4u32.to_le_bytes()); // namesz
    note.extend_from_slice(&4u32.to_le_bytes()); // descsz
    note.extend_from_slice(&18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
    note.extend_from_slice(b"Xen\0");
    note.extend_from_slice(&(TINY_LOAD_ADDR as u32).to_le_bytes());
    let code_off = 0x1000usize;

    let mut f = vec![0u8; code_off];
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little endian
    f[6] = 1; // version
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&TINY_LOAD_ADDR.to_le_bytes()); // e_entry
    f[32..40].copy_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    f[52..54].copy_from_slice(&(EHDR as u16).to_le_bytes()); // e_ehsize
    f[54..56].copy_from_slice(&(PHDR as u16).to_le_bytes()); // e_phentsize
    f[56..58].copy_from_slice(&2u16.to_le_bytes()); // e_phnum
    let phdr = |f: &mut Vec<u8>, at: usize, kind: u32, off: u64, addr: u64, size: u64| {
        write_program_header(f, at, kind, off, addr, size, size)
    };
    phdr(
        &mut f,
        EHDR,
        1,
        code_off as u64,
        TINY_LOAD_ADDR,
        code.len() as u64,
    ); // PT_LOAD
    phdr(
        &mut f,
        EHDR + PHDR,
        4,
        note_off as u64,
        0,
        note.len() as u64,
    ); // PT_NOTE
    f[note_off..note_off + note.len()].copy_from_slice(&note);
    f.extend_from_slice(code);
    f
}

/// 32-bit code: `out dx, al` of each byte of `text` to COM1.
pub fn print_code(text: &[u8]) -> Vec<u8> {
    let mut c = vec![0x66, 0xba, 0xf8, 0x03]; // mov dx, 0x3f8
    for b in text {
        c.extend_from_slice(&[0xb0, *b, 0xee]); // mov al, b; out dx, al
    }
    c
}

/// 32-bit code: write `value` to I/O port `port`.
pub fn out_code(port: u16, value: u8) -> Vec<u8> {
    let p = port.to_le_bytes();
    vec![0x66, 0xba, p[0], p[1], 0xb0, value, 0xee]
}

/// 32-bit code: halt forever.
pub const HALT_LOOP: [u8; 3] = [0xf4, 0xeb, 0xfd];
/// S5 sleep type 5 << 2 | SLP_EN.
pub const POWER_OFF_VALUE: u8 = (5 << 2) | (1 << 5);

/// A scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pvmm-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes a tiny kernel running `code` into `dir`.
pub fn write_kernel(dir: &Path, code: &[u8]) -> PathBuf {
    let k = dir.join("tiny.elf");
    std::fs::write(&k, tiny_pvh_kernel(code)).unwrap();
    k
}

/// A run that has not ended by then is a hang: the test fails instead of blocking CI.
const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs pvmm with `args`, stdin closed; kills it and fails the test if it hangs.
pub fn pvmm(args: &[&str]) -> Output {
    pvmm_with(args, |_| {})
}

/// [`pvmm`], with `configure` adjusting the command first (its environment, say).
pub fn pvmm_with(args: &[&str], configure: impl FnOnce(&mut Command)) -> Output {
    use std::io::Read;
    let mut command = Command::new(env!("CARGO_BIN_EXE_pvmm"));
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    configure(&mut command);
    let mut child = command.spawn().expect("run pvmm");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for pvmm") {
            break status;
        }
        if start.elapsed() > RUN_LIMIT {
            child.kill().ok();
            child.wait().ok();
            panic!("pvmm {args:?} did not exit within {RUN_LIMIT:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Whether /dev/kvm is usable here. Without it, KVM tests skip loudly, unless
/// PVMM_REQUIRE_KVM=1 (CI), where they fail ([`require_or_skip`]).
pub fn kvm_available(test: &str) -> bool {
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if !ok {
        require_or_skip(Need::Kvm, test, "/dev/kvm is not usable on this machine");
    }
    ok
}

/// The bounded, seeded proptest configuration of the fuzz tests in CI: `cases` cases from
/// `seed`; `PROPTEST_CASES` and `PROPTEST_RNG_SEED` override them for longer runs.
pub fn fuzz_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    }
    config.failure_persistence = None;
    config
}

/// 32-bit code: spin forever (`jmp $`). This machine's KVM emulates kernel-mode code
/// instruction by instruction, so the vCPU thread never sleeps: a busy vCPU.
pub const SPIN: [u8; 2] = [0xeb, 0xfe];

/// How long a started VM or daemon may take to answer on a loaded machine.
const START_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// A child process killed and reaped when dropped, so that a failing test leaves none behind.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// Starts a pvmm VM of `vcpus` vCPUs running the tiny guest `code`, its control socket
/// `dir/run/NAME.sock` (so a `pvmm host --runtime-dir dir/run` finds it under the name
/// `name`), giving an outside balancer a lease of `lease_ms`; returns once the socket answers.
pub fn start_pvmm_vm(
    dir: &Path,
    name: &str,
    code: &[u8],
    vcpus: &str,
    lease_ms: &str,
) -> (Proc, PathBuf) {
    start_pvmm_vm_with(dir, name, code, vcpus, lease_ms, |_| {})
}

/// [`start_pvmm_vm`], with `configure` adjusting the command first (more options, say).
pub fn start_pvmm_vm_with(
    dir: &Path,
    name: &str,
    code: &[u8],
    vcpus: &str,
    lease_ms: &str,
    configure: impl FnOnce(&mut Command),
) -> (Proc, PathBuf) {
    use std::process::Stdio;
    let kernel = dir.join(format!("{name}.elf"));
    std::fs::write(&kernel, tiny_pvh_kernel(code)).unwrap();
    std::fs::create_dir_all(dir.join("run")).unwrap();
    let socket = dir.join("run").join(format!("{name}.sock"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_pvmm"));
    command
        .args(["--vcpus", vcpus, "--memory", "64"])
        .args(["--external-lease-ms", lease_ms])
        .arg("--api-socket")
        .arg(&socket);
    configure(&mut command);
    let mut child = command
        .arg(&kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pvmm");
    let start = std::time::Instant::now();
    while pvmm::api::client::request(&socket, "GET", "/v1/vm", None).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name}: pvmm exited before serving its socket: {status}");
        }
        assert!(start.elapsed() < START_LIMIT, "{name}: no socket");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (Proc(child), socket)
}

/// `pvmm host`: the daemon as the multicall binary runs it (the `pvmm-host` crate's own
/// binary runs the same entry point).
pub fn host_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pvmm"));
    c.arg("host");
    c
}

/// Starts `pvmm host ARGS --runtime-dir RUN`, its output discarded.
pub fn spawn_host(run: &Path, args: &[&str]) -> Child {
    host_command()
        .args(args)
        .arg("--runtime-dir")
        .arg(run)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pvmm host")
}

/// The daemon's status (`pvmm host status --json`) on runtime directory `run`; None while it
/// does not answer.
pub fn host_status(run: &Path) -> Option<pvmm_api::stats::HostStatus> {
    let out = host_command()
        .args(["status", "--json", "--runtime-dir"])
        .arg(run)
        .output()
        .expect("run pvmm host status");
    serde_json::from_slice(&out.stdout).ok()
}

/// The daemon's Prometheus text, from its status socket on runtime directory `run`.
pub fn host_metrics(run: &Path) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(run.join("pvmm-host.api"))
        .expect("the daemon's status socket");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A thread's `Cpus_allowed_list` from /proc; empty once the thread is gone.
pub fn cpus_allowed(tid: i64) -> String {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Whether QEMU can run here; without it a test that needs it skips loudly, unless the rig
/// (which needs QEMU too) is required.
pub fn qemu_available(test: &str) -> bool {
    let ok = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        require_or_skip(Need::Rig, test, "qemu-system-x86_64 is not installed");
    }
    ok
}

/// QEMU's arguments for a KVM VM named `name` (thread names on, so that `pvmm host --adopt
/// auto` finds its vCPU threads by name) of `smp` vCPUs and 64 MiB running the tiny PVH
/// `kernel`, with no devices, display or network.
pub fn qemu_tiny_args(name: &str, smp: u32, kernel: &Path) -> Vec<String> {
    // `max` without ARCH_CAPABILITIES: some hosts' KVM refuses the value QEMU writes to that
    // MSR (0x10a) and QEMU aborts before it starts its vCPU threads; the tiny guest needs no
    // CPU feature at all.
    [
        "-enable-kvm",
        "-cpu",
        "max,-arch-capabilities",
        "-name",
        &format!("{name},debug-threads=on"),
        "-smp",
        &smp.to_string(),
        "-m",
        "64",
        "-display",
        "none",
        "-nodefaults",
        "-no-reboot",
        "-kernel",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([kernel.display().to_string()])
    .collect()
}

/// The names of the threads of `/proc/PROCESS` (a pid, or `self`), from their `comm`.
pub fn thread_names(process: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{process}/task")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|comm| comm.trim().to_string())
        .collect()
}

/// Each thread of process `pid`: its name and `Cpus_allowed_list`.
pub fn process_threads(pid: u32) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let tid: i64 = e.file_name().to_string_lossy().parse().unwrap_or(0);
            (comm.trim().to_string(), cpus_allowed(tid))
        })
        .collect()
}
