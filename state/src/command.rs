//! Commands: the only way the replicated state changes. Each one is a Raft log entry; the leader stamps the
//! time into the entry so that `apply` never reads a clock.

use serde::{Deserialize, Serialize};

use crate::config::ClusterConfig;
use crate::error::CommandError;
use crate::job::{JobId, JobSpec};

/// A log entry's application payload: the command and the leader's wall-clock stamp for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Milliseconds since the Unix epoch, read once by the leader when it proposed the entry.
    pub time_ms: u64,
    pub command: Command,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Seeds the configuration. Every new leader proposes it while none is committed; all but the first are no-ops.
    InitCluster {
        config: ClusterConfig,
    },
    /// `sbatch`. `request_id` is chosen by the client and makes a retried submission return the first one's id
    /// instead of creating a second job.
    SubmitJob {
        spec: Box<JobSpec>,
        request_id: Option<String>,
    },
    /// `scancel ID...`. `by_uid` is the requester, checked against each job's owner (root may cancel any).
    CancelJobs {
        ids: Vec<JobId>,
        by_uid: u32,
    },
    /// `scontrol hold` (user hold) / `scontrol release`.
    HoldJobs {
        ids: Vec<JobId>,
        by_uid: u32,
    },
    ReleaseJobs {
        ids: Vec<JobId>,
        by_uid: u32,
    },
}

impl Command {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::InitCluster { .. } => "init_cluster",
            Command::SubmitJob { .. } => "submit_job",
            Command::CancelJobs { .. } => "cancel_jobs",
            Command::HoldJobs { .. } => "hold_jobs",
            Command::ReleaseJobs { .. } => "release_jobs",
        }
    }
}

/// The per-job outcome of a command that names several jobs (Slurm reports each one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub id: JobId,
    pub result: Result<(), CommandError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Initialized {
        already: bool,
    },
    Submitted {
        job_id: JobId,
        duplicate: bool,
    },
    Jobs(Vec<JobOutcome>),
    /// Blank entries and membership changes.
    Nothing,
}

/// What `apply` answers to the proposer.
pub type Response = Result<Reply, CommandError>;

impl std::fmt::Display for Request {
    /// A one-line summary for openraft's logs (never the script or environment).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.command.kind(), self.time_ms)
    }
}
