//! `pvmm-host` in the rig: two VMs of 2 vCPUs side by side in one L1 (2 packages x 2 cores),
//! each guest running one busy thread, the daemon placing both: two pvmm VMs, and a pvmm VM
//! with a QEMU VM the daemon adopts. Checked from L1's `/proc` (each VM's vCPU threads'
//! `Cpus_allowed_list` and CPU time, each L1 CPU's idle time), not from the daemon's output:
//! the two busy vCPUs are on two different CPUs of one package and the other package stays
//! idle. Each pvmm placing itself (no daemon) would put both busy vCPUs on the same CPU (the
//! tiny-guest test `vmm/tests/host.rs` shows that case). A third boot runs one 4-vCPU pvmm VM
//! whose load rises to four busy threads and falls again: the daemon spreads and then
//! consolidates it; then the daemon is killed (SIGKILL), pvmm places itself once its lease
//! lapses, and a restarted daemon takes the VM over again without moving a vCPU.

use pvmm_rig::{InnerVmm, Rig, RigOutcome, VmSpec};
use pvmm_tests::{
    boot_rig, exit_report, prepare_rig, rig_lock, scripts, PlacementTrace, L1_STATS_PATH,
    PROBE_INTERVAL, PROBE_SAMPLE,
};

/// The runtime directory in L1: pvmm VMs' sockets and the daemon's lock.
const RUNTIME_DIR: &str = "/tmp";
/// Seconds between L1's `go` (sent once every guest is ready, however far apart they booted:
/// up to 40 s in a loaded CI-like run) and VM `n`'s load: `n` times this. One VM's vCPU is busy
/// before the other's, so the daemon places them in turn, each time with one busy vCPU more.
const STAGGER_SECS: u32 = 6;
/// Seconds a guest waits for L1's `go`, and L1 for every guest to be ready: past the 40 s two
/// guests' boots may lie apart on a loaded host, and short of the boot's limit, so that a guest
/// that crashed in its boot (never ready) leaves the others to go on alone, and the boot ends
/// as the rig failure it is, not as a timeout.
const GO_WAIT_SECS: u32 = 120;
/// Seconds of each VM's load: they overlap for this less [`STAGGER_SECS`]; the window judged is
/// the overlap less [`SETTLE_SECS`] and the loads' ending edges ([`BUSY_SPAN_SECS`] and a
/// second), and must last 10 s: 28 s leaves 5 s for a loaded L1's delays.
const LOAD_SECS: u32 = 28;
/// The guest CPU each guest's busy thread is pinned to: left to itself, the guest's scheduler
/// moves the thread between its vCPUs, and the busy vCPU changes under the daemon.
const BUSY_VCPU: u32 = 0;
/// Seconds after the later load start before placement is judged (the daemon reacts within
/// a few ticks; the rest is the two VMs' load starting at different times).
const SETTLE_SECS: f64 = 4.0;
/// Least share of time package 1 must be idle in the window. Package 0's two CPUs are full
/// with the busy vCPUs, so the two idle ones sit on package 1, and their guests' timer
/// wake-ups (slow under nested TCG, slower still when the host is loaded) keep each of its
/// CPUs busy 5-10 % of the time. A busy vCPU on one of them would leave that CPU next to
/// never idle, so the bound tells the two apart with room for a loaded host.
const IDLE_PACKAGE_SHARE: f64 = 0.85;
/// Span (s) over which a vCPU thread's CPU time tells whether its load still runs.
const BUSY_SPAN_SECS: f64 = 2.0;
/// CPU time (USER_HZ ticks) a vCPU thread running its guest's load gets in [`BUSY_SPAN_SECS`]
/// at the least: a fifth of a CPU. A busy vCPU alone on a CPU of a loaded L1 measured 27-80
/// ticks a second, one sharing its CPU gets about half of that, and an idle guest's vCPU 0-10.
const BUSY_MIN_TICKS: u64 = 40;
/// Hard limit for the rig boot.
const RIG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(480);

/// VM `n`'s guest command: one busy thread on vCPU [`BUSY_VCPU`] for [`LOAD_SECS`], from
/// `n` x [`STAGGER_SECS`] after L1 says `go` (`tests/scripts/host-guest.sh`).
fn guest(n: usize) -> String {
    pvmm_rig::scripts::guest_command(
        &[
            ("VM", &n.to_string()),
            ("GO_WAIT_SECS", &GO_WAIT_SECS.to_string()),
            (
                "START_SECS",
                &(STAGGER_SECS * u32::try_from(n).unwrap_or(0)).to_string(),
            ),
            ("BUSY_VCPU", &BUSY_VCPU.to_string()),
            ("LOAD_SECS", &LOAD_SECS.to_string()),
        ],
        &[scripts::HOST_GUEST],
    )
}

/// What runs in L1 beside the daemon.
#[derive(Clone, Copy, PartialEq)]
enum L1Job {
    /// Nothing.
    None,
    /// Kills the daemon after the guest's load falls and starts it again (see
    /// `tests/scripts/host-probe-begin.sh`), each step a mark.
    KillAndRestart,
}

/// The probe of each VM: the first to start launches the daemon, the job that says `go` to
/// every guest once all `vms` are ready, and `l1_job`, in the background; each samples its own
/// VM with the placement probe (its own sample file; the shared marks file kept for the other
/// probe); the last to end stops the daemon and prints its log.
fn probe(l1_job: L1Job, vms: usize) -> String {
    let job = if l1_job == L1Job::KillAndRestart {
        "restart"
    } else {
        ""
    };
    pvmm_rig::scripts::assemble(
        &[
            ("RUNTIME_DIR", RUNTIME_DIR),
            ("VMS", &vms.to_string()),
            ("GO_WAIT_SECS", &GO_WAIT_SECS.to_string()),
            ("L1_JOB", job),
            ("KILL_AFTER_FALL_SECS", &KILL_AFTER_FALL_SECS.to_string()),
            (
                "RESTART_AFTER_KILL_SECS",
                &RESTART_AFTER_KILL_SECS.to_string(),
            ),
            ("PROBE_INTERVAL", PROBE_INTERVAL),
            ("STATS_PATH", L1_STATS_PATH),
        ],
        &[
            PROBE_SAMPLE,
            scripts::HOST_PROBE_BEGIN,
            pvmm_rig::scripts::PLACEMENT_PROBE,
            scripts::HOST_PROBE_END,
        ],
    )
}

/// VM `n` of a scenario: a pvmm VM joining the daemon through its socket, or a QEMU VM the
/// daemon adopts (`vcpus` vCPUs, 256 MiB either way).
fn vm(n: usize, vmm: InnerVmm, vcpus: &str) -> VmSpec {
    let socket = format!("{RUNTIME_DIR}/vm{n}.sock");
    let mut args = vec!["--vcpus", vcpus, "--memory", "256"];
    if vmm == InnerVmm::Pvmm {
        args.extend(["--policy", "powersaving", "--api-socket", &socket]);
    }
    VmSpec {
        vmm,
        args: args.into_iter().map(String::from).collect(),
        guest_command: Some(guest(n)),
    }
}

/// Boots `vms` in one L1 with the daemon (and `l1_job` beside it, see [`probe`]).
fn boot(test: &str, vms: Vec<VmSpec>, l1_job: L1Job) -> Option<RigOutcome> {
    let _lock = rig_lock();
    let needs = pvmm_rig::images::L1Needs {
        pvmm: true,
        qemu: vms.iter().any(|v| v.vmm == InnerVmm::Qemu),
        vmlinux: false,
        ..Default::default()
    };
    let (ws, images) = prepare_rig(test, needs)?;
    let rig = Rig::with_vms(vms.clone())
        .timeout(RIG_TIMEOUT)
        .console_input(true)
        .l1_probe(probe(l1_job, vms.len()))
        .echo(std::env::var_os("PVMM_RIG_ECHO").is_some());
    Some(boot_rig(test, &ws, &images, &rig, &vms))
}

/// The sample in `trace` nearest to L1 time `t`.
fn nearest(trace: &PlacementTrace, t: f64) -> usize {
    (0..trace.samples.len())
        .min_by(|&a, &b| {
            let d = |i: usize| (trace.samples[i].t - t).abs();
            d(a).total_cmp(&d(b))
        })
        .unwrap_or(0)
}

/// CPU time (ticks) of vCPU `v` in sample `i` of `trace`.
fn ticks(trace: &PlacementTrace, i: usize, v: u32) -> u64 {
    trace.samples[i]
        .threads
        .iter()
        .find(|t| t.vcpu == v)
        .map_or(0, |t| t.cpu_ticks)
}

/// The L1 time by which vCPU `v` of `trace` had stopped running a load: the end of the last
/// [`BUSY_SPAN_SECS`] in which it ran [`BUSY_MIN_TICKS`] or more. The guest's `load-end` mark
/// reaches L1 through the guest's console and L1's shell, late by an unknown time when L1 is
/// loaded; after the load the vCPU is idle and may share a CPU, so the window must close
/// before it, by what `/proc` shows.
fn load_stopped(trace: &PlacementTrace, v: u32) -> f64 {
    let mut from = 0;
    let mut last = trace.samples.first().map_or(0.0, |s| s.t);
    for i in 0..trace.samples.len() {
        let t = trace.samples[i].t;
        while from + 1 < i && trace.samples[from + 1].t <= t - BUSY_SPAN_SECS {
            from += 1;
        }
        if trace.samples[from].t <= t - BUSY_SPAN_SECS
            && ticks(trace, i, v).saturating_sub(ticks(trace, from, v)) >= BUSY_MIN_TICKS
        {
            last = t;
        }
    }
    last
}

/// The vCPU of `trace` that ran most between samples `a` and `b`.
fn busiest(trace: &PlacementTrace, a: usize, b: usize) -> u32 {
    let vcpus: Vec<u32> = trace.samples[a].threads.iter().map(|t| t.vcpu).collect();
    vcpus
        .into_iter()
        .max_by_key(|&v| ticks(trace, b, v).saturating_sub(ticks(trace, a, v)))
        .unwrap_or(0)
}

/// Two pvmm VMs, each with a busy vCPU (case a of the design).
#[test]
fn two_vms_busy_vcpus_get_a_cpu_each_on_one_package() {
    let vms = vec![vm(0, InnerVmm::Pvmm, "2"), vm(1, InnerVmm::Pvmm, "2")];
    if let Some(outcome) = boot("rig_host", vms, L1Job::None) {
        check(&outcome);
    }
}

/// A pvmm VM and a QEMU VM of one busy vCPU each: the daemon adopts QEMU's vCPU thread (found
/// by its KVM file descriptor, mapped through debugfs or QEMU's thread names) and places it
/// with pvmm's under one engine. One vCPU each, so that no idle vCPU decides how many
/// packages are needed: with two vCPUs each the engine gave each VM a package of its own in a
/// loaded run (idle vCPUs' utilization under nested TCG varies); the two-vCPU case is the
/// pvmm pair above.
#[test]
fn a_qemu_vm_is_adopted_and_placed_with_a_pvmm_vm() {
    let vms = vec![vm(0, InnerVmm::Pvmm, "1"), vm(1, InnerVmm::Qemu, "1")];
    if let Some(outcome) = boot("rig_host_qemu", vms, L1Job::None) {
        check(&outcome);
    }
}

/// Both VMs' busy vCPUs on two CPUs of package 0 throughout the overlap of their loads, and
/// package 1 (the idle vCPUs) idle, all from L1's `/proc`.
fn check(outcome: &RigOutcome) {
    let runs: Vec<_> = ["0", "1"]
        .iter()
        .map(|l| {
            outcome
                .run(l)
                .unwrap_or_else(|| panic!("VM {l} never started: {}", outcome.summary("pvmm")))
        })
        .collect();
    let host_log: Vec<&String> = runs
        .iter()
        .flat_map(|r| r.probe.iter().filter(|l| l.starts_with("HOST ")))
        .collect();
    for r in &runs {
        assert_eq!(
            r.status,
            Some(0),
            "{}\nthe daemon: {host_log:?}",
            exit_report(outcome, r)
        );
    }
    let traces: Vec<PlacementTrace> = runs
        .iter()
        .map(|r| PlacementTrace::parse(r.probe))
        .collect();
    let mark = |text: &str| {
        traces
            .iter()
            .find_map(|t| t.mark(text))
            .unwrap_or_else(|| panic!("no mark {text}"))
    };
    let begin = mark("load-begin-0").max(mark("load-begin-1")) + SETTLE_SECS;
    let stopped = traces
        .iter()
        .map(|t| load_stopped(t, BUSY_VCPU) - BUSY_SPAN_SECS)
        .fold(f64::INFINITY, f64::min);
    let end = (mark("load-end-0").min(mark("load-end-1"))).min(stopped) - 1.0;
    assert!(
        end - begin >= 10.0,
        "the two loads overlapped only {:.1} s",
        end - begin
    );
    let window: Vec<(usize, usize)> = traces
        .iter()
        .map(|t| (nearest(t, begin), nearest(t, end)))
        .collect();
    let busy: Vec<u32> = traces
        .iter()
        .zip(&window)
        .map(|(t, &(a, b))| busiest(t, a, b))
        .collect();
    assert_eq!(
        busy, [BUSY_VCPU; 2],
        "the busy vCPU of each VM, from L1's /proc"
    );
    let package0 = traces[0].package_cpus(0);
    let (a0, b0) = window[0];
    let cpus = |s: &pvmm_tests::ProbeSample, v: u32| {
        s.threads
            .iter()
            .find(|t| t.vcpu == v)
            .map(|t| t.allowed.clone())
            .unwrap_or_default()
    };
    // Both VMs' vCPU CPU lists at L1 time `t`, one line (for a failure's message).
    let at = |t: f64| {
        let mut line = format!("{t:6.1}");
        for trace in &traces {
            let s = &trace.samples[nearest(trace, t)];
            line.push_str(" |");
            for th in &s.threads {
                line.push_str(&format!(" {}:{:?}/{}", th.vcpu, th.allowed, th.cpu_ticks));
            }
        }
        line
    };
    for i in a0..=b0 {
        let s0 = &traces[0].samples[i];
        let s1 = &traces[1].samples[nearest(&traces[1], s0.t)];
        let (c0, c1) = (cpus(s0, busy[0]), cpus(s1, busy[1]));
        let apart = c0.len() == 1
            && c1.len() == 1
            && c0 != c1
            && package0.contains(&c0[0])
            && package0.contains(&c1[0]);
        if !apart {
            let context: Vec<String> = traces[0].samples
                [i.saturating_sub(20)..=(i + 10).min(traces[0].samples.len() - 1)]
                .iter()
                .map(|s| at(s.t))
                .collect();
            panic!(
                "at {:.1} (window {begin:.1}-{end:.1}): VM 0's busy vCPU {} may run on {c0:?}, \
                 VM 1's busy vCPU {} on {c1:?} (package 0 = {package0:?})\n\
                 t | VM 0 vcpu:[cpus]/ticks | VM 1 ...:\n{}\nthe daemon: {host_log:?}\n\
                 pvmm 0: {:?}\npvmm 1: {:?}",
                s0.t,
                busy[0],
                busy[1],
                context.join("\n"),
                runs[0].vmm,
                runs[1].vmm
            );
        }
    }
    for cpu in traces[0].package_cpus(1) {
        let idle = traces[0].cpu_idle_share(cpu, a0, b0);
        eprintln!(
            "rig_host: L1 CPU {cpu} (package 1) idle {:.1} %",
            idle * 100.0
        );
        assert!(
            idle >= IDLE_PACKAGE_SHARE,
            "L1 CPU {cpu} (package 1) idle only {:.1} %",
            idle * 100.0
        );
    }
    for (n, r) in runs.iter().enumerate() {
        let work = r
            .guest
            .iter()
            .find(|l| l.contains("pvmm-load: total iterations"));
        eprintln!(
            "rig_host: VM {n}: busy vCPU {}, {}",
            busy[n],
            work.map_or("no work line", |w| w.as_str())
        );
    }
}

/// Seconds of four busy threads in the rise-and-fall scenario.
const RISE_SECS: u32 = 20;
/// Seconds of idleness after them: past the engine's 5 s consolidation ramp-down with room
/// for the ticks it takes to see the load gone, then the daemon's kill and restart.
const FALL_SECS: u32 = 30;
/// Seconds after the load starts before the spread is judged: the daemon spreads within two
/// ticks of seeing four busy vCPUs; the rest is the guest starting its four threads and the
/// utilization (32 ms half-life) rising under nested TCG.
const SPREAD_SETTLE_SECS: f64 = 3.0;
/// Seconds after the load ends before consolidation is judged: the 5 s ramp-down
/// (`DEFAULT_RAMP_DOWN_WINDOW_MS`), the demand decaying (utilization and the engine's demand
/// average, about 1 s), and a few ticks of slack.
const CONSOLIDATE_SETTLE_SECS: f64 = 10.0;

/// pvmm's external-placement lease in the rise-and-fall VM (ms), passed explicitly.
const LEASE_MS: u64 = 3000;
/// Seconds after the guest's fall mark reaches L1 before the daemon is killed (SIGKILL): it
/// has consolidated the idle guest by then (the demand's decay and the 5 s ramp-down).
const KILL_AFTER_FALL_SECS: u32 = 9;
/// Seconds the daemon stays dead: past the lease and a few ticks.
const RESTART_AFTER_KILL_SECS: u32 = 5;
/// One pvmm VM of 4 vCPUs under the daemon whose guest runs four busy threads, then idles.
fn rise_and_fall_vm() -> VmSpec {
    let command = pvmm_rig::scripts::guest_command(
        &[
            ("GO_WAIT_SECS", &GO_WAIT_SECS.to_string()),
            ("RISE_SECS", &RISE_SECS.to_string()),
            ("FALL_SECS", &FALL_SECS.to_string()),
        ],
        &[scripts::HOST_RISE_FALL_GUEST],
    );
    let socket = format!("{RUNTIME_DIR}/vm0.sock");
    let lease = LEASE_MS.to_string();
    let args = [
        "--vcpus",
        "4",
        "--memory",
        "256",
        "--policy",
        "powersaving",
        "--api-socket",
        &socket,
        "--external-lease-ms",
        &lease,
        "--stats",
        L1_STATS_PATH,
    ];
    VmSpec {
        vmm: InnerVmm::Pvmm,
        args: args.map(String::from).to_vec(),
        guest_command: Some(command),
    }
}

/// Load rises to four busy vCPUs: the daemon spreads them over both packages, one CPU each;
/// load falls: after the ramp-down it consolidates every vCPU onto package 0 and package 1
/// goes idle. All from L1's `/proc`. Then the daemon is killed and restarted
/// ([`check_kill_and_restart`]); package 0 keeps every vCPU throughout.
#[test]
fn the_daemon_spreads_a_rising_load_and_consolidates_after_it_falls() {
    let Some(outcome) = boot(
        "rig_host_rise_fall",
        vec![rise_and_fall_vm()],
        L1Job::KillAndRestart,
    ) else {
        return;
    };
    let label = Rig::with_vms(vec![rise_and_fall_vm()]).labels().remove(0);
    let run = outcome
        .run(&label)
        .unwrap_or_else(|| panic!("the VM never started: {}", outcome.summary("pvmm")));
    assert_eq!(run.status, Some(0), "{}", exit_report(&outcome, &run));
    let trace = PlacementTrace::parse(run.probe);
    let mark = |text: &str| trace.mark(text).unwrap_or_else(|| panic!("no mark {text}"));
    let (rise, fall, done) = (mark("rise"), mark("fall"), mark("done"));
    // The load's end as /proc shows it: the mark reaches L1 late when L1 is loaded.
    let stopped = (0..4)
        .map(|v| load_stopped(&trace, v) - BUSY_SPAN_SECS)
        .fold(f64::INFINITY, f64::min);
    let busy_end = fall.min(stopped) - 1.0;
    let busy_begin = rise + SPREAD_SETTLE_SECS;
    assert!(
        busy_end - busy_begin >= 5.0,
        "the busy phase was only {:.1} s",
        busy_end - busy_begin
    );
    let describe = |i: usize| {
        let s = &trace.samples[i];
        let vcpus: Vec<String> = s
            .threads
            .iter()
            .map(|t| format!("{}:{:?}", t.vcpu, t.allowed))
            .collect();
        format!("{:.1} {}", s.t, vcpus.join(" "))
    };
    let (package0, package1) = (trace.package_cpus(0), trace.package_cpus(1));
    for i in nearest(&trace, busy_begin)..=nearest(&trace, busy_end) {
        assert!(
            each_on_own_cpu(&trace.samples[i], 4),
            "busy: every vCPU must have a CPU of its own at {}",
            describe(i)
        );
    }
    // What the README quotes: how long after the guest's marks the spread and the
    // consolidation showed in /proc.
    let spread_at = trace
        .samples
        .iter()
        .find(|s| s.t >= rise && each_on_own_cpu(s, 4));
    let packed = |s: &pvmm_tests::ProbeSample| {
        s.threads
            .iter()
            .all(|t| !t.allowed.is_empty() && t.allowed.iter().all(|c| package0.contains(c)))
    };
    let packed_at = trace.samples.iter().position(|s| s.t >= fall && packed(s));
    eprintln!(
        "rig_host_rise_fall: spread {} s after the rise mark; every vCPU on package 0 {} s after the fall mark",
        spread_at.map_or("-".into(), |s| format!("{:.1}", s.t - rise)),
        packed_at.map_or("-".into(), |i| format!("{:.1}", trace.samples[i].t - fall))
    );
    let idle_begin = fall + CONSOLIDATE_SETTLE_SECS;
    let idle_end = done - 1.0;
    assert!(
        idle_end - idle_begin >= 5.0,
        "the idle phase was only {:.1} s",
        idle_end - idle_begin
    );
    let (a, b) = (nearest(&trace, idle_begin), nearest(&trace, idle_end));
    for i in a..=b {
        assert!(
            packed(&trace.samples[i]),
            "idle: every vCPU must be on package 0 ({package0:?}) at {}",
            describe(i)
        );
    }
    for cpu in package1 {
        let idle = trace.cpu_idle_share(cpu, a, b);
        assert!(
            idle >= IDLE_PACKAGE_SHARE,
            "L1 CPU {cpu} (package 1) idle only {:.1} % after the load fell",
            idle * 100.0
        );
    }
    check_kill_and_restart(&trace, done);
}

/// Whether sample `s` shows `n` vCPU threads, each allowed on one CPU no other one has.
fn each_on_own_cpu(s: &pvmm_tests::ProbeSample, n: usize) -> bool {
    let mut cpus: Vec<u32> = s
        .threads
        .iter()
        .filter(|t| t.allowed.len() == 1)
        .map(|t| t.allowed[0])
        .collect();
    cpus.sort_unstable();
    cpus.dedup();
    s.threads.len() == n && cpus.len() == n
}

/// The daemon killed with SIGKILL (the `host-killed` mark, which carries pvmm's last tick
/// before the kill): pvmm, whose placement the daemon held until then, places itself once
/// the lease from the daemon's last renewal has ended, and at the first or second tick after
/// that, all on pvmm's own clock (`t_ms`, `external_renewed_ms`). Restarted
/// (`host-restarted`, with pvmm's last tick before the restart), the daemon takes the VM over
/// again (`external` true again) and no vCPU thread's `Cpus_allowed_list` in L1 changes from
/// the sample before the restart to a second after the takeover (both on L1's clock: the
/// probe's samples and the ticks' `boot_ms`).
fn check_kill_and_restart(trace: &PlacementTrace, done: f64) {
    let mark = |text: &str| {
        trace
            .mark_with_tick(text)
            .unwrap_or_else(|| panic!("no mark {text} with pvmm's tick"))
            .1
    };
    let (at_kill, at_restart) = (mark("host-killed"), mark("host-restarted"));
    assert!(
        at_kill.external,
        "the daemon did not hold placement at pvmm's last tick before the kill: {at_kill:?}"
    );
    let after = |t_ms: u64| trace.ticks.iter().filter(move |k| k.t_ms > t_ms);
    let own = after(at_kill.t_ms)
        .find(|k| !k.external)
        .expect("pvmm never placed itself after the daemon was killed");
    let renewed = own
        .external_renewed_ms
        .expect("pvmm's stats report the lease's last renewal");
    let lease_end = renewed + LEASE_MS;
    eprintln!(
        "rig_host_rise_fall: pvmm placed itself {} ms after its last tick before the kill, {} ms after the lease's last renewal (lease {LEASE_MS} ms)",
        own.t_ms - at_kill.t_ms,
        own.t_ms - renewed
    );
    assert!(
        own.t_ms >= lease_end,
        "pvmm placed itself at {} ms, before its lease (renewed at {renewed} ms) ended",
        own.t_ms
    );
    let late = trace
        .ticks
        .iter()
        .filter(|k| k.t_ms >= lease_end && k.t_ms < own.t_ms)
        .count();
    assert!(
        late < 2,
        "pvmm placed itself {late} ticks after its lease ended at {lease_end} ms (allowed: the first or second tick)"
    );
    let taken = after(at_restart.t_ms)
        .find(|k| k.external)
        .expect("the restarted daemon never placed the VM");
    eprintln!(
        "rig_host_rise_fall: the restarted daemon took over {} ms after pvmm's last tick before the restart",
        taken.t_ms - at_restart.t_ms
    );
    let from = trace
        .samples
        .iter()
        .rposition(|s| s.t <= at_restart.up)
        .expect("a sample before the restart");
    let to = nearest(trace, (taken.up + 1.0).min(done));
    let allowed = |i: usize| -> Vec<(u32, Vec<u32>)> {
        let mut v: Vec<(u32, Vec<u32>)> = trace.samples[i]
            .threads
            .iter()
            .map(|t| (t.vcpu, t.allowed.clone()))
            .collect();
        v.sort();
        v
    };
    for i in from..=to {
        assert_eq!(
            allowed(i),
            allowed(from),
            "a vCPU moved when the restarted daemon took over (L1 {:.1} s; takeover at {:.1} s)",
            trace.samples[i].t,
            taken.up
        );
    }
}
