//! Plain-data inputs of a scheduling pass: an immutable view of the replicated state.
//!
//! Everything here is serde-serializable so the leader can log or ship the exact view a plan was computed from,
//! and a test can replay it. Time is always an input (`now_s`), never read from a clock.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// Job ids come from the replicated job-id counter.
pub type JobId = u64;

/// Where a node sits in the network; placement prefers few switches, then few racks, and never spans sites
/// unless the job asks for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub site: String,
    pub rack: String,
    pub switch: String,
}

/// One GPU node as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// GPUs are indexed `0..gpus_total`; at most 64 per node (a bit mask per node keeps placement cheap).
    pub gpus_total: u32,
    /// Indices of GPUs no running job holds. Authoritative for "start now": a plan only hands out these.
    pub free_gpus: Vec<u32>,
    pub cpus_total: u32,
    pub cpus_free: u32,
    /// Memory in MiB; a node with `mem_total_mb == 0` does not track memory (any request fits).
    #[serde(default)]
    pub mem_total_mb: u64,
    #[serde(default)]
    pub mem_free_mb: u64,
    pub partitions: Vec<String>,
    /// `--constraint` matches against these.
    pub features: Vec<String>,
    /// e.g. "a100"; a job asking `--gres=gpu:a100:N` only lands on matching nodes.
    pub gpu_type: Option<String>,
    pub topology: Topology,
    /// False for drained / down nodes: nothing new starts or is reserved there.
    pub schedulable: bool,
    /// A hot spare: held out of ordinary placement, reservations and preemption. Only a job restarting after a
    /// node failure ([`PendingJob::may_use_spares`]) may start on it, so such a job restarts at once instead of
    /// waiting for a full set of normal nodes.
    #[serde(default)]
    pub spare: bool,
}

/// A job that holds resources now. Its expected end (`start_s + time_limit_s`) is when the scheduler may plan
/// to reuse its GPUs; time limits are enforced, so that is a safe upper bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningJob {
    pub id: JobId,
    pub user: CompactString,
    pub account: CompactString,
    pub qos: CompactString,
    /// (node name, GPU indices held there).
    pub alloc: Vec<(String, Vec<u32>)>,
    pub start_s: u64,
    pub time_limit_s: u64,
    /// An exclusive job owns its whole nodes, GPUs it did not ask for included.
    pub exclusive: bool,
    /// The advance reservation it runs in, if any: it consumes that reservation's capacity.
    pub reservation: Option<CompactString>,
    /// The job array it is a task of, if any: it counts against that array's [`ArrayLimit`].
    #[serde(default)]
    pub array_id: Option<JobId>,
    /// The partition it runs in (for partition-tier preemption, Slurm's `preempt/partition_prio`).
    #[serde(default)]
    pub partition: CompactString,
    /// Whether it may be preempted and requeued (it checkpoints and can restart). Only requeue-able jobs are
    /// ever chosen as preemption victims.
    #[serde(default)]
    pub requeueable: bool,
    /// Its priority as last computed while it was pending; lower-priority victims are preempted first.
    #[serde(default)]
    pub priority: u64,
    /// Already told to end (a [`crate::plan::Preemption`] the controller acted on): it is never chosen again, and
    /// its GPUs are expected free at `now + kill_wait_s` (see [`SchedulerConfig::kill_wait_s`]).
    #[serde(default)]
    pub preempting: bool,
    /// The job it is being preempted for ([`crate::plan::Preemption::for_job`]), when `preempting`. The GPUs it
    /// frees are then held for that job while it is pending, so a later pass neither hands them to another job
    /// nor preempts again for it. None: they go to any job that may preempt this one.
    #[serde(default)]
    pub preempted_for: Option<JobId>,
}

impl RunningJob {
    pub fn expected_end_s(&self) -> u64 {
        self.start_s.saturating_add(self.time_limit_s)
    }
}

/// State of a job's `--dependency`, evaluated by the caller (see [`crate::dependency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DependencyState {
    /// No dependency, or all satisfied.
    #[default]
    Satisfied,
    /// Some dependency may still be satisfied later.
    Waiting,
    /// A dependency can never be satisfied (e.g. afterok on a failed job).
    NeverSatisfied,
}

/// A job array's throttle (`--array=...%N`): at most `max_running` of its tasks run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayLimit {
    /// The array's id (Slurm's ArrayJobId), shared by all its tasks and by [`RunningJob::array_id`].
    pub array_id: JobId,
    pub max_running: u32,
}

/// [`PendingJob::mem_per_node_mb`] for "all of each node's memory".
pub const ALL_MEMORY: u64 = u64::MAX;

/// The MiB a job asking for `per_node` (or [`ALL_MEMORY`]) needs on a node of `total` MiB; 0 where the node does
/// not track memory.
pub fn mem_needed(per_node: u64, total: u64) -> u64 {
    match (total, per_node) {
        (0, _) => 0,
        (total, ALL_MEMORY) => total,
        (_, mb) => mb,
    }
}

/// A job waiting to start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingJob {
    pub id: JobId,
    pub submit_s: u64,
    pub user: CompactString,
    pub account: CompactString,
    pub partition: CompactString,
    pub qos: CompactString,
    /// Number of nodes (`--nodes`), at least 1.
    pub nodes: u32,
    /// GPUs on each node (`--gres=gpu:N`), may be 0 for CPU-only work.
    pub gpus_per_node: u32,
    pub cpus_per_node: u32,
    /// Memory on each node in MiB ([`ALL_MEMORY`]: the node's whole memory, Slurm's `--mem=0`).
    #[serde(default)]
    pub mem_per_node_mb: u64,
    pub gpu_type: Option<CompactString>,
    pub time_limit_s: u64,
    pub exclusive: bool,
    /// `--constraint`: every listed feature must be present on each node.
    pub constraint: Vec<String>,
    /// `--nodelist`: when non-empty, only these nodes are used.
    pub nodelist: Vec<String>,
    /// `--exclude`.
    pub exclude: Vec<String>,
    /// `--reservation`: the job runs only inside it.
    pub reservation: Option<CompactString>,
    pub held: bool,
    pub dependency: DependencyState,
    /// Multi-node jobs stay within one site unless they set this.
    pub allow_multi_site: bool,
    /// Slurm's nice: subtracted from the final priority (which never goes below 0); negative raises it.
    #[serde(default)]
    pub nice: i32,
    /// `scontrol top`: 0 = not topped. A user's topped jobs take that user's highest priority values (higher rank
    /// first); their other jobs keep their order below. Other users' jobs are unaffected.
    #[serde(default)]
    pub top_rank: u64,
    /// Set for a task of a throttled job array.
    #[serde(default)]
    pub array: Option<ArrayLimit>,
    /// `--begin`: not eligible before this time (0: at once).
    #[serde(default)]
    pub begin_s: u64,
    /// A job restarting after a node failure: when the free normal nodes cannot start it now, it may take hot
    /// spares ([`Node::spare`]) together with them. It never waits on a spare: without enough free nodes now it
    /// waits (and reserves) on normal nodes, like any job.
    #[serde(default)]
    pub may_use_spares: bool,
}

impl PendingJob {
    /// A job with the common defaults, for tests, benches and the simulator.
    pub fn simple(id: JobId, submit_s: u64, nodes: u32, gpus_per_node: u32, time_limit_s: u64) -> Self {
        Self {
            id,
            submit_s,
            user: "user".into(),
            account: "root".into(),
            partition: "gpu".into(),
            qos: "normal".into(),
            nodes,
            gpus_per_node,
            cpus_per_node: 0,
            mem_per_node_mb: 0,
            begin_s: 0,
            gpu_type: None,
            time_limit_s,
            exclusive: false,
            constraint: Vec::new(),
            nodelist: Vec::new(),
            exclude: Vec::new(),
            reservation: None,
            held: false,
            dependency: DependencyState::Satisfied,
            allow_multi_site: false,
            nice: 0,
            top_rank: 0,
            array: None,
            may_use_spares: false,
        }
    }

    pub fn total_gpus(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.gpus_per_node)
    }
}

/// A partition's state and preemption mode: the state's own types. The scheduler starts nothing in a partition
/// that is not `Up`.
pub use drover_common::model::{PartitionState, PreemptMode};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    /// Jobs asking for more than this never start here (`PartitionTimeLimit`).
    pub max_time_s: Option<u64>,
    /// Slurm's PriorityTier: higher tiers are scheduled first, and feed the partition priority factor.
    pub priority_tier: u32,
    pub state: PartitionState,
    #[serde(default)]
    pub preempt_mode: PreemptMode,
}

/// A node of the fair-share account tree. The root has `parent: None`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub name: String,
    pub parent: Option<String>,
    /// Raw shares, relative to siblings.
    pub shares: u32,
    /// Decayed GPU-seconds charged directly to this account (children's usage is added up by the scheduler).
    pub usage_gpu_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReservationFlag {
    /// Maintenance: blocks the nodes for everyone not named in the reservation (same placement effect).
    Maint,
}

/// An advance reservation (`scontrol create reservation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvanceReservation {
    pub name: String,
    /// Whole nodes reserved. If empty, `gpu_count` GPUs are reserved instead, on nodes chosen deterministically.
    pub nodes: Vec<String>,
    pub gpu_count: Option<u32>,
    pub start_s: u64,
    /// None: open-ended.
    pub duration_s: Option<u64>,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub flags: Vec<ReservationFlag>,
}

impl AdvanceReservation {
    pub fn end_s(&self) -> u64 {
        self.duration_s.map_or(u64::MAX, |d| self.start_s.saturating_add(d))
    }
}

/// Quality of service: a priority factor, and limits per user and per account. A limit counts the running jobs
/// of that user (account) under this QOS plus those the pass starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    pub name: String,
    pub priority: u32,
    pub max_jobs_per_user: Option<u32>,
    pub max_gpus_per_user: Option<u32>,
    #[serde(default)]
    pub max_jobs_per_account: Option<u32>,
    #[serde(default)]
    pub max_gpus_per_account: Option<u32>,
    /// Slurm's `Preempt=`: names of the QOSes whose requeue-able running jobs this QOS's jobs may preempt
    /// (`PreemptType=preempt/qos`, `PreemptMode=REQUEUE`). A QOS never preempts itself.
    #[serde(default)]
    pub preempt: Vec<String>,
    /// Slurm's `PreemptExemptTime`: a job of this QOS that started less than this long ago is not preempted.
    #[serde(default)]
    pub preempt_exempt_time_s: Option<u64>,
}

impl Qos {
    /// A QOS with this priority and no limits.
    pub fn unlimited(name: impl Into<String>, priority: u32) -> Self {
        Self {
            name: name.into(),
            priority,
            max_jobs_per_user: None,
            max_gpus_per_user: None,
            max_jobs_per_account: None,
            max_gpus_per_account: None,
            preempt: Vec::new(),
            preempt_exempt_time_s: None,
        }
    }

    /// Whether any per-user or per-account limit is set (only then does a pass count usage for it).
    pub fn has_limits(&self) -> bool {
        self.max_jobs_per_user.is_some()
            || self.max_gpus_per_user.is_some()
            || self.max_jobs_per_account.is_some()
            || self.max_gpus_per_account.is_some()
    }
}

/// Slurm's PriorityWeight* settings. Each factor is in [0, 1] and multiplied by its weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriorityWeights {
    pub age: u32,
    pub fairshare: u32,
    pub job_size: u32,
    pub partition: u32,
    pub qos: u32,
    /// PriorityMaxAge: age factor saturates at 1 after this long in the queue.
    pub max_age_s: u64,
    /// PriorityFavorSmall: small jobs get the larger size factor.
    pub favor_small: bool,
    /// Weight of the short-job factor (no Slurm equivalent; Moab's XFactor idea): 1 for the smallest request,
    /// falling with the logarithm of the job's requested GPU-seconds (GPUs × time limit), 0 at or beyond
    /// [`SHORT_FACTOR_MAX_GPU_S`]. 0 (the default): off. See [`crate::priority`] for the aging bound.
    #[serde(default)]
    pub short: u32,
}

/// Requested GPU-seconds at which the short-job factor reaches 0: 64 GPUs for 7 days.
pub const SHORT_FACTOR_MAX_GPU_S: u64 = 64 * 7 * 24 * 3600;
/// The short-job factor's unit: requests up to about this many GPU-seconds all count as the smallest.
pub const SHORT_FACTOR_UNIT_GPU_S: u64 = 60;

impl Default for PriorityWeights {
    fn default() -> Self {
        Self {
            age: 1_000,
            fairshare: 10_000,
            job_size: 1_000,
            partition: 1_000,
            qos: 1_000,
            max_age_s: 7 * 24 * 3600,
            favor_small: false,
            short: 0,
        }
    }
}

impl PriorityWeights {
    /// Drover's "short first" profile, for queues whose time limits mean something: smaller requests (GPUs × time
    /// limit, on a log scale) go first, and age grows without saturating in practice, so nothing starves. Age is
    /// worth 100 points a day ([`SHORT_FIRST_AGE_WEIGHT`] over a [`SHORT_FIRST_MAX_AGE_S`] of one year); the
    /// short-job factor at most [`SHORT_FIRST_SHORT_WEIGHT`] = 200, i.e. 2 days of age. Fair-share, partition
    /// and QOS keep Slurm's default weights; job size (which favours large jobs by default) is off.
    ///
    /// Aging bound: while a job J has waited less than the max age, a job K can be ordered ahead of J only if
    /// `100/day × (K.submit − J.submit) < short + fair-share + partition + QOS contributions of K − J's`; with equal
    /// account, partition and QOS that is K submitted less than 2 days after J. So a job is passed only by the
    /// (finite) jobs submitted before then, and once they are gone it is first, holds the first backfill
    /// reservation, and starts by the time the running jobs' limits end.
    ///
    /// Tuned on the ElasticFlow traces (SIMULATION.md, "Scheduler quality vs the Slurm-like policy").
    pub fn short_first() -> Self {
        Self {
            age: SHORT_FIRST_AGE_WEIGHT,
            max_age_s: SHORT_FIRST_MAX_AGE_S,
            job_size: 0,
            short: SHORT_FIRST_SHORT_WEIGHT,
            ..Self::default()
        }
    }
}

/// Age weight of [`PriorityWeights::short_first`]: 100 points per day of waiting, up to its max age.
pub const SHORT_FIRST_AGE_WEIGHT: u32 = 36_500;
/// PriorityMaxAge of [`PriorityWeights::short_first`]: a year, so age effectively never saturates (a saturated
/// age would tie old jobs and let the short-job factor order them, and long jobs could then wait on and on).
pub const SHORT_FIRST_MAX_AGE_S: u64 = 365 * 24 * 3600;
/// Short-job weight of [`PriorityWeights::short_first`]: the most a small request can be worth, 2 days of age.
pub const SHORT_FIRST_SHORT_WEIGHT: u32 = 200;

impl SchedulerConfig {
    /// The default pass with [`PriorityWeights::short_first`].
    pub fn short_first() -> Self {
        Self { weights: PriorityWeights::short_first(), ..Self::default() }
    }
}

/// How a pass runs; the defaults are Drover's policy, other settings reproduce FIFO or Slurm-like passes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    pub weights: PriorityWeights,
    /// False: strict priority order, nothing starts after the first job that cannot (FIFO without backfill).
    pub backfill: bool,
    /// How many blocked jobs get a reservation at their earliest start (the backfill "depth").
    /// Every job is still tried for starting now regardless of this. At 10,000 nodes and 100k pending jobs a depth
    /// of 100 adds ~10–20 ms to a pass and 1,000 adds ~200 ms (see SIMULATION.md).
    pub max_reservations: usize,
    /// Slurm's bf_max_job_test: only the first N jobs in priority order are examined at all. None: every job.
    pub max_backfill_jobs: Option<usize>,
    /// Preemption with requeue (see [`crate::backfill::preempt`]): it only acts when some QOS lists others in
    /// [`Qos::preempt`] or some partition has [`PreemptMode::Requeue`]. False: never preempt.
    #[serde(default = "default_true")]
    pub preemption: bool,
    /// Slurm's KillWait: the grace a victim gets to checkpoint and exit. Its GPUs are expected free this long after
    /// the pass (at least 1 s), and the preemptor holds a reservation from then.
    #[serde(default = "default_kill_wait_s")]
    pub kill_wait_s: u64,
    /// Most victims one pass preempts (new preemptions; victims already ending do not count).
    #[serde(default = "default_max_preemptions")]
    pub max_preemptions: usize,
}

fn default_true() -> bool {
    true
}

fn default_kill_wait_s() -> u64 {
    30
}

fn default_max_preemptions() -> usize {
    64
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            weights: PriorityWeights::default(),
            backfill: true,
            max_reservations: 100,
            max_backfill_jobs: None,
            preemption: true,
            kill_wait_s: default_kill_wait_s(),
            max_preemptions: default_max_preemptions(),
        }
    }
}

/// The immutable view a pass reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    pub now_s: u64,
    pub nodes: Vec<Node>,
    pub running: Vec<RunningJob>,
    pub pending: Vec<PendingJob>,
    pub partitions: Vec<Partition>,
    pub accounts: Vec<Account>,
    pub reservations: Vec<AdvanceReservation>,
    pub qos: Vec<Qos>,
}
