//! Host topology sources: fake sysfs trees, topology files and specs. Bad input
//! gives a typed error, never a panic.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use pvmm_scheduler::topology::{parse_host_topology_arg, HostTopology, TopologyError};
use pvmm_scheduler::CpuSet;

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "pvmm-topology-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, relative: &str, content: &str) {
        let path = self.0.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One CPU of a fake sysfs tree.
struct FakeCpu {
    id: u32,
    package: &'static str,
    die: Option<&'static str>,
    core: &'static str,
    siblings: &'static str,
}

fn write_tree(dir: &TempDir, online: &str, cpus: &[FakeCpu]) {
    dir.write("online", &format!("{online}\n"));
    for c in cpus {
        let t = format!("cpu{}/topology", c.id);
        dir.write(
            &format!("{t}/physical_package_id"),
            &format!("{}\n", c.package),
        );
        if let Some(die) = c.die {
            dir.write(&format!("{t}/die_id"), &format!("{die}\n"));
        }
        dir.write(&format!("{t}/core_id"), &format!("{}\n", c.core));
        dir.write(
            &format!("{t}/thread_siblings_list"),
            &format!("{}\n", c.siblings),
        );
    }
}

/// 2 packages x 2 cores x 2 threads, Linux x86 numbering (CPU n and n+4 are siblings).
fn two_by_two_by_two() -> Vec<FakeCpu> {
    let pkg = ["0", "0", "1", "1"];
    let core = ["0", "1", "0", "1"];
    let sib = ["0,4", "1,5", "2,6", "3,7"];
    (0..8u32)
        .map(|id| {
            let k = (id % 4) as usize;
            FakeCpu {
                id,
                package: pkg[k],
                die: Some("0"),
                core: core[k],
                siblings: sib[k],
            }
        })
        .collect()
}

#[test]
fn sysfs_tree_matches_the_equivalent_spec() {
    let dir = TempDir::new();
    write_tree(&dir, "0-7", &two_by_two_by_two());
    let from_sysfs = HostTopology::from_sysfs(dir.path()).unwrap();
    let from_spec = HostTopology::from_spec("2x2x2").unwrap();
    assert_eq!(from_sysfs, from_spec);
    assert_eq!(from_sysfs.siblings(1).to_string(), "1,5");
}

#[test]
fn offline_cpus_and_missing_die_ids_are_handled() {
    let dir = TempDir::new();
    let mut cpus = two_by_two_by_two();
    for c in &mut cpus {
        c.die = None; // older kernels have no die_id
    }
    write_tree(&dir, "0-2,4-6", &cpus);
    let topo = HostTopology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.cpu_set().to_string(), "0-2,4-6");
    assert_eq!(topo.siblings(3), CpuSet::new());
    assert_eq!(topo.siblings(7), CpuSet::new());
    assert_eq!(topo.siblings(2).to_string(), "2,6");
}

#[test]
fn core_cpus_list_replaces_thread_siblings_list() {
    let dir = TempDir::new();
    write_tree(&dir, "0-7", &two_by_two_by_two());
    for c in 0..8 {
        let t = dir.path().join(format!("cpu{c}/topology"));
        fs::rename(t.join("thread_siblings_list"), t.join("core_cpus_list")).unwrap();
    }
    assert_eq!(
        HostTopology::from_sysfs(dir.path()).unwrap(),
        HostTopology::from_spec("2x2x2").unwrap()
    );
    fs::remove_file(dir.path().join("cpu3/topology/core_cpus_list")).unwrap();
    assert!(matches!(
        HostTopology::from_sysfs(dir.path()),
        Err(TopologyError::Unreadable { .. })
    ));
}

#[test]
fn unknown_package_id_reads_as_zero() {
    let dir = TempDir::new();
    write_tree(
        &dir,
        "0-1",
        &[
            FakeCpu {
                id: 0,
                package: "-1",
                die: Some("-1"),
                core: "0",
                siblings: "0",
            },
            FakeCpu {
                id: 1,
                package: "-1",
                die: Some("-1"),
                core: "1",
                siblings: "1",
            },
        ],
    );
    let topo = HostTopology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.num_packages(), 1);
    assert_eq!(topo.num_cores(), 2);
}

#[test]
fn capacities_from_cpu_capacity_and_cpufreq() {
    let dir = TempDir::new();
    let cpus = [
        FakeCpu {
            id: 0,
            package: "0",
            die: None,
            core: "0",
            siblings: "0",
        },
        FakeCpu {
            id: 1,
            package: "0",
            die: None,
            core: "1",
            siblings: "1",
        },
    ];
    write_tree(&dir, "0-1", &cpus);
    dir.write("cpu0/cpufreq/cpuinfo_max_freq", "3000000\n");
    dir.write("cpu1/cpufreq/cpuinfo_max_freq", "1500000\n");
    let topo = HostTopology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.cpu(0).unwrap().capacity, 1024);
    assert_eq!(topo.cpu(1).unwrap().capacity, 512);
    // cpu_capacity wins over frequencies.
    dir.write("cpu0/cpu_capacity", "1024\n");
    dir.write("cpu1/cpu_capacity", "446\n");
    let topo = HostTopology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.cpu(1).unwrap().capacity, 446);
}

fn sysfs_error(setup: impl Fn(&TempDir)) -> TopologyError {
    let dir = TempDir::new();
    write_tree(&dir, "0-7", &two_by_two_by_two());
    setup(&dir);
    let err = HostTopology::from_sysfs(dir.path()).unwrap_err();
    // One line, naming the problem.
    assert!(!err.to_string().contains('\n'), "{err}");
    err
}

#[test]
fn broken_sysfs_trees_give_errors() {
    let err = sysfs_error(|d| fs::remove_file(d.path().join("online")).unwrap());
    assert!(matches!(err, TopologyError::Unreadable { .. }), "{err}");

    let err = sysfs_error(|d| d.write("online", "zero-seven\n"));
    assert!(matches!(err, TopologyError::BadSysfsValue { .. }), "{err}");

    let err = sysfs_error(|d| d.write("online", "0-8\n"));
    assert!(
        matches!(err, TopologyError::Unreadable { .. }),
        "missing cpu8: {err}"
    );

    let err = sysfs_error(|d| d.write("cpu3/topology/core_id", "banana\n"));
    assert!(matches!(err, TopologyError::BadSysfsValue { .. }), "{err}");

    let err = sysfs_error(|d| d.write("cpu3/topology/physical_package_id", "-7\n"));
    assert!(matches!(err, TopologyError::BadSysfsValue { .. }), "{err}");

    let err = sysfs_error(|d| {
        fs::remove_file(d.path().join("cpu2/topology/core_id")).unwrap();
        fs::create_dir(d.path().join("cpu2/topology/core_id")).unwrap();
    });
    assert!(matches!(err, TopologyError::Unreadable { .. }), "{err}");

    // Sibling list without the CPU itself.
    let err = sysfs_error(|d| d.write("cpu1/topology/thread_siblings_list", "5\n"));
    assert!(matches!(err, TopologyError::InconsistentSysfs(_)), "{err}");

    // Siblings that disagree with core ids.
    let err = sysfs_error(|d| d.write("cpu5/topology/core_id", "0\n"));
    assert!(matches!(err, TopologyError::InconsistentSysfs(_)), "{err}");
    let err = sysfs_error(|d| d.write("cpu0/topology/thread_siblings_list", "0-1,4\n"));
    assert!(matches!(err, TopologyError::InconsistentSysfs(_)), "{err}");

    // cpu_capacity on some CPUs only, or out of range.
    let err = sysfs_error(|d| d.write("cpu0/cpu_capacity", "1024\n"));
    assert!(matches!(err, TopologyError::InconsistentSysfs(_)), "{err}");
    let err = sysfs_error(|d| {
        for c in 0..8 {
            d.write(
                &format!("cpu{c}/cpu_capacity"),
                if c == 3 { "2048\n" } else { "1024\n" },
            );
        }
    });
    assert!(
        matches!(
            err,
            TopologyError::BadCapacity {
                cpu: 3,
                capacity: 2048
            }
        ),
        "{err}"
    );
    let err = sysfs_error(|d| d.write("cpu0/cpufreq/cpuinfo_max_freq", "fast\n"));
    assert!(matches!(err, TopologyError::BadSysfsValue { .. }), "{err}");
}

#[test]
fn this_hosts_sysfs_reads() {
    // The test machines are Linux with sysfs; the result must be usable.
    let topo = HostTopology::detect().unwrap();
    assert!(!topo.cpus().is_empty());
    assert_eq!(parse_host_topology_arg("auto").unwrap(), topo);
}

#[test]
fn topology_files() {
    let dir = TempDir::new();
    dir.write(
        "hybrid.topo",
        "# one package, two clusters\n\
         cpu=0 package=0 die=0 core=0 capacity=1024\n\
         cpu=1 package=0 die=0 core=0   # SMT sibling of 0\n\
         \n\
         cpu=2 package=0 die=1 core=0 capacity=446\n",
    );
    let topo = parse_host_topology_arg(dir.path().join("hybrid.topo").to_str().unwrap()).unwrap();
    assert_eq!(topo.cpus().len(), 3);
    assert_eq!(topo.siblings(0).to_string(), "0-1");
    assert_eq!(topo.cpu(2).unwrap().capacity, 446);
    assert_eq!(topo.packages()[0].dies.len(), 2);

    for (content, line, needle) in [
        ("cpu=0 package=0\n", 1, "missing core"),
        (
            "cpu=0 package=0 core=0\ncpu=1 package=x core=0\n",
            2,
            "not a number",
        ),
        ("cpu=0 package=0 core=0 socket=1\n", 1, "unknown key"),
        ("cpu=0 package=0 core=0 core=1\n", 1, "given twice"),
        ("cpu=0 package=0 core=0 junk\n", 1, "not key=value"),
        ("package=0 core=0\n", 1, "missing cpu"),
        ("cpu=70000 package=0 core=0\n", 1, "above"),
    ] {
        dir.write("bad.topo", content);
        match HostTopology::from_file(&dir.path().join("bad.topo")) {
            Err(TopologyError::BadFileLine {
                line: l, reason, ..
            }) => {
                assert_eq!(l, line, "{content:?}");
                assert!(reason.contains(needle), "{content:?}: {reason}");
            }
            other => panic!("{content:?}: {other:?}"),
        }
    }
    dir.write(
        "dup.topo",
        "cpu=0 package=0 core=0\ncpu=0 package=1 core=0\n",
    );
    assert!(matches!(
        HostTopology::from_file(&dir.path().join("dup.topo")),
        Err(TopologyError::DuplicateCpu(0))
    ));
    dir.write("cap.topo", "cpu=0 package=0 core=0 capacity=0\n");
    assert!(matches!(
        HostTopology::from_file(&dir.path().join("cap.topo")),
        Err(TopologyError::BadCapacity { .. })
    ));
    dir.write("empty.topo", "# nothing\n");
    assert!(matches!(
        HostTopology::from_file(&dir.path().join("empty.topo")),
        Err(TopologyError::NoCpus)
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any spec string: a topology or an error, never a panic.
    #[test]
    fn arbitrary_specs_never_panic(spec in "[0-9xX ]{0,14}|\\PC{0,12}") {
        if let Ok(topo) = HostTopology::from_spec(&spec) {
            prop_assert!(!topo.cpus().is_empty());
        }
    }

    /// Any content in any sysfs file: a topology or an error, never a panic.
    #[test]
    fn arbitrary_sysfs_content_never_panics(
        file in prop::sample::select(vec![
            "online", "cpu0/topology/physical_package_id", "cpu1/topology/core_id",
            "cpu2/topology/thread_siblings_list", "cpu3/topology/die_id", "cpu4/cpu_capacity",
        ]),
        content in "[0-9,\\-]{0,10}|\\PC{0,10}",
    ) {
        let dir = TempDir::new();
        write_tree(&dir, "0-7", &two_by_two_by_two());
        dir.write(file, &content);
        if let Err(e) = HostTopology::from_sysfs(dir.path()) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Restricting keeps exactly the allowed CPUs, with their packages.
    #[test]
    fn restrict_keeps_exactly_the_allowed(mask in 1u32..(1 << 16)) {
        let topo = HostTopology::from_spec("2x4x2").unwrap();
        let allowed: CpuSet = (0..16).filter(|c| mask & (1 << c) != 0).collect();
        let r = topo.restrict(&allowed).unwrap();
        prop_assert_eq!(r.cpu_set(), allowed);
        for cpu in r.cpus() {
            prop_assert_eq!(Some(cpu.package), topo.package_of(cpu.id));
        }
    }
}
