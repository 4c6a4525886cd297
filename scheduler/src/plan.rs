//! The output of a pass: what to start now, why the rest waits, and when reserved jobs expect to start.

use serde::{Deserialize, Serialize};

use crate::model::JobId;
use crate::priority::PriorityBreakdown;

/// Slurm's pending reasons (the `squeue` REASON column): the state's own type, so the plan's reasons are
/// stored as they are. A pass never gives `None` or `JobHeldAdmin` (the controller knows who held a job).
pub use drover_common::model::PendingReason as Reason;

/// GPUs a job gets on one node.
pub type NodeAlloc = (String, Vec<u32>);

/// A running job to preempt and requeue so that a pending job can start (Slurm's `PreemptMode=REQUEUE`). The
/// controller signals it, waits up to KillWait for it to end, requeues it, and marks it
/// [`crate::model::RunningJob::preempting`] (with `preempted_for = Some(for_job)`) in later views meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    pub victim: JobId,
    /// The pending job whose reservation needs the victim's GPUs.
    pub for_job: JobId,
}

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
    /// Running jobs to preempt now, in the order the preemptors were scheduled. A preemptor does not start in the
    /// pass that preempts for it: it waits with reason `Resources` and a reservation at `now + kill_wait_s`.
    #[serde(default)]
    pub preemptions: Vec<Preemption>,
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

    /// The victims preempted for `job` in this plan.
    pub fn victims_of(&self, job: JobId) -> Vec<JobId> {
        self.preemptions.iter().filter(|p| p.for_job == job).map(|p| p.victim).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn reason_names_are_slurms() {
        let all = [
            Reason::Priority,
            Reason::Resources,
            Reason::ReqNodeNotAvail,
            Reason::Reservation,
            Reason::Dependency,
            Reason::DependencyNeverSatisfied,
            Reason::QOSMaxGRESPerUser,
            Reason::QOSMaxJobsPerUserLimit,
            Reason::PartitionDown,
            Reason::PartitionTimeLimit,
            Reason::JobHeldUser,
            Reason::JobArrayTaskLimit,
            Reason::QOSMaxJobsPerAccountLimit,
            Reason::QOSMaxGRESPerAccount,
            Reason::MultiSiteRequired,
            Reason::SiteNodesNotAvail,
        ];
        for r in all {
            // The variants are named exactly as Slurm spells the reasons.
            assert_eq!(r.name(), format!("{r:?}"));
            assert_eq!(r.to_string(), r.name());
        }
    }
}
