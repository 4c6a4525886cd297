//! `scontrol`: `show job|node|partition|config|reservation|hostnames|hostlist|hostlistsorted`, `ping`,
//! `hold`/`release`/`uhold`/`top`, `requeue`/`requeuehold`, `update` (jobs, nodes, partitions, reservations),
//! `create`/`delete reservation`, `write batch_script`, `version`; with Slurm 22.05's layouts and its global
//! options (`-o` one line per record, `-d` details, `-Q` quiet), anywhere on the line.

use drover_state::hostlist::{compress_hostlist, expand_hostlist};
use drover_state::slurm_time::{format_duration_long, format_time_limit_long};
use drover_state::{ClusterConfig, Job, JobState, Limit, Node};

mod reservation;

use crate::format::{Tres, elapsed_s, format_timestamp, mem_mb, timestamp_or_unknown};
use crate::slurm::nodes::{node_gres, node_gres_used, node_state};

pub fn run(args: &[String]) -> i32 {
    let (options, words) = match global_options(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("scontrol: error: {e}");
            return 1;
        }
    };
    if options.version {
        println!("{}", crate::format::version_line());
        return 0;
    }
    match dispatch(&options, &words) {
        Ok(code) => code,
        Err(e) => {
            if !options.quiet {
                eprintln!("{}", crate::command::error_text("scontrol", &e, false));
            }
            1
        }
    }
}

const USAGE: &str = "usage: scontrol [-o] [-d] [-Q] show job [ID] | show node [NAME] | show partition [NAME] | show config | show reservation [NAME] | show hostnames [HOSTLIST] | show hostlist HOSTS | ping | version | requeue ID[,ID...] | requeuehold ID[,ID...] | write batch_script ID [FILE|-] | top ID... | hold ID... | release ID... | update jobid=ID [TimeLimit=[+|-]T] [Nice=N] [QOS=Q] [Dependency=D] [JobName=N] [Comment=C] [Partition=P] | create reservation ReservationName=N StartTime=T (Duration=D|EndTime=T) (Nodes=LIST|NodeCnt=N|TRES=gres/gpu=N) (Users=U,..|Accounts=A,..) [Flags=MAINT] | update ReservationName=N ... | delete ReservationName=N | update nodename=LIST [state=drain|resume [reason=TEXT]] [spare=yes|no] | update partitionname=NAME [state=UP|DOWN|DRAIN|INACTIVE] [maxtime=T] [defaulttime=T] [maxnodes=N] [nodes=LIST] [default=yes]";

/// scontrol's options, which Slurm takes anywhere on the line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Options {
    controllers: Option<String>,
    /// `-o`: each record on one line.
    one_liner: bool,
    /// `-d`: more detail (the derived exit code, per-node allocations).
    details: bool,
    /// `-Q`: no error messages.
    quiet: bool,
    /// `-V`: the version, whatever else is asked.
    version: bool,
}

/// Takes scontrol's own options out of the words, wherever they are (`scontrol show job 12 -o`).
fn global_options(args: &[String]) -> anyhow::Result<(Options, Vec<String>)> {
    let mut options = Options::default();
    let mut words = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "-o" | "--oneliner" => options.one_liner = true,
            "-d" | "--details" => options.details = true,
            "-dd" => options.details = true,
            "-Q" | "--quiet" => options.quiet = true,
            "-a" | "--all" | "-v" | "-vv" | "--verbose" | "--local" | "--sibling" | "--federation" => {}
            "-V" | "--version" => options.version = true,
            "-M" | "--clusters" | "-u" | "--uid" => {
                iter.next();
            }
            "--controllers" => {
                options.controllers =
                    Some(iter.next().ok_or_else(|| anyhow::anyhow!("--controllers needs a value"))?.clone())
            }
            other => match other.strip_prefix("--controllers=") {
                Some(list) => options.controllers = Some(list.to_string()),
                None if other.starts_with("--clusters=") || other.starts_with("-M") && other.len() > 2 => {}
                None => words.push(other.to_string()),
            },
        }
    }
    Ok((options, words))
}

fn is_reservation(word: &str) -> bool {
    matches!(word.to_ascii_lowercase().as_str(), "reservation" | "reservations" | "res")
}

fn dispatch(options: &Options, args: &[String]) -> anyhow::Result<i32> {
    let controllers = options.controllers.clone();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let verb = lower.first().map(String::as_str).unwrap_or("");
    let entity = lower.get(1).map(String::as_str).unwrap_or("");
    match words.as_slice() {
        ["version"] => {
            println!("{}", crate::format::version_line());
            Ok(0)
        }
        ["ping"] => ping(controllers.as_deref()),
        ["update", first, rest @ ..]
            if ["jobid=", "job="].iter().any(|p| first.to_ascii_lowercase().starts_with(p)) =>
        {
            update_job(controllers.as_deref(), first, rest)
        }
        ["create", kind, rest @ ..] if is_reservation(kind) => reservation::create(controllers.as_deref(), rest),
        ["create", first, rest @ ..] if first.to_ascii_lowercase().starts_with("reservation") => {
            reservation::create(controllers.as_deref(), &[&[*first], rest].concat())
        }
        ["update", first, rest @ ..] if first.to_ascii_lowercase().starts_with("reservationname=") => {
            reservation::update(controllers.as_deref(), &[&[*first], rest].concat())
        }
        ["delete", first] if first.to_ascii_lowercase().starts_with("reservationname=") => {
            reservation::delete(controllers.as_deref(), first)
        }
        ["delete", kind, name] if is_reservation(kind) => {
            reservation::delete(controllers.as_deref(), &format!("reservationname={name}"))
        }
        ["show", kind, rest @ ..] if is_reservation(kind) && rest.len() <= 1 => {
            reservation::show(controllers.as_deref(), rest.first().copied())
        }
        ["update", first, rest @ ..] if first.to_ascii_lowercase().starts_with("partitionname=") => {
            update_partition(controllers.as_deref(), first, rest)
        }
        ["update", rest @ ..] if !rest.is_empty() => update_nodes(controllers.as_deref(), rest),
        ["show", _, rest @ ..] if matches!(entity, "node" | "nodes") && rest.len() <= 1 => {
            show_nodes(options, rest.first().copied())
        }
        ["show", _, rest @ ..] if matches!(entity, "partition" | "partitions") && rest.len() <= 1 => {
            show_partitions(controllers.as_deref(), rest.first().copied())
        }
        ["show", _] if matches!(entity, "config" | "conf" | "configuration") => show_config(controllers.as_deref()),
        ["show", _] if entity == "hostnames" => {
            let list = std::env::var("SLURM_JOB_NODELIST")
                .map_err(|_| anyhow::anyhow!("host list is empty and SLURM_JOB_NODELIST is not set"))?;
            print_hostnames(&list)
        }
        ["show", _, list] if entity == "hostnames" => print_hostnames(list),
        ["show", _, list] if matches!(entity, "hostlist" | "hostlistsorted") => {
            print_hostlist(list, entity == "hostlistsorted")
        }
        ["show", _, rest @ ..] if matches!(entity, "job" | "jobs") && rest.len() <= 1 => {
            show_jobs(options, rest.first().copied())
        }
        // `scontrol show 12` reads as `show job 12` (Drover's shorthand); `scontrol show` alone lists every job.
        ["show", rest @ ..]
            if rest.len() <= 1 && rest.first().is_none_or(|w| w.chars().all(|c| c.is_ascii_digit() || c == '_')) =>
        {
            show_jobs(options, rest.first().copied())
        }
        ["write", "batch_script", id, rest @ ..] if rest.len() <= 1 => {
            write_batch_script(controllers.as_deref(), id, rest.first().copied())
        }
        [_, rest @ ..] if verb == "reboot" || verb == "reboot_nodes" => reboot(controllers.as_deref(), rest, false),
        [_, rest @ ..] if verb == "cancel_reboot" => reboot(controllers.as_deref(), rest, true),
        ["requeue", ids @ ..] if !ids.is_empty() => requeue(controllers.as_deref(), &job_list(ids), false),
        ["requeuehold", ids @ ..] if !ids.is_empty() => requeue(controllers.as_deref(), &job_list(ids), true),
        [_, ids @ ..]
            if matches!(verb, "hold" | "release" | "uhold" | "top" | "suspend" | "resume") && !ids.is_empty() =>
        {
            hold_release(controllers.as_deref(), verb, &job_list(ids))
        }
        // Slurm's words, on stderr, exit 1 (`scontrol --help` lists the commands).
        [first, ..] => Err(crate::command::Bare(format!("invalid keyword: {first}")).into()),
        [] => anyhow::bail!("no command; {USAGE}"),
    }
}

/// Job lists as the job verbs take them: `12 13`, `12,13`, `JobId=12` (Slurm's spelling in scripts).
fn job_list<'a>(words: &[&'a str]) -> Vec<&'a str> {
    words
        .iter()
        .map(|w| match w.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("jobid") || key.eq_ignore_ascii_case("job") => value,
            _ => w,
        })
        .collect()
}

/// `scontrol ping`: each controller replica, the leader as the primary, as Slurm lists slurmctlds.
fn ping(controllers: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    let status = crate::connect::runtime().block_on(client.cluster_status())?;
    print!("{}", ping_text(&status.replicas));
    Ok(if status.replicas.iter().any(|r| r.reachable) { 0 } else { 1 })
}

fn ping_text(replicas: &[drover_proto::v1::ReplicaStatus]) -> String {
    let mut ordered: Vec<&drover_proto::v1::ReplicaStatus> = replicas.iter().collect();
    ordered.sort_by_key(|r| (r.role != "leader", r.id));
    let count = ordered.len();
    let mut out = String::new();
    for (i, r) in ordered.iter().enumerate() {
        let mode = match i {
            0 => "primary".to_string(),
            1 if count == 2 => "backup".to_string(),
            n => format!("backup{n}"),
        };
        out.push_str(&format!("Slurmctld({mode}) at {} is {}\n", r.address, if r.reachable { "UP" } else { "DOWN" }));
    }
    out
}

/// `scontrol show config`: the `Key = value` lines tools grep (`SLURM_VERSION`, `ClusterName`, `SelectType`,
/// `MaxArraySize`, `MinJobAge`, ...), with Drover's equivalent of each, then the controllers' status.
fn show_config(controllers: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let (_, config) = rt.block_on(client.nodes_and_config(false))?;
    let status = rt.block_on(client.cluster_status())?;
    let config = config.unwrap_or_default();
    let now = super::now_ms();
    println!("Configuration data as of {}", format_timestamp(Some(now)));
    for (key, value) in config_pairs(&config, &status, client.addresses()) {
        println!("{key:<23} = {value}");
    }
    println!();
    print!("{}", ping_text(&status.replicas));
    Ok(0)
}

fn config_pairs(
    config: &ClusterConfig,
    status: &drover_proto::v1::ClusterStatusReply,
    addresses: &[String],
) -> Vec<(String, String)> {
    let preempts = config.partitions.iter().any(|p| p.preempt_mode == drover_state::PreemptMode::Requeue);
    let s = &config.scheduler;
    let days = |secs: u64| {
        let (d, h, m) = (secs / 86_400, (secs / 3600) % 24, (secs / 60) % 60);
        format!("{d}-{h:02}:{m:02}:00")
    };
    let mut pairs: Vec<(String, String)> = [
        ("AccountingStorageEnforce", "associations,limits,qos".to_string()),
        ("AccountingStorageHost", addresses.join(",")),
        ("AccountingStorageTRES", "cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu".to_string()),
        // The replicated job history plays slurmdbd's part: sacct always works.
        ("AccountingStorageType", "accounting_storage/slurmdbd".to_string()),
        ("AuthType", "auth/drover".to_string()),
        ("ClusterName", config.cluster_name.clone()),
        ("DefMemPerNode", "UNLIMITED".to_string()),
        ("EnforcePartLimits", "ALL".to_string()),
        ("FirstJobId", config.first_job_id.to_string()),
        ("GresTypes", "gpu".to_string()),
        ("JobRequeue", "1".to_string()),
        ("MaxArraySize", config.limits.max_array_size.to_string()),
        ("MaxBatchRequeue", config.max_batch_requeue.to_string()),
        ("MaxJobCount", config.limits.max_active_jobs.to_string()),
        ("MaxJobId", "67043328".to_string()),
        ("MinJobAge", format!("{} sec", crate::format::MIN_JOB_AGE_MS / 1000)),
        ("MpiDefault", "none".to_string()),
        ("NEXT_JOB_ID", status.next_job_id.to_string()),
        ("PreemptMode", if preempts { "REQUEUE" } else { "OFF" }.to_string()),
        ("PreemptType", if preempts { "preempt/partition_prio" } else { "preempt/none" }.to_string()),
        ("PriorityDecayHalfLife", days(config.fairshare_half_life_s)),
        ("PriorityFavorSmall", if s.favor_small { "Yes" } else { "No" }.to_string()),
        ("PriorityMaxAge", days(s.max_age_s)),
        ("PriorityType", "priority/multifactor".to_string()),
        ("PriorityWeightAge", s.weight_age.to_string()),
        ("PriorityWeightFairShare", s.weight_fairshare.to_string()),
        ("PriorityWeightJobSize", s.weight_job_size.to_string()),
        ("PriorityWeightPartition", s.weight_partition.to_string()),
        ("PriorityWeightQOS", s.weight_qos.to_string()),
        ("ProctrackType", "proctrack/pgid".to_string()),
        ("SchedulerParameters", format!("bf_max_job_test={},bf_resv_depth={}", s.queue_depth, s.reservation_depth)),
        ("SchedulerType", "sched/backfill".to_string()),
        ("SelectType", "select/cons_tres".to_string()),
        ("SelectTypeParameters", "CR_CPU_MEMORY".to_string()),
        ("SLURM_CONF", std::env::var("DROVER_CONFIG").unwrap_or_else(|_| "(null)".to_string())),
        ("SLURM_VERSION", crate::format::SLURM_VERSION.to_string()),
        ("SwitchType", "switch/none".to_string()),
        ("TopologyPlugin", "topology/tree".to_string()),
        ("TrackWCKey", "Yes".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (i, address) in addresses.iter().enumerate() {
        pairs.push((format!("SlurmctldHost[{i}]"), address.clone()));
    }
    pairs.sort_by_key(|(k, _)| k.to_ascii_lowercase());
    pairs
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

/// `scontrol update jobid=12 TimeLimit=1:00:00 Nice=10 QOS=debug Dependency=afterok:11 JobName=N Comment=C
/// Partition=P` (a pending job, or every task of an array; a running one may change TimeLimit, also `+T`/`-T`,
/// JobName and Comment).
fn update_job(controllers: Option<&str>, first: &str, words: &[&str]) -> anyhow::Result<i32> {
    let id = first.split_once('=').map(|(_, v)| v).unwrap_or_default().to_string();
    let mut update = drover_state::JobUpdate::default();
    let mut relative_limit: Option<(bool, u64)> = None;
    let parse_limit_value = |v: &str| match drover_state::slurm_time::parse_time_limit(v) {
        Ok(Some(s)) => Ok(s),
        _ => Err(anyhow::anyhow!("Invalid time limit {v:?}")),
    };
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(|| anyhow::anyhow!("invalid update argument {word:?}"))?;
        match key.to_ascii_lowercase().as_str() {
            // `+T`/`-T` move the current limit (Slurm's relative form).
            "timelimit" if value.starts_with(['+', '-']) && value.len() > 1 && value != "-1" => {
                relative_limit = Some((value.starts_with('+'), parse_limit_value(&value[1..])?));
            }
            "timelimit" => match drover_state::slurm_time::parse_time_limit(value) {
                Ok(Some(s)) => update.time_limit_s = Some(s),
                Ok(None) => update.time_unlimited = true,
                Err(e) => anyhow::bail!("Invalid time limit {value:?}: {e}"),
            },
            "jobname" | "name" => update.name = Some(value.to_string()),
            "comment" => update.comment = Some(value.to_string()),
            "partition" => update.partition = Some(value.to_string()),
            "nice" => update.nice = Some(value.parse().map_err(|_| anyhow::anyhow!("Invalid Nice {value:?}"))?),
            "qos" => update.qos = Some(value.to_string()),
            "dependency" => {
                update.dependency =
                    Some(drover_state::dependency::parse_dependency_value(value).map_err(|e| anyhow::anyhow!(e))?)
            }
            // Slurm's words (the fields Drover updates: TimeLimit, Nice, QOS, Dependency, JobName, Comment).
            _ => {
                return Err(crate::command::Bare(format!(
                    "Update of this parameter is not supported: {word}\nRequest aborted"
                ))
                .into());
            }
        }
    }
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let mut code = 0;
    for job in rt.block_on(crate::job_refs::resolve(&client, &[id], false))? {
        let mut update = update.clone();
        if let Some((up, by_s)) = relative_limit {
            let (current, _) = rt.block_on(client.get_job(job, false, false))?;
            let Some(now_s) = current.time_limit_s else {
                anyhow::bail!("job {job} has no time limit to move by {by_s} s");
            };
            update.time_limit_s =
                Some(if up { now_s.saturating_add(by_s) } else { now_s.saturating_sub(by_s).max(60) });
        }
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
        let member_nodes: Vec<&Node> = nodes.iter().filter(|n| members.contains(&n.info.name)).collect();
        let gpus: usize = member_nodes.iter().map(|n| n.info.gpus.len()).sum();
        let cpus: u64 = member_nodes.iter().map(|n| u64::from(n.info.cpus)).sum();
        let mem: u64 = member_nodes.iter().map(|n| n.info.memory_mb).sum();
        let mut tres = vec![format!("cpu={cpus}")];
        if mem > 0 {
            tres.push(format!("mem={}", mem_mb(mem)));
        }
        tres.push(format!("node={}", members.len()));
        tres.push(format!("billing={cpus}"));
        if gpus > 0 {
            tres.push(format!("gres/gpu={gpus}"));
        }
        // Slurm 22.05's layout, line for line; what Drover does not model shows as Slurm's default for it, and
        // Drover's own fields (GPUs) come last.
        let allow = |list: &[String]| if list.is_empty() { "ALL".to_string() } else { list.join(",") };
        let lines = [
            format!("PartitionName={}", p.name),
            format!("   AllowGroups=ALL AllowAccounts={} AllowQos={}", allow(&p.allow_accounts), allow(&p.allow_qos)),
            format!("   AllocNodes=ALL Default={} QoS=N/A", if p.default { "YES" } else { "NO" }),
            format!(
                "   DefaultTime={} DisableRootJobs={} ExclusiveUser=NO GraceTime=0 Hidden=NO",
                p.default_time_s.map_or("NONE".to_string(), |t| format_time_limit_long(Some(t))),
                if config.allow_root_jobs { "NO" } else { "YES" }
            ),
            format!(
                "   MaxNodes={} MaxTime={} MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED",
                p.max_nodes.map_or("UNLIMITED".to_string(), |n| n.to_string()),
                format_time_limit_long(p.max_time_s)
            ),
            format!("   Nodes={}", if members.is_empty() { "(null)".to_string() } else { compress_hostlist(&members) }),
            format!("   PriorityJobFactor=1 PriorityTier={} RootOnly=NO ReqResv=NO OverSubscribe=NO", p.priority_tier),
            format!("   OverTimeLimit=NONE PreemptMode={}", p.preempt_mode.name()),
            format!(
                "   State={} TotalCPUs={cpus} TotalNodes={} SelectTypeParameters=NONE",
                p.state.name(),
                members.len()
            ),
            "   JobDefaults=(null)".to_string(),
            "   DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED".to_string(),
            format!("   TRES={}", tres.join(",")),
            format!(
                "   TotalGPUs={gpus} MaxTRESPerJob={}",
                p.max_gpus_per_job.map_or("(null)".to_string(), |g| format!("gres/gpu={g}"))
            ),
        ];
        println!("{}\n", lines.join("\n"));
    }
    if shown == 0 {
        // Slurm prints this one on stdout.
        println!("Partition {} not found", name.unwrap_or(""));
        return Ok(1);
    }
    Ok(0)
}

/// `scontrol update nodename=gpu[01-02] state=drain reason="bad fan"` (and `state=resume`/`undrain`), and
/// Drover's `spare=yes|no` (the hot-spare pool).
fn update_nodes(controllers: Option<&str>, words: &[&str]) -> anyhow::Result<i32> {
    let mut names = None;
    let mut state = None;
    let mut spare = None;
    let mut reason = String::new();
    for word in words {
        let (key, value) =
            word.split_once('=').ok_or_else(|| anyhow::anyhow!("invalid update argument {word:?}; {USAGE}"))?;
        match key.to_ascii_lowercase().as_str() {
            "nodename" | "node" => names = Some(expand_hostlist(value).map_err(|e| anyhow::anyhow!(e))?),
            "state" => state = Some(value.to_ascii_lowercase()),
            "reason" => reason = value.trim_matches('"').to_string(),
            "spare" => {
                spare = Some(
                    parse_yes_no(value)
                        .ok_or_else(|| anyhow::anyhow!("Invalid spare value {value:?}: use yes or no"))?,
                )
            }
            other => anyhow::bail!("Update of {other} is not supported; {USAGE}"),
        }
    }
    let names = names.ok_or_else(|| anyhow::anyhow!("update needs nodename=LIST"))?;
    let drain = match state.as_deref() {
        Some("drain") => Some(true),
        Some("resume") | Some("undrain") | Some("idle") => Some(false),
        None if spare.is_some() => None,
        other => anyhow::bail!("Invalid node state specified: {}", other.unwrap_or("(none)")),
    };
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    if let Some(spare) = spare {
        rt.block_on(client.admin(&drover_state::AdminOp::SetNodeSpare { names: names.clone(), spare }))?;
    }
    if let Some(drain) = drain {
        rt.block_on(client.drain_nodes(&names, drain, &reason))?;
    }
    Ok(0)
}

/// `scontrol reboot [ASAP] [nextstate=RESUME|DOWN] [reason=TEXT] ALL|NODELIST` and `scontrol cancel_reboot NODELIST`:
/// the nodes take no new job, and each runs its agent's reboot program once it has no job left.
fn reboot(controllers: Option<&str>, words: &[&str], cancel: bool) -> anyhow::Result<i32> {
    let mut request = drover_proto::v1::RebootNodesRequest { cancel, ..Default::default() };
    for word in words {
        match word.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("nextstate") && !cancel => {
                match value.to_ascii_lowercase().as_str() {
                    "resume" | "down" => request.next_state = value.to_ascii_lowercase(),
                    _ => anyhow::bail!("Invalid nextstate {value:?}: use RESUME or DOWN"),
                }
            }
            Some((key, value)) if key.eq_ignore_ascii_case("reason") && !cancel => {
                request.reason = value.trim_matches('"').to_string()
            }
            Some((key, _)) => anyhow::bail!("Invalid reboot option {key:?}: ASAP, nextstate=, reason= or nodes"),
            None if word.eq_ignore_ascii_case("asap") && !cancel => request.asap = true,
            None if word.eq_ignore_ascii_case("all") => request.all = true,
            None => request.names.extend(expand_hostlist(word).map_err(|e| anyhow::anyhow!(e))?),
        }
    }
    if request.names.is_empty() && !request.all {
        anyhow::bail!("Missing node list. Specify ALL|<NodeList>");
    }
    let client = crate::connect::client(controllers)?;
    crate::connect::runtime().block_on(client.reboot_nodes(request))?;
    Ok(0)
}

/// `yes`/`no` as Slurm's update values spell them (also `1`/`0`, `true`/`false`), case-insensitively.
fn parse_yes_no(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "y" | "1" | "true" => Some(true),
        "no" | "n" | "0" | "false" => Some(false),
        _ => None,
    }
}

/// Joins a record's lines as Slurm does: indented lines, or one line with `-o`; a blank line after each.
fn record(lines: &[String], one_liner: bool) -> String {
    if one_liner {
        return format!("{}\n", lines.join(" "));
    }
    let mut out = lines[0].clone();
    for line in &lines[1..] {
        out.push_str("\n   ");
        out.push_str(line);
    }
    out.push_str("\n\n");
    out
}

/// Slurm 22.05's `scontrol show node` layout, with Drover's topology labels after the reason.
fn show_nodes(options: &Options, name: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(options.controllers.as_deref())?;
    let (nodes, config) = crate::connect::runtime().block_on(client.nodes_and_config(false))?;
    let mut state = drover_state::State::default();
    state.meta.config = config;
    let partitions_of = |node: &Node| -> Vec<String> {
        let config = state.config().map(|c| c.partitions.as_slice()).unwrap_or_default();
        config.iter().filter(|p| state.node_in_partition(&node.info, &p.name)).map(|p| p.name.clone()).collect()
    };
    let wanted = match name {
        Some(list) => Some(expand_hostlist(list).map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let mut out = String::new();
    let mut shown = 0;
    for node in nodes.iter().filter(|n| wanted.as_ref().is_none_or(|w| w.contains(&n.info.name))) {
        shown += 1;
        out.push_str(&record(&node_lines(node, &partitions_of(node), options.details), options.one_liner));
    }
    print!("{out}");
    if shown == 0 {
        match name {
            Some(n) => {
                if !options.quiet {
                    eprintln!("Node {n} not found");
                }
                return Ok(1);
            }
            None => println!("No nodes in the system"),
        }
    }
    Ok(0)
}

/// A node's configured TRES (`CfgTRES=cpu=64,mem=64G,billing=64,gres/gpu=8`).
pub fn node_cfg_tres(node: &Node) -> String {
    let info = &node.info;
    let mut parts = vec![format!("cpu={}", info.cpus)];
    if info.memory_mb > 0 {
        parts.push(format!("mem={}", mem_mb(info.memory_mb)));
    }
    parts.push(format!("billing={}", info.cpus));
    if !info.gpus.is_empty() {
        parts.push(format!("gres/gpu={}", info.gpus.len()));
    }
    parts.join(",")
}

/// What jobs hold on a node (`AllocTRES=cpu=8,mem=32G,gres/gpu=2`; empty when idle).
pub fn node_alloc_tres(node: &Node) -> String {
    let mut parts = Vec::new();
    if node.allocated_cpus > 0 {
        parts.push(format!("cpu={}", node.allocated_cpus));
    }
    if node.allocated_mem_mb > 0 {
        parts.push(format!("mem={}", mem_mb(node.allocated_mem_mb)));
    }
    if !node.allocated_gpus.is_empty() {
        parts.push(format!("gres/gpu={}", node.allocated_gpus.len()));
    }
    parts.join(",")
}

fn node_lines(node: &Node, partitions: &[String], details: bool) -> Vec<String> {
    let info = &node.info;
    let features = if info.features.is_empty() { "(null)".to_string() } else { info.features.join(",") };
    let topology: Vec<String> = info.topology.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let since = timestamp_or_unknown(Some(node.since_ms));
    let mut lines = vec![
        format!("NodeName={} Arch=x86_64 CoresPerSocket=1 ", info.name),
        format!("CPUAlloc={} CPUEfctv={} CPUTot={} CPULoad=N/A", node.allocated_cpus, info.cpus, info.cpus),
        format!("AvailableFeatures={features}"),
        format!("ActiveFeatures={features}"),
        format!("Gres={}", node_gres(node)),
    ];
    if details || !node.allocated_gpus.is_empty() {
        lines.push(format!("GresUsed={}", node_gres_used(node)));
    }
    lines.extend([
        format!("NodeAddr={} NodeHostName={} Version={}", info.host, info.name, info.version),
        // FreeMem is what no job holds (Drover does not sample the OS's free memory).
        format!(
            "RealMemory={} AllocMem={} FreeMem={} Sockets=1 Boards=1",
            info.memory_mb,
            node.allocated_mem_mb,
            node.free_mem_mb()
        ),
        format!("State={} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A", node_state(node)),
        format!("Partitions={} ", if partitions.is_empty() { "(null)".to_string() } else { partitions.join(",") }),
        format!("BootTime=None SlurmdStartTime={since}"),
        format!("LastBusyTime={since}"),
        format!("CfgTRES={}", node_cfg_tres(node)),
        format!("AllocTRES={}", node_alloc_tres(node)),
        "CapWatts=n/a".to_string(),
        "CurrentWatts=0 AveWatts=0".to_string(),
        "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s".to_string(),
    ]);
    if !node.reason.is_empty() {
        lines.push(format!("Reason={} [root@{since}]", node.reason));
    }
    lines.push(format!("Topology={}", if topology.is_empty() { "(null)".to_string() } else { topology.join(",") }));
    lines.push(format!("Spare={}", if node.spare { "yes" } else { "no" }));
    if let Some(reboot) = &node.reboot {
        let next = match reboot.next_state {
            Some(drover_state::node::NextState::Resume) => "RESUME",
            Some(drover_state::node::NextState::Down) => "DOWN",
            None => "(previous)",
        };
        lines.push(format!("RebootRequested={} NextState={next}", if reboot.asap { "ASAP" } else { "yes" }));
    }
    for (gpu, drain) in &node.drained_gpus {
        lines.push(format!("DrainedGpu[{gpu}]={} [{}]", drain.reason.replace(' ', "_"), drain.action.name()));
    }
    if !node.failures.is_empty() {
        let last: Vec<String> = node
            .failures
            .iter()
            .rev()
            .take(5)
            .map(|f| format!("{}:{}", format_timestamp(Some(f.time_ms)), f.what.replace(' ', "_")))
            .collect();
        lines.push(format!("Failures={} RecentFailures={}", node.failures.len(), last.join(",")));
    }
    if let Some(store) = &node.image_store {
        lines.push(format!(
            "ContainerImages={} ImageCacheSize={} ImageCacheLimit={}",
            store.images,
            mem_mb(store.bytes >> 20),
            mem_mb(store.limit_bytes >> 20)
        ));
    }
    lines
}

fn print_hostnames(list: &str) -> anyhow::Result<i32> {
    for host in expand_hostlist(list).map_err(|e| anyhow::anyhow!(e))? {
        println!("{host}");
    }
    Ok(0)
}

/// `scontrol show hostlist a,b,c` compresses (in the order given; `hostlistsorted` sorts first). A file name
/// (containing `/`) is read for the hosts, one or more per line, as Slurm allows.
fn print_hostlist(list: &str, sorted: bool) -> anyhow::Result<i32> {
    let text = if list.contains('/') {
        std::fs::read_to_string(list).map_err(|e| anyhow::anyhow!("cannot read host file {list}: {e}"))?
    } else {
        list.to_string()
    };
    let mut hosts = Vec::new();
    for part in text.split(['\n', ' ']).filter(|p| !p.is_empty()) {
        hosts.extend(expand_hostlist(part).map_err(|e| anyhow::anyhow!(e))?);
    }
    if sorted {
        hosts.sort();
        hosts.dedup();
        println!("{}", compress_hostlist(&hosts));
        return Ok(0);
    }
    // Unsorted, as Slurm's: names keep their order, and only neighbours with the same prefix share brackets.
    let prefix = |h: &str| h.trim_end_matches(|c: char| c.is_ascii_digit()).to_string();
    let mut runs: Vec<Vec<String>> = Vec::new();
    for host in hosts {
        match runs.last_mut() {
            Some(run) if prefix(&run[0]) == prefix(&host) => run.push(host),
            _ => runs.push(vec![host]),
        }
    }
    println!("{}", runs.iter().map(|run| compress_hostlist(run)).collect::<Vec<_>>().join(","));
    Ok(0)
}

fn show_jobs(options: &Options, id: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(options.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let jobs = match id {
        Some(id) => {
            let mut jobs = Vec::new();
            let ids = match rt.block_on(crate::job_refs::resolve(&client, &[id.to_string()], true)) {
                Ok(ids) => ids,
                Err(_) => {
                    if !options.quiet {
                        eprintln!("slurm_load_jobs error: Invalid job id specified");
                    }
                    return Ok(1);
                }
            };
            for id in ids {
                match rt.block_on(client.get_job(id, false, false)) {
                    Ok((job, _)) => jobs.push(job),
                    Err(drover_client::ClientError::NotFound(_)) => {
                        if !options.quiet {
                            eprintln!("slurm_load_jobs error: Invalid job id specified");
                        }
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
    let mut out = String::new();
    // Pending tasks of an array not yet split off are one record, as in Slurm (ArrayTaskId=1-3).
    for row in crate::slurm::arrays::rows(&jobs, false) {
        let lines = match row {
            crate::slurm::arrays::Row::Job(job) => job_lines(job, now, options.details),
            crate::slurm::arrays::Row::Group { first, task_ids } if task_ids.len() == 1 => {
                job_lines(first, now, options.details)
            }
            crate::slurm::arrays::Row::Group { first, task_ids } => {
                let mut lines = job_lines(first, now, options.details);
                lines[0] = array_record_line(first, &task_ids);
                lines
            }
        };
        out.push_str(&record(&lines, options.one_liner));
    }
    print!("{out}");
    Ok(0)
}

/// `scontrol show job`'s lines for one job, in Slurm's order, then Drover's own.
fn job_lines(job: &Job, now_ms: u64, details: bool) -> Vec<String> {
    let mut lines = Vec::with_capacity(40);
    identity_lines(job, details, &mut lines);
    time_and_place_lines(job, now_ms, &mut lines);
    resource_lines(job, details, &mut lines);
    request_lines(job, &mut lines);
    drover_lines(job, &mut lines);
    lines
}

fn or_null(v: &Option<drover_state::ThinStr>) -> String {
    v.as_deref().unwrap_or("(null)").to_string()
}

fn list_or_null(v: &[String]) -> String {
    if v.is_empty() { "(null)".to_string() } else { compress_hostlist(v) }
}

/// The first line of the record of an array's pending tasks: the array's id, and its tasks as a range with the
/// throttle (`ArrayTaskId=0-7%2`), as Slurm shows the array's job before its tasks split off.
fn array_record_line(first: &Job, task_ids: &[u32]) -> String {
    let a = first.array.as_deref().copied().expect("groups hold array tasks");
    let tasks = drover_state::array::format_task_ids(task_ids, a.max_running);
    let throttle = a.max_running.map(|m| format!(" ArrayTaskThrottle={m}")).unwrap_or_default();
    format!(
        "JobId={} ArrayJobId={} ArrayTaskId={}{throttle} JobName={}",
        a.array_job_id,
        a.array_job_id,
        tasks.trim_matches(['[', ']']),
        first.spec.name
    )
}

/// Who and what: ids, owner, priority, state and reason, requeue and exit code.
fn identity_lines(job: &Job, details: bool, lines: &mut Vec<String>) {
    let s = &job.spec;
    let first = match job.array.as_deref() {
        Some(a) => {
            let throttle = a.max_running.map(|m| format!(" ArrayTaskThrottle={m}")).unwrap_or_default();
            format!(
                "JobId={} ArrayJobId={} ArrayTaskId={}{throttle} JobName={}",
                job.id, a.array_job_id, a.task_id, s.name
            )
        }
        None => format!("JobId={} JobName={}", job.id, s.name),
    };
    let (account, qos) = (job.account_name(), job.qos_name());
    let dependency =
        drover_state::dependency::format_dependency_status(&s.dependency, s.dependency_any, &job.dependency_state);
    lines.extend([
        first,
        format!("UserId={}({}) GroupId={}({}) MCS_label=N/A", s.user, s.uid, crate::format::group_name(s.gid), s.gid),
        format!(
            "Priority={} Nice={} Account={account} QOS={qos} WCKey={}",
            if job.held { 0 } else { 1 },
            s.nice,
            or_null(&s.wckey)
        ),
        format!(
            "JobState={} Reason={} Dependency={dependency}",
            job.shown_state().name(),
            crate::format::job_reason(job)
        ),
        format!(
            "Requeue={} Restarts={} BatchFlag={} Reboot=0 ExitCode={}:{}",
            u8::from(s.requeue.unwrap_or(true)),
            job.restarts(),
            // An allocation (salloc) runs no batch script.
            u8::from(!s.interactive),
            job.exit_code,
            job.exit_signal
        ),
    ]);
    if details {
        lines.push("DerivedExitCode=0:0".to_string());
    }
}

/// When and where: run time and limits, the job's times, partition and nodes.
fn time_and_place_lines(job: &Job, now_ms: u64, lines: &mut Vec<String>) {
    let s = &job.spec;
    let eligible = crate::format::eligible_ms(job);
    lines.extend([
        format!(
            "RunTime={} TimeLimit={} TimeMin={}",
            format_duration_long(elapsed_s(job, now_ms)),
            format_time_limit_long(job.time_limit_s),
            s.time_min_s.map_or_else(|| "N/A".to_string(), |t| format_time_limit_long(Some(t)))
        ),
        format!(
            "SubmitTime={} EligibleTime={}",
            timestamp_or_unknown(Some(job.submit_time_ms)),
            timestamp_or_unknown(eligible)
        ),
        format!("AccrueTime={}", timestamp_or_unknown(eligible)),
        format!(
            "StartTime={} EndTime={} Deadline={}",
            timestamp_or_unknown(job.start_time_ms),
            timestamp_or_unknown(crate::format::expected_end_ms(job)),
            format_timestamp(s.deadline_ms)
        ),
        "SuspendTime=None SecsPreSuspend=0 LastSchedEval=Unknown Scheduler=Main".to_string(),
        format!("Partition={} AllocNode:Sid=N/A", job.partition),
        format!("ReqNodeList={} ExcNodeList={}", list_or_null(&s.nodelist), list_or_null(&s.exclude)),
        format!("NodeList={}", list_or_null(&job.nodes)),
    ]);
    if let Some(first) = job.nodes.first() {
        lines.push(format!("BatchHost={first}"));
    }
}

/// How much: node, CPU and task counts, TRES, and (with `--details`) each node's share.
fn resource_lines(job: &Job, details: bool, lines: &mut Vec<String>) {
    let s = &job.spec;
    let tres = Tres::current(job);
    let num_nodes = if job.nodes.is_empty() && s.max_nodes > s.min_nodes {
        format!("{}-{}", s.min_nodes, s.max_nodes)
    } else if job.nodes.is_empty() {
        s.min_nodes.max(1).to_string()
    } else {
        job.nodes.len().to_string()
    };
    lines.extend([
        format!(
            "NumNodes={num_nodes} NumCPUs={} NumTasks={} CPUs/Task={} ReqB:S:C:T=0:0:*:*",
            tres.cpu,
            s.total_tasks(),
            s.cpus_per_task
        ),
        format!("TRES={}", tres.by_id()),
        format!("Socks/Node=* NtasksPerN:B:S:C={}:0:*:* CoreSpec=*", s.ntasks_per_node.unwrap_or(0)),
    ]);
    if details {
        for a in &job.allocation {
            let mut gpus = a.gpus.clone();
            gpus.sort_unstable();
            let gres = if gpus.is_empty() {
                String::new()
            } else {
                format!("gpu:{}(IDX:{})", gpus.len(), drover_common::ranges::format_ranges(&gpus))
            };
            lines.push(format!("  Nodes={} CPU_IDs=N/A Mem={} GRES={gres}", a.node, a.mem_mb));
        }
    }
}

/// What was asked: per-node minimums, features, reservation, sharing, command, files and per-TRES requests.
fn request_lines(job: &Job, lines: &mut Vec<String>) {
    let s = &job.spec;
    let (min_mem, per) = crate::format::min_memory_mb(job);
    lines.extend([
        format!(
            "MinCPUsNode={} MinMemory{per}={} MinTmpDiskNode=0",
            s.cpus_per_task.max(1) * s.ntasks_per_node.unwrap_or(1).max(1),
            mem_mb(min_mem)
        ),
        format!(
            "Features={} DelayBoot=00:00:00",
            if s.constraint.is_empty() { "(null)".to_string() } else { s.constraint.join("&") }
        ),
    ]);
    if let Some(r) = &s.reservation {
        lines.push(format!("Reservation={r}"));
    }
    lines.extend([
        format!("OverSubscribe={} Contiguous=0 Licenses=(null) Network=(null)", if s.exclusive { "NO" } else { "OK" }),
        format!("Command={}", s.name),
        format!("WorkDir={}", s.work_dir),
    ]);
    if let Some(comment) = &s.comment {
        lines.push(format!("Comment={comment} "));
    }
    lines.extend([
        format!("StdErr={}", crate::format::std_path(job, s.stderr.as_deref().or(s.stdout.as_deref()))),
        "StdIn=/dev/null".to_string(),
        format!("StdOut={}", crate::format::std_path(job, s.stdout.as_deref())),
        "Power=".to_string(),
    ]);
    if let Some(n) = s.cpus_per_gpu {
        lines.push(format!("CpusPerTres=gres:gpu:{n}"));
    }
    if let Some(m) = crate::format::mem_per_tres(job) {
        lines.push(format!("MemPerTres={m}"));
    }
    if let Some(freq) = &s.gpu_freq {
        lines.push(format!("TresFreq=gpu:{freq}"));
    }
    if let Some(c) = &s.container {
        lines.push(crate::format::container_line(c));
    }
    if let Some(t) = crate::format::tres_per_job(job) {
        lines.push(format!("TresPerJob={t}"));
    }
    if let Some(t) = crate::format::tres_per_node(job) {
        lines.push(format!("TresPerNode={t}"));
    }
    if let Some(t) = crate::format::tres_per_task(job) {
        lines.push(format!("TresPerTask={t}"));
    }
    if let Some(n) = s.ntasks_per_gpu {
        lines.push(format!("NtasksPerTRES={n}"));
    }
}

/// Drover's own lines: checkpoints and restarts (where this incarnation writes, what it resumes from, how each
/// earlier incarnation ended), and placement (whether the job may span sites, what its reason asks of the user).
fn drover_lines(job: &Job, lines: &mut Vec<String>) {
    lines.push(format!(
        "Incarnation={} CheckpointDir={} Failures={}",
        job.incarnation,
        job.checkpoint_dir(),
        job.failures
    ));
    lines.push(format!("MultiSite={}", if job.spec.multi_site { "yes" } else { "no" }));
    if job.state == JobState::Pending
        && let Some(detail) = job.reason.detail()
    {
        lines.push(format!("ReasonDetail={detail}"));
    }
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
        lines.push(format!("Requeueing={:?} RequeueReason={}", r.kind, r.reason.replace(' ', "_")));
    }
    if let Some(res) = job.resilience.as_deref() {
        let progress = job.progress();
        lines.push(format!(
            "ProgressTimeout={} LastProgress={} LastProgressStep={}",
            res.progress_timeout_s.map_or_else(|| "NONE".to_string(), format_duration_long),
            format_timestamp(progress.map(|p| p.time_ms)),
            progress.and_then(|p| p.step).map_or_else(|| "N/A".to_string(), |s| s.to_string()),
        ));
        if !res.bad_checkpoints.is_empty() {
            lines.push(format!("BadCheckpoints={}", res.bad_checkpoints.join(",")));
        }
        if !res.avoid_nodes.is_empty() {
            lines.push(format!("AvoidNodes={}", res.avoid_nodes.join(",")));
        }
    }
    // One field per earlier incarnation, its parts inside the value: `scontrol show job -o` is parsed as
    // KEY=VALUE tokens, and a second `StartTime=` or `Reason=` would overwrite Slurm's own in every such parser.
    for h in &job.history {
        lines.push(format!(
            "Restart[{}]=State:{},NodeList:{},StartTime:{},EndTime:{},ResumedFrom:{},Reason:{}",
            h.incarnation,
            h.state.name(),
            if h.nodes.is_empty() { "(null)" } else { &h.nodes },
            format_timestamp(h.start_ms),
            format_timestamp(Some(h.end_ms)),
            h.resumed_from.as_deref().unwrap_or("(null)"),
            h.reason.replace(' ', "_")
        ));
    }
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
        "uhold" => rt.block_on(client.uhold(&ids))?,
        "suspend" => rt.block_on(client.suspend(&ids))?,
        "resume" => rt.block_on(client.resume(&ids))?,
        _ => rt.block_on(client.hold(&ids))?,
    };
    let mut code = 0;
    for o in outcomes.iter().filter(|o| !o.ok) {
        // Slurm's scontrol words these as `slurm_perror` does: the reason, then which job.
        eprintln!("{} for job {}", o.error, o.job_id);
        code = 1;
    }
    Ok(code)
}
