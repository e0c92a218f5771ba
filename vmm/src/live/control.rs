//! What the control socket may change in the live scheduler, and what the scheduler publishes
//! back: a policy to switch to, an outside balancer's assignments under a lease, and the
//! latest tick's snapshot.
//!
//! The API thread only writes requests here; the scheduler thread picks them up at its next
//! tick, so a placement is always decided and applied by one thread.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pvmm_api::stats::VmStats;

use crate::config::PlacementPolicy;

pub use pvmm_api::messages::ExternalAssignment;

/// Who places the vCPUs at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExternalState {
    /// pvmm's own policy.
    Own,
    /// An outside balancer, with the assignments in the caller's [`ExternalCopy`].
    Active,
    /// The outside balancer's lease just ran out (reported once); pvmm places again.
    Expired,
}

/// The scheduler's copy of an outside balancer's assignments, copied again only when the
/// balancer has sent assignments since (a CPU set that is not one range is a heap bitmap, so a
/// copy at every tick would allocate).
#[derive(Debug, Default)]
pub struct ExternalCopy {
    /// Which `set_external` call the copy is of (0: none).
    version: u64,
    /// The assignments.
    pub assignments: Vec<ExternalAssignment>,
    /// When the balancer last sent assignments (its lease runs from there), kept after the
    /// lease ends: the stats report it, so that a lease's end can be checked on pvmm's clock.
    pub renewed: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    policy_request: Option<PlacementPolicy>,
    external: Option<(Vec<ExternalAssignment>, Instant)>,
    /// The latest `set_external` call's instant, kept when the lease ends or is given back.
    renewed: Option<Instant>,
    /// Counts `set_external` calls.
    external_version: u64,
    /// The latest tick's snapshot (`--stats` text); empty before the first tick.
    snapshot: Vec<u8>,
}

/// Requests from the control socket to the scheduler, and the scheduler's latest snapshot.
#[derive(Debug)]
pub struct PlacementControl {
    state: Mutex<State>,
    lease: Duration,
}

impl PlacementControl {
    /// Control with an external-placement lease of `lease`.
    pub fn new(lease: Duration) -> Self {
        Self {
            state: Mutex::new(State::default()),
            lease,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the scheduler to place under `policy` from its next tick.
    pub fn request_policy(&self, policy: PlacementPolicy) {
        self.state().policy_request = Some(policy);
    }

    /// Hands placement to an outside balancer (or renews its lease) with `assignments`; vCPUs
    /// they do not name keep their CPUs and capacity.
    pub fn set_external(&self, assignments: Vec<ExternalAssignment>) {
        let mut state = self.state();
        let now = Instant::now();
        state.external = Some((assignments, now));
        state.renewed = Some(now);
        state.external_version += 1;
    }

    /// Gives placement back to pvmm's own policy; `true` if an outside balancer had it.
    pub fn clear_external(&self) -> bool {
        self.state().external.take().is_some()
    }

    /// Whether an outside balancer holds placement now (lease not expired).
    pub fn external_active(&self) -> bool {
        self.state()
            .external
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < self.lease)
    }

    /// The latest tick's snapshot (the `--stats` line), if a tick has run.
    pub fn snapshot(&self) -> Option<VmStats> {
        let state = self.state();
        if state.snapshot.is_empty() {
            return None;
        }
        serde_json::from_slice(&state.snapshot).ok()
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Scheduler side: a policy change asked for since the last tick.
    pub fn take_policy_request(&self) -> Option<PlacementPolicy> {
        self.state().policy_request.take()
    }

    /// Scheduler side: who places at this tick, with an outside balancer's assignments in
    /// `copy` (copied when they changed, into the room it has), and the latest renewal's
    /// instant. An expired lease is dropped here and reported as [`ExternalState::Expired`]
    /// exactly once.
    pub fn external(&self, now: Instant, copy: &mut ExternalCopy) -> ExternalState {
        let mut state = self.state();
        copy.renewed = state.renewed;
        match &state.external {
            None => ExternalState::Own,
            Some((_, at)) if now.saturating_duration_since(*at) >= self.lease => {
                state.external = None;
                ExternalState::Expired
            }
            Some((a, _)) => {
                if copy.version != state.external_version {
                    copy.assignments.clone_from(a);
                    copy.version = state.external_version;
                }
                ExternalState::Active
            }
        }
    }

    /// Scheduler side: the snapshot text of the tick just run. The control keeps `snapshot`'s
    /// text and leaves the previous one's buffer in its place, so that the two buffers are
    /// reused turn about.
    pub fn publish(&self, snapshot: &mut Vec<u8>) {
        std::mem::swap(&mut self.state().snapshot, snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvmm_scheduler::CpuSet;

    fn one() -> Vec<ExternalAssignment> {
        vec![ExternalAssignment {
            vcpu: 0,
            cpus: CpuSet::range(0, 1),
            capacity: 512,
        }]
    }

    #[test]
    fn a_lease_expires_once_and_renewal_keeps_it() {
        let c = PlacementControl::new(Duration::from_millis(100));
        let t0 = Instant::now();
        let mut got = ExternalCopy::default();
        assert_eq!(c.external(t0, &mut got), ExternalState::Own);
        c.set_external(one());
        assert_eq!(c.external(Instant::now(), &mut got), ExternalState::Active);
        assert_eq!(got.assignments, one());
        // The same assignments are not copied again at the next tick; new ones are.
        got.assignments.clear();
        assert_eq!(c.external(Instant::now(), &mut got), ExternalState::Active);
        assert!(got.assignments.is_empty());
        c.set_external(one());
        assert_eq!(c.external(Instant::now(), &mut got), ExternalState::Active);
        assert_eq!(got.assignments, one());
        assert!(c.external_active());
        let renewed = got.renewed.expect("a renewal's instant");
        let later = renewed + Duration::from_millis(100);
        assert_eq!(c.external(later, &mut got), ExternalState::Expired);
        assert_eq!(c.external(later, &mut got), ExternalState::Own);
        assert!(!c.external_active());
        // The latest renewal stays reported after the lease ended: the lease ran from it.
        assert_eq!(got.renewed, Some(renewed));
        c.set_external(one());
        assert!(c.clear_external());
        assert!(!c.clear_external());
        assert_eq!(c.external(Instant::now(), &mut got), ExternalState::Own);
    }

    #[test]
    fn a_policy_request_is_taken_once() {
        let c = PlacementControl::new(Duration::from_secs(3));
        assert_eq!(c.take_policy_request(), None);
        c.request_policy(PlacementPolicy::None);
        assert_eq!(c.take_policy_request(), Some(PlacementPolicy::None));
        assert_eq!(c.take_policy_request(), None);
    }

    #[test]
    fn a_published_snapshot_is_read_back_and_its_buffer_reused() {
        let c = PlacementControl::new(Duration::from_secs(3));
        assert_eq!(c.snapshot(), None);
        let stats = |t_ms: u64| VmStats {
            boot_ms: 1000 + t_ms,
            capacity_notifications: None,
            cppc_enabled: None,
            external: false,
            external_renewed_ms: None,
            guest_register_errors: None,
            housekeeping: 0.0,
            migrations: 0,
            migrations_total: 0,
            packages: Vec::new(),
            policy: PlacementPolicy::None,
            policy_changes: 0,
            t_ms,
            vcpus: Vec::new(),
        };
        let first = serde_json::to_vec(&stats(1)).unwrap();
        let mut line = first.clone();
        c.publish(&mut line);
        assert!(
            line.is_empty(),
            "the previous (empty) snapshot's buffer comes back"
        );
        line.extend_from_slice(&serde_json::to_vec(&stats(2)).unwrap());
        c.publish(&mut line);
        assert_eq!(line, first);
        assert_eq!(c.snapshot(), Some(stats(2)));
    }
}
