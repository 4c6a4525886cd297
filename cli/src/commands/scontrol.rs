//! `scontrol`: `show job [ID]`, `hold ID...`, `release ID...`, `show hostnames [LIST]`.

use drover_state::Job;
use drover_state::slurm_time::{format_duration, format_time_limit};

use crate::format::{compress_hostlist, elapsed_s, format_timestamp};

pub fn run(args: &[String]) -> i32 {
    match dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("scontrol: error: {e}");
            1
        }
    }
}

const USAGE: &str =
    "usage: scontrol show job [ID] | scontrol hold ID... | scontrol release ID... | scontrol show hostnames [HOSTLIST]";

fn dispatch(args: &[String]) -> anyhow::Result<i32> {
    let (controllers, args) = super::sbatch::take_controllers_flag(args);
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["show", "job" | "jobs", rest @ ..] | ["show", rest @ ..]
            if rest.len() <= 1 && words.get(1) != Some(&"hostnames") =>
        {
            show_jobs(controllers.as_deref(), rest.first().copied())
        }
        ["show", "hostnames"] => {
            let list = std::env::var("SLURM_JOB_NODELIST")
                .map_err(|_| anyhow::anyhow!("no hostlist given and SLURM_JOB_NODELIST is not set"))?;
            print_hostnames(&list)
        }
        ["show", "hostnames", list] => print_hostnames(list),
        ["hold", ids @ ..] | ["release", ids @ ..] | ["uhold", ids @ ..] if !ids.is_empty() => {
            hold_release(controllers.as_deref(), words[0], ids)
        }
        _ => anyhow::bail!("invalid command {:?}; {USAGE}", args.join(" ")),
    }
}

fn print_hostnames(list: &str) -> anyhow::Result<i32> {
    for host in expand_hostlist(list).map_err(|e| anyhow::anyhow!(e))? {
        println!("{host}");
    }
    Ok(0)
}

fn show_jobs(controllers: Option<&str>, id: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let jobs = match id {
        Some(id) => {
            let id = super::parse_job_ids(&[id.to_string()]).map_err(|e| anyhow::anyhow!(e))?[0];
            match rt.block_on(client.get_job(id, false, false)) {
                Ok((job, _)) => vec![job],
                Err(drover_client::ClientError::NotFound(_)) => {
                    eprintln!("slurm_load_jobs error: Invalid job id specified");
                    return Ok(1);
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => rt.block_on(client.list_jobs(&drover_client::JobFilter::default()))?.0,
    };
    if jobs.is_empty() {
        println!("No jobs in the system");
    }
    let now = super::now_ms();
    for job in &jobs {
        println!("{}", show_job_text(job, now));
    }
    Ok(0)
}

/// Slurm's `scontrol show job` layout: `Key=Value` pairs, grouped on indented lines.
pub fn show_job_text(job: &Job, now_ms: u64) -> String {
    let s = &job.spec;
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(null)".into());
    let gres = if s.gpus_per_node > 0 { format!(",gres/gpu={}", s.total_gpus()) } else { String::new() };
    let reason = if job.state == drover_state::JobState::Pending { job.reason.name() } else { "None" };
    let stdout =
        s.stdout.clone().unwrap_or_else(|| format!("{}/slurm-%j.out", s.work_dir)).replace("%j", &job.id.to_string());
    let stderr = s.stderr.clone().unwrap_or_else(|| stdout.clone()).replace("%j", &job.id.to_string());
    let nodes = if job.nodes.is_empty() { "(null)".to_string() } else { compress_hostlist(&job.nodes) };
    let lines = [
        format!("JobId={} JobName={}", job.id, s.name),
        format!("UserId={}({}) GroupId={} MCS_label=N/A", s.user, s.uid, s.gid),
        format!("Priority={} Nice=0 Account={} QOS=normal", if job.held { 0 } else { 1 }, opt(&s.account)),
        format!("JobState={} Reason={} Dependency=(null)", job.state.name(), reason),
        format!(
            "Requeue={} Restarts={} BatchFlag=1 Reboot=0 ExitCode={}:{}",
            u8::from(s.requeue.unwrap_or(true)),
            job.restart_count,
            job.exit_code,
            job.exit_signal
        ),
        format!(
            "RunTime={} TimeLimit={} TimeMin=N/A",
            format_duration(elapsed_s(job, now_ms)),
            format_time_limit(job.time_limit_s)
        ),
        format!(
            "SubmitTime={} EligibleTime={}",
            format_timestamp(Some(job.submit_time_ms)),
            format_timestamp(Some(job.submit_time_ms))
        ),
        format!(
            "StartTime={} EndTime={} Deadline=N/A",
            format_timestamp(job.start_time_ms),
            format_timestamp(job.end_time_ms)
        ),
        format!("Partition={} AllocNode:Sid=N/A", job.partition),
        format!("NodeList={nodes}"),
        format!(
            "NumNodes={} NumCPUs={} NumTasks={} CPUs/Task={}",
            s.min_nodes,
            s.total_tasks() * s.cpus_per_task,
            s.total_tasks(),
            s.cpus_per_task
        ),
        format!("TRES=cpu={},node={}{gres}", s.total_tasks() * s.cpus_per_task, s.min_nodes),
        format!("Command={}", s.name),
        format!("WorkDir={}", s.work_dir),
        format!("StdErr={stderr}"),
        "StdIn=/dev/null".to_string(),
        format!("StdOut={stdout}"),
    ];
    let mut out = lines[0].clone();
    for line in &lines[1..] {
        out.push_str("\n   ");
        out.push_str(line);
    }
    out.push('\n');
    out
}

fn hold_release(controllers: Option<&str>, verb: &str, ids: &[&str]) -> anyhow::Result<i32> {
    let ids =
        super::parse_job_ids(&ids.iter().map(|s| s.to_string()).collect::<Vec<_>>()).map_err(|e| anyhow::anyhow!(e))?;
    let client = crate::connect::client(controllers)?;
    let (_, uid, _) = crate::identity::current_user();
    let rt = crate::connect::runtime();
    let outcomes = match verb {
        "release" => rt.block_on(client.release(&ids, uid))?,
        _ => rt.block_on(client.hold(&ids, uid))?,
    };
    let mut code = 0;
    for o in outcomes.iter().filter(|o| !o.ok) {
        eprintln!("scontrol: error: job {}: {}", o.job_id, o.error);
        code = 1;
    }
    Ok(code)
}

/// Expands Slurm hostlist syntax: `gpu[01-03,07],login` → gpu01 gpu02 gpu03 gpu07 login.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    const MAX_HOSTS: usize = 1_000_000;
    let mut hosts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = list.as_bytes();
    let mut items = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().filter(|s| !s.is_empty()) {
        let Some(open) = item.find('[') else {
            hosts.push(item.to_string());
            continue;
        };
        let close = item.rfind(']').ok_or_else(|| format!("unbalanced brackets in hostlist {list:?}"))?;
        let (prefix, suffix) = (&item[..open], &item[close + 1..]);
        for range in item[open + 1..close].split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let width = lo.len();
            let lo: u64 = lo.parse().map_err(|_| format!("bad range {range:?} in hostlist {list:?}"))?;
            let hi: u64 = hi.parse().map_err(|_| format!("bad range {range:?} in hostlist {list:?}"))?;
            if hi < lo || hosts.len() as u64 + (hi - lo) > MAX_HOSTS as u64 {
                return Err(format!("bad range {range:?} in hostlist {list:?}"));
            }
            for n in lo..=hi {
                hosts.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_expand_and_compress_back() {
        let hosts = expand_hostlist("gpu[01-03,07],login").unwrap();
        assert_eq!(hosts, ["gpu01", "gpu02", "gpu03", "gpu07", "login"]);
        assert_eq!(compress_hostlist(&hosts), "login,gpu[01-03,07]");
        assert!(expand_hostlist("gpu[3-1]").is_err());
        assert!(expand_hostlist("gpu[1-2").is_err());
    }
}
