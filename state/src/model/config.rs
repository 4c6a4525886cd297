//! The cluster's configuration as the replicated state holds it: partitions and their limits.
//! Seeded from the bootstrap TOML by the first leader (`Command::InitCluster`), then changed only through the log.

use serde::{Deserialize, Serialize};

pub use drover_common::model::{PartitionState, PreemptMode};

/// Slurm's `MaxBatchRequeue` default.
pub const DEFAULT_MAX_BATCH_REQUEUE: u32 = 5;

/// One partition: a named set of nodes with limits, as in `slurm.conf`'s `PartitionName=` lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    pub name: String,
    /// Jobs without `--partition` go to the default partition (`Default=YES`).
    #[serde(default)]
    pub default: bool,
    /// Node names as a Slurm hostlist expression (`gpu[01-16]`); empty means every node.
    #[serde(default)]
    pub nodes: String,
    /// `MaxTime`: the longest `--time` accepted; `None` = UNLIMITED.
    #[serde(default)]
    pub max_time_s: Option<u64>,
    /// `DefaultTime`: the limit of jobs that give no `--time`; `None` = the max time.
    #[serde(default)]
    pub default_time_s: Option<u64>,
    /// `MaxNodes`: the most nodes one job may ask for; `None` = UNLIMITED.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    #[serde(default)]
    pub state: PartitionState,
    /// `MaxTRESPerJob=gres/gpu=N`: the most GPUs one job may ask for here; `None` = UNLIMITED.
    #[serde(default)]
    pub max_gpus_per_job: Option<u32>,
    /// `PriorityTier`: jobs of a higher tier are scheduled first, and the tier feeds the partition factor.
    #[serde(default)]
    pub priority_tier: u32,
    /// `AllowAccounts` / `AllowQos`: who may submit here; empty = everyone.
    #[serde(default)]
    pub allow_accounts: Vec<String>,
    #[serde(default)]
    pub allow_qos: Vec<String>,
    /// Shared storage for this partition's checkpoints (`DROVER_CHECKPOINT_DIR` is `DIR/JOBID/INCARNATION`);
    /// unset: the cluster's `checkpoint_dir`.
    #[serde(default)]
    pub checkpoint_dir: Option<String>,
    /// `PreemptMode=REQUEUE`: this partition's jobs may preempt requeue-able jobs of lower-tier partitions on the
    /// same nodes (Slurm's `preempt/partition_prio`).
    #[serde(default)]
    pub preempt_mode: PreemptMode,
    /// The progress timeout of this partition's jobs that set none (`--progress-timeout`), in seconds.
    #[serde(default)]
    pub progress_timeout_s: Option<u64>,
}

impl Partition {
    /// The partition every fresh cluster gets when its configuration names none.
    pub fn fallback() -> Partition {
        Partition {
            name: "gpu".to_string(),
            default: true,
            nodes: String::new(),
            max_time_s: None,
            default_time_s: None,
            max_nodes: None,
            state: PartitionState::Up,
            max_gpus_per_job: None,
            priority_tier: 0,
            allow_accounts: Vec::new(),
            allow_qos: Vec::new(),
            checkpoint_dir: None,
            preempt_mode: PreemptMode::Off,
            progress_timeout_s: None,
        }
    }
}

/// A new value for a limit. (Not `Option<Option<T>>`: JSON cannot tell `Some(None)` from `None`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limit<T> {
    Unlimited,
    At(T),
}

impl<T: Copy> Limit<T> {
    pub fn value(self) -> Option<T> {
        match self {
            Limit::Unlimited => None,
            Limit::At(v) => Some(v),
        }
    }

    pub fn from_option(value: Option<T>) -> Limit<T> {
        value.map_or(Limit::Unlimited, Limit::At)
    }
}

/// `scontrol update partitionname=X ...`: the fields to change (`None` leaves one as it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PartitionUpdate {
    pub name: String,
    pub state: Option<PartitionState>,
    pub nodes: Option<String>,
    pub max_time_s: Option<Limit<u64>>,
    pub default_time_s: Option<Limit<u64>>,
    pub max_nodes: Option<Limit<u32>>,
    /// `Default=YES` makes this the default partition (and no other).
    pub make_default: bool,
    #[serde(default)]
    pub max_gpus_per_job: Option<Limit<u32>>,
    #[serde(default)]
    pub priority_tier: Option<u32>,
    /// `AllowAccounts=a,b` / `AllowQos=...` (`ALL` clears the list).
    #[serde(default)]
    pub allow_accounts: Option<Vec<String>>,
    #[serde(default)]
    pub allow_qos: Option<Vec<String>>,
    /// `PreemptMode=`.
    #[serde(default)]
    pub preempt_mode: Option<PreemptMode>,
}

/// Limits that protect the controllers from oversized or runaway input. Replicated, so every replica
/// refuses the same things.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// The largest batch script accepted (bytes). Slurm's default `max_script_size` is 4 MiB.
    pub max_script_bytes: u64,
    /// The most environment bytes (names + values) captured at submit.
    pub max_environment_bytes: u64,
    /// The most jobs that may be pending or running at once (Slurm's `MaxJobCount`).
    pub max_active_jobs: u64,
    /// Slurm's `MaxArraySize`: array task ids must be below it (and an array has at most this many tasks).
    pub max_array_size: u32,
    /// Slurm's `MaxSubmitJobs` per user: the most pending or running jobs one user may hold, so that one user
    /// (or one runaway script) cannot fill the queue for everyone.
    pub max_jobs_per_user: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_script_bytes: 4 * 1024 * 1024,
            max_environment_bytes: 1024 * 1024,
            max_active_jobs: 2_000_000,
            max_array_size: 1001,
            max_jobs_per_user: 100_000,
        }
    }
}

/// Slurm's `PriorityWeight*` settings and the backfill depth: how the leader's scheduler weighs pending jobs.
/// Replicated, so a new leader schedules by the same rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSettings {
    pub weight_age: u32,
    pub weight_fairshare: u32,
    pub weight_job_size: u32,
    pub weight_partition: u32,
    pub weight_qos: u32,
    /// `PriorityMaxAge`: the age factor is 1 after this long in the queue.
    pub max_age_s: u64,
    /// `PriorityFavorSmall`.
    pub favor_small: bool,
    /// Weight of Drover's short-job factor (no Slurm equivalent: smaller GPUs × time-limit requests first; see
    /// `drover_scheduler::PriorityWeights::short_first` for the profile and its aging bound). 0: off.
    pub weight_short: u32,
    /// How many blocked jobs, in priority order, get a backfill reservation at their earliest start. Every
    /// pending job is still considered for starting now on every pass.
    pub reservation_depth: u32,
    /// The most pending jobs one pass considers, highest priority first (Slurm bounds its passes the same way:
    /// `default_queue_depth`, `bf_max_job_test`). The rest keep their place and reason until they rank within it.
    /// A million pending jobs then cost a pass the memory and time of this many.
    pub queue_depth: u32,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        SchedulerSettings {
            weight_age: 1_000,
            weight_fairshare: 10_000,
            weight_job_size: 1_000,
            weight_partition: 1_000,
            weight_qos: 1_000,
            max_age_s: 7 * 24 * 3600,
            favor_small: false,
            weight_short: 0,
            reservation_depth: 100,
            queue_depth: DEFAULT_QUEUE_DEPTH,
        }
    }
}

/// Pending jobs a pass considers unless the configuration says otherwise: every job of the largest queue the
/// scheduler's own benchmark times (100,000 pending on 10,000 nodes).
pub const DEFAULT_QUEUE_DEPTH: u32 = 100_000;

/// Slurm's `PriorityDecayHalfLife` default: 7 days.
pub const DEFAULT_HALF_LIFE_S: u64 = 7 * 24 * 3600;

fn default_half_life_s() -> u64 {
    DEFAULT_HALF_LIFE_S
}

/// The replicated cluster configuration. Every field may be left out of the TOML (defaults apply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster_name: String,
    pub partitions: Vec<Partition>,
    pub limits: Limits,
    /// `PriorityDecayHalfLife`: past usage counts half as much after this long (0: never decays).
    #[serde(default = "default_half_life_s")]
    pub fairshare_half_life_s: u64,
    pub scheduler: SchedulerSettings,
    /// Whether jobs may run as root (uid 0). Off by default: a job runs with its submitter's identity on every
    /// node, so root jobs are root on every GPU node.
    pub allow_root_jobs: bool,
    /// Slurm's `MaxBatchRequeue`: a job whose node failed more than this many times is not requeued again.
    #[serde(default = "default_max_batch_requeue")]
    pub max_batch_requeue: u32,
    /// Where checkpoints go when the partition names no `checkpoint_dir`; unset: `SUBMIT_DIR/.drover/checkpoints`.
    pub checkpoint_dir: Option<String>,
    /// Slurm's `FirstJobId`: the id the cluster's first job gets (ids count up from it). Taken when the cluster
    /// is initialized; a site moving from Slurm starts above its old ids so no script confuses the two.
    #[serde(default = "default_first_job_id")]
    pub first_job_id: u64,
    /// Hang detection, lemon-node quarantine and checkpoint fallback.
    #[serde(default)]
    pub resilience: ResilienceSettings,
}

/// What turns repeated failures into action: see the README's operations section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResilienceSettings {
    /// The progress timeout of jobs whose request, QOS and partition set none, in seconds (`None`: no hang
    /// detection for them).
    pub progress_timeout_s: Option<u64>,
    /// A node charged with this many failures within `quarantine_window_s` is drained (0: never).
    pub quarantine_failures: u32,
    pub quarantine_window_s: u64,
    /// A job that fails within this many seconds of starting charges its nodes with a failure (0: never).
    pub early_failure_s: u64,
    /// An incarnation that fails (exits non-zero or hangs) within this many seconds of resuming from a checkpoint
    /// marks that checkpoint bad and is restarted from the one before (0: never).
    pub checkpoint_fallback_s: u64,
}

impl Default for ResilienceSettings {
    fn default() -> Self {
        ResilienceSettings {
            progress_timeout_s: None,
            quarantine_failures: 3,
            quarantine_window_s: 24 * 3600,
            early_failure_s: 300,
            checkpoint_fallback_s: 600,
        }
    }
}

fn default_first_job_id() -> u64 {
    1
}

fn default_max_batch_requeue() -> u32 {
    DEFAULT_MAX_BATCH_REQUEUE
}

impl ClusterConfig {
    /// Where a job submitted from `submit_dir` to `partition` keeps its checkpoints.
    pub fn checkpoint_root(&self, partition: &Partition, submit_dir: &str) -> String {
        match partition.checkpoint_dir.as_ref().or(self.checkpoint_dir.as_ref()) {
            Some(dir) => dir.clone(),
            None => format!("{}/.drover/checkpoints", submit_dir.trim_end_matches('/')),
        }
    }
}

impl ClusterConfig {
    /// Normalizes a configuration: at least one partition, exactly one default (the first flagged, else the first).
    pub fn normalized(mut self) -> ClusterConfig {
        if self.partitions.is_empty() {
            self.partitions.push(Partition::fallback());
        }
        let first_default = self.partitions.iter().position(|p| p.default).unwrap_or(0);
        for (i, p) in self.partitions.iter_mut().enumerate() {
            p.default = i == first_default;
        }
        self
    }

    pub fn partition(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name == name)
    }

    pub fn default_partition(&self) -> &Partition {
        let found = self.partitions.iter().find(|p| p.default);
        found.unwrap_or_else(|| &self.partitions[0])
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            cluster_name: "drover".to_string(),
            partitions: vec![],
            limits: Limits::default(),
            fairshare_half_life_s: DEFAULT_HALF_LIFE_S,
            scheduler: SchedulerSettings::default(),
            allow_root_jobs: false,
            max_batch_requeue: DEFAULT_MAX_BATCH_REQUEUE,
            checkpoint_dir: None,
            first_job_id: default_first_job_id(),
            resilience: ResilienceSettings::default(),
        }
        .normalized()
    }
}
