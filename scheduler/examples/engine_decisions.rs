//! Makes N placement decisions on the engine benchmark's load and host, in one
//! process, so that a tool can count what they cost without timing noise:
//!
//! ```text
//! cargo build --release -p pvmm-scheduler --example engine_decisions
//! valgrind --tool=cachegrind --cache-sim=yes \
//!     target/release/examples/engine_decisions varying performance 20
//! ```
//!
//! Run it with 0 decisions too and subtract: the rest is setup. Modes are the
//! benchmark's (`steady`, `varying`, `cold`) at 10,000 vCPUs.

#[path = "../benches/common/engine_load.rs"]
mod engine_load;

use std::process::ExitCode;

use engine_load::{loads, HOST};
use pvmm_scheduler::{Decision, Engine, EngineConfig, HostTopology, Policy, VcpuLoad};

const USAGE: &str = "usage: engine_decisions steady|varying|cold POLICY DECISIONS";
const VCPUS: u32 = 10_000;
/// Load sets the `varying` mode cycles through, as the benchmark.
const LOAD_SETS: u64 = 16;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, policy, decisions] = args.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let (Ok(policy), Ok(decisions)) = (policy.parse::<Policy>(), decisions.parse::<u64>()) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let Ok(topology) = HostTopology::from_spec(HOST) else {
        eprintln!("engine_decisions: bad host spec {HOST}");
        return ExitCode::from(1);
    };
    let capacity = u64::from(
        pvmm_scheduler::capacity::group_capacity(&topology, &topology.cpu_set()).capacity,
    );
    let sets: Vec<Vec<VcpuLoad>> = (0..LOAD_SETS)
        .map(|s| loads(VCPUS, 0x9E37_79B9 + s, capacity))
        .collect();
    let fresh = Engine::new(topology, policy, EngineConfig::default());
    let mut engine = fresh.clone();
    let mut out = Decision::default();
    let mut moves = 0usize;
    for tick in 1..=decisions {
        let result = match mode.as_str() {
            "steady" => engine.place_into(tick * 100, &sets[0], &mut out),
            "varying" => {
                engine.place_into(tick * 100, &sets[(tick % LOAD_SETS) as usize], &mut out)
            }
            "cold" => {
                engine = fresh.clone();
                engine.place(0, &sets[0]).map(|d| out = d)
            }
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        };
        if let Err(e) = result {
            eprintln!("engine_decisions: {e}");
            return ExitCode::from(1);
        }
        moves += out.moves();
    }
    println!("{decisions} {mode} decisions, {policy}: {moves} moves");
    ExitCode::SUCCESS
}
