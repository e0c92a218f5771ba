//! The loop's phases against recording members: order, restarts, the `none` policy,
//! housekeeping and totals.

use std::path::PathBuf;

use pvmm_scheduler::{HostTopology, Policy};

use super::*;

/// Members that record what the loop asked of them.
#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
    /// Loads to hand the loop: (vCPU, util, busy).
    vcpus: Vec<(u32, u32, bool)>,
    control: Control,
    /// Where the vCPUs run, told at `assume`.
    homes: Vec<(u32, u32)>,
    lowest: Option<u32>,
    housekeeping: Vec<CpuSet>,
    /// What the housekeeping threads used, handed to the loop at every tick.
    housekeeping_util: u32,
    applied: Applied,
}

impl Members for Recorder {
    type Error = PlaceError;

    fn discover(&mut self) {
        self.calls.push("discover".into());
    }

    fn sample(&mut self, _now_ns: u64, loads: &mut Vec<VcpuLoad>) {
        self.calls.push("sample".into());
        loads.extend(self.vcpus.iter().map(|&(vcpu, util, busy)| VcpuLoad {
            id: VcpuId { vm: 0, vcpu },
            util,
            busy,
            waited: 0,
        }));
    }

    fn control(&mut self, _now_ns: u64) -> Control {
        std::mem::take(&mut self.control)
    }

    fn lease_lapsed(&mut self, policy: PlacementPolicy) {
        self.calls.push(format!("lapsed {policy}"));
    }

    fn assume(&mut self, fresh: bool, assume: &mut dyn FnMut(VcpuId, u32)) {
        self.calls.push(format!("assume {fresh}"));
        if fresh {
            for &(vcpu, cpu) in &self.homes {
                assume(VcpuId { vm: 0, vcpu }, cpu);
            }
        }
    }

    fn topology_changed(&mut self, topology: &HostTopology) {
        self.calls.push(format!("topology {}", topology.cpu_set()));
    }

    fn apply(&mut self, decision: &Decision) -> Result<Applied, PlaceError> {
        self.calls
            .push(format!("apply {}", decision.assignments.len()));
        Ok(self.applied)
    }

    fn apply_outside(&mut self, _topology: &HostTopology) -> Applied {
        self.calls.push("outside".into());
        self.applied
    }

    fn follow_host(&mut self, _topology: &HostTopology) {
        self.calls.push("follow".into());
    }

    fn release(&mut self, all: &CpuSet) {
        self.calls.push(format!("release {all}"));
    }

    fn lowest_package(&self) -> Option<u32> {
        self.lowest
    }

    fn pin_housekeeping(&mut self, cpus: &CpuSet) -> u64 {
        self.housekeeping.push(cpus.clone());
        1
    }

    fn sample_housekeeping(&mut self, _now_ns: u64) -> u32 {
        self.housekeeping_util
    }

    fn publish(&mut self) {
        self.calls.push("publish".into());
    }

    fn report(&mut self, tick: &TickReport<'_>) {
        self.calls.push(format!(
            "report decided={} outside={} ticks={}",
            tick.decision.is_some(),
            tick.outside,
            tick.totals.ticks
        ));
    }
}

fn two_packages() -> HostTopology {
    HostTopology::from_spec("2x2x1").expect("a valid spec")
}

fn powersaving() -> PlacementPolicy {
    PlacementPolicy::Managed(Policy::Powersaving { level: 1 })
}

fn tick(policy: PlacementPolicy) -> Tick {
    Tick::new(
        policy,
        two_packages(),
        EngineConfig::default(),
        PhaseClock::Wall,
    )
}

fn busy(n: u32) -> Vec<(u32, u32, bool)> {
    (0..n).map(|v| (v, 1024, true)).collect()
}

#[test]
fn a_tick_runs_its_phases_in_order() {
    let mut t = tick(powersaving());
    let mut m = Recorder {
        vcpus: busy(2),
        ..Recorder::default()
    };
    let decision = t.run(0, &mut m).expect("placed");
    assert_eq!(decision.map(|d| d.assignments.len()), Some(2));
    assert_eq!(
        m.calls,
        [
            "discover",
            "sample",
            "assume false",
            "apply 2",
            "publish",
            "report decided=true outside=false ticks=1"
        ]
    );
}

#[test]
fn housekeeping_follows_the_lowest_package_the_decision_uses() {
    let mut t = tick(powersaving());
    let mut m = Recorder {
        vcpus: busy(1),
        ..Recorder::default()
    };
    let decision = t.run(0, &mut m).expect("placed").expect("decided");
    let package = decision.assignments[0].package;
    assert_eq!(m.housekeeping, [two_packages().package_cpus(package)]);
    // The recorder refuses one housekeeping change per tick: counted as an apply error.
    assert_eq!(t.totals().apply_errors, 1);
}

/// The housekeeping threads' CPU time takes room on the package they were kept on: two busy
/// vCPUs fill a two-CPU package, so once the threads use half a CPU there one vCPU moves to
/// the other package, and the threads stay on the lowest one.
#[test]
fn housekeeping_load_takes_room_on_its_package() {
    let mut t = tick(powersaving());
    let mut m = Recorder {
        vcpus: busy(2),
        ..Recorder::default()
    };
    let packages = |t: &Tick| -> Vec<u32> {
        let mut p: Vec<u32> = t.decision().assignments.iter().map(|a| a.package).collect();
        p.sort_unstable();
        p
    };
    for i in 0..5 {
        t.run(i * 100_000_000, &mut m).expect("placed");
    }
    assert_eq!(packages(&t), [0, 0]);
    m.housekeeping_util = 512;
    for i in 5..15 {
        t.run(i * 100_000_000, &mut m).expect("placed");
    }
    assert_eq!(packages(&t), [0, 1]);
    assert_eq!(m.housekeeping.last(), Some(&two_packages().package_cpus(0)));
}

/// Housekeeping threads busy enough to push every vCPU off their package stay there: the
/// vCPUs settle on the other package instead of drawing the threads after them, tick after
/// tick. One busy vCPU and a CPU of device work need both single-CPU packages (powersaving);
/// a fifth of a CPU of device work sends a busy vCPU to the emptier package (performance).
#[test]
fn housekeeping_threads_do_not_chase_the_vcpus_that_make_room_for_them() {
    for (policy, spec, util) in [
        (powersaving(), "2x1x1", 1024),
        (PlacementPolicy::Managed(Policy::Performance), "2x2x1", 200),
    ] {
        let topology = HostTopology::from_spec(spec).expect("a valid spec");
        let mut t = Tick::new(
            policy,
            topology.clone(),
            EngineConfig::default(),
            PhaseClock::Wall,
        );
        let mut m = Recorder {
            vcpus: busy(1),
            housekeeping_util: util,
            ..Recorder::default()
        };
        let mut moves = 0;
        for i in 0..40 {
            let d = t
                .run(i * 100_000_000, &mut m)
                .expect("placed")
                .expect("decided");
            if i >= 20 {
                moves += d.migrations.len();
            }
        }
        assert_eq!(t.decision().assignments[0].package, 1, "{policy}");
        assert_eq!(moves, 0, "{policy}: settled");
        assert_eq!(
            m.housekeeping.last(),
            Some(&topology.package_cpus(0)),
            "{policy}"
        );
    }
}

#[test]
fn totals_add_what_the_members_applied() {
    let mut t = tick(powersaving());
    let mut m = Recorder {
        vcpus: busy(2),
        applied: Applied {
            moved: 2,
            refused: 1,
        },
        ..Recorder::default()
    };
    for i in 0..3 {
        t.run(i * 100_000_000, &mut m).expect("placed");
    }
    let totals = t.totals();
    assert_eq!((totals.ticks, totals.migrations), (3, 6));
    // One refused placement and one refused housekeeping change a tick.
    assert_eq!(totals.apply_errors, 6);
}

#[test]
fn policy_none_hands_threads_back_and_follows_the_host() {
    let mut t = tick(powersaving());
    let mut m = Recorder {
        vcpus: busy(2),
        control: Control {
            policy: Some(PlacementPolicy::None),
            outside: Outside::No,
        },
        ..Recorder::default()
    };
    assert!(t.run(0, &mut m).expect("ran").is_none());
    assert!(
        m.calls.contains(&"release 0-3".to_string()),
        "{:?}",
        m.calls
    );
    assert!(m.calls.contains(&"follow".to_string()), "{:?}", m.calls);
    assert!(
        m.housekeeping.is_empty(),
        "no one places: threads stay free"
    );
    assert_eq!(t.totals().policy_changes, 1);
    assert_eq!(t.policy(), PlacementPolicy::None);
}

#[test]
fn the_end_of_an_outside_lease_restarts_the_engine_from_where_vcpus_are() {
    let mut t = tick(powersaving());
    let mut m = Recorder {
        vcpus: busy(2),
        control: Control {
            policy: None,
            outside: Outside::Active,
        },
        lowest: Some(1),
        homes: vec![(0, 2), (1, 3)],
        ..Recorder::default()
    };
    assert!(t.run(0, &mut m).expect("ran").is_none());
    assert!(t.outside());
    assert!(m.calls.contains(&"outside".to_string()));
    // Under an outside balancer, housekeeping follows the package its placement uses.
    assert_eq!(m.housekeeping, [two_packages().package_cpus(1)]);

    m.calls.clear();
    m.control = Control {
        policy: None,
        outside: Outside::Lapsed,
    };
    let decision = t
        .run(100_000_000, &mut m)
        .expect("placed")
        .expect("decided");
    assert!(m.calls.contains(&"lapsed powersaving:1".to_string()));
    assert!(
        m.calls.contains(&"assume true".to_string()),
        "{:?}",
        m.calls
    );
    // Told where the vCPUs run, a fresh engine leaves them there: both fit package 1.
    let cpus: Vec<u32> = decision.assignments.iter().map(|a| a.cpu).collect();
    assert_eq!(cpus, [2, 3]);
}

#[test]
fn cpus_going_offline_restart_the_engine_on_the_cpus_left() {
    let dir = std::env::temp_dir().join(format!("pvmm-tick-online-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let online: PathBuf = dir.join("online");
    std::fs::write(&online, "0-3\n").expect("write");
    let watch = OnlineCpus::watch(two_packages(), online.clone()).expect("all online");
    let mut t = tick(powersaving()).with_online_cpus(watch, "test");
    let mut m = Recorder {
        vcpus: busy(2),
        homes: vec![(0, 0), (1, 1)],
        ..Recorder::default()
    };
    t.run(0, &mut m).expect("placed");
    std::fs::write(&online, "0-1\n").expect("write");
    m.calls.clear();
    let decision = t
        .run(100_000_000, &mut m)
        .expect("placed")
        .expect("decided");
    assert!(
        m.calls.contains(&"topology 0-1".to_string()),
        "{:?}",
        m.calls
    );
    assert!(
        m.calls.contains(&"assume true".to_string()),
        "{:?}",
        m.calls
    );
    assert!(decision.assignments.iter().all(|a| a.cpu <= 1));
    assert_eq!(t.all_cpus().to_string(), "0-1");
    let _ = std::fs::remove_dir_all(&dir);
}
