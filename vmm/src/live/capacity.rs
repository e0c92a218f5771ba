//! Telling the guest what each vCPU really gets: the effective capacity from every placement,
//! on the guest's performance scale ([`guest_perfs`]), goes into the CPPC registers the guest
//! reads live, and a change the guest should act on raises an ACPI notification through the
//! Generic Event Device.
//!
//! A change is worth notifying when it is large ([`NOTIFY_THRESHOLD_PERCENT`]) or when it
//! changes the order of the vCPUs by performance, however small: the guest's amd-pstate ranks
//! its CPUs for the scheduler ("preferred cores") by the highest performance it read at the
//! last notification, so a one-step swap left unnotified would keep a stale order.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvmm_devices::cppc::CppcShared;
use pvmm_devices::ged::GedShared;
use pvmm_scheduler::capacity::CAPACITY_SCALE;

use crate::cppc::{guest_perfs, guest_perfs_into};

/// A change of at least 5 % is worth telling the guest: Linux's `capacity_greater()` treats
/// capacities within about 5 % (1078/1024) as equal, so smaller changes would not alter any of
/// its decisions, except the order of its preferred cores, which has its own rule.
pub const NOTIFY_THRESHOLD_PERCENT: u32 = 5;
/// At most one notification per vCPU per second: each one makes the guest re-read its CPPC
/// registers and rebalance, which must not follow every tick of a fluctuating load.
pub const NOTIFY_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Where the live scheduler publishes each vCPU's effective capacity.
pub trait CapacityReporter: Send {
    /// The vCPUs now have `capacities` (by vCPU index, 1 up to the capacity scale) at `now`.
    fn publish(&mut self, capacities: &[u32], now: Instant);
    /// The guest's last desired-performance request for `vcpu` (0 = none).
    fn guest_desired(&self, vcpu: u32) -> u32;
    /// How many vCPUs the guest has enabled CPPC on.
    fn guest_enabled(&self) -> u32;
    /// Notifications raised so far.
    fn notifications(&self) -> u64;
}

/// Whether a change from `last` to `new` reaches [`NOTIFY_THRESHOLD_PERCENT`].
pub fn significant_change(last: u32, new: u32) -> bool {
    let diff = u64::from(last.abs_diff(new));
    diff * 100 >= u64::from(NOTIFY_THRESHOLD_PERCENT) * u64::from(last.max(1))
}

/// For each vCPU, written into `out` (whose room is reused), whether the guest would order it
/// differently among the others from what it was `told` than from what it has `now` (both
/// performances, by vCPU index): some other vCPU compares with it otherwise (greater, equal or
/// less).
pub fn out_of_order_into(told: &[u32], now: &[u32], out: &mut Vec<bool>) {
    let order = |p: &[u32], v: usize, w: usize| -> Ordering { p[v].cmp(&p[w]) };
    out.clear();
    out.extend(
        (0..now.len()).map(|v| (0..now.len()).any(|w| order(told, v, w) != order(now, v, w))),
    );
}

/// Tells whether the guest is ready for GED interrupts (its GED driver unmasked the line).
pub type GuestReady = Box<dyn Fn() -> bool + Send>;

/// The CPPC registers plus GED notifications, with the threshold, the order rule and the
/// rate limit.
pub struct CppcReporter {
    cppc: Arc<CppcShared>,
    ged: Arc<GedShared>,
    ready: GuestReady,
    ready_seen: bool,
    /// Per vCPU: the performance the guest was last notified of (or booted with).
    told: Vec<u32>,
    /// Per vCPU: when it was last notified.
    when: Vec<Option<Instant>>,
    notifications: u64,
    /// The performances of the capacities being published, reused at each publication.
    perfs: Vec<u32>,
    /// Per vCPU, whether its order changed ([`out_of_order_into`]), reused likewise.
    reordered: Vec<bool>,
}

impl CppcReporter {
    /// A reporter for every vCPU of `cppc`, which it sets to the performances of vCPUs that
    /// each have a full CPU: the guest boots believing them, so nothing needs notifying until
    /// they change. Notifications wait until `ready` says the guest listens: an edge interrupt
    /// raised while its line is still masked is lost, and one raised before the guest set up
    /// its interrupt controllers could even arrive as a CPU exception.
    pub fn new(cppc: Arc<CppcShared>, ged: Arc<GedShared>, ready: GuestReady) -> Self {
        let vcpus = cppc.vcpus();
        let told = guest_perfs(&vec![CAPACITY_SCALE; vcpus as usize]);
        for (vcpu, &perf) in (0..vcpus).zip(&told) {
            cppc.set_perf(vcpu, perf);
        }
        Self {
            cppc,
            ged,
            ready,
            ready_seen: false,
            when: vec![None; told.len()],
            told,
            notifications: 0,
            perfs: Vec::new(),
            reordered: Vec::new(),
        }
    }

    /// Whether the guest listens to GED interrupts (checked until it first does).
    fn guest_listens(&mut self) -> bool {
        self.ready_seen = self.ready_seen || (self.ready)();
        self.ready_seen
    }
}

impl CapacityReporter for CppcReporter {
    fn publish(&mut self, capacities: &[u32], now: Instant) {
        if capacities.len() != self.told.len() {
            return; // not one capacity per vCPU: nothing to go by
        }
        guest_perfs_into(capacities, &mut self.perfs);
        for (vcpu, &perf) in (0..).zip(&self.perfs) {
            self.cppc.set_perf(vcpu, perf);
        }
        // Until the guest listens, `told` keeps the values it booted with, so the first
        // notifications after it is ready report any change since.
        if !self.guest_listens() {
            return;
        }
        out_of_order_into(&self.told, &self.perfs, &mut self.reordered);
        for (vcpu, &perf) in (0..).zip(&self.perfs) {
            let i = vcpu as usize;
            let due = self.when[i].is_none_or(|t| now.duration_since(t) >= NOTIFY_MIN_INTERVAL);
            // A change held back by the rate limit stays pending: `told` is only updated when
            // the guest is told, so the next eligible tick notifies the latest value.
            if due
                && (self.reordered[i] || significant_change(self.told[i], perf))
                && self.ged.notify_capacity_changed(vcpu).is_ok()
            {
                self.told[i] = perf;
                self.when[i] = Some(now);
                self.notifications += 1;
            }
        }
    }

    fn guest_desired(&self, vcpu: u32) -> u32 {
        self.cppc.desired(vcpu).unwrap_or(0)
    }

    fn guest_enabled(&self) -> u32 {
        self.cppc.enabled_vcpus()
    }

    fn notifications(&self) -> u64 {
        self.notifications
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out_of_order(told: &[u32], now: &[u32]) -> Vec<bool> {
        let mut out = Vec::new();
        out_of_order_into(told, now, &mut out);
        out
    }
    use crate::cppc::{perf_of_capacity, CPPC_HIGHEST_PERF};
    use vmm_sys_util::eventfd::EventFd;

    fn reporter_with(n: u32, ready: GuestReady) -> (CppcReporter, Arc<CppcShared>, Arc<GedShared>) {
        let cppc = Arc::new(CppcShared::new(n, CPPC_HIGHEST_PERF));
        let ged = Arc::new(GedShared::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
        (
            CppcReporter::new(cppc.clone(), ged.clone(), ready),
            cppc,
            ged,
        )
    }

    fn reporter(n: u32) -> (CppcReporter, Arc<CppcShared>, Arc<GedShared>) {
        reporter_with(n, Box::new(|| true))
    }

    /// The capacity that shows the guest performance `perf`.
    fn capacity_of(perf: u32) -> u32 {
        (1..=CAPACITY_SCALE)
            .find(|&c| perf_of_capacity(c) == perf)
            .unwrap()
    }

    #[test]
    fn threshold() {
        assert!(!significant_change(254, 250));
        assert!(significant_change(254, 241));
        assert!(significant_change(127, 254));
        assert!(significant_change(0, 1));
    }

    #[test]
    fn order_changes_are_seen_for_every_vcpu_involved() {
        assert_eq!(out_of_order(&[5, 4, 3], &[5, 4, 3]), [false; 3]);
        assert_eq!(out_of_order(&[5, 4, 3], &[9, 8, 7]), [false; 3]);
        assert_eq!(out_of_order(&[5, 4, 3], &[4, 5, 3]), [true, true, false]);
        // From a tie to an order (and back) is a change.
        assert_eq!(out_of_order(&[5, 5, 3], &[5, 4, 3]), [true, true, false]);
        assert_eq!(out_of_order(&[5, 4, 3], &[5, 5, 3]), [true, true, false]);
    }

    #[test]
    fn the_guest_boots_with_every_vcpu_told_apart() {
        let (_r, cppc, _ged) = reporter(3);
        let perfs: Vec<_> = (0..3).map(|v| cppc.perf(v).unwrap()).collect();
        assert_eq!(perfs, [CPPC_HIGHEST_PERF, 253, 253]);
    }

    #[test]
    fn nothing_is_notified_before_the_guest_listens() {
        let listening = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let l = listening.clone();
        let (mut r, cppc, ged) = reporter_with(
            1,
            Box::new(move || l.load(std::sync::atomic::Ordering::Relaxed)),
        );
        let t0 = Instant::now();
        r.publish(&[256], t0);
        assert_eq!(cppc.perf(0), Some(64), "registers are live regardless");
        assert_eq!(ged.raised(), 0);
        listening.store(true, std::sync::atomic::Ordering::Relaxed);
        r.publish(&[256], t0 + Duration::from_secs(2));
        assert_eq!(
            ged.raised(),
            1,
            "the change since boot is reported once it listens"
        );
        r.publish(&[256], t0 + Duration::from_secs(4));
        assert_eq!(ged.raised(), 1);
    }

    #[test]
    fn notifies_big_changes_at_most_once_a_second() {
        let (mut r, cppc, ged) = reporter(1);
        let t0 = Instant::now();
        r.publish(&[1010], t0);
        assert_eq!(cppc.perf(0), Some(251));
        assert_eq!(ged.raised(), 0, "a 1 % change is not notified");
        r.publish(&[512], t0);
        assert_eq!(ged.raised(), 1);
        r.publish(&[1024], t0 + Duration::from_millis(300));
        assert_eq!(ged.raised(), 1, "rate limited");
        assert_eq!(cppc.perf(0), Some(254), "but the register is live");
        r.publish(&[1024], t0 + Duration::from_millis(1100));
        assert_eq!(
            ged.raised(),
            2,
            "the held-back change goes out when allowed"
        );
        assert_eq!(r.notifications(), 2);
        r.publish(&[1024, 5], t0); // not one capacity per vCPU: ignored
        assert_eq!(cppc.perf(0), Some(254));
    }

    /// Two vCPUs whose performances swap by one step each: far below the threshold, but the
    /// guest's preferred-core order is now wrong, so both are notified, each at most once a
    /// second; a swap held back by that limit goes out when the second has passed.
    #[test]
    fn a_one_step_swap_is_notified_at_most_once_a_second() {
        let (mut r, cppc, ged) = reporter(3);
        let (hi, lo) = (capacity_of(200), capacity_of(199));
        let t0 = Instant::now();
        r.publish(&[hi, lo, 512], t0);
        assert_eq!(ged.raised(), 3, "every vCPU moved from the boot values");
        r.publish(&[lo, hi, 512], t0 + Duration::from_millis(1000));
        assert_eq!([cppc.perf(0), cppc.perf(1)], [Some(199), Some(200)]);
        assert_eq!(ged.raised(), 5, "the swap of vCPUs 0 and 1, not vCPU 2");
        let back = t0 + Duration::from_millis(1500);
        r.publish(&[hi, lo, 512], back);
        assert_eq!(ged.raised(), 5, "swapped back within the second: held back");
        r.publish(&[hi, lo, 512], t0 + Duration::from_millis(2000));
        assert_eq!(ged.raised(), 7, "and told when the second has passed");
        r.publish(&[hi, lo, 512], t0 + Duration::from_millis(4000));
        assert_eq!(ged.raised(), 7, "nothing new, nothing told");
        assert_eq!(r.notifications(), 7);
    }
}
