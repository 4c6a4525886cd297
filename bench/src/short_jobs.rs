//! `drover-bench short-jobs` (issue 33): short batch jobs through the whole control plane for minutes at a fixed
//! offered rate, as Slurm's documentation validates 500 simple batch jobs/s. Clients submit at `--rate`; the
//! leader schedules, commits each start and pushes it to the node's agent; the agent reports the job's end and
//! confirms its release; and at the end every acknowledged job's record is looked up in the accounting store
//! (what `sacct` reads) and must be complete: COMPLETED, with start, end and node.
//!
//! The agents are simulated (`agents.rs`: each its own mutual-TLS session, certificate and lease, speaking the
//! real session protocol): they run no process, so the figure is the control plane's, not the node's fork rate.
//! A job "runs" for `--job-ms` from the moment its assignment reaches the agent.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use drover_client::{Client, JobFilter};
use drover_state::JobState;
use drover_testkit::local::{LocalCluster, UpOptions};
use hdrhistogram::Histogram;

use crate::agents::{Sim, clock_ticks_per_s, cpu_ticks, leader_of, sim_agent, true_job};
use crate::sim_jobs::SimJobs;

/// How long reading the leader's `/metrics` may take.
const METRICS_TIMEOUT_S: u64 = 10;

/// Ids looked up in the accounting store per request at the end.
const LOOKUP_CHUNK: usize = 5_000;
/// How long the backlog may go without a job ending before the bench gives up.
const DRAIN_STALL_S: u64 = 60;
/// Between progress lines.
const REPORT_EVERY_S: u64 = 10;

#[derive(clap::Args)]
pub struct ShortJobsArgs {
    /// Simulated agents (nodes), 8 GPUs each.
    #[arg(long, default_value_t = 8)]
    agents: usize,
    /// Offered load: one-GPU jobs submitted per second, paced evenly over the clients.
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// How long the load is offered.
    #[arg(long, default_value_t = 300)]
    duration_s: u64,
    /// Concurrent submitting clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long each job runs once its assignment reaches the agent.
    #[arg(long, default_value_t = 0)]
    job_ms: u64,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    #[arg(long, default_value_t = 1_000)]
    heartbeat_ms: u64,
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub async fn short_jobs(args: ShortJobsArgs, dir: PathBuf) -> anyhow::Result<()> {
    if args.agents == 0 || args.rate == 0 || args.duration_s == 0 || args.clients == 0 {
        bail!("--agents, --rate, --duration-s and --clients must be at least 1");
    }
    let options = UpOptions {
        controllers: args.replicas,
        agents: 0,
        agent_heartbeat_ms: args.heartbeat_ms,
        ..UpOptions::default()
    };
    let cluster = LocalCluster::up(&dir, options)?;
    let leader = cluster.wait_ready(Duration::from_secs(30)).await?;
    let client = Arc::new(cluster.client()?);
    let (_, leader_addr, _) = leader_of(&client).await?;
    let mut controllers: Vec<String> = cluster.addresses().split(',').map(str::to_string).collect();
    controllers.sort_by_key(|a| *a != leader_addr);
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    let jobs = SimJobs::new(Duration::from_millis(args.job_ms));
    let sim = Arc::new(Sim::new(cluster.pki()?, controllers, heartbeat, args.agents, 500, Some(jobs)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let agents: Vec<_> = (0..args.agents).map(|i| tokio::spawn(sim_agent(sim.clone(), i, stop_rx.clone()))).collect();
    while sim.registration().0 + sim.registration().1 < args.agents {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if sim.registration().0 < args.agents {
        bail!("{} of {} simulated agents registered: {:?}", sim.registration().0, args.agents, sim.first_error());
    }
    tokio::time::sleep(2 * heartbeat).await;
    println!(
        "bench short-jobs: {} one-GPU jobs/s offered for {} s by {} clients; {} simulated agents x 8 GPUs (no \
         process runs: each job ends {} ms after its assignment reaches the agent); {} replicas, leader replica \
         {leader}",
        args.rate, args.duration_s, args.clients, args.agents, args.job_ms, args.replicas
    );

    let work_dir = cluster.dir.join("work");
    std::fs::create_dir_all(&work_dir)?;
    let pid = cluster.process(leader).and_then(|p| p.pid).map(|p| p.to_string());
    let cpu_before = pid.as_deref().and_then(cpu_ticks);
    let started = Instant::now();
    let (ids, refused) = offer_load(&client, &sim, &args, &work_dir).await?;
    let offered_s = started.elapsed().as_secs_f64();
    let cpu = pid.as_deref().and_then(cpu_ticks).zip(cpu_before).map(|(a, b)| (a - b) as f64 / clock_ticks_per_s());
    let sim_jobs = sim.jobs().expect("short-jobs runs its agents' jobs");
    let ended_in_window = sim_jobs.acked.load(Ordering::Relaxed);
    println!(
        "offered: {} acknowledged in {offered_s:.1} s ({:.0}/s), {refused} refused; ends committed meanwhile: \
         {ended_in_window} ({:.0}/s sustained); leader CPU {}",
        ids.len(),
        ids.len() as f64 / offered_s,
        ended_in_window as f64 / offered_s,
        cpu.map_or("?".into(), |s| format!("{:.0} % of a core", 100.0 * s / offered_s)),
    );
    drain(&client, sim_jobs, ids.len() as u64).await?;
    let total_s = started.elapsed().as_secs_f64();
    {
        let h = sim_jobs.to_agent.lock().expect("to_agent poisoned");
        println!(
            "loop: submission -> assignment at the agent p50={:.1} ms p99={:.1} ms max={:.1} ms ({} jobs); all \
             ended {total_s:.1} s after the first submission",
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
            h.max() as f64 / 1e3,
            h.len()
        );
    }
    accounting(&client, &ids).await?;
    match passes(&cluster, leader).await {
        Ok((deep, shallow)) => println!("passes on the leader: {deep} deep, {shallow} shallow"),
        Err(e) => println!("passes on the leader: unknown ({e:#})"),
    }
    let _ = stop_tx.send(true);
    for agent in agents {
        let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
    }
    println!("leases: {} ran out before their renewal", sim.fenced());
    drop(cluster);
    Ok(())
}

/// Submits at the offered rate for the duration, each client on its own even schedule (a client that falls
/// behind submits at once until it has caught up, so the offered total holds). Prints progress every
/// [`REPORT_EVERY_S`]. The acknowledged ids, and the submissions refused.
async fn offer_load(
    client: &Arc<Client>,
    sim: &Arc<Sim>,
    args: &ShortJobsArgs,
    work_dir: &std::path::Path,
) -> anyhow::Result<(Vec<u64>, u64)> {
    let spec = true_job(work_dir);
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs(args.duration_s);
    let period = Duration::from_secs_f64(args.clients as f64 / args.rate as f64);
    let ids = Arc::new(Mutex::new(Vec::with_capacity((args.rate * args.duration_s) as usize)));
    let refused = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (client, spec, ids, refused) = (client.clone(), spec.clone(), ids.clone(), refused.clone());
        let first = start + period.mul_f64(c as f64 / args.clients as f64);
        tasks.push(tokio::spawn(async move {
            let mut due = first;
            while due < end {
                tokio::time::sleep_until(due).await;
                match client.submit(&spec).await {
                    Ok(id) => ids.lock().expect("ids poisoned").push(id),
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                due += period;
            }
        }));
    }
    let reporter = {
        let (client, sim, ids, done) = (client.clone(), sim.clone(), ids.clone(), done.clone());
        tokio::spawn(async move {
            let mut last = (0usize, 0u64);
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(REPORT_EVERY_S)).await;
                let submitted = ids.lock().expect("ids poisoned").len();
                let ended = sim.jobs().map_or(0, |j| j.acked.load(Ordering::Relaxed));
                let backlog = client
                    .cluster_status()
                    .await
                    .map(|s| format!("{} pending, {} running", s.pending_jobs, s.running_jobs));
                println!(
                    "  {:>4.0} s: submitted {:.0}/s, ended {:.0}/s; {}",
                    start.elapsed().as_secs_f64(),
                    (submitted - last.0) as f64 / REPORT_EVERY_S as f64,
                    (ended - last.1) as f64 / REPORT_EVERY_S as f64,
                    backlog.unwrap_or_else(|e| format!("status: {e}"))
                );
                last = (submitted, ended);
            }
        })
    };
    for task in tasks {
        task.await?;
    }
    done.store(true, Ordering::Relaxed);
    reporter.abort();
    let ids = std::mem::take(&mut *ids.lock().expect("ids poisoned"));
    Ok((ids, refused.load(Ordering::Relaxed)))
}

/// Waits until every acknowledged job's end is committed (the agents count the leader's acknowledgements).
async fn drain(client: &Client, jobs: &SimJobs, acknowledged: u64) -> anyhow::Result<()> {
    let mut last = jobs.acked.load(Ordering::Relaxed);
    let mut progress_at = Instant::now();
    loop {
        let status = client.cluster_status().await?;
        if status.pending_jobs + status.running_jobs == 0 {
            return Ok(());
        }
        let acked = jobs.acked.load(Ordering::Relaxed);
        if acked > last {
            (last, progress_at) = (acked, Instant::now());
        }
        if progress_at.elapsed() > Duration::from_secs(DRAIN_STALL_S) {
            bail!(
                "no job ended for {DRAIN_STALL_S} s with {} pending and {} running ({acked} of {acknowledged} ends acknowledged)",
                status.pending_jobs,
                status.running_jobs
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Looks every acknowledged job up in the accounting store (finished jobs, what `sacct` lists) and counts the
/// records that are complete: COMPLETED, exit 0, with a start, an end and a node.
async fn accounting(client: &Client, ids: &[u64]) -> anyhow::Result<()> {
    let (mut complete, mut incomplete, mut missing) = (0usize, 0usize, 0usize);
    let mut example = None;
    let mut start_to_end = Histogram::<u64>::new_with_bounds(1, 600_000, 3)?;
    for chunk in ids.chunks(LOOKUP_CHUNK) {
        let filter = JobFilter { ids: chunk.to_vec(), include_finished: true, limit: 0, ..Default::default() };
        let (jobs, _) = client.list_jobs(&filter).await?;
        let found: HashSet<u64> = jobs.iter().map(|j| j.id).collect();
        missing += chunk.iter().filter(|id| !found.contains(id)).count();
        for job in &jobs {
            let ok = job.state == JobState::Completed
                && job.exit_code == 0
                && job.start_time_ms.is_some()
                && job.end_time_ms.is_some()
                && !job.nodes.is_empty();
            if ok {
                complete += 1;
                let waited = job.start_time_ms.unwrap_or(0).saturating_sub(job.submit_time_ms);
                let _ = start_to_end.record(waited.max(1));
            } else {
                incomplete += 1;
                example.get_or_insert_with(|| format!("job {}: {} {:?}", job.id, job.state.name(), job.nodes));
            }
        }
    }
    println!(
        "accounting: {complete} of {} acknowledged jobs complete in the accounting store (COMPLETED, start, end, \
         node); {incomplete} incomplete{}, {missing} missing; submit -> start on the leader's stamps p50={} ms \
         p99={} ms",
        ids.len(),
        example.map(|e| format!(" (e.g. {e})")).unwrap_or_default(),
        start_to_end.value_at_quantile(0.5),
        start_to_end.value_at_quantile(0.99)
    );
    Ok(())
}

/// Scheduling passes the leader ran, deep and shallow, from its `/metrics`: a backlog past the shallow threshold
/// (2,048 pending) must show shallow passes.
async fn passes(cluster: &LocalCluster, leader: u64) -> anyhow::Result<(u64, u64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_, url) = cluster
        .web_addresses()
        .into_iter()
        .find(|(id, _)| *id == leader)
        .ok_or_else(|| anyhow::anyhow!("controller {leader} serves no /metrics"))?;
    let host = url.trim_start_matches("http://").to_string();
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(&host).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await?;
        anyhow::Ok(reply)
    };
    let reply = tokio::time::timeout(Duration::from_secs(METRICS_TIMEOUT_S), read).await??;
    let count = |series: &str| -> anyhow::Result<u64> {
        reply
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .ok_or_else(|| anyhow::anyhow!("no {series} in the leader's /metrics"))
    };
    Ok((count("drover_scheduler_pass_seconds_count")?, count("drover_scheduler_shallow_pass_seconds_count")?))
}
