//! Cost of one placement decision for all vCPUs of all VMs.
//!
//! Host: 8 packages x 32 cores x 2 threads = 512 CPUs. Loads: 10 vCPUs per VM,
//! 100 / 1,000 / 10,000 vCPUs, utilizations drawn (deterministically) so that
//! the host is about half loaded: a few busy vCPUs, many light ones.
//!
//! - `steady`: the loads of the previous decision again (a converged tick);
//! - `varying`: every decision sees different utilizations (the live case:
//!   PELT values move every tick), cycling through 16 precomputed load sets;
//! - `cold`: the first decision of a fresh engine (every vCPU placed anew,
//!   every buffer allocated, via `Engine::place`).
//!
//! `steady` and `varying` use `Engine::place_into` with one reused `Decision`,
//! as the live VMM's tick loop can.
//!
//! Run: `cargo bench -p pvmm-scheduler --bench placement -- --warm-up-time 1 --measurement-time 3`

use criterion::{black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use pvmm_scheduler::{Decision, Engine, EngineConfig, HostTopology, Policy, VcpuLoad};

#[path = "common/engine_load.rs"]
mod engine_load;
use engine_load::{loads, HOST};

fn placement(c: &mut Criterion) {
    let topology = HostTopology::from_spec(HOST).expect("valid spec");
    let capacity = u64::from(
        pvmm_scheduler::capacity::group_capacity(&topology, &topology.cpu_set()).capacity,
    );
    let mut group = c.benchmark_group("place");
    for n in [100u32, 1_000, 10_000] {
        let sets: Vec<Vec<VcpuLoad>> = (0..16)
            .map(|s| loads(n, 0x9E37_79B9 + s, capacity))
            .collect();
        for policy in [
            Policy::Performance,
            Policy::Balance,
            Policy::Powersaving { level: 2 },
        ] {
            let name = format!("{policy}");
            let fresh = Engine::new(topology.clone(), policy, EngineConfig::default());

            let mut engine = fresh.clone();
            let mut now = 0u64;
            for _ in 0..100 {
                now += 100;
                engine.place(now, &sets[0]).expect("no duplicates");
            }
            let mut out = Decision::default();
            group.bench_with_input(BenchmarkId::new(format!("steady/{name}"), n), &n, |b, _| {
                b.iter(|| {
                    now += 100;
                    engine
                        .place_into(now, black_box(&sets[0]), &mut out)
                        .expect("no duplicates");
                    black_box(&out);
                })
            });

            let mut engine = fresh.clone();
            let mut tick = 0usize;
            group.bench_with_input(
                BenchmarkId::new(format!("varying/{name}"), n),
                &n,
                |b, _| {
                    b.iter(|| {
                        tick += 1;
                        let loads = &sets[tick % sets.len()];
                        engine
                            .place_into(tick as u64 * 100, black_box(loads), &mut out)
                            .expect("no duplicates");
                        black_box(&out);
                    })
                },
            );

            group.bench_with_input(BenchmarkId::new(format!("cold/{name}"), n), &n, |b, _| {
                b.iter_batched(
                    || fresh.clone(),
                    |mut engine| black_box(engine.place(0, &sets[0]).expect("no duplicates")),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, placement);
criterion_main!(benches);
