//! Jobs as the replicated state knows them: what the user asked for (`JobSpec`) and what became of it (`Job`).

use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

pub use drover_common::model::PendingReason;

use crate::thin_str::ThinStr;

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
    Vars { all: bool, names: ThinVec<String> },
}

/// Everything a user asked for at submit time. Stored whole (the script text included), so the job can run
/// after the script file is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct JobSpec {
    /// `--job-name/-J`; Slurm's default is the script's file name, or `wrap` for `--wrap`.
    pub name: CompactString,
    /// `--partition/-p`; `None` means the cluster's default partition, resolved in `apply`.
    pub partition: Option<ThinStr>,
    /// `--account/-A`.
    pub account: Option<ThinStr>,
    /// The submitting user's name, uid and gid (the agent runs the job as them).
    pub user: CompactString,
    pub uid: u32,
    pub gid: u32,
    /// The batch script's full text (for `--wrap`, a generated `#!/bin/sh` script).
    pub script: ThinStr,
    /// Arguments after the script name on the `sbatch` command line.
    pub script_args: ThinVec<String>,
    /// Where the job runs: `--chdir`, else the submit directory.
    pub work_dir: CompactString,
    /// The directory `sbatch` was run from (`SLURM_SUBMIT_DIR`).
    pub submit_dir: CompactString,
    /// `--output/-o` and `--error/-e` patterns (`%j`, `%x`, ...); `None` means Slurm's `slurm-%j.out`.
    pub stdout: Option<ThinStr>,
    pub stderr: Option<ThinStr>,
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
    pub gpu_type: Option<ThinStr>,
    /// `--time/-t` in seconds; `None` takes the partition's default.
    pub time_limit_s: Option<u64>,
    /// `--requeue` / `--no-requeue`; `None` takes the cluster default (requeue allowed).
    pub requeue: Option<bool>,
    /// `--hold`: submitted held (priority 0, reason `JobHeldUser`).
    pub hold: bool,
    /// `--export` and the captured environment it selects from.
    pub export: ExportPolicy,
    pub environment: ThinVec<(String, String)>,
    /// `--open-mode=append` (else output files are truncated when the job starts).
    pub open_append: bool,
    /// An allocation without a batch script (`srun` outside a job, `salloc`): the agents run nothing until a
    /// step is launched, and the client that made it reports its end.
    pub interactive: bool,
    /// `--exclusive`: whole nodes, shared with no other job.
    pub exclusive: bool,
    /// `--constraint/-C`: features every allocated node must have (Slurm's `a&b`).
    pub constraint: ThinVec<String>,
    /// `--nodelist/-w`: the job runs only on these nodes (expanded hostlist); empty = any.
    pub nodelist: ThinVec<String>,
    /// `--exclude/-x`: never on these nodes.
    pub exclude: ThinVec<String>,
    /// `--qos/-q`; `None` takes the cluster's default QOS (`normal`).
    pub qos: Option<ThinStr>,
    /// `--reservation`: run only inside this advance reservation.
    pub reservation: Option<ThinStr>,
    /// `--nice`: subtracted from the job's priority (only root may give a negative value).
    pub nice: i32,
    /// `--dependency`: all must hold (Slurm's `,`), or any one (Slurm's `?`) when `dependency_any`.
    pub dependency: ThinVec<Dependency>,
    pub dependency_any: bool,
    /// `--array`: the task ids and the `%N` limit on tasks running at once. Each task becomes its own job.
    pub array: Option<ArraySpec>,
    /// `--gpus/-G` without `--nodes`: the total, spread over as few nodes as the partition allows (resolved at
    /// submit into `min_nodes` x `gpus_per_node`).
    pub gpus_total: Option<u32>,
    /// `--gpus-per-task` (already folded into `gpus_per_node` by the client; kept for `SLURM_GPUS_PER_TASK`).
    pub gpus_per_task: Option<u32>,
    /// `--signal=[{R|B}:]SIG[@secs]`: a warning signal before the time limit, and before a requeue or a
    /// preemption, so the job can checkpoint first.
    pub signal: Option<WarnSignal>,
    /// `--no-kill`: a multi-node job keeps running on its remaining nodes when one that is not its first fails.
    pub no_kill: bool,
    /// `--mem`, `--mem-per-cpu`, `--mem-per-gpu`: memory reserved on each node (the scheduler places on it, the
    /// agent confines the tasks to it where the host allows). `None` reserves none.
    pub mem: Option<MemRequest>,
    /// `--begin`: not eligible to start before this time (ms since the epoch; resolved by the client).
    pub begin_ms: Option<u64>,
    /// `--deadline`: a pending job that can no longer finish by then is cancelled (Slurm's DEADLINE state).
    pub deadline_ms: Option<u64>,
    /// `--time-min`: the shortest limit the job accepts (recorded; shown by `scontrol show job`).
    pub time_min_s: Option<u64>,
    /// `--cpus-per-gpu` and `--ntasks-per-gpu`, as given (already folded into `cpus_per_task` and
    /// `ntasks_per_node` by the client; kept for `SLURM_CPUS_PER_GPU` and `scontrol show job`).
    pub cpus_per_gpu: Option<u32>,
    pub ntasks_per_gpu: Option<u32>,
    /// `--wckey` and `--comment`: recorded and shown (`sacct -o WCKey,Comment`).
    pub wckey: Option<ThinStr>,
    pub comment: Option<ThinStr>,
    /// `--multi-site` (Drover): a multi-node job may span sites (topology label `site`); by default all its
    /// nodes are on one site.
    pub multi_site: bool,
    /// `--kill-on-invalid-dep=yes`: once its dependencies can never be satisfied, the job is cancelled (reason
    /// `DependencyNeverSatisfied`) instead of staying pending.
    pub kill_on_invalid_dep: bool,
    /// `--gpu-freq`: the clocks the job's GPUs run at (set by the agent before the job starts there, reset to the
    /// highest once it has left). Boxed: few jobs ask, and the spec stays one word bigger, not three.
    pub gpu_freq: Option<Box<GpuFreq>>,
    /// `--container-image` and the other pyxis options: the job's batch script (and its srun steps, unless they
    /// name their own) run inside this container. Boxed like `gpu_freq`: one word in every spec.
    pub container: Option<Box<crate::container::ContainerSpec>>,
    /// `--progress-timeout=MINUTES` (seconds here): the job is hung when no progress (`drover progress`, a
    /// checkpoint, the progress marker) arrives for this long, and is requeued. `None`: the QOS's, the
    /// partition's or the cluster's default, resolved at submit into [`Resilience::progress_timeout_s`].
    #[serde(default)]
    pub progress_timeout_s: Option<u32>,
}

/// `--gpu-freq=[<level>][,memory=<level>][,verbose]`: the GPUs' graphics and memory clocks, as Slurm's option
/// spells them. Typed, so whatever a client sends is a request the agent can carry out (a number a GPU cannot
/// run at gets the closest it can, as in Slurm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct GpuFreq {
    pub graphics: Option<ClockLevel>,
    pub memory: Option<ClockLevel>,
    /// `verbose`: the agent logs the clocks it set.
    pub verbose: bool,
}

/// One clock of `--gpu-freq`: a named point of the GPU's supported range, or a frequency in MHz.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClockLevel {
    Low,
    Medium,
    High,
    /// The next one below the highest.
    HighM1,
    Mhz(u32),
}

/// A `--gpu-freq` value Slurm would refuse; shown as Slurm's sbatch shows it (`gpu:` and the value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid --gpu-freq argument: gpu:{0}")]
pub struct InvalidGpuFreq(pub String);

impl ClockLevel {
    /// Slurm's words, in lower case only (it refuses `HIGH`), or digits.
    fn parse(word: &str) -> Option<ClockLevel> {
        Some(match word {
            "low" => ClockLevel::Low,
            "medium" => ClockLevel::Medium,
            "high" => ClockLevel::High,
            "highm1" => ClockLevel::HighM1,
            _ if !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit()) => ClockLevel::Mhz(word.parse().ok()?),
            _ => return None,
        })
    }

    /// The clock to set among those the GPU supports (any order): low the lowest, high the highest, highm1 the next
    /// below it, medium the middle one (the upper of two), a frequency the closest one (the higher of two as close).
    /// `None` when the GPU lists none.
    pub fn pick(self, supported: &[u32]) -> Option<u32> {
        let mut clocks = supported.to_vec();
        clocks.sort_unstable_by(|a, b| b.cmp(a));
        clocks.dedup();
        let last = clocks.len().checked_sub(1)?;
        Some(match self {
            ClockLevel::High => clocks[0],
            ClockLevel::HighM1 => clocks[1.min(last)],
            ClockLevel::Medium => clocks[last / 2],
            ClockLevel::Low => clocks[last],
            ClockLevel::Mhz(mhz) => *clocks.iter().min_by_key(|c| c.abs_diff(mhz)).expect("not empty"),
        })
    }
}

impl std::fmt::Display for ClockLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClockLevel::Low => f.write_str("low"),
            ClockLevel::Medium => f.write_str("medium"),
            ClockLevel::High => f.write_str("high"),
            ClockLevel::HighM1 => f.write_str("highm1"),
            ClockLevel::Mhz(mhz) => write!(f, "{mhz}"),
        }
    }
}

impl GpuFreq {
    /// Reads the option's value: comma-separated `LEVEL`, `memory=LEVEL` and `verbose`, a later one of a kind
    /// replacing an earlier one (as Slurm accepts `1,2`). Nothing else: Slurm refuses `graphics=` and `HIGH`.
    pub fn parse(text: &str) -> Result<GpuFreq, InvalidGpuFreq> {
        let mut freq = GpuFreq::default();
        for word in text.split(',') {
            match word.strip_prefix("memory=") {
                _ if word == "verbose" => freq.verbose = true,
                Some(level) => freq.memory = Some(ClockLevel::parse(level).ok_or(InvalidGpuFreq(text.to_string()))?),
                None => freq.graphics = Some(ClockLevel::parse(word).ok_or(InvalidGpuFreq(text.to_string()))?),
            }
        }
        if freq.graphics.is_none() && freq.memory.is_none() && !freq.verbose {
            return Err(InvalidGpuFreq(text.to_string()));
        }
        Ok(freq)
    }
}

/// As the user would write it (`SLURM_GPU_FREQ`; `scontrol show job` prefixes `gpu:`): graphics, memory, verbose.
impl std::fmt::Display for GpuFreq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut words: Vec<String> = Vec::new();
        words.extend(self.graphics.map(|g| g.to_string()));
        words.extend(self.memory.map(|m| format!("memory={m}")));
        if self.verbose {
            words.push("verbose".to_string());
        }
        f.write_str(&words.join(","))
    }
}

/// A memory request, in MiB (Slurm's M). Each form is per node once resolved against the node's share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemRequest {
    /// `--mem=N`; `--mem=0` asks for all of each node's memory.
    PerNode(u64),
    /// `--mem-per-cpu=N`: times the CPUs the job gets on the node.
    PerCpu(u64),
    /// `--mem-per-gpu=N`: times the GPUs the job gets on the node.
    PerGpu(u64),
}

impl MemRequest {
    /// MiB on one node holding `cpus` CPUs and `gpus` GPUs of the job, whose memory is `node_mb`.
    pub fn on_node(self, cpus: u32, gpus: u32, node_mb: u64) -> u64 {
        match self {
            MemRequest::PerNode(0) => node_mb,
            MemRequest::PerNode(mb) => mb,
            MemRequest::PerCpu(mb) => mb.saturating_mul(u64::from(cpus)),
            MemRequest::PerGpu(mb) => mb.saturating_mul(u64::from(gpus)),
        }
    }

    /// As Slurm prints it in `ReqMem` and `scontrol show job` (`MinMemoryNode=4G`).
    pub fn describe(self) -> String {
        let (mb, per) = match self {
            MemRequest::PerNode(mb) => (mb, "Node"),
            MemRequest::PerCpu(mb) => (mb, "CPU"),
            MemRequest::PerGpu(mb) => (mb, "GPU"),
        };
        format!("MinMemory{per}={}", format_mb(mb))
    }
}

/// MiB as Slurm prints sizes: `512M`, `4G`, `1.50T`.
pub fn format_mb(mb: u64) -> String {
    if mb >= 1 << 20 && mb.is_multiple_of(1 << 20) {
        format!("{}T", mb >> 20)
    } else if mb >= 1 << 10 && mb.is_multiple_of(1 << 10) {
        format!("{}G", mb >> 10)
    } else if mb >= 1 << 10 {
        format!("{:.2}G", mb as f64 / 1024.0)
    } else {
        format!("{mb}M")
    }
}

/// `--signal=[{R|B}:]SIG[@secs]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarnSignal {
    pub signal: i32,
    /// How long before the end it is sent (Slurm's default: 60 s).
    pub before_s: u32,
    /// `B:`: only the batch shell is signalled (Slurm's default: every step, not the batch shell).
    pub batch_only: bool,
    /// `R:` (reservation end); accepted and treated like the time limit.
    pub reservation: bool,
}

/// A checkpoint a job recorded (`drover checkpoint record PATH`, or the marker file): where, which step, and
/// which incarnation wrote it. The next incarnation starts with `DROVER_RESUME_FROM` = `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub path: String,
    pub step: Option<u64>,
    pub incarnation: u64,
    /// When it was recorded (the leader's stamp).
    pub time_ms: u64,
}

/// How one incarnation of a job ended, for `scontrol show job` and `sacct -D` (the newest last; bounded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncarnationRecord {
    pub incarnation: u64,
    pub start_ms: Option<u64>,
    pub end_ms: u64,
    /// Its nodes, as a hostlist.
    pub nodes: String,
    /// NODE_FAIL, PREEMPTED or REQUEUED.
    pub state: JobState,
    pub reason: String,
    /// The checkpoint it started from (`DROVER_RESUME_FROM`), if any.
    pub resumed_from: Option<String>,
    /// GPUs it held when it ended (for goodput: GPU time allocated and lost). 0 in records written before it was
    /// kept, which therefore count no GPU time.
    #[serde(default)]
    pub gpus: u32,
    /// When it recorded its own latest checkpoint (the leader's stamp), if it recorded any: the progress after it
    /// was lost with the incarnation (see `goodput`).
    #[serde(default)]
    pub last_checkpoint_ms: Option<u64>,
}

/// How many incarnations `Job::history` keeps.
pub const MAX_HISTORY: usize = 32;

/// Why a running job is being stopped to be requeued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequeueKind {
    /// `scontrol requeue` / `requeuehold` (by its owner, from inside the job, or by an operator).
    Requested,
    /// A higher-priority job needs its GPUs (PreemptMode=REQUEUE).
    Preempted,
    /// Its node failed: a GPU fault, a fence, a lost node. Counts towards the cluster's requeue limit.
    NodeFailure,
    /// No progress within its `--progress-timeout`. Counts towards the requeue limit.
    Hung,
    /// It failed right after resuming from a checkpoint, which is now marked bad: restarted from the one before.
    /// Counts towards the requeue limit.
    Fallback,
}

impl RequeueKind {
    /// The state the ended incarnation is recorded with.
    pub fn state(self) -> JobState {
        match self {
            RequeueKind::Requested => JobState::Requeued,
            RequeueKind::Preempted => JobState::Preempted,
            RequeueKind::NodeFailure => JobState::NodeFail,
            RequeueKind::Hung => JobState::Requeued,
            RequeueKind::Fallback => JobState::Failed,
        }
    }

    /// Whether it is a failure (counted towards `max_batch_requeue`), not a request or a preemption.
    pub fn is_failure(self) -> bool {
        matches!(self, RequeueKind::NodeFailure | RequeueKind::Hung | RequeueKind::Fallback)
    }
}

/// A running job told to end and go back to the queue once its tasks are gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequeueOrder {
    pub kind: RequeueKind,
    /// `requeuehold`: back in the queue held; by an operator for someone else's job, an administrator's hold.
    pub hold: Option<PendingReason>,
    pub reason: String,
    /// For a preemption: the job whose start it makes room for.
    #[serde(default)]
    pub preempted_for: Option<JobId>,
    /// The nodes the failure is charged to: the next incarnation avoids them (see [`Resilience::avoid_nodes`]).
    #[serde(default)]
    pub blame: Vec<String>,
}

/// What a `--dependency` entry waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DependencyKind {
    /// `after`: the target started (or ended).
    After,
    /// `afterok`: the target completed with exit code 0.
    AfterOk,
    /// `afterany`: the target ended, however.
    AfterAny,
    /// `afternotok`: the target ended in a failed state (non-zero exit, cancelled, timeout, node failure).
    AfterNotOk,
    /// `singleton`: no other job of this user with this name is running or ahead in the queue.
    Singleton,
}

impl DependencyKind {
    pub fn name(self) -> &'static str {
        match self {
            DependencyKind::After => "after",
            DependencyKind::AfterOk => "afterok",
            DependencyKind::AfterAny => "afterany",
            DependencyKind::AfterNotOk => "afternotok",
            DependencyKind::Singleton => "singleton",
        }
    }
}

/// One `--dependency` entry: `afterok:123` (every task of array 123, or job 123), `afterok:123_4` (one task).
/// `job` is 0 for `singleton`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: DependencyKind,
    pub job: JobId,
    pub task: Option<u32>,
}

/// `--array=0-99:2%8`: the task ids (sorted, unique) and how many may run at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ArraySpec {
    pub task_ids: ThinVec<u32>,
    pub max_running: Option<u32>,
}

/// Bounds on the parts of a spec that the script and environment limits do not cover: names, paths, lists.
/// Generous for real use; they exist so a malformed or hostile request is a clear error, not a huge record.
pub const MAX_NAME_BYTES: usize = 1_024;
pub const MAX_PATH_BYTES: usize = 4_096;
pub const MAX_LIST_ITEMS: usize = 4_096;
pub const MAX_SCRIPT_ARGS_BYTES: usize = 1 << 20;
/// Sizes beyond any cluster: a job of more nodes, tasks or GPUs than this is a typo or an attack.
pub const MAX_NODES_PER_JOB: u32 = 100_000;
pub const MAX_TASKS_PER_JOB: u32 = 10_000_000;
pub const MAX_PER_TASK_OR_NODE: u32 = 100_000;

/// Which bound of [`JobSpec::check_bounds`] a request breaks, naming the field as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutOfBounds {
    #[error("{field}={value} is over the limit of {max}")]
    Count { field: &'static str, value: u32, max: u32 },
    #[error("{field} is {bytes} bytes, over the limit of {max}")]
    Bytes { field: &'static str, bytes: usize, max: usize },
    #[error("{field} contains a NUL byte")]
    Nul { field: &'static str },
    #[error("{field} names {entries} entries, over the limit of {MAX_LIST_ITEMS}")]
    Entries { field: &'static str, entries: usize },
    #[error("the script's arguments are {bytes} bytes in {items} items, over the limits")]
    ScriptArgs { bytes: usize, items: usize },
    #[error("the submit environment holds a variable with an empty name, '=' in its name, or a NUL byte")]
    Environment,
    #[error(transparent)]
    Container(#[from] crate::container::ContainerError),
}

impl JobSpec {
    /// Checks every string and list against the bounds above, naming the field that is too large.
    pub fn check_bounds(&self) -> Result<(), OutOfBounds> {
        let count = |field: &'static str, value: u32, max: u32| {
            if value > max { Err(OutOfBounds::Count { field, value, max }) } else { Ok(()) }
        };
        count("--nodes (minimum)", self.min_nodes, MAX_NODES_PER_JOB)?;
        count("--nodes (maximum)", self.max_nodes, MAX_NODES_PER_JOB)?;
        count("--ntasks", self.ntasks.unwrap_or(0), MAX_TASKS_PER_JOB)?;
        count("--ntasks-per-node", self.ntasks_per_node.unwrap_or(0), MAX_PER_TASK_OR_NODE)?;
        count("--cpus-per-task", self.cpus_per_task, MAX_PER_TASK_OR_NODE)?;
        count("GPUs per node", self.gpus_per_node, MAX_PER_TASK_OR_NODE)?;
        count("--gpus", self.gpus_total.unwrap_or(0), MAX_TASKS_PER_JOB)?;
        count("--gpus-per-task", self.gpus_per_task.unwrap_or(0), MAX_PER_TASK_OR_NODE)?;
        let text = |field: &'static str, value: &str, max: usize| {
            if value.len() > max {
                return Err(OutOfBounds::Bytes { field, bytes: value.len(), max });
            }
            if value.contains('\0') {
                return Err(OutOfBounds::Nul { field });
            }
            Ok(())
        };
        let opt = |field: &'static str, value: &Option<ThinStr>, max: usize| {
            value.as_deref().map_or(Ok(()), |v| text(field, v, max))
        };
        text("--job-name", &self.name, MAX_NAME_BYTES)?;
        text("user", &self.user, MAX_NAME_BYTES)?;
        text("--chdir", &self.work_dir, MAX_PATH_BYTES)?;
        text("submit directory", &self.submit_dir, MAX_PATH_BYTES)?;
        opt("--partition", &self.partition, MAX_NAME_BYTES)?;
        opt("--account", &self.account, MAX_NAME_BYTES)?;
        opt("--output", &self.stdout, MAX_PATH_BYTES)?;
        opt("--error", &self.stderr, MAX_PATH_BYTES)?;
        opt("--gres type", &self.gpu_type, MAX_NAME_BYTES)?;
        opt("--qos", &self.qos, MAX_NAME_BYTES)?;
        opt("--reservation", &self.reservation, MAX_NAME_BYTES)?;
        opt("--wckey", &self.wckey, MAX_NAME_BYTES)?;
        opt("--comment", &self.comment, MAX_PATH_BYTES)?;
        for (field, list) in
            [("--constraint", &self.constraint), ("--nodelist", &self.nodelist), ("--exclude", &self.exclude)]
        {
            if list.len() > MAX_LIST_ITEMS {
                return Err(OutOfBounds::Entries { field, entries: list.len() });
            }
            for item in list.iter() {
                text(field, item, MAX_NAME_BYTES)?;
            }
        }
        let args: usize = self.script_args.iter().map(|a| a.len() + 1).sum();
        if self.script_args.len() > MAX_LIST_ITEMS || args > MAX_SCRIPT_ARGS_BYTES {
            return Err(OutOfBounds::ScriptArgs { bytes: args, items: self.script_args.len() });
        }
        if let ExportPolicy::Vars { names, .. } = &self.export
            && names.len() > MAX_LIST_ITEMS
        {
            return Err(OutOfBounds::Entries { field: "--export", entries: names.len() });
        }
        if self.environment.iter().any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0')) {
            return Err(OutOfBounds::Environment);
        }
        if let Some(container) = &self.container {
            container.validate()?;
        }
        Ok(())
    }

    /// Whether a node passes the job's `--nodelist`, `--exclude` and `--constraint` (not its size).
    pub fn accepts_node(&self, name: &str, features: &[String]) -> bool {
        (self.nodelist.is_empty() || self.nodelist.iter().any(|n| n == name))
            && !self.exclude.iter().any(|n| n == name)
            && self.constraint.iter().all(|c| features.iter().any(|f| f == c))
    }

    /// Total tasks the job will run (Slurm: `ntasks`, else `ntasks-per-node × nodes`, else one per node).
    pub fn total_tasks(&self) -> u32 {
        match (self.ntasks, self.ntasks_per_node) {
            (Some(n), _) => n,
            (None, Some(per_node)) => per_node.saturating_mul(self.min_nodes.max(1)),
            (None, None) => self.min_nodes.max(1),
        }
    }

    /// The memory request in force: `--exclusive` without one takes each node's whole memory, as in Slurm.
    pub fn mem_request(&self) -> Option<MemRequest> {
        self.mem.or(self.exclusive.then_some(MemRequest::PerNode(0)))
    }

    /// Total GPUs on the minimum node count (Slurm's `AllocTRES` gres/gpu).
    pub fn total_gpus(&self) -> u32 {
        self.gpus_per_node.saturating_mul(self.min_nodes.max(1))
    }

    /// The submit-time variables `--export` lets through: all, none, or the named ones (`NAME=value` entries
    /// set a value of their own).
    pub fn exported_environment(&self) -> Vec<(String, String)> {
        match &self.export {
            ExportPolicy::All => self.environment.to_vec(),
            ExportPolicy::None => Vec::new(),
            ExportPolicy::Vars { all, names } => {
                let mut vars: Vec<(String, String)> = if *all { self.environment.to_vec() } else { Vec::new() };
                for name in names {
                    match name.split_once('=') {
                        Some((k, v)) => vars.push((k.to_string(), v.to_string())),
                        None => {
                            if let Some(pair) = self.environment.iter().find(|(k, _)| k == name) {
                                vars.push(pair.clone());
                            }
                        }
                    }
                }
                vars
            }
        }
    }

    /// Tasks on each of `nodes` nodes, Slurm's block distribution: `--ntasks-per-node` each, else the total
    /// spread as evenly as possible with the first nodes taking the remainder.
    pub fn tasks_per_node(&self, nodes: u32) -> Vec<u32> {
        let nodes = nodes.max(1);
        if let Some(per_node) = self.ntasks_per_node {
            return vec![per_node; nodes as usize];
        }
        let total = self.total_tasks().max(nodes);
        (0..nodes).map(|i| total / nodes + u32::from(i < total % nodes)).collect()
    }

    /// The most tasks any one of `nodes` nodes runs (the first node's, in block distribution), without listing
    /// every node: a request for billions of nodes must cost nothing to refuse.
    pub fn max_tasks_per_node(&self, nodes: u32) -> u32 {
        let nodes = nodes.max(1);
        match self.ntasks_per_node {
            Some(per_node) => per_node,
            None => self.total_tasks().max(nodes).div_ceil(nodes),
        }
    }
}

/// Slurm's job state names, with the same meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub enum JobState {
    #[default]
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

/// A job as the replicated state holds it. The script text is *not* here: it is stored once, beside the job,
/// so that the in-memory state of a million pending jobs stays small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Job {
    pub id: JobId,
    /// The spec with `script` emptied (kept in the script table).
    pub spec: JobSpec,
    /// The partition resolved at submit time (the spec's, or the default).
    pub partition: CompactString,
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
    pub nodes: ThinVec<String>,
    /// Who cancelled it, for `scontrol show job`'s reason line.
    pub cancelled_by: Option<u32>,
    /// Per node: the GPUs, CPUs and tasks of the current incarnation (empty while pending).
    #[serde(default)]
    pub allocation: ThinVec<NodeAllocation>,
    /// Set when the job was told to end (cancel) while its tasks still run; the final state once they are gone.
    #[serde(default)]
    pub ending: Option<JobState>,
    /// Resources the batch task used, from its supervisor's rusage (the batch node only; kept for the record).
    #[serde(default)]
    pub usage: Usage,
    /// What the current (or last) incarnation's tasks used on each node, as the job's cgroup there measured it
    /// (sacct's `TotalCPU`, `MaxRSS`, `TRESUsageIn*`). At most one entry per node of the allocation; a node that
    /// measured nothing (no cgroup there) has none, so the figures stay empty rather than invented.
    #[serde(default)]
    pub node_usage: ThinVec<NodeUsage>,
    /// The next `srun` step id within the job.
    #[serde(default)]
    pub next_step_id: u32,
    /// The current incarnation's `srun` steps, oldest first (at most [`MAX_STEP_RECORDS`]: the oldest ended ones
    /// give way), for sacct's `123.0` rows.
    #[serde(default)]
    pub steps: ThinVec<StepRecord>,
    /// Why the last incarnation failed to launch, or what the agent said about the end.
    #[serde(default)]
    pub message: Option<ThinStr>,
    /// The account charged (the spec's, else the user's default) and the QOS, resolved at submit.
    #[serde(default)]
    pub account: CompactString,
    #[serde(default)]
    pub qos: CompactString,
    /// Set for a task of a job array.
    #[serde(default)]
    pub array: Option<Box<ArrayTask>>,
    /// Per entry of `spec.dependency`, as far as `apply` knows (singletons are judged by the scheduler).
    #[serde(default)]
    pub dependency_state: ThinVec<DepState>,
    /// `scontrol top`: the latest top wins among the owner's jobs (0 = never topped).
    #[serde(default)]
    pub top_rank: u64,
    /// Set while a running job is being stopped to be requeued (requeue, preemption, GPU fault).
    #[serde(default)]
    pub requeue: Option<Box<RequeueOrder>>,
    /// The latest checkpoint recorded, by any incarnation.
    #[serde(default)]
    pub checkpoint: Option<Box<Checkpoint>>,
    /// Where incarnations keep their checkpoints (`DROVER_CHECKPOINT_DIR` is `ROOT/JOBID/INCARNATION`), resolved
    /// at submit from the partition's or the cluster's `checkpoint_dir`.
    #[serde(default)]
    pub checkpoint_root: CompactString,
    /// How earlier incarnations ended (the newest last).
    #[serde(default)]
    pub history: ThinVec<IncarnationRecord>,
    /// Requeues caused by failures (node loss, fences, GPU faults), checked against `max_batch_requeue`.
    #[serde(default)]
    pub failures: u32,
    /// The goodput of incarnations that no longer fit in `history` (beyond [`MAX_HISTORY`]), so the job's figures
    /// stay whole (see `goodput::of_job`). `None` until a job's history first overflows, which few ever do: boxed,
    /// the field costs every other job one word instead of seven. (Records written before it was optional hold the
    /// sums inline, which decode as `Some`.)
    #[serde(default)]
    pub dropped_goodput: Option<Box<crate::model::goodput_totals::GoodputTotals>>,
    /// `scontrol suspend` of this incarnation (rare: boxed, one word when never suspended).
    #[serde(default)]
    pub suspension: Option<Box<Suspension>>,
    /// Hang detection, checkpoint fallback and the nodes to avoid (boxed: one word for jobs that use none).
    #[serde(default)]
    pub resilience: Option<Box<Resilience>>,
}

/// The last progress a job's incarnation reported (`drover progress`, a checkpoint record, the marker file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub incarnation: u64,
    /// The leader's stamp of the report.
    pub time_ms: u64,
    /// The training step it named, if any.
    pub step: Option<u64>,
}

/// How many earlier checkpoints a job keeps besides its latest, to fall back to when the latest proves bad.
pub const MAX_EARLIER_CHECKPOINTS: usize = 3;
/// How many checkpoint paths a job remembers as bad.
pub const MAX_BAD_CHECKPOINTS: usize = 8;
/// How many nodes a requeued job avoids (those its failed incarnation ran on).
pub const MAX_AVOID_NODES: usize = 64;

/// What a job carries for surviving hangs, bad checkpoints and bad nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Resilience {
    /// The progress timeout in force (the job's, its QOS's, its partition's or the cluster's), in seconds.
    pub progress_timeout_s: Option<u64>,
    /// The current incarnation's latest progress.
    pub progress: Option<Progress>,
    /// Checkpoints recorded before `Job::checkpoint`, newest first (at most [`MAX_EARLIER_CHECKPOINTS`]).
    pub earlier_checkpoints: Vec<Checkpoint>,
    /// Checkpoint paths found bad (an incarnation failed right after resuming from one, or `drover checkpoint
    /// invalidate`): never resumed from again.
    pub bad_checkpoints: Vec<String>,
    /// The nodes the last failed incarnation ran on: the scheduler places the next one elsewhere unless no other
    /// nodes could ever hold it.
    pub avoid_nodes: Vec<String>,
}

/// A job's suspensions (`scontrol suspend`/`resume`) in its current incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Suspension {
    /// Since when its tasks are stopped (it stays RUNNING inside, holding its allocation and taking reports, and
    /// shows as SUSPENDED); `None` once resumed.
    pub since_ms: Option<u64>,
    /// Time spent suspended before: the time limit ends that much later.
    pub total_ms: u64,
}

/// One task of a job array. The tasks of array `A` hold the consecutive job ids `A .. A + task_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array's job id (its first task's id): `SLURM_ARRAY_JOB_ID`, the `123` of `123_4`.
    pub array_job_id: JobId,
    /// `SLURM_ARRAY_TASK_ID`, the `4` of `123_4`.
    pub task_id: u32,
    pub task_count: u32,
    /// Lowest and highest task id (`SLURM_ARRAY_TASK_MIN/MAX`).
    pub task_min: u32,
    pub task_max: u32,
    /// `%N`: at most this many tasks run at once.
    pub max_running: Option<u32>,
}

/// Where one dependency stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum DepState {
    #[default]
    Waiting,
    Satisfied,
    /// It can never hold (afterok on a failed job): the job stays pending with `DependencyNeverSatisfied`.
    Never,
}

impl Job {
    /// The id users see: `123_4` for an array task, else `123`.
    pub fn display_id(&self) -> String {
        match &self.array {
            Some(a) => format!("{}_{}", a.array_job_id, a.task_id),
            None => self.id.to_string(),
        }
    }

    /// The account the job charges. Records written before format 2 did not resolve it: theirs is the spec's
    /// `--account`, else root, as the scheduler then treated them.
    pub fn account_name(&self) -> &str {
        match (self.account.as_str(), &self.spec.account) {
            ("", Some(asked)) => asked,
            ("", None) => crate::model::account::ROOT_ACCOUNT,
            (resolved, _) => resolved,
        }
    }

    /// The job's QOS (`normal` for records written before format 2).
    pub fn qos_name(&self) -> &str {
        if self.qos.is_empty() { crate::model::qos::DEFAULT_QOS } else { &self.qos }
    }

    /// Where the job's script is stored: once per array, under the array's id.
    pub fn script_id(&self) -> JobId {
        self.array.as_ref().map_or(self.id, |a| a.array_job_id)
    }

    /// Whether the job ended the way `afterok` waits for.
    pub fn succeeded(&self) -> bool {
        self.state == JobState::Completed && self.exit_code == 0 && self.exit_signal == 0
    }

    /// GPUs held on all nodes (`AllocTRES` gres/gpu).
    pub fn allocated_gpus(&self) -> usize {
        self.allocation.iter().map(|a| a.gpus.len()).sum()
    }

    /// CPUs held on all nodes.
    pub fn allocated_cpus(&self) -> u32 {
        self.allocation.iter().map(|a| a.cpus).sum()
    }

    /// Memory held on all nodes, in MiB.
    pub fn allocated_mem_mb(&self) -> u64 {
        self.allocation.iter().map(|a| a.mem_mb).sum()
    }

    /// Whether its tasks must be stopped now (cancelled, or to be requeued).
    pub fn stopping(&self) -> bool {
        self.ending.is_some() || self.requeue.is_some()
    }

    /// The state users see: SUSPENDED while `scontrol suspend` holds a running job's tasks stopped.
    pub fn shown_state(&self) -> JobState {
        if self.state == JobState::Running && self.suspended_since().is_some() {
            JobState::Suspended
        } else {
            self.state
        }
    }

    /// Since when it is suspended, if it is.
    pub fn suspended_since(&self) -> Option<u64> {
        self.suspension.as_ref().and_then(|s| s.since_ms)
    }

    /// Time spent suspended and resumed since, in this incarnation (ms).
    pub fn suspended_total_ms(&self) -> u64 {
        self.suspension.as_ref().map_or(0, |s| s.total_ms)
    }

    /// When the time limit ends (ms), counting the time spent suspended; `None` without a limit or a start, or
    /// while suspended (the limit does not run then).
    pub fn limit_end_ms(&self) -> Option<u64> {
        if self.suspended_since().is_some() {
            return None;
        }
        let (limit_s, start_ms) = (self.time_limit_s?, self.start_time_ms?);
        Some(start_ms.saturating_add(limit_s.saturating_mul(1_000)).saturating_add(self.suspended_total_ms()))
    }

    /// Slurm's `Restarts`: a requeue counts from the moment it is ordered, as Slurm's does, though the next
    /// incarnation begins only once this one's tasks are gone.
    pub fn restarts(&self) -> u32 {
        self.restart_count + u32::from(self.requeue.is_some())
    }

    /// The checkpoint this incarnation resumes from: the newest good one, if an earlier incarnation recorded it
    /// (once the incarnation records its own, it resumes from nothing any more: what it loaded has proved itself).
    pub fn resume_from(&self) -> Option<&Checkpoint> {
        self.checkpoints().find(|c| !self.checkpoint_is_bad(&c.path)).filter(|c| c.incarnation < self.incarnation)
    }

    /// Every checkpoint the job keeps, newest first.
    pub fn checkpoints(&self) -> impl Iterator<Item = &Checkpoint> {
        let earlier = self.resilience.as_deref().map(|r| r.earlier_checkpoints.as_slice()).unwrap_or_default();
        self.checkpoint.as_deref().into_iter().chain(earlier)
    }

    /// Whether `path` was found bad (and is never resumed from).
    pub fn checkpoint_is_bad(&self, path: &str) -> bool {
        self.resilience.as_deref().is_some_and(|r| r.bad_checkpoints.iter().any(|b| b == path))
    }

    /// The progress timeout in force, in seconds.
    pub fn progress_timeout_s(&self) -> Option<u64> {
        self.resilience.as_deref().and_then(|r| r.progress_timeout_s)
    }

    /// The current incarnation's latest progress report, if it made one.
    pub fn progress(&self) -> Option<Progress> {
        self.resilience.as_deref().and_then(|r| r.progress).filter(|p| p.incarnation == self.incarnation)
    }

    /// When the current incarnation last showed progress: its latest report or checkpoint, else its start.
    pub fn last_progress_ms(&self) -> Option<u64> {
        let start = self.start_time_ms?;
        let checkpoint = self.incarnation_checkpoint_ms().unwrap_or(0);
        let report = self.progress().map_or(0, |p| p.time_ms);
        Some(start.max(checkpoint).max(report))
    }

    /// When a running job with a progress timeout counts as hung (`None`: no timeout, not running, or suspended).
    pub fn hung_at_ms(&self) -> Option<u64> {
        if self.state != JobState::Running || self.stopping() || self.suspended_since().is_some() {
            return None;
        }
        let timeout_s = self.progress_timeout_s()?;
        Some(self.last_progress_ms()?.saturating_add(timeout_s.saturating_mul(1_000)))
    }

    /// The nodes this job should not be placed on again (those its last failed incarnation ran on).
    pub fn avoid_nodes(&self) -> &[String] {
        self.resilience.as_deref().map(|r| r.avoid_nodes.as_slice()).unwrap_or_default()
    }

    /// The resilience record, created on first use.
    pub fn resilience_mut(&mut self) -> &mut Resilience {
        self.resilience.get_or_insert_default()
    }

    /// When the current incarnation recorded its latest checkpoint, if it recorded one itself.
    pub fn incarnation_checkpoint_ms(&self) -> Option<u64> {
        self.checkpoint.as_ref().filter(|c| c.incarnation == self.incarnation).map(|c| c.time_ms)
    }

    /// This incarnation's checkpoint directory (`DROVER_CHECKPOINT_DIR`).
    pub fn checkpoint_dir(&self) -> String {
        format!("{}/{}/{}", self.checkpoint_root.trim_end_matches('/'), self.id, self.incarnation)
    }

    /// CPU time of the job's tasks summed over the nodes that measured it, in ms (`TotalCPU`); `None` when no
    /// node did.
    pub fn measured_cpu_ms(&self) -> Option<u64> {
        self.node_usage.iter().filter_map(|n| n.usage.cpu_ms).reduce(u64::saturating_add)
    }

    /// The largest per-node memory peak, in KiB (`MaxRSS`).
    pub fn measured_max_rss_kb(&self) -> Option<u64> {
        self.node_usage.iter().filter_map(|n| n.usage.mem_peak_kb).max()
    }

    /// The per-node memory peaks added up, in KiB (`mem=` of `TRESUsageInTot`).
    pub fn measured_total_rss_kb(&self) -> Option<u64> {
        self.node_usage.iter().filter_map(|n| n.usage.mem_peak_kb).reduce(u64::saturating_add)
    }

    /// The mean of the per-node memory peaks, in KiB (`AveRSS`; Slurm averages over tasks, Drover measures nodes).
    pub fn measured_ave_rss_kb(&self) -> Option<u64> {
        let peaks: Vec<u64> = self.node_usage.iter().filter_map(|n| n.usage.mem_peak_kb).collect();
        let total = peaks.iter().copied().reduce(u64::saturating_add)?;
        Some(total / peaks.len() as u64)
    }

    /// The largest per-node CPU time, in ms (`cpu=` of `TRESUsageInMax`).
    pub fn measured_max_cpu_ms(&self) -> Option<u64> {
        self.node_usage.iter().filter_map(|n| n.usage.cpu_ms).max()
    }

    /// Records what `node` measured for the current incarnation, once: a node's later report (a retry) is
    /// ignored, and so is one from a node outside the allocation. True if recorded.
    pub fn record_node_usage(&mut self, node: &str, usage: MeasuredUsage) -> bool {
        if usage.is_empty() || !self.nodes.iter().any(|n| n == node) || self.node_usage.iter().any(|n| n.node == node) {
            return false;
        }
        self.node_usage.push(NodeUsage { node: node.to_string(), usage });
        true
    }
}

/// One node's share of a job's allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NodeAllocation {
    pub node: String,
    /// Concrete GPU indices on that node; never given to two jobs at once.
    pub gpus: Vec<u32>,
    pub cpus: u32,
    /// How many of the job's tasks run there (block distribution).
    pub tasks: u32,
    /// Memory reserved there, in MiB (0: none requested, or the node does not track memory).
    #[serde(default)]
    pub mem_mb: u64,
}

/// What a job's tasks consumed, summed over tasks (CPU) or the maximum (RSS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Usage {
    pub cpu_ms: u64,
    pub max_rss_kb: u64,
}

/// What a job's tasks on one node consumed, as the job's cgroup there counted it (every task and every process
/// they started, while the job ran on the node). A figure the node could not measure (no cgroup, or no
/// controller for it) is `None`, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MeasuredUsage {
    /// User plus system CPU time, in ms (cgroup v2 `cpu.stat` usage_usec, v1 `cpuacct.usage`).
    #[serde(default)]
    pub cpu_ms: Option<u64>,
    /// The cgroup's peak memory, in KiB (v2 `memory.peak` or the largest sample of `memory.current`, v1
    /// `memory.max_usage_in_bytes`).
    #[serde(default)]
    pub mem_peak_kb: Option<u64>,
}

impl MeasuredUsage {
    pub fn is_empty(&self) -> bool {
        self.cpu_ms.is_none() && self.mem_peak_kb.is_none()
    }
}

/// One node's [`MeasuredUsage`] of a job's incarnation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUsage {
    pub node: String,
    pub usage: MeasuredUsage,
}

/// How many step records a job keeps: a job that runs steps in a loop must not grow without bound.
pub const MAX_STEP_RECORDS: usize = 512;

/// One `srun` step of a job, as the controllers recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub id: u32,
    /// The program it ran.
    pub name: String,
    pub nodes: Vec<String>,
    pub tasks: u32,
    pub start_ms: u64,
    /// `None` while it runs, or when its `srun` never said (a step of a job that ended under it).
    #[serde(default)]
    pub end: Option<StepEnd>,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    pub end_ms: u64,
    pub exit_code: i32,
    pub signal: i32,
    pub cancelled: bool,
}

impl StepRecord {
    /// Slurm's state for the step: its own end if `srun` reported one; else running while the job runs, and
    /// cancelled with it once the job has ended (its tasks were killed with the job).
    pub fn state(&self, job_state: JobState) -> JobState {
        match self.end {
            Some(end) if end.cancelled => JobState::Cancelled,
            Some(end) if end.exit_code != 0 || end.signal != 0 => JobState::Failed,
            Some(_) => JobState::Completed,
            None if matches!(job_state, JobState::Running | JobState::Completing) => JobState::Running,
            None => JobState::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slurm 22.05's sbatch on this machine: `medium,memory=high`, `450`, `memory=low,verbose`, `1,2` and
    /// `high,verbose,memory=450` are accepted; `graphics=low`, `HIGH`, `bogus` and an empty value are refused with
    /// `Invalid --gpu-freq argument: gpu:VALUE`.
    #[test]
    fn gpu_freq_reads_what_slurm_reads_and_refuses_what_it_refuses() {
        use ClockLevel::*;
        let ok = |text: &str| GpuFreq::parse(text).unwrap();
        assert_eq!(ok("medium,memory=high"), GpuFreq { graphics: Some(Medium), memory: Some(High), verbose: false });
        assert_eq!(ok("450"), GpuFreq { graphics: Some(Mhz(450)), ..GpuFreq::default() });
        assert_eq!(ok("memory=low,verbose"), GpuFreq { memory: Some(Low), verbose: true, ..GpuFreq::default() });
        assert_eq!(ok("1,2").graphics, Some(Mhz(2)), "a later one of a kind wins");
        assert_eq!(ok("high,verbose,memory=450").to_string(), "high,memory=450,verbose");
        assert_eq!(ok("medium,memory=high").to_string(), "medium,memory=high");
        for bad in ["graphics=low", "HIGH", "bogus", "", "memory=", "high,,low", "99999999999"] {
            let err = GpuFreq::parse(bad).unwrap_err();
            assert_eq!(err.to_string(), format!("Invalid --gpu-freq argument: gpu:{bad}"));
        }
    }

    /// What each level picks among a GPU's supported clocks, in whatever order NVML lists them.
    #[test]
    fn a_clock_level_picks_among_the_supported_clocks() {
        use ClockLevel::*;
        let supported = [1410, 1980, 345, 1200, 1980];
        assert_eq!(High.pick(&supported), Some(1980));
        assert_eq!(HighM1.pick(&supported), Some(1410), "the next distinct clock below the highest");
        assert_eq!(Low.pick(&supported), Some(345));
        assert_eq!(Medium.pick(&supported), Some(1410), "the middle of 1980, 1410, 1200, 345: the upper one");
        assert_eq!(Mhz(1300).pick(&supported), Some(1200));
        assert_eq!(Mhz(1305).pick(&supported), Some(1410), "as close either way: the higher");
        assert_eq!(Mhz(9000).pick(&supported), Some(1980));
        assert_eq!(HighM1.pick(&[2619]), Some(2619), "one clock only: that one");
        assert_eq!(High.pick(&[]), None);
    }

    /// A replica holds every active job in memory, a million of them at the scale we promise (< 1 GiB each): the
    /// job's inline size is the bulk of that. Short names live inline (no heap block each); lists, optional strings
    /// and rarely set parts take one word each. A field added inline should be a decision, not an accident: this fails first.
    #[test]
    fn the_in_memory_job_stays_compact() {
        // 752 since `kill_on_invalid_dep`: the spec's flags had filled their word (8 bytes a job, under 1 % of a
        // replica's memory at a million jobs). 760 since `scontrol suspend`: one boxed word for a rare state
        // (unboxed, its time and total would have cost 24). 768 since `--gpu-freq`: one boxed word (the request
        // inline would have cost 16 more). 776 since `--container-image`: one boxed word (inline, the container's
        // options would cost over 100 bytes in every job, though few jobs of a million name an image). 792 since hang
        // detection: the request (`--progress-timeout`, 8 bytes in the spec: it travels in the submission) and one
        // boxed word for what the job keeps for hangs, checkpoint fallback and nodes to avoid (inline, over 100).
        assert!(std::mem::size_of::<Job>() <= 792, "Job is {} bytes", std::mem::size_of::<Job>());
        assert!(std::mem::size_of::<JobSpec>() <= 464, "JobSpec is {} bytes", std::mem::size_of::<JobSpec>());
        // A trivial job's names need no heap block of their own.
        let job = Job {
            spec: JobSpec { name: "wrap".into(), user: "alice".into(), work_dir: "/tmp".into(), ..JobSpec::default() },
            partition: "gpu".into(),
            account: "root".into(),
            qos: "normal".into(),
            checkpoint_root: "/shared/checkpoints".into(),
            ..Job::default()
        };
        for name in [&job.spec.name, &job.spec.user, &job.spec.work_dir, &job.partition, &job.qos, &job.checkpoint_root]
        {
            assert!(!name.is_heap_allocated(), "{name} is on the heap");
        }
    }
}
