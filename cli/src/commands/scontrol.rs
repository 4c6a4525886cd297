//! `scontrol`: `show job [ID]`, `hold ID...`, `release ID...`, `show hostnames [LIST]`.

use drover_state::slurm_time::{format_duration, format_time_limit};
use drover_state::{Job, Limit};

use drover_state::hostlist::{compress_hostlist, expand_hostlist};

use crate::format::{elapsed_s, format_timestamp};

pub fn run(args: &[String]) -> i32 {
    match dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("scontrol: error: {e}");
            1
        }
    }
}

const USAGE: &str = "usage: scontrol show job [ID] | scontrol requeue ID[,ID...] | scontrol requeuehold ID[,ID...] | scontrol write batch_script ID [FILE|-] | scontrol top ID... | scontrol update jobid=ID [TimeLimit=T] [Nice=N] [QOS=Q] [Dependency=D] | scontrol create reservation ReservationName=N StartTime=T (Duration=D|EndTime=T) (Nodes=LIST|NodeCnt=N|TRES=gres/gpu=N) (Users=U,..|Accounts=A,..) [Flags=MAINT] | scontrol update ReservationName=N ... | scontrol delete ReservationName=N | scontrol show reservation [NAME] | scontrol show node [NAME] | scontrol hold ID... | scontrol release ID... | scontrol show hostnames [HOSTLIST] | scontrol update nodename=LIST state=drain|resume [reason=TEXT] | scontrol show partition [NAME] | scontrol update partitionname=NAME [state=UP|DOWN|DRAIN|INACTIVE] [maxtime=T] [defaulttime=T] [maxnodes=N] [nodes=LIST] [default=yes]";

fn is_reservation(word: &str) -> bool {
    matches!(word.to_ascii_lowercase().as_str(), "reservation" | "reservations" | "res")
}

fn dispatch(args: &[String]) -> anyhow::Result<i32> {
    let (controllers, args) = super::sbatch::take_controllers_flag(args);
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["update", first, rest @ ..]
            if ["jobid=", "job="].iter().any(|p| first.to_ascii_lowercase().starts_with(p)) =>
        {
            update_job(controllers.as_deref(), first, rest)
        }
        ["create", kind, rest @ ..] if is_reservation(kind) => super::reservation::create(controllers.as_deref(), rest),
        ["create", first, rest @ ..] if first.to_ascii_lowercase().starts_with("reservation") => {
            super::reservation::create(controllers.as_deref(), &[&[*first], rest].concat())
        }
        ["update", first, rest @ ..] if first.to_ascii_lowercase().starts_with("reservationname=") => {
            super::reservation::update(controllers.as_deref(), &[&[*first], rest].concat())
        }
        ["delete", first] if first.to_ascii_lowercase().starts_with("reservationname=") => {
            super::reservation::delete(controllers.as_deref(), first)
        }
        ["delete", kind, name] if is_reservation(kind) => {
            super::reservation::delete(controllers.as_deref(), &format!("reservationname={name}"))
        }
        ["show", kind, rest @ ..] if is_reservation(kind) && rest.len() <= 1 => {
            super::reservation::show(controllers.as_deref(), rest.first().copied())
        }
        ["show", "node" | "nodes", rest @ ..] if rest.len() <= 1 => {
            show_nodes(controllers.as_deref(), rest.first().copied())
        }
        ["update", first, rest @ ..] if first.to_ascii_lowercase().starts_with("partitionname=") => {
            update_partition(controllers.as_deref(), first, rest)
        }
        ["update", rest @ ..] if !rest.is_empty() => update_nodes(controllers.as_deref(), rest),
        ["show", "partition" | "partitions", rest @ ..] if rest.len() <= 1 => {
            show_partitions(controllers.as_deref(), rest.first().copied())
        }
        ["show", "job" | "jobs", rest @ ..] | ["show", rest @ ..]
            if rest.len() <= 1 && words.get(1) != Some(&"hostnames") =>
        {
            show_jobs(controllers.as_deref(), rest.first().copied())
        }
        ["write", "batch_script", id, rest @ ..] if rest.len() <= 1 => {
            write_batch_script(controllers.as_deref(), id, rest.first().copied())
        }
        ["show", "hostnames"] => {
            let list = std::env::var("SLURM_JOB_NODELIST")
                .map_err(|_| anyhow::anyhow!("no hostlist given and SLURM_JOB_NODELIST is not set"))?;
            print_hostnames(&list)
        }
        ["show", "hostnames", list] => print_hostnames(list),
        ["requeue", ids @ ..] if !ids.is_empty() => requeue(controllers.as_deref(), ids, false),
        ["requeuehold", ids @ ..] if !ids.is_empty() => requeue(controllers.as_deref(), ids, true),
        ["hold", ids @ ..] | ["release", ids @ ..] | ["uhold", ids @ ..] | ["top", ids @ ..] if !ids.is_empty() => {
            hold_release(controllers.as_deref(), words[0], ids)
        }
        _ => anyhow::bail!("invalid command {:?}; {USAGE}", args.join(" ")),
    }
}

/// `scontrol write batch_script ID [FILE]`: the job's script as submitted, to `slurm-ID.sh` (Slurm's default),
/// FILE, or standard output for `-`. Only its owner, operators and administrators may read it.
fn write_batch_script(controllers: Option<&str>, id: &str, file: Option<&str>) -> anyhow::Result<i32> {
    let job_id: u64 = id.parse().map_err(|_| anyhow::anyhow!("Invalid job id specified: {id}"))?;
    let client = crate::connect::client(controllers)?;
    let (_, script) = crate::connect::runtime().block_on(client.get_job(job_id, true, false))?;
    match file.unwrap_or("") {
        "-" => print!("{script}"),
        name => {
            let path = if name.is_empty() { format!("slurm-{job_id}.sh") } else { name.to_string() };
            std::fs::write(&path, script).map_err(|e| anyhow::anyhow!("cannot write {path}: {e}"))?;
            println!("batch script for job {job_id} written to {path}");
        }
    }
    Ok(0)
}

/// `scontrol update jobid=12 TimeLimit=1:00:00 Nice=10 QOS=debug Dependency=afterok:11` (a pending job, or every
/// task of an array).
fn update_job(controllers: Option<&str>, first: &str, words: &[&str]) -> anyhow::Result<i32> {
    let id = first.split_once('=').map(|(_, v)| v).unwrap_or_default().to_string();
    let mut update = drover_state::JobUpdate::default();
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(|| anyhow::anyhow!("invalid update argument {word:?}"))?;
        match key.to_ascii_lowercase().as_str() {
            "timelimit" => match drover_state::slurm_time::parse_time_limit(value) {
                Ok(Some(s)) => update.time_limit_s = Some(s),
                Ok(None) => update.time_unlimited = true,
                Err(e) => anyhow::bail!("Invalid time limit {value:?}: {e}"),
            },
            "nice" => update.nice = Some(value.parse().map_err(|_| anyhow::anyhow!("Invalid Nice {value:?}"))?),
            "qos" => update.qos = Some(value.to_string()),
            "dependency" => {
                update.dependency =
                    Some(drover_state::dependency::parse_dependency_value(value).map_err(|e| anyhow::anyhow!(e))?)
            }
            other => anyhow::bail!("Update of job {other} is not supported (TimeLimit, Nice, QOS, Dependency)"),
        }
    }
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let mut code = 0;
    for job in rt.block_on(crate::job_refs::resolve(&client, &[id], false))? {
        if let Err(e) = rt.block_on(client.update_job(job, &update)) {
            eprintln!("scontrol: error: job {job}: {e}");
            code = 1;
        }
    }
    Ok(code)
}

/// `scontrol update partitionname=gpu state=down maxtime=1-00:00:00 maxnodes=UNLIMITED nodes=gpu[01-08] default=yes`.
fn update_partition(controllers: Option<&str>, first: &str, words: &[&str]) -> anyhow::Result<i32> {
    let name = first.split_once('=').map(|(_, v)| v).unwrap_or_default();
    let mut update = drover_state::PartitionUpdate { name: name.to_string(), ..Default::default() };
    let limit = |value: &str| -> anyhow::Result<Option<u64>> {
        drover_state::slurm_time::parse_time_limit(value)
            .map_err(|e| anyhow::anyhow!("Invalid time limit {value:?}: {e}"))
    };
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(|| anyhow::anyhow!("invalid update argument {word:?}"))?;
        match key.to_ascii_lowercase().as_str() {
            "state" => {
                update.state = Some(match value.to_ascii_uppercase().as_str() {
                    "UP" => drover_state::PartitionState::Up,
                    "DOWN" => drover_state::PartitionState::Down,
                    "DRAIN" => drover_state::PartitionState::Drain,
                    "INACTIVE" => drover_state::PartitionState::Inactive,
                    _ => anyhow::bail!("Invalid partition state {value:?}: UP, DOWN, DRAIN or INACTIVE"),
                })
            }
            "maxtime" => update.max_time_s = Some(Limit::from_option(limit(value)?)),
            "defaulttime" => update.default_time_s = Some(Limit::from_option(limit(value)?)),
            "maxnodes" if value.eq_ignore_ascii_case("unlimited") => update.max_nodes = Some(Limit::Unlimited),
            "maxnodes" => {
                let n = value.parse().map_err(|_| anyhow::anyhow!("Invalid MaxNodes {value:?}"))?;
                update.max_nodes = Some(Limit::At(n));
            }
            "nodes" => update.nodes = Some(value.to_string()),
            "default" => update.make_default = value.eq_ignore_ascii_case("yes"),
            "maxtresperjob" => update.max_gpus_per_job = Some(gpu_limit(value)?),
            "prioritytier" => {
                update.priority_tier =
                    Some(value.parse().map_err(|_| anyhow::anyhow!("Invalid PriorityTier {value:?}"))?)
            }
            "allowaccounts" => update.allow_accounts = Some(value.split(',').map(str::to_string).collect()),
            "allowqos" => update.allow_qos = Some(value.split(',').map(str::to_string).collect()),
            "preemptmode" => {
                update.preempt_mode = Some(match value.to_ascii_uppercase().as_str() {
                    "OFF" => drover_state::PreemptMode::Off,
                    "REQUEUE" => drover_state::PreemptMode::Requeue,
                    _ => anyhow::bail!("Invalid PreemptMode {value:?}: OFF or REQUEUE"),
                })
            }
            other => anyhow::bail!(
                "Update of partition {other} is not supported (State, MaxTime, DefaultTime, MaxNodes, MaxTRESPerJob=gres/gpu=N, Nodes, Default, PriorityTier, AllowAccounts, AllowQos, PreemptMode)"
            ),
        }
    }
    let client = crate::connect::client(controllers)?;
    crate::connect::runtime().block_on(client.update_partition(&update))?;
    Ok(0)
}

/// `MaxTRESPerJob=gres/gpu=N` (or `gres/gpu=UNLIMITED`/`-1`).
fn gpu_limit(value: &str) -> anyhow::Result<Limit<u32>> {
    let bad = || anyhow::anyhow!("Invalid MaxTRESPerJob {value:?}: use gres/gpu=N");
    let lower = value.to_ascii_lowercase();
    match lower.strip_prefix("gres/gpu=").ok_or_else(bad)? {
        "unlimited" | "-1" => Ok(Limit::Unlimited),
        count => Ok(Limit::At(count.parse().map_err(|_| bad())?)),
    }
}

/// Slurm's `scontrol show partition` layout.
fn show_partitions(controllers: Option<&str>, name: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    let (nodes, config) = crate::connect::runtime().block_on(client.nodes_and_config(false))?;
    let config = config.unwrap_or_default();
    let mut state = drover_state::State::default();
    state.meta.config = Some(config.clone());
    let mut shown = 0;
    for p in config.partitions.iter().filter(|p| name.is_none_or(|n| n == p.name)) {
        shown += 1;
        let members: Vec<String> =
            nodes.iter().filter(|n| state.node_in_partition(&n.info, &p.name)).map(|n| n.info.name.clone()).collect();
        let gpus: usize = nodes.iter().filter(|n| members.contains(&n.info.name)).map(|n| n.info.gpus.len()).sum();
        println!(
            "PartitionName={}\n   AllowAccounts={} AllowQos={}\n   Default={} State={} PriorityTier={} PreemptMode={}\n   MaxNodes={} MaxTime={} DefaultTime={} MaxTRESPerJob={}\n   Nodes={}\n   TotalNodes={} TotalGPUs={}\n",
            p.name,
            if p.allow_accounts.is_empty() { "ALL".to_string() } else { p.allow_accounts.join(",") },
            if p.allow_qos.is_empty() { "ALL".to_string() } else { p.allow_qos.join(",") },
            if p.default { "YES" } else { "NO" },
            p.state.name(),
            p.priority_tier,
            p.preempt_mode.name(),
            p.max_nodes.map_or("UNLIMITED".to_string(), |n| n.to_string()),
            format_time_limit(p.max_time_s),
            p.default_time_s.map_or("NONE".to_string(), |t| format_time_limit(Some(t))),
            p.max_gpus_per_job.map_or("(null)".to_string(), |g| format!("gres/gpu={g}")),
            if members.is_empty() { "(null)".to_string() } else { compress_hostlist(&members) },
            members.len(),
            gpus
        );
    }
    if shown == 0 {
        eprintln!("Partition {} not found", name.unwrap_or(""));
        return Ok(1);
    }
    Ok(0)
}

/// `scontrol update nodename=gpu[01-02] state=drain reason="bad fan"` (and `state=resume`/`undrain`).
fn update_nodes(controllers: Option<&str>, words: &[&str]) -> anyhow::Result<i32> {
    let mut names = None;
    let mut state = None;
    let mut reason = String::new();
    for word in words {
        let (key, value) =
            word.split_once('=').ok_or_else(|| anyhow::anyhow!("invalid update argument {word:?}; {USAGE}"))?;
        match key.to_ascii_lowercase().as_str() {
            "nodename" | "node" => names = Some(expand_hostlist(value).map_err(|e| anyhow::anyhow!(e))?),
            "state" => state = Some(value.to_ascii_lowercase()),
            "reason" => reason = value.trim_matches('"').to_string(),
            other => anyhow::bail!("Update of {other} is not supported; {USAGE}"),
        }
    }
    let names = names.ok_or_else(|| anyhow::anyhow!("update needs nodename=LIST"))?;
    let drain = match state.as_deref() {
        Some("drain") => true,
        Some("resume") | Some("undrain") | Some("idle") => false,
        other => anyhow::bail!("Invalid node state specified: {}", other.unwrap_or("(none)")),
    };
    let client = crate::connect::client(controllers)?;
    crate::connect::runtime().block_on(client.drain_nodes(&names, drain, &reason))?;
    Ok(0)
}

/// Slurm's `scontrol show node` layout.
fn show_nodes(controllers: Option<&str>, name: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    let nodes = crate::connect::runtime().block_on(client.list_nodes(false))?;
    let mut shown = 0;
    for node in nodes.iter().filter(|n| name.is_none_or(|x| x == n.info.name)) {
        shown += 1;
        let info = &node.info;
        let gres = if info.gpus.is_empty() {
            "(null)".to_string()
        } else if info.gpu_type.is_empty() {
            format!("gpu:{}", info.gpus.len())
        } else {
            format!("gpu:{}:{}", info.gpu_type, info.gpus.len())
        };
        let topology: Vec<String> = info.topology.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "NodeName={} Arch=x86_64 CoresPerSocket=1\n   CPUAlloc={} CPUTot={} CPULoad=N/A\n   AvailableFeatures={}\n   Gres={} GresUsed=gpu:{}\n   NodeAddr={} NodeHostName={} Version={}\n   RealMemory={} State={} Partitions={}\n   Topology={}\n   Reason={}\n",
            info.name,
            node.allocated_cpus,
            info.cpus,
            if info.features.is_empty() { "(null)".to_string() } else { info.features.join(",") },
            gres,
            node.allocated_gpus.len(),
            info.host,
            info.name,
            info.version,
            info.memory_mb,
            node.state_name(),
            if info.partitions.is_empty() { "(default)".to_string() } else { info.partitions.join(",") },
            if topology.is_empty() { "(null)".to_string() } else { topology.join(",") },
            if node.reason.is_empty() { "(null)".to_string() } else { node.reason.clone() },
        );
    }
    if shown == 0 {
        match name {
            Some(n) => {
                eprintln!("Node {n} not found");
                return Ok(1);
            }
            None => println!("No nodes in the system"),
        }
    }
    Ok(0)
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
            let mut jobs = Vec::new();
            for id in rt.block_on(crate::job_refs::resolve(&client, &[id.to_string()], true))? {
                match rt.block_on(client.get_job(id, false, false)) {
                    Ok((job, _)) => jobs.push(job),
                    Err(drover_client::ClientError::NotFound(_)) => {
                        eprintln!("slurm_load_jobs error: Invalid job id specified");
                        return Ok(1);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            jobs
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
    let array = match job.array {
        Some(a) => format!(
            "JobId={} ArrayJobId={} ArrayTaskId={} ArrayTaskThrottle={} JobName={}",
            job.id,
            a.array_job_id,
            a.task_id,
            a.max_running.unwrap_or(0),
            s.name
        ),
        None => format!("JobId={} JobName={}", job.id, s.name),
    };
    let (account, qos) = (job.account_name(), job.qos_name());
    let dependency = drover_state::dependency::format_dependency(&s.dependency, s.dependency_any);
    let lines = [
        array,
        format!("UserId={}({}) GroupId={} MCS_label=N/A", s.user, s.uid, s.gid),
        format!("Priority={} Nice={} Account={account} QOS={qos}", if job.held { 0 } else { 1 }, s.nice),
        format!("JobState={} Reason={} Dependency={dependency}", job.state.name(), reason),
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
        format!("Partition={} AllocNode:Sid=N/A Reservation={}", job.partition, opt(&s.reservation)),
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
    let mut lines = lines.to_vec();
    // Checkpoints and restarts (Drover's own lines): where this incarnation writes, what it resumes from, and
    // how each earlier incarnation ended.
    lines.push(format!(
        "Incarnation={} CheckpointDir={} Failures={}",
        job.incarnation,
        job.checkpoint_dir(),
        job.failures
    ));
    if let Some(c) = &job.checkpoint {
        lines.push(format!(
            "Checkpoint={} CheckpointStep={} CheckpointIncarnation={} CheckpointTime={}",
            c.path,
            c.step.map_or_else(|| "N/A".to_string(), |s| s.to_string()),
            c.incarnation,
            format_timestamp(Some(c.time_ms))
        ));
    }
    if let Some(r) = &job.requeue {
        lines.push(format!("Requeueing={:?} Reason={}", r.kind, r.reason.replace(' ', "_")));
    }
    for h in &job.history {
        lines.push(format!(
            "Restart[{}]: State={} NodeList={} StartTime={} EndTime={} ResumedFrom={} Reason={}",
            h.incarnation,
            h.state.name(),
            if h.nodes.is_empty() { "(null)" } else { &h.nodes },
            format_timestamp(h.start_ms),
            format_timestamp(Some(h.end_ms)),
            h.resumed_from.as_deref().unwrap_or("(null)"),
            h.reason.replace(' ', "_")
        ));
    }
    let mut out = lines[0].clone();
    for line in &lines[1..] {
        out.push_str("\n   ");
        out.push_str(line);
    }
    out.push('\n');
    out
}

/// `scontrol requeue ID[,ID...]` / `requeuehold`: running jobs end (their --signal warning first) and go back to
/// the queue as their next incarnation; from inside a job too (`scontrol requeue $SLURM_JOB_ID`).
fn requeue(controllers: Option<&str>, ids: &[&str], hold: bool) -> anyhow::Result<i32> {
    let refs: Vec<String> =
        ids.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()).map(str::to_string).collect();
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let ids = rt.block_on(crate::job_refs::resolve(&client, &refs, false))?;
    let outcomes = rt.block_on(client.requeue(&ids, hold))?;
    let mut code = 0;
    for o in outcomes.iter().filter(|o| !o.ok) {
        eprintln!("scontrol: error: Requeue of job {} failed: {}", o.job_id, o.error);
        code = 1;
    }
    Ok(code)
}

fn hold_release(controllers: Option<&str>, verb: &str, ids: &[&str]) -> anyhow::Result<i32> {
    let refs: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let ids = rt.block_on(crate::job_refs::resolve(&client, &refs, false))?;
    let outcomes = match verb {
        "release" => rt.block_on(client.release(&ids))?,
        "top" => rt.block_on(client.top(&ids))?,
        _ => rt.block_on(client.hold(&ids))?,
    };
    let mut code = 0;
    for o in outcomes.iter().filter(|o| !o.ok) {
        eprintln!("scontrol: error: job {}: {}", o.job_id, o.error);
        code = 1;
    }
    Ok(code)
}
