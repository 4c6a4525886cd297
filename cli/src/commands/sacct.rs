//! `sacct`: accounting for finished and running jobs, read from the replicated history (RocksDB), not memory.

use clap::Parser;
use drover_state::hostlist::compress_hostlist;
use drover_state::{Job, JobState};

use crate::format::{elapsed_s, format_timestamp};
use crate::identity::current_user;

/// Slurm's default `--format`.
const DEFAULT_FIELDS: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
/// Jobs listed at most (the server caps too).
const MAX_JOBS: u32 = 100_000;

#[derive(Parser, Debug)]
#[command(name = "sacct", about = "Accounting data of Drover jobs")]
struct Args {
    /// Job ids (comma-separated).
    #[arg(short = 'j', long = "jobs")]
    jobs: Vec<String>,
    /// Only the jobs' allocations (Drover keeps no per-step records, so this is always the case).
    #[arg(short = 'X', long = "allocations")]
    allocations: bool,
    /// No header.
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// `|`-separated, with a trailing `|`.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    /// `|`-separated, no trailing `|`.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// Fields to show (`JobID,JobName,State,ExitCode,Elapsed,NodeList,AllocTRES`, ...); `%N` sets a width.
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Jobs of these users.
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// Every user's jobs.
    #[arg(short = 'a', long = "allusers")]
    all_users: bool,
    /// Only jobs in these states.
    #[arg(short = 's', long = "state", value_delimiter = ',')]
    states: Vec<String>,
    /// Accepted for compatibility; the whole history is searched.
    #[arg(short = 'S', long = "starttime")]
    start: Option<String>,
    #[arg(short = 'E', long = "endtime")]
    end: Option<String>,
    /// Also every earlier incarnation of requeued jobs (REQUEUED, NODE_FAIL, PREEMPTED), each on its own row.
    #[arg(short = 'D', long = "duplicates")]
    duplicates: bool,
    #[arg(long = "controllers")]
    controllers: Option<String>,
}

pub fn run(args: &[String]) -> i32 {
    match sacct(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sacct: error: {e:#}");
            1
        }
    }
}

/// One column: its name, width and how to print it.
struct Field {
    name: String,
    width: usize,
}

fn sacct(args: &[String]) -> anyhow::Result<()> {
    let args = Args::try_parse_from(std::iter::once("sacct".to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    let fields = parse_fields(args.format.as_deref().unwrap_or(DEFAULT_FIELDS))?;
    let refs = crate::job_refs::parse_refs(&args.jobs).map_err(|e| anyhow::anyhow!(e))?;
    let ids = crate::job_refs::base_ids(&refs);
    let (me, uid, _) = current_user();
    let users = if !args.users.is_empty() {
        args.users.clone()
    } else if args.all_users || uid == 0 || !ids.is_empty() {
        Vec::new()
    } else {
        vec![me]
    };
    let filter = drover_client::JobFilter {
        ids,
        users,
        states: args.states.clone(),
        include_finished: true,
        limit: MAX_JOBS,
        ..Default::default()
    };
    let client = crate::connect::client(args.controllers.as_deref())?;
    let (mut jobs, truncated) = crate::connect::runtime().block_on(client.list_jobs(&filter))?;
    jobs.retain(|j| crate::job_refs::names(&refs, j));
    let now = super::now_ms();
    let separator = if args.parsable || args.parsable2 { Some(args.parsable) } else { None };
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&row(&fields, |f| f.name.clone(), separator));
        if separator.is_none() {
            out.push_str(&row(&fields, |f| "-".repeat(f.width), None));
        }
    }
    for job in &jobs {
        if args.duplicates {
            for earlier in earlier_incarnations(job) {
                out.push_str(&row(&fields, |f| value(&f.name, &earlier, now), separator));
            }
        }
        out.push_str(&row(&fields, |f| value(&f.name, job, now), separator));
    }
    print!("{out}");
    if truncated {
        eprintln!("sacct: warning: output cut at {MAX_JOBS} jobs; narrow it with -j, -u or -s");
    }
    Ok(())
}

fn row(fields: &[Field], cell: impl Fn(&Field) -> String, separator: Option<bool>) -> String {
    match separator {
        Some(trailing) => {
            let mut line = fields.iter().map(&cell).collect::<Vec<_>>().join("|");
            if trailing {
                line.push('|');
            }
            line.push('\n');
            line
        }
        None => {
            let cells: Vec<String> = fields
                .iter()
                .map(|f| {
                    let text = cell(f);
                    // Slurm right-aligns and truncates with a `+` marker.
                    if text.chars().count() > f.width {
                        let cut: String = text.chars().take(f.width.saturating_sub(1)).collect();
                        format!("{cut}+")
                    } else {
                        format!("{text:>width$}", width = f.width)
                    }
                })
                .collect();
            format!("{}\n", cells.join(" "))
        }
    }
}

fn parse_fields(spec: &str) -> anyhow::Result<Vec<Field>> {
    spec.split(',')
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (name, width) = match f.split_once('%') {
                Some((n, w)) => (n, Some(w.parse::<usize>().map_err(|_| anyhow::anyhow!("Invalid field width: {f}"))?)),
                None => (f, None),
            };
            let canonical = FIELDS
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .ok_or_else(|| anyhow::anyhow!("Invalid field requested: \"{name}\""))?;
            Ok(Field { name: canonical.0.to_string(), width: width.unwrap_or(canonical.1) })
        })
        .collect()
}

/// Supported fields and Slurm's default widths.
const FIELDS: [(&str, usize); 30] = [
    ("JobID", 12),
    ("QOS", 10),
    ("Reservation", 12),
    ("JobIDRaw", 12),
    ("JobName", 10),
    ("Partition", 10),
    ("Account", 10),
    ("User", 9),
    ("UID", 6),
    ("AllocCPUS", 10),
    ("NCPUS", 10),
    ("AllocNodes", 10),
    ("NNodes", 8),
    ("State", 10),
    ("ExitCode", 8),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Submit", 19),
    ("Start", 19),
    ("End", 19),
    ("NodeList", 15),
    ("AllocTRES", 10),
    ("TotalCPU", 10),
    ("MaxRSS", 10),
    ("Restarts", 8),
    ("Incarnation", 11),
    ("Checkpoint", 30),
    ("CheckpointStep", 14),
    ("Reason", 20),
    ("Timelimit", 10),
];

fn value(field: &str, job: &Job, now: u64) -> String {
    match field {
        "JobID" => job.display_id(),
        "JobIDRaw" => job.id.to_string(),
        "JobName" => job.spec.name.clone(),
        "Partition" => job.partition.clone(),
        "Account" => job.account_name().to_string(),
        "QOS" => job.qos_name().to_string(),
        "Reservation" => job.spec.reservation.clone().unwrap_or_default(),
        "User" => job.spec.user.clone(),
        "UID" => job.spec.uid.to_string(),
        "AllocCPUS" | "NCPUS" => job.allocated_cpus().to_string(),
        "AllocNodes" | "NNodes" => job.nodes.len().to_string(),
        "State" => match (job.state, job.cancelled_by) {
            (JobState::Cancelled, Some(by)) => format!("CANCELLED by {by}"),
            (state, _) => state.name().to_string(),
        },
        "ExitCode" => format!("{}:{}", job.exit_code, job.exit_signal),
        "Elapsed" => format_elapsed(elapsed_s(job, now)),
        "ElapsedRaw" => elapsed_s(job, now).to_string(),
        "Submit" => format_timestamp(Some(job.submit_time_ms)),
        "Start" => job.start_time_ms.map_or("Unknown".into(), |t| format_timestamp(Some(t))),
        "End" => job.end_time_ms.map_or("Unknown".into(), |t| format_timestamp(Some(t))),
        "NodeList" => {
            if job.nodes.is_empty() {
                "None assigned".to_string()
            } else {
                compress_hostlist(&job.nodes)
            }
        }
        "AllocTRES" => alloc_tres(job),
        "TotalCPU" => format_cpu(job.usage.cpu_ms),
        "MaxRSS" => {
            if job.usage.max_rss_kb > 0 {
                format!("{}K", job.usage.max_rss_kb)
            } else {
                String::new()
            }
        }
        "Restarts" => job.restart_count.to_string(),
        "Incarnation" => job.incarnation.to_string(),
        "Checkpoint" => job.checkpoint.as_ref().map(|c| c.path.clone()).unwrap_or_default(),
        "CheckpointStep" => job.checkpoint.as_ref().and_then(|c| c.step).map(|s| s.to_string()).unwrap_or_default(),
        "Reason" => job.message.clone().unwrap_or_default(),
        "Timelimit" => drover_state::slurm_time::format_time_limit(job.time_limit_s),
        _ => String::new(),
    }
}

/// A job's earlier incarnations as rows of their own, from its restart history.
fn earlier_incarnations(job: &Job) -> Vec<Job> {
    job.history
        .iter()
        .map(|h| Job {
            state: h.state,
            start_time_ms: h.start_ms,
            end_time_ms: Some(h.end_ms),
            nodes: drover_state::hostlist::expand_hostlist(&h.nodes).unwrap_or_default(),
            incarnation: h.incarnation,
            message: Some(h.reason.clone()),
            allocation: Vec::new(),
            history: Vec::new(),
            checkpoint: None,
            exit_code: 0,
            exit_signal: 0,
            cancelled_by: None,
            ..job.clone()
        })
        .collect()
}

/// Slurm's `AllocTRES`: `billing=N,cpu=N,gres/gpu=N,node=N`.
fn alloc_tres(job: &Job) -> String {
    if job.nodes.is_empty() {
        return String::new();
    }
    let cpus = job.allocated_cpus();
    let mut parts = vec![format!("billing={cpus}"), format!("cpu={cpus}")];
    let gpus = job.allocated_gpus();
    if gpus > 0 {
        parts.push(format!("gres/gpu={gpus}"));
    }
    parts.push(format!("node={}", job.nodes.len()));
    parts.join(",")
}

/// sacct's `Elapsed`: always `HH:MM:SS`, with a `D-` prefix past a day.
fn format_elapsed(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
    if d > 0 { format!("{d}-{h:02}:{m:02}:{sec:02}") } else { format!("{h:02}:{m:02}:{sec:02}") }
}

/// `TotalCPU` as Slurm prints it: `MM:SS.mmm` (or with hours).
fn format_cpu(ms: u64) -> String {
    let (s, milli) = (ms / 1000, ms % 1000);
    let (h, m, sec) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 { format!("{h:02}:{m:02}:{sec:02}") } else { format!("{m:02}:{sec:02}.{milli:03}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_case_insensitively_with_widths_and_unknown_ones_are_named() {
        let fields = parse_fields("jobid,State%20,exitcode").unwrap();
        assert_eq!(fields[0].name, "JobID");
        assert_eq!(fields[1].width, 20);
        let err = parse_fields("JobID,Bogus").err().unwrap().to_string();
        assert!(err.contains("Invalid field requested: \"Bogus\""), "{err}");
    }

    #[test]
    fn parsable_rows_follow_slurm() {
        let fields = parse_fields("JobID,State").unwrap();
        assert_eq!(row(&fields, |f| f.name.clone(), Some(false)), "JobID|State\n");
        assert_eq!(row(&fields, |f| f.name.clone(), Some(true)), "JobID|State|\n");
        assert_eq!(row(&fields, |f| f.name.clone(), None), "       JobID      State\n");
        assert_eq!(format_cpu(61_005), "01:01.005");
        assert_eq!(format_elapsed(3_725), "01:02:05");
        assert_eq!(format_elapsed(90_000), "1-01:00:00");
    }
}
