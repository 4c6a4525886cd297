//! Commands: the only way the replicated state changes. Each one is a Raft log entry; the leader stamps the
//! time into the entry so that `apply` never reads a clock.

use serde::{Deserialize, Serialize};

use crate::error::CommandError;
use crate::model::config::{ClusterConfig, PartitionUpdate};
use crate::model::job::{Job, JobId, JobSpec, MeasuredUsage, NodeAllocation, PendingReason, Usage};
use crate::model::node::{NodeInfo, RunningShare};
use crate::model::registry::AdminOp;

/// What `srun` says of a step it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStart {
    /// The program's name (sacct's JobName for the step).
    pub name: String,
    /// The nodes its tasks run on, a subset of the job's.
    pub nodes: Vec<String>,
    pub tasks: u32,
}

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
    /// `scontrol hold` / `uhold` (`scontrol release` is `ReleaseJobs`).
    HoldJobs {
        ids: Vec<JobId>,
        by_uid: u32,
        /// `Some(true)`: `uhold`, always a user hold. `Some(false)`: `hold`, an administrator's hold when an
        /// operator places it (on any job, their own too, as Slurm's). `None`: an entry written before the two
        /// were told apart, applied as it was then (an administrator's hold only on someone else's job).
        #[serde(default)]
        user_hold: Option<bool>,
    },
    ReleaseJobs {
        ids: Vec<JobId>,
        by_uid: u32,
    },
    /// An agent (re)registered with this inventory. Brings a down node back up, in a new epoch; `running` lists
    /// the incarnations the agent still has tasks of, whose GPUs then stay held (lingering) until it confirms
    /// them gone, so a node that returns with a stale task never has that task's GPUs handed out beside it.
    RegisterNode {
        info: NodeInfo,
        #[serde(default)]
        running: Vec<RunningShare>,
    },
    /// The leader stopped hearing from a node (or an administrator said so): its jobs are requeued or fail.
    /// `epoch` is the registration the decision is about: if the node has registered again since, the decision
    /// is stale and refused (entries from before epochs carry none and apply as before).
    NodeDown {
        name: String,
        reason: String,
        #[serde(default)]
        epoch: Option<u64>,
    },
    /// `scontrol update nodename=X state=drain|resume reason=...` (operators), or a GPU health problem (the
    /// leader, as uid 0).
    DrainNodes {
        names: Vec<String>,
        drain: bool,
        reason: String,
        /// Entries written before roles existed carry none: they were root's.
        #[serde(default)]
        by_uid: u32,
        /// A health problem (a GPU fault): the node's requeue-able jobs are also stopped and requeued.
        #[serde(default)]
        requeue_jobs: bool,
    },
    /// The scheduler's plan: allocations to start and new pending reasons. `apply` re-checks every allocation
    /// against the current state and skips those that no longer fit, so a stale plan never double-books.
    ApplyPlan {
        allocations: Vec<Allocation>,
        reasons: Vec<(JobId, PendingReason)>,
    },
    /// A job's batch script (or its interactive allocation) ended. Reports for another incarnation are refused.
    JobEnded {
        job_id: JobId,
        incarnation: u64,
        end: JobEnd,
    },
    /// `scontrol update partitionname=...`: state (UP, DOWN, DRAIN, INACTIVE), nodes and limits, at run time
    /// (administrators).
    UpdatePartition {
        update: PartitionUpdate,
        #[serde(default)]
        by_uid: u32,
    },
    /// `srun` inside a job: numbers a new step and records it (what it runs, where, how many tasks) for sacct.
    CreateStep {
        job_id: JobId,
        by_uid: u32,
        /// Absent in entries written before steps were recorded.
        #[serde(default)]
        step: Option<StepStart>,
    },
    /// `srun` saw its step's tasks end: the step's record gets its end (the log's time) and exit status.
    EndStep {
        job_id: JobId,
        step_id: u32,
        /// The largest exit code of its tasks, and the signal that killed one, if any (Slurm's step ExitCode).
        exit_code: i32,
        signal: i32,
        /// Interrupted (Ctrl-C, scancel of the step) rather than ended on its own.
        cancelled: bool,
        by_uid: u32,
    },
    /// Accounts, QOS and advance reservations (root only).
    Admin {
        op: AdminOp,
        by_uid: u32,
    },
    /// `scontrol update jobid=N TimeLimit= Nice= QOS= Dependency=`: a pending job's request, re-checked whole.
    UpdateJob {
        id: JobId,
        by_uid: u32,
        update: JobUpdate,
    },
    /// `scontrol top`: these pending jobs move ahead of their owner's other jobs.
    TopJobs {
        ids: Vec<JobId>,
        by_uid: u32,
    },
    /// `scontrol requeue` / `requeuehold`: running jobs end (warning signal, SIGTERM, KillWait, SIGKILL) and go
    /// back to the queue as their next incarnation.
    RequeueJobs {
        ids: Vec<JobId>,
        by_uid: u32,
        hold: bool,
    },
    /// The scheduler preempts these running jobs for `for_job` (PreemptMode=REQUEUE): as a requeue.
    PreemptJobs {
        victims: Vec<JobId>,
        for_job: JobId,
    },
    /// A job (or its agent, for the marker file) recorded a finished checkpoint; refused unless `incarnation` is
    /// the job's current one.
    RecordCheckpoint {
        job_id: JobId,
        incarnation: u64,
        path: String,
        step: Option<u64>,
        by_uid: u32,
    },
    /// The node running a job's container found its image at this digest: recorded once (the first incarnation's),
    /// so that a requeued job restarts in the same image whatever its tag names by then.
    RecordImage {
        job_id: JobId,
        incarnation: u64,
        digest: String,
    },
    /// A node's agent reported what its container image store holds now.
    RecordImageStore {
        node: String,
        summary: crate::model::node::ImageStoreSummary,
    },
    /// A node's agent confirmed that these ended incarnations have no task left there, with what their tasks
    /// used there (as the jobs' cgroups measured it), recorded on the finished jobs.
    ReleaseLingering {
        node: String,
        keys: Vec<(JobId, u64)>,
        /// Absent in entries written before usage was measured.
        #[serde(default)]
        usage: Vec<((JobId, u64), MeasuredUsage)>,
    },
    /// An administrative change made outside the state machine (replica membership, through openraft), recorded
    /// in the audit log after it took effect. Proposed only by the controller that made the change.
    RecordAudit {
        by_uid: u32,
        action: String,
        detail: String,
    },
    /// `scontrol suspend` (`suspend`) / `resume`: an operator stops a running job's tasks (SIGSTOP) where they
    /// are, holding its allocation, and lets them go on later; its time limit moves by the time stopped.
    SuspendJobs {
        ids: Vec<JobId>,
        by_uid: u32,
        suspend: bool,
    },
    /// `drover progress [--step N]` from inside a job (or its agent, for the progress marker): the incarnation is
    /// alive. The leader drops reports that would change nothing it needs (see the controller's progress filter).
    RecordProgress {
        job_id: JobId,
        incarnation: u64,
        step: Option<u64>,
        by_uid: u32,
    },
    /// The leader saw no progress from this incarnation within its timeout: requeued with reason `Hung`, its nodes
    /// charged. Re-checked against the log's time, so a report committed meanwhile wins.
    JobHung {
        job_id: JobId,
        incarnation: u64,
    },
    /// A node's agent reported a GPU error with the remedy its XID table names.
    GpuFault {
        node: String,
        fault: crate::model::node::GpuFault,
    },
    /// An operator takes GPUs out of service one by one (`drover node gpus drain`), or returns them.
    DrainGpus {
        node: String,
        gpus: Vec<u32>,
        drain: bool,
        reason: String,
        by_uid: u32,
    },
    /// A node's agent reset these GPUs (drained for a reset) once idle, and they pass their health check again.
    GpusReset {
        node: String,
        gpus: Vec<u32>,
    },
    /// `scontrol reboot [ASAP] [nextstate=RESUME|DOWN] [reason=...] NODES` (operators).
    RebootNodes {
        names: Vec<String>,
        asap: bool,
        next_state: Option<crate::model::node::NextState>,
        reason: String,
        by_uid: u32,
    },
    /// `scontrol cancel_reboot NODES`.
    CancelReboot {
        names: Vec<String>,
        by_uid: u32,
    },
    /// A node's agent ran the reboot program for order `id` and is back: the node returns in the order's next state.
    NodeRebooted {
        node: String,
        id: u64,
    },
    /// `drover checkpoint invalidate`: never resume from this checkpoint (default: the one the next incarnation
    /// would resume from).
    InvalidateCheckpoint {
        job_id: JobId,
        path: Option<String>,
        by_uid: u32,
    },
    /// `scontrol requeue` of a finished batch job: back to PENDING as its next incarnation. The leader reads the
    /// job from the accounting history (which only it and the other replicas' stores hold, not `State`) and
    /// proposes it whole; applying checks it is still finished (a second request finds it active).
    RequeueFinished {
        job: Box<Job>,
        by_uid: u32,
        hold: bool,
    },
    /// `drover cluster upgrade finalize`: raise the cluster's active feature level (`feature`). The leader
    /// proposes it only once every member said it understands the level; it never goes down. Needs level 2
    /// itself: no build before feature levels can read it, which is the point (a finalized cluster cannot roll
    /// back past it).
    SetFeatureLevel {
        level: u32,
        by_uid: u32,
    },
}

/// The fields `scontrol update jobid=...` may change (`None` leaves one as it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct JobUpdate {
    /// `TimeLimit=`; `Some(None)` cannot cross JSON, so UNLIMITED is `time_unlimited`.
    pub time_limit_s: Option<u64>,
    pub time_unlimited: bool,
    pub nice: Option<i32>,
    pub qos: Option<String>,
    /// `Dependency=` (empty clears them).
    pub dependency: Option<(Vec<crate::model::job::Dependency>, bool)>,
    /// `JobName=`, `Comment=`: allowed on a running job too, as in Slurm.
    pub name: Option<String>,
    pub comment: Option<String>,
    /// `Partition=`: a pending job only; checked again like a submission.
    pub partition: Option<String>,
}

impl JobUpdate {
    /// Whether it changes only what Slurm lets a running job change: its time limit, name and comment.
    pub fn fits_a_running_job(&self) -> bool {
        self.nice.is_none() && self.qos.is_none() && self.dependency.is_none() && self.partition.is_none()
    }
}

/// One job's placement in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub job_id: JobId,
    pub nodes: Vec<NodeAllocation>,
}

/// How a job's tasks ended, as its batch node reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct JobEnd {
    pub exit_code: i32,
    pub signal: i32,
    /// Ended by the agent at the time limit.
    pub timed_out: bool,
    pub usage: Usage,
    /// What went wrong when the task could not start (missing executable, bad directory).
    pub message: Option<String>,
    /// The agent (or the task's supervisor) killed the tasks because the node's lease from the controllers
    /// expired: a node failure, after which the job is requeued, not a failure of the job.
    #[serde(default)]
    pub fenced: bool,
    /// The kernel killed a task for going over the job's memory (`--mem`): the job ends OUT_OF_MEMORY.
    #[serde(default)]
    pub oom: bool,
    /// What the job's tasks used on the reporting node, as its cgroup there measured it (`None`: not measured,
    /// or a report from before usage was measured). The other nodes report theirs when they release the job.
    #[serde(default)]
    pub measured: Option<MeasuredUsage>,
    /// Reported by a client (`salloc` ending its allocation), not by a node: no node has said its tasks are gone, so
    /// the job's share lingers on every node, the first included, until each node's agent confirms them gone.
    #[serde(default)]
    pub by_client: bool,
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
            Command::RegisterNode { .. } => "register_node",
            Command::NodeDown { .. } => "node_down",
            Command::DrainNodes { .. } => "drain_nodes",
            Command::ApplyPlan { .. } => "apply_plan",
            Command::JobEnded { .. } => "job_ended",
            Command::CreateStep { .. } => "create_step",
            Command::EndStep { .. } => "end_step",
            Command::UpdatePartition { .. } => "update_partition",
            Command::Admin { op, .. } => op.kind(),
            Command::TopJobs { .. } => "top_jobs",
            Command::RequeueFinished { .. } => "requeue_finished",
            Command::SuspendJobs { suspend: true, .. } => "suspend_jobs",
            Command::SuspendJobs { suspend: false, .. } => "resume_jobs",
            Command::UpdateJob { .. } => "update_job",
            Command::RecordAudit { .. } => "record_audit",
            Command::RequeueJobs { .. } => "requeue_jobs",
            Command::PreemptJobs { .. } => "preempt_jobs",
            Command::RecordCheckpoint { .. } => "record_checkpoint",
            Command::RecordImage { .. } => "record_image",
            Command::RecordImageStore { .. } => "record_image_store",
            Command::ReleaseLingering { .. } => "release_lingering",
            Command::RecordProgress { .. } => "record_progress",
            Command::JobHung { .. } => "job_hung",
            Command::GpuFault { .. } => "gpu_fault",
            Command::DrainGpus { .. } => "drain_gpus",
            Command::GpusReset { .. } => "gpus_reset",
            Command::InvalidateCheckpoint { .. } => "invalidate_checkpoint",
            Command::RebootNodes { .. } => "reboot_nodes",
            Command::CancelReboot { .. } => "cancel_reboot",
            Command::NodeRebooted { .. } => "node_rebooted",
            Command::SetFeatureLevel { .. } => "set_feature_level",
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
    /// Which planned allocations started, and which were refused (and why).
    Planned {
        started: Vec<JobId>,
        refused: Vec<(JobId, crate::error::AllocationRefusal)>,
    },
    Step {
        step_id: u32,
    },
    /// The victims told to end (those already ending or gone are left out).
    Preempted {
        jobs: Vec<JobId>,
    },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_written_before_usage_was_measured_still_decode() {
        let release: Command = serde_json::from_str(r#"{"ReleaseLingering":{"node":"n1","keys":[[7,0]]}}"#).unwrap();
        assert_eq!(release, Command::ReleaseLingering { node: "n1".into(), keys: vec![(7, 0)], usage: Vec::new() });
        let end: JobEnd = serde_json::from_str(
            r#"{"exit_code":0,"signal":0,"timed_out":false,"usage":{"cpu_ms":5,"max_rss_kb":6},"message":null}"#,
        )
        .unwrap();
        assert_eq!(end.measured, None);
        let partial: MeasuredUsage = serde_json::from_str(r#"{"cpu_ms":3}"#).unwrap();
        assert_eq!(partial, MeasuredUsage { cpu_ms: Some(3), mem_peak_kb: None });
    }
}
