//! Helpers for pvmm end-to-end tests.
//!
//! The rig tests need QEMU, busybox-static, apt access to the Debian kernel package and a
//! buildable pvmm. The Debian packages come through the rig's own check
//! ([`pvmm_rig::packages::ensure`]: installed when the tests run as root, else named in the
//! command to run). When something is still missing they skip with a loud message on stderr,
//! unless `PVMM_REQUIRE_RIG=1` (CI sets it), in which case they fail
//! ([`pvmm_testutil::require_or_skip`]).

use std::sync::{Mutex, MutexGuard, OnceLock};

use pvmm_rig::RigOutcome;
use pvmm_testutil::{require_or_skip, Need};

pub mod scripts;

// The rig's retry of its own failures and its post-mortem log, shared with the benchmarks.
pub use pvmm_rig::retry::{dump_outcome, retry_boots, RIG_ATTEMPTS};

use pvmm_rig::images::{self, L1Images, L1Needs};
use pvmm_rig::soak::{classify, BootKind};
use pvmm_rig::workspace::Workspace;

/// Serializes rig runs: each L1 already keeps both host CPUs busy, so parallel rigs only
/// slow each other down (and would race on rebuilding the images).
static RIG_LOCK: Mutex<()> = Mutex::new(());

/// One rig boot shared by every test of a test binary, held in a `static`: booted by the first
/// test that asks for it, the others waiting for it; None for all when the rig is unavailable
/// (each test then skips).
pub struct SharedOutcome(OnceLock<Option<RigOutcome>>);

impl SharedOutcome {
    /// Not booted yet.
    pub const fn new() -> SharedOutcome {
        SharedOutcome(OnceLock::new())
    }

    /// The outcome, from `boot` on the first call.
    pub fn get_or_boot(
        &'static self,
        boot: impl FnOnce() -> Option<RigOutcome>,
    ) -> Option<&'static RigOutcome> {
        self.0.get_or_init(boot).as_ref()
    }
}

impl Default for SharedOutcome {
    fn default() -> Self {
        SharedOutcome::new()
    }
}

/// Takes the rig lock for the rest of a test (a panicking test does not poison it for others).
pub fn rig_lock() -> MutexGuard<'static, ()> {
    RIG_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Builds (or reuses) the rig's images, or reports why it cannot and returns None.
/// Call with the [`rig_lock`] held.
pub fn prepare_rig(test: &str, needs: L1Needs) -> Option<(Workspace, L1Images)> {
    if let Err(error) = pvmm_rig::packages::ensure() {
        require_or_skip(Need::Rig, test, &error.to_string());
        return None;
    }
    let ws = match Workspace::locate() {
        Ok(ws) => ws,
        Err(error) => {
            require_or_skip(Need::Rig, test, &error.to_string());
            return None;
        }
    };
    match images::build_l1(&ws, needs) {
        Ok(l1) => Some((ws, l1)),
        Err(error) => {
            require_or_skip(
                Need::Rig,
                test,
                &format!("building the rig images failed: {error}"),
            );
            None
        }
    }
}

/// Runs `rig` for `test`, booting again while the runs of `vms` (the rig's first ones, whose
/// ends tell a rig failure) end in one of the nested rig's own failure kinds ([`retry_boots`]);
/// prints the outcome's summary and dumps it (`PVMM_RIG_DUMP`).
pub fn boot_rig(
    test: &str,
    ws: &Workspace,
    images: &L1Images,
    rig: &pvmm_rig::Rig,
    vms: &[pvmm_rig::VmSpec],
) -> RigOutcome {
    let labels = rig.labels();
    let outcome = retry_boots(
        test,
        || rig.run(ws, images),
        |outcome| classify(outcome, vms, &labels[..vms.len()]),
    )
    .expect("the rig runs");
    eprintln!("{test}: {}", outcome.summary("pvmm"));
    dump_outcome(test, &outcome);
    outcome
}

// Placement and CPPC rig tests: the L1 probe that samples pvmm's vCPU threads from outside, its
// parser (both in pvmm-rig, shared with the placement benchmark) and the measurements the tests
// build on.
pub use pvmm_rig::probe::{
    placement_probe, CpuSet, CpuTimes, PlacementTrace, ProbeSample, StatsTick, StatsVcpu,
    ThreadSample, ThreadSeccomp, BUSY_SHARE, L1_STATS_PATH, L1_USER_HZ, PROBE_SAMPLE,
};

/// Limit of each placement run (pvmm is killed after it, on L1's clock), and per run of the
/// whole L1 boot, which also gets [`pvmm_rig::sequence::L1_BOOT_SECS`] for L1's own start: each
/// pvmm run takes 25-45 s in the rig on an idle machine; shared CI machines are several times
/// slower.
pub const SEQUENCE_TIMEOUT_PER_RUN: std::time::Duration = std::time::Duration::from_secs(240);

/// The probe's sampling interval (s): several samples per 100 ms pvmm tick would cost L1 more
/// than the tick itself; one per tick resolves "within two ticks".
pub const PROBE_INTERVAL: &str = "0.1";

/// Runs `runs` (label, pvmm arguments, guest command) in one L1 boot (2x2x1) with the
/// [`placement_probe`], every pvmm writing `--stats` to [`L1_STATS_PATH`]. None when the rig
/// is unavailable (and not required).
pub fn run_placement_sequence(
    test: &str,
    runs: &[(&str, Vec<&str>, String)],
) -> Option<pvmm_rig::RigOutcome> {
    run_placement_sequence_with_probe(test, runs, "")
}

/// [`run_placement_sequence`] with `probe_prefix` (shell) run in L1 before the placement
/// probe, in the same script: for background loops of the test's own (they share the probe's
/// CPU 0 and its `$PVMM_PID`; their output joins the probe's lines).
pub fn run_placement_sequence_with_probe(
    test: &str,
    runs: &[(&str, Vec<&str>, String)],
    probe_prefix: &str,
) -> Option<pvmm_rig::RigOutcome> {
    run_placement_sequence_on(test, pvmm_rig::GuestKernel::default(), runs, probe_prefix)
}

/// [`run_placement_sequence_with_probe`] with the guests booting `guest_kernel`.
pub fn run_placement_sequence_on(
    test: &str,
    guest_kernel: pvmm_rig::GuestKernel,
    runs: &[(&str, Vec<&str>, String)],
    probe_prefix: &str,
) -> Option<pvmm_rig::RigOutcome> {
    let _lock = rig_lock();
    let (ws, images) = prepare_rig(
        test,
        L1Needs {
            pvmm: true,
            qemu: false,
            vmlinux: false,
            guest_kernel,
            root_disk: false,
            kernbench: false,
        },
    )?;
    let runs: Vec<pvmm_rig::PvmmRun> = runs
        .iter()
        .map(|(label, args, command)| {
            let mut pvmm_args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            pvmm_args.extend(["--stats".to_string(), L1_STATS_PATH.to_string()]);
            pvmm_rig::PvmmRun {
                label: label.to_string(),
                pvmm_args,
                guest_command: command.clone(),
            }
        })
        .collect();
    let options = pvmm_rig::SequenceOptions {
        topology: pvmm_rig::Topology::default(),
        timeout: std::time::Duration::from_secs(pvmm_rig::sequence::L1_BOOT_SECS)
            + SEQUENCE_TIMEOUT_PER_RUN * u32::try_from(runs.len()).unwrap_or(u32::MAX),
        run_limit_secs: SEQUENCE_TIMEOUT_PER_RUN.as_secs(),
        echo: std::env::var_os("PVMM_RIG_ECHO").is_some(),
        progress: false,
        probe: Some(format!("{probe_prefix}{}", placement_probe(PROBE_INTERVAL))),
        tuning: pvmm_rig::L1Tuning::default(),
        guest_kernel,
    };
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let started = std::time::Instant::now();
    let outcome = retry_boots(
        test,
        || pvmm_rig::run_pvmm_sequence(&ws, &images, &options, &runs),
        |outcome| pvmm_boot_kind(outcome, &labels),
    )
    .expect("the rig runs");
    dump_outcome(test, &outcome);
    eprintln!(
        "{test}: {} ({} pvmm runs, {:.1} s)",
        outcome.summary("pvmm"),
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    Some(outcome)
}

/// Guest console lines shown when a run fails: enough to see where a guest stopped.
const GUEST_TAIL_LINES: usize = 25;

/// L1 console lines shown when a run fails: L1 boots with `loglevel=4`, so these are its
/// kernel's warnings (RCU stalls, lockups) and init's errors, few when all is well.
const L1_TAIL_LINES: usize = 15;

/// The rig's other failures, L1's own kernel failing ([`pvmm_rig::RigEnd::is_l1_failure`]).
pub fn l1_failed(outcome: &pvmm_rig::RigOutcome) -> bool {
    outcome.end.is_l1_failure()
}

/// How a boot of pvmm runs `labels` (all pvmm) ended: see [`retry_boots`].
pub fn pvmm_boot_kind(outcome: &pvmm_rig::RigOutcome, labels: &[String]) -> (BootKind, String) {
    let vms = vec![pvmm_rig::VmSpec::new(pvmm_rig::InnerVmm::Pvmm); labels.len()];
    classify(outcome, &vms, labels)
}

/// The lines and parsed probe trace of run `label`; panics (with pvmm's stderr) when the run
/// did not start or pvmm did not exit 0.
pub fn run_trace<'a>(
    outcome: &'a pvmm_rig::RigOutcome,
    label: &str,
) -> (pvmm_rig::RunLines<'a>, PlacementTrace) {
    let run = outcome
        .run(label)
        .unwrap_or_else(|| panic!("run {label} never started: {}", outcome.summary("pvmm")));
    assert_eq!(
        run.status,
        Some(0),
        "run {label}: {}",
        exit_report(outcome, &run)
    );
    let trace = PlacementTrace::parse(run.probe);
    assert!(
        trace.samples.len() > 20 && !trace.ticks.is_empty(),
        "run {label}: the probe got {} samples and {} stats lines",
        trace.samples.len(),
        trace.ticks.len()
    );
    (run, trace)
}

/// Why a run's pvmm did not exit 0, for a test's failure message: its stderr, what the guest's
/// kernel said of its end (a panic, a stall), the guest's last console lines and L1's.
pub fn exit_report(outcome: &pvmm_rig::RigOutcome, run: &pvmm_rig::RunLines) -> String {
    let guest_end =
        pvmm_rig::soak::guest_end_report(run.guest).unwrap_or_else(|| "nothing".to_string());
    format!(
        "pvmm exited {:?} (None: L1 never reported its exit; {}: killed at the run's time limit); its stderr:\n{}\nthe guest's kernel reported: {guest_end}\nthe guest's last console lines:\n{}\nL1's last console lines (whole boot):\n{}",
        run.status,
        pvmm_rig::soak::RUN_LIMIT_STATUS,
        run.vmm.join("\n"),
        run.guest[run.guest.len().saturating_sub(GUEST_TAIL_LINES)..].join("\n"),
        outcome.l1_lines[outcome.l1_lines.len().saturating_sub(L1_TAIL_LINES)..].join("\n")
    )
}

pub use scripts::GUEST_HELPERS;

/// The body of `pvmm ctl external` giving vCPU `v` the L1 CPUs and capacity
/// `placements[v]` (a CPU list and 1..1024).
pub fn external_assignment(placements: &[(String, u32)]) -> String {
    let each: Vec<String> = placements
        .iter()
        .enumerate()
        .map(|(v, (cpus, capacity))| {
            format!(r#"{{"vcpu":{v},"cpus":"{cpus}","capacity":{capacity}}}"#)
        })
        .collect();
    format!(r#"{{"assignments":[{}]}}"#, each.join(","))
}

/// The renewal period (s) of the rig tests' outside balancers ([`outside_balancer`]).
pub const BALANCER_RENEW_S: f64 = 0.5;
/// The `--external-lease-ms` the rig tests' pvmm runs with under an outside balancer: four
/// renewals, so that a renewal delayed on a slow L1 does not let the placement lapse, and short
/// enough to keep a run short.
pub const BALANCER_LEASE_MS: &str = "2000";

/// pvmm's arguments in the rig tests with an outside balancer: 4 vCPUs under `powersaving`,
/// the control socket `socket`, and the lease [`BALANCER_LEASE_MS`].
pub fn balanced_pvmm_args(socket: &str) -> Vec<&str> {
    vec![
        "--vcpus",
        "4",
        "--policy",
        "powersaving",
        "--api-socket",
        socket,
        "--external-lease-ms",
        BALANCER_LEASE_MS,
    ]
}

/// L1 shell for a probe prefix: an outside balancer, as `pvmm host` is one, that waits until
/// the guest marks `start_mark` (`pvmm-mark: START_MARK`), then renews `bodies`
/// ([`external_assignment`]) on pvmm's control socket `socket`, one every `renew_s` seconds,
/// each body for `renewals_each` renewals in turn, until pvmm exits. pvmm keeps an outside
/// placement only while it is renewed within its `--external-lease-ms`.
pub fn outside_balancer(
    socket: &str,
    start_mark: &str,
    bodies: &[String],
    renew_s: f64,
    renewals_each: u32,
) -> String {
    let files: String = bodies
        .iter()
        .enumerate()
        .map(|(k, body)| format!("echo '{body}' > /tmp/pattern-{k}.json\n"))
        .collect();
    format!(
        r#"{files}( until grep -q {start_mark} /tmp/rig-marks 2>/dev/null; do kill -0 $PVMM_PID 2>/dev/null || exit 0; sleep 0.2; done
  i=0
  while kill -0 $PVMM_PID 2>/dev/null; do
    /bin/pvmm ctl --socket {socket} external /tmp/pattern-$(( (i / {renewals_each}) % {n} )).json
    i=$((i + 1)); sleep {renew_s}
  done ) > /dev/null 2>&1 &
"#,
        n = bodies.len(),
    )
}

/// One `r LABEL` line of [`GUEST_HELPERS`].
#[derive(Debug, Clone, PartialEq)]
pub struct CppcRead {
    /// The label.
    pub label: String,
    /// highest_perf per guest CPU: pvmm's capacity on the guest's performance scale
    /// (compare with `PlacementTrace::guest_perfs_around`).
    pub highest_perf: Vec<u64>,
    /// GED interrupts so far.
    pub ged: u64,
}

/// The `CPPC ...` lines in a guest's console.
pub fn cppc_reads(guest: &[String]) -> Vec<CppcRead> {
    guest
        .iter()
        .filter_map(|line| {
            let rest = line.strip_prefix("CPPC ")?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            let ged_at = words.iter().position(|w| *w == "GED")?;
            Some(CppcRead {
                label: words.first()?.to_string(),
                highest_perf: words[1..ged_at]
                    .iter()
                    .map(|w| w.parse().ok())
                    .collect::<Option<_>>()?,
                ged: words.get(ged_at + 1)?.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use pvmm_rig::host::BUSYBOX;

    use super::*;

    #[test]
    fn probe_sample_reads_vcpu_threads_and_cpus() {
        if !Path::new(BUSYBOX).is_file() {
            require_or_skip(
                Need::Rig,
                "probe_sample_reads_vcpu_threads_and_cpus",
                "no busybox",
            );
            return;
        }
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let stop_rx = std::sync::Arc::new(std::sync::Mutex::new(stop_rx));
        // std names a thread from inside it, before running its closure.
        let started = std::sync::Arc::new(std::sync::Barrier::new(4));
        // pvmm's names, and QEMU's for vCPU 2.
        let names = ["vcpu0", "vcpu1", "CPU 2/KVM"];
        let threads: Vec<_> = names
            .iter()
            .map(|name| {
                let rx = stop_rx.clone();
                let started = started.clone();
                std::thread::Builder::new()
                    .name(name.to_string())
                    .spawn(move || {
                        started.wait();
                        let _ = rx.lock().map(|rx| rx.recv());
                    })
                    .unwrap()
            })
            .collect();
        started.wait();
        // What /proc says about them, read here.
        let mut expected = Vec::new();
        let mut expected_seccomp = Vec::new();
        for entry in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = entry.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let comm = comm.trim();
            let n = comm.strip_prefix("vcpu").or_else(|| {
                comm.strip_prefix("CPU ")
                    .and_then(|c| c.strip_suffix("/KVM"))
            });
            if let Some(n) = n {
                let status = std::fs::read_to_string(dir.join("status")).unwrap();
                let allowed = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|l| l.parse::<CpuSet>().unwrap().iter().collect::<Vec<u32>>())
                    .unwrap();
                let tid: u32 = dir.file_name().unwrap().to_str().unwrap().parse().unwrap();
                let mode = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Seccomp:"))
                    .map(|m| m.trim().parse().unwrap())
                    .unwrap();
                expected_seccomp.push(ThreadSeccomp {
                    tid,
                    mode,
                    name: format!("vcpu{n}"),
                });
                expected.push((n.parse::<u32>().unwrap(), tid, allowed));
            }
        }
        expected.sort();
        assert_eq!(expected.len(), 3);
        // A thread that exits between the glob and the read must not cost the sample.
        let gone = format!("/proc/{}/task/999999999", std::process::id());
        let sample = pvmm_rig::scripts::assemble(&[], &[PROBE_SAMPLE, "probe_sample \"$@\""]);
        let threads_file =
            std::env::temp_dir().join(format!("probe-threads-{}", std::process::id()));
        let out = std::process::Command::new(BUSYBOX)
            .args(["sh", "-c", &sample, "sh"])
            .args([format!("{gone}/stat"), format!("{gone}/status")])
            .env("PVMM_PID", std::process::id().to_string())
            .env("PROBE_THREADS", &threads_file)
            .output()
            .unwrap();
        drop(stop_tx);
        for t in threads {
            t.join().unwrap();
        }
        let lines: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let trace = PlacementTrace::parse(&lines);
        assert_eq!(trace.samples.len(), 1, "{lines:?}");
        let sample = &trace.samples[0];
        let seen: Vec<(u32, u32, Vec<u32>)> = sample
            .threads
            .iter()
            .map(|t| (t.vcpu, t.tid, t.allowed.clone()))
            .collect();
        assert_eq!(seen, expected, "{lines:?}");
        let cpus = std::fs::read_to_string("/proc/stat")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        assert_eq!(sample.cpus.len(), cpus, "{lines:?}");
        assert!(sample.t > 0.0);
        // Every thread of the process, the test harness's own included, as /proc showed it.
        let threads_lines: Vec<String> = std::fs::read_to_string(&threads_file)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        std::fs::remove_file(&threads_file).unwrap();
        let seccomp = PlacementTrace::parse(&threads_lines).seccomp;
        expected_seccomp.sort();
        let mut seen: Vec<ThreadSeccomp> = seccomp
            .into_iter()
            .filter(|t| t.name.starts_with("vcpu"))
            .collect();
        seen.sort();
        assert_eq!(seen, expected_seccomp, "{threads_lines:?}");
    }
}
