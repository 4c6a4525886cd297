//! The JSON payloads of the agent protocol (`AgentGateway.Session`, `AgentService.LaunchStep`). They are
//! drover-state's types plus a few envelopes, so the agent, the leader and `srun` share one definition.

use drover_state::{Job, JobEnd, JobId, MeasuredUsage, NodeInfo, RunningShare};
use serde::{Deserialize, Serialize};

/// Agent → leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// First message of every session: the node's inventory (committed only if it changed or the node was down),
    /// and the incarnations the agent still has tasks of here with their GPUs: a node coming back from DOWN keeps
    /// those GPUs held until it confirms the tasks gone.
    Register {
        info: NodeInfo,
        #[serde(default)]
        running: Vec<RunningShare>,
        /// The highest feature level this agent understands (`drover_state::feature`; absent, 0, from an agent
        /// before feature levels: level 1). The leader sends it nothing newer; `drover cluster version` lists it.
        /// (Its build's version is `info.version`.)
        #[serde(default)]
        feature_level: u32,
    },
    /// Liveness (never logged), and problems that must keep new work off the node (a GPU failing its health
    /// check, an inventory that disagrees with the config): the leader drains the node with them as reason and
    /// requeues its jobs. `seq` numbers the heartbeat; the leader's [`ControllerMessage::Lease`] answers it.
    Heartbeat {
        #[serde(default)]
        seq: u64,
        problems: Vec<String>,
        /// GPU errors with their XID table's remedy. A `RestartApp` one is sent once; the others in every
        /// heartbeat while the GPU stays faulted (the leader acts once: the state shows what it did).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpu_faults: Vec<GpuFaultReport>,
        /// GPUs drained for a reset that the agent reset and that are healthy again.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpus_reset: Vec<u32>,
        /// Progress markers its jobs touched since the last heartbeat: (job, incarnation, step).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        progress: Vec<(JobId, u64, Option<u64>)>,
        /// The health-check program's failure (Slurm's HealthCheckProgram): the node is drained with it as
        /// reason; its jobs carry on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        health_check: Option<String>,
        /// The reboot order this node carried out (it ran the reboot program and is back).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rebooted: Option<u64>,
    },
    /// A job's batch script (or the cancelled remains of an interactive job) ended on its first node.
    JobEnded { job_id: JobId, incarnation: u64, end: JobEnd },
    /// A job's marker file (`$DROVER_CHECKPOINT_DIR/LATEST`) names a finished checkpoint.
    Checkpoint { job_id: JobId, incarnation: u64, path: String, step: Option<u64> },
    /// The job's container image resolved to this digest on this node (its first incarnation's is kept).
    ImageDigest { job_id: JobId, incarnation: u64, digest: String },
    /// What the node's container image store holds now (sent when it changed).
    ImageStore { summary: drover_state::node::ImageStoreSummary },
    /// These ended incarnations (listed as lingering in the assignments) have no task left on this node; `usage`
    /// says what their tasks used here, for those the node measured (a job cgroup).
    Released {
        keys: Vec<(JobId, u64)>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        usage: Vec<((JobId, u64), MeasuredUsage)>,
    },
}

/// One GPU error as the agent classified it (the state's own type: the leader proposes it as it came).
pub type GpuFaultReport = drover_state::node::GpuFault;

/// Which of a job's tasks a signal reaches (`scancel --signal`, as Slurm: steps by default, `-b` the batch shell
/// only, `--full` everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SignalTarget {
    /// Every step's tasks, not the batch shell.
    #[default]
    Steps,
    /// The batch shell alone (not its children, not the steps).
    Batch,
    /// Every task: the steps and the batch shell with its children.
    Full,
}

/// Leader → agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControllerMessage {
    /// Sent once a session is accepted: how often to heartbeat, how long a lease lasts (after it expires
    /// without renewal the node's tasks are killed, before the leader declares the node down and requeues its
    /// jobs), and the cluster's grace between SIGTERM and SIGKILL (Slurm's `KillWait`).
    /// `epoch` is the node's registration epoch this session speaks for (0 from controllers before epochs).
    Welcome {
        leader_id: u64,
        heartbeat_ms: u64,
        fence_after_ms: u64,
        kill_wait_ms: u64,
        #[serde(default)]
        epoch: u64,
    },
    /// Every job that holds this node now, from the leader's state at `applied_index` (never older than its own
    /// commit at election: an agent ignores assignments older than ones it already has). Jobs the agent runs that
    /// are not listed must not run. `lingering` lists ended incarnations whose end this node must confirm.
    Assignments {
        jobs: Vec<Assignment>,
        #[serde(default)]
        applied_index: u64,
        #[serde(default)]
        lingering: Vec<(JobId, u64)>,
        /// Whether the cluster's configuration (in the same state) lets jobs run as root.
        #[serde(default)]
        allow_root_jobs: bool,
        /// The node's registration epoch in that state: the agent starts tasks only under a lease of this epoch.
        #[serde(default)]
        epoch: u64,
        /// The GPUs each lingering incarnation holds here: confirmed gone only once no process uses them.
        #[serde(default)]
        lingering_gpus: Vec<((JobId, u64), Vec<u32>)>,
        /// The cluster's name (`SLURM_CLUSTER_NAME` in every task).
        #[serde(default)]
        cluster_name: String,
        /// `scontrol reboot`: the order to carry out (run the reboot program) once the node has no task left.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reboot: Option<u64>,
    },
    /// A `JobEnded` report is committed (or stale); the agent may forget it.
    EndAcked { job_id: JobId, incarnation: u64 },
    /// `scancel --signal`: deliver to the job's tasks on this node that `target` names.
    Signal {
        job_id: JobId,
        incarnation: u64,
        signal: i32,
        #[serde(default)]
        target: SignalTarget,
    },
    /// The answer to heartbeat `seq`, sent only while the leader has heard from a quorum of controllers
    /// recently: the node's lease runs until `lease_ms` after the agent *sent* that heartbeat. A leader cut off
    /// from the quorum sends none, so its agents' leases run out (and they look for the new leader) before the
    /// new leader can declare their nodes down. `epoch` is the registration the lease is for (0 from
    /// controllers before epochs).
    Lease {
        seq: u64,
        lease_ms: u64,
        #[serde(default)]
        epoch: u64,
    },
}

/// One job on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub job: Job,
    /// Per allocated node, in allocation order: the host others reach it by (the first is `MASTER_ADDR`).
    pub hosts: Vec<String>,
    /// Index of this node in the allocation (`SLURM_NODEID`); node 0 runs the batch script and reports the end.
    pub node_index: u32,
    /// The batch script, sent to node 0 only.
    pub script: Option<String>,
}

impl Assignment {
    /// True while the job's tasks must be stopped (cancelled, or being requeued or preempted).
    pub fn cancelled(&self) -> bool {
        self.job.stopping()
    }
}

/// `srun` → agent: this node's part of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLaunch {
    pub job_id: JobId,
    pub step_id: u32,
    pub argv: Vec<String>,
    /// Variables srun passes on (`--export`), on top of what the agent sets for Slurm and torch.
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// The step's nodes (names, in order), this node's index among them, and every node's first global rank
    /// and task count.
    pub nodes: Vec<String>,
    pub node_index: u32,
    pub tasks_per_node: Vec<u32>,
    /// `--output`/`--error` patterns (`%t` expands per task); `None` streams the output back to srun.
    pub output: Option<String>,
    pub error: Option<String>,
    pub unbuffered: bool,
    /// Which tasks read srun's standard input (sent with `StepInput`): all, one rank, or none (`/dev/null`).
    #[serde(default)]
    pub stdin: StepStdin,
    /// The step's own container (pyxis's options on srun); `None`: the job's, if it has one.
    #[serde(default)]
    pub container: Option<Box<drover_state::container::ContainerSpec>>,
}

/// srun's `--input`: which of a step's tasks get srun's standard input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum StepStdin {
    /// `/dev/null` for every task (`--input=none`, and steps from an srun that sends none).
    #[default]
    None,
    /// Every task (Slurm's default).
    All,
    /// One task, by its global rank (`--input=N`).
    Rank(u32),
}

impl StepStdin {
    pub fn reaches(self, rank: u32) -> bool {
        match self {
            StepStdin::None => false,
            StepStdin::All => true,
            StepStdin::Rank(r) => r == rank,
        }
    }
}

impl StepLaunch {
    /// Every task of the step (saturating: a launch whose counts do not fit has no [`StepLaunch::ranks_here`]).
    pub fn total_tasks(&self) -> u32 {
        self.tasks_per_node.iter().fold(0u32, |sum, n| sum.saturating_add(*n))
    }

    /// Global ranks of the tasks on this node; `None` when the node index is out of range or the counts overflow
    /// a rank (a malformed launch: the agent refuses it).
    pub fn ranks_here(&self) -> Option<std::ops::Range<u32>> {
        let index = self.node_index as usize;
        let first = self.tasks_per_node.get(..index)?.iter().try_fold(0u32, |sum, n| sum.checked_add(*n))?;
        let here = *self.tasks_per_node.get(index)?;
        Some(first..first.checked_add(here)?)
    }
}

/// Agent → `srun`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StepEvent {
    Output {
        rank: u32,
        stderr: bool,
        text: String,
    },
    Exited {
        rank: u32,
        exit_code: i32,
        signal: i32,
    },
    /// The step could not start here; names the problem.
    Refused {
        message: String,
    },
}

/// The leader's latest view of one pending job (`sprio`, `squeue --start`): weighted priority factors as Slurm
/// prints them, and the start time a backfill reservation holds for it, if any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct JobInsight {
    pub job_id: JobId,
    pub priority: u64,
    pub age: u64,
    pub fairshare: u64,
    pub job_size: u64,
    pub partition: u64,
    /// Drover's short-job factor (no Slurm column; `sprio` shows it only when its weight is set).
    #[serde(default)]
    pub short: u64,
    pub qos: u64,
    /// Seconds since the Unix epoch.
    pub expected_start_s: Option<u64>,
}

/// One `sshare` row: an account's shares and usage as the scheduler sees them now (running jobs' usage so far
/// included, everything decayed to now). The controller fills it from the scheduler's own report, so sshare
/// shows exactly what the pass uses; the wire keeps its own copy so clients need not link the scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareRow {
    pub account: String,
    pub parent: Option<String>,
    /// 0 for a root; `sshare` indents by it.
    pub depth: u32,
    pub raw_shares: u32,
    /// The account's normalized shares (S).
    pub norm_shares: f64,
    /// Decayed GPU-seconds of the account's whole subtree.
    pub raw_usage: f64,
    pub norm_usage: f64,
    pub effective_usage: f64,
    /// F, the account's fair-share factor.
    pub fairshare: f64,
}

/// `GetRegistry`: the replicated accounts, QOS and reservations, and the fair-share figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Registry {
    pub accounts: Vec<drover_state::Account>,
    /// Every QOS, the implicit `normal` included.
    pub qos: Vec<drover_state::Qos>,
    pub reservations: Vec<drover_state::Reservation>,
    pub shares: Vec<ShareRow>,
    /// Operators and administrators (`drover admin list`).
    #[serde(default)]
    pub roles: Vec<drover_state::RoleGrant>,
    /// The replica's clock when it answered (reservation states are judged against it).
    pub now_ms: u64,
}

/// Encodes a payload (these types always serialize).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("wire types serialize")
}

/// A payload that is not the message it should be (a peer of another version, or a bug): names the type expected.
#[derive(Debug, thiserror::Error)]
#[error("malformed {expected}: {source}")]
pub struct DecodeError {
    pub expected: &'static str,
    #[source]
    pub source: serde_json::Error,
}

/// Decodes a payload, naming the type on failure.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(bytes).map_err(|source| DecodeError { expected: std::any::type_name::<T>(), source })
}
