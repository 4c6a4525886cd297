//! Errors for views the scheduler cannot plan over. A plan is never computed from an inconsistent view.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScheduleError {
    #[error("duplicate {kind} {name:?}")]
    Duplicate { kind: &'static str, name: String },
    #[error("unknown {kind} {name:?}")]
    Unknown { kind: &'static str, name: String },
    #[error("account {name:?} is not reachable from a root (cycle in the account tree)")]
    AccountCycle { name: String },
    #[error("node {node:?} has {gpus} GPUs; at most {max} are supported")]
    TooManyGpus { node: String, gpus: u32, max: u32 },
    #[error("node {node:?}: GPU index {index} is out of range or listed twice")]
    BadGpuIndex { node: String, index: u32 },
    #[error("more than {max} distinct {kind}; the scheduler keeps them in a bit mask")]
    TooManyDistinct { kind: &'static str, max: usize },
    #[error("job {job}: {what}")]
    BadJob { job: u64, what: &'static str },
}
