//! `scancel`: cancels (or signals) jobs by id or by filter, as Slurm 22.05's scancel does: options anywhere on
//! the line (`scancel 12 --signal=USR1`), array tasks (`12_3`, `12_[1-3]`, `12_*`), and its two paths: plain ids
//! go straight to the controller; a signal, `--batch` or any filter first selects among the active jobs, and an
//! id that names none of them is reported as Slurm reports it ("Invalid job id specified").

use crate::command::Common;
use clap::Parser;
use drover_state::hostlist::expand_hostlist;
use drover_state::{CommandError, Job, JobState};

use crate::format::SlurmState;

#[derive(Parser, Debug)]
#[command(name = "scancel", about = "Cancel Drover jobs", disable_version_flag = true)]
struct Args {
    /// Job ids (`12`, `12_3`, `12_[1-3]`, `12_*`, comma-separated or several).
    ids: Vec<String>,
    /// Only jobs of this account.
    #[arg(short = 'A', long = "account")]
    account: Option<String>,
    /// Signal the batch shell only (not its children, not the steps).
    #[arg(short = 'b', long = "batch")]
    batch: bool,
    /// Signal everything, the batch shell and its children included.
    #[arg(short = 'f', long = "full")]
    full: bool,
    /// Only jobs with this name.
    #[arg(short = 'n', long = "name", alias = "jobname")]
    name: Option<String>,
    /// Only the current user's jobs.
    #[arg(long = "me")]
    me: bool,
    /// Only jobs of this partition.
    #[arg(short = 'p', long = "partition")]
    partition: Option<String>,
    /// Only jobs of this QOS.
    #[arg(short = 'q', long = "qos")]
    qos: Option<String>,
    /// Only jobs of this reservation.
    #[arg(short = 'R', long = "reservation")]
    reservation: Option<String>,
    /// Send this signal to the job's tasks instead of cancelling it (to its steps, not the batch shell, unless
    /// -b or --full says otherwise).
    #[arg(short = 's', long = "signal")]
    signal: Option<String>,
    /// Only jobs in this state (PENDING, RUNNING or SUSPENDED).
    #[arg(short = 't', long = "state")]
    state: Option<String>,
    /// Only this user's jobs (name or uid; with no ids: all of them).
    #[arg(short = 'u', long = "user")]
    user: Option<String>,
    /// Only jobs on these nodes (a hostlist).
    #[arg(short = 'w', long = "nodelist")]
    nodelist: Option<String>,
    /// Only jobs with this wckey.
    #[arg(long = "wckey")]
    wckey: Option<String>,
    /// Accepted for compatibility (Drover ends jobs at once).
    #[arg(short = 'H', long = "hurry")]
    hurry: bool,
    #[arg(long = "ctld")]
    ctld: bool,
    #[arg(short = 'M', long = "clusters", alias = "cluster")]
    clusters: Option<String>,
    #[arg(long = "sibling")]
    sibling: Option<String>,
    /// No error messages.
    #[arg(short = 'Q', long = "quiet")]
    quiet: bool,
    /// Report what is done (and errors Slurm keeps quiet about).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[arg(long = "usage")]
    usage: bool,
    #[command(flatten)]
    common: Common,
}

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("scancel", cancel(args))
}

/// Jobs the filters keep: active ones (pending, running, suspended) matching every filter given.
#[derive(Debug, Default)]
struct Filters {
    account: Option<String>,
    name: Option<String>,
    partition: Option<String>,
    qos: Option<String>,
    reservation: Option<String>,
    state: Option<SlurmState>,
    uid: Option<u32>,
    nodes: Vec<String>,
    wckey: Option<String>,
}

impl Filters {
    fn any(&self) -> bool {
        self.account.is_some()
            || self.name.is_some()
            || self.partition.is_some()
            || self.qos.is_some()
            || self.reservation.is_some()
            || self.state.is_some()
            || self.uid.is_some()
            || !self.nodes.is_empty()
            || self.wckey.is_some()
    }

    fn keep(&self, job: &Job) -> bool {
        let active = matches!(job.state, JobState::Pending | JobState::Running | JobState::Suspended);
        let same = |want: &Option<String>, have: Option<&str>| want.as_deref().is_none_or(|w| Some(w) == have);
        active
            && same(&self.account, Some(job.account_name()))
            && same(&self.name, Some(&job.spec.name))
            && same(&self.partition, Some(&job.partition))
            && same(&self.qos, Some(job.qos_name()))
            && same(&self.reservation, job.spec.reservation.as_deref())
            && self.state.is_none_or(|s| s.0 == Some(job.state))
            && self.uid.is_none_or(|u| u == job.spec.uid)
            && (self.nodes.is_empty() || job.nodes.iter().any(|n| self.nodes.contains(n)))
            && same(&self.wckey, job.spec.wckey.as_deref().map(|w| w.trim_start_matches('*')))
    }
}

/// The job ids as typed, checked as scancel checks them (`Invalid job id 12x`), `12_*` read as the whole array.
fn job_refs(ids: &[String]) -> anyhow::Result<Vec<drover_state::array::JobRef>> {
    let mut refs = Vec::new();
    for text in crate::job_refs::split_refs(ids) {
        if text.contains('.') {
            anyhow::bail!("Kill job error on job step id {text}: Drover does not cancel single job steps");
        }
        let text = text.strip_suffix("_*").unwrap_or(&text);
        let r = drover_state::array::parse_job_ref(text).map_err(|_| anyhow::anyhow!("Invalid job id {text}"))?;
        refs.push(r);
    }
    Ok(refs)
}

fn filters(args: &Args) -> anyhow::Result<Filters> {
    let state = match &args.state {
        Some(text) => Some(SlurmState::parse(text).ok_or_else(|| {
            crate::command::Bare(format!(
                "Invalid job state specified: {text}\nValid job states are PENDING, RUNNING, and SUSPENDED"
            ))
        })?),
        None => None,
    };
    let user = if args.me { Some(crate::identity::current_user().0) } else { args.user.clone() };
    let uid = match user {
        None => None,
        Some(u) => Some(match u.parse::<u32>() {
            Ok(uid) => uid,
            Err(_) => crate::identity::user_uid(&u).ok_or_else(|| anyhow::anyhow!("Invalid user name: {u}"))?,
        }),
    };
    let nodes = match &args.nodelist {
        Some(list) => expand_hostlist(list).map_err(|e| anyhow::anyhow!("Invalid node list {list:?}: {e}"))?,
        None => Vec::new(),
    };
    Ok(Filters {
        account: args.account.clone(),
        name: args.name.clone(),
        partition: args.partition.clone(),
        qos: args.qos.clone(),
        reservation: args.reservation.clone(),
        state,
        uid,
        nodes,
        wckey: args.wckey.clone().map(|w| w.trim_start_matches('*').to_string()),
    })
}

fn cancel(args: &[String]) -> anyhow::Result<i32> {
    let args: Args = crate::command::parse_args("scancel", args)?;
    let _ = (args.hurry, args.ctld, &args.clusters, &args.sibling);
    if args.version {
        println!("{}", crate::format::version_line());
        return Ok(0);
    }
    if args.usage {
        println!(
            "Usage: scancel [-A account] [--batch] [--full] [--interactive] [-n job_name] [-p partition] [-Q] [-q qos] [-R reservation] [-s signal | integer] [-t PENDING | RUNNING | SUSPENDED] [--usage] [-u user_name] [--hurry] [-V] [-v] [-w hosts...] [--wckey=wckey] [--me] [job_id[_array_id][.step_id]]"
        );
        return Ok(0);
    }
    let refs = job_refs(&args.ids)?;
    let filters = filters(&args)?;
    if refs.is_empty() && !filters.any() {
        anyhow::bail!("No job identification provided");
    }
    let signal = args.signal.as_deref().map(parse_signal).transpose()?;
    if args.batch && args.full {
        anyhow::bail!("-b/--batch and -f/--full exclude each other");
    }
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let report = |text: String| {
        if !args.quiet {
            eprintln!("scancel: error: {text}");
        }
    };
    // Slurm 22.05's plain scancel of a job that has ended, or never was, succeeds and says nothing unless asked (-v);
    // scripts cancel "whatever is left" and check the exit code.
    let gone = |text: &str, why: &str| {
        if args.verbose > 0 {
            eprintln!("scancel: Terminating job {text}");
            report(format!("Kill job error on job id {text}: {why}"));
        }
    };
    let mut code = 0;
    // Slurm's plain path: ids and nothing else go to the controller as they are.
    let plain = signal.is_none() && !args.batch && !filters.any();
    let ids = if plain {
        let filter = drover_client::JobFilter { ids: crate::job_refs::base_ids(&refs), ..Default::default() };
        let (jobs, _) = rt.block_on(client.list_jobs(&filter))?;
        let mut ids = Vec::new();
        for (text, r) in args.ids_without_star().iter().zip(&refs) {
            // An array task that is not (or no longer) active; plain ids go to the controllers as they are.
            match crate::job_refs::select(std::slice::from_ref(r), &jobs) {
                Ok(found) => ids.extend(found),
                Err(_) => gone(text, "Invalid job id specified"),
            }
        }
        ids
    } else {
        // The filtered path: the active jobs, each id checked against them, then the filters.
        let filter = drover_client::JobFilter { ids: crate::job_refs::base_ids(&refs), ..Default::default() };
        let (jobs, _) = rt.block_on(client.list_jobs(&filter))?;
        let active: Vec<Job> = jobs.into_iter().filter(|j| !j.state.is_terminal()).collect();
        let mut named = Vec::new();
        for (text, r) in crate::job_refs::split_refs(&args.ids).iter().zip(&refs) {
            match crate::job_refs::select(std::slice::from_ref(r), &active) {
                Ok(ids) if ids.iter().any(|id| active.iter().any(|j| j.id == *id)) => named.extend(ids),
                _ => {
                    report(format!("Kill job error on job id {text}: Invalid job id specified"));
                    code = 1;
                }
            }
        }
        active
            .iter()
            .filter(|j| (refs.is_empty() || named.contains(&j.id)) && filters.keep(j))
            .map(|j| j.id)
            .collect::<Vec<u64>>()
    };
    if ids.is_empty() {
        return Ok(code);
    }
    if let Some(signal) = signal {
        // Signals go to the running tasks through their node agents; nothing is logged.
        let target = match (args.batch, args.full) {
            (true, _) => drover_proto::v1::SignalTarget::Batch,
            (false, true) => drover_proto::v1::SignalTarget::Full,
            (false, false) => drover_proto::v1::SignalTarget::Steps,
        };
        for o in rt.block_on(client.signal(&ids, signal, target))? {
            if o.ok {
                if args.verbose > 0 {
                    eprintln!("scancel: Signal {signal} to job {}", o.job_id);
                }
            } else {
                report(format!("Kill job error on job id {}: {}", o.job_id, o.error));
                code = 1;
            }
        }
        return Ok(code);
    }
    for o in rt.block_on(client.cancel(&ids))? {
        let refusal = if o.ok { None } else { drover_proto::command_error_from_details(&o.error_details) };
        match refusal {
            None if o.ok => {
                if args.verbose > 0 {
                    eprintln!("scancel: Terminating job {}", o.job_id);
                }
            }
            Some(CommandError::InvalidJobId { .. }) if plain => gone(&o.job_id.to_string(), "Invalid job id specified"),
            Some(CommandError::AlreadyFinished { .. }) if plain => {
                gone(&o.job_id.to_string(), "Job/step already completing or completed")
            }
            _ => {
                report(format!("Kill job error on job id {}: {}", o.job_id, o.error));
                code = 1;
            }
        }
    }
    Ok(code)
}

impl Args {
    /// The ids with `12_*` read as `12` (the whole array).
    fn ids_without_star(&self) -> Vec<String> {
        crate::job_refs::split_refs(&self.ids)
            .into_iter()
            .map(|t| t.strip_suffix("_*").unwrap_or(&t).to_string())
            .collect()
    }
}

/// Accepts `TERM`, `SIGTERM`, `USR1`, or a number.
pub fn parse_signal(text: &str) -> anyhow::Result<i32> {
    drover_state::signal::parse_signal(text).map_err(|e| anyhow::anyhow!(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("scancel").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn options_may_follow_the_job_ids() {
        let args = parse(&["12", "--signal=USR1", "13_[1-2]", "-b", "14_*"]);
        assert_eq!(args.ids, ["12", "13_[1-2]", "14_*"]);
        assert_eq!((args.signal.as_deref(), args.batch), (Some("USR1"), true));
        let refs = job_refs(&args.ids).unwrap();
        assert_eq!(crate::job_refs::base_ids(&refs), [12, 13, 14]);
        assert_eq!(args.ids_without_star(), ["12", "13_[1-2]", "14"]);
        assert_eq!(job_refs(&["12x".into()]).unwrap_err().to_string(), "Invalid job id 12x");
    }

    #[test]
    fn filters_keep_only_active_jobs_matching_all_of_them() {
        let args = parse(&["-t", "PD", "-n", "train", "-p", "gpu"]);
        let f = filters(&args).unwrap();
        let mut job = Job { partition: "gpu".into(), ..Job::default() };
        job.spec.name = "train".into();
        assert!(f.keep(&job));
        job.state = JobState::Running;
        assert!(!f.keep(&job), "not pending");
        let err = filters(&parse(&["-t", "sideways"])).unwrap_err().to_string();
        assert_eq!(err, "Invalid job state specified: sideways\nValid job states are PENDING, RUNNING, and SUSPENDED");
        let done = Job { state: JobState::Completed, ..Job::default() };
        assert!(!Filters::default().keep(&done), "finished jobs are never selected");
    }
}
