//! `sprio`: the priority factors of pending jobs, as the leader's latest scheduling pass weighed them.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "sprio", disable_help_flag = true, about = "Priority factors of pending Drover jobs")]
struct Args {
    /// Job ids (comma-separated).
    #[arg(short = 'j', long = "jobs")]
    jobs: Vec<String>,
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    #[arg(long = "controllers")]
    controllers: Option<String>,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    match sprio(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sprio: error: {e:#}");
            1
        }
    }
}

fn sprio(args: &[String]) -> anyhow::Result<()> {
    let args = Args::try_parse_from(std::iter::once("sprio".to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    let client = crate::connect::client(args.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let ids = if args.jobs.is_empty() {
        Vec::new()
    } else {
        rt.block_on(crate::job_refs::resolve(&client, &args.jobs, false))?
    };
    let insights = rt.block_on(client.job_insights(&ids))?;
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&format!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "JOBID", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS"
        ));
    }
    for i in &insights {
        out.push_str(&format!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            i.job_id, i.priority, i.age, i.fairshare, i.job_size, i.partition, i.qos
        ));
    }
    print!("{out}");
    if !ids.is_empty() && insights.is_empty() {
        eprintln!("sprio: no pending job among those ids (only pending jobs have priority factors)");
    }
    Ok(())
}
