//! `scancel`: cancels jobs by id or by filter.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "scancel", about = "Cancel Drover jobs")]
struct Args {
    /// Job ids.
    ids: Vec<String>,
    /// Cancel only this user's jobs (with no ids: all of them).
    #[arg(short = 'u', long = "user")]
    user: Option<String>,
    /// Cancel only jobs in this state.
    #[arg(short = 't', long = "state")]
    state: Option<String>,
    /// Cancel only jobs with this name.
    #[arg(short = 'n', long = "name", alias = "jobname")]
    name: Option<String>,
    /// Send this signal to the job's tasks instead of cancelling it (to its steps, not the batch shell, unless
    /// -b or --full says otherwise).
    #[arg(short = 's', long = "signal")]
    signal: Option<String>,
    /// With --signal: signal the batch shell only (not its children, not the steps).
    #[arg(short = 'b', long = "batch")]
    batch: bool,
    /// With --signal: signal everything, the batch shell and its children included.
    #[arg(short = 'f', long = "full")]
    full: bool,
    /// Report what is done.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    #[arg(long = "controllers")]
    controllers: Option<String>,
}

pub fn run(args: &[String]) -> i32 {
    match cancel(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("scancel: error: {e}");
            1
        }
    }
}

fn cancel(args: &[String]) -> anyhow::Result<i32> {
    let args = Args::try_parse_from(std::iter::once("scancel".to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    crate::job_refs::parse_refs(&args.ids).map_err(|e| anyhow::anyhow!(e))?;
    if args.ids.is_empty() && args.user.is_none() && args.state.is_none() && args.name.is_none() {
        anyhow::bail!("No job identification provided");
    }
    if let Some(signal) = &args.signal {
        parse_signal(signal)?;
    }
    let client = crate::connect::client(args.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let mut ids = if args.ids.is_empty() {
        Vec::new()
    } else {
        rt.block_on(crate::job_refs::resolve(&client, &args.ids, false))?
    };
    if args.user.is_some() || args.state.is_some() || args.name.is_some() {
        // Filters select among the active jobs (and narrow explicit ids, as Slurm does).
        let filter = drover_client::JobFilter {
            ids: ids.clone(),
            users: args.user.iter().cloned().collect(),
            states: args.state.iter().cloned().collect(),
            ..Default::default()
        };
        let (jobs, _) = rt.block_on(client.list_jobs(&filter))?;
        ids = jobs.into_iter().filter(|j| args.name.as_ref().is_none_or(|n| *n == j.spec.name)).map(|j| j.id).collect();
        if ids.is_empty() {
            return Ok(0);
        }
    }
    if let Some(signal) = &args.signal {
        // Signals go to the running tasks through their node agents; nothing is logged.
        let target = match (args.batch, args.full) {
            (true, true) => anyhow::bail!("-b/--batch and -f/--full exclude each other"),
            (true, false) => drover_proto::v1::SignalTarget::Batch,
            (false, true) => drover_proto::v1::SignalTarget::Full,
            (false, false) => drover_proto::v1::SignalTarget::Steps,
        };
        let outcomes = rt.block_on(client.signal(&ids, parse_signal(signal)?, target))?;
        let mut code = 0;
        for o in outcomes.iter().filter(|o| !o.ok) {
            eprintln!("scancel: error: Signal job error on job id {}: {}", o.job_id, o.error);
            code = 1;
        }
        return Ok(code);
    }
    let outcomes = rt.block_on(client.cancel(&ids))?;
    let mut code = 0;
    for o in outcomes {
        if o.ok {
            if args.verbose {
                eprintln!("scancel: Terminating job {}", o.job_id);
            }
        } else {
            eprintln!("scancel: error: Kill job error on job id {}: {}", o.job_id, o.error);
            code = 1;
        }
    }
    Ok(code)
}

/// Accepts `TERM`, `SIGTERM`, `USR1`, or a number.
pub fn parse_signal(text: &str) -> anyhow::Result<i32> {
    drover_state::signal::parse_signal(text).map_err(|e| anyhow::anyhow!(e))
}
