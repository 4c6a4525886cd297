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
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
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
    let ids = super::parse_job_ids(&args.jobs).map_err(|e| anyhow::anyhow!(e))?;
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
    // squeue shows pending and running jobs unless states are named.
    if states.is_empty() && !args.states.iter().any(|s| s.eq_ignore_ascii_case("all")) {
        states = vec!["PENDING".into(), "RUNNING".into(), "SUSPENDED".into(), "COMPLETING".into(), "REQUEUED".into()];
    }
    let client = crate::connect::client(args.controllers.as_deref())?;
    let filter = drover_client::JobFilter { ids, users, states, include_finished: false, stale: args.stale, limit: 0 };
    let (jobs, truncated) = crate::connect::runtime().block_on(client.list_jobs(&filter))?;
    let now = super::now_ms();
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&formatter.header());
        out.push('\n');
    }
    for job in &jobs {
        out.push_str(&formatter.line(job, now));
        out.push('\n');
    }
    print!("{out}");
    if truncated {
        eprintln!("squeue: warning: output truncated at {} jobs; narrow it with -j, -u or -t", jobs.len());
    }
    Ok(())
}
