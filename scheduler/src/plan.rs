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
    /// `--begin` is still in the future.
    BeginTime,
    /// Its job array already runs `max_running` tasks.
    JobArrayTaskLimit,
    QOSMaxJobsPerAccountLimit,
    QOSMaxGRESPerAccount,
    /// Drover: a multi-node job without `--multi-site` that needs more nodes than any one site has (counting its
    /// down and drained nodes too): it fits only across sites, so it starts only once a site grows, or if it is
    /// submitted again with `--multi-site`.
    MultiSiteRequired,
    /// Drover: a multi-node job without `--multi-site` that some site could hold, but not with that site's nodes
    /// that are up and undrained now; only across sites would it fit today.
    SiteNodesNotAvail,
}

impl Reason {
    /// Slurm's spelling, as `squeue` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Priority => "Priority",
            Reason::Resources => "Resources",
            Reason::ReqNodeNotAvail => "ReqNodeNotAvail",
            Reason::Reservation => "Reservation",
            Reason::Dependency => "Dependency",
            Reason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            Reason::QOSMaxGRESPerUser => "QOSMaxGRESPerUser",
            Reason::QOSMaxJobsPerUserLimit => "QOSMaxJobsPerUserLimit",
            Reason::PartitionDown => "PartitionDown",
            Reason::PartitionTimeLimit => "PartitionTimeLimit",
            Reason::JobHeldUser => "JobHeldUser",
            Reason::BeginTime => "BeginTime",
            Reason::JobArrayTaskLimit => "JobArrayTaskLimit",
            Reason::QOSMaxJobsPerAccountLimit => "QOSMaxJobsPerAccountLimit",
            Reason::QOSMaxGRESPerAccount => "QOSMaxGRESPerAccount",
            Reason::MultiSiteRequired => "MultiSiteRequired",
            Reason::SiteNodesNotAvail => "SiteNodesNotAvail",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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
