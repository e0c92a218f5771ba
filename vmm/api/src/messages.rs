//! The control socket's bodies: what a client sends and what pvmm answers, one type each,
//! used by the server to parse and write, and by clients (`pvmm-ctl`, the host daemon) to
//! build and read.
//!
//! Text values (a policy, a CPU list) travel as the text a person would type; the server
//! parses them in [`crate::routes`], so that each mistake gets its own message.

use pvmm_scheduler::{CpuSet, PlacementPolicy};
use serde::{Deserialize, Serialize};

/// One vCPU's placement as an outside balancer sets it (a checked [`AssignmentBody`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalAssignment {
    /// vCPU index.
    pub vcpu: u32,
    /// Host CPUs its thread may run on.
    pub cpus: CpuSet,
    /// The capacity published to the guest (1..1024).
    pub capacity: u32,
}

/// `PUT /v1/policy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    /// The policy's name, as `--policy` takes it.
    pub policy: String,
}

/// One vCPU in `PUT /v1/placement/external`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentBody {
    /// vCPU index.
    pub vcpu: u32,
    /// Host CPUs, as a CPU list (`0-3,8`).
    pub cpus: String,
    /// The capacity to publish (1..1024).
    pub capacity: u32,
}

impl From<&ExternalAssignment> for AssignmentBody {
    fn from(a: &ExternalAssignment) -> Self {
        Self {
            vcpu: a.vcpu,
            cpus: a.cpus.to_string(),
            capacity: a.capacity,
        }
    }
}

/// `PUT /v1/placement/external`: an outside balancer's assignments (renews its lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalBody {
    /// At least one vCPU's placement.
    pub assignments: Vec<AssignmentBody>,
}

/// `PUT /v1/vm/shutdown` (an empty body asks for pvmm's `--shutdown-timeout`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownBody {
    /// How long the guest may take after the power button before pvmm stops it.
    pub timeout_ms: Option<u64>,
}

/// `GET /v1/vm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    /// Whether an outside balancer places the vCPUs.
    pub external_placement: bool,
    /// How long an outside balancer's placement holds without a renewing `PUT`
    /// (`--external-lease-ms`).
    pub external_lease_ms: u64,
    /// The kernel image booted.
    pub kernel: String,
    /// Guest memory.
    pub memory_mib: u64,
    /// The name it was given (`--name`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// pvmm's pid.
    pub pid: i32,
    /// The policy in force.
    #[serde(with = "crate::text")]
    pub policy: PlacementPolicy,
    /// Whether the guest's ACPI driver has enabled the power button.
    pub power_button_listening: bool,
    /// `running`, `paused`, or a mix while changing.
    pub state: String,
    /// Milliseconds since pvmm started.
    pub uptime_ms: u64,
    /// Number of vCPUs.
    pub vcpus: u32,
}

/// `PUT /v1/policy`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyAnswer {
    /// When the switch applies.
    pub applies: String,
    /// The policy switched to.
    #[serde(with = "crate::text")]
    pub policy: PlacementPolicy,
}

/// `PUT` and `DELETE /v1/placement/external`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalAnswer {
    /// Assignments taken (PUT).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub assignments: Option<usize>,
    /// Whether an outside balancer places the vCPUs now.
    pub external: bool,
    /// Whether one did before (DELETE).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub was_external: Option<bool>,
}

/// `PUT /v1/vm/pause` and `/v1/vm/resume`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAnswer {
    /// `paused` or `running`.
    pub state: String,
}

/// `PUT /v1/vm/shutdown`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownAnswer {
    /// Whether the power button was pressed (the guest listens for it).
    pub power_button: bool,
    /// When pvmm stops the VM regardless.
    pub stop_after_ms: u64,
}

/// One of pvmm's own threads in `GET /v1/vcpus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadEntry {
    /// Its name.
    pub name: String,
    /// Its thread id.
    pub tid: i32,
}

/// One vCPU in `GET /v1/vcpus`: its latest tick's entry and its run state, or only its
/// thread and run state before the first tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VcpuEntry {
    /// A tick has placed it.
    Placed {
        /// Its latest tick.
        #[serde(flatten)]
        stats: crate::stats::VcpuStats,
        /// `running` or `paused`.
        state: String,
    },
    /// No tick has run yet.
    Unplaced {
        /// vCPU index.
        vcpu: u32,
        /// Its thread id.
        tid: i32,
        /// `running` or `paused`.
        state: String,
    },
}

impl VcpuEntry {
    /// vCPU index.
    pub fn vcpu(&self) -> u32 {
        match self {
            Self::Placed { stats, .. } => stats.vcpu,
            Self::Unplaced { vcpu, .. } => *vcpu,
        }
    }

    /// Its thread id.
    pub fn tid(&self) -> i32 {
        match self {
            Self::Placed { stats, .. } => stats.tid,
            Self::Unplaced { tid, .. } => *tid,
        }
    }

    /// `running` or `paused`.
    pub fn state(&self) -> &str {
        match self {
            Self::Placed { state, .. } | Self::Unplaced { state, .. } => state,
        }
    }

    /// Its latest tick, once a tick has placed it.
    pub fn stats(&self) -> Option<&crate::stats::VcpuStats> {
        match self {
            Self::Placed { stats, .. } => Some(stats),
            Self::Unplaced { .. } => None,
        }
    }
}

/// `GET /v1/vcpus`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VcpusAnswer {
    /// pvmm's own threads other than vCPUs.
    pub threads: Vec<ThreadEntry>,
    /// Every vCPU.
    pub vcpus: Vec<VcpuEntry>,
}
