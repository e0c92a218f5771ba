//! Host topology: packages -> dies -> cores -> hardware threads, with host CPU ids
//! and per-CPU capacity.
//!
//! Sources: the running host's sysfs ([`HostTopology::from_sysfs`],
//! [`HostTopology::detect`]), a declared spec such as `2x4x2`
//! ([`HostTopology::from_spec`]) or a small declarative file
//! ([`HostTopology::from_file`]). [`HostTopology::restrict`] narrows any of them to
//! the CPUs pvmm may use (`--cpus 2-15,18`).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use thiserror::Error;

use crate::cpuset::{CpuSet, CpuSetError, MAX_CPU_ID};

/// One full CPU (the fastest CPU of the host running alone on its core): the scale of each
/// CPU's capacity here, of `cpu_capacity`, of PELT utilization and of every capacity the
/// engine computes (re-exported as `capacity::CAPACITY_SCALE`).
pub const CAPACITY_SCALE: u32 = 1024;

/// Where [`HostTopology::detect`] reads the host's CPU topology.
pub const SYSFS_CPU_ROOT: &str = "/sys/devices/system/cpu";

/// Errors building a host topology.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// A declared spec did not parse.
    #[error("invalid topology spec {spec:?}: {reason} (expected SOCKETSxCORESxTHREADS like 2x4x2, or SOCKETSxDIESxCORESxTHREADS)")]
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A file (sysfs or topology file) could not be read.
    #[error("cannot read {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A sysfs file held something other than the expected value.
    #[error("unexpected content {content:?} in {path}: {reason}")]
    BadSysfsValue {
        /// The file.
        path: PathBuf,
        /// Its content (trimmed).
        content: String,
        /// What was expected.
        reason: String,
    },
    /// sysfs files contradict each other.
    #[error("inconsistent CPU topology in sysfs: {0}")]
    InconsistentSysfs(String),
    /// A topology file line did not parse.
    #[error("{path}:{line}: {reason}")]
    BadFileLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// The same CPU id was declared twice.
    #[error("CPU {0} is declared more than once")]
    DuplicateCpu(u32),
    /// A CPU capacity outside 1..=1024.
    #[error("CPU {cpu} has capacity {capacity}; capacities are 1..=1024 (1024 = the fastest CPU)")]
    BadCapacity {
        /// The CPU.
        cpu: u32,
        /// The declared capacity.
        capacity: u64,
    },
    /// The topology has no CPU.
    #[error("the host topology has no CPUs")]
    NoCpus,
    /// A CPU list did not parse.
    #[error("invalid CPU list: {0}")]
    BadCpuList(#[from] CpuSetError),
    /// `restrict` named CPUs the host does not have.
    #[error("CPUs {0} are not in the host topology")]
    UnknownCpus(CpuSet),
}

/// One host logical CPU (hardware thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostCpu {
    /// Host CPU id (as in `sched_setaffinity` masks and `/sys/devices/system/cpu/cpuN`).
    pub id: u32,
    /// Physical package (socket) id.
    pub package: u32,
    /// Die id within the package (0 where the platform has one die per package).
    pub die: u32,
    /// Core id within the die, as the platform reports it (may be sparse).
    pub core: u32,
    /// Index of this thread within its core (0, 1, ...), by ascending CPU id.
    pub thread: u32,
    /// Capacity of this CPU running alone on its core, 1..=1024 (1024 = the fastest CPU).
    pub capacity: u32,
}

/// A physical core: the hardware threads sharing its execution units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// Core id (as reported).
    pub id: u32,
    /// Host CPU ids of its threads, ascending (thread 0 first).
    pub cpus: Vec<u32>,
}

/// A die: cores sharing a last-level cache slice and uncore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Die {
    /// Die id within its package.
    pub id: u32,
    /// Its cores, by ascending core id.
    pub cores: Vec<Core>,
}

/// A physical package (socket): the unit whose idle time saves the most power.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// Package id.
    pub id: u32,
    /// Its dies, by ascending die id.
    pub dies: Vec<Die>,
}

impl Package {
    /// All cores of the package, die by die.
    pub fn cores(&self) -> impl Iterator<Item = &Core> {
        self.dies.iter().flat_map(|d| d.cores.iter())
    }

    /// All host CPU ids of the package.
    pub fn cpus(&self) -> CpuSet {
        self.cores().flat_map(|c| c.cpus.iter().copied()).collect()
    }
}

/// The host's CPU topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTopology {
    /// All CPUs, sorted by id.
    cpus: Vec<HostCpu>,
    /// Packages sorted by id, each with dies and cores sorted by id.
    packages: Vec<Package>,
}

/// One CPU as a source declares it, before threads are numbered.
#[derive(Debug, Clone, Copy)]
struct CpuRecord {
    id: u32,
    package: u32,
    die: u32,
    core: u32,
    capacity: u32,
}

impl HostTopology {
    /// Builds the topology from declared CPUs; thread indices are assigned by
    /// ascending CPU id within each (package, die, core).
    fn from_records(mut records: Vec<CpuRecord>) -> Result<Self, TopologyError> {
        if records.is_empty() {
            return Err(TopologyError::NoCpus);
        }
        records.sort_by_key(|r| r.id);
        for pair in records.windows(2) {
            if pair[0].id == pair[1].id {
                return Err(TopologyError::DuplicateCpu(pair[0].id));
            }
        }
        for r in &records {
            if r.capacity == 0 || r.capacity > CAPACITY_SCALE {
                return Err(TopologyError::BadCapacity {
                    cpu: r.id,
                    capacity: u64::from(r.capacity),
                });
            }
        }
        // package -> die -> core -> cpu ids (ascending, since records are sorted).
        let mut tree: BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, Vec<u32>>>> = BTreeMap::new();
        for r in &records {
            tree.entry(r.package)
                .or_default()
                .entry(r.die)
                .or_default()
                .entry(r.core)
                .or_default()
                .push(r.id);
        }
        let mut cpus: Vec<HostCpu> = Vec::with_capacity(records.len());
        let mut packages = Vec::with_capacity(tree.len());
        for (package_id, dies) in tree {
            let mut package = Package {
                id: package_id,
                dies: Vec::with_capacity(dies.len()),
            };
            for (die_id, cores) in dies {
                let mut die = Die {
                    id: die_id,
                    cores: Vec::with_capacity(cores.len()),
                };
                for (core_id, ids) in cores {
                    for (thread, id) in (0u32..).zip(ids.iter()) {
                        let capacity = records
                            .binary_search_by_key(id, |r| r.id)
                            .map(|i| records[i].capacity)
                            .unwrap_or(CAPACITY_SCALE);
                        cpus.push(HostCpu {
                            id: *id,
                            package: package_id,
                            die: die_id,
                            core: core_id,
                            thread,
                            capacity,
                        });
                    }
                    die.cores.push(Core {
                        id: core_id,
                        cpus: ids,
                    });
                }
                package.dies.push(die);
            }
            packages.push(package);
        }
        cpus.sort_by_key(|c| c.id);
        Ok(HostTopology { cpus, packages })
    }

    /// A declared topology: `SxCxT` (sockets x cores per socket x threads per
    /// core) or `SxDxCxT` (with dies per socket). All CPUs have capacity 1024.
    ///
    /// CPUs are numbered as Linux numbers most x86 servers: first thread 0 of
    /// every core, package by package, then thread 1 of every core, and so on;
    /// so in `2x4x2` CPUs 0-3 are package 0, 4-7 package 1, and CPU 8 is CPU 0's
    /// SMT sibling.
    pub fn from_spec(spec: &str) -> Result<Self, TopologyError> {
        let SpecCounts {
            sockets,
            dies,
            cores,
            threads,
        } = parse_spec(spec)?;
        let cores_total = sockets * dies * cores;
        let mut records = Vec::new();
        for t in 0..threads {
            for s in 0..sockets {
                for d in 0..dies {
                    for c in 0..cores {
                        let linear_core = (s * dies + d) * cores + c;
                        // `parse_spec` allows at most MAX_CPU_ID + 1 CPUs in all: every id
                        // and index here fits a u32.
                        #[allow(clippy::cast_possible_truncation)]
                        records.push(CpuRecord {
                            id: (t * cores_total + linear_core) as u32,
                            package: s as u32,
                            die: d as u32,
                            core: c as u32,
                            capacity: CAPACITY_SCALE,
                        });
                    }
                }
            }
        }
        HostTopology::from_records(records)
    }

    /// Reads a topology file: one CPU per line as `key=value` words,
    /// `cpu=N package=P core=C` with optional `die=D` (default 0) and
    /// `capacity=K` (1..=1024, default 1024). `#` starts a comment.
    ///
    /// ```text
    /// # big.LITTLE-like 1 package, 2 clusters
    /// cpu=0 package=0 die=0 core=0 capacity=1024
    /// cpu=1 package=0 die=1 core=0 capacity=446
    /// ```
    pub fn from_file(path: &Path) -> Result<Self, TopologyError> {
        let text = fs::read_to_string(path).map_err(|source| TopologyError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        let mut records = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |reason: String| TopologyError::BadFileLine {
                path: path.to_path_buf(),
                line: index + 1,
                reason,
            };
            let (mut cpu, mut package, mut die, mut core, mut capacity) =
                (None, None, None, None, None);
            for word in line.split_whitespace() {
                let (key, value) = word
                    .split_once('=')
                    .ok_or_else(|| bad(format!("{word:?} is not key=value")))?;
                let number: u32 = value
                    .parse()
                    .map_err(|_| bad(format!("{key}={value:?} is not a number")))?;
                let slot = match key {
                    "cpu" => &mut cpu,
                    "package" => &mut package,
                    "die" => &mut die,
                    "core" => &mut core,
                    "capacity" => &mut capacity,
                    _ => {
                        return Err(bad(format!(
                            "unknown key {key:?} (expected cpu, package, die, core, capacity)"
                        )))
                    }
                };
                if slot.replace(number).is_some() {
                    return Err(bad(format!("{key} given twice")));
                }
            }
            let id = cpu.ok_or_else(|| bad("missing cpu=N".to_string()))?;
            if id > MAX_CPU_ID {
                return Err(bad(format!("cpu={id} is above {MAX_CPU_ID}")));
            }
            records.push(CpuRecord {
                id,
                package: package.ok_or_else(|| bad("missing package=P".to_string()))?,
                die: die.unwrap_or(0),
                core: core.ok_or_else(|| bad("missing core=C".to_string()))?,
                capacity: capacity.unwrap_or(CAPACITY_SCALE),
            });
        }
        HostTopology::from_records(records)
    }

    /// Reads a sysfs CPU tree; `root` is normally `/sys/devices/system/cpu`.
    ///
    /// Uses `online`, and per online CPU `topology/physical_package_id`,
    /// `topology/die_id` (0 if absent), `topology/core_id`,
    /// `topology/thread_siblings_list` (or `core_cpus_list`; checked against
    /// the core ids) and, for capacity, `cpu_capacity` where present, else the
    /// ratio of `cpufreq/cpuinfo_max_freq` to the fastest CPU's, else 1024.
    pub fn from_sysfs(root: &Path) -> Result<Self, TopologyError> {
        let online = read_online(root)?;
        let mut records = Vec::with_capacity(online.len());
        let mut siblings: Vec<(u32, CpuSet)> = Vec::with_capacity(online.len());
        let mut explicit_capacity: Vec<Option<u32>> = Vec::with_capacity(online.len());
        let mut max_freq: Vec<Option<u64>> = Vec::with_capacity(online.len());
        for cpu in &online {
            let read = read_sysfs_cpu(root, cpu)?;
            records.push(read.record);
            siblings.push((cpu, read.siblings));
            explicit_capacity.push(read.explicit_capacity);
            max_freq.push(read.max_freq);
        }
        assign_capacities(&mut records, &explicit_capacity, &max_freq)?;
        check_core_siblings(&records, &siblings, &online)?;
        HostTopology::from_records(records)
    }

    /// The running host's topology, from [`SYSFS_CPU_ROOT`].
    pub fn detect() -> Result<Self, TopologyError> {
        HostTopology::from_sysfs(Path::new(SYSFS_CPU_ROOT))
    }

    /// The same topology limited to `allowed`. Every CPU in `allowed` must exist;
    /// cores that keep only some of their threads keep those threads.
    pub fn restrict(&self, allowed: &CpuSet) -> Result<Self, TopologyError> {
        let unknown: CpuSet = allowed.iter().filter(|c| self.cpu(*c).is_none()).collect();
        if !unknown.is_empty() {
            return Err(TopologyError::UnknownCpus(unknown));
        }
        let records: Vec<CpuRecord> = self
            .cpus
            .iter()
            .filter(|c| allowed.contains(c.id))
            .map(|c| CpuRecord {
                id: c.id,
                package: c.package,
                die: c.die,
                core: c.core,
                capacity: c.capacity,
            })
            .collect();
        HostTopology::from_records(records)
    }

    /// All CPUs, sorted by id.
    pub fn cpus(&self) -> &[HostCpu] {
        &self.cpus
    }

    /// The CPU with this id.
    pub fn cpu(&self, id: u32) -> Option<&HostCpu> {
        self.cpus
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.cpus[i])
    }

    /// All CPU ids.
    pub fn cpu_set(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }

    /// Packages, sorted by id.
    pub fn packages(&self) -> &[Package] {
        &self.packages
    }

    /// Number of packages.
    pub fn num_packages(&self) -> usize {
        self.packages.len()
    }

    /// Number of physical cores.
    pub fn num_cores(&self) -> usize {
        self.packages.iter().map(|p| p.cores().count()).sum()
    }

    /// CPUs of the package with this id (empty if there is none).
    pub fn package_cpus(&self, package: u32) -> CpuSet {
        self.packages
            .iter()
            .find(|p| p.id == package)
            .map(Package::cpus)
            .unwrap_or_default()
    }

    /// Package id of a CPU.
    pub fn package_of(&self, cpu: u32) -> Option<u32> {
        self.cpu(cpu).map(|c| c.package)
    }

    /// The SMT siblings of a CPU, itself included.
    pub fn siblings(&self, cpu: u32) -> CpuSet {
        let Some(me) = self.cpu(cpu) else {
            return CpuSet::new();
        };
        self.cpus
            .iter()
            .filter(|c| (c.package, c.die, c.core) == (me.package, me.die, me.core))
            .map(|c| c.id)
            .collect()
    }
}

impl FromStr for HostTopology {
    type Err = TopologyError;

    /// Parses a declared spec (see [`HostTopology::from_spec`]).
    fn from_str(s: &str) -> Result<Self, TopologyError> {
        HostTopology::from_spec(s)
    }
}

/// The counts a topology spec declares (see [`HostTopology::from_spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecCounts {
    /// Sockets (packages).
    pub sockets: u64,
    /// Dies per socket (1 in an `SxCxT` spec).
    pub dies: u64,
    /// Cores per die.
    pub cores: u64,
    /// Threads per core.
    pub threads: u64,
}

/// Parses a topology spec, `SxCxT` or `SxDxCxT` (`x` or `X` between the counts), into its
/// counts: each at least 1, and at most `MAX_CPU_ID + 1` CPUs in all. The one parser of the
/// spec syntax, for pvmm's `--host-topology` and the rig's L1 topology.
pub fn parse_spec(spec: &str) -> Result<SpecCounts, TopologyError> {
    let bad = |reason: &str| TopologyError::BadSpec {
        spec: spec.to_string(),
        reason: reason.to_string(),
    };
    let fields: Vec<&str> = spec.trim().split(['x', 'X']).collect();
    let numbers = fields
        .iter()
        .map(|f| {
            let f = f.trim();
            if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("{f:?} is not a positive number")));
            }
            match f.parse::<u64>() {
                Ok(0) => Err(bad("counts must be at least 1")),
                Ok(n) => Ok(n),
                Err(_) => Err(bad(&format!("{f:?} is too large"))),
            }
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let (sockets, dies, cores, threads) = match numbers.as_slice() {
        [s, c, t] => (*s, 1, *c, *t),
        [s, d, c, t] => (*s, *d, *c, *t),
        _ => return Err(bad("expected 3 or 4 fields separated by 'x'")),
    };
    let total = sockets
        .checked_mul(dies)
        .and_then(|n| n.checked_mul(cores))
        .and_then(|n| n.checked_mul(threads));
    match total {
        Some(n) if n <= u64::from(MAX_CPU_ID) + 1 => Ok(SpecCounts {
            sockets,
            dies,
            cores,
            threads,
        }),
        _ => Err(bad(&format!(
            "more than {} CPUs",
            u64::from(MAX_CPU_ID) + 1
        ))),
    }
}

/// Interprets a `--host-topology` style argument: `auto` reads this host's
/// sysfs, something made of digits and `x` is a spec, anything else a file path.
pub fn parse_host_topology_arg(arg: &str) -> Result<HostTopology, TopologyError> {
    let trimmed = arg.trim();
    if trimmed == "auto" {
        HostTopology::detect()
    } else if !trimmed.is_empty()
        && trimmed
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'x' || b == b'X')
    {
        HostTopology::from_spec(trimmed)
    } else {
        HostTopology::from_file(Path::new(arg))
    }
}

fn read_trimmed(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| TopologyError::Unreadable {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads a file that may legitimately be absent.
fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Unreadable {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_number<T: FromStr>(path: &Path, text: &str) -> Result<T, TopologyError> {
    text.parse().map_err(|_| TopologyError::BadSysfsValue {
        path: path.to_path_buf(),
        content: text.to_string(),
        reason: "expected a non-negative integer".to_string(),
    })
}

/// Reads a topology id. Some platforms report `-1` ("unknown") for package and
/// die ids; those CPUs all belong to one package/die, so -1 reads as 0.
fn read_id(path: &Path) -> Result<u32, TopologyError> {
    let text = read_trimmed(path)?;
    let value: i64 = text.parse().map_err(|_| TopologyError::BadSysfsValue {
        path: path.to_path_buf(),
        content: text.clone(),
        reason: "expected an integer id".to_string(),
    })?;
    match value {
        -1 => Ok(0),
        v => u32::try_from(v).map_err(|_| TopologyError::BadSysfsValue {
            path: path.to_path_buf(),
            content: text,
            reason: "id out of range".to_string(),
        }),
    }
}

/// One online CPU as its sysfs directory describes it.
struct SysfsCpu {
    /// Its ids, at [`CAPACITY_SCALE`] until [`assign_capacities`].
    record: CpuRecord,
    /// Its thread siblings, itself included.
    siblings: CpuSet,
    /// `cpu_capacity`, where present.
    explicit_capacity: Option<u32>,
    /// `cpufreq/cpuinfo_max_freq`, where present.
    max_freq: Option<u64>,
}

/// The online CPUs: `online` under `root`.
fn read_online(root: &Path) -> Result<CpuSet, TopologyError> {
    read_trimmed(&root.join("online"))?
        .parse()
        .map_err(|e: CpuSetError| TopologyError::BadSysfsValue {
            path: root.join("online"),
            content: read_trimmed(&root.join("online")).unwrap_or_default(),
            reason: e.to_string(),
        })
}

/// CPU `cpu`'s ids, thread siblings and capacity sources, from `cpuN` under `root`.
fn read_sysfs_cpu(root: &Path, cpu: u32) -> Result<SysfsCpu, TopologyError> {
    let dir = root.join(format!("cpu{cpu}"));
    let topo = dir.join("topology");
    let package = read_id(&topo.join("physical_package_id"))?;
    let die = match read_optional(&topo.join("die_id"))? {
        Some(_) => read_id(&topo.join("die_id"))?,
        None => 0,
    };
    let core = read_id(&topo.join("core_id"))?;
    let siblings = read_thread_siblings(&topo, cpu)?;
    let explicit_capacity = read_optional_number(&dir.join("cpu_capacity"))?;
    let max_freq = read_optional_number(&dir.join("cpufreq").join("cpuinfo_max_freq"))?;
    Ok(SysfsCpu {
        record: CpuRecord {
            id: cpu,
            package,
            die,
            core,
            capacity: CAPACITY_SCALE,
        },
        siblings,
        explicit_capacity,
        max_freq,
    })
}

/// CPU `cpu`'s thread siblings from its `topology` folder `topo`; they must include `cpu`.
fn read_thread_siblings(topo: &Path, cpu: u32) -> Result<CpuSet, TopologyError> {
    // thread_siblings_list is deprecated in favour of core_cpus_list
    // (Linux 5.3+) but both exist today; accept either.
    let mut siblings_path = topo.join("thread_siblings_list");
    let sibling_text = match read_optional(&siblings_path)? {
        Some(text) => text,
        None => {
            siblings_path = topo.join("core_cpus_list");
            read_trimmed(&siblings_path)?
        }
    };
    let sibling_set: CpuSet =
        sibling_text
            .parse()
            .map_err(|e: CpuSetError| TopologyError::BadSysfsValue {
                path: siblings_path.clone(),
                content: sibling_text.clone(),
                reason: e.to_string(),
            })?;
    if !sibling_set.contains(cpu) {
        return Err(TopologyError::InconsistentSysfs(format!(
            "{} lists {sibling_set} without CPU {cpu} itself",
            siblings_path.display()
        )));
    }
    Ok(sibling_set)
}

/// A number in a file that may be absent.
fn read_optional_number<T: FromStr>(path: &Path) -> Result<Option<T>, TopologyError> {
    match read_optional(path)? {
        Some(text) => Ok(Some(parse_number(path, &text)?)),
        None => Ok(None),
    }
}

/// Threads of one core must be exactly each other's siblings: each CPU's online siblings
/// (`siblings`, in `records`' order) are the CPUs with its package, die and core ids.
fn check_core_siblings(
    records: &[CpuRecord],
    siblings: &[(u32, CpuSet)],
    online: &CpuSet,
) -> Result<(), TopologyError> {
    for (i, (cpu, sibling_set)) in siblings.iter().enumerate() {
        let me = records[i];
        let same_core: CpuSet = records
            .iter()
            .filter(|r| (r.package, r.die, r.core) == (me.package, me.die, me.core))
            .map(|r| r.id)
            .collect();
        let online_siblings = sibling_set.intersection(online);
        if same_core != online_siblings {
            return Err(TopologyError::InconsistentSysfs(format!(
                "CPU {cpu}: thread_siblings_list says {online_siblings} (online) but CPUs {same_core} share package {} die {} core {}",
                me.package, me.die, me.core
            )));
        }
    }
    Ok(())
}

/// Capacity per CPU: `cpu_capacity` when every CPU has one; else, when every
/// CPU reports `cpuinfo_max_freq` and they differ, 1024 x freq / fastest freq
/// (asymmetric frequency, as the kernel's arch_scale_cpu_capacity falls back
/// to); else 1024 for all.
fn assign_capacities(
    records: &mut [CpuRecord],
    explicit: &[Option<u32>],
    max_freq: &[Option<u64>],
) -> Result<(), TopologyError> {
    if explicit.iter().all(Option::is_some) {
        for (r, cap) in records.iter_mut().zip(explicit) {
            let cap = cap.unwrap_or(CAPACITY_SCALE);
            if cap == 0 || cap > CAPACITY_SCALE {
                return Err(TopologyError::BadCapacity {
                    cpu: r.id,
                    capacity: u64::from(cap),
                });
            }
            r.capacity = cap;
        }
        return Ok(());
    }
    if explicit.iter().any(Option::is_some) {
        return Err(TopologyError::InconsistentSysfs(
            "cpu_capacity exists for some online CPUs but not all".to_string(),
        ));
    }
    if max_freq.iter().all(Option::is_some) {
        let fastest = max_freq.iter().flatten().copied().max().unwrap_or(0);
        if fastest > 0 {
            for (r, f) in records.iter_mut().zip(max_freq) {
                let f = f.unwrap_or(fastest);
                let capacity = (u128::from(f) * u128::from(CAPACITY_SCALE)) / u128::from(fastest);
                r.capacity = u32::try_from(capacity.clamp(1, u128::from(CAPACITY_SCALE)))
                    .unwrap_or(CAPACITY_SCALE);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_numbers_threads_like_linux_x86() {
        let topo = HostTopology::from_spec("2x4x2").unwrap();
        assert_eq!(topo.cpus().len(), 16);
        assert_eq!(topo.num_packages(), 2);
        assert_eq!(topo.num_cores(), 8);
        assert_eq!(topo.package_cpus(0).to_string(), "0-3,8-11");
        assert_eq!(topo.package_cpus(1).to_string(), "4-7,12-15");
        assert_eq!(topo.siblings(0).to_string(), "0,8");
        assert_eq!(topo.cpu(8).unwrap().thread, 1);
        assert_eq!(topo.package_of(13), Some(1));
        let dies = HostTopology::from_spec("1x2x2x1").unwrap();
        assert_eq!(dies.packages()[0].dies.len(), 2);
    }

    #[test]
    fn spec_counts() {
        let counts = |spec| parse_spec(spec).unwrap();
        assert_eq!(
            counts("2x4x2"),
            SpecCounts {
                sockets: 2,
                dies: 1,
                cores: 4,
                threads: 2
            }
        );
        assert_eq!(counts("1X3x4x1").dies, 3);
        assert!(parse_spec("2x0x1").is_err());
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in [
            "",
            "2x4",
            "0x4x2",
            "2x-4x2",
            "axbxc",
            "2x4x2x2x2",
            "99999x99999x99",
            "2xx2",
            "2x4x2 ",
        ] {
            let result = HostTopology::from_spec(spec);
            if spec == "2x4x2 " {
                assert!(result.is_ok(), "trailing space is trimmed");
            } else {
                assert!(
                    matches!(result, Err(TopologyError::BadSpec { .. })),
                    "{spec:?}"
                );
            }
        }
    }

    #[test]
    fn restrict_keeps_allowed_cpus_only() {
        let topo = HostTopology::from_spec("2x4x2").unwrap();
        let r = topo.restrict(&"2-7,9".parse().unwrap()).unwrap();
        assert_eq!(r.cpu_set().to_string(), "2-7,9");
        assert_eq!(
            r.cpu(9).unwrap().thread,
            0,
            "CPU 9 is alone in its core now"
        );
        assert!(matches!(
            topo.restrict(&"15-17".parse().unwrap()),
            Err(TopologyError::UnknownCpus(s)) if s.to_string() == "16-17"
        ));
        assert!(matches!(
            topo.restrict(&CpuSet::new()),
            Err(TopologyError::NoCpus)
        ));
    }

    #[test]
    fn arg_dispatch() {
        assert_eq!(parse_host_topology_arg("1x2x1").unwrap().cpus().len(), 2);
        assert!(matches!(
            parse_host_topology_arg("/nonexistent/topology"),
            Err(TopologyError::Unreadable { .. })
        ));
    }
}
