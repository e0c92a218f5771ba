//! VM descriptions for the simulator: how many vCPUs, each vCPU's load, and
//! optionally a fixed amount of work that ends the run.
//!
//! Text form (`pvmm-sim --vm SPEC`), comma-separated `KEY=VALUE` items:
//!
//! | key | value | default |
//! |---|---|---|
//! | `vcpus` | number of vCPUs, 1..=1024 | the number of loads, or the trace's columns, or 1 |
//! | `load` | one generator for every vCPU, or `L1+L2+...` one per vCPU ([`crate::load`]) | `constant:1` |
//! | `trace` | a trace file, one column per vCPU ([`crate::trace`]); excludes `load` | |
//! | `work` | the VM's job in CPU-seconds at full speed, shared by its vCPUs as make's job server shares compile jobs: the VM is done when it has all been done | none: the VM runs until the simulation ends |
//!
//! Examples: `vcpus=4,load=bursty:20/50,work=60`;
//! `load=constant:1+constant:0.1`; `trace=web.trace`.

use std::path::Path;
use std::sync::Arc;

use thiserror::Error;

use super::load::{LoadError, LoadSpec};
use super::trace::{Trace, TraceError};

/// Most vCPUs one simulated VM may have: KVM's `KVM_MAX_VCPUS` on x86-64
/// hosts (the most a real VM placed by the engine can have).
pub const MAX_VCPUS_PER_VM: usize = 1024;

/// Largest `work=` accepted (CPU-seconds): about 11 days of one CPU; more is a
/// typo and would make a run take hours.
pub const MAX_WORK_S: f64 = 1.0e6;

/// Errors from parsing a VM spec.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SpecError {
    /// An item without `=`.
    #[error("VM spec item '{0}' is not KEY=VALUE")]
    NotKeyValue(String),
    /// A key that is not vcpus, load, trace or work.
    #[error("unknown VM spec key '{0}' (expected vcpus, load, trace or work)")]
    UnknownKey(String),
    /// The same key twice.
    #[error("VM spec key '{0}' given twice")]
    Duplicate(String),
    /// `vcpus` out of range or not a number.
    #[error("vcpus '{0}' is not a number from 1 to {MAX_VCPUS_PER_VM}")]
    BadVcpus(String),
    /// `work` out of range or not a number.
    #[error("work '{0}' is not a number of CPU-seconds above 0 and up to {MAX_WORK_S}")]
    BadWork(String),
    /// `load` and `trace` together.
    #[error("a VM spec takes load= or trace=, not both")]
    LoadAndTrace,
    /// The number of loads does not match `vcpus`.
    #[error("{loads} loads given for {vcpus} vCPUs (give one load, or one per vCPU)")]
    LoadCount {
        /// Loads given.
        loads: usize,
        /// vcpus= value.
        vcpus: usize,
    },
    /// `vcpus` does not match the trace's columns.
    #[error("vcpus={vcpus} but the trace has {columns} vCPU columns")]
    TraceColumns {
        /// vcpus= value.
        vcpus: usize,
        /// Columns in the trace.
        columns: usize,
    },
    /// A bad generator.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A bad trace file.
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// One simulated VM.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSpec {
    /// One load generator per vCPU.
    pub vcpus: Vec<LoadSpec>,
    /// The VM's job (CPU-seconds at full speed), or `None` for an endless load.
    pub work_s: Option<f64>,
}

impl VmSpec {
    /// `count` vCPUs with the same generator.
    pub fn uniform(count: usize, load: LoadSpec, work_s: Option<f64>) -> Self {
        VmSpec {
            vcpus: vec![load; count],
            work_s,
        }
    }

    /// Parses the text form (module docs); trace paths are read from disk.
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let items = SpecItems::read(text)?;
        let work_s = items.work_s;
        Ok(VmSpec {
            vcpus: items.vcpu_loads()?,
            work_s,
        })
    }
}

/// The items of a VM spec's text form, each checked on its own.
#[derive(Default)]
struct SpecItems {
    vcpus: Option<usize>,
    loads: Option<Vec<LoadSpec>>,
    trace: Option<Arc<Trace>>,
    work_s: Option<f64>,
}

impl SpecItems {
    /// Reads the `KEY=VALUE` items in order; the first bad one is the error.
    fn read(text: &str) -> Result<Self, SpecError> {
        let mut items = SpecItems::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| SpecError::NotKeyValue(item.to_string()))?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(SpecError::Duplicate(key.to_string()));
            }
            items.set(key, value)?;
            seen.push(key);
        }
        Ok(items)
    }

    /// Sets the item `key` from its text.
    fn set(&mut self, key: &str, value: &str) -> Result<(), SpecError> {
        match key {
            "vcpus" => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_VCPUS_PER_VM).contains(n))
                    .ok_or_else(|| SpecError::BadVcpus(value.to_string()))?;
                self.vcpus = Some(n);
            }
            "load" => {
                let parsed = value
                    .split('+')
                    .map(str::parse::<LoadSpec>)
                    .collect::<Result<Vec<_>, _>>()?;
                self.loads = Some(parsed);
            }
            "trace" => self.trace = Some(Arc::new(Trace::from_file(Path::new(value))?)),
            "work" => {
                let w = value
                    .parse::<f64>()
                    .ok()
                    .filter(|w| w.is_finite() && *w > 0.0 && *w <= MAX_WORK_S)
                    .ok_or_else(|| SpecError::BadWork(value.to_string()))?;
                self.work_s = Some(w);
            }
            _ => return Err(SpecError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// One load per vCPU: the trace's columns, the loads given (one for all, or one each), or
    /// a constant full load.
    fn vcpu_loads(self) -> Result<Vec<LoadSpec>, SpecError> {
        let vcpus = self.vcpus;
        let specs = match (self.loads, self.trace) {
            (Some(_), Some(_)) => return Err(SpecError::LoadAndTrace),
            (_, Some(trace)) => {
                let columns = trace.vcpus();
                let count = vcpus.unwrap_or(columns);
                if count != columns {
                    return Err(SpecError::TraceColumns {
                        vcpus: count,
                        columns,
                    });
                }
                (0..columns)
                    .map(|column| LoadSpec::Trace {
                        trace: trace.clone(),
                        column,
                    })
                    .collect()
            }
            (Some(loads), None) => {
                let count = vcpus.unwrap_or(loads.len());
                if loads.len() == 1 {
                    vec![loads[0].clone(); count]
                } else if loads.len() == count {
                    loads
                } else {
                    return Err(SpecError::LoadCount {
                        loads: loads.len(),
                        vcpus: count,
                    });
                }
            }
            (None, None) => vec![LoadSpec::Constant { demand: 1.0 }; vcpus.unwrap_or(1)],
        };
        Ok(specs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys() {
        let vm = VmSpec::parse("vcpus=4,load=bursty:20/50,work=60").unwrap();
        assert_eq!(vm.vcpus.len(), 4);
        assert_eq!(vm.work_s, Some(60.0));
        assert!(matches!(vm.vcpus[3], LoadSpec::Bursty { .. }));
        let vm = VmSpec::parse("load=constant:1+constant:0.1").unwrap();
        assert_eq!(vm.vcpus.len(), 2);
        assert_eq!(vm.vcpus[1], LoadSpec::Constant { demand: 0.1 });
        assert_eq!(vm.work_s, None);
        let vm = VmSpec::parse("").unwrap();
        assert_eq!(vm.vcpus, vec![LoadSpec::Constant { demand: 1.0 }]);
        let vm = VmSpec::parse(" vcpus = 3 ").unwrap();
        assert_eq!(vm.vcpus.len(), 3);
    }

    #[test]
    fn trace_vcpus_come_from_the_file() {
        let dir = std::env::temp_dir().join(format!("pvmm-sim-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.trace");
        std::fs::write(&path, "0 1 0.5 0\n100 0 0 0\n").unwrap();
        let vm = VmSpec::parse(&format!("trace={}", path.display())).unwrap();
        assert_eq!(vm.vcpus.len(), 3);
        assert!(matches!(
            VmSpec::parse(&format!("trace={},vcpus=2", path.display())),
            Err(SpecError::TraceColumns {
                vcpus: 2,
                columns: 3
            })
        ));
        assert!(matches!(
            VmSpec::parse(&format!("trace={},load=constant:1", path.display())),
            Err(SpecError::LoadAndTrace)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_are_one_line() {
        for (text, check) in [
            ("vcpus", "not KEY=VALUE"),
            ("cpus=2", "unknown VM spec key"),
            ("vcpus=2,vcpus=3", "given twice"),
            ("vcpus=0", "vcpus '0'"),
            ("vcpus=5000", "vcpus '5000'"),
            ("work=-1", "work '-1'"),
            ("work=inf", "work 'inf'"),
            (
                "vcpus=3,load=constant:1+constant:0",
                "2 loads given for 3 vCPUs",
            ),
            ("load=sine:1", "unknown load"),
            ("trace=/nonexistent/x.trace", "cannot read trace"),
        ] {
            let err = VmSpec::parse(text).unwrap_err().to_string();
            assert!(err.contains(check), "{text}: {err}");
            assert!(!err.contains('\n'));
        }
    }
}
