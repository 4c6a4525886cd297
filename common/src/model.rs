//! The models that the replicated state keeps and the scheduler reads, defined once: a job's pending reason,
//! a partition's state and preemption mode. Their serde forms are the state's (records and log entries hold
//! them; a variant is only ever added at the end).

use serde::{Deserialize, Serialize};

/// Why a pending job is not running, in Slurm's words (`squeue`'s `REASON` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum PendingReason {
    #[default]
    None,
    Priority,
    Resources,
    JobHeldUser,
    JobHeldAdmin,
    PartitionDown,
    BeginTime,
    Dependency,
    /// No node in the partition could ever satisfy the request (nodes down or drained).
    ReqNodeNotAvail,
    /// Its advance reservation is missing, not active yet, or full.
    Reservation,
    /// A dependency can never be satisfied (Slurm: `DependencyNeverSatisfied`).
    DependencyNeverSatisfied,
    QOSMaxGRESPerUser,
    QOSMaxJobsPerUserLimit,
    /// The time limit exceeds the partition's.
    PartitionTimeLimit,
    QOSMaxJobsPerAccountLimit,
    QOSMaxGRESPerAccount,
    /// Its array's `%N` limit of running tasks is reached.
    JobArrayTaskLimit,
    /// Drover: a multi-node job without `--multi-site` that needs more nodes than any one site has.
    MultiSiteRequired,
    /// Drover: a multi-node job without `--multi-site` that one site could hold, but not with that site's nodes
    /// that are up and undrained now (it would fit across sites).
    SiteNodesNotAvail,
    /// `scontrol requeuehold` by the job's owner (or root on its own job): a user's hold that Slurm names apart.
    RequeuedHeld,
}

impl PendingReason {
    pub fn name(self) -> &'static str {
        match self {
            PendingReason::None => "None",
            PendingReason::Priority => "Priority",
            PendingReason::Resources => "Resources",
            PendingReason::JobHeldUser => "JobHeldUser",
            PendingReason::JobHeldAdmin => "JobHeldAdmin",
            PendingReason::PartitionDown => "PartitionDown",
            PendingReason::BeginTime => "BeginTime",
            PendingReason::Dependency => "Dependency",
            PendingReason::ReqNodeNotAvail => "ReqNodeNotAvail",
            PendingReason::Reservation => "Reservation",
            PendingReason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            PendingReason::QOSMaxGRESPerUser => "QOSMaxGRESPerUser",
            PendingReason::QOSMaxJobsPerUserLimit => "QOSMaxJobsPerUserLimit",
            PendingReason::PartitionTimeLimit => "PartitionTimeLimit",
            PendingReason::QOSMaxJobsPerAccountLimit => "QOSMaxJobsPerAccountLimit",
            PendingReason::QOSMaxGRESPerAccount => "QOSMaxGRESPerAccount",
            PendingReason::JobArrayTaskLimit => "JobArrayTaskLimit",
            PendingReason::MultiSiteRequired => "MultiSiteRequired",
            PendingReason::SiteNodesNotAvail => "SiteNodesNotAvail",
            PendingReason::RequeuedHeld => "job_requeued_in_held_state",
        }
    }

    /// A sentence for `scontrol show job` where the name alone does not say what to do.
    pub fn detail(self) -> Option<&'static str> {
        match self {
            PendingReason::MultiSiteRequired => Some(
                "the job needs more nodes than any one site has; it cannot run within one site: submit it with \
                 --multi-site to let it span sites",
            ),
            PendingReason::SiteNodesNotAvail => Some(
                "the job cannot fit in one site with the nodes up there now (it would fit across sites): it waits \
                 for them, or submit it with --multi-site",
            ),
            _ => None,
        }
    }
}

/// Slurm's partition states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum PartitionState {
    /// Accepts and schedules jobs.
    #[default]
    Up,
    /// Accepts jobs but starts none.
    Down,
    /// Refuses new jobs; running and pending jobs go on.
    Drain,
    /// Refuses new jobs and starts none.
    Inactive,
}

impl PartitionState {
    pub fn name(self) -> &'static str {
        match self {
            PartitionState::Up => "UP",
            PartitionState::Down => "DOWN",
            PartitionState::Drain => "DRAIN",
            PartitionState::Inactive => "INACTIVE",
        }
    }

    /// Whether `sbatch` may add jobs to a partition in this state.
    pub fn accepts_jobs(self) -> bool {
        matches!(self, PartitionState::Up | PartitionState::Down)
    }
}

/// Slurm's `PreemptMode` (REQUEUE is the one training clusters use: the preempted job resumes from its
/// checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum PreemptMode {
    #[default]
    Off,
    Requeue,
}

impl PreemptMode {
    pub fn name(self) -> &'static str {
        match self {
            PreemptMode::Off => "OFF",
            PreemptMode::Requeue => "REQUEUE",
        }
    }
}

impl std::fmt::Display for PendingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
