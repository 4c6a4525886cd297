//! `squeue`: pending and running jobs, in Slurm 22.05's formats (`-o`, `-O`, `-l`) and with its filters, so that
//! pollers (Nextflow's `squeue --noheader -o '%i %t' -t all`, dashboards) read Drover as they read Slurm.

use crate::command::Common;
use std::time::Duration;

use clap::Parser;
use drover_state::hostlist::expand_hostlist;
use drover_state::{Job, JobState};

use crate::format::{JobFormatter, SQUEUE_DEFAULT, SlurmState};
use crate::slurm::arrays::Row;
use crate::slurm::time::ctime;

/// `-l`: Slurm's long default (the `-O` spelling of `%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R`).
const SQUEUE_LONG: &str = "jobarrayid:.18 ,partition:.9 ,name:.8 ,username:.8 ,state:.8 ,timeused:.10 ,timelimit:.9 ,numnodes:.6 ,reasonlist:0";
/// `--start`'s columns.
const SQUEUE_START: &str = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R";
/// The most seconds `-i` waits between reports (Slurm takes any; a day is plenty).
const MAX_ITERATE_S: u64 = 86_400;

#[derive(Parser, Debug)]
#[command(
    name = "squeue",
    disable_help_flag = true,
    disable_version_flag = true,
    about = "View jobs in the Drover queue"
)]
struct Args {
    /// Do not print a header.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Output format (Slurm's %-codes: `%.18i %j %T`).
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Output format by field name (`JobID:20,State:.10,Name`).
    #[arg(short = 'O', long = "Format")]
    format_long: Option<String>,
    /// Long format (adds the state's full name and the time limit).
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// Job ids (comma-separated; `123_4`, `123_[1-3]` name array tasks). With no value, the ids follow as an
    /// operand (`squeue -j 12,13`).
    #[arg(short = 'j', long = "jobs", num_args = 0..=1, default_missing_value = "")]
    jobs: Vec<String>,
    /// The job list after a bare `-j`.
    #[arg(hide = true)]
    operands: Vec<String>,
    /// Users, by name or uid (comma-separated).
    #[arg(short = 'u', long = "user", alias = "users")]
    users: Option<String>,
    /// The current user's jobs only.
    #[arg(long = "me")]
    me: bool,
    /// States (comma-separated, long or short names), or `all`.
    #[arg(short = 't', long = "states")]
    states: Option<String>,
    /// Job names (comma-separated).
    #[arg(short = 'n', long = "name")]
    names: Option<String>,
    /// Partitions (comma-separated).
    #[arg(short = 'p', long = "partition", alias = "partitions")]
    partitions: Option<String>,
    /// Only jobs on these nodes (a hostlist).
    #[arg(short = 'w', long = "nodelist", aliases = ["nodes", "node"])]
    nodelist: Option<String>,
    /// Accounts (comma-separated).
    #[arg(short = 'A', long = "account", aliases = ["accounts"])]
    accounts: Option<String>,
    /// QOS (comma-separated).
    #[arg(short = 'q', long = "qos")]
    qos: Option<String>,
    /// Only jobs of this reservation.
    #[arg(short = 'R', long = "reservation")]
    reservation: Option<String>,
    /// Sort keys (`-S i`, `-S P,-t`): `+`/`-` then a format letter.
    #[arg(short = 'S', long = "sort")]
    sort: Option<String>,
    /// One line per array task (else pending tasks of an array share one line, `123_[4-99%8]`).
    #[arg(short = 'r', long = "array")]
    array: bool,
    /// Expected start times of pending jobs (from the scheduler's backfill reservations).
    #[arg(long = "start")]
    start: bool,
    /// Report again every N seconds.
    #[arg(short = 'i', long = "iterate")]
    iterate: Option<u64>,
    /// Accepted for compatibility: every partition is shown already.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// The jobs as Slurm 22.05's `squeue --json` prints them (OpenAPI v0.0.38).
    #[arg(long = "json")]
    json: bool,
    #[arg(long = "hide")]
    hide: bool,
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[arg(long = "usage")]
    usage: bool,
    /// Read from whichever controller answers, without confirming leadership (remote sites).
    #[arg(long = "stale")]
    stale: bool,
    #[command(flatten)]
    common: Common,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    match list(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", crate::command::error_text("squeue", &e, false));
            1
        }
    }
}

/// Which jobs to show, from the options.
#[derive(Debug, Default)]
struct Selection {
    refs: Vec<drover_state::array::JobRef>,
    /// Names and uids (`-u`, `--me`).
    users: Vec<String>,
    /// `None`: every state (`-t all`); else Slurm states, some of which Drover never has.
    states: Option<Vec<SlurmState>>,
    names: Vec<String>,
    partitions: Vec<String>,
    nodes: Vec<String>,
    accounts: Vec<String>,
    qos: Vec<String>,
    reservation: Option<String>,
}

/// squeue's default: what is still going on.
const ACTIVE: [JobState; 5] =
    [JobState::Pending, JobState::Running, JobState::Suspended, JobState::Completing, JobState::Requeued];

impl Selection {
    fn wants(&self, job: &Job) -> bool {
        let list_has =
            |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v.eq_ignore_ascii_case(value));
        let state_ok = match &self.states {
            None => true,
            Some(states) => states.iter().any(|s| s.0 == Some(job.shown_state())),
        };
        crate::job_refs::names(&self.refs, job)
            && state_ok
            && (self.users.is_empty()
                || self.users.iter().any(|u| *u == job.spec.user || *u == job.spec.uid.to_string()))
            && list_has(&self.names, &job.spec.name)
            && (self.partitions.is_empty() || self.partitions.iter().any(|p| *p == job.partition))
            && (self.nodes.is_empty() || job.nodes.iter().any(|n| self.nodes.contains(n)))
            && list_has(&self.accounts, job.account_name())
            && list_has(&self.qos, job.qos_name())
            && self.reservation.as_deref().is_none_or(|r| job.spec.reservation.as_deref() == Some(r))
    }
}

fn split(list: &Option<String>) -> Vec<String> {
    list.iter().flat_map(|l| l.split(',')).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

fn list(args: &[String]) -> anyhow::Result<i32> {
    let args: Args = crate::command::parse_args("squeue", args)?;
    if args.version {
        println!("{}", crate::format::version_line());
        return Ok(0);
    }
    if args.usage {
        println!(
            "Usage: squeue [-A account] [--clusters names] [-i seconds] [--job jobid] [-n name] [-o format] [-O fields] [-p partitions] [--qos qos] [--reservation reservation] [--sort fields] [--start] [--steps] [-t states] [-u user_name] [--usage] [-w nodes] [--me] [-ahjlrv]"
        );
        return Ok(0);
    }
    let _ = (args.all, args.hide, args.verbose);
    if args.format.is_some() && args.format_long.is_some() {
        anyhow::bail!("-O (--Format) is incompatible with -o (--format)");
    }
    if args.long && args.format.is_some() {
        anyhow::bail!("Options -o(--format) and -l(--long) are mutually exclusive. Please remove one and retry.");
    }
    let formatter = formatter(&args);
    let selection = selection(&args)?;
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    loop {
        let code = rt.block_on(report(&args, &client, &formatter, &selection))?;
        match args.iterate {
            Some(secs) if code == 0 => {
                println!();
                std::thread::sleep(Duration::from_secs(secs.clamp(1, MAX_ITERATE_S)));
            }
            _ => return Ok(code),
        }
    }
}

/// The formatter `-o`, `-O`, `-l`, `--start` or `SQUEUE_FORMAT`/`SQUEUE_FORMAT2` ask for. Unknown fields are
/// reported as Slurm does (an error line each), and the rest prints anyway.
fn formatter(args: &Args) -> JobFormatter {
    let env_short = std::env::var("SQUEUE_FORMAT").ok();
    let env_long = std::env::var("SQUEUE_FORMAT2").ok();
    let explicit = args.format.is_some() || args.format_long.is_some() || args.long || args.start;
    let (formatter, invalid) = match (&args.format, &args.format_long) {
        (Some(f), _) => JobFormatter::lenient(f),
        (None, Some(f)) => JobFormatter::long(f),
        (None, None) if args.long => JobFormatter::long(SQUEUE_LONG),
        (None, None) if args.start => JobFormatter::lenient(SQUEUE_START),
        (None, None) => match (explicit, env_short, env_long) {
            (false, Some(f), _) => JobFormatter::lenient(&f),
            (false, None, Some(f)) => JobFormatter::long(&f),
            _ => JobFormatter::lenient(SQUEUE_DEFAULT),
        },
    };
    for field in invalid {
        eprintln!("squeue: error: Invalid job format specification: {field}");
    }
    formatter
}

fn selection(args: &Args) -> anyhow::Result<Selection> {
    let mut jobs: Vec<String> = args.jobs.iter().filter(|j| !j.is_empty()).cloned().collect();
    if !args.jobs.is_empty() {
        jobs.extend(args.operands.iter().cloned());
    } else if let Some(extra) = args.operands.first() {
        anyhow::bail!("Unrecognized option: {extra}");
    }
    let refs = crate::job_refs::parse_refs(&jobs).map_err(|e| anyhow::anyhow!(e))?;
    let mut users = split(&args.users.clone().or_else(|| std::env::var("SQUEUE_USERS").ok()));
    if args.me {
        users = vec![crate::identity::current_user().0];
    }
    let state_text = args.states.clone().or_else(|| std::env::var("SQUEUE_STATES").ok());
    let mut states = match state_text.as_deref() {
        Some(all) if all.eq_ignore_ascii_case("all") => None,
        Some(list) => Some(parse_states(list)?),
        None => Some(ACTIVE.iter().map(|s| SlurmState(Some(*s))).collect()),
    };
    if args.start && state_text.is_none() {
        states = Some(vec![SlurmState(Some(JobState::Pending))]);
    }
    // Slurm's --json dumps every job slurmctld still holds, those that ended within MinJobAge included.
    if args.json && state_text.is_none() {
        states = None;
    }
    let nodes = match &args.nodelist {
        Some(list) => {
            expand_hostlist(list).map_err(|e| anyhow::anyhow!("'{list}' invalid entry for --nodelist: {e}"))?
        }
        None => Vec::new(),
    };
    Ok(Selection {
        refs,
        users,
        states,
        names: split(&args.names.clone().or_else(|| std::env::var("SQUEUE_NAMES").ok())),
        partitions: split(&args.partitions.clone().or_else(|| std::env::var("SQUEUE_PARTITION").ok())),
        nodes,
        accounts: split(&args.accounts.clone().or_else(|| std::env::var("SQUEUE_ACCOUNT").ok())),
        qos: split(&args.qos.clone().or_else(|| std::env::var("SQUEUE_QOS").ok())),
        reservation: args.reservation.clone(),
    })
}

/// `-t PD,R`: each a long or short Slurm name, refused with Slurm's two error lines.
fn parse_states(list: &str) -> anyhow::Result<Vec<SlurmState>> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            SlurmState::parse(s).ok_or_else(|| {
                anyhow::anyhow!(
                    "Invalid job state specified: {s}\nsqueue: error: Valid job states include: {}\n",
                    crate::format::SLURM_JOB_STATES.join(",")
                )
            })
        })
        .collect()
}

/// One report: the header and a line per job (or per group of pending array tasks). Exit code 1 when a single
/// job asked for by id is unknown, as slurm_load_job answers.
async fn report(
    args: &Args,
    client: &drover_client::Client,
    formatter: &JobFormatter,
    selection: &Selection,
) -> anyhow::Result<i32> {
    let ids = crate::job_refs::base_ids(&selection.refs);
    // Names go to the controller; uids (or a mix) are matched here.
    let users = if selection.users.iter().all(|u| !u.chars().all(|c| c.is_ascii_digit())) {
        selection.users.clone()
    } else {
        Vec::new()
    };
    let server_states = match &selection.states {
        Some(states) if ids.is_empty() && states.iter().all(|s| s.0.is_some_and(|s| !s.is_terminal())) => {
            states.iter().filter_map(|s| s.0).map(|s| s.name().to_string()).collect()
        }
        _ => Vec::new(),
    };
    // Finished jobs leave the active table at once; Slurm keeps them visible for MinJobAge, so jobs named by id,
    // and listings that ask for ended states (`-t all`, `-t CD`), look among the finished too, and those that
    // ended within MinJobAge count as still known.
    let wants_finished =
        selection.states.as_ref().is_none_or(|states| states.iter().any(|s| s.0.is_some_and(|s| s.is_terminal())));
    let now = super::now_ms();
    let filter = drover_client::JobFilter {
        ids: ids.clone(),
        users,
        states: server_states,
        include_finished: !ids.is_empty() || wants_finished,
        stale: args.stale,
        limit: 0,
        finished_since_ms: now.saturating_sub(crate::format::MIN_JOB_AGE_MS),
    };
    let (mut jobs, truncated) = client.list_jobs(&filter).await?;
    jobs.retain(|j| !j.state.is_terminal() || j.end_time_ms.is_some_and(|e| e + crate::format::MIN_JOB_AGE_MS >= now));
    let known = !jobs.is_empty();
    jobs.retain(|j| selection.wants(j));
    if ids.len() == 1 && !known {
        eprintln!("slurm_load_jobs error: Invalid job id specified");
        return Ok(1);
    }
    if let Some(keys) = &args.sort {
        sort_jobs(&mut jobs, keys, now);
    }
    if args.json {
        let (_, config) = client.nodes_and_config(args.stale).await?;
        let cluster = config.map(|c| c.cluster_name).unwrap_or_default();
        let objects: Vec<serde_json::Value> = crate::slurm::arrays::rows(&jobs, args.array)
            .into_iter()
            .map(|row| match row {
                Row::Job(job) => crate::slurm::openapi::job_object(job, &cluster, None),
                Row::Group { first, task_ids } if task_ids.len() == 1 => {
                    crate::slurm::openapi::job_object(first, &cluster, None)
                }
                Row::Group { first, task_ids } => {
                    let a = first.array.as_deref().copied().expect("groups hold array tasks");
                    let tasks = drover_state::array::format_task_ids(&task_ids, a.max_running);
                    crate::slurm::openapi::job_object(first, &cluster, Some(tasks.trim_matches(['[', ']'])))
                }
            })
            .collect();
        let document = crate::slurm::openapi::jobs_document(&objects);
        println!("{}", serde_json::to_string_pretty(&document)?);
        return Ok(0);
    }
    let mut out = String::new();
    if args.start {
        let wanted: Vec<u64> = jobs.iter().map(|j| j.id).collect();
        let insights = if wanted.is_empty() { Vec::new() } else { client.job_insights(&wanted).await? };
        for job in &mut jobs {
            // The expected start of a pending job is the leader's latest backfill reservation for it.
            job.start_time_ms =
                insights.iter().find(|i| i.job_id == job.id).and_then(|i| i.expected_start_s).map(|s| s * 1000);
        }
    }
    if !args.noheader {
        if args.long || args.iterate.is_some() {
            out.push_str(&ctime(now));
            out.push('\n');
        }
        out.push_str(&formatter.header());
        out.push('\n');
    }
    for row in crate::slurm::arrays::rows(&jobs, args.array) {
        match row {
            Row::Job(job) => out.push_str(&formatter.line(job, now)),
            Row::Group { first, task_ids } => {
                let a = first.array.as_deref().copied().expect("groups hold array tasks");
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
    Ok(0)
}

/// `-S`: comma-separated keys, each a format letter with `+` (ascending, the default) or `-`.
fn sort_jobs(jobs: &mut [Job], keys: &str, now_ms: u64) {
    use std::cmp::Ordering;
    let keys: Vec<(bool, char)> = keys
        .split(',')
        .filter_map(|k| {
            let (desc, rest) = match k.strip_prefix('-') {
                Some(r) => (true, r),
                None => (false, k.strip_prefix('+').unwrap_or(k)),
            };
            rest.chars().next().map(|c| (desc, c))
        })
        .collect();
    jobs.sort_by(|a, b| {
        for (desc, key) in &keys {
            let order = match key {
                'i' | 'A' => a.id.cmp(&b.id),
                'j' => a.spec.name.cmp(&b.spec.name),
                'P' => a.partition.cmp(&b.partition),
                'u' => a.spec.user.cmp(&b.spec.user),
                'U' => a.spec.uid.cmp(&b.spec.uid),
                't' | 'T' => a.state.cmp(&b.state),
                'V' => a.submit_time_ms.cmp(&b.submit_time_ms),
                'S' => a.start_time_ms.cmp(&b.start_time_ms),
                'M' => crate::format::elapsed_s(a, now_ms).cmp(&crate::format::elapsed_s(b, now_ms)),
                'l' => a.time_limit_s.cmp(&b.time_limit_s),
                'D' => a.spec.min_nodes.cmp(&b.spec.min_nodes),
                'a' => a.account_name().cmp(b.account_name()),
                'q' => a.qos_name().cmp(b.qos_name()),
                'p' | 'Q' => b.held.cmp(&a.held),
                _ => Ordering::Equal,
            };
            let order = if *desc { order.reverse() } else { order };
            if order != Ordering::Equal {
                return order;
            }
        }
        a.id.cmp(&b.id)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("squeue").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn a_bare_dash_j_takes_the_ids_that_follow_as_slurm_does() {
        let s = selection(&parse(&["-j", "12,13_[1-2]", "-h"])).unwrap();
        assert_eq!(crate::job_refs::base_ids(&s.refs), [12, 13]);
        let s = selection(&parse(&["--jobs=7", "-t", "all"])).unwrap();
        assert_eq!(crate::job_refs::base_ids(&s.refs), [7]);
        assert!(s.states.is_none(), "all means every state");
        let err = selection(&parse(&["12"])).unwrap_err().to_string();
        assert_eq!(err, "Unrecognized option: 12");
    }

    #[test]
    fn states_take_slurms_names_and_codes_and_refuse_others_with_its_words() {
        let s = selection(&parse(&["-t", "pd,RUNNING,CD,BF"])).unwrap();
        let states: Vec<Option<JobState>> = s.states.unwrap().into_iter().map(|s| s.0).collect();
        assert_eq!(states, [Some(JobState::Pending), Some(JobState::Running), Some(JobState::Completed), None]);
        let err = selection(&parse(&["--states=sideways"])).unwrap_err().to_string();
        assert!(err.starts_with("Invalid job state specified: sideways\nsqueue: error: Valid job states include: PENDING,RUNNING,SUSPENDED,COMPLETED"), "{err}");
        let default: Vec<Option<JobState>> =
            selection(&parse(&[])).unwrap().states.unwrap().into_iter().map(|s| s.0).collect();
        assert!(default.contains(&Some(JobState::Pending)) && !default.contains(&Some(JobState::Completed)));
    }

    #[test]
    fn filters_match_names_case_insensitively_and_users_by_name_or_uid() {
        let s = selection(&parse(&["-u", "ada,1001", "-n", "TRAIN", "-p", "gpu"])).unwrap();
        let mut job = Job { partition: "gpu".into(), ..Job::default() };
        job.spec.name = "train".into();
        job.spec.user = "bob".into();
        job.spec.uid = 1001;
        assert!(s.wants(&job));
        job.partition = "debug".into();
        assert!(!s.wants(&job));
    }

    #[test]
    fn sort_keys_order_with_a_direction_each() {
        let mut jobs: Vec<Job> = [(1, "b"), (2, "a"), (3, "b")]
            .iter()
            .map(|(id, p)| Job { id: *id, partition: p.to_string().into(), ..Job::default() })
            .collect();
        sort_jobs(&mut jobs, "P,-i", 0);
        assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [2, 3, 1]);
    }
}
