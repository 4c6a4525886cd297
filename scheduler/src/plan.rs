//! The output of a pass: what to start now, why the rest waits, and when reserved jobs expect to start.

use serde::{Deserialize, Serialize};

use crate::model::JobId;
use crate::priority::PriorityBreakdown;

/// Slurm's pending reasons (the `squeue` REASON column), spelled as Slurm spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// Higher-priority jobs are ahead of this one.
    Priority,
    /// The first job(s) waiting for resources in the queue: holds a reservation at its expected start.
    Resources,
    /// Its required nodes can never satisfy it (nodelist/constraint/partition/GPU type/size).
    ReqNodeNotAvail,
    /// Its advance reservation is missing, not active yet, or full.
    Reservation,
    Dependency,
    DependencyNeverSatisfied,
    QOSMaxGRESPerUser,
    QOSMaxJobsPerUserLimit,
    PartitionDown,
    PartitionTimeLimit,
    JobHeldUser,
}

/// GPUs a job gets on one node.
pub type NodeAlloc = (String, Vec<u32>);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Jobs to start now, with concrete node names and GPU indices (lowest free indices first).
    pub starts: Vec<(JobId, Vec<NodeAlloc>)>,
    /// Every pending job that does not start, with why.
    pub reasons: Vec<(JobId, Reason)>,
    /// Jobs holding a backfill reservation, with the time it begins.
    pub expected_start: Vec<(JobId, u64)>,
    /// Per-factor priority of every pending job (`sprio`), in scheduling order.
    pub priorities: Vec<(JobId, PriorityBreakdown)>,
}

impl Plan {
    pub fn reason_of(&self, job: JobId) -> Option<Reason> {
        self.reasons.iter().find(|(j, _)| *j == job).map(|(_, r)| *r)
    }

    pub fn start_of(&self, job: JobId) -> Option<&[NodeAlloc]> {
        self.starts.iter().find(|(j, _)| *j == job).map(|(_, a)| a.as_slice())
    }

    pub fn expected_start_of(&self, job: JobId) -> Option<u64> {
        self.expected_start.iter().find(|(j, _)| *j == job).map(|(_, t)| *t)
    }
}
