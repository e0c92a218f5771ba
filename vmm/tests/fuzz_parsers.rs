//! Property-based fuzzing of the parsers behind `--cpus` and `--host-topology` (the scheduler
//! crate's, used here read-only), alone and as pvmm resolves its flags: CPU lists and topology
//! files built from their own tokens, hostile values and garbage.
//!
//! Properties: never a panic; a refused value is one non-empty line, with exit status 2 when
//! pvmm reports it; what is accepted means what it says (a list is the union of its ranges, a
//! file's CPUs are the ones it names, `--cpus` restricts the topology to exactly its CPUs).
//!
//! Seeded and bounded for CI; a longer run:
//! `PROPTEST_CASES=100000 cargo test -p pvmm --test fuzz_parsers` (and `PROPTEST_RNG_SEED=N`
//! for another seed).

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use proptest::prelude::*;
use pvmm::cli::{parse, ParseOutcome};
use pvmm::vmm::{resolve_topology, VmmError};
use pvmm_scheduler::{CpuSet, HostTopology};

/// Cases per property in CI.
const CI_CASES: u32 = 256;
/// The fixed seed of CI runs.
const CI_SEED: u64 = 0x7061_7273_6572_7321;

fn fuzz_config() -> ProptestConfig {
    common::fuzz_config(CI_CASES, CI_SEED)
}

/// A scratch file per test thread.
fn scratch_file(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "pvmm-fuzz-parsers-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn one_line(text: &str) -> Result<(), TestCaseError> {
    prop_assert!(!text.trim().is_empty(), "empty error");
    prop_assert!(!text.contains('\n'), "{text}");
    Ok(())
}

/// A CPU number: small, at the limit, past it, or absurd.
fn cpu_number() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u32..40).prop_map(|n| n.to_string()),
        1 => Just("65535".to_string()),
        1 => Just("65536".to_string()),
        1 => Just("99999999999999999999999".to_string()),
        1 => Just("-1".to_string()),
        1 => Just(String::new()),
        1 => "[0-9]{1,6}",
        1 => "\\PC{1,3}",
    ]
}

/// Text in the CPU list syntax, often well formed, often not.
fn cpu_list_text() -> impl Strategy<Value = String> {
    let element = prop_oneof![
        3 => cpu_number(),
        3 => (cpu_number(), cpu_number()).prop_map(|(a, b)| format!("{a}-{b}")),
        1 => (cpu_number(), cpu_number(), cpu_number()).prop_map(|(a, b, c)| format!("{a}-{b}-{c}")),
    ];
    let separator = prop_oneof![8 => Just(","), 1 => Just(", "), 1 => Just(",,"), 1 => Just(";"), 1 => Just(" ")];
    (
        prop::collection::vec((element, separator), 0..6),
        prop_oneof![Just(""), Just(" "), Just("\n")],
    )
        .prop_map(|(parts, pad)| {
            let mut s = pad.to_string();
            for (i, (e, sep)) in parts.iter().enumerate() {
                if i > 0 {
                    s.push_str(sep);
                }
                s.push_str(e);
            }
            s.push_str(pad);
            s
        })
}

/// One line of a topology file: the keys it knows, and others; numbers and garbage.
fn topology_line() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => Just("cpu"),
        3 => Just("package"),
        3 => Just("core"),
        1 => Just("die"),
        1 => Just("capacity"),
        1 => Just("thread"),
        1 => Just(""),
    ];
    let value = prop_oneof![
        6 => (0u32..8).prop_map(|n| n.to_string()),
        1 => (0u32..2000).prop_map(|n| n.to_string()),
        1 => Just("4294967296".to_string()),
        1 => Just("-3".to_string()),
        1 => Just(String::new()),
        1 => "\\PC{0,4}",
    ];
    let word = prop_oneof![
        8 => (key, value).prop_map(|(k, v)| format!("{k}={v}")),
        1 => "[a-z]{1,5}",
        1 => Just("=".to_string()),
    ];
    prop_oneof![
        8 => prop::collection::vec(word, 0..6).prop_map(|w| w.join(" ")),
        1 => Just("# a comment".to_string()),
        1 => Just(String::new()),
        1 => "\\PC{0,20}",
    ]
}

/// A well-formed file line for CPU `cpu`.
fn good_line(cpu: u32, package: u32, core: u32, capacity: Option<u32>) -> String {
    let mut line = format!("cpu={cpu} package={package} core={core}");
    if let Some(c) = capacity {
        line.push_str(&format!(" capacity={c}"));
    }
    line
}

/// `--host-topology` values: specs, files, garbage.
fn host_topology_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["1x2x1", "2x4x2", "1x1x1", "2x2x2x2", "64x64x1", "0x2x1", "3xx"])
            .prop_map(str::to_string),
        2 => "[0-9xX]{1,10}",
        1 => "\\PC{0,10}",
    ]
}

proptest! {
    #![proptest_config(fuzz_config())]

    /// `--cpus` text: a set that prints back to itself, or one line of error.
    #[test]
    fn any_cpu_list_parses_or_fails_with_one_line(text in cpu_list_text()) {
        match text.parse::<CpuSet>() {
            Ok(set) => {
                prop_assert!(!set.is_empty() || text.trim().is_empty());
                let printed = set.to_string();
                prop_assert_eq!(printed.parse::<CpuSet>().ok(), Some(set));
            }
            Err(e) => one_line(&e.to_string())?,
        }
    }

    /// A well-formed list is the union of its ranges.
    #[test]
    fn well_formed_cpu_lists_are_the_union_of_their_ranges(
        ranges in prop::collection::vec((0u32..300, 0u32..20, any::<bool>()), 1..10)
    ) {
        let text = ranges
            .iter()
            .map(|(lo, n, single)| if *single { lo.to_string() } else { format!("{lo}-{}", lo + n) })
            .collect::<Vec<_>>()
            .join(",");
        let want: BTreeSet<u32> = ranges
            .iter()
            .flat_map(|(lo, n, single)| *lo..=(if *single { *lo } else { lo + n }))
            .collect();
        let set: CpuSet = text.parse().unwrap();
        prop_assert_eq!(set.iter().collect::<BTreeSet<u32>>(), want);
    }

    /// Any topology file: a topology of exactly the CPUs it names, or one line naming the file.
    #[test]
    fn any_topology_file_loads_or_fails_with_one_line(
        lines in prop::collection::vec(topology_line(), 0..10),
        good in prop::collection::vec((0u32..16, 0u32..3, 0u32..4, prop::option::of(0u32..1100)), 0..6),
    ) {
        let mut text: Vec<String> = good
            .iter()
            .map(|(cpu, package, core, capacity)| good_line(*cpu, *package, *core, *capacity))
            .collect();
        text.extend(lines);
        let path = scratch_file("topology");
        std::fs::write(&path, text.join("\n")).unwrap();
        let loaded = HostTopology::from_file(&path);
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
        match loaded {
            Ok(topology) => {
                // Every line with a CPU in it named that CPU.
                let named: BTreeSet<u32> = text
                    .iter()
                    .filter_map(|l| {
                        l.split('#').next().unwrap().split_whitespace().find_map(|w| {
                            w.strip_prefix("cpu=").and_then(|v| v.parse().ok())
                        })
                    })
                    .collect();
                prop_assert_eq!(topology.cpu_set().iter().collect::<BTreeSet<u32>>(), named);
                for cpu in topology.cpus() {
                    prop_assert!((1..=1024).contains(&cpu.capacity));
                }
            }
            Err(e) => {
                let line = e.to_string();
                one_line(&line)?;
            }
        }
    }

    /// pvmm's own resolution of `--host-topology` and `--cpus`: the topology restricted to
    /// exactly the listed CPUs, or an error pvmm reports in one line with exit status 2.
    #[test]
    fn host_topology_and_cpus_flags_resolve_or_fail_with_status_2(
        arg in host_topology_arg(),
        cpus in prop::option::of(cpu_list_text()),
    ) {
        let mut args = vec!["pvmm".to_string(), "--policy".into(), "none".into()];
        args.push(format!("--host-topology={arg}"));
        if let Some(list) = &cpus {
            args.push(format!("--cpus={list}"));
        }
        args.push("kernel".into());
        let config = match parse(args) {
            ParseOutcome::Run(cli) => cli.into_config(),
            ParseOutcome::Error(line) => return one_line(&line),
            ParseOutcome::Print(text) => {
                return Err(TestCaseError::fail(format!("printed {text}")))
            }
        };
        match resolve_topology(&config) {
            Ok(topology) => {
                if let Some(list) = &cpus {
                    let listed: CpuSet = list.parse().unwrap();
                    prop_assert_eq!(topology.cpu_set(), listed);
                }
            }
            Err(e) => {
                one_line(&e.to_string())?;
                prop_assert_eq!(VmmError::status(&e), 2, "{}", e);
            }
        }
    }
}

/// The same through the `pvmm` binary (no KVM needed: flags are checked first): status 2 and
/// one line for a few hostile topology files and CPU lists.
#[test]
fn pvmm_refuses_bad_topology_files_and_cpu_lists_in_one_line() {
    let dir = common::scratch("fuzz-parsers-binary");
    let kernel = common::write_kernel(&dir, &common::HALT_LOOP);
    let cases: &[(&str, Option<&str>)] = &[
        ("cpu=0 package=0 core=0 capacity=0\n", None),
        ("cpu=0 package=0 core=0\ncpu=0 package=1 core=0\n", None),
        ("cpu=70000 package=0 core=0\n", None),
        ("cpu=0 package=0\n", None),
        ("cpu=0 package=0 core=0 core=1\n", None),
        ("\u{0}\u{1}binary\u{ff}", None),
        ("cpu=0 package=0 core=0\n", Some("0-99999999999")),
        ("cpu=0 package=0 core=0\n", Some("1")),
        ("cpu=0 package=0 core=0\n", Some(",")),
    ];
    for (i, (content, cpus)) in cases.iter().enumerate() {
        let file = dir.join(format!("topology-{i}"));
        std::fs::write(&file, content).unwrap();
        let mut args = vec![
            "--policy",
            "none",
            "--host-topology",
            file.to_str().unwrap(),
        ];
        if let Some(list) = cpus {
            args.extend(["--cpus", list]);
        }
        args.push(kernel.to_str().unwrap());
        let out = common::pvmm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{content:?} {cpus:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{content:?} {cpus:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
