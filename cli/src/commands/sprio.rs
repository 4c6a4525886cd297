//! `sprio`: the priority factors of pending jobs, as the leader's latest scheduling pass weighed them.

use crate::command::Common;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "sprio", disable_help_flag = true, about = "Priority factors of pending Drover jobs")]
struct Args {
    /// Job ids (comma-separated).
    #[arg(short = 'j', long = "jobs")]
    jobs: Vec<String>,
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    #[command(flatten)]
    common: Common,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("sprio", sprio(args).map(|()| 0))
}

fn sprio(args: &[String]) -> anyhow::Result<()> {
    let args: Args = crate::command::parse_args("sprio", args)?;
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let ids = if args.jobs.is_empty() {
        Vec::new()
    } else {
        rt.block_on(crate::job_refs::resolve(&client, &args.jobs, false))?
    };
    let insights = rt.block_on(client.job_insights(&ids))?;
    // Array tasks show as `123_4`, as everywhere else.
    let shown: std::collections::HashMap<u64, String> = if insights.is_empty() {
        Default::default()
    } else {
        let filter = drover_client::JobFilter {
            ids: insights.iter().map(|i| i.job_id).collect(),
            states: vec!["PENDING".into()],
            ..Default::default()
        };
        let (jobs, _) = rt.block_on(client.list_jobs(&filter))?;
        jobs.iter().filter(|j| j.array.is_some()).map(|j| (j.id, j.display_id())).collect()
    };
    // Drover's short-job factor has no Slurm column: shown after QOS only when some job has it (its weight is
    // set), so Slurm's layout stays as it is for everyone else and the columns still add up to PRIORITY.
    let short = insights.iter().any(|i| i.short > 0);
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&format!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "JOBID", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS"
        ));
        out.push_str(if short { "      SHORT\n" } else { "\n" });
    }
    for i in &insights {
        out.push_str(&format!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            shown.get(&i.job_id).cloned().unwrap_or_else(|| i.job_id.to_string()),
            i.priority,
            i.age,
            i.fairshare,
            i.job_size,
            i.partition,
            i.qos
        ));
        out.push_str(&if short { format!(" {:>10}\n", i.short) } else { "\n".to_string() });
    }
    print!("{out}");
    if !ids.is_empty() && insights.is_empty() {
        eprintln!("sprio: no pending job among those ids (only pending jobs have priority factors)");
    }
    Ok(())
}
