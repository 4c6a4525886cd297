//! `sacct`: accounting for finished and running jobs, read from the replicated history (RocksDB), not memory.
//!
//! Follows Slurm 22.05: its field names (any unambiguous prefix, `%N` widths, negative = left-justified), its
//! column and `-p`/`-P` layouts, its time window (`-S`/`-E` defaults and which jobs a window holds), and its
//! errors. Drover records no job steps, so every row is a job allocation (what `-X` asks for).

use clap::Parser;
use drover_state::hostlist::{compress_hostlist, expand_hostlist};
use drover_state::{Job, JobState, goodput};

use crate::command::{Bare, Common, finish, parse_args};
use crate::format::{SlurmState, Tres, clock, clock_limit, convert_num_unit, elapsed_s, mem_mb, timestamp_or_unknown};
use crate::identity::current_user;

/// Slurm's default `--format` (and `-b`, `-l`).
const DEFAULT_FIELDS: &str = "jobid,jobname,partition,account,alloccpus,state,exitcode";
const BRIEF_FIELDS: &str = "jobid,state,exitcode";
const LONG_FIELDS: &str = "jobid,jobidraw,jobname,partition,maxvmsize,maxvmsizenode,maxvmsizetask,avevmsize,maxrss,maxrssnode,maxrsstask,averss,maxpages,maxpagesnode,maxpagestask,avepages,mincpu,mincpunode,mincputask,avecpu,ntasks,alloccpus,elapsed,state,exitcode,avecpufreq,reqcpufreqmin,reqcpufreqmax,reqcpufreqgov,reqmem,consumedenergy,maxdiskread,maxdiskreadnode,maxdiskreadtask,avediskread,maxdiskwrite,maxdiskwritenode,maxdiskwritetask,avediskwrite,reqtres,alloctres,tresusageinave,tresusageinmax,tresusageinmaxn,tresusageinmaxt,tresusageinmin,tresusageinminn,tresusageinmint,tresusageintot,tresusageoutmax,tresusageoutmaxn,tresusageoutmaxt,tresusageoutave,tresusageouttot";
/// Jobs listed at most (the server caps too).
const MAX_JOBS: u32 = 100_000;
/// Batch scripts `-B` prints at most (each is one more request).
const MAX_SCRIPTS: usize = 100;

#[derive(Parser, Debug)]
#[command(name = "sacct", about = "Accounting data of Drover jobs", disable_version_flag = true)]
struct Args {
    /// Job ids (comma-separated, repeatable; `123_4` and `123_[1-3]` name array tasks; a step suffix such as
    /// `.batch` names its job, Drover keeping no step records).
    #[arg(short = 'j', long = "jobs")]
    jobs: Vec<String>,
    /// Only the jobs' allocations (Drover keeps no per-step records, so this is always the case).
    #[arg(short = 'X', long = "allocations")]
    allocations: bool,
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// Fields separated by `|` (or `--delimiter`), each followed by one.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    /// Fields separated by `|` (or `--delimiter`), none after the last.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// The separator for -p and -P.
    #[arg(long = "delimiter")]
    delimiter: Option<String>,
    /// Fields to show (`JobID,JobName%30,State,NodeList%-256`), repeatable; any unambiguous prefix of a name.
    #[arg(short = 'o', long = "format", alias = "fields")]
    format: Vec<String>,
    /// `--format=jobid,state,exitcode`.
    #[arg(short = 'b', long = "brief")]
    brief: bool,
    /// Slurm's long field list.
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// Print the field names and exit.
    #[arg(short = 'e', long = "helpformat")]
    helpformat: bool,
    /// Jobs of these users (names or uids, comma-separated).
    #[arg(short = 'u', long = "user", alias = "uid")]
    users: Vec<String>,
    /// Every user's jobs.
    #[arg(short = 'a', long = "allusers")]
    all_users: bool,
    /// Only jobs in these states, at some time in the window (comma-separated, long or short names).
    #[arg(short = 's', long = "state")]
    states: Vec<String>,
    /// The window's start (Slurm's time forms: `now-2hours`, `2026-12-01T08:00`, `midnight`, `MMDD`...).
    #[arg(short = 'S', long = "starttime")]
    start: Option<String>,
    /// The window's end (same forms; default now).
    #[arg(short = 'E', long = "endtime")]
    end: Option<String>,
    /// Only jobs with these names (comma-separated).
    #[arg(long = "name")]
    names: Vec<String>,
    /// Only jobs of these partitions.
    #[arg(short = 'r', long = "partition")]
    partitions: Vec<String>,
    /// Only jobs of these accounts.
    #[arg(short = 'A', long = "accounts", alias = "account")]
    accounts: Vec<String>,
    /// Only jobs of these QOS.
    #[arg(short = 'q', long = "qos")]
    qos: Vec<String>,
    /// Only jobs that ran on these nodes (a hostlist).
    #[arg(short = 'N', long = "nodelist")]
    nodelist: Option<String>,
    /// Only jobs with these wckeys.
    #[arg(short = 'W', long = "wckeys")]
    wckeys: Vec<String>,
    /// Print each job's batch script (with -j).
    #[arg(short = 'B', long = "batch-script")]
    batch_script: bool,
    /// Also every earlier incarnation of requeued jobs (REQUEUED, NODE_FAIL, PREEMPTED), each on its own row.
    #[arg(short = 'D', long = "duplicates")]
    duplicates: bool,
    /// Accepted for compatibility (one cluster).
    #[arg(short = 'L', long = "allclusters")]
    all_clusters: bool,
    #[arg(short = 'M', long = "clusters", alias = "cluster")]
    clusters: Option<String>,
    /// Accepted for compatibility (times are not truncated to the window).
    #[arg(short = 'T', long = "truncate")]
    truncate: bool,
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[command(flatten)]
    common: Common,
}

pub fn run(args: &[String]) -> i32 {
    finish("sacct", sacct(args).map(|()| 0))
}

use crate::slurm::fields::Kind::{Date, Number, Text};
use crate::slurm::fields::{
    Field, FieldDef, Layout, def, gpu_hours, header, help_format_in, parse_fields_in, ratio, row,
};
use crate::slurm::time::{local_midnight, parse_time};

/// Slurm 22.05's fields (sacct.c), then Drover's own: restart history and checkpoints, and goodput
/// (`drover_state::goodput`): `GPUHours` held by all the job's incarnations (a running one up to now),
/// `LostGPUHours` lost to failures (GPUs × time since each failed incarnation's last checkpoint),
/// `PreemptLostGPUHours` the same for preemptions, `DownTime` from failures to restarts, and `Goodput`, the
/// effective training time ratio `(GPUHours − LostGPUHours − PreemptLostGPUHours) / GPUHours` (empty when the job
/// never ran). GPU-hours print with 4 decimals (a resolution of 0.36 GPU-seconds). A job's row counts all of its
/// incarnations; with `-D`, each earlier incarnation's row counts only itself.
const FIELDS: &[FieldDef] = &[
    def("Account", 10, Text),
    def("AdminComment", 15, Text),
    def("AllocCPUS", 10, Number),
    def("AllocNodes", 10, Text),
    def("AllocTRES", 10, Text),
    def("AssocID", 7, Number),
    def("AveCPU", 10, Text),
    def("AveCPUFreq", 10, Text),
    def("AveDiskRead", 14, Text),
    def("AveDiskWrite", 14, Text),
    def("AvePages", 10, Text),
    def("AveRSS", 10, Text),
    def("AveVMSize", 10, Text),
    def("BlockID", 16, Text),
    def("Cluster", 10, Text),
    def("Comment", 14, Text),
    def("Constraints", 19, Text),
    def("ConsumedEnergy", 14, Text),
    def("ConsumedEnergyRaw", 17, Number),
    def("Container", 19, Text),
    def("CPUTime", 10, Number),
    def("CPUTimeRAW", 10, Number),
    def("DBIndex", -10, Number),
    def("DerivedExitCode", 15, Text),
    def("Elapsed", 10, Number),
    def("ElapsedRaw", 10, Number),
    def("Eligible", 19, Date),
    def("End", 19, Date),
    def("ExitCode", 8, Text),
    def("Flags", 19, Text),
    def("GID", 6, Number),
    def("Group", 9, Text),
    def("JobID", -12, Text),
    def("JobIDRaw", -12, Text),
    def("JobName", 10, Text),
    def("Layout", 9, Text),
    def("MaxDiskRead", 12, Text),
    def("MaxDiskReadNode", 15, Text),
    def("MaxDiskReadTask", 15, Number),
    def("MaxDiskWrite", 12, Text),
    def("MaxDiskWriteNode", 16, Text),
    def("MaxDiskWriteTask", 16, Number),
    def("MaxPages", 8, Text),
    def("MaxPagesNode", 12, Text),
    def("MaxPagesTask", 14, Number),
    def("MaxRSS", 10, Text),
    def("MaxRSSNode", 10, Text),
    def("MaxRSSTask", 10, Number),
    def("MaxVMSize", 10, Text),
    def("MaxVMSizeNode", 14, Text),
    def("MaxVMSizeTask", 14, Number),
    def("McsLabel", 12, Text),
    def("MinCPU", 10, Text),
    def("MinCPUNode", 10, Text),
    def("MinCPUTask", 10, Number),
    def("NCPUS", 10, Number),
    def("NNodes", 8, Number),
    def("NodeList", 15, Text),
    def("NTasks", 8, Number),
    def("Partition", 10, Text),
    def("Priority", 10, Number),
    def("QOS", 10, Text),
    def("QOSRAW", 6, Number),
    def("Reason", 22, Text),
    def("ReqCPUFreq", 10, Text),
    def("ReqCPUFreqGov", 13, Text),
    def("ReqCPUFreqMax", 13, Text),
    def("ReqCPUFreqMin", 13, Text),
    def("ReqCPUS", 8, Number),
    def("ReqMem", 10, Text),
    def("ReqNodes", 8, Text),
    def("ReqTRES", 10, Text),
    def("Reservation", 20, Text),
    def("ReservationId", 8, Number),
    def("Reserved", 10, Number),
    def("ResvCPU", 10, Number),
    def("ResvCPURAW", 10, Number),
    def("Start", 19, Date),
    def("State", 10, Text),
    def("Submit", 19, Date),
    def("SubmitLine", 20, Text),
    def("Suspended", 10, Number),
    def("SystemComment", 15, Text),
    def("SystemCPU", 10, Text),
    def("Timelimit", 10, Text),
    def("TimelimitRaw", 10, Text),
    def("TotalCPU", 10, Text),
    def("TRESUsageInAve", 14, Text),
    def("TRESUsageInMax", 14, Text),
    def("TRESUsageInMaxNode", 18, Text),
    def("TRESUsageInMaxTask", 18, Text),
    def("TRESUsageInMin", 14, Text),
    def("TRESUsageInMinNode", 18, Text),
    def("TRESUsageInMinTask", 18, Text),
    def("TRESUsageInTot", 14, Text),
    def("TRESUsageOutAve", 15, Text),
    def("TRESUsageOutMax", 15, Text),
    def("TRESUsageOutMaxNode", 19, Text),
    def("TRESUsageOutMaxTask", 19, Text),
    def("TRESUsageOutMin", 15, Text),
    def("TRESUsageOutMinNode", 19, Text),
    def("TRESUsageOutMinTask", 19, Text),
    def("TRESUsageOutTot", 15, Text),
    def("UID", 6, Number),
    def("User", 9, Text),
    def("UserCPU", 10, Text),
    def("WCKey", 10, Text),
    def("WCKeyID", 10, Number),
    def("WorkDir", 20, Text),
    def("Restarts", 8, Number),
    def("Incarnation", 11, Number),
    def("Checkpoint", 30, Text),
    def("CheckpointStep", 14, Number),
    def("GPUHours", 10, Number),
    def("LostGPUHours", 12, Number),
    def("PreemptLostGPUHours", 19, Number),
    def("DownTime", 10, Number),
    def("Goodput", 7, Number),
];

/// `-o` as Slurm reads it: comma-separated names, each any prefix of a field name (case-insensitive, the first
/// match in Slurm's order wins), `%N` setting the width (`atoi`: `%-20` left-justifies); `ALL` is every field.
fn parse_fields(spec: &str) -> anyhow::Result<Vec<Field>> {
    parse_fields_in(spec, FIELDS)
}

/// Which jobs the options select.
#[derive(Debug, Default)]
struct Query {
    refs: Vec<drover_state::array::JobRef>,
    /// `refs` again, each with the step it names, if any (`123.batch`).
    step_refs: Vec<(drover_state::array::JobRef, Option<String>)>,
    /// The window, in ms since the epoch.
    start_ms: u64,
    end_ms: u64,
    states: Vec<SlurmState>,
    /// Names or uids; empty: everyone.
    users: Vec<String>,
    names: Vec<String>,
    partitions: Vec<String>,
    accounts: Vec<String>,
    qos: Vec<String>,
    nodes: Vec<String>,
    wckeys: Vec<String>,
}

impl Query {
    fn wants(&self, job: &Job) -> bool {
        let any = |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v == value);
        crate::job_refs::names(&self.refs, job)
            && (self.users.is_empty()
                || self.users.iter().any(|u| *u == job.spec.user || *u == job.spec.uid.to_string()))
            && any(&self.names, &job.spec.name)
            && any(&self.partitions, &job.partition)
            && (self.accounts.is_empty() || self.accounts.iter().any(|a| a.eq_ignore_ascii_case(job.account_name())))
            && (self.qos.is_empty() || self.qos.iter().any(|q| q.eq_ignore_ascii_case(job.qos_name())))
            && (self.nodes.is_empty() || job.nodes.iter().any(|n| self.nodes.contains(n)))
            && (self.wckeys.is_empty() || job.spec.wckey.as_deref().is_some_and(|w| self.wckeys.iter().any(|k| k == w)))
            && self.in_window(job)
    }

    /// Slurm's window rules (as_mysql_jobacct_process.c): without `-s`, jobs eligible before the end that had not
    /// ended by the start (with `-j`, submitted instead of eligible); with `-s`, jobs that were in one of the
    /// states at some time in the window (a terminal state: ended inside it).
    fn in_window(&self, job: &Job) -> bool {
        let (s, e) = (self.start_ms / 1000, self.end_ms / 1000);
        let secs = |ms: Option<u64>| ms.map(|m| m / 1000);
        let (start, end) = (secs(job.start_time_ms), secs(job.end_time_ms));
        let submit = job.submit_time_ms / 1000;
        let eligible = secs(crate::format::eligible_ms(job));
        let not_ended_before = end.is_none_or(|end| end >= s);
        if self.states.is_empty() {
            return if self.refs.is_empty() {
                eligible.is_some_and(|el| el < e) && not_ended_before
            } else {
                submit < e && not_ended_before
            };
        }
        self.states.iter().filter_map(|st| st.0).any(|state| match state {
            JobState::Pending => {
                eligible.is_some_and(|el| el < e)
                    && match (start, end) {
                        (Some(start), _) => s < start,
                        (None, Some(end)) => s < end,
                        (None, None) => job.state == JobState::Pending,
                    }
            }
            JobState::Running => {
                start.is_some_and(|start| start < e)
                    && (end.is_some_and(|end| s < end) || (end.is_none() && job.state == JobState::Running))
            }
            JobState::Suspended | JobState::Completing => job.state == state,
            terminal => job.state == terminal && end.is_some_and(|end| s <= end && end <= e),
        })
    }
}

fn split(lists: &[String]) -> Vec<String> {
    lists.iter().flat_map(|l| l.split(',')).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// The jobs `-j` names, and for each reference the step it names (`123.batch`: `Some("batch")`).
fn job_refs(args: &[String]) -> anyhow::Result<Vec<(drover_state::array::JobRef, Option<String>)>> {
    crate::job_refs::split_refs(args)
        .into_iter()
        .map(|r| {
            let (job, step) = match r.split_once('.') {
                Some((job, step)) => (job.to_string(), Some(step.to_string())),
                None => (r, None),
            };
            let job = crate::job_refs::parse_refs(&[job]).map_err(|e| anyhow::anyhow!(e))?.remove(0);
            Ok((job, step))
        })
        .collect()
}

/// The rows `sacct` prints for one job: the job (allocation) row unless only its steps were named, then its
/// steps unless `-X`: the batch script's (`123.batch`, on the first node for the whole incarnation, so its row
/// is the job's narrowed to that node) and the `srun` steps the controllers recorded (`123.0`, ...). Slurm's
/// `extern` step does not exist in Drover, so naming it prints nothing.
fn rows_of(job: &Job, query: &Query, allocations_only: bool) -> Vec<Row> {
    let named: Vec<&Option<String>> = query
        .step_refs
        .iter()
        .filter(|(r, _)| crate::job_refs::names(std::slice::from_ref(r), job))
        .map(|(_, step)| step)
        .collect();
    let whole = named.is_empty() || named.iter().any(|step| step.is_none());
    let wants = |step: &str| (whole && !allocations_only) || named.iter().any(|s| s.as_deref() == Some(step));
    let has_batch = !job.spec.interactive && job.start_time_ms.is_some() && job.state != JobState::Pending;
    let mut rows = Vec::new();
    if whole {
        rows.push(Row::Job);
    }
    if has_batch && wants("batch") {
        rows.push(Row::Batch);
    }
    rows.extend(job.steps.iter().enumerate().filter(|(_, s)| wants(&s.id.to_string())).map(|(i, _)| Row::Step(i)));
    rows
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    Job,
    Batch,
    /// The job's `steps[i]`.
    Step(usize),
}

/// A field of an `srun` step's row: its own id, name, times, nodes, tasks and outcome; the job's for the rest
/// (user, account, ...). Usage is measured per job cgroup, not per step, so those fields are empty.
fn srun_step_value(field: &str, job: &Job, step: &drover_state::StepRecord, cx: &Context) -> String {
    let end_ms = step.end.map(|e| e.end_ms).or(job.end_time_ms.filter(|_| job.state.is_terminal()));
    let elapsed_s = end_ms.unwrap_or(cx.now_ms).saturating_sub(step.start_ms) / 1000;
    let cpus: u64 = job.allocation.iter().filter(|a| step.nodes.contains(&a.node)).map(|a| u64::from(a.cpus)).sum();
    match field {
        "JobID" => format!("{}.{}", job.display_id(), step.id),
        "JobIDRaw" => format!("{}.{}", job.id, step.id),
        "JobName" => step.name.clone(),
        "State" => step.state(job.state).name().to_string(),
        "ExitCode" => step.end.map(|e| format!("{}:{}", e.exit_code, e.signal)).unwrap_or_else(|| "0:0".into()),
        "Start" => timestamp_or_unknown(Some(step.start_ms)),
        "End" => timestamp_or_unknown(end_ms),
        "Elapsed" => clock(elapsed_s),
        "ElapsedRaw" => elapsed_s.to_string(),
        "NodeList" => compress_hostlist(&step.nodes),
        "NNodes" | "AllocNodes" => step.nodes.len().to_string(),
        "NTasks" => step.tasks.to_string(),
        "AllocCPUS" | "NCPUS" => cpus.to_string(),
        "CPUTime" => clock(elapsed_s * cpus),
        "CPUTimeRAW" => (elapsed_s * cpus).to_string(),
        "Partition" | "Timelimit" | "TimelimitRaw" | "QOS" | "Reservation" | "Comment" | "Priority" | "Submit"
        | "Eligible" | "ReqMem" | "ReqTRES" | "AllocTRES" | "Reason" => String::new(),
        "AveRSS" | "MaxRSS" | "MaxRSSNode" | "TRESUsageInMax" | "TRESUsageInTot" | "TotalCPU" => String::new(),
        "GPUHours" | "LostGPUHours" | "PreemptLostGPUHours" | "DownTime" | "Goodput" => String::new(),
        _ => value(field, job, cx),
    }
}

/// The batch step of `job` as a job of its own for [`value`]: the first node only, its usage only.
fn batch_step(job: &Job) -> Job {
    let mut step = job.clone();
    step.nodes.truncate(1);
    step.allocation.truncate(1);
    step.node_usage.retain(|u| step.nodes.contains(&u.node));
    step.spec.name = "batch".into();
    step.partition = Default::default();
    step
}

/// A field of a batch step's row: what differs from a job row, else the job's value narrowed to the step.
fn step_value(field: &str, job: &Job, step: &Job, cx: &Context) -> String {
    match field {
        "JobID" => format!("{}.batch", job.display_id()),
        "JobIDRaw" => format!("{}.batch", job.id),
        "Timelimit" | "TimelimitRaw" | "QOS" | "Reservation" | "Comment" | "Priority" => String::new(),
        // Goodput is the job's (its row), not a step's.
        "GPUHours" | "LostGPUHours" | "PreemptLostGPUHours" | "DownTime" | "Goodput" => String::new(),
        // The script is killed when the job is cancelled, times out or is preempted: Slurm's batch step then
        // reads CANCELLED, while the job row says why.
        "State" => match job.state {
            JobState::Cancelled | JobState::Timeout | JobState::Preempted => "CANCELLED".into(),
            state => state.name().to_string(),
        },
        _ => value(field, step, cx),
    }
}

fn sacct(args: &[String]) -> anyhow::Result<()> {
    let args: Args = parse_args("sacct", args)?;
    let _ = (args.all_clusters, &args.clusters, args.truncate, args.verbose);
    if args.version {
        println!("{}", crate::format::version_line());
        return Ok(());
    }
    if args.helpformat {
        print!("{}", help_format());
        return Ok(());
    }
    if args.long && !args.format.is_empty() {
        anyhow::bail!(Bare(
            "sacct: fatal: Options -o(--format) and -l(--long) are mutually exclusive. Please remove one and retry."
                .into()
        ));
    }
    let mut spec = args.format.join(",");
    if args.brief {
        spec = format!("{spec},{BRIEF_FIELDS}");
    }
    if args.long {
        spec = format!("{spec},{LONG_FIELDS}");
    }
    if spec.trim_matches(',').is_empty() {
        spec = std::env::var("SACCT_FORMAT").unwrap_or_else(|_| DEFAULT_FIELDS.to_string());
    }
    let fields = parse_fields(&spec)?;
    let now = super::now_ms();
    let query = query(&args, now)?;
    let layout = if args.parsable || args.parsable2 {
        Layout::Parsable { delimiter: args.delimiter.clone().unwrap_or_else(|| "|".into()), trailing: !args.parsable2 }
    } else {
        Layout::Columns
    };
    // The controller narrows by id and by user name; everything else is judged here.
    let server_users = if query.users.iter().all(|u| !u.chars().all(|c| c.is_ascii_digit())) {
        query.users.clone()
    } else {
        Vec::new()
    };
    let filter = drover_client::JobFilter {
        ids: crate::job_refs::base_ids(&query.refs),
        users: server_users,
        include_finished: true,
        limit: MAX_JOBS,
        ..Default::default()
    };
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let (mut jobs, truncated) = rt.block_on(client.list_jobs(&filter))?;
    jobs.retain(|j| query.wants(j));
    if args.batch_script {
        if query.refs.is_empty() {
            anyhow::bail!(Bare(
                "sacct: fatal: When requesting job scripts you must also request specific jobs with the '-j' option."
                    .into()
            ));
        }
        for job in jobs.iter().take(MAX_SCRIPTS) {
            let (_, script) = rt.block_on(client.get_job(job.id, true, false))?;
            println!("Batch Script for {}\n{}\n{script}", job.display_id(), "-".repeat(80));
        }
        return Ok(());
    }
    let cluster = if fields.iter().any(|f| f.name() == "Cluster") {
        rt.block_on(client.nodes_and_config(false))?.1.map(|c| c.cluster_name).unwrap_or_default()
    } else {
        String::new()
    };
    let context = Context { now_ms: now, cluster };
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&header(&fields, &layout));
    }
    for job in &jobs {
        if args.duplicates {
            for earlier in earlier_incarnations(job) {
                let values: Vec<String> = fields.iter().map(|f| value(f.name(), &earlier, &context)).collect();
                out.push_str(&row(&fields, &values, &layout));
            }
        }
        for kind in rows_of(job, &query, args.allocations) {
            let values: Vec<String> = match kind {
                Row::Job => fields.iter().map(|f| value(f.name(), job, &context)).collect(),
                Row::Batch => {
                    let step = batch_step(job);
                    fields.iter().map(|f| step_value(f.name(), job, &step, &context)).collect()
                }
                Row::Step(i) => {
                    fields.iter().map(|f| srun_step_value(f.name(), job, &job.steps[i], &context)).collect()
                }
            };
            out.push_str(&row(&fields, &values, &layout));
        }
    }
    print!("{out}");
    if truncated {
        eprintln!("sacct: warning: output cut at {MAX_JOBS} jobs; narrow it with -j, -u, -S/-E or -s");
    }
    Ok(())
}

/// How far the controllers' clock may run ahead of the client's (the same allowance as credentials').
const CLOCK_SLACK_MS: u64 = 300_000;

/// The query the options describe, with Slurm's defaults for the window: with `-s`, the instant now (or the
/// start given); with `-j`, all of history; otherwise since midnight. The end defaults to now.
fn query(args: &Args, now_ms: u64) -> anyhow::Result<Query> {
    let step_refs = job_refs(&args.jobs)?;
    let refs: Vec<drover_state::array::JobRef> = step_refs.iter().map(|(r, _)| r.clone()).collect();
    let mut states = Vec::new();
    for s in split(&args.states) {
        let state =
            SlurmState::parse(&s).ok_or_else(|| Bare(format!("sacct: fatal: unrecognized job state value '{s}'")))?;
        states.push(state);
    }
    let parse =
        |text: &str| parse_time(text, now_ms / 1000, true).map(|s| s as u64 * 1000).map_err(|e| Bare(e.to_string()));
    let mut start = args.start.as_deref().map(parse).transpose()?;
    let mut end = args.end.as_deref().map(parse).transpose()?;
    if !states.is_empty() {
        if start.is_none() && refs.is_empty() {
            start = Some(now_ms);
        }
        if start.is_some() && end.is_none() {
            end = start;
        }
    } else if refs.is_empty() && start.is_none() {
        start = Some(local_midnight(now_ms / 1000) as u64 * 1000);
    }
    // A defaulted end is "now" on the controllers' clock, which stamped the jobs: allow for it being ahead of
    // ours (and for a job submitted in this very second, which `submit < end` would leave out).
    let (start_ms, end_ms) = (start.unwrap_or(0), end.unwrap_or(now_ms + CLOCK_SLACK_MS));
    if start_ms > end_ms {
        anyhow::bail!(
            "Start time ({}) requested is after end time ({}).",
            crate::format::format_timestamp(Some(start_ms)),
            crate::format::format_timestamp(Some(end_ms))
        );
    }
    let nodes = match &args.nodelist {
        Some(list) => expand_hostlist(list).map_err(|e| anyhow::anyhow!("invalid --nodelist {list:?}: {e}"))?,
        None => Vec::new(),
    };
    let (_, uid, _) = current_user();
    // Everyone's jobs for root, with -a, or when jobs or nodes are named; else the caller's.
    let users = if !args.users.is_empty() && !args.users.iter().any(|u| u == "-1") {
        split(&args.users)
    } else if args.all_users
        || uid == 0
        || !refs.is_empty()
        || !nodes.is_empty()
        || args.users.iter().any(|u| u == "-1")
    {
        Vec::new()
    } else {
        vec![current_user().0]
    };
    Ok(Query {
        refs,
        step_refs,
        start_ms,
        end_ms,
        states,
        users,
        names: split(&args.names),
        partitions: split(&args.partitions),
        accounts: split(&args.accounts),
        qos: split(&args.qos),
        nodes,
        wckeys: split(&args.wckeys),
    })
}

/// `sacct -e`: the field names, four to a line as Slurm prints them.
fn help_format() -> String {
    help_format_in(FIELDS)
}

/// What values need beyond the job.
struct Context {
    now_ms: u64,
    cluster: String,
}

fn value(field: &str, job: &Job, cx: &Context) -> String {
    let spec = &job.spec;
    let req = Tres::requested(job);
    let elapsed = elapsed_s(job, cx.now_ms);
    match field {
        "Account" => job.account_name().to_string(),
        // The allocation's CPUs and nodes; before there is one, the request (Slurm falls back to ReqTRES).
        "AllocCPUS" | "NCPUS" => Tres::current(job).cpu.to_string(),
        "AllocNodes" => job.nodes.len().to_string(),
        "AllocTRES" => Tres::allocated(job).map(|t| alloc_tres(job, t)).unwrap_or_default(),
        "Cluster" => cx.cluster.clone(),
        "Comment" => spec.comment.as_deref().unwrap_or_default().to_string(),
        "Constraints" => spec.constraint.join("&"),
        // Slurm's field names an OCI bundle; Drover's containers are images, shown with the digest the job runs.
        "Container" => spec.container.as_deref().map(crate::format::container_image).unwrap_or_default(),
        "ConsumedEnergy" | "ConsumedEnergyRaw" => "0".into(),
        "CPUTime" => clock(elapsed * Tres::current(job).cpu),
        "CPUTimeRAW" => (elapsed * Tres::current(job).cpu).to_string(),
        "DerivedExitCode" => "0:0".into(),
        "Elapsed" => clock(elapsed),
        "ElapsedRaw" => elapsed.to_string(),
        "Eligible" => timestamp_or_unknown(crate::format::eligible_ms(job)),
        "End" => timestamp_or_unknown(job.end_time_ms),
        "ExitCode" => format!("{}:{}", job.exit_code, job.exit_signal),
        "GID" | "Group" => spec.gid.to_string(),
        "JobID" => job.display_id(),
        "JobIDRaw" => job.id.to_string(),
        "JobName" => spec.name.to_string(),
        // Usage as the job's cgroups measured it, empty where nothing was measured (see `Job::node_usage`).
        "AveRSS" => job.measured_ave_rss_kb().map(kib).unwrap_or_default(),
        "MaxRSS" => job.measured_max_rss_kb().map(kib).unwrap_or_default(),
        "MaxRSSNode" => max_rss_node(job).unwrap_or_default(),
        "TRESUsageInMax" => tres_usage(job.measured_max_cpu_ms(), job.measured_max_rss_kb()),
        "TRESUsageInTot" => tres_usage(job.measured_cpu_ms(), job.measured_total_rss_kb()),
        "NNodes" => Tres::current(job).node.to_string(),
        "NodeList" if job.nodes.is_empty() => "None assigned".into(),
        "NodeList" => compress_hostlist(&job.nodes),
        "Partition" => job.partition.to_string(),
        "Priority" => if job.held || job.state.is_terminal() { "0" } else { "1" }.into(),
        "QOS" => job.qos_name().to_string(),
        "Reason" => match (&job.message, job.state) {
            (Some(message), _) => message.to_string(),
            (None, JobState::Pending) => job.reason.name().to_string(),
            (None, _) => "None".to_string(),
        },
        "ReqCPUS" => req.cpu.to_string(),
        "ReqMem" => mem_mb(req.mem_mb),
        "ReqNodes" => req.node.to_string(),
        "ReqTRES" => req.by_name(),
        "Reservation" => spec.reservation.as_deref().unwrap_or_default().to_string(),
        "Reserved" | "ResvCPU" => clock(0),
        "ResvCPURAW" => "0".into(),
        "Start" => timestamp_or_unknown(job.start_time_ms),
        "State" => match (job.shown_state(), job.cancelled_by) {
            (JobState::Cancelled, Some(by)) => format!("CANCELLED by {by}"),
            (state, _) => state.name().to_string(),
        },
        "Submit" => timestamp_or_unknown(Some(job.submit_time_ms)),
        "Suspended" => {
            let now_suspended = job.suspended_since().map_or(0, |since| super::now_ms().saturating_sub(since));
            clock((job.suspended_total_ms() + now_suspended) / 1000)
        }
        "Timelimit" => clock_limit(job.time_limit_s),
        "TimelimitRaw" => job.time_limit_s.map_or_else(|| "UNLIMITED".into(), |s| (s / 60).to_string()),
        "TotalCPU" => job.measured_cpu_ms().map(format_cpu).unwrap_or_default(),
        "UID" => spec.uid.to_string(),
        "User" => spec.user.to_string(),
        "WCKey" => spec.wckey.as_deref().unwrap_or_default().to_string(),
        "WorkDir" => spec.work_dir.to_string(),
        "Restarts" => job.restarts().to_string(),
        "Incarnation" => job.incarnation.to_string(),
        "Checkpoint" => job.checkpoint.as_ref().map(|c| c.path.clone()).unwrap_or_default(),
        "CheckpointStep" => job.checkpoint.as_ref().and_then(|c| c.step).map(|s| s.to_string()).unwrap_or_default(),
        "GPUHours" => gpu_hours(goodput::of_job(job, cx.now_ms).allocated_gpu_ms),
        "LostGPUHours" => gpu_hours(goodput::of_job(job, cx.now_ms).lost_to_failures_gpu_ms),
        "PreemptLostGPUHours" => gpu_hours(goodput::of_job(job, cx.now_ms).lost_to_preemption_gpu_ms),
        "DownTime" => clock(goodput::of_job(job, cx.now_ms).down_after_failures_ms / 1000),
        "Goodput" => goodput::of_job(job, cx.now_ms).effective_ratio().map(ratio).unwrap_or_default(),
        // Step-level figures (Drover records no steps) and fields Drover has no data for print empty.
        _ => String::new(),
    }
}

/// `AllocTRES`. Memory shows when the job asked for some: a whole-node job without `--mem` (`--exclusive`)
/// holds the node's memory too, which Slurm would print as `mem=`; Drover leaves it out (see the report in the
/// tests of this module).
fn alloc_tres(job: &Job, mut held: Tres) -> String {
    if job.spec.mem.is_none() {
        held.mem_mb = 0;
    }
    held.by_name()
}

/// A job's earlier incarnations as rows of their own, from its restart history. Each keeps its own record as
/// its only history, so goodput fields count that incarnation alone.
fn earlier_incarnations(job: &Job) -> Vec<Job> {
    job.history
        .iter()
        .map(|h| Job {
            state: h.state,
            start_time_ms: h.start_ms,
            end_time_ms: Some(h.end_ms),
            nodes: expand_hostlist(&h.nodes).unwrap_or_default().into(),
            incarnation: h.incarnation,
            message: Some(h.reason.clone().into()),
            allocation: Default::default(),
            history: vec![h.clone()].into(),
            dropped_goodput: None,
            checkpoint: None,
            exit_code: 0,
            exit_signal: 0,
            cancelled_by: None,
            // Measured usage is the last incarnation's.
            node_usage: Default::default(),
            ..job.clone()
        })
        .collect()
}

/// `TotalCPU` as Slurm prints it (sacct's `_elapsed_time`): `D-HH:MM:SS` past a day, `HH:MM:SS` past an hour,
/// else `MM:SS.mmm`, or `00:MM:SS` on a whole second.
fn format_cpu(ms: u64) -> String {
    let (s, milli) = (ms / 1000, ms % 1000);
    let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
    match () {
        () if d > 0 => format!("{d}-{h:02}:{m:02}:{sec:02}"),
        () if h > 0 => format!("{h:02}:{m:02}:{sec:02}"),
        () if milli > 0 => format!("{m:02}:{sec:02}.{milli:03}"),
        () => format!("00:{m:02}:{sec:02}"),
    }
}

/// Memory in KiB as sacct prints `MaxRSS`/`AveRSS` (bytes through `convert_num_unit`: `123456K`, `2M` when exact).
fn kib(kb: u64) -> String {
    convert_num_unit(kb, 1)
}

/// The node with the largest memory peak (`MaxRSSNode`).
fn max_rss_node(job: &Job) -> Option<String> {
    let peaks = job.node_usage.iter().filter_map(|n| Some((n.usage.mem_peak_kb?, &n.node)));
    // The first node of equal peaks, as the allocation lists them.
    peaks.rev().max_by_key(|(kb, _)| *kb).map(|(_, node)| node.clone())
}

/// A `TRESUsageIn*` value as Slurm 22.05 prints it (`cpu=00:01:02,mem=1012K`): CPU time as `[D-]HH:MM:SS`,
/// memory through `convert_num_unit`; only what was measured, empty when nothing was.
fn tres_usage(cpu_ms: Option<u64>, mem_kb: Option<u64>) -> String {
    let cpu = cpu_ms.map(|ms| format!("cpu={}", clock(ms / 1000)));
    let mem = mem_kb.map(|kb| format!("mem={}", kib(kb)));
    cpu.into_iter().chain(mem).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::fields::Column;
    use drover_state::{JobSpec, NodeAllocation};

    fn names(fields: &[Field]) -> Vec<&str> {
        fields.iter().map(|f| f.name()).collect()
    }

    #[test]
    fn fields_match_any_prefix_in_slurms_order_with_signed_widths() {
        let fields = parse_fields("jobid,State%20,exitcode,nodelist%-256,jobidraw,st,node").unwrap();
        assert_eq!(names(&fields), ["JobID", "State", "ExitCode", "NodeList", "JobIDRaw", "Start", "NodeList"]);
        assert_eq!((fields[1].width(), fields[3].width()), (20, -256));
        assert_eq!(fields[0].width(), -12, "JobID is left-justified by default");
        let err = parse_fields("JobID,Bogus").err().unwrap().to_string();
        assert_eq!(err, "Invalid field requested: \"Bogus\"");
        let err = parse_fields("AllocGRES").err().unwrap().to_string();
        assert_eq!(err, "AllocGRES has been removed, please use AllocTRES");
        assert_eq!(parse_fields("ALL").unwrap().len(), FIELDS.len());
    }

    #[test]
    fn rows_follow_slurms_print_fields() {
        let fields = parse_fields("JobID,State,AllocCPUS").unwrap();
        let values = ["12_3".to_string(), "CANCELLED by 1000".to_string(), "4".to_string()];
        let p2 = Layout::Parsable { delimiter: "|".into(), trailing: false };
        let p = Layout::Parsable { delimiter: "|".into(), trailing: true };
        assert_eq!(row(&fields, &values, &p2), "12_3|CANCELLED by 1000|4\n");
        assert_eq!(row(&fields, &values, &p), "12_3|CANCELLED by 1000|4|\n");
        assert_eq!(header(&fields, &p2), "JobID|State|AllocCPUS\n");
        // Columns: every cell followed by a space, text cut with a `+`, JobID on the left.
        assert_eq!(row(&fields, &values, &Layout::Columns), "12_3         CANCELLED+          4 \n");
        assert_eq!(
            header(&fields, &Layout::Columns),
            "JobID             State  AllocCPUS \n------------ ---------- ---------- \n"
        );
        let tab = Layout::Parsable { delimiter: "\t".into(), trailing: false };
        assert_eq!(row(&fields, &values, &tab), "12_3\tCANCELLED by 1000\t4\n");
    }

    #[test]
    fn values_show_requests_and_allocations_as_slurm_does() {
        let mut job = Job { id: 12, partition: "gpu".into(), submit_time_ms: 1_000, ..Job::default() };
        job.spec.min_nodes = 2;
        job.spec.cpus_per_task = 2;
        job.spec.gpus_per_node = 4;
        job.spec.mem = Some(drover_state::job::MemRequest::PerNode(4096));
        job.spec.wckey = Some("proj".into());
        job.spec.comment = Some("nightly".into());
        job.time_limit_s = Some(300);
        let cx = Context { now_ms: 10_000, cluster: "c".into() };
        let v = |f: &str, j: &Job| value(f, j, &cx);
        assert_eq!(v("ReqMem", &job), "8G", "the whole job's request, no n/c suffix");
        assert_eq!(v("ReqTRES", &job), "billing=4,cpu=4,gres/gpu=8,mem=8G,node=2");
        assert_eq!(v("AllocTRES", &job), "", "nothing allocated while pending");
        assert_eq!(
            (v("AllocCPUS", &job).as_str(), v("NNodes", &job).as_str()),
            ("4", "2"),
            "the request while pending"
        );
        assert_eq!((v("NodeList", &job).as_str(), v("Start", &job).as_str()), ("None assigned", "Unknown"));
        assert_eq!((v("WCKey", &job).as_str(), v("Comment", &job).as_str()), ("proj", "nightly"));
        assert_eq!(v("Timelimit", &job), "00:05:00");
        assert_eq!(v("TimelimitRaw", &job), "5");
        job.nodes = vec!["n1".into(), "n2".into()].into();
        job.allocation = ["n1", "n2"]
            .iter()
            .map(|n| NodeAllocation { node: n.to_string(), gpus: vec![0, 1, 2, 3], cpus: 2, tasks: 1, mem_mb: 4096 })
            .collect();
        assert_eq!(v("AllocTRES", &job), "billing=4,cpu=4,gres/gpu=8,mem=8G,node=2");
        job.state = JobState::Cancelled;
        job.cancelled_by = Some(1000);
        assert_eq!(v("State", &job), "CANCELLED by 1000");
        job.node_usage = vec![drover_state::NodeUsage {
            node: "n1".into(),
            usage: drover_state::MeasuredUsage { cpu_ms: None, mem_peak_kb: Some(2048) },
        }]
        .into();
        assert_eq!(v("MaxRSS", &job), "2M");
    }

    #[test]
    fn goodput_fields_show_gpu_hours_lost_per_job_and_per_incarnation() {
        // 8 GPUs: incarnation 0 ran 0-150 s with a checkpoint at 100 s and lost its node; incarnation 1 started
        // 30 s later and completed after 450 s.
        let failed = drover_state::IncarnationRecord {
            incarnation: 0,
            start_ms: Some(0),
            end_ms: 150_000,
            nodes: "n1".into(),
            state: JobState::NodeFail,
            reason: "node n1 failed".into(),
            resumed_from: None,
            gpus: 8,
            last_checkpoint_ms: Some(100_000),
        };
        let job = Job {
            id: 5,
            state: JobState::Completed,
            incarnation: 1,
            restart_count: 1,
            start_time_ms: Some(180_000),
            end_time_ms: Some(630_000),
            nodes: vec!["n2".into()].into(),
            allocation: vec![NodeAllocation { node: "n2".into(), gpus: (0..8).collect(), ..Default::default() }].into(),
            history: vec![failed].into(),
            ..Job::default()
        };
        let cx = Context { now_ms: 700_000, cluster: String::new() };
        let fields = parse_fields("JobID,Restarts,GPUHours,LostGPUHours,PreemptLostGPUHours,DownTime,Goodput").unwrap();
        let p2 = Layout::Parsable { delimiter: "|".into(), trailing: false };
        let line = |j: &Job| row(&fields, &fields.iter().map(|f| value(f.name(), j, &cx)).collect::<Vec<_>>(), &p2);
        // 8 × 600 s = 1.3333 GPU-h held, 8 × 50 s = 0.1111 lost: 1 − 50/600 kept.
        assert_eq!(line(&job), "5|1|1.3333|0.1111|0.0000|00:00:30|0.9167\n");
        assert_eq!(line(&earlier_incarnations(&job)[0]), "5|1|0.3333|0.1111|0.0000|00:00:00|0.6667\n");
        assert_eq!(names(&parse_fields("lost,goodput,gpuh").unwrap()), ["LostGPUHours", "Goodput", "GPUHours"]);
        let pending = Job { id: 6, ..Job::default() };
        assert_eq!(line(&pending), "6|0|0.0000|0.0000|0.0000|00:00:00|\n", "never ran: no ratio");
    }

    #[test]
    fn measured_usage_shows_as_slurm_prints_it_and_stays_empty_when_unmeasured() {
        use drover_state::{MeasuredUsage, NodeUsage};
        let cx = Context { now_ms: 10_000, cluster: "c".into() };
        let mut job = Job { id: 3, nodes: vec!["n1".into(), "n2".into()].into(), ..Job::default() };
        let fields = ["TotalCPU", "MaxRSS", "MaxRSSNode", "AveRSS", "TRESUsageInTot", "TRESUsageInMax"];
        for field in fields {
            assert_eq!(value(field, &job, &cx), "", "{field}: no cgroup, no figure");
        }
        let measured = |node: &str, cpu_ms, kb| NodeUsage {
            node: node.into(),
            usage: MeasuredUsage { cpu_ms: Some(cpu_ms), mem_peak_kb: Some(kb) },
        };
        job.node_usage = vec![measured("n1", 61_500, 123_456), measured("n2", 3_725_250, 1_000)].into();
        let v = |f: &str| value(f, &job, &cx);
        assert_eq!(v("TotalCPU"), "01:03:06", "CPU summed over the nodes: 3786.75 s");
        assert_eq!(v("MaxRSS"), "123456K", "the largest node's peak");
        assert_eq!(v("MaxRSSNode"), "n1");
        assert_eq!(v("AveRSS"), "62228K");
        assert_eq!(v("TRESUsageInTot"), "cpu=01:03:06,mem=124456K");
        assert_eq!(v("TRESUsageInMax"), "cpu=01:02:05,mem=123456K");
        // A node that measured memory but not CPU time (a v1 host without cpuacct).
        job.node_usage =
            vec![NodeUsage { node: "n1".into(), usage: MeasuredUsage { cpu_ms: None, mem_peak_kb: Some(2048) } }]
                .into();
        assert_eq!(
            (value("TotalCPU", &job, &cx).as_str(), value("TRESUsageInTot", &job, &cx).as_str()),
            ("", "mem=2M")
        );
        // Slurm's TotalCPU forms.
        assert_eq!(format_cpu(1_500), "00:01.500");
        assert_eq!(format_cpu(62_000), "00:01:02", "a whole second has no fraction");
        assert_eq!(format_cpu(3_600_000), "01:00:00");
        assert_eq!(format_cpu(90_061_001), "1-01:01:01");
    }

    fn query_at(start_s: u64, end_s: u64, states: &[&str], by_id: bool) -> Query {
        Query {
            refs: if by_id { crate::job_refs::parse_refs(&["1".into()]).unwrap() } else { Vec::new() },
            start_ms: start_s * 1000,
            end_ms: end_s * 1000,
            states: states.iter().map(|s| SlurmState::parse(s).unwrap()).collect(),
            ..Query::default()
        }
    }

    #[test]
    fn a_started_batch_job_has_a_batch_step_row_and_named_steps_narrow_to_it() {
        let job = Job {
            id: 5,
            state: JobState::Timeout,
            start_time_ms: Some(1_000),
            nodes: vec!["n1".into(), "n2".into()].into(),
            partition: "gpu".into(),
            ..Job::default()
        };
        let rows = |jobs: &[&str], x: bool| {
            let step_refs = job_refs(&jobs.iter().map(|j| j.to_string()).collect::<Vec<_>>()).unwrap();
            rows_of(&job, &Query { step_refs, ..Query::default() }, x)
        };
        assert_eq!(rows(&["5"], false), [Row::Job, Row::Batch]);
        assert_eq!(rows(&[], false), [Row::Job, Row::Batch], "no -j: every job with its steps");
        assert_eq!(rows(&["5"], true), [Row::Job], "-X: allocations only");
        assert_eq!(rows(&["5.batch"], false), [Row::Batch]);
        assert_eq!(rows(&["5.batch"], true), [Row::Batch], "a named step shows even with -X");
        assert!(rows(&["5.0"], false).is_empty(), "no step 0 was recorded");
        assert!(rows(&["5.extern"], false).is_empty(), "Drover has no extern step");
        assert_eq!(rows(&["5.0", "5"], false), [Row::Job, Row::Batch]);
        let interactive = Job { spec: JobSpec { interactive: true, ..JobSpec::default() }, ..job.clone() };
        let step_refs = job_refs(&["5".to_string()]).unwrap();
        assert_eq!(rows_of(&interactive, &Query { step_refs, ..Query::default() }, false), [Row::Job]);

        let cx = Context { now_ms: 2_000, cluster: String::new() };
        let step = batch_step(&job);
        let get = |f: &str| step_value(f, &job, &step, &cx);
        assert_eq!(
            (get("JobID"), get("JobIDRaw"), get("JobName")),
            ("5.batch".into(), "5.batch".into(), "batch".into())
        );
        assert_eq!((get("State"), get("NodeList"), get("Partition")), ("CANCELLED".into(), "n1".into(), String::new()));
    }

    #[test]
    fn recorded_srun_steps_have_rows_of_their_own() {
        use drover_state::{StepEnd, StepRecord};
        let step = |id, end: Option<StepEnd>| StepRecord {
            id,
            name: "python".into(),
            nodes: vec!["n2".into()],
            tasks: 4,
            start_ms: 10_000,
            end,
        };
        let failed = StepEnd { end_ms: 70_000, exit_code: 3, signal: 0, cancelled: false };
        let job = Job {
            id: 5,
            state: JobState::Running,
            start_time_ms: Some(1_000),
            nodes: vec!["n1".into(), "n2".into()].into(),
            allocation: vec![
                NodeAllocation { node: "n1".into(), gpus: vec![], cpus: 8, tasks: 4, mem_mb: 0 },
                NodeAllocation { node: "n2".into(), gpus: vec![], cpus: 8, tasks: 4, mem_mb: 0 },
            ]
            .into(),
            steps: vec![step(0, Some(failed)), step(1, None)].into(),
            ..Job::default()
        };
        let rows = |jobs: &[&str], x: bool| {
            let step_refs = job_refs(&jobs.iter().map(|j| j.to_string()).collect::<Vec<_>>()).unwrap();
            rows_of(&job, &Query { step_refs, ..Query::default() }, x)
        };
        assert_eq!(rows(&["5"], false), [Row::Job, Row::Batch, Row::Step(0), Row::Step(1)]);
        assert_eq!(rows(&["5"], true), [Row::Job]);
        assert_eq!(rows(&["5.1"], false), [Row::Step(1)]);
        assert_eq!(rows(&["5.batch", "5.0"], false), [Row::Batch, Row::Step(0)]);

        let cx = Context { now_ms: 100_000, cluster: String::new() };
        let get = |i: usize, f: &str| srun_step_value(f, &job, &job.steps[i], &cx);
        assert_eq!(
            [get(0, "JobID"), get(0, "JobName"), get(0, "State"), get(0, "ExitCode")],
            ["5.0", "python", "FAILED", "3:0"]
        );
        assert_eq!(
            [get(0, "Elapsed"), get(0, "NodeList"), get(0, "NTasks"), get(0, "AllocCPUS")],
            ["00:01:00", "n2", "4", "8"]
        );
        assert_eq!([get(1, "State"), get(1, "Elapsed"), get(1, "End")], ["RUNNING", "00:01:30", "Unknown"]);
        // Once the job has ended, a step srun never reported ended with it.
        let ended = Job { state: JobState::Cancelled, end_time_ms: Some(50_000), ..job.clone() };
        assert_eq!(srun_step_value("State", &ended, &ended.steps[1], &cx), "CANCELLED");
        assert_eq!(srun_step_value("Elapsed", &ended, &ended.steps[1], &cx), "00:00:40");
    }

    #[test]
    fn the_window_holds_the_jobs_slurm_would_return() {
        // Submitted at 100, ran 200..300.
        let job = Job {
            id: 1,
            state: JobState::Completed,
            submit_time_ms: 100_000,
            start_time_ms: Some(200_000),
            end_time_ms: Some(300_000),
            ..Job::default()
        };
        assert!(query_at(250, 400, &[], false).wants(&job), "overlaps the window");
        assert!(!query_at(301, 400, &[], false).wants(&job), "ended before it");
        assert!(!query_at(0, 100, &[], false).wants(&job), "eligible only at its end (exclusive)");
        assert!(query_at(0, 300, &["CD"], false).wants(&job), "ended inside the window");
        assert!(!query_at(0, 299, &["COMPLETED"], false).wants(&job));
        assert!(query_at(150, 250, &["R"], false).wants(&job), "running during the window, done now");
        assert!(query_at(0, 150, &["PD"], false).wants(&job), "pending during the window");
        assert!(!query_at(250, 260, &["PD"], false).wants(&job));
        let held = Job { held: true, state: JobState::Pending, ..job.clone() };
        let held = Job { start_time_ms: None, end_time_ms: None, ..held };
        assert!(!query_at(0, 400, &[], false).wants(&held), "held jobs are not eligible");
        assert!(query_at(0, 400, &[], true).wants(&held), "but show when named");
    }

    #[test]
    fn default_windows_follow_the_options() {
        let parse = |a: &[&str]| Args::try_parse_from(std::iter::once("sacct").chain(a.iter().copied())).unwrap();
        let now = 1_800_000_000_000;
        let q = query(&parse(&["-j", "5"]), now).unwrap();
        assert_eq!((q.start_ms, q.end_ms), (0, now + CLOCK_SLACK_MS), "named jobs: all of history, to now");
        let q = query(&parse(&["-s", "CD"]), now).unwrap();
        assert_eq!((q.start_ms, q.end_ms), (now, now), "states alone: the instant now");
        let q = query(&parse(&[]), now).unwrap();
        assert_eq!(q.start_ms, local_midnight(now / 1000) as u64 * 1000, "else since midnight");
        let err = query(&parse(&["-s", "sideways"]), now).unwrap_err().to_string();
        assert_eq!(err, "sacct: fatal: unrecognized job state value 'sideways'");
        let err = query(&parse(&["-S", "now", "-E", "now-1hour"]), now).unwrap_err().to_string();
        assert!(err.starts_with("Start time (") && err.contains(") requested is after end time ("), "{err}");
        let q = query(&parse(&["-j", "12.batch,13_[1-2]", "-j", "14"]), now).unwrap();
        assert_eq!(crate::job_refs::base_ids(&q.refs), [12, 13, 14]);
    }
}
