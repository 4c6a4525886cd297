//! `squeue`: pending and running jobs, in Slurm's formats.

use clap::Parser;

use crate::format::{JobFormatter, SQUEUE_DEFAULT};

#[derive(Parser, Debug)]
#[command(name = "squeue", disable_help_flag = true, about = "View jobs in the Drover queue")]
struct Args {
    /// Do not print a header.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Output format (Slurm's %-codes).
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Job ids (comma-separated).
    #[arg(short = 'j', long = "jobs")]
    jobs: Vec<String>,
    /// Users (comma-separated).
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// States (comma-separated, long or short names, or `all`).
    #[arg(short = 't', long = "states", value_delimiter = ',')]
    states: Vec<String>,
    /// Show the current user's jobs only.
    #[arg(long = "me")]
    me: bool,
    /// Read from whichever controller answers, without confirming leadership (remote sites).
    #[arg(long = "stale")]
    stale: bool,
    /// Expected start times of pending jobs (from the scheduler's backfill reservations).
    /// One line per array task (else pending tasks of an array share one line, `123_[4-99%8]`).
    #[arg(short = 'r', long = "array")]
    array: bool,
    #[arg(long = "start")]
    start: bool,
    #[arg(long = "controllers")]
    controllers: Option<String>,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    match list(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("squeue: error: {e}");
            1
        }
    }
}

fn list(args: &[String]) -> anyhow::Result<()> {
    let args = Args::try_parse_from(std::iter::once("squeue".to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    let formatter =
        JobFormatter::new(args.format.as_deref().unwrap_or(SQUEUE_DEFAULT)).map_err(|e| anyhow::anyhow!(e))?;
    let refs = crate::job_refs::parse_refs(&args.jobs).map_err(|e| anyhow::anyhow!(e))?;
    let ids = crate::job_refs::base_ids(&refs);
    let mut users = args.users.clone();
    if args.me {
        users.push(crate::identity::current_user().0);
    }
    let mut states: Vec<String> = args.states.iter().filter(|s| !s.eq_ignore_ascii_case("all")).cloned().collect();
    for s in &states {
        if drover_state::JobState::parse(s).is_none() {
            anyhow::bail!("Invalid job state specified: {s}");
        }
    }
    if args.start && states.is_empty() {
        states = vec!["PENDING".into()];
    }
    // squeue shows pending and running jobs unless states are named.
    if states.is_empty() && !args.states.iter().any(|s| s.eq_ignore_ascii_case("all")) {
        states = vec!["PENDING".into(), "RUNNING".into(), "SUSPENDED".into(), "COMPLETING".into(), "REQUEUED".into()];
    }
    let client = crate::connect::client(args.controllers.as_deref())?;
    let filter = drover_client::JobFilter { ids, users, states, include_finished: false, stale: args.stale, limit: 0 };
    let (mut jobs, truncated) = crate::connect::runtime().block_on(client.list_jobs(&filter))?;
    jobs.retain(|j| crate::job_refs::names(&refs, j));
    if args.start {
        let ids: Vec<u64> = jobs.iter().map(|j| j.id).collect();
        let insights =
            if ids.is_empty() { Vec::new() } else { crate::connect::runtime().block_on(client.job_insights(&ids))? };
        print!("{}", start_table(&jobs, &insights, args.noheader));
        return Ok(());
    }
    let now = super::now_ms();
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&formatter.header());
        out.push('\n');
    }
    for row in rows(&jobs, args.array) {
        match row {
            Row::Job(job) => out.push_str(&formatter.line(job, now)),
            Row::Group { first, task_ids } => {
                let a = first.array.expect("groups hold array tasks");
                let tasks = drover_state::array::format_task_ids(&task_ids, a.max_running);
                let id = format!("{}_{tasks}", a.array_job_id);
                out.push_str(&formatter.group_line(first, now, &id, tasks.trim_matches(['[', ']'])));
            }
        }
        out.push('\n');
    }
    print!("{out}");
    if truncated {
        eprintln!("squeue: warning: output truncated at {} jobs; narrow it with -j, -u or -t", jobs.len());
    }
    Ok(())
}

/// One line of squeue's output.
enum Row<'a> {
    Job(&'a drover_state::Job),
    /// Pending tasks of one array, waiting for the same reason: one line, as Slurm prints them (unless `-r`).
    Group {
        first: &'a drover_state::Job,
        task_ids: Vec<u32>,
    },
}

fn rows(jobs: &[drover_state::Job], one_per_task: bool) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = Vec::new();
    for job in jobs {
        let groupable = !one_per_task && job.state == drover_state::JobState::Pending && job.array.is_some();
        if groupable
            && let Some(Row::Group { first, task_ids }) = rows.last_mut()
            && first.array.map(|a| a.array_job_id) == job.array.map(|a| a.array_job_id)
            && first.reason == job.reason
        {
            task_ids.push(job.array.expect("checked").task_id);
            continue;
        }
        rows.push(match (groupable, job.array) {
            (true, Some(a)) => Row::Group { first: job, task_ids: vec![a.task_id] },
            _ => Row::Job(job),
        });
    }
    rows
}

/// `squeue --start`: Slurm's columns, with the expected start from the leader's latest pass (`N/A` when the
/// job holds no reservation).
fn start_table(jobs: &[drover_state::Job], insights: &[drover_proto::wire::JobInsight], noheader: bool) -> String {
    let mut out = String::new();
    if !noheader {
        out.push_str(&format!(
            "{:>18} {:>9} {:>8} {:>8} {:>2} {:>19} {:>6} {}\n",
            "JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "NODES", "NODELIST(REASON)"
        ));
    }
    for job in jobs {
        let start = insights
            .iter()
            .find(|i| i.job_id == job.id)
            .and_then(|i| i.expected_start_s)
            .map_or("N/A".to_string(), |s| crate::format::format_timestamp(Some(s * 1_000)));
        let name: String = job.spec.name.chars().take(8).collect();
        let user: String = job.spec.user.chars().take(8).collect();
        out.push_str(&format!(
            "{:>18} {:>9} {:>8} {:>8} {:>2} {:>19} {:>6} ({})\n",
            job.display_id(),
            job.partition,
            name,
            user,
            job.state.short(),
            start,
            job.spec.min_nodes,
            job.reason.name()
        ));
    }
    out
}
