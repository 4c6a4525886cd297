//! `drover-bench ...`: the figures in BENCHMARKS.md. Each bench starts its own local cluster (release builds
//! give the real numbers) and prints one summary line per measurement. A binary of its own, so that the
//! shipped `drover` carries no load generators.

mod agents;
mod containers;
mod ettr;
mod recovery;
mod requeue;
mod restarts;
mod short_jobs;
mod sim_jobs;
mod sites;
mod wan;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::{Parser, Subcommand};
use drover_client::{Client, JobFilter};
use hdrhistogram::Histogram;

use agents as bench_agents;
use drover_testkit::local::{LocalCluster, UpOptions, trivial_spec};

#[derive(Parser)]
#[command(name = "drover-bench", about = "Drover's benchmarks (the figures in BENCHMARKS.md)")]
struct Cli {
    #[command(subcommand)]
    command: BenchCmd,
}

fn main() -> anyhow::Result<()> {
    run(Cli::parse().command)
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Committed submissions/s and latency with N concurrent clients.
    Submit {
        #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
        clients: Vec<usize>,
        /// Connections the clients share, round-robin (like etcd's benchmark `--conns`); at most one per client.
        /// One connection multiplexes every client over one HTTP/2 stream set; many model separate processes.
        #[arg(long, default_value_t = 1)]
        conns: usize,
        #[arg(long, default_value_t = 10)]
        duration_s: u64,
        /// Worker threads of the load generator itself. It shares the host's cores with the three replicas, so by
        /// default it takes one, as `drover local up` gives each replica its share: on two cores a second thread
        /// only added cross-thread wake-ups on the cores the replicas need (64 clients, same build: 9,070 commits/s
        /// with two, 9,632-10,102/s with one). A load generator on a machine of its own would not take them at all.
        #[arg(long, default_value_t = 1)]
        client_threads: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// SIGKILL the leader repeatedly under load: time to the next acknowledged submission, and lost jobs.
    Failover {
        #[arg(long, default_value_t = 20)]
        kills: usize,
        #[arg(long, default_value_t = 8)]
        clients: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Fill the state with N jobs; leader RSS, then restart time of the whole cluster.
    State {
        #[arg(long, default_value_t = 1_000_000)]
        jobs: u64,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// End to end: N trivial one-GPU jobs through one agent with G simulated GPUs, first submission to last
    /// completion.
    Jobs {
        #[arg(long, default_value_t = 1_000)]
        count: usize,
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Run the agent without job cgroups (no memory limits, cpusets or usage counters), to measure their cost.
        #[arg(long)]
        no_cgroups: bool,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A node dies under a checkpointing job: time until the job steps again elsewhere, from its checkpoint.
    Requeue {
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Configure a fence command (a stand-in for a BMC power-off) so the dead node is declared down at once.
        #[arg(long)]
        fence_command: bool,
        /// What goes wrong: the node dies, its GPU falls off the bus, or the job hangs.
        #[arg(long, value_enum, default_value = "node")]
        fault: requeue::Fault,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Multi-site (issue 14): 5 replicas over sites a,a,b,b,c behind a userspace WAN emulator (RTT between
    /// sites); sequential submission latency from a client at one site, leader failover, and the loss of a site.
    Sites(sites::SitesArgs),
    /// Containers (`srun --container-image`): time to a task's first line with the node's image store cold and
    /// warm, against plain `srun` and `docker run`, and N cold starts at once on one node (one import).
    Containers(containers::ContainersArgs),
    /// Heartbeat load: N simulated agents heartbeating on one leader; leader CPU and Raft log growth (zero
    /// expected from heartbeats).
    Heartbeats(bench_agents::HeartbeatArgs),
    /// ETTR of Llama 3 405B's 54-day run (Meta's published failures), simulated under Drover's recovery and under
    /// Slurm's defaults: GPU-hours lost per root cause. Deterministic per seed; starts no cluster.
    Ettr(ettr::EttrArgs),
    /// Backup under load, restore into a new cluster, and a new cluster forced from one survivor, at N jobs.
    Recovery(recovery::RecoveryArgs),
    /// Planned leader restarts (SIGTERM) under load: the longest pause in acknowledgements, this build beside the
    /// previous release (`--previous`).
    Restarts(restarts::RestartsArgs),
    /// Short one-GPU jobs at a fixed offered rate for minutes through simulated agents (8 GPUs each): jobs/s
    /// sustained, the scheduling loop's latency under that load, and every job's record in accounting.
    ShortJobs(short_jobs::ShortJobsArgs),
}

fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let BenchCmd::Submit { client_threads, .. } = &cmd {
        if *client_threads == 0 {
            bail!("--client-threads must be at least 1");
        }
        rt.worker_threads(*client_threads);
    }
    rt.enable_all().build()?.block_on(async move {
        match cmd {
            BenchCmd::Submit { clients, conns, duration_s, client_threads: _, dir } => {
                submit(clients, conns, duration_s, bench_dir(dir, "submit")).await
            }
            BenchCmd::Failover { kills, clients, dir } => failover(kills, clients, bench_dir(dir, "failover")).await,
            BenchCmd::State { jobs, clients, dir } => state(jobs, clients, bench_dir(dir, "state")).await,
            BenchCmd::Jobs { count, gpus, clients, no_cgroups, dir } => {
                bench_agents::jobs(count, gpus, clients, !no_cgroups, bench_dir(dir, "jobs")).await
            }
            BenchCmd::Requeue { runs, fence_command, fault, dir } => {
                requeue::requeue(runs, fence_command, fault, bench_dir(dir, "requeue")).await
            }
            BenchCmd::Sites(args) => {
                let dir = bench_dir(args.dir.clone(), "sites");
                sites::sites(args, dir).await
            }
            BenchCmd::Containers(args) => containers::containers(args).await,
            BenchCmd::Heartbeats(args) => {
                let dir = bench_dir(args.dir.clone(), "heartbeats");
                bench_agents::heartbeats(args, dir).await
            }
            BenchCmd::Ettr(args) => ettr::ettr(&args),
            BenchCmd::Recovery(args) => {
                let dir = bench_dir(None, "recovery");
                recovery::recovery(args, dir).await
            }
            BenchCmd::ShortJobs(args) => {
                let dir = bench_dir(args.dir.clone(), "short-jobs");
                short_jobs::short_jobs(args, dir).await
            }
            BenchCmd::Restarts(args) => {
                let dir = bench_dir(args.dir.clone(), "restarts");
                restarts::restarts(args, dir).await
            }
        }
    })
}

fn bench_dir(dir: Option<PathBuf>, name: &str) -> PathBuf {
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("drover-bench-{name}-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `clients` submit loops until `stop`, spread round-robin over `connections`; returns (acknowledged ids
/// with ack times, latency histogram µs).
async fn load(
    connections: &[Arc<Client>],
    clients: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<(u64, Instant)>, Histogram<u64>) {
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (client, stop) = (connections[i % connections.len()].clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let spec = trivial_spec();
            let mut acked = Vec::new();
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                if let Ok(id) = client.submit(&spec).await {
                    let now = Instant::now();
                    let _ = hist.record(now.duration_since(t).as_micros() as u64);
                    acked.push((id, now));
                }
            }
            (acked, hist)
        }));
    }
    let mut acked = Vec::new();
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    for t in tasks {
        let (a, h) = t.await.expect("load task");
        acked.extend(a);
        hist.add(h).expect("same histogram bounds");
    }
    (acked, hist)
}

async fn submit(levels: Vec<usize>, conns: usize, duration_s: u64, dir: PathBuf) -> anyhow::Result<()> {
    if conns == 0 {
        bail!("--conns must be at least 1");
    }
    let cluster = LocalCluster::up(&dir, UpOptions::default())?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    let connections = (0..conns).map(|_| cluster.client().map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
    println!(
        "bench submit: 3 replicas on loopback, {duration_s} s per level, clients over {conns} connection(s), {} worker thread(s) each",
        drover_testkit::local::worker_share(3)
    );
    for clients in levels {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let shared = connections[..conns.min(clients)].to_vec();
        let load_stop = stop.clone();
        let handle = tokio::spawn(async move { load(&shared, clients, load_stop).await });
        tokio::time::sleep(Duration::from_secs(duration_s)).await;
        stop.store(true, Ordering::Relaxed);
        let (acked, hist) = handle.await?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "clients={clients:>3}  committed={:>7}  rate={:>8.0}/s  p50={:>6.2} ms  p99={:>6.2} ms",
            acked.len(),
            acked.len() as f64 / secs,
            hist.value_at_quantile(0.5) as f64 / 1e3,
            hist.value_at_quantile(0.99) as f64 / 1e3
        );
    }
    drop(cluster);
    Ok(())
}

async fn failover(kills: usize, clients: usize, dir: PathBuf) -> anyhow::Result<()> {
    let mut cluster = LocalCluster::up(&dir, UpOptions::default())?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    let client = Arc::new(cluster.client()?);
    let faults = vec![Fault::Leader; kills];
    let result =
        kill_under_load(&mut cluster, client, clients, &faults, Duration::from_millis(700), &[], KillHooks::none())
            .await?;
    let gaps = result.gaps();
    println!(
        "failover: {kills} kills, {clients} clients: next ack p50={:.0} ms p99={:.0} ms max={:.0} ms; acknowledged={} lost={} duplicate_ids={}",
        percentile_ms(&gaps, 0.5),
        percentile_ms(&gaps, 0.99),
        percentile_ms(&gaps, 1.0),
        result.acknowledged,
        result.lost,
        result.duplicates
    );
    Ok(())
}

/// What to SIGKILL in one round of [`kill_under_load`].
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    /// The current leader.
    Leader,
    /// These replicas at once (a whole site).
    Replicas(Vec<u64>),
}

/// One round: who was killed, who led before and after, and the time from the kill to the first acknowledgement
/// of a submission sent after it.
pub(crate) struct Round {
    pub killed: Vec<u64>,
    pub leader_before: u64,
    pub leader_after: u64,
    pub gap: Duration,
}

pub(crate) struct KillResult {
    pub rounds: Vec<Round>,
    pub acknowledged: usize,
    pub lost: usize,
    pub duplicates: usize,
}

impl KillResult {
    fn gaps(&self) -> Vec<Duration> {
        self.rounds.iter().map(|r| r.gap).collect()
    }
}

/// The `q` quantile of `values` in ms (1.0: the largest); 0 when empty.
pub(crate) fn percentile_ms(values: &[Duration], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1].as_secs_f64() * 1e3
}

/// What a bench does around each kill of [`kill_under_load`]: `before_kill` is awaited after the settle (e.g. until
/// every simulated agent renewed its lease), `on_kill` runs just before the SIGKILL.
pub(crate) struct KillHooks<'a> {
    pub on_kill: &'a (dyn Fn() + Sync),
    pub before_kill: &'a (dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Sync),
}

impl KillHooks<'static> {
    pub fn none() -> Self {
        fn nothing() {}
        fn ready() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            Box::pin(async {})
        }
        KillHooks { on_kill: &nothing, before_kill: &ready }
    }
}

/// `clients` submit loops run while each fault in turn SIGKILLs replicas (after `settle`, once a leader serves,
/// one of `leaders` when given and it happens within 15 s), waits for the first acknowledged submission sent
/// after the kill, and restarts them. At the end every acknowledged job must still be listed.
pub(crate) async fn kill_under_load(
    cluster: &mut LocalCluster,
    client: Arc<Client>,
    clients: usize,
    faults: &[Fault],
    settle: Duration,
    leaders: &[u64],
    hooks: KillHooks<'_>,
) -> anyhow::Result<KillResult> {
    let stop = Arc::new(AtomicBool::new(false));
    // (sent, acknowledged) per successful submission.
    let acks = Arc::new(std::sync::Mutex::new(Vec::<(Instant, Instant)>::new()));
    // A watcher records every ack time, so the gap after each kill can be measured.
    let mut tasks = Vec::new();
    let ids = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    for _ in 0..clients {
        let (client, stop, acks, ids) = (client.clone(), stop.clone(), acks.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let spec = trivial_spec();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                if let Ok(id) = client.submit(&spec).await {
                    acks.lock().unwrap().push((sent, Instant::now()));
                    ids.lock().unwrap().push(id);
                }
            }
        }));
    }
    let mut rounds = Vec::new();
    for (round, fault) in faults.iter().enumerate() {
        tokio::time::sleep(settle).await;
        (hooks.before_kill)().await;
        let mut leader = cluster.wait_ready(Duration::from_secs(30)).await?;
        let waiting = Instant::now();
        while !leaders.is_empty() && !leaders.contains(&leader) && waiting.elapsed() < Duration::from_secs(15) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            leader = cluster.wait_ready(Duration::from_secs(30)).await?;
        }
        let killed = match fault {
            Fault::Leader => vec![leader],
            Fault::Replicas(ids) => ids.clone(),
        };
        (hooks.on_kill)();
        let killed_at = Instant::now();
        for id in &killed {
            cluster.kill(*id)?;
        }
        // Only submissions sent after the replicas are gone count: a reply already in flight proves nothing.
        let dead_at = Instant::now();
        let first = loop {
            let first = acks.lock().unwrap().iter().filter(|(sent, _)| *sent > dead_at).map(|(_, acked)| *acked).min();
            if let Some(t) = first {
                break t;
            }
            if killed_at.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("round {round}: nothing acknowledged within 60 s after killing {killed:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let gap = first.duration_since(killed_at);
        let leader_after = cluster.wait_ready(Duration::from_secs(30)).await?;
        for id in &killed {
            cluster.start(*id)?;
        }
        println!(
            "kill {:>2}: replica(s) {killed:?} (leader was {leader}), next ack after {:>6.0} ms, leader now {leader_after}",
            round + 1,
            gap.as_secs_f64() * 1e3
        );
        rounds.push(Round { killed, leader_before: leader, leader_after, gap });
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let acked = ids.lock().unwrap().clone();
    let (jobs, _) = client.list_jobs(&JobFilter { include_finished: true, limit: 0, ..Default::default() }).await?;
    let present: std::collections::HashSet<u64> = jobs.iter().map(|j| j.id).collect();
    let lost = acked.iter().filter(|id| !present.contains(id)).count();
    let mut sorted = acked.clone();
    sorted.sort_unstable();
    sorted.dedup();
    Ok(KillResult { rounds, acknowledged: acked.len(), lost, duplicates: acked.len() - sorted.len() })
}

/// Resident memory of a process, from /proc (0 when it is gone).
/// Submits `jobs` trivial jobs from `clients` concurrent loops (rounded up to a multiple of `clients`).
async fn fill(client: &Arc<Client>, jobs: u64, clients: usize) {
    let per_client = jobs.div_ceil(clients as u64);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let spec = trivial_spec();
            for _ in 0..per_client {
                client.submit(&spec).await.expect("submit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("fill task");
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn state(jobs: u64, clients: usize, dir: PathBuf) -> anyhow::Result<()> {
    let mut cluster = LocalCluster::up(
        &dir,
        UpOptions {
            snapshot_after_entries: 100_000,
            keep_entries_after_snapshot: 10_000,
            // One user submits them all: lift MaxSubmitJobs (100,000 by default) above the count.
            extra_toml: format!("[cluster.limits]\nmax_jobs_per_user = {}\n", jobs.max(100_000)),
            ..UpOptions::default()
        },
    )?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    let client = Arc::new(cluster.client()?);
    let started = Instant::now();
    fill(&client, jobs, clients).await;
    let fill_s = started.elapsed().as_secs_f64();
    let leader = cluster.wait_ready(Duration::from_secs(30)).await?;
    let pid = cluster.process(leader).and_then(|p| p.pid).unwrap_or(0);
    let status = client.cluster_status().await?;
    let rss: Vec<String> =
        cluster.processes.iter().filter_map(|p| p.pid).map(|p| format!("{} MiB", rss_kib(p) / 1024)).collect();
    println!(
        "state: {} jobs submitted in {fill_s:.1} s ({:.0}/s); leader RSS {} MiB; all replicas: {}",
        status.next_job_id - 1,
        (status.next_job_id - 1) as f64 / fill_s,
        rss_kib(pid) / 1024,
        rss.join(", ")
    );
    let ids: Vec<u64> = cluster.processes.iter().map(|p| p.id).collect();
    for id in &ids {
        cluster.signal(*id, libc::SIGTERM)?;
    }
    let restart = Instant::now();
    for id in &ids {
        cluster.start(*id)?;
    }
    cluster.wait_ready(Duration::from_secs(600)).await?;
    let after = client.cluster_status().await?;
    println!(
        "restart: all 3 replicas stopped and started; leader serving with {} pending jobs after {:.2} s",
        after.pending_jobs,
        restart.elapsed().as_secs_f64()
    );
    Ok(())
}
