//! Telling the guest what each vCPU really gets: the effective capacity from every placement
//! goes into the CPPC registers the guest reads live, and a significant change raises an ACPI
//! notification through the Generic Event Device.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pvmm_devices::cppc::CppcShared;
use pvmm_devices::ged::GedShared;

/// A change of at least 5 % is worth telling the guest: Linux's `capacity_greater()` treats
/// capacities within about 5 % (1078/1024) as equal, so smaller changes would not alter any of
/// its decisions.
pub const NOTIFY_THRESHOLD_PERCENT: u32 = 5;
/// At most one notification per vCPU per second: each one makes the guest re-read its CPPC
/// registers and rebalance, which must not follow every tick of a fluctuating load.
pub const NOTIFY_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Where the live scheduler publishes each vCPU's effective capacity.
pub trait CapacityReporter: Send {
    /// vCPU `vcpu` now has `capacity` (1 up to the capacity scale) at time `now`.
    fn publish(&mut self, vcpu: u32, capacity: u32, now: Instant);
    /// The guest's last desired-performance request for `vcpu` (0 = none).
    fn guest_desired(&self, vcpu: u32) -> u32;
    /// Notifications raised so far.
    fn notifications(&self) -> u64;
}

/// Whether a change from `last` to `new` reaches [`NOTIFY_THRESHOLD_PERCENT`].
pub fn significant_change(last: u32, new: u32) -> bool {
    let diff = u64::from(last.abs_diff(new));
    diff * 100 >= u64::from(NOTIFY_THRESHOLD_PERCENT) * u64::from(last.max(1))
}

/// Tells whether the guest is ready for GED interrupts (its GED driver unmasked the line).
pub type GuestReady = Box<dyn Fn() -> bool + Send>;

/// The CPPC registers plus GED notifications, with the threshold and rate limit.
pub struct CppcReporter {
    cppc: Arc<CppcShared>,
    ged: Arc<GedShared>,
    ready: GuestReady,
    ready_seen: bool,
    /// Per vCPU: the capacity the guest was last notified of, and when.
    notified: Vec<(u32, Option<Instant>)>,
    notifications: u64,
}

impl CppcReporter {
    /// A reporter for every vCPU of `cppc`; the guest boots believing the initial registers,
    /// so nothing needs notifying until they change. Notifications wait until `ready` says the
    /// guest listens: an edge interrupt raised while its line is still masked is lost, and one
    /// raised before the guest set up its interrupt controllers could even arrive as a CPU
    /// exception.
    pub fn new(cppc: Arc<CppcShared>, ged: Arc<GedShared>, ready: GuestReady) -> Self {
        let notified = (0..cppc.vcpus())
            .map(|i| (cppc.capacity(i).unwrap_or(0), None))
            .collect();
        Self {
            cppc,
            ged,
            ready,
            ready_seen: false,
            notified,
            notifications: 0,
        }
    }
}

impl CapacityReporter for CppcReporter {
    fn publish(&mut self, vcpu: u32, capacity: u32, now: Instant) {
        self.cppc.set_capacity(vcpu, capacity);
        let Some((last, when)) = self.notified.get_mut(vcpu as usize) else {
            return;
        };
        if !self.ready_seen {
            if !(self.ready)() {
                // Until the guest listens, `last` keeps the value it booted with, so the first
                // notification after it is ready reports any change since.
                return;
            }
            self.ready_seen = true;
        }
        let due = when.is_none_or(|t| now.duration_since(t) >= NOTIFY_MIN_INTERVAL);
        // A change held back by the rate limit stays pending: `last` is only updated when
        // the guest is told, so the next eligible tick notifies the latest value.
        if due
            && significant_change(*last, capacity)
            && self.ged.notify_capacity_changed(vcpu).is_ok()
        {
            *last = capacity;
            *when = Some(now);
            self.notifications += 1;
        }
    }

    fn guest_desired(&self, vcpu: u32) -> u32 {
        self.cppc.desired(vcpu).unwrap_or(0)
    }

    fn notifications(&self) -> u64 {
        self.notifications
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvmm_scheduler::capacity::CAPACITY_SCALE;
    use vmm_sys_util::eventfd::EventFd;

    fn reporter_with(n: u32, ready: GuestReady) -> (CppcReporter, Arc<CppcShared>, Arc<GedShared>) {
        let cppc = Arc::new(CppcShared::new(n, CAPACITY_SCALE));
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

    #[test]
    fn threshold() {
        assert!(!significant_change(1024, 1000));
        assert!(significant_change(1024, 972));
        assert!(significant_change(512, 1024));
        assert!(significant_change(0, 1));
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
        r.publish(0, 256, t0);
        assert_eq!(cppc.capacity(0), Some(256), "registers are live regardless");
        assert_eq!(ged.raised(), 0);
        listening.store(true, std::sync::atomic::Ordering::Relaxed);
        r.publish(0, 256, t0 + Duration::from_secs(2));
        assert_eq!(
            ged.raised(),
            1,
            "the change since boot is reported once it listens"
        );
        r.publish(0, 256, t0 + Duration::from_secs(4));
        assert_eq!(ged.raised(), 1);
    }

    #[test]
    fn notifies_big_changes_at_most_once_a_second() {
        let (mut r, cppc, ged) = reporter(2);
        let t0 = Instant::now();
        r.publish(0, 1010, t0);
        assert_eq!(cppc.capacity(0), Some(1010));
        assert_eq!(ged.raised(), 0, "a 1 % change is not notified");
        r.publish(0, 512, t0);
        assert_eq!(ged.raised(), 1);
        r.publish(0, 1024, t0 + Duration::from_millis(300));
        assert_eq!(ged.raised(), 1, "rate limited");
        assert_eq!(cppc.capacity(0), Some(1024), "but the register is live");
        r.publish(0, 1024, t0 + Duration::from_millis(1100));
        assert_eq!(
            ged.raised(),
            2,
            "the held-back change goes out when allowed"
        );
        r.publish(1, 341, t0);
        assert_eq!(ged.raised(), 3, "vCPUs are limited independently");
        assert_eq!(r.notifications(), 3);
        r.publish(9, 5, t0); // unknown vCPU: ignored
    }
}
