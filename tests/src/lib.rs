//! Helpers for pvmm end-to-end tests.
//!
//! The rig tests need QEMU, busybox-static, apt access to the Debian kernel package and a
//! buildable pvmm. The Debian packages come through the rig's own check
//! ([`pvmm_rig::packages::ensure`]: installed when the tests run as root, else named in the
//! command to run). When something is still missing they skip with a loud message on stderr,
//! unless `PVMM_REQUIRE_RIG=1` (CI sets it), in which case they fail.

use std::sync::{Mutex, MutexGuard};

use pvmm_rig::images::{self, L1Images, L1Needs, Workspace};
use pvmm_rig::soak::{classify, BootKind};

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
         !!! (set {REQUIRE_RIG_ENV}=1 to fail instead)\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
}

/// Builds (or reuses) the rig's images, or reports why it cannot and returns None.
/// Call with the [`rig_lock`] held.
pub fn prepare_rig(test: &str, needs: L1Needs) -> Option<(Workspace, L1Images)> {
    if let Err(error) = pvmm_rig::packages::ensure() {
        rig_unavailable(test, &error.to_string());
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

// ---------------------------------------------------------------------------------------------
// Placement and CPPC rig tests: an L1 probe that samples pvmm's vCPU threads from outside, and
// the parsers and measurements the tests build on.
// ---------------------------------------------------------------------------------------------

/// Where the placement tests make pvmm write its `--stats` lines inside L1 (L1's tmpfs root).
pub const L1_STATS_PATH: &str = "/tmp/pvmm-stats.jsonl";

/// L1's USER_HZ: `/proc/stat` and `/proc/<pid>/task/<tid>/stat` count CPU time in these
/// ticks per second (100 on x86 Linux; the Debian kernel L1 runs is no exception).
pub const L1_USER_HZ: f64 = 100.0;

/// A sampling interval's CPU-time share at or above which a vCPU thread counts as busy in it:
/// pvmm's own "busy" definition (ran at least half of the interval).
pub const BUSY_SHARE: f64 = 0.5;

/// One sample of the L1 probe, a single busybox `awk` over `/proc` (pvmm's pid in
/// `$PVMM_PID`), printing:
///
/// - `T <L1 uptime>`;
/// - per L1 CPU `C cpuN <the /proc/stat counters>`;
/// - per vCPU thread `V <comm> <tid> <Cpus_allowed_list> <utime> <stime> <last CPU>` (from
///   `/proc/<pid>/task/<tid>/stat` and `.../status`). pvmm names vCPU N's thread `vcpuN`, QEMU
///   (`-name ...,debug-threads=on`) `CPU N/KVM`; both print as `vcpuN`, so a probe of either
///   VMM parses the same. The fields after the name count from the `)` that ends it (a name
///   may hold spaces).
///
/// One process reading whole files, not the shell's `read` builtin: `read` takes a byte per
/// system call (it must not read past a line), about 16,000 system calls a sample for a
/// 4-vCPU pvmm, 8 ms natively and several times that in a TCG L1 whose CPU 0 the probe
/// shares with a vCPU (on a slow CI machine samples came 0.3-0.5 s apart instead of 0.1 s).
/// This costs an exec and a few dozen reads (6x less natively). Every file is read with
/// `getline`, which returns -1 for a file that cannot be opened (a thread that exited after
/// the shell expanded the glob), where busybox awk would abort on an input file operand; a
/// thread whose `stat` or `status` could not be read is left out (the parser then drops the
/// sample as incomplete).
pub const PROBE_SAMPLE: &str = r#"awk 'BEGIN {
  if ((getline line < "/proc/uptime") > 0) { split(line, w, " "); print "T", w[1] }
  while ((getline line < "/proc/stat") > 0) if (line ~ /^cpu[0-9]/) print "C", line
  for (i = 1; i < ARGC; i++) {
    f = ARGV[i]; n = split(f, path, "/"); tid = path[n - 1]
    if (path[n] == "stat") {
      if ((getline line < f) > 0) {
        lp = index(line, "("); rest = substr(line, lp + 1); rp = match(rest, /\) [A-Za-z] /)
        name = substr(rest, 1, rp - 1); split(substr(rest, rp + 2), w, " ")
        if (name ~ /^CPU [0-9]+\/KVM$/) { split(name, q, "[ /]"); name = "vcpu" q[2] }
        if (name ~ /^vcpu[0-9]+$/) { comm[tid] = name; times[tid] = w[12] " " w[13] " " w[37] }
      }
    } else {
      while ((getline line < f) > 0) if (line ~ /^Cpus_allowed_list:/) { split(line, w, " "); allowed[tid] = w[2] }
    }
    close(f)
  }
  for (tid in comm) if (tid in allowed) print "V", comm[tid], tid, allowed[tid], times[tid]
}' /proc/$PVMM_PID/task/*/stat /proc/$PVMM_PID/task/*/status"#;

/// The L1 probe for placement tests. It pins itself to L1 CPU 0 (package 0) so that its own
/// work never shows up as activity on the package the tests want idle, then every
/// `interval_s` seconds appends a [`PROBE_SAMPLE`] to a tmpfs file.
///
/// It starts with `START <L1 uptime>` (pvmm's start, the origin of its stats `t_ms` within
/// a few milliseconds) and `PKG <cpu> <physical_package_id>` per L1 CPU, and when pvmm has
/// exited prints the samples, the guest's marks (`M <L1 uptime> TEXT` for each guest line
/// `pvmm-mark: TEXT`, see `pvmm_rig::scripts`), then pvmm's `--stats` file
/// ([`L1_STATS_PATH`]) with the fields the tests do not read removed (less console traffic).
pub fn placement_probe(interval_s: &str) -> String {
    format!(
        r#"taskset -p 1 $$ >/dev/null 2>&1 || echo "probe: cannot pin to CPU 0"
out=/tmp/pvmm-samples
read -r up rest < /proc/uptime
echo "START $up" > $out
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  read -r pkg < $c/topology/physical_package_id
  echo "PKG ${{c##*cpu}} $pkg" >> $out
done
while kill -0 $PVMM_PID 2>/dev/null; do
  {PROBE_SAMPLE} >> $out
  sleep {interval_s}
done
cat $out
sleep 1
[ -f /tmp/rig-marks ] && sed 's/^/M /' /tmp/rig-marks
rm -f /tmp/rig-marks
sed -e 's/"tid":[0-9]*,//g' -e 's/,"desired":[0-9]*//g' -e 's/"policy":"[^"]*",//' {L1_STATS_PATH}
"#
    )
}

/// One vCPU thread as the probe saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSample {
    /// vCPU index (from the thread name `vcpuN`).
    pub vcpu: u32,
    /// Thread id in L1.
    pub tid: u32,
    /// `Cpus_allowed_list`, expanded.
    pub allowed: Vec<u32>,
    /// utime + stime, in [`L1_USER_HZ`] ticks.
    pub cpu_ticks: u64,
    /// The CPU it last ran on.
    pub last_cpu: u32,
}

/// One L1 CPU's `/proc/stat` counters at a sample.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTimes {
    /// CPU number.
    pub cpu: u32,
    /// idle + iowait ticks.
    pub idle: u64,
    /// All ticks.
    pub total: u64,
}

/// One probe sample.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSample {
    /// L1 uptime (s).
    pub t: f64,
    /// The vCPU threads, by vCPU index.
    pub threads: Vec<ThreadSample>,
    /// L1's CPUs, by number.
    pub cpus: Vec<CpuTimes>,
}

/// One vCPU in one pvmm `--stats` line.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsVcpu {
    /// vCPU index.
    pub vcpu: u32,
    /// The host CPU list pvmm applied.
    pub cpus: String,
    /// The capacity pvmm publishes through CPPC.
    pub capacity: u64,
    /// pvmm's busy flag.
    pub busy: bool,
}

/// One pvmm `--stats` line (one tick).
#[derive(Debug, Clone, PartialEq)]
pub struct StatsTick {
    /// Milliseconds since pvmm's scheduler started.
    pub t_ms: u64,
    /// The vCPUs, by index.
    pub vcpus: Vec<StatsVcpu>,
    /// GED notifications sent so far.
    pub capacity_notifications: u64,
}

/// Everything a placement probe reported.
#[derive(Debug, Clone, Default)]
pub struct PlacementTrace {
    /// L1 uptime when the probe started (pvmm's start).
    pub start: f64,
    /// L1 CPU -> package id.
    pub package_of: std::collections::BTreeMap<u32, u32>,
    /// The samples, in time order.
    pub samples: Vec<ProbeSample>,
    /// pvmm's stats lines, in order.
    pub ticks: Vec<StatsTick>,
    /// The guest's `pvmm-mark:` lines: L1 uptime and text.
    pub marks: Vec<(f64, String)>,
}

/// Expands a Linux CPU list (`0-2,5`); None when malformed.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

fn malformed<T>(line: &str) -> T {
    panic!("malformed probe line: {line:?}")
}

fn parse_stats_line(line: &str) -> Option<StatsTick> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let vcpus = value
        .get("vcpus")?
        .as_array()?
        .iter()
        .map(|v| {
            Some(StatsVcpu {
                vcpu: u32::try_from(v.get("vcpu")?.as_u64()?).ok()?,
                cpus: v.get("cpus")?.as_str()?.to_string(),
                capacity: v.get("capacity")?.as_u64()?,
                busy: v.get("busy").and_then(|b| b.as_bool()).unwrap_or(false),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(StatsTick {
        t_ms: value.get("t_ms")?.as_u64()?,
        vcpus,
        capacity_notifications: value
            .get("capacity_notifications")
            .and_then(|n| n.as_u64())
            .unwrap_or(0),
    })
}

impl PlacementTrace {
    /// Parses the output of [`placement_probe`] (the rig's `probe_lines`). Panics with the
    /// offending line when a sample line is malformed (a test helper).
    pub fn parse(lines: &[String]) -> PlacementTrace {
        let mut trace = PlacementTrace::default();
        let mut current: Option<ProbeSample> = None;
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.first().copied() {
                Some("START") => trace.start = words[1].parse().unwrap_or_else(|_| malformed(line)),
                Some("PKG") => {
                    trace.package_of.insert(
                        words[1].parse().unwrap_or_else(|_| malformed(line)),
                        words[2].parse().unwrap_or_else(|_| malformed(line)),
                    );
                }
                Some("M") if words.len() >= 3 => {
                    trace.marks.push((
                        words[1].parse().unwrap_or_else(|_| malformed(line)),
                        words[2..].join(" "),
                    ));
                }
                Some("T") => {
                    trace.samples.extend(current.take());
                    current = Some(ProbeSample {
                        t: words[1].parse().unwrap_or_else(|_| malformed(line)),
                        threads: Vec::new(),
                        cpus: Vec::new(),
                    });
                }
                Some("V") if words.len() == 7 => {
                    let sample = current.as_mut().unwrap_or_else(|| malformed(line));
                    let vcpu = words[1]
                        .strip_prefix("vcpu")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| malformed(line));
                    let ticks = |w: &str| w.parse::<u64>().unwrap_or_else(|_| malformed(line));
                    sample.threads.push(ThreadSample {
                        vcpu,
                        tid: words[2].parse().unwrap_or_else(|_| malformed(line)),
                        allowed: parse_cpu_list(words[3]).unwrap_or_else(|| malformed(line)),
                        cpu_ticks: ticks(words[4]) + ticks(words[5]),
                        last_cpu: words[6].parse().unwrap_or_else(|_| malformed(line)),
                    });
                }
                Some("C") if words.len() >= 9 => {
                    let sample = current.as_mut().unwrap_or_else(|| malformed(line));
                    let counters: Vec<u64> = words[2..]
                        .iter()
                        .map(|w| w.parse().unwrap_or_else(|_| malformed(line)))
                        .collect();
                    sample.cpus.push(CpuTimes {
                        cpu: words[1]
                            .strip_prefix("cpu")
                            .and_then(|n| n.parse().ok())
                            .unwrap_or_else(|| malformed(line)),
                        idle: counters[3] + counters[4],
                        total: counters.iter().take(8).sum(),
                    });
                }
                _ if line.starts_with('{') => {
                    if let Some(tick) = parse_stats_line(line) {
                        trace.ticks.push(tick);
                    }
                }
                _ => {}
            }
        }
        trace.samples.extend(current);
        for sample in &mut trace.samples {
            sample.threads.sort_by_key(|t| t.vcpu);
            sample.cpus.sort_by_key(|c| c.cpu);
        }
        // A sample cut off by pvmm's exit (fewer threads than the others) is dropped.
        let vcpus = trace
            .samples
            .iter()
            .map(|s| s.threads.len())
            .max()
            .unwrap_or(0);
        trace
            .samples
            .retain(|s| s.threads.len() == vcpus && !s.cpus.is_empty());
        trace
    }

    /// L1 uptime of the guest's first `pvmm-mark: TEXT` line with this text.
    pub fn mark(&self, text: &str) -> Option<f64> {
        self.marks.iter().find(|(_, m)| m == text).map(|&(t, _)| t)
    }

    /// The CPUs of package `package`.
    pub fn package_cpus(&self, package: u32) -> Vec<u32> {
        self.package_of
            .iter()
            .filter(|(_, &p)| p == package)
            .map(|(&c, _)| c)
            .collect()
    }

    /// Share of sample interval `i` (from sample `i - 1` to `i`) that vCPU `vcpu`'s thread ran.
    pub fn busy_share(&self, i: usize, vcpu: u32) -> f64 {
        let (a, b) = (&self.samples[i - 1], &self.samples[i]);
        let ticks = |s: &ProbeSample| {
            s.threads
                .iter()
                .find(|t| t.vcpu == vcpu)
                .map_or(0, |t| t.cpu_ticks)
        };
        let ran = ticks(b).saturating_sub(ticks(a)) as f64 / L1_USER_HZ;
        let wall = b.t - a.t;
        if wall > 0.0 {
            ran / wall
        } else {
            0.0
        }
    }

    /// The vCPUs busy ([`BUSY_SHARE`]) in sample interval `i`.
    pub fn busy_vcpus(&self, i: usize) -> Vec<u32> {
        self.samples[i]
            .threads
            .iter()
            .map(|t| t.vcpu)
            .filter(|&v| self.busy_share(i, v) >= BUSY_SHARE)
            .collect()
    }

    /// Sample index ranges (intervals `i` with `i >= 1`) in which exactly `vcpus` are busy,
    /// as `(first, last)` interval indexes, in time order.
    pub fn episodes(&self, vcpus: &[u32]) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        let mut open: Option<usize> = None;
        for i in 1..self.samples.len() {
            let matches = self.busy_vcpus(i) == vcpus;
            match (matches, open) {
                (true, None) => open = Some(i),
                (false, Some(first)) => {
                    runs.push((first, i - 1));
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(first) = open {
            runs.push((first, self.samples.len() - 1));
        }
        runs
    }

    /// Intervals after `from` (exclusive) up to the first with any busy vCPU (exclusive).
    pub fn idle_run_after(&self, from: usize) -> (usize, usize) {
        let first = from + 1;
        let mut last = from;
        for i in first..self.samples.len() {
            if !self.busy_vcpus(i).is_empty() {
                break;
            }
            last = i;
        }
        (first, last)
    }

    /// L1 uptime `t` as pvmm's stats clock (ms since pvmm's start).
    pub fn to_pvmm_ms(&self, t: f64) -> f64 {
        (t - self.start) * 1000.0
    }

    /// The capacities pvmm published (stats lines) from `before_ticks` ticks before L1 uptime
    /// `t` to `after_ticks` ticks after it, as vectors by vCPU.
    pub fn capacities_around(
        &self,
        t: f64,
        before_ticks: usize,
        after_ticks: usize,
    ) -> Vec<Vec<u64>> {
        let ms = self.to_pvmm_ms(t);
        let at = self
            .ticks
            .iter()
            .position(|k| k.t_ms as f64 > ms)
            .unwrap_or(self.ticks.len());
        let from = at.saturating_sub(before_ticks + 1);
        let to = (at + after_ticks).min(self.ticks.len());
        self.ticks[from..to]
            .iter()
            .map(|k| k.vcpus.iter().map(|v| v.capacity).collect())
            .collect()
    }

    /// pvmm ticks with `t_ms` in `(from, to]` (L1 uptimes).
    pub fn ticks_between(&self, from: f64, to: f64) -> usize {
        let (a, b) = (self.to_pvmm_ms(from), self.to_pvmm_ms(to));
        self.ticks
            .iter()
            .filter(|k| (k.t_ms as f64) > a && (k.t_ms as f64) <= b)
            .count()
    }

    /// Median interval between pvmm's ticks (s); 0.1 when there are too few.
    pub fn median_tick_s(&self) -> f64 {
        let mut gaps: Vec<u64> = self
            .ticks
            .windows(2)
            .map(|w| w[1].t_ms.saturating_sub(w[0].t_ms))
            .collect();
        if gaps.is_empty() {
            return 0.1;
        }
        gaps.sort_unstable();
        gaps[gaps.len() / 2] as f64 / 1000.0
    }

    /// Share of the time between samples `a` and `b` that L1 CPU `cpu` was idle.
    pub fn cpu_idle_share(&self, cpu: u32, a: usize, b: usize) -> f64 {
        let find = |s: &ProbeSample| s.cpus.iter().find(|c| c.cpu == cpu).cloned();
        match (find(&self.samples[a]), find(&self.samples[b])) {
            (Some(x), Some(y)) if y.total > x.total => {
                y.idle.saturating_sub(x.idle) as f64 / (y.total - x.total) as f64
            }
            _ => 1.0,
        }
    }

    /// The packages vCPU thread `vcpu` may run on at sample `i`.
    pub fn packages_allowed(&self, i: usize, vcpu: u32) -> Vec<u32> {
        let mut packages: Vec<u32> = self.samples[i]
            .threads
            .iter()
            .filter(|t| t.vcpu == vcpu)
            .flat_map(|t| {
                t.allowed
                    .iter()
                    .filter_map(|c| self.package_of.get(c).copied())
            })
            .collect();
        packages.sort_unstable();
        packages.dedup();
        packages
    }

    /// Whether vCPU `vcpu` has a CPU of its own at sample `i`: it may run on exactly one CPU
    /// and no other vCPU thread may run there.
    pub fn has_own_cpu(&self, i: usize, vcpu: u32) -> bool {
        let threads = &self.samples[i].threads;
        let Some(mine) = threads.iter().find(|t| t.vcpu == vcpu) else {
            return false;
        };
        mine.allowed.len() == 1
            && threads
                .iter()
                .filter(|t| t.vcpu != vcpu)
                .all(|t| !t.allowed.contains(&mine.allowed[0]))
    }

    /// One line per sample in `a..=b`: time, busy shares and allowed CPUs (for failure
    /// messages).
    pub fn describe(&self, a: usize, b: usize) -> String {
        let mut out = String::new();
        for i in a.max(1)..=b.min(self.samples.len().saturating_sub(1)) {
            let s = &self.samples[i];
            out.push_str(&format!(
                "  t={:.2} (pvmm {:.0} ms):",
                s.t,
                self.to_pvmm_ms(s.t)
            ));
            for t in &s.threads {
                out.push_str(&format!(
                    " v{}[{:.2} cpus {:?}]",
                    t.vcpu,
                    self.busy_share(i, t.vcpu),
                    t.allowed
                ));
            }
            out.push('\n');
        }
        out
    }
}

/// Hard limit for one L1 boot of placement runs: each pvmm run takes 25-45 s in the rig on an
/// idle machine; shared CI machines are several times slower.
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
    let _lock = rig_lock();
    let (ws, images) = prepare_rig(
        test,
        L1Needs {
            pvmm: true,
            qemu: false,
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
        timeout: SEQUENCE_TIMEOUT_PER_RUN * runs.len() as u32,
        run_limit_secs: SEQUENCE_TIMEOUT_PER_RUN.as_secs(),
        echo: std::env::var_os("PVMM_RIG_ECHO").is_some(),
        probe: Some(format!("{probe_prefix}{}", placement_probe(PROBE_INTERVAL))),
        tuning: pvmm_rig::L1Tuning::default(),
    };
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let started = std::time::Instant::now();
    let outcome = retry_rig_crash(
        test,
        || pvmm_rig::run_pvmm_sequence(&ws, &images, &options, &runs).expect("the rig runs"),
        |outcome| pvmm_boot_kind(outcome, &labels),
    );
    dump_outcome(test, &outcome);
    eprintln!(
        "{test}: {} ({} pvmm runs, {:.1} s)",
        outcome.summary("pvmm"),
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    Some(outcome)
}

/// With `PVMM_RIG_DUMP=DIR` set, writes every classified line of `outcome` to `DIR/<test>.log`:
/// a failure's post-mortem, since a test's own message shows only what it checked.
pub fn dump_outcome(test: &str, outcome: &pvmm_rig::RigOutcome) {
    let Some(dir) = std::env::var_os("PVMM_RIG_DUMP") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{test}.log"));
    let text = outcome.log_text();
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("PVMM_RIG_DUMP: cannot write {}: {e}", path.display());
    }
}

/// Guest console lines shown when a run fails: enough to see where a guest stopped.
const GUEST_TAIL_LINES: usize = 25;

/// L1 console lines shown when a run fails: L1 boots with `loglevel=4`, so these are its
/// kernel's warnings (RCU stalls, lockups) and init's errors, few when all is well.
const L1_TAIL_LINES: usize = 15;

pub use pvmm_rig::soak::PVMM_EXIT_TRIPLE_FAULT;

/// Rig boots a rig test may use for one outcome. The nested rig itself (QEMU TCG emulating
/// SVM for L1's KVM) now and then crashes a guest mid-boot: a triple fault under pvmm, a
/// reset (QEMU exits 0 under `-no-reboot`) under QEMU as the inner VMM, at similar points of
/// the guest's boot (6 of 40 pvmm boots when counted), and L1 failing ([`l1_failed`]).
/// Such an outcome is run again, with a loud `!!! rig retry` line naming its kind, up to 3
/// boots in all; a third crash fails the test like any other failure, and so does, at once, an
/// outcome of a kind not seen before ([`retry_rig_crash`]). Three, not two: on a loaded 2-CPU machine (CI's
/// speed) 3 of 12 sequence boots counted this session ended in an L1 failure, so two in a
/// row would fail about one CI run in six over the three rig test binaries; a retried
/// sequence costs its failure point plus at most 90 s, so CI stays well inside its limit.
pub const RIG_ATTEMPTS: u32 = 3;

/// The rig's other failures, L1's own kernel failing: it reports one of its CPUs stuck
/// (`BUG: soft lockup - CPU#n stuck for 130s! [vcpu3:120]`, seen in CI with pvmm's vCPU
/// threads and with QEMU's) because TCG's emulated SVM stopped returning from guest mode, or it
/// panics (seen once under load: a stack overflow in L1's page-fault entry on the CPU running
/// a vCPU thread), or freezes (no output at all, its heartbeat included: seen in CI and twice
/// under load, the guest's console stopping mid-line), or resets (QEMU exits in the middle of
/// a run, L1 silent: seen under load); the rig then ends the run as
/// [`pvmm_rig::RigEnd::L1Lockup`], [`pvmm_rig::RigEnd::L1Panic`],
/// [`pvmm_rig::RigEnd::L1Frozen`] or [`pvmm_rig::RigEnd::L1Reset`]. No user-space VMM can
/// cause any of these: its threads are
/// preemptible, KVM's run loop gives the CPU up when L1's scheduler asks, and a broken kernel
/// stack in L1 is L1's CPU state, which only the emulator keeps.
pub fn l1_failed(outcome: &pvmm_rig::RigOutcome) -> bool {
    matches!(
        outcome.end,
        pvmm_rig::RigEnd::L1Lockup
            | pvmm_rig::RigEnd::L1Panic
            | pvmm_rig::RigEnd::L1Frozen
            | pvmm_rig::RigEnd::L1Reset
    )
}

/// Runs `boot` up to [`RIG_ATTEMPTS`] times while `kind` says it ended in a known failure of
/// the nested rig ([`BootKind::is_known_rig_failure`]; its answer also says what happened).
/// Every rerun is logged on one `!!! rig retry` line with its kind, so the rig's failure rate
/// stays visible in CI output. Any other outcome is returned at once: a clean one for the test
/// to check, and a failure of a kind the rig has not shown before ([`BootKind::Other`]) for the
/// test to fail on, not to hide by booting again.
pub fn retry_rig_crash<T>(
    test: &str,
    mut boot: impl FnMut() -> T,
    kind: impl Fn(&T) -> (BootKind, String),
) -> T {
    let mut attempt = 1;
    loop {
        let outcome = boot();
        let (found, what) = kind(&outcome);
        if !found.is_known_rig_failure() {
            if found == BootKind::Other {
                eprintln!("!!! {test}: not a known rig failure, not run again: {what}");
            }
            return outcome;
        }
        if attempt == RIG_ATTEMPTS {
            eprintln!(
                "!!! rig retry: {test}: {} in boot {attempt} of {RIG_ATTEMPTS}, the last: {what}",
                found.name()
            );
            return outcome;
        }
        attempt += 1;
        eprintln!(
            "!!! rig retry: {test}: {} (README, Rig reliability): {what}; booting again \
             (attempt {attempt} of {RIG_ATTEMPTS})",
            found.name()
        );
    }
}

/// How a boot of pvmm runs `labels` (all pvmm) ended: see [`retry_rig_crash`].
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
        "run {label}: pvmm did not exit 0 (None: L1 never reported its exit; 137: killed at the run's time limit); its stderr:\n{}\nthe guest's last console lines:\n{}\nL1's last console lines (whole boot):\n{}",
        run.vmm.join("\n"),
        run.guest[run.guest.len().saturating_sub(GUEST_TAIL_LINES)..].join("\n"),
        outcome.l1_lines[outcome.l1_lines.len().saturating_sub(L1_TAIL_LINES)..].join("\n")
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

/// Guest shell helper for the tests' guest commands: `l CPU SECS` starts one 100 %-busy
/// pvmm-load thread pinned to guest CPU `CPU` in the background (so the test knows which vCPU
/// is busy); `r LABEL` prints the mark `pvmm-mark: cppc-LABEL` (L1 timestamps it), then
/// `CPPC LABEL <highest_perf of each CPU> GED <ACPI:Ged interrupts>`.
pub const GUEST_HELPERS: &str = "l(){ taskset -c $1 pvmm-load --threads 1 --duty 100 --seconds $2 >/dev/null & }\n\
r(){ echo pvmm-mark: cppc-$1; echo \"CPPC $1 $(cat /sys/devices/system/cpu/cpu[0-9]*/acpi_cppc/highest_perf | tr '\\n' ' ')GED $(grep Ged /proc/interrupts | awk '{s=0; for(i=2;i<=NF;i++) if ($i ~ /^[0-9]+$/) s+=$i; print s}')\"; }\n";

/// One `r LABEL` line of [`GUEST_HELPERS`].
#[derive(Debug, Clone, PartialEq)]
pub struct CppcRead {
    /// The label.
    pub label: String,
    /// highest_perf per guest CPU.
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

    use pvmm_rig::images::BUSYBOX;

    use super::*;

    /// (boots made, the boot returned) when boot `b` (from 1) ends as `kind_of(b)`.
    fn retried(kind_of: impl Fn(u32) -> BootKind) -> (u32, u32) {
        let mut boots = 0;
        let last = retry_rig_crash(
            "t",
            || {
                boots += 1;
                boots
            },
            |&b| (kind_of(b), "what".to_string()),
        );
        (boots, last)
    }

    /// The probe's sample, run by busybox against this process with two threads named like
    /// pvmm's vCPU threads, parses into one sample with those threads as /proc shows them.
    #[test]
    fn probe_sample_reads_vcpu_threads_and_cpus() {
        if !Path::new(BUSYBOX).is_file() {
            rig_unavailable("probe_sample_reads_vcpu_threads_and_cpus", "no busybox");
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
                    .map(|l| parse_cpu_list(l.trim()).unwrap())
                    .unwrap();
                let tid: u32 = dir.file_name().unwrap().to_str().unwrap().parse().unwrap();
                expected.push((n.parse::<u32>().unwrap(), tid, allowed));
            }
        }
        expected.sort();
        assert_eq!(expected.len(), 3);
        // A thread that exits between the glob and the read must not cost the sample.
        let gone = "/proc/$PVMM_PID/task/999999999/stat /proc/$PVMM_PID/task/999999999/status";
        let out = std::process::Command::new(BUSYBOX)
            .args(["sh", "-c", &format!("{PROBE_SAMPLE} {gone}")])
            .env("PVMM_PID", std::process::id().to_string())
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
    }

    #[test]
    fn crashes_are_run_again_up_to_the_limit_and_a_clean_outcome_is_kept() {
        let fault = |_| BootKind::TripleFault;
        assert_eq!(retried(fault), (RIG_ATTEMPTS, RIG_ATTEMPTS));
        let first = |b| {
            if b == 1 {
                BootKind::L1Lockup
            } else {
                BootKind::Clean
            }
        };
        assert_eq!(retried(first), (2, 2));
        let until_last = |b| {
            if b < RIG_ATTEMPTS {
                BootKind::L1Frozen
            } else {
                BootKind::Clean
            }
        };
        assert_eq!(retried(until_last), (RIG_ATTEMPTS, RIG_ATTEMPTS));
        assert_eq!(retried(|_| BootKind::Clean), (1, 1));
    }

    #[test]
    fn a_failure_of_a_new_kind_is_not_run_again() {
        assert_eq!(retried(|_| BootKind::Other), (1, 1));
        let then_new = |b| {
            if b == 1 {
                BootKind::GuestReset
            } else {
                BootKind::Other
            }
        };
        assert_eq!(retried(then_new), (2, 2));
    }
}
