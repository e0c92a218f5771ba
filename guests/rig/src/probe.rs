//! The L1 probes: shell that runs in L1 next to the inner VMM and prints what it sees, one
//! line per fact, and the one parser for those lines ([`ProbeLine`]).
//!
//! Lines, by their first word:
//!
//! - `START <L1 uptime>`: the probe started, with pvmm;
//! - `PKG <cpu> <package> [<core>]`: an L1 CPU's place in L1's topology;
//! - `T <L1 uptime>`: a sample begins; its `C` and `V` lines follow;
//! - `C cpuN <the /proc/stat counters>`: an L1 CPU's times at the sample;
//! - `V vcpuN <tid> <Cpus_allowed_list> <utime> <stime> <last CPU>`: a vCPU thread at the sample;
//! - `F <tid> <seccomp mode> <name>`: a pvmm thread's `Seccomp:` field (2: a filter), each
//!   distinct line once per run;
//! - `M <L1 uptime> TEXT`: the guest printed `pvmm-mark: TEXT` then (see [`crate::scripts`]);
//! - `{...}`: a pvmm `--stats` line (JSON), whole, read as the stats schema's type
//!   ([`read_stats`]).
//!
//! The placement tests' probe ([`placement_probe`]) and its [`PlacementTrace`] use all of them;
//! the placement benchmark's probe ([`crate::placement_bench::bench_probe`]) prints `START`,
//! `M`, `K` and stats lines, and its CPU samples go to [`crate::activity`].

use std::collections::BTreeMap;
use std::str::FromStr;

use pvmm::cppc::guest_perfs;
use pvmm_api::stats::VmStats;

/// Where the placement tests make pvmm write its `--stats` lines inside L1 (L1's tmpfs root).
pub const L1_STATS_PATH: &str = "/tmp/pvmm-stats.jsonl";

/// L1's USER_HZ: `/proc/stat` and `/proc/<pid>/task/<tid>/stat` count CPU time in these
/// ticks per second (100 on x86 Linux; the Debian kernel L1 runs is no exception).
pub const L1_USER_HZ: f64 = 100.0;

/// A sampling interval's CPU-time share at or above which a vCPU thread counts as busy in it:
/// pvmm's own "busy" definition (ran at least half of the interval).
pub const BUSY_SHARE: f64 = 0.5;

/// Defines the shell function `probe_sample [FILE...]`: one sample of the L1 probe, a single
/// busybox `awk` over `/proc` (pvmm's pid in `$PVMM_PID`), printing:
///
/// - `T <L1 uptime>`;
/// - per L1 CPU `C cpuN <the /proc/stat counters>`;
/// - per vCPU thread `V <comm> <tid> <Cpus_allowed_list> <utime> <stime> <last CPU>` (from
///   `/proc/<pid>/task/<tid>/stat` and `.../status`). pvmm names vCPU N's thread `vcpuN`, QEMU
///   (`-name ...,debug-threads=on`) `CPU N/KVM`; both print as `vcpuN`, so a probe of either
///   VMM parses the same. The fields after the name count from the `)` that ends it (a name
///   may hold spaces).
///
/// When `$PROBE_THREADS` names a file, it also appends `F <tid> <Seccomp> <name>` there for
/// every thread of the VMM (vCPU threads named as above), from the `status` files it reads
/// anyway: the placement probe prints that file's distinct lines once, at the end, instead of
/// a line per thread in every sample.
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
pub const PROBE_SAMPLE: &str = crate::scripts::PROBE_SAMPLE_LIB;

/// The L1 probe for placement tests. It pins itself to L1 CPU 0 (package 0) so that its own
/// work never shows up as activity on the package the tests want idle, then every
/// `interval_s` seconds appends a sample ([`PROBE_SAMPLE`]) to a tmpfs file.
///
/// It starts with `START <L1 uptime>` (when the probe started, with pvmm) and `PKG <cpu> <physical_package_id>` per L1 CPU, and when pvmm has
/// exited prints the samples, each distinct `F` line of the samples (every pvmm thread's seccomp
/// mode as it was seen; a mode never goes back down), the guest's marks (`M <L1 uptime> TEXT` for each guest line
/// `pvmm-mark: TEXT`, see [`crate::scripts`]), then pvmm's `--stats` file
/// ([`L1_STATS_PATH`]) whole, read as the stats schema's type.
pub fn placement_probe(interval_s: &str) -> String {
    crate::scripts::assemble(
        &[
            ("PROBE_INTERVAL", interval_s),
            ("STATS_PATH", L1_STATS_PATH),
        ],
        &[PROBE_SAMPLE, crate::scripts::PLACEMENT_PROBE],
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

/// A VMM thread's seccomp mode as the probe saw it (an `F` line).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ThreadSeccomp {
    /// Thread id in L1.
    pub tid: u32,
    /// The `Seccomp:` field of its `/proc/<pid>/task/<tid>/status`: 0 none, 1 strict, 2 filter.
    pub mode: u32,
    /// Its name (`comm`; vCPU threads as `vcpuN`).
    pub name: String,
}

pub use pvmm_scheduler::CpuSet;
pub use pvmm_tick::cpustat::CpuTimes;

/// One probe sample.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSample {
    /// L1 uptime (s).
    pub t: f64,
    /// The vCPU threads, by vCPU index.
    pub threads: Vec<ThreadSample>,
    /// L1's CPUs' `/proc/stat` times, by CPU number.
    pub cpus: Vec<(u32, CpuTimes)>,
}

/// One vCPU in one pvmm `--stats` line.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsVcpu {
    /// vCPU index.
    pub vcpu: u32,
    /// The host CPU list pvmm applied.
    pub cpus: String,
    /// The capacity pvmm placed the vCPU with (1..1024); the guest reads it through CPPC on
    /// its own scale ([`PlacementTrace::guest_perfs_around`]).
    pub capacity: u64,
    /// pvmm's busy flag.
    pub busy: bool,
}

/// One pvmm `--stats` line (one tick).
#[derive(Debug, Clone, PartialEq)]
pub struct StatsTick {
    /// Milliseconds since pvmm's scheduler started.
    pub t_ms: u64,
    /// The tick's L1 uptime (s): its `boot_ms`, on the clock of the probe's samples and marks
    /// (`/proc/uptime` is L1's boot clock), so that ticks and samples are timed by one clock.
    pub up: f64,
    /// When the outside balancer last renewed its lease, on the `t_ms` clock.
    pub external_renewed_ms: Option<u64>,
    /// The vCPUs, by index.
    pub vcpus: Vec<StatsVcpu>,
    /// GED notifications sent so far.
    pub capacity_notifications: u64,
    /// An outside balancer (`pvmm host`) placed the vCPUs at this tick.
    pub external: bool,
}

/// Everything a placement probe reported.
#[derive(Debug, Clone, Default)]
pub struct PlacementTrace {
    /// L1 uptime when the probe started, with pvmm (pvmm's ticks carry their own L1 uptime,
    /// [`StatsTick::up`]).
    pub start: f64,
    /// L1 CPU -> package id.
    pub package_of: BTreeMap<u32, u32>,
    /// The samples, in time order.
    pub samples: Vec<ProbeSample>,
    /// pvmm's stats lines, in order.
    pub ticks: Vec<StatsTick>,
    /// The guest's `pvmm-mark:` lines: L1 uptime and text.
    pub marks: Vec<(f64, String)>,
    /// Each thread's seccomp modes seen over the run, each (thread, mode) once.
    pub seccomp: Vec<ThreadSeccomp>,
}

/// One line of an L1 probe's output (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeLine {
    /// `START`: the probe's (and pvmm's) start, L1 uptime in seconds.
    Start(f64),
    /// `PKG`: an L1 CPU, its package and, when printed, its core.
    Package {
        /// L1 CPU number.
        cpu: u32,
        /// Its physical package id.
        package: u32,
        /// Its core id.
        core: Option<u32>,
    },
    /// `T`: a sample begins at this L1 uptime.
    Sample(f64),
    /// `C`: an L1 CPU's times.
    Cpu(u32, CpuTimes),
    /// `V`: a vCPU thread.
    Thread(ThreadSample),
    /// `F`: a VMM thread's seccomp mode.
    Seccomp(ThreadSeccomp),
    /// `M`: a guest mark, its L1 uptime and text.
    Mark(f64, String),
    /// `K`: the vCPU threads' `se.nr_migrations` summed, as L1's kernel counts them, at an L1
    /// uptime.
    KernelMigrations {
        /// L1 uptime (s).
        up: f64,
        /// Migrations so far.
        total: u64,
    },
    /// A pvmm `--stats` line.
    Stats(StatsTick),
}

/// A probe line of a known kind whose fields do not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed probe line: {0:?}")]
pub struct MalformedLine(pub String);

/// Word `index` of `line` as a `T`.
fn field<T: FromStr>(words: &[&str], index: usize, line: &str) -> Result<T, MalformedLine> {
    words
        .get(index)
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| MalformedLine(line.to_string()))
}

/// The number after `prefix` in word `index` of `line` (`cpu3`, `vcpu1`).
fn numbered(words: &[&str], index: usize, prefix: &str, line: &str) -> Result<u32, MalformedLine> {
    words
        .get(index)
        .and_then(|w| w.strip_prefix(prefix))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| MalformedLine(line.to_string()))
}

impl ProbeLine {
    /// Parses one probe line; Ok(None) for a line of no kind (the probe's own messages, a
    /// shorter `M`, `V` or `C` line, a JSON line that is not pvmm's stats).
    pub fn parse(line: &str) -> Result<Option<ProbeLine>, MalformedLine> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let parsed = match words.first().copied() {
            Some("START") => ProbeLine::Start(field(&words, 1, line)?),
            Some("PKG") => ProbeLine::Package {
                cpu: field(&words, 1, line)?,
                package: field(&words, 2, line)?,
                core: match words.len() {
                    3 => None,
                    _ => Some(field(&words, 3, line)?),
                },
            },
            Some("T") => ProbeLine::Sample(field(&words, 1, line)?),
            Some("C") if words.len() >= 9 => {
                let counters = words[2..]
                    .iter()
                    .map(|w| w.parse::<u64>())
                    .collect::<Result<Vec<u64>, _>>()
                    .map_err(|_| MalformedLine(line.to_string()))?;
                ProbeLine::Cpu(
                    numbered(&words, 1, "cpu", line)?,
                    CpuTimes::from_counters(&counters),
                )
            }
            Some("V") if words.len() == 7 => ProbeLine::Thread(ThreadSample {
                vcpu: numbered(&words, 1, "vcpu", line)?,
                tid: field(&words, 2, line)?,
                allowed: words[3]
                    .parse::<CpuSet>()
                    .map_err(|_| MalformedLine(line.to_string()))?
                    .iter()
                    .collect(),
                cpu_ticks: field::<u64>(&words, 4, line)? + field::<u64>(&words, 5, line)?,
                last_cpu: field(&words, 6, line)?,
            }),
            Some("F") if words.len() >= 4 => ProbeLine::Seccomp(ThreadSeccomp {
                tid: field(&words, 1, line)?,
                mode: field(&words, 2, line)?,
                name: words[3..].join(" "),
            }),
            Some("M") if words.len() >= 3 => {
                ProbeLine::Mark(field(&words, 1, line)?, words[2..].join(" "))
            }
            Some("K") if words.len() == 3 => ProbeLine::KernelMigrations {
                up: field(&words, 1, line)?,
                total: field(&words, 2, line)?,
            },
            _ if line.starts_with('{') => match parse_stats_line(line) {
                Some(tick) => ProbeLine::Stats(tick),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        Ok(Some(parsed))
    }
}

/// A pvmm `--stats` line as the stats schema's one type ([`VmStats`]); None when it is not one.
pub fn read_stats(line: &str) -> Option<VmStats> {
    serde_json::from_str(line).ok()
}

/// A pvmm `--stats` line ([`read_stats`]) reduced to the fields the tests read; None when it is
/// not one.
fn parse_stats_line(line: &str) -> Option<StatsTick> {
    let stats = read_stats(line)?;
    let vcpus = stats
        .vcpus
        .iter()
        .map(|v| StatsVcpu {
            vcpu: v.vcpu,
            cpus: v.cpus.to_string(),
            capacity: u64::from(v.capacity),
            busy: v.busy,
        })
        .collect();
    Some(StatsTick {
        t_ms: stats.t_ms,
        up: ms_as_secs(stats.boot_ms),
        external_renewed_ms: stats.external_renewed_ms,
        vcpus,
        capacity_notifications: stats.capacity_notifications.unwrap_or(0),
        external: stats.external,
    })
}

/// Milliseconds as seconds.
fn ms_as_secs(ms: u64) -> f64 {
    // Exact below 2^53 ms (285,000 years of uptime).
    #[allow(clippy::cast_precision_loss)]
    let ms = ms as f64;
    ms / 1000.0
}

/// The sample a `V` or `C` line belongs to; panics when none has begun.
fn open_sample<'a>(current: &'a mut Option<ProbeSample>, line: &str) -> &'a mut ProbeSample {
    current
        .as_mut()
        .unwrap_or_else(|| panic!("{}", MalformedLine(line.to_string())))
}

impl PlacementTrace {
    /// Parses the output of [`placement_probe`] (the rig's `probe_lines`). Panics with the
    /// offending line when a line is malformed, or a sample's line comes before any sample (a
    /// test helper).
    pub fn parse(lines: &[String]) -> PlacementTrace {
        let mut trace = PlacementTrace::default();
        let mut current: Option<ProbeSample> = None;
        for line in lines {
            let parsed = ProbeLine::parse(line).unwrap_or_else(|error| panic!("{error}"));
            match parsed {
                Some(ProbeLine::Start(t)) => trace.start = t,
                Some(ProbeLine::Package { cpu, package, .. }) => {
                    trace.package_of.insert(cpu, package);
                }
                Some(ProbeLine::Mark(t, text)) => trace.marks.push((t, text)),
                Some(ProbeLine::Sample(t)) => {
                    trace.samples.extend(current.take());
                    current = Some(ProbeSample {
                        t,
                        threads: Vec::new(),
                        cpus: Vec::new(),
                    });
                }
                Some(ProbeLine::Thread(thread)) => {
                    open_sample(&mut current, line).threads.push(thread)
                }
                Some(ProbeLine::Cpu(cpu, times)) => {
                    open_sample(&mut current, line).cpus.push((cpu, times))
                }
                Some(ProbeLine::Stats(tick)) => trace.ticks.push(tick),
                Some(ProbeLine::Seccomp(thread)) => trace.seccomp.push(thread),
                Some(ProbeLine::KernelMigrations { .. }) | None => {}
            }
        }
        trace.samples.extend(current);
        for sample in &mut trace.samples {
            sample.threads.sort_by_key(|t| t.vcpu);
            sample.cpus.sort_by_key(|&(cpu, _)| cpu);
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

    /// The names of the threads seen, each once, sorted.
    pub fn thread_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.seccomp.iter().map(|t| t.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// The threads (`name/tid`) never seen under a seccomp filter (mode 2). Once a thread has
    /// a filter it keeps one, so a thread seen without one only before is not listed.
    pub fn threads_without_filter(&self) -> Vec<String> {
        let filtered = |tid: u32| self.seccomp.iter().any(|t| t.tid == tid && t.mode == 2);
        let mut without: Vec<String> = self
            .seccomp
            .iter()
            .filter(|t| !filtered(t.tid))
            .map(|t| format!("{}/{}", t.name, t.tid))
            .collect();
        without.sort();
        without.dedup();
        without
    }

    /// L1 uptime of the guest's first `pvmm-mark: TEXT` line with this text.
    pub fn mark(&self, text: &str) -> Option<f64> {
        self.marks.iter().find(|(_, m)| m == text).map(|&(t, _)| t)
    }

    /// The first mark `TEXT {...}` whose words after `text` are a pvmm `--stats` line: its L1
    /// uptime and that tick (an L1 job's mark that carries pvmm's last tick before it, so that
    /// the event is ordered on pvmm's own clock).
    pub fn mark_with_tick(&self, text: &str) -> Option<(f64, StatsTick)> {
        self.marks.iter().find_map(|(t, m)| {
            let line = m.strip_prefix(text)?.strip_prefix(' ')?;
            Some((*t, parse_stats_line(line)?))
        })
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

    /// The capacities pvmm published (stats lines) from `before_ticks` ticks before L1 uptime
    /// `t` to `after_ticks` ticks after it, as vectors by vCPU (the ticks' own L1 uptimes,
    /// [`StatsTick::up`]).
    pub fn capacities_around(
        &self,
        t: f64,
        before_ticks: usize,
        after_ticks: usize,
    ) -> Vec<Vec<u64>> {
        let at = self
            .ticks
            .iter()
            .position(|k| k.up > t)
            .unwrap_or(self.ticks.len());
        let from = at.saturating_sub(before_ticks + 1);
        let to = (at + after_ticks).min(self.ticks.len());
        self.ticks[from..to]
            .iter()
            .map(|k| k.vcpus.iter().map(|v| v.capacity).collect())
            .collect()
    }

    /// What the guest's CPPC registers held at the ticks of [`Self::capacities_around`]: each
    /// tick's capacities as pvmm maps them onto the guest's performance scale
    /// ([`guest_perfs`]), the values the guest reads as `highest_perf`.
    pub fn guest_perfs_around(
        &self,
        t: f64,
        before_ticks: usize,
        after_ticks: usize,
    ) -> Vec<Vec<u64>> {
        self.capacities_around(t, before_ticks, after_ticks)
            .iter()
            .map(|tick| {
                let capacities: Vec<u32> = tick
                    .iter()
                    .map(|&c| u32::try_from(c).unwrap_or(u32::MAX))
                    .collect();
                guest_perfs(&capacities)
                    .into_iter()
                    .map(u64::from)
                    .collect()
            })
            .collect()
    }

    /// pvmm's ticks at L1 uptimes in `(from, to]`: one clock, L1's, times both the ticks
    /// ([`StatsTick::up`]) and the probe's samples.
    pub fn ticks_in(&self, from: f64, to: f64) -> impl DoubleEndedIterator<Item = &StatsTick> {
        self.ticks.iter().filter(move |k| k.up > from && k.up <= to)
    }

    /// How many of pvmm's ticks came at L1 uptimes in `(from, to]` ([`Self::ticks_in`]).
    pub fn ticks_between(&self, from: f64, to: f64) -> usize {
        self.ticks_in(from, to).count()
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
        let find = |s: &ProbeSample| s.cpus.iter().find(|&&(c, _)| c == cpu).map(|&(_, t)| t);
        match (find(&self.samples[a]), find(&self.samples[b])) {
            (Some(x), Some(y)) => y.idle_fraction_since(&x).unwrap_or(1.0),
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
            out.push_str(&format!("  t={:.2}:", s.t));
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

#[cfg(test)]
mod tests;
