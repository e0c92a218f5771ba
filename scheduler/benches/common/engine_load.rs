//! The load of the engine benchmarks: one host, VMs of 10 vCPUs, deterministic
//! utilizations about half the host. Shared by `benches/placement.rs`
//! (criterion timings) and `examples/engine_decisions.rs` (one process making
//! N decisions, to count instructions under valgrind).

use pvmm_scheduler::{VcpuId, VcpuLoad};

pub const HOST: &str = "8x32x2";
const VCPUS_PER_VM: u32 = 10;
/// Fraction (per mille) of the host's SMT capacity the load uses on average.
const HOST_LOAD_PERMILLE: u64 = 500;

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `n` vCPUs in VMs of 10 whose utilizations average to HOST_LOAD_PERMILLE of
/// the host (capped at one CPU each): one vCPU in 8 is busy, the rest light.
pub fn loads(n: u32, seed: u64, capacity: u64) -> Vec<VcpuLoad> {
    let mut rng = Rng(seed | 1);
    let mean = (capacity * HOST_LOAD_PERMILLE / 1000 / u64::from(n)).clamp(8, 1024);
    (0..n)
        .map(|i| {
            let r = rng.next();
            let busy = r & 7 == 0; // one in eight
            let util = if busy {
                (mean * 4).min(1024) - (r >> 8) % (mean.min(256) + 1) / 2
            } else {
                (r >> 16) % (mean * 11 / 7 + 1)
            };
            VcpuLoad {
                id: VcpuId {
                    vm: i / VCPUS_PER_VM,
                    vcpu: i % VCPUS_PER_VM,
                },
                util: util.min(1024) as u32,
                busy,
                waited: 0,
            }
        })
        .collect()
}
