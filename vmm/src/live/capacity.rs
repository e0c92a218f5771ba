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
    /// vCPU `vcpu` now has `capacity` (1..=1024) at time `now`.
    fn publish(&mut self, vcpu: u32, capacity: u32, now: Instant);
    /// The guest's last desired-performance request for `vcpu` (0 = none).
    fn guest_desired(&self, vcpu: u32) -> u32;
    /// Notifications raised so far.
    fn notifications(&self) -> u64;
    /// Guest register accesses ignored so far (mistakes).
    fn ignored_accesses(&self) -> u64;
}

/// Whether a change from `last` to `new` reaches [`NOTIFY_THRESHOLD_PERCENT`].
pub fn significant_change(last: u32, new: u32) -> bool {
    let diff = u64::from(last.abs_diff(new));
    diff * 100 >= u64::from(NOTIFY_THRESHOLD_PERCENT) * u64::from(last.max(1))
}

/// The CPPC registers plus GED notifications, with the threshold and rate limit.
pub struct CppcReporter {
    cppc: Arc<CppcShared>,
    ged: Arc<GedShared>,
    /// Per vCPU: the capacity the guest was last notified of, and when.
    notified: Vec<(u32, Option<Instant>)>,
    notifications: u64,
}

impl CppcReporter {
    /// A reporter for every vCPU of `cppc`; the guest boots believing the initial registers,
    /// so nothing needs notifying until they change.
    pub fn new(cppc: Arc<CppcShared>, ged: Arc<GedShared>) -> Self {
        let notified = (0..cppc.vcpus())
            .map(|i| (cppc.capacity(i).unwrap_or(0), None))
            .collect();
        Self {
            cppc,
            ged,
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
        if !self.cppc.guest_probed() {
            // The guest will read this value when its CPPC driver probes.
            *last = capacity;
            return;
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

    fn ignored_accesses(&self) -> u64 {
        self.cppc.ignored_accesses() + self.ged.ignored_accesses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EventFd;

    fn reporter(n: u32) -> (CppcReporter, Arc<CppcShared>, Arc<GedShared>) {
        let cppc = Arc::new(CppcShared::new(n));
        let ged = Arc::new(GedShared::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
        (CppcReporter::new(cppc.clone(), ged.clone()), cppc, ged)
    }

    #[test]
    fn threshold() {
        assert!(!significant_change(1024, 1000));
        assert!(significant_change(1024, 972));
        assert!(significant_change(512, 1024));
        assert!(significant_change(0, 1));
    }

    fn probe(cppc: &Arc<CppcShared>) {
        use pvmm_devices::bus::BusDevice;
        let mut dev = pvmm_devices::cppc::CppcDevice::new(
            cppc.clone(),
            Box::new(pvmm_devices::cppc::ProcSchedstat),
        );
        let mut b = [0u8; 8];
        dev.read(0, &mut b);
    }

    #[test]
    fn nothing_is_notified_before_the_guest_probes_cppc() {
        let (mut r, cppc, ged) = reporter(1);
        let t0 = Instant::now();
        r.publish(0, 256, t0);
        assert_eq!(cppc.capacity(0), Some(256));
        assert_eq!(ged.raised(), 0);
        probe(&cppc);
        r.publish(0, 256, t0 + Duration::from_secs(2));
        assert_eq!(
            ged.raised(),
            0,
            "the guest read 256 at probe: no change to report"
        );
        r.publish(0, 1024, t0 + Duration::from_secs(3));
        assert_eq!(ged.raised(), 1);
    }

    #[test]
    fn notifies_big_changes_at_most_once_a_second() {
        let (mut r, cppc, ged) = reporter(2);
        probe(&cppc);
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
