//! Pack mode: `balance` and `powersaving` while the host has room (the
//! module documentation of `placement` describes the steps).
//!
//! A decision is [`Engine::place_pack`]: the packages needed, the ramp's
//! count, each VM's home, then *stay*, *relieve* overfull CPUs, *place the
//! rest* and, for `powersaving:2`, *pull* into the preferred package. Pack
//! mode tracks fit demands (the fit rule's headroom, capped at one slot) on
//! top of the loads of the [`super::draft::Draft`].

use crate::capacity::{capacity_greater, CAPACITY_GREATER_MARGIN, CAPACITY_SCALE, FIT_MARGIN};

use super::draft::{reserve_len, reset, ScratchSizes};
use super::index::{dense, CpuIndex, PkgIndex};
use super::layout::{fit_demand, ratio_less, slot_fits};
use super::{Engine, VcpuLoad, BUSY_CPU_UTIL, MIN_VCPU_WEIGHT};

/// How far (of 1024) a CPU's fit demand may exceed its slot before the
/// relieve step moves vCPUs off it: 1/8 more. A vCPU is placed on a CPU only
/// where it fits with the fit rule's headroom, but the vCPUs already on a CPU
/// are moved off only when they use more than 90 % of it (1152 / 1280), so
/// demands that drift around a slot's edge do not move a vCPU back and forth
/// every few ticks. The same hysteresis as the kernel's `imbalance_pct`
/// (117-125 %): an imbalance must be clear before it moves a task.
const RELIEVE_MARGIN: u64 = 1152;

/// Whether fit demand `fit` on a CPU of slot `slot` calls for the relieve
/// step ([`RELIEVE_MARGIN`]; a slot of 0 is never relieved). A CPU holding a
/// busy vCPU gets no margin: a busy vCPU keeps its CPU to itself, and idle
/// vCPUs make room.
fn overfull(fit: u64, slot: u64, busy: bool) -> bool {
    let margin = if busy {
        u64::from(CAPACITY_SCALE)
    } else {
        RELIEVE_MARGIN
    };
    slot > 0 && u128::from(fit) * u128::from(CAPACITY_SCALE) > u128::from(slot) * u128::from(margin)
}

/// Pack mode's buffers, reused across decisions.
#[derive(Debug, Clone, Default)]
pub(super) struct PackScratch {
    /// Fit demand placed on each CPU.
    cpu_fit: Vec<u64>,
    /// Fit demand placed on each package (against its largest slot).
    pkg_fit: Vec<u64>,
    /// Per package: the position in its packing order before which no CPU
    /// can take even the smallest vCPU any more.
    pkg_cursor: Vec<u32>,
    /// Packages in use this decision.
    active: Vec<bool>,
    /// vCPUs of the previous placement still on each package (not yet sent
    /// home this decision); read only while the ramp holds surplus packages.
    pkg_left: Vec<u32>,
    /// Each VM's home package: the lowest numbered package in use that holds
    /// any of its vCPUs, [`PkgIndex::NONE`] until it has one.
    vm_home: Vec<PkgIndex>,
    /// Each VM's fit demand not placed yet.
    vm_remaining: Vec<u64>,
    /// Place the rest: VMs with unplaced vCPUs, by descending remaining demand.
    vm_order: Vec<u32>,
    /// Place the rest: each VM's start in `rest` (a count while filling it).
    vm_offset: Vec<u32>,
    /// Place the rest: the unplaced vCPUs, grouped by VM in `vm_order`.
    rest: Vec<u32>,
    /// Pull: `vm_members[vm_start[v]..vm_start[v + 1]]` are VM `v`'s vCPUs.
    vm_start: Vec<u32>,
    vm_members: Vec<u32>,
    /// Pull: VMs already considered.
    vm_done: Vec<bool>,
}

impl PackScratch {
    /// Room for every vector at `sizes`.
    pub(super) fn reserve(&mut self, sizes: ScratchSizes) {
        reserve_len(&mut self.cpu_fit, sizes.cpus);
        reserve_len(&mut self.pkg_fit, sizes.pkgs);
        reserve_len(&mut self.pkg_cursor, sizes.pkgs);
        reserve_len(&mut self.active, sizes.pkgs);
        reserve_len(&mut self.pkg_left, sizes.pkgs);
        reserve_len(&mut self.vm_home, sizes.vms);
        reserve_len(&mut self.vm_remaining, sizes.vms);
        reserve_len(&mut self.vm_order, sizes.vms);
        reserve_len(&mut self.vm_offset, sizes.vms + 1);
        reserve_len(&mut self.rest, sizes.vcpus);
        reserve_len(&mut self.vm_start, sizes.vms + 1);
        reserve_len(&mut self.vm_members, sizes.vcpus);
        reserve_len(&mut self.vm_done, sizes.vms);
    }
}

/// The two rounds of the stay step, for the busy and then the other vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StayRound {
    /// vCPUs at their VM's home (and vCPUs out of migration tokens) stay.
    AtHome,
    /// vCPUs away from home move home when home has a CPU they fit on, and
    /// stay otherwise.
    AwayFromHome,
}

impl Engine {
    /// Pack mode. Returns the packages in use and the preferred package id
    /// for `powersaving:2`.
    pub(super) fn place_pack(
        &mut self,
        now_ms: u64,
        loads: &[VcpuLoad],
        total_fit: u64,
    ) -> (usize, Option<u32>) {
        let needed = self.packages_needed(total_fit).max(1);
        let ramp_target = self
            .ramp
            .step(now_ms, needed, self.config.ramp_down_window_ms);
        // While the ramp holds more packages than the load needs, vCPUs on
        // those packages stay put: moving a VM's vCPUs home would consolidate
        // before the window has passed, which is what the ramp exists to stop.
        let ramp_holding = ramp_target > needed;
        self.begin_pack(ramp_target);
        self.find_vm_homes();
        self.stay(loads, ramp_holding);
        self.relieve_overfull_cpus(loads);
        let in_use = self.place_rest(loads, ramp_target);
        let preferred = self.policy.prefers_package().then_some(PkgIndex(0));
        if let Some(pref) = preferred {
            self.pull_into(pref, loads);
        }
        if in_use > ramp_target {
            // Packages opened to place the rest count as in use at once, and
            // stay open while the demand is about the same.
            self.ramp.up_at_once(in_use);
            self.fragmentation = Some((total_fit, in_use));
        }
        (in_use, preferred.map(|p| self.layout.pkg_id(p)))
    }

    /// Packages the total fit demand needs, lowest numbered first.
    ///
    /// Packages are used in id order: the packages in use are always the
    /// lowest numbered ones, so a consolidating host empties its high
    /// packages and busy vCPUs gather on package 0 whichever of them turned
    /// busy first. Ranking packages by load would keep load where it is, but
    /// which package survived would then depend on a tick's noise: an idle
    /// vCPU's timer burst, or which of two vCPUs started a job 100 ms earlier.
    fn packages_needed(&mut self, total_fit: u64) -> usize {
        let mut needed = 0usize;
        let mut cap = 0u64;
        for p in 0..self.layout.num_pkgs() {
            if needed > 0 && cap >= total_fit {
                break;
            }
            cap += self.layout.slots.pkg_total[p];
            needed += 1;
        }
        // Packing whole vCPUs (and whole VMs) can need more packages than the
        // total suggests; once a decision had to open more, keep that many
        // until the demand is clearly (5 %) lower, rather than let the ramp
        // retry an impossible consolidation every window.
        if let Some((fit_then, k_then)) = self.fragmentation {
            if capacity_greater(fit_then, total_fit) {
                self.fragmentation = None;
            } else {
                needed = needed.max(k_then);
            }
        }
        needed
    }

    /// Empties pack mode's fit demands but the housekeeping load's; the first `in_use`
    /// packages are in use.
    fn begin_pack(&mut self, in_use: usize) {
        let l = &self.layout;
        let s = &mut self.pack;
        reset(&mut s.cpu_fit, l.num_cpus(), 0);
        reset(&mut s.pkg_fit, l.num_pkgs(), 0);
        self.housekeeping.add_fit(l, &mut s.pkg_fit);
        reset(&mut s.active, l.num_pkgs(), false);
        s.active[..in_use].fill(true);
        s.pkg_cursor.clear();
        s.pkg_cursor
            .extend_from_slice(&l.pkg_cpu_start[..l.num_pkgs()]);
    }

    /// Each VM's home (the lowest numbered package in use holding any of its
    /// vCPUs now), its fit demand, and the vCPUs on each package now.
    fn find_vm_homes(&mut self) {
        let l = &self.layout;
        let s = &mut self.pack;
        reset(&mut s.vm_home, self.num_vms, PkgIndex::NONE);
        reset(&mut s.vm_remaining, self.num_vms, 0);
        reset(&mut s.pkg_left, l.num_pkgs(), 0);
        for (i, v) in self.vcpus.iter().enumerate() {
            s.vm_remaining[v.vm as usize] += fit_demand(self.draft.weight[i], l.slots.host_max);
            if !v.cpu.is_none() {
                let p = l.pkg_of(v.cpu);
                s.pkg_left[p.get()] += 1;
                // PkgIndex::NONE is the largest index, so min keeps the lowest package.
                if s.active[p.get()] {
                    let home = &mut s.vm_home[v.vm as usize];
                    *home = (*home).min(p);
                }
            }
        }
    }

    /// Step 1, stay: busy vCPUs before the others. An idle vCPU staying on
    /// the last free CPU of a package would push a vCPU that just turned busy
    /// out to another package (busy vCPUs would end up spread by the history
    /// of where idle ones sat) or onto an already busy CPU. In each group,
    /// vCPUs at their VM's home stay first, then the others, which move home
    /// instead when home has a CPU they fit on.
    fn stay(&mut self, loads: &[VcpuLoad], ramp_holding: bool) {
        for busy_group in [true, false] {
            let away = self.stay_round(loads, busy_group, StayRound::AtHome, ramp_holding);
            if away > 0 {
                self.stay_round(loads, busy_group, StayRound::AwayFromHome, ramp_holding);
            }
            if busy_group {
                self.place_displaced_busy(loads);
            }
        }
    }

    /// One round of the stay step over the vCPUs of one group (busy or not)
    /// that were placed before and have no CPU yet. Returns how many were
    /// left for the away-from-home round.
    fn stay_round(
        &mut self,
        loads: &[VcpuLoad],
        busy_group: bool,
        round: StayRound,
        ramp_holding: bool,
    ) -> usize {
        let mut away_from_home = 0usize;
        for k in 0..self.draft.order.len() {
            let i = self.draft.order[k] as usize;
            let prev = self.vcpus[i].cpu;
            if prev.is_none() || self.draft.placed(i) || self.claims_first(i, loads) != busy_group {
                continue;
            }
            if self.draft.out_of_tokens[i] {
                if round == StayRound::AtHome {
                    self.pack_assign(i, prev, loads[i].busy);
                }
                continue;
            }
            let p = self.layout.pkg_of(prev);
            let home = self.pack.vm_home[self.vcpus[i].vm as usize];
            let at_home = home.is_none() || home == p;
            match round {
                StayRound::AtHome if !at_home => {
                    away_from_home += 1;
                    continue;
                }
                StayRound::AwayFromHome if at_home => continue,
                _ => {}
            }
            // A busy vCPU also needs its CPU to itself: two busy vCPUs on one
            // CPU would both "fit" their package.
            if !self.stay_fits(i, prev) || (busy_group && !self.cpu_fits(prev, i)) {
                continue;
            }
            if round == StayRound::AwayFromHome
                && self.goes_home(i, p, home, busy_group, ramp_holding)
            {
                self.pack.pkg_left[p.get()] -= 1;
                continue;
            }
            self.pack_assign(i, prev, loads[i].busy);
        }
        away_from_home
    }

    /// Whether vCPU `i`, on package `p` away from its VM's `home`, leaves to
    /// be placed home in step 3: home has a CPU it fits on (room in home's
    /// total alone is not enough, or two vCPUs of one VM could keep trading
    /// places between an overfull CPU and elsewhere). While the ramp holds
    /// surplus packages, idle vCPUs stay (going home would consolidate
    /// early), and a busy one goes home only if another vCPU remains on its
    /// package: the last one leaving would empty a package the ramp holds (a
    /// burst right after a load ends, the guest reaping its jobs, would
    /// consolidate before the window has passed).
    fn goes_home(
        &mut self,
        i: usize,
        p: PkgIndex,
        home: PkgIndex,
        busy_group: bool,
        ramp_holding: bool,
    ) -> bool {
        let w = self.draft.weight[i];
        let may_leave = !ramp_holding || (busy_group && self.pack.pkg_left[p.get()] > 1);
        may_leave && self.pkg_fits(home, w) && self.first_fit_cpu(home, w).is_some()
    }

    /// Step 1, busy vCPUs that did not stay (their CPU is taken by another
    /// busy vCPU, or they go home): a CPU of their VM's home, else of their
    /// own package, that fits them, while only busy vCPUs are placed. With no
    /// such CPU a vCPU stays where it was if its package has room (the relieve
    /// step then evens out its CPU), else step 3 places it.
    fn place_displaced_busy(&mut self, loads: &[VcpuLoad]) {
        for k in 0..self.draft.order.len() {
            let i = self.draft.order[k] as usize;
            let prev = self.vcpus[i].cpu;
            if prev.is_none()
                || self.draft.placed(i)
                || !self.claims_first(i, loads)
                || self.draft.out_of_tokens[i]
            {
                continue;
            }
            let p = self.layout.pkg_of(prev);
            let home = self.pack.vm_home[self.vcpus[i].vm as usize];
            let home = if home.is_none() { p } else { home };
            let w = self.draft.weight[i];
            let target = [home, p].into_iter().find_map(|pkg| {
                if self.pack.active[pkg.get()] && self.pkg_fits(pkg, w) {
                    self.first_fit_cpu(pkg, w)
                } else {
                    None
                }
            });
            match target {
                Some(c) => self.pack_assign(i, c, true),
                None if self.stay_fits(i, prev) => self.pack_assign(i, prev, true),
                None => {}
            }
        }
    }

    /// Step 2, relieve CPUs that are clearly too full ([`RELIEVE_MARGIN`]:
    /// loads grew, or a fallback placement overfilled them): their smallest
    /// vCPUs move to a CPU of the same package where they fit. Every such move lowers the total overflow
    /// and creates none, so repeated decisions converge.
    fn relieve_overfull_cpus(&mut self, loads: &[VcpuLoad]) {
        let l = &self.layout;
        let any_overfull = (0..l.num_cpus())
            .any(|c| overfull(self.pack.cpu_fit[c], l.slots.cpu[c], self.draft.cpu_busy[c]));
        if !any_overfull {
            return;
        }
        for k in (0..self.draft.order.len()).rev() {
            let i = self.draft.order[k] as usize;
            let c = self.draft.new_cpu[i];
            if c.is_none() || self.draft.out_of_tokens[i] {
                continue;
            }
            let cu = c.get();
            if !overfull(
                self.pack.cpu_fit[cu],
                self.layout.slots.cpu[cu],
                self.draft.cpu_busy[cu],
            ) {
                continue;
            }
            let p = self.layout.pkg_of(c);
            if let Some(target) = self.first_fit_cpu(p, self.draft.weight[i]) {
                self.pack_unassign(i);
                self.pack_assign(i, target, loads[i].busy);
            }
        }
    }

    /// Step 3, place the rest VM by VM (largest remaining demand first, so
    /// first fit works on whole VMs), each VM's vCPUs by weight. Returns the
    /// packages in use: `in_use` plus any opened for vCPUs nothing in use fit.
    fn place_rest(&mut self, loads: &[VcpuLoad], in_use: usize) -> usize {
        let mut in_use = in_use;
        self.group_unplaced_by_vm();
        for k in 0..self.pack.rest.len() {
            let i = self.pack.rest[k] as usize;
            let c = self.choose_pack_cpu(i, &mut in_use);
            self.pack_assign(i, c, loads[i].busy);
            let vm = self.vcpus[i].vm as usize;
            if self.pack.vm_home[vm].is_none() {
                self.pack.vm_home[vm] = self.layout.pkg_of(c);
            }
        }
        in_use
    }

    /// Fills `pack.rest` with the unplaced vCPUs grouped by VM: VMs by
    /// descending remaining fit demand (ties by first appearance), each VM's
    /// vCPUs in weight order. O(vCPUs + VMs log VMs).
    fn group_unplaced_by_vm(&mut self) {
        let num_vms = self.num_vms;
        let d = &self.draft;
        let s = &mut self.pack;
        reset(&mut s.vm_offset, num_vms + 1, 0);
        for &i in &d.order {
            if !d.placed(i as usize) {
                s.vm_offset[self.vcpus[i as usize].vm as usize] += 1;
            }
        }
        s.vm_order.clear();
        s.vm_order
            .extend((0..dense(num_vms)).filter(|v| s.vm_offset[*v as usize] > 0));
        let remaining = &s.vm_remaining;
        s.vm_order.sort_unstable_by(|a, b| {
            remaining[*b as usize]
                .cmp(&remaining[*a as usize])
                .then(a.cmp(b))
        });
        // vm_offset: count -> start position, in vm_order sequence.
        let mut next = 0u32;
        for v in &s.vm_order {
            let count = s.vm_offset[*v as usize];
            s.vm_offset[*v as usize] = next;
            next += count;
        }
        reset(&mut s.rest, next as usize, 0);
        for &i in &d.order {
            if !d.placed(i as usize) {
                let vm = self.vcpus[i as usize].vm as usize;
                s.rest[s.vm_offset[vm] as usize] = i;
                s.vm_offset[vm] += 1;
            }
        }
    }

    /// Step 3: the CPU for vCPU `i`, which is not staying. Opens packages
    /// beyond `in_use` when nothing in use fits it.
    fn choose_pack_cpu(&mut self, i: usize, in_use: &mut usize) -> CpuIndex {
        let w = self.draft.weight[i];
        let vm = self.vcpus[i].vm as usize;
        let home = self.pack.vm_home[vm];
        let home_fits = !home.is_none() && self.pack.active[home.get()] && self.pkg_fits(home, w);
        if home_fits {
            if let Some(c) = self.first_fit_cpu(home, w) {
                return c;
            }
        }
        // Home is too fragmented: a vCPU that only left to go home stays put.
        let prev = self.vcpus[i].cpu;
        if !prev.is_none() && self.stay_fits(i, prev) {
            return prev;
        }
        if home_fits {
            return self.cpu_in_package(home, i);
        }
        if home.is_none() {
            // A VM not placed yet: the first package where all of it fits.
            let whole = self.pack.vm_remaining[vm];
            for p in 0..*in_use {
                if self.pack.pkg_fit[p] + whole <= self.layout.slots.pkg_total[p] {
                    return self.cpu_in_package(PkgIndex(dense(p)), i);
                }
            }
        }
        for p in self.layout.pkgs() {
            if p.get() >= *in_use {
                // Nothing in use fits: use one more package at once.
                *in_use = p.get() + 1;
                self.pack.active[p.get()] = true;
            }
            if self.pkg_fits(p, w) {
                return self.cpu_in_package(p, i);
            }
        }
        let p = self.least_full_package(prev);
        self.cpu_in_package(p, i)
    }

    /// Overflow (fragmentation only: totals above capacity spread instead):
    /// the least full package, unless the package of `prev` (the vCPU's
    /// previous CPU) is not clearly fuller.
    fn least_full_package(&self, prev: CpuIndex) -> PkgIndex {
        let l = &self.layout;
        let s = &self.pack;
        let mut best_pkg = 0usize;
        for p in 1..l.num_pkgs() {
            if ratio_less(
                s.pkg_fit[p],
                l.slots.pkg_total[p],
                s.pkg_fit[best_pkg],
                l.slots.pkg_total[best_pkg],
            ) {
                best_pkg = p;
            }
        }
        if !prev.is_none() {
            let p = l.pkg_of(prev).get();
            let lhs = u128::from(s.pkg_fit[p]) * u128::from(l.slots.pkg_total[best_pkg]);
            let rhs = u128::from(s.pkg_fit[best_pkg]) * u128::from(l.slots.pkg_total[p]);
            if lhs * u128::from(CAPACITY_SCALE) <= rhs * u128::from(CAPACITY_GREATER_MARGIN) {
                best_pkg = p;
            }
        }
        PkgIndex(dense(best_pkg))
    }

    /// CPU for vCPU `i` in package `p`: the first in packing order where it
    /// fits, else (the package has room in total but no single slot has) the
    /// least loaded slot, or the vCPU's previous CPU in `p` when that is not
    /// clearly worse.
    fn cpu_in_package(&mut self, p: PkgIndex, i: usize) -> CpuIndex {
        let w = self.draft.weight[i];
        if let Some(c) = self.first_fit_cpu(p, w) {
            return c;
        }
        let l = &self.layout;
        let s = &self.pack;
        let mut best = CpuIndex::NONE;
        for &c in l.pkg_pack_order(p) {
            if l.slots.cpu[c.get()] == 0 {
                continue;
            }
            if best.is_none()
                || ratio_less(
                    s.cpu_fit[c.get()],
                    l.slots.cpu[c.get()],
                    s.cpu_fit[best.get()],
                    l.slots.cpu[best.get()],
                )
            {
                best = c;
            }
        }
        if best.is_none() {
            best = l.slots.pack_order[l.pkg_cpu_start[p.get()] as usize];
        }
        let prev = self.vcpus[i].cpu;
        if !prev.is_none() && prev != best && l.pkg_of(prev) == p && l.slots.cpu[prev.get()] > 0 {
            let fd = fit_demand(w, l.slots.cpu[prev.get()]);
            let prev_after = s.cpu_fit[prev.get()] + fd;
            let best_after = s.cpu_fit[best.get()] + fd;
            if !capacity_greater(prev_after, best_after) {
                return prev;
            }
        }
        best
    }

    /// First CPU of package `p`, in packing order, with no busy vCPU and less
    /// than [`BUSY_CPU_UTIL`] of load: a newly idle CPU that may pull work.
    fn idle_cpu(&self, p: PkgIndex) -> Option<CpuIndex> {
        let l = &self.layout;
        let d = &self.draft;
        l.pkg_pack_order(p).iter().copied().find(|c| {
            let c = c.get();
            l.slots.cpu[c] > 0 && !d.cpu_busy[c] && d.cpu_load[c] < BUSY_CPU_UTIL
        })
    }

    /// Step 4 (`powersaving:2`): the preferred package `pref` pulls VMs with
    /// busy vCPUs from other packages at once, whole VMs only (a VM split
    /// over two packages would lose its shared cache and free no package).
    fn pull_into(&mut self, pref: PkgIndex, loads: &[VcpuLoad]) {
        let outside = |e: &Engine, i: usize| e.layout.pkg_of(e.draft.new_cpu[i]) != pref;
        if !loads
            .iter()
            .enumerate()
            .any(|(i, l)| l.busy && outside(self, i))
        {
            return;
        }
        self.index_vm_members();
        reset(&mut self.pack.vm_done, self.num_vms, false);
        for k in 0..self.draft.order.len() {
            let i = self.draft.order[k] as usize;
            let vm = self.vcpus[i].vm as usize;
            if !loads[i].busy || !outside(self, i) || self.pack.vm_done[vm] {
                continue;
            }
            self.pack.vm_done[vm] = true;
            self.pull_vm(vm, pref, loads);
        }
    }

    /// Fills `pack.vm_start` and `pack.vm_members`: each VM's vCPUs.
    fn index_vm_members(&mut self) {
        let num_vms = self.num_vms;
        let s = &mut self.pack;
        reset(&mut s.vm_start, num_vms + 1, 0);
        for v in &self.vcpus {
            s.vm_start[v.vm as usize + 1] += 1;
        }
        for v in 0..num_vms {
            s.vm_start[v + 1] += s.vm_start[v];
        }
        reset(&mut s.vm_members, self.vcpus.len(), 0);
        reset(&mut s.vm_offset, num_vms, 0);
        for (i, v) in self.vcpus.iter().enumerate() {
            let vm = v.vm as usize;
            s.vm_members[(s.vm_start[vm] + s.vm_offset[vm]) as usize] = dense(i);
            s.vm_offset[vm] += 1;
        }
    }

    /// Moves VM `vm`'s vCPUs outside `pref` into it, if all of them fit its
    /// total and none is out of migration tokens.
    fn pull_vm(&mut self, vm: usize, pref: PkgIndex, loads: &[VcpuLoad]) {
        let slot = self.layout.slots.pkg_max[pref.get()];
        let members = self.pack.vm_start[vm] as usize..self.pack.vm_start[vm + 1] as usize;
        let mut outside = 0u64;
        let mut out_of_tokens = false;
        for m in members.clone() {
            let j = self.pack.vm_members[m] as usize;
            if self.layout.pkg_of(self.draft.new_cpu[j]) != pref {
                outside += fit_demand(self.draft.weight[j], slot);
                out_of_tokens |= self.draft.out_of_tokens[j];
            }
        }
        if out_of_tokens
            || self.pack.pkg_fit[pref.get()] + outside > self.layout.slots.pkg_total[pref.get()]
        {
            return;
        }
        for m in members {
            let j = self.pack.vm_members[m] as usize;
            if self.layout.pkg_of(self.draft.new_cpu[j]) == pref {
                continue;
            }
            let w = self.draft.weight[j];
            // A CPU where it fits, else one running only idle vCPUs (they
            // share it; the next decision moves them if it is too full).
            let target = match self.first_fit_cpu(pref, w) {
                Some(c) => c,
                None => match self.idle_cpu(pref) {
                    Some(c) => c,
                    None => self.cpu_in_package(pref, j),
                },
            };
            self.pack_unassign(j);
            self.pack_assign(j, target, loads[j].busy);
        }
    }

    /// Places vCPU `i` on CPU `c`: the draft's loads, the fit demands of the
    /// CPU and its package, and its VM's remaining demand.
    fn pack_assign(&mut self, i: usize, c: CpuIndex, busy: bool) {
        let l = &self.layout;
        let w = self.draft.weight[i];
        if !self.draft.placed(i) {
            let vm = self.vcpus[i].vm as usize;
            let remaining = &mut self.pack.vm_remaining[vm];
            *remaining = remaining.saturating_sub(fit_demand(w, l.slots.host_max));
        }
        self.draft.assign(l, i, c, busy);
        let p = l.pkg_of(c).get();
        self.pack.cpu_fit[c.get()] += l.cpu_fit_demand(c, w);
        self.pack.pkg_fit[p] += fit_demand(w, l.slots.pkg_max[p]);
    }

    /// Undoes [`Engine::pack_assign`] but for the VM's remaining demand.
    fn pack_unassign(&mut self, i: usize) {
        let c = self.draft.new_cpu[i];
        if c.is_none() {
            return;
        }
        let l = &self.layout;
        let w = self.draft.weight[i];
        let p = l.pkg_of(c).get();
        self.pack.cpu_fit[c.get()] -= l.cpu_fit_demand(c, w);
        self.pack.pkg_fit[p] -= fit_demand(w, l.slots.pkg_max[p]);
        self.draft.unassign(l, i);
    }

    /// Whether vCPU `i` may stay on CPU `c`: its package is in use and has
    /// room, and `c` is a packing slot. A CPU that is too full is relieved
    /// afterwards, by moves that are strict improvements only.
    fn stay_fits(&self, i: usize, c: CpuIndex) -> bool {
        let p = self.layout.pkg_of(c);
        self.pack.active[p.get()]
            && self.layout.slots.cpu[c.get()] > 0
            && self.pkg_fits(p, self.draft.weight[i])
    }

    /// Whether vCPU `i` is placed with the busy group of step 1: busy now and
    /// with at least half a CPU of decayed utilization ([`BUSY_CPU_UTIL`]), so
    /// a short burst of a mostly idle vCPU does not shuffle its neighbours.
    fn claims_first(&self, i: usize, loads: &[VcpuLoad]) -> bool {
        loads[i].busy && self.draft.weight[i] >= BUSY_CPU_UTIL
    }

    /// Whether vCPU `i` fits on CPU `c` as it is filled so far.
    fn cpu_fits(&self, c: CpuIndex, i: usize) -> bool {
        slot_fits(
            self.pack.cpu_fit[c.get()],
            self.draft.weight[i],
            self.layout.slots.cpu[c.get()],
        )
    }

    /// Whether weight `w` fits package `p`'s remaining slots in total.
    fn pkg_fits(&self, p: PkgIndex, w: u64) -> bool {
        let p = p.get();
        let l = &self.layout;
        self.pack.pkg_fit[p] + fit_demand(w, l.slots.pkg_max[p]) <= l.slots.pkg_total[p]
    }

    /// First CPU of package `p`, in packing order, where weight `w` fits.
    fn first_fit_cpu(&mut self, p: PkgIndex, w: u64) -> Option<CpuIndex> {
        let l = &self.layout;
        let s = &mut self.pack;
        let cursor = &mut s.pkg_cursor[p.get()];
        let end = l.pkg_cpu_start[p.get() + 1];
        let min_fd = u64::from(MIN_VCPU_WEIGHT) * FIT_MARGIN;
        // Skip CPUs that cannot take even the smallest vCPU any more.
        while *cursor < end {
            let c = l.slots.pack_order[*cursor as usize].get();
            if l.slots.cpu[c] > 0 && s.cpu_fit[c] + min_fd.min(l.slots.cpu[c]) <= l.slots.cpu[c] {
                break;
            }
            *cursor += 1;
        }
        l.slots.pack_order[*cursor as usize..end as usize]
            .iter()
            .copied()
            .find(|c| slot_fits(s.cpu_fit[c.get()], w, l.slots.cpu[c.get()]))
    }
}
