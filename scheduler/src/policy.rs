//! The balancing policies, by the names users type.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// How the engine trades performance for package idle time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Spread vCPUs across packages, then across cores, then threads: no two
    /// vCPUs share a core or SMT siblings while there are free cores
    /// (sched_mc_power_savings=0).
    #[default]
    Performance,
    /// Pack into the fewest packages using one thread per core while capacity
    /// lasts (Alex Shi's `balance`): power saved without SMT slowdown.
    Balance,
    /// Pack into the fewest packages using every logical CPU, letting idle
    /// vCPUs share CPUs (sched_mc_power_savings=1 / 2, Alex Shi's `powersaving`).
    Powersaving {
        /// 1 = consolidate; 2 = also nominate a preferred package that waking
        /// vCPUs go to and whose idle CPUs pull busy vCPUs at once.
        level: u8,
    },
}

/// A policy name that is not one of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown policy {0:?}: expected performance, balance, powersaving, powersaving:1 or powersaving:2")]
pub struct PolicyParseError(pub String);

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 4] = [
        Policy::Performance,
        Policy::Balance,
        Policy::Powersaving { level: 1 },
        Policy::Powersaving { level: 2 },
    ];

    /// True for the policies that consolidate onto fewer packages.
    pub fn packs(self) -> bool {
        !matches!(self, Policy::Performance)
    }

    /// True for powersaving level 2 (preferred package, immediate pull).
    pub fn prefers_package(self) -> bool {
        matches!(self, Policy::Powersaving { level } if level >= 2)
    }
}

impl FromStr for Policy {
    type Err = PolicyParseError;

    fn from_str(s: &str) -> Result<Self, PolicyParseError> {
        match s.trim() {
            "performance" => Ok(Policy::Performance),
            "balance" => Ok(Policy::Balance),
            "powersaving" | "powersaving:1" => Ok(Policy::Powersaving { level: 1 }),
            "powersaving:2" => Ok(Policy::Powersaving { level: 2 }),
            _ => Err(PolicyParseError(s.to_string())),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Performance => f.write_str("performance"),
            Policy::Balance => f.write_str("balance"),
            Policy::Powersaving { level } => write!(f, "powersaving:{level}"),
        }
    }
}

/// What pvmm does with vCPU threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementPolicy {
    /// Never pin: the host scheduler decides (the baseline the policies are measured against).
    None,
    /// Pin and migrate under a balancing policy.
    Managed(Policy),
}

/// The balancing policy pvmm (and `pvmm-host`) places under by default, `powersaving:1`:
/// pvmm's reason to exist is packing an under-used guest onto few packages; level 1 does so
/// without level 2's wake-up bias.
pub const DEFAULT_POLICY: Policy = Policy::Powersaving { level: 1 };

impl Default for PlacementPolicy {
    /// [`DEFAULT_POLICY`].
    fn default() -> Self {
        PlacementPolicy::Managed(DEFAULT_POLICY)
    }
}

impl FromStr for PlacementPolicy {
    type Err = PolicyParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" {
            return Ok(PlacementPolicy::None);
        }
        Policy::from_str(s).map(PlacementPolicy::Managed)
    }
}

impl fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementPolicy::None => f.write_str("none"),
            PlacementPolicy::Managed(p) => write!(f, "{p}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>(), Ok(p));
        }
        assert_eq!(
            "powersaving".parse::<Policy>(),
            Ok(Policy::Powersaving { level: 1 })
        );
        assert!("powersaving:3".parse::<Policy>().is_err());
        assert!("fast".parse::<Policy>().is_err());
    }
}
