//! Jobs as the replicated state knows them: what the user asked for (`JobSpec`) and what became of it (`Job`).

use serde::{Deserialize, Serialize};

/// A job id, as Slurm numbers them: sequential from the state's counter, never reused.
pub type JobId = u64;

/// Which of the submitting shell's variables the job sees (`--export`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ExportPolicy {
    /// `--export=ALL` (Slurm's default): the whole submit environment, captured at submit time.
    #[default]
    All,
    /// `--export=NONE`: only what Slurm itself sets.
    None,
    /// `--export=ALL,VAR=x` or `--export=VAR1,VAR2`: named variables (and `ALL` if listed).
    Vars { all: bool, names: Vec<String> },
}

/// Everything a user asked for at submit time. Stored whole (the script text included), so the job can run
/// after the script file is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct JobSpec {
    /// `--job-name/-J`; Slurm's default is the script's file name, or `wrap` for `--wrap`.
    pub name: String,
    /// `--partition/-p`; `None` means the cluster's default partition, resolved in `apply`.
    pub partition: Option<String>,
    /// `--account/-A`.
    pub account: Option<String>,
    /// The submitting user's name, uid and gid (the agent runs the job as them).
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    /// The batch script's full text (for `--wrap`, a generated `#!/bin/sh` script).
    pub script: String,
    /// Arguments after the script name on the `sbatch` command line.
    pub script_args: Vec<String>,
    /// Where the job runs: `--chdir`, else the submit directory.
    pub work_dir: String,
    /// The directory `sbatch` was run from (`SLURM_SUBMIT_DIR`).
    pub submit_dir: String,
    /// `--output/-o` and `--error/-e` patterns (`%j`, `%x`, ...); `None` means Slurm's `slurm-%j.out`.
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    /// `--nodes/-N`: minimum and maximum node count (`-N 2-4`).
    pub min_nodes: u32,
    pub max_nodes: u32,
    /// `--ntasks/-n`, `--ntasks-per-node`; `None` when not given.
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    /// `--cpus-per-task/-c` (default 1).
    pub cpus_per_task: u32,
    /// GPUs on every allocated node (`--gres=gpu:N`, `--gpus-per-node`), and an optional type (`gpu:h100:8`).
    pub gpus_per_node: u32,
    pub gpu_type: Option<String>,
    /// `--time/-t` in seconds; `None` takes the partition's default.
    pub time_limit_s: Option<u64>,
    /// `--requeue` / `--no-requeue`; `None` takes the cluster default (requeue allowed).
    pub requeue: Option<bool>,
    /// `--hold`: submitted held (priority 0, reason `JobHeldUser`).
    pub hold: bool,
    /// `--export` and the captured environment it selects from.
    pub export: ExportPolicy,
    pub environment: Vec<(String, String)>,
}

impl JobSpec {
    /// Total tasks the job will run (Slurm: `ntasks`, else `ntasks-per-node × nodes`, else one per node).
    pub fn total_tasks(&self) -> u32 {
        match (self.ntasks, self.ntasks_per_node) {
            (Some(n), _) => n,
            (None, Some(per_node)) => per_node.saturating_mul(self.min_nodes.max(1)),
            (None, None) => self.min_nodes.max(1),
        }
    }

    /// Total GPUs on the minimum node count (Slurm's `AllocTRES` gres/gpu).
    pub fn total_gpus(&self) -> u32 {
        self.gpus_per_node.saturating_mul(self.min_nodes.max(1))
    }
}

/// Slurm's job state names, with the same meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Suspended,
    Completing,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    Preempted,
    OutOfMemory,
    Requeued,
}

impl JobState {
    /// The long name `squeue -l`, `sacct` and `scontrol` print.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Suspended => "SUSPENDED",
            JobState::Completing => "COMPLETING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::Preempted => "PREEMPTED",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::Requeued => "REQUEUED",
        }
    }

    /// The compact code `squeue`'s default `ST` column prints.
    pub fn short(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Running => "R",
            JobState::Suspended => "S",
            JobState::Completing => "CG",
            JobState::Completed => "CD",
            JobState::Failed => "F",
            JobState::Cancelled => "CA",
            JobState::Timeout => "TO",
            JobState::NodeFail => "NF",
            JobState::Preempted => "PR",
            JobState::OutOfMemory => "OOM",
            JobState::Requeued => "RQ",
        }
    }

    /// Parses either form, case-insensitively, as `squeue -t` and `sacct -s` accept them.
    pub fn parse(text: &str) -> Option<JobState> {
        let upper = text.trim().to_ascii_uppercase();
        JobState::ALL
            .iter()
            .copied()
            .find(|s| s.name() == upper || s.short() == upper || (upper == "CANCELED" && *s == JobState::Cancelled))
    }

    /// A terminal job never changes again (unless requeued by an explicit command, which makes a new incarnation).
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Suspended | JobState::Completing | JobState::Requeued
        )
    }

    pub const ALL: [JobState; 12] = [
        JobState::Pending,
        JobState::Running,
        JobState::Suspended,
        JobState::Completing,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::Preempted,
        JobState::OutOfMemory,
        JobState::Requeued,
    ];
}

/// Why a pending job is not running, in Slurm's words (`squeue`'s `REASON` column).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PendingReason {
    None,
    Priority,
    Resources,
    JobHeldUser,
    JobHeldAdmin,
    PartitionDown,
    BeginTime,
    Dependency,
}

impl PendingReason {
    pub fn name(&self) -> &'static str {
        match self {
            PendingReason::None => "None",
            PendingReason::Priority => "Priority",
            PendingReason::Resources => "Resources",
            PendingReason::JobHeldUser => "JobHeldUser",
            PendingReason::JobHeldAdmin => "JobHeldAdmin",
            PendingReason::PartitionDown => "PartitionDown",
            PendingReason::BeginTime => "BeginTime",
            PendingReason::Dependency => "Dependency",
        }
    }
}

/// A job as the replicated state holds it. The script text is *not* here: it is stored once, beside the job,
/// so that the in-memory state of a million pending jobs stays small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// The spec with `script` emptied (kept in the script table).
    pub spec: JobSpec,
    /// The partition resolved at submit time (the spec's, or the default).
    pub partition: String,
    /// The time limit resolved at submit time (the spec's, or the partition default); `None` = UNLIMITED.
    pub time_limit_s: Option<u64>,
    pub state: JobState,
    pub reason: PendingReason,
    /// Held jobs have priority 0 in Slurm; `held` keeps who held it via `reason`.
    pub held: bool,
    /// Times in milliseconds since the Unix epoch, stamped by the leader into the log entry that caused them.
    pub submit_time_ms: u64,
    pub start_time_ms: Option<u64>,
    pub end_time_ms: Option<u64>,
    /// How many times this job was requeued; each requeue starts a new incarnation.
    pub restart_count: u32,
    pub incarnation: u64,
    /// Exit code and terminating signal (`ExitCode` column `N:S`).
    pub exit_code: i32,
    pub exit_signal: i32,
    /// The nodes the current incarnation runs on (empty while pending).
    pub nodes: Vec<String>,
    /// Who cancelled it, for `scontrol show job`'s reason line.
    pub cancelled_by: Option<u32>,
}
