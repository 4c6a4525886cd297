//! Slurm's output formats shared by the query commands: `squeue`'s `-o`/`-O` field specs, sizes (`4G`),
//! durations, timestamps and TRES strings, each as Slurm 22.05 prints them (client libraries parse these).

use drover_state::hostlist::compress_hostlist;
use drover_state::job::MemRequest;
use drover_state::slurm_time::{format_duration, format_time_limit};
use drover_state::{Job, JobState, PendingReason};

/// The Slurm release whose interface these commands copy: what `--version` prints and `scontrol show config`
/// reports as `SLURM_VERSION`, so tools that check the version see one whose formats they know.
pub const SLURM_VERSION: &str = "22.05.11";

/// `sinfo --version` and friends: `slurm 22.05.11`.
pub fn version_line() -> String {
    format!("slurm {SLURM_VERSION}")
}

/// How long a finished job stays visible to `squeue` (Slurm's `MinJobAge` default, 300 s).
pub const MIN_JOB_AGE_MS: u64 = 300_000;

/// `squeue`'s default format.
pub const SQUEUE_DEFAULT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

/// Slurm's `convert_num_unit` with `CONVERT_NUM_UNIT_EXACT`, which every command here uses: `value` in the unit
/// `unit` (0 = none, 1 = K, 2 = M, ...) goes up a unit while it stays a multiple of half the next one, so 4096M
/// is `4G`, 1536M is `1.50G` and 4000M stays `4000M`.
pub fn convert_num_unit(value: u64, unit: usize) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    if value == 0 {
        return "0".to_string();
    }
    let mut num = value as f64;
    let mut unit = unit.min(UNITS.len() - 1);
    while num >= 1024.0 && (num as u64).is_multiple_of(512) && unit + 1 < UNITS.len() {
        num /= 1024.0;
        unit += 1;
    }
    if num.fract() == 0.0 { format!("{}{}", num as u64, UNITS[unit]) } else { format!("{num:.2}{}", UNITS[unit]) }
}

/// MiB as Slurm prints memory (`MinMemoryNode=4G`, `ReqMem`, `mem=` in TRES strings).
pub fn mem_mb(mb: u64) -> String {
    convert_num_unit(mb, 2)
}

/// Slurm's `secs2time_str` (sacct's `Elapsed`, `scontrol`'s `RunTime`): always `HH:MM:SS`, `D-HH:MM:SS` past a day.
/// (`squeue` and `sinfo` print the shorter `M:SS` form, [`format_duration`].)
pub fn clock(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, (secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    if d > 0 { format!("{d}-{h:02}:{m:02}:{s:02}") } else { format!("{h:02}:{m:02}:{s:02}") }
}

/// A time limit as `sacct` prints it: [`clock`] or `UNLIMITED`.
pub fn clock_limit(limit: Option<u64>) -> String {
    limit.map_or_else(|| "UNLIMITED".to_string(), clock)
}

/// Slurm's timestamp format (`2026-12-02T10:15:00`, local time), or `N/A` (squeue's word for none).
pub fn format_timestamp(ms: Option<u64>) -> String {
    timestamp_or(ms, "N/A")
}

/// A timestamp, or `Unknown` for none (what `slurm_make_time_str` prints for 0: sacct's `Start`/`End`,
/// scontrol's `StartTime=`/`EndTime=`).
pub fn timestamp_or_unknown(ms: Option<u64>) -> String {
    timestamp_or(ms, "Unknown")
}

fn timestamp_or(ms: Option<u64>, none: &str) -> String {
    ms.and_then(drover_common::wall::local_iso).unwrap_or_else(|| none.into())
}

/// Time the job has run (or ran).
pub fn elapsed_s(job: &Job, now_ms: u64) -> u64 {
    match (job.start_time_ms, job.end_time_ms) {
        (Some(start), Some(end)) => end.saturating_sub(start) / 1000,
        (Some(start), None) => now_ms.saturating_sub(start) / 1000,
        _ => 0,
    }
}

/// A job's trackable resources (Slurm's TRES), requested or allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tres {
    pub cpu: u64,
    pub mem_mb: u64,
    pub node: u64,
    pub gpus: u64,
}

impl Tres {
    /// What the job asked for (sacct's `ReqTRES`, `ReqMem`; `scontrol show job`'s `TRES=` while pending).
    pub fn requested(job: &Job) -> Tres {
        let spec = &job.spec;
        let node = u64::from(spec.min_nodes.max(1));
        let cpu = u64::from(spec.total_tasks()).saturating_mul(u64::from(spec.cpus_per_task.max(1)));
        let gpus = u64::from(spec.gpus_total.unwrap_or_else(|| spec.total_gpus()));
        let mem_mb = match spec.mem_request() {
            // `--mem=0` (and `--exclusive`) take each node's memory, known only once placed.
            Some(MemRequest::PerNode(0)) | None => 0,
            Some(MemRequest::PerNode(mb)) => mb.saturating_mul(node),
            Some(MemRequest::PerCpu(mb)) => mb.saturating_mul(cpu),
            Some(MemRequest::PerGpu(mb)) => mb.saturating_mul(gpus),
        };
        Tres { cpu, mem_mb, node, gpus }
    }

    /// What the job holds (sacct's `AllocTRES`), or `None` before it has nodes.
    pub fn allocated(job: &Job) -> Option<Tres> {
        if job.nodes.is_empty() {
            return None;
        }
        Some(Tres {
            cpu: u64::from(job.allocated_cpus()),
            mem_mb: job.allocated_mem_mb(),
            node: job.nodes.len() as u64,
            gpus: job.allocated_gpus() as u64,
        })
    }

    /// The allocation once there is one, else the request (Slurm's `tres_alloc_str ?: tres_req_str`).
    pub fn current(job: &Job) -> Tres {
        Tres::allocated(job).unwrap_or_else(|| Tres::requested(job))
    }

    /// As sacct prints TRES: sorted by name, billing (the CPU count, without `TRESBillingWeights`) included,
    /// zero counts left out: `billing=8,cpu=8,gres/gpu=2,mem=32G,node=1`.
    pub fn by_name(&self) -> String {
        let mut parts = vec![format!("billing={}", self.cpu), format!("cpu={}", self.cpu)];
        if self.gpus > 0 {
            parts.push(format!("gres/gpu={}", self.gpus));
        }
        if self.mem_mb > 0 {
            parts.push(format!("mem={}", mem_mb(self.mem_mb)));
        }
        parts.push(format!("node={}", self.node));
        parts.join(",")
    }

    /// As slurmctld prints TRES (`scontrol show job`'s `TRES=`, squeue's `tres-alloc`): in TRES id order, cpu,
    /// mem, node, then GRES: `cpu=8,mem=32G,node=1,gres/gpu=2`. (Slurm puts `billing=` after `node=`; Drover
    /// leaves it out here, see the module's tests.)
    pub fn by_id(&self) -> String {
        let mut parts = vec![format!("cpu={}", self.cpu)];
        if self.mem_mb > 0 {
            parts.push(format!("mem={}", mem_mb(self.mem_mb)));
        }
        parts.push(format!("node={}", self.node));
        if self.gpus > 0 {
            parts.push(format!("gres/gpu={}", self.gpus));
        }
        parts.join(",")
    }
}

/// The job's `--gres`/`--gpus-per-node` as Slurm 22.05 stores it (`TresPerNode=`, squeue's `%b`):
/// `gres:gpu:4` or `gres:gpu:h200:4`; `None` when it asked for GPUs another way (or none).
pub fn tres_per_node(job: &Job) -> Option<String> {
    let spec = &job.spec;
    if spec.gpus_per_node == 0 || spec.gpus_total.is_some() || spec.gpus_per_task.is_some() {
        return None;
    }
    Some(gres_text(spec.gpu_type.as_deref(), spec.gpus_per_node))
}

/// `--gpus=N` (`TresPerJob=`).
pub fn tres_per_job(job: &Job) -> Option<String> {
    job.spec.gpus_total.map(|n| gres_text(job.spec.gpu_type.as_deref(), n))
}

/// `--gpus-per-task=N` (`TresPerTask=`).
pub fn tres_per_task(job: &Job) -> Option<String> {
    job.spec.gpus_per_task.map(|n| gres_text(job.spec.gpu_type.as_deref(), n))
}

fn gres_text(gpu_type: Option<&str>, count: u32) -> String {
    match gpu_type {
        Some(t) => format!("gres:gpu:{t}:{count}"),
        None => format!("gres:gpu:{count}"),
    }
}

/// `--mem-per-gpu` as Slurm shows it (`MemPerTres=gres:gpu:4096`, squeue's `mem-per-tres`).
pub fn mem_per_tres(job: &Job) -> Option<String> {
    match job.spec.mem {
        Some(MemRequest::PerGpu(mb)) => Some(format!("gres:gpu:{mb}")),
        _ => None,
    }
}

/// The per-node (or per-CPU) memory request, as squeue's `%m` and scontrol's `MinMemory*=` give it (in MiB,
/// 0 when none or when it is per GPU).
pub fn min_memory_mb(job: &Job) -> (u64, &'static str) {
    match job.spec.mem_request() {
        Some(MemRequest::PerNode(mb)) => (mb, "Node"),
        Some(MemRequest::PerCpu(mb)) => (mb, "CPU"),
        Some(MemRequest::PerGpu(_)) | None => (0, "Node"),
    }
}

/// Every job state Slurm 22.05 names, in the order its error messages list them.
pub const SLURM_JOB_STATES: [&str; 24] = [
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "COMPLETING",
    "CONFIGURING",
    "RESIZING",
    "RESV_DEL_HOLD",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "REVOKED",
    "SIGNALING",
    "SPECIAL_EXIT",
    "STAGE_OUT",
    "STOPPED",
];

/// The compact codes of [`SLURM_JOB_STATES`], in the same order.
const SLURM_JOB_STATE_CODES: [&str; 24] = [
    "PD", "R", "S", "CD", "CA", "F", "TO", "NF", "PR", "BF", "DL", "OOM", "CG", "CF", "RS", "RD", "RQ", "RF", "RH",
    "RV", "SI", "SE", "SO", "ST",
];

/// A job state as `squeue -t`, `sacct -s` and `scancel -t` take it: any of Slurm's, by long name or code, in any
/// case. `None` inside: a state Slurm has and Drover never enters (`BOOT_FAIL`, `DEADLINE`, ...), which matches
/// no job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlurmState(pub Option<JobState>);

impl SlurmState {
    pub fn parse(text: &str) -> Option<SlurmState> {
        let upper = text.trim().to_ascii_uppercase();
        let index = SLURM_JOB_STATES
            .iter()
            .position(|s| *s == upper)
            .or_else(|| SLURM_JOB_STATE_CODES.iter().position(|s| *s == upper))?;
        Some(SlurmState(JobState::parse(SLURM_JOB_STATES[index])))
    }
}

/// One squeue column: what `%X` or `-O Name` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Account,
    ArrayJobId,
    ArrayTaskId,
    BatchHost,
    Command,
    Comment,
    Contiguous,
    CpusPerTask,
    CpusPerTres,
    Deadline,
    Dependency,
    EligibleTime,
    EndTime,
    ExcNodes,
    ExitCode,
    Features,
    GroupId,
    GroupName,
    JobArrayId,
    JobId,
    Licenses,
    MaxNodes,
    MemPerTres,
    MinCpus,
    MinMemory,
    MinTime,
    Name,
    Nice,
    NodeList,
    NumCpus,
    NumNodes,
    NumTasks,
    OverSubscribe,
    Partition,
    Priority,
    PriorityLong,
    Qos,
    Reason,
    ReasonList,
    ReqNodes,
    Requeue,
    Reservation,
    RestartCnt,
    /// Drover's: the current incarnation's last progress (time) and step.
    LastProgress,
    ProgressStep,
    StartTime,
    State,
    StateCompact,
    StdErr,
    StdIn,
    StdOut,
    SubmitTime,
    TimeLeft,
    TimeLimit,
    TimeUsed,
    TresAlloc,
    TresPerJob,
    TresPerNode,
    TresPerTask,
    UserId,
    UserName,
    WcKey,
    WorkDir,
    /// A column Slurm has and Drover has nothing for: its header, and `N/A` on every row.
    Unset(&'static str),
}

impl Col {
    /// `squeue -o %X`.
    fn from_code(code: char) -> Option<Col> {
        Some(match code {
            'a' => Col::Account,
            'A' => Col::JobId,
            'b' => Col::TresPerNode,
            'B' => Col::BatchHost,
            'c' => Col::MinCpus,
            'C' => Col::NumCpus,
            'd' => Col::Unset("MIN_TMP_DISK"),
            'D' => Col::NumNodes,
            'e' => Col::EndTime,
            'E' => Col::Dependency,
            'f' => Col::Features,
            'F' => Col::ArrayJobId,
            'g' => Col::GroupName,
            'G' => Col::GroupId,
            'h' => Col::OverSubscribe,
            'H' => Col::Unset("SOCKETS_PER_NODE"),
            'i' => Col::JobArrayId,
            'I' => Col::Unset("CORES_PER_SOCKET"),
            'j' => Col::Name,
            'J' => Col::Unset("THREADS_PER_CORE"),
            'k' => Col::Comment,
            'K' => Col::ArrayTaskId,
            'l' => Col::TimeLimit,
            'L' => Col::TimeLeft,
            'm' => Col::MinMemory,
            'M' => Col::TimeUsed,
            'n' => Col::ReqNodes,
            'N' => Col::NodeList,
            'o' => Col::Command,
            'O' => Col::Contiguous,
            'p' => Col::Priority,
            'P' => Col::Partition,
            'q' => Col::Qos,
            'Q' => Col::PriorityLong,
            'r' => Col::Reason,
            'R' => Col::ReasonList,
            's' => Col::Unset("SELECT_JOBINFO"),
            'S' => Col::StartTime,
            't' => Col::StateCompact,
            'T' => Col::State,
            'u' => Col::UserName,
            'U' => Col::UserId,
            'v' => Col::Reservation,
            'V' => Col::SubmitTime,
            'w' => Col::WcKey,
            'W' => Col::Licenses,
            'x' => Col::ExcNodes,
            'X' => Col::Unset("CORE_SPEC"),
            'y' => Col::Nice,
            'Y' => Col::Unset("SCHEDNODES"),
            'z' => Col::Unset("S:C:T"),
            'Z' => Col::WorkDir,
            _ => return None,
        })
    }

    /// `squeue -O Name` (case-insensitive, as in Slurm 22.05).
    fn from_name(name: &str) -> Option<Col> {
        Some(match name.to_ascii_lowercase().as_str() {
            "account" => Col::Account,
            "arrayjobid" => Col::ArrayJobId,
            "arraytaskid" => Col::ArrayTaskId,
            "batchhost" => Col::BatchHost,
            "command" => Col::Command,
            "comment" => Col::Comment,
            "contiguous" => Col::Contiguous,
            "cpuspertask" | "cpus-per-task" => Col::CpusPerTask,
            "cpus-per-tres" => Col::CpusPerTres,
            "deadline" => Col::Deadline,
            "dependency" => Col::Dependency,
            "eligibletime" => Col::EligibleTime,
            "endtime" => Col::EndTime,
            "exit_code" => Col::ExitCode,
            "feature" => Col::Features,
            "gres" | "tres-per-node" => Col::TresPerNode,
            "groupid" => Col::GroupId,
            "groupname" => Col::GroupName,
            "jobarrayid" => Col::JobArrayId,
            "jobid" => Col::JobId,
            "licenses" => Col::Licenses,
            "maxnodes" => Col::MaxNodes,
            "mem-per-tres" => Col::MemPerTres,
            "mincpus" => Col::MinCpus,
            "minmemory" => Col::MinMemory,
            "mintime" => Col::MinTime,
            "name" => Col::Name,
            "nice" => Col::Nice,
            "nodelist" => Col::NodeList,
            "numcpus" => Col::NumCpus,
            "numnodes" => Col::NumNodes,
            "numtasks" => Col::NumTasks,
            "oversubscribe" | "shared" => Col::OverSubscribe,
            "partition" => Col::Partition,
            "priority" => Col::Priority,
            "prioritylong" => Col::PriorityLong,
            "qos" => Col::Qos,
            "reason" => Col::Reason,
            "reasonlist" => Col::ReasonList,
            "reqnodes" => Col::ReqNodes,
            "requeue" => Col::Requeue,
            "reservation" => Col::Reservation,
            "restartcnt" => Col::RestartCnt,
            "lastprogress" => Col::LastProgress,
            "progressstep" => Col::ProgressStep,
            "starttime" => Col::StartTime,
            "state" => Col::State,
            "statecompact" => Col::StateCompact,
            "stderr" => Col::StdErr,
            "stdin" => Col::StdIn,
            "stdout" => Col::StdOut,
            "submittime" => Col::SubmitTime,
            "timeleft" => Col::TimeLeft,
            "timelimit" => Col::TimeLimit,
            "timeused" => Col::TimeUsed,
            "tres" | "tres-alloc" => Col::TresAlloc,
            "tres-per-job" => Col::TresPerJob,
            "tres-per-task" => Col::TresPerTask,
            "userid" => Col::UserId,
            "username" => Col::UserName,
            "wckey" => Col::WcKey,
            "workdir" => Col::WorkDir,
            "accruetime" => Col::Unset("ACCRUE_TIME"),
            "batchflag" => Col::Unset("BATCH_FLAG"),
            "burstbuffer" => Col::Unset("BURST_BUFFER"),
            "cluster" => Col::Unset("CLUSTER"),
            "cores" => Col::Unset("CORES_PER_SOCKET"),
            "corespec" => Col::Unset("CORE_SPEC"),
            "licenses_" => Col::Unset("LICENSES"),
            "mintmpdisk" => Col::Unset("MIN_TMP_DISK"),
            "network" => Col::Unset("NETWORK"),
            "pendingtime" => Col::Unset("PENDING_TIME"),
            "schednodes" => Col::Unset("SCHEDNODES"),
            "sockets" => Col::Unset("SOCKETS_PER_NODE"),
            "threads" => Col::Unset("THREADS_PER_CORE"),
            _ => return None,
        })
    }

    fn header(self) -> &'static str {
        match self {
            Col::Account => "ACCOUNT",
            Col::ArrayJobId => "ARRAY_JOB_ID",
            Col::ArrayTaskId => "ARRAY_TASK_ID",
            Col::BatchHost => "EXEC_HOST",
            Col::Command => "COMMAND",
            Col::Comment => "COMMENT",
            Col::Contiguous => "CONTIGUOUS",
            Col::CpusPerTask => "CPUS_PER_TASK",
            Col::CpusPerTres => "CPUS_PER_TRES",
            Col::Deadline => "DEADLINE",
            Col::Dependency => "DEPENDENCY",
            Col::EligibleTime => "ELIGIBLE_TIME",
            Col::EndTime => "END_TIME",
            Col::ExcNodes => "EXC_NODES",
            Col::ExitCode => "EXIT_CODE",
            Col::Features => "FEATURES",
            Col::GroupId | Col::GroupName => "GROUP",
            Col::JobArrayId | Col::JobId => "JOBID",
            Col::Licenses => "LICENSES",
            Col::MaxNodes => "MAX_NODES",
            Col::MemPerTres => "MEM_PER_TRES",
            Col::MinCpus => "MIN_CPUS",
            Col::MinMemory => "MIN_MEMORY",
            Col::MinTime => "TIME_MIN",
            Col::Name => "NAME",
            Col::Nice => "NICE",
            Col::NodeList => "NODELIST",
            Col::NumCpus => "CPUS",
            Col::NumNodes => "NODES",
            Col::NumTasks => "TASKS",
            Col::OverSubscribe => "OVER_SUBSCRIBE",
            Col::Partition => "PARTITION",
            Col::Priority | Col::PriorityLong => "PRIORITY",
            Col::Qos => "QOS",
            Col::Reason => "REASON",
            Col::ReasonList => "NODELIST(REASON)",
            Col::ReqNodes => "REQ_NODES",
            Col::Requeue => "REQUEUE",
            Col::Reservation => "RESERVATION",
            Col::RestartCnt => "RESTART_COUNT",
            Col::LastProgress => "LAST_PROGRESS",
            Col::ProgressStep => "PROGRESS_STEP",
            Col::StartTime => "START_TIME",
            Col::State => "STATE",
            Col::StateCompact => "ST",
            Col::StdErr => "STDERR",
            Col::StdIn => "STDIN",
            Col::StdOut => "STDOUT",
            Col::SubmitTime => "SUBMIT_TIME",
            Col::TimeLeft => "TIME_LEFT",
            Col::TimeLimit => "TIME_LIMIT",
            Col::TimeUsed => "TIME",
            Col::TresAlloc => "TRES_ALLOC",
            Col::TresPerJob => "TRES_PER_JOB",
            Col::TresPerNode => "TRES_PER_NODE",
            Col::TresPerTask => "TRES_PER_TASK",
            Col::UserId => "UID",
            Col::UserName => "USER",
            Col::WcKey => "WCKEY",
            Col::WorkDir => "WORK_DIR",
            Col::Unset(header) => header,
        }
    }

    /// Slurm cuts a value to its column's width, except node lists (and the reason column's header).
    fn cut(self) -> bool {
        !matches!(self, Col::NodeList | Col::ReasonList)
    }

    fn value(self, job: &Job, now_ms: u64) -> String {
        let spec = &job.spec;
        let or_null = |v: &Option<drover_state::ThinStr>| v.as_deref().unwrap_or("(null)").to_string();
        match self {
            Col::Account => job.account_name().to_string(),
            Col::ArrayJobId => job.array.as_deref().map_or_else(|| job.id.to_string(), |a| a.array_job_id.to_string()),
            Col::ArrayTaskId => job.array.as_deref().map_or_else(|| "N/A".to_string(), |a| a.task_id.to_string()),
            Col::BatchHost => job.nodes.first().cloned().unwrap_or_else(|| "n/a".into()),
            Col::Command => spec.name.to_string(),
            Col::Comment => or_null(&spec.comment),
            Col::Contiguous => "0".into(),
            Col::CpusPerTask => spec.cpus_per_task.to_string(),
            Col::CpusPerTres => spec.cpus_per_gpu.map_or_else(|| "N/A".into(), |n| format!("gres:gpu:{n}")),
            Col::Deadline => format_timestamp(spec.deadline_ms),
            Col::Dependency => drover_state::dependency::format_dependency_status(
                &spec.dependency,
                spec.dependency_any,
                &job.dependency_state,
            ),
            Col::EligibleTime => format_timestamp(eligible_ms(job)),
            Col::EndTime => format_timestamp(expected_end_ms(job)),
            Col::ExcNodes => list_or_empty(&spec.exclude),
            Col::ExitCode => format!("{}:{}", job.exit_code, job.exit_signal),
            Col::Features => {
                if spec.constraint.is_empty() {
                    "(null)".into()
                } else {
                    spec.constraint.join("&")
                }
            }
            Col::GroupId | Col::GroupName => spec.gid.to_string(),
            Col::JobArrayId => job.display_id(),
            Col::JobId => job.id.to_string(),
            Col::Licenses => "(null)".into(),
            Col::MaxNodes => spec.max_nodes.max(spec.min_nodes).to_string(),
            Col::MemPerTres => mem_per_tres(job).unwrap_or_else(|| "N/A".into()),
            Col::MinCpus => (spec.cpus_per_task.max(1) * spec.ntasks_per_node.unwrap_or(1).max(1)).to_string(),
            Col::MinMemory => mem_mb(min_memory_mb(job).0),
            Col::MinTime => spec.time_min_s.map_or_else(|| "N/A".into(), format_duration),
            Col::Name => spec.name.to_string(),
            Col::Nice => spec.nice.to_string(),
            Col::NodeList => compress_hostlist(&job.nodes),
            Col::NumCpus => Tres::current(job).cpu.to_string(),
            Col::NumNodes => {
                if job.nodes.is_empty() {
                    spec.min_nodes.to_string()
                } else {
                    job.nodes.len().to_string()
                }
            }
            Col::NumTasks => spec.total_tasks().to_string(),
            Col::OverSubscribe => if spec.exclusive { "NO" } else { "OK" }.into(),
            Col::Partition => job.partition.to_string(),
            // Drover keeps no priority number on the job: held jobs are 0, as in Slurm, others 1 (and `%p` is that
            // over 2^32 - 1, as Slurm normalizes it).
            Col::Priority => if job.held { "0.00000000000" } else { "0.00000000023" }.into(),
            Col::PriorityLong => if job.held { "0" } else { "1" }.into(),
            Col::Qos => job.qos_name().to_string(),
            Col::Reason => job.reason.name().to_string(),
            Col::ReasonList => reason_or_nodes(job),
            Col::ReqNodes => list_or_empty(&spec.nodelist),
            Col::Requeue => u8::from(spec.requeue.unwrap_or(true)).to_string(),
            Col::Reservation => or_null(&spec.reservation),
            Col::RestartCnt => job.restarts().to_string(),
            Col::LastProgress => {
                job.progress().map_or_else(|| "N/A".to_string(), |p| format_timestamp(Some(p.time_ms)))
            }
            Col::ProgressStep => {
                job.progress().and_then(|p| p.step).map_or_else(|| "N/A".to_string(), |s| s.to_string())
            }
            Col::StartTime => format_timestamp(job.start_time_ms),
            Col::State => job.shown_state().name().to_string(),
            Col::StateCompact => job.shown_state().short().to_string(),
            Col::StdErr => std_path(job, spec.stderr.as_deref().or(spec.stdout.as_deref())),
            Col::StdIn => "/dev/null".into(),
            Col::StdOut => std_path(job, spec.stdout.as_deref()),
            Col::SubmitTime => format_timestamp(Some(job.submit_time_ms)),
            Col::TimeLeft => match job.time_limit_s {
                Some(limit) => format_duration(limit.saturating_sub(elapsed_s(job, now_ms))),
                None => "UNLIMITED".into(),
            },
            Col::TimeLimit => format_time_limit(job.time_limit_s),
            Col::TimeUsed => format_duration(elapsed_s(job, now_ms)),
            Col::TresAlloc => Tres::current(job).by_id(),
            Col::TresPerJob => tres_per_job(job).unwrap_or_else(|| "N/A".into()),
            Col::TresPerNode => tres_per_node(job).unwrap_or_else(|| "N/A".into()),
            Col::TresPerTask => tres_per_task(job).unwrap_or_else(|| "N/A".into()),
            Col::UserId => spec.uid.to_string(),
            Col::UserName => spec.user.to_string(),
            Col::WcKey => or_null(&spec.wckey),
            Col::WorkDir => spec.work_dir.to_string(),
            Col::Unset("SCHEDNODES" | "NETWORK") => "(null)".into(),
            Col::Unset(_) => "N/A".into(),
        }
    }
}

fn list_or_empty(list: &[String]) -> String {
    if list.is_empty() { String::new() } else { compress_hostlist(list) }
}

/// Where a job's output goes, `%j` and `%x` filled in (`scontrol show job`'s `StdOut=`).
pub fn std_path(job: &Job, path: Option<&str>) -> String {
    let spec = &job.spec;
    let path = path.map(str::to_string).unwrap_or_else(|| match job.array {
        Some(_) => format!("{}/slurm-%A_%a.out", spec.work_dir),
        None => format!("{}/slurm-%j.out", spec.work_dir),
    });
    let (array_id, task) = match job.array.as_deref() {
        Some(a) => (a.array_job_id.to_string(), a.task_id.to_string()),
        None => (job.id.to_string(), "4294967294".to_string()),
    };
    path.replace("%j", &job.id.to_string())
        .replace("%A", &array_id)
        .replace("%a", &task)
        .replace("%x", &spec.name)
        .replace("%u", &spec.user)
}

/// When the job may start: its `--begin`, else its submission; none while held (Slurm's `EligibleTime`).
pub fn eligible_ms(job: &Job) -> Option<u64> {
    if job.held {
        return None;
    }
    Some(job.spec.begin_ms.map_or(job.submit_time_ms, |b| b.max(job.submit_time_ms)))
}

/// A running job's expected end (start + limit), a finished one's end.
pub fn expected_end_ms(job: &Job) -> Option<u64> {
    match (job.end_time_ms, job.start_time_ms, job.time_limit_s) {
        (Some(end), _, _) => Some(end),
        (None, Some(start), Some(limit)) => Some(start + limit * 1000),
        _ => None,
    }
}

/// Slurm's reason text: `(Reason)` for pending jobs, the node list otherwise.
fn reason_or_nodes(job: &Job) -> String {
    if job.state == JobState::Pending {
        let reason = match &job.reason {
            PendingReason::None => "None",
            r => r.name(),
        };
        format!("({reason})")
    } else {
        compress_hostlist(&job.nodes)
    }
}

/// One item of an output format (`squeue -o/-O`, `sinfo -o/-O`): literal text, or a field with Slurm's width
/// rules.
#[derive(Debug, Clone, PartialEq)]
pub enum Item<F> {
    Text(String),
    Field {
        field: F,
        /// 0: as wide as the value.
        width: usize,
        right: bool,
    },
}

/// A `-o` format: `%[.][WIDTH]X` fields between literal text (`.` right-justifies; `%-10X`, which Slurm reads
/// as the field `-`, is read as left-justified), `%%` a percent sign. Unknown letters are kept as text and
/// named in the second value, or, with `drop_unknown`, left out together with the text up to the next `%`
/// (what sinfo's `%all` does with letters that name nothing).
pub fn parse_percent_format<F>(
    format: &str,
    from_code: impl Fn(char) -> Option<F>,
    drop_unknown: bool,
) -> (Vec<Item<F>>, Vec<String>) {
    let mut items = Vec::new();
    let mut invalid = Vec::new();
    let mut chars = format.chars().peekable();
    let mut text = String::new();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let mut spec = String::from("%");
        let mut right = false;
        if chars.peek() == Some(&'-') {
            spec.push('-');
            chars.next();
        }
        if chars.peek() == Some(&'.') {
            spec.push('.');
            chars.next();
            right = true;
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        spec.push_str(&digits);
        let Some(code) = chars.next() else {
            text.push_str(&spec);
            break;
        };
        match from_code(code) {
            Some(field) => {
                if !text.is_empty() {
                    items.push(Item::Text(std::mem::take(&mut text)));
                }
                items.push(Item::Field { field, width: digits.parse().unwrap_or(0), right });
            }
            None if drop_unknown => {
                while chars.peek().is_some_and(|c| *c != '%') {
                    chars.next();
                }
            }
            None => {
                invalid.push(code.to_string());
                spec.push(code);
                text.push_str(&spec);
            }
        }
    }
    if !text.is_empty() {
        items.push(Item::Text(text));
    }
    (items, invalid)
}

/// One `-O` token, `Name[:[.][WIDTH]][SUFFIX]`: the name, its width (20 when there is no `:`; 0: as wide as the
/// value), whether it is right-justified, and the literal suffix.
pub fn parse_long_token(token: &str) -> (&str, usize, bool, &str) {
    match token.split_once(':') {
        Some((name, rest)) => {
            let (right, rest) = match rest.strip_prefix('.') {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
            (name, rest[..digits].parse().unwrap_or(0), right, &rest[digits..])
        }
        None => (token, 20, false, ""),
    }
}

/// A `%X` field no format knows, in the format it came in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid job format specification: {code} (in {format:?}; see squeue --help for the % fields)")]
pub struct InvalidFormat {
    pub code: String,
    pub format: String,
}

/// Formats jobs as `squeue -o` (`%.18i %j`) or `squeue -O` (`JobID:20,State:.10`) says.
#[derive(Debug)]
pub struct JobFormatter {
    items: Vec<Item<Col>>,
}

impl JobFormatter {
    /// A `-o` format. An unknown `%X` is refused (Drover's stricter reading; see [`JobFormatter::lenient`]).
    pub fn new(format: &str) -> Result<JobFormatter, InvalidFormat> {
        let (formatter, invalid) = JobFormatter::lenient(format);
        match invalid.first() {
            Some(code) => Err(InvalidFormat { code: code.to_string(), format: format.to_string() }),
            None => Ok(formatter),
        }
    }

    /// A `-o` format as squeue reads it: `%[.][WIDTH]X` fields between literal text (`.` right-justifies, a
    /// width pads and cuts). Unknown fields are kept as text and named in the second value, which squeue reports
    /// as errors before printing anyway.
    pub fn lenient(format: &str) -> (JobFormatter, Vec<String>) {
        let (items, invalid) = parse_percent_format(format, Col::from_code, false);
        (JobFormatter { items }, invalid)
    }

    /// A `-O` format: comma-separated `Name[:[.][WIDTH]][SUFFIX]` (width 20 when none is given).
    pub fn long(format: &str) -> (JobFormatter, Vec<String>) {
        let mut items = Vec::new();
        let mut invalid = Vec::new();
        for token in format.split(',').filter(|t| !t.is_empty()) {
            let (name, width, right, suffix) = parse_long_token(token);
            match Col::from_name(name) {
                Some(field) => items.push(Item::Field { field, width, right }),
                None => invalid.push(name.to_string()),
            }
            if !suffix.is_empty() {
                items.push(Item::Text(suffix.to_string()));
            }
        }
        (JobFormatter { items }, invalid)
    }

    pub fn header(&self) -> String {
        self.render(|col| col.header().to_string(), true)
    }

    pub fn line(&self, job: &Job, now_ms: u64) -> String {
        self.render(|col| col.value(job, now_ms), false)
    }

    /// A line for a group of pending array tasks, shown as one (`123_[4-99%8]`), as squeue does.
    pub fn group_line(&self, job: &Job, now_ms: u64, id: &str, task_ids: &str) -> String {
        self.render(
            |col| match col {
                Col::JobArrayId => id.to_string(),
                Col::ArrayTaskId => task_ids.to_string(),
                _ => col.value(job, now_ms),
            },
            false,
        )
    }

    fn render(&self, value: impl Fn(Col) -> String, header: bool) -> String {
        let mut out = String::new();
        for item in &self.items {
            match item {
                Item::Text(t) => out.push_str(t),
                Item::Field { field: col, width, right } => {
                    let text = value(*col);
                    // Node lists are never cut, nor the NODELIST(REASON) header; a pending job's reason is.
                    let cut = match col {
                        Col::ReasonList => !header && text.starts_with('('),
                        _ => col.cut(),
                    };
                    out.push_str(&pad(&text, *width, *right, cut));
                }
            }
        }
        out
    }
}

/// Slurm's `_print_str`: right-justified (`%.N`) or left-justified and padded (`%N`) to `width`, cut to it when
/// `cut`; width 0 prints the value as it is.
pub fn pad(value: &str, width: usize, right: bool, cut: bool) -> String {
    if width == 0 {
        return value.to_string();
    }
    let shown: String = if cut { value.chars().take(width).collect() } else { value.to_string() };
    if right { format!("{shown:>width$}") } else { format!("{shown:<width$}") }
}

/// A group's name from the group database, else its number (Slurm's `gid_to_string`).
pub fn group_name(gid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: the buffers outlive the call; getgrgid_r writes only within them.
    let rc = unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return gid.to_string();
    }
    // SAFETY: on success gr_name points to a NUL-terminated string inside `buf`.
    unsafe { std::ffi::CStr::from_ptr(grp.gr_name) }.to_string_lossy().into_owned()
}

/// Why a job is where it is: the pending reason, or why it ended.
pub fn job_reason(job: &Job) -> String {
    match job.state {
        JobState::Pending => job.reason.name().to_string(),
        // Slurm's slurmctld files a batch script that died of a signal under FAIL_LAUNCH, whatever the signal.
        JobState::Failed if job.exit_signal != 0 => "JobLaunchFailure".to_string(),
        JobState::Failed if job.exit_code != 0 => "NonZeroExitCode".to_string(),
        JobState::Timeout => "TimeLimit".to_string(),
        JobState::NodeFail => "NodeDown".to_string(),
        JobState::OutOfMemory => "OutOfMemory".to_string(),
        // `--kill-on-invalid-dep=yes` cancels with DependencyNeverSatisfied; a cancel by a user leaves None.
        JobState::Cancelled => job.reason.name().to_string(),
        _ => "None".to_string(),
    }
}

/// `scontrol show job`'s line for a job's container (Slurm has none: pyxis's options are invisible there).
pub fn container_line(c: &drover_state::container::ContainerSpec) -> String {
    let image = c.image.as_ref().map_or_else(String::new, |i| i.to_string());
    let mounts: Vec<String> = c.mounts.iter().map(|m| m.to_string()).collect();
    let mut line = format!(
        "ContainerImage={image} ContainerName={} ContainerMounts={} ContainerWorkdir={} ContainerWritable={} \
         ContainerRemapRoot={} ContainerMountHome={} ContainerEntrypoint={}",
        c.name.as_deref().unwrap_or("(null)"),
        if mounts.is_empty() { "(null)".to_string() } else { mounts.join(",") },
        c.workdir.as_deref().unwrap_or("(image)"),
        if c.readonly { "no" } else { "yes" },
        yes_no(c.remap_root),
        yes_no(c.mount_home),
        yes_no(c.entrypoint),
    );
    if !c.env.is_empty() {
        line.push_str(&format!(" ContainerEnv={}", c.env.join(",")));
    }
    if let Some(save) = &c.save {
        line.push_str(&format!(" ContainerSave={save}"));
    }
    if let Some(digest) = &c.pinned_digest {
        line.push_str(&format!(" ContainerDigest={digest}"));
    }
    line
}

/// The job's image as given, with the digest it runs once a node has resolved it (`IMAGE@sha256:...`).
pub fn container_image(c: &drover_state::container::ContainerSpec) -> String {
    let image = c.image.as_ref().map_or_else(|| c.name.clone().unwrap_or_default(), |i| i.to_string());
    match &c.pinned_digest {
        Some(digest) => format!("{image}@{digest}"),
        None => image,
    }
}

fn yes_no(on: bool) -> &'static str {
    if on { "yes" } else { "no" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_state::{JobSpec, NodeAllocation};

    fn job() -> Job {
        Job {
            id: 7,
            spec: JobSpec {
                name: "train".into(),
                user: "ada".into(),
                min_nodes: 2,
                max_nodes: 2,
                ntasks_per_node: Some(4),
                cpus_per_task: 2,
                gpus_per_node: 4,
                mem: Some(MemRequest::PerNode(4096)),
                ..JobSpec::default()
            },
            partition: "gpu".into(),
            ..Job::default()
        }
    }

    #[test]
    fn sizes_convert_only_while_exact_as_slurm_does() {
        assert_eq!(mem_mb(4096), "4G");
        assert_eq!(mem_mb(1536), "1.50G");
        assert_eq!(mem_mb(4000), "4000M");
        assert_eq!(mem_mb(512), "512M");
        assert_eq!(mem_mb(0), "0");
        assert_eq!(mem_mb(2 << 20), "2T");
        assert_eq!(convert_num_unit(1180, 1), "1180K");
        assert_eq!(convert_num_unit(2048, 1), "2M");
    }

    #[test]
    fn durations_and_timestamps_in_slurms_forms() {
        assert_eq!(clock(65), "00:01:05");
        assert_eq!(clock(90_061), "1-01:01:01");
        assert_eq!(clock_limit(None), "UNLIMITED");
        assert_eq!(timestamp_or_unknown(None), "Unknown");
        assert_eq!(format_timestamp(None), "N/A");
    }

    #[test]
    fn tres_strings_are_sorted_by_name_for_sacct_and_by_id_for_scontrol() {
        let mut j = job();
        let req = Tres::requested(&j);
        assert_eq!(req.by_name(), "billing=16,cpu=16,gres/gpu=8,mem=8G,node=2");
        assert_eq!(req.by_id(), "cpu=16,mem=8G,node=2,gres/gpu=8");
        assert_eq!(Tres::allocated(&j), None, "nothing is held while pending");
        j.nodes = vec!["n1".into()].into();
        j.allocation =
            vec![NodeAllocation { node: "n1".into(), gpus: vec![0, 1], cpus: 3, tasks: 1, mem_mb: 1536 }].into();
        assert_eq!(Tres::allocated(&j).unwrap().by_name(), "billing=3,cpu=3,gres/gpu=2,mem=1.50G,node=1");
        j.spec.mem = Some(MemRequest::PerCpu(1000));
        assert_eq!(Tres::requested(&j).mem_mb, 16_000, "per CPU, times every CPU of the job");
        j.spec.mem = None;
        assert_eq!(Tres::requested(&j).by_name(), "billing=16,cpu=16,gres/gpu=8,node=2", "no mem, no mem=");
    }

    #[test]
    fn format_strings_parse_widths_and_justification() {
        let f = JobFormatter::new("%.5i|%-4j|%t%%").unwrap();
        assert_eq!(f.header(), "JOBID|NAME|ST%");
        assert!(JobFormatter::new("%Y%j").is_ok(), "every letter Slurm knows is accepted");
        let (lenient, invalid) = JobFormatter::lenient("%i %9");
        assert_eq!(invalid, Vec::<String>::new());
        assert_eq!(lenient.header(), "JOBID %9");
        assert!(JobFormatter::new("%i %!").unwrap_err().to_string().contains("Invalid job format specification: !"));
    }

    #[test]
    fn the_default_header_matches_slurm() {
        let f = JobFormatter::new(SQUEUE_DEFAULT).unwrap();
        assert_eq!(f.header(), "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)");
    }

    #[test]
    fn widths_pad_and_cut_like_slurms_print_str() {
        let j = job();
        let f = JobFormatter::new("%5j|%.3j|%.4i|%m|%b|%C|%D").unwrap();
        assert_eq!(f.line(&j, 0), "train|tra|   7|4G|gres:gpu:4|16|2");
        let f = JobFormatter::new("%.3R").unwrap();
        assert_eq!(f.line(&j, 0), "(No", "a pending job's reason is cut to the width");
    }

    #[test]
    fn long_formats_take_names_widths_and_suffixes() {
        let j = job();
        let (f, invalid) = JobFormatter::long("JobID:5,State:.8 ,Name,minmemory:4|,Bogus");
        assert_eq!(invalid, ["Bogus"]);
        assert_eq!(f.header(), "JOBID   STATE NAME                MIN_|");
        assert_eq!(f.line(&j, 0), "7     PENDING train               4G  |");
    }
}
