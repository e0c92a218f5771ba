//! The vCPUs the engine knows between decisions: each one's previous CPU and
//! migration tokens, matched to a decision's input by id.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::demand::Demand;
use super::index::{dense, CpuIndex};
use super::tokens::TokenBucket;
use super::{Engine, PlaceError, VcpuId, VcpuLoad};

/// vCPU numbers below this are checked for duplicates in a bitmap per VM
/// (pvmm's limit is 255 vCPUs); larger ones, in a map.
const SEEN_BITS_PER_VM: u32 = 256;

/// Hash map keyed by a packed id, with [`IdHasher`].
type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Packs a vCPU id into one integer key.
fn id_key(id: VcpuId) -> u64 {
    (u64::from(id.vm) << 32) | u64::from(id.vcpu)
}

/// SplitMix64's finalizer as a hasher for integer keys: a few cycles per key
/// (SipHash costs tens of nanoseconds, too much for 10,000 vCPUs per tick) and
/// every input bit reaches every output bit. Keys are ours, not an attacker's.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = self.0.rotate_left(32) ^ value;
    }
}

/// Per-vCPU state kept between decisions.
#[derive(Debug, Clone, Copy)]
pub(super) struct VcpuState {
    pub(super) id: VcpuId,
    /// Dense VM index.
    pub(super) vm: u32,
    /// The CPU of the previous decision, or [`CpuIndex::NONE`].
    pub(super) cpu: CpuIndex,
    pub(super) tokens: TokenBucket,
    pub(super) demand: Demand,
}

impl Engine {
    /// Aligns `self.vcpus` with `loads` (fast when the order is unchanged).
    pub(super) fn sync_state(&mut self, now_ms: u64, loads: &[VcpuLoad]) -> Result<(), PlaceError> {
        if self.vcpus.len() == loads.len()
            && self.vcpus.iter().zip(loads).all(|(v, l)| v.id == l.id)
        {
            return Ok(());
        }
        // Keyed by id through a cheap well-mixed hasher: placement must stay
        // fast even when the vCPU list changes (a VM starts or stops).
        let mut old: IdMap<u32> =
            IdMap::with_capacity_and_hasher(self.vcpus.len(), Default::default());
        for (index, v) in self.vcpus.iter().enumerate() {
            old.insert(id_key(v.id), dense(index));
        }
        // Duplicates: a bitmap of vCPU numbers per VM (vCPU numbers are small:
        // at most 255 under pvmm), a map only for larger ones: hashing every
        // vCPU costs a cold 10,000-vCPU decision more than its whole stay test.
        let seen_bits = &mut self.seen_bits;
        seen_bits.clear();
        let mut seen_large: IdMap<()> = IdMap::default();
        let mut vm_index: IdMap<u32> = IdMap::default();
        let limit = self.config.max_migrations_per_vcpu_per_s;
        let mut vcpus = Vec::with_capacity(loads.len());
        // An input refused below puts the adoptions back for the next decision; a good one
        // uses them and drops them all (a vCPU assumed but absent from the input is
        // forgotten).
        let assumed = std::mem::take(&mut self.assumed);
        let mut adopted_packages = self.adopted_packages;
        // (VM id, dense index) of the previous load: vCPUs of a VM usually come
        // together, so most lookups are skipped.
        let mut last_vm: Option<(u32, u32)> = None;
        for l in loads {
            let vm = match last_vm {
                Some((id, index)) if id == l.id.vm => index,
                _ => {
                    let next_vm = dense(vm_index.len());
                    *vm_index.entry(u64::from(l.id.vm)).or_insert(next_vm)
                }
            };
            last_vm = Some((l.id.vm, vm));
            let duplicate = if l.id.vcpu < SEEN_BITS_PER_VM {
                let bit = vm as usize * SEEN_BITS_PER_VM as usize + l.id.vcpu as usize;
                if seen_bits.len() <= bit / 64 {
                    seen_bits.resize(bit / 64 + 1, 0);
                }
                let mask = 1u64 << (bit % 64);
                let duplicate = seen_bits[bit / 64] & mask != 0;
                seen_bits[bit / 64] |= mask;
                duplicate
            } else {
                seen_large.insert(id_key(l.id), ()).is_some()
            };
            if duplicate {
                // The state stays as before this input, adoptions included.
                self.assumed = assumed;
                return Err(PlaceError::DuplicateVcpu(l.id));
            }
            let previous = if old.is_empty() {
                None
            } else {
                old.get(&id_key(l.id))
            };
            let mut state = match previous {
                Some(index) => self.vcpus[*index as usize],
                None => VcpuState {
                    id: l.id,
                    vm,
                    cpu: match assumed.get(&l.id).copied() {
                        Some(c) => {
                            // Packages are used lowest first: adopting a vCPU on package
                            // p takes the p + 1 lowest.
                            let packages = self.layout.pkg_of(c).get() + 1;
                            adopted_packages = adopted_packages.max(packages);
                            c
                        }
                        None => CpuIndex::NONE,
                    },
                    tokens: TokenBucket::full(limit, now_ms),
                    demand: Demand::default(),
                },
            };
            state.vm = vm;
            vcpus.push(state);
        }
        self.vcpus = vcpus;
        self.adopted_packages = adopted_packages;
        self.num_vms = vm_index.len();
        self.reserve_scratch();
        Ok(())
    }
}
