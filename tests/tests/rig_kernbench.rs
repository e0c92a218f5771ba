//! A real compile in a pvmm guest, in the rig: the guest mounts the kernbench disk (a Debian 12
//! toolchain and the pinned Lua tree, shared read-only) and builds the tree with `make -j2`
//! (at `-O0`) under `powersaving`, the short case of `cargo xtask bench-kernbench`. The built interpreter
//! runs in the guest and prints its version, and the benchmark reports the build's run time
//! and its package idle and modelled energy from L1's `/proc/stat`. The build runs alone
//! ([`Pace::BUILD_ONLY`]: no warm page cache, no idle around it), which this check does not
//! need and CI's time does.

use pvmm_rig::images::L1Needs;
use pvmm_rig::kernbench::{
    format_table, run_kernbench, KernbenchOptions, Pace, DEFAULT_MEMORY_MIB,
};
use pvmm_rig::Topology;
use pvmm_tests::{prepare_rig, rig_lock};

/// The policy of the one build.
const POLICY: &str = "powersaving";

/// Without the tree's optimization the build takes about half the time: a real compile all
/// the same, and shorter CI.
const QUICK_CFLAGS: &str = "-O0";

#[test]
fn a_real_build_runs_in_the_guest_and_its_time_is_reported() {
    let test = "rig_kernbench";
    let _lock = rig_lock();
    let needs = L1Needs {
        pvmm: true,
        kernbench: true,
        ..Default::default()
    };
    let Some((ws, images)) = prepare_rig(test, needs) else {
        return;
    };
    let options = KernbenchOptions {
        jobs: vec![2],
        policies: vec![POLICY.to_string()],
        rounds: 1,
        mycflags: QUICK_CFLAGS.to_string(),
        vcpus: 4,
        memory_mib: DEFAULT_MEMORY_MIB,
        topology: Topology::default(),
        echo: std::env::var_os("PVMM_RIG_ECHO").is_some(),
        pace: Pace::BUILD_ONLY,
    };
    let measured = run_kernbench(&ws, &images, &options).expect("the rig runs");
    let (builds, failures) = (measured.builds, measured.failures);
    let outcome = measured.outcomes.last().expect("one boot at least");
    eprintln!("{test}: {}", outcome.summary("pvmm"));
    let label = format!("{POLICY}-j2-r0");
    let run = outcome.run(&label).expect("the build's run started");
    let tail: Vec<&String> = run.guest.iter().rev().take(30).rev().collect();
    assert!(
        failures.is_empty(),
        "not measured: {failures:?}\nguest console's end:\n{tail:#?}"
    );
    assert!(
        run.guest.iter().any(|l| l.trim() == "KB lua Lua 5.4"),
        "the built interpreter did not run in the guest: {tail:#?}"
    );
    let [build] = builds.as_slice() else {
        panic!("expected one build, got {builds:?}");
    };
    assert!(build.build_s > 0.0 && build.window_s > 0.0, "{build:?}");
    assert_eq!(build.package_idle.len(), 2, "{build:?}");
    assert!(build.energy_j > 0.0, "{build:?}");
    let table = format_table("N = 2", &options.policies, &[build]);
    eprintln!("{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(POLICY))
        .expect("the policy's row");
    let time = format!("{:.1}", build.build_s);
    assert!(row.split_whitespace().any(|cell| cell == time), "{table}");
}
