//! `drover demo`: starts 3 controller replicas and 2 node agents (4 simulated GPUs each), runs a 2-node job
//! whose 8 tasks rendezvous at MASTER_ADDR:MASTER_PORT, SIGKILLs the leader while the job runs and clients
//! are submitting, and shows the job finishing with its output and every acknowledged submission kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_client::{Client, JobFilter};
use drover_state::JobState;

use crate::local::{LocalCluster, UpOptions};
use crate::sbatch_args::{build_spec, parse_command_line};

/// The training job: a rendezvous of all ranks (as torch.distributed's env:// does), some "training", then a
/// step that reports where each rank ran.
fn train_script(drover: &Path) -> String {
    format!(
        "#!/bin/bash
#SBATCH --job-name=llm-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --time=14-00:00:00
#SBATCH --requeue
#SBATCH --output=llm-pretrain-%j.out
echo \"job $SLURM_JOB_ID on $SLURM_JOB_NODELIST; rendezvous at $MASTER_ADDR:$MASTER_PORT\"
srun {drover} rendezvous
sleep 4   # training...
srun --label bash -c 'echo \"rank $RANK/$WORLD_SIZE on $SLURMD_NODENAME (local rank $LOCAL_RANK, GPUs $CUDA_VISIBLE_DEVICES): epoch done\"'
echo \"training finished\"
",
        drover = drover.display()
    )
}

pub fn run(dir: Option<PathBuf>) -> anyhow::Result<()> {
    let tmp;
    let dir = match dir {
        Some(d) => d,
        None => {
            tmp = std::env::temp_dir().join(format!("drover-demo-{}", std::process::id()));
            tmp
        }
    };
    crate::connect::runtime().block_on(demo(dir))
}

/// A job spec as `sbatch ARGS` would submit it from `cwd`, with the demo's Slurm commands first on PATH.
fn spec(args: &[&str], script: Option<&str>, cwd: &Path) -> anyhow::Result<drover_state::JobSpec> {
    let shims = cwd.parent().unwrap_or(cwd).join("bin");
    let path = format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()));
    let mut env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k == "HOME").collect();
    env.push(("PATH".to_string(), path));
    let ctx = crate::slurm::host::submit_context(cwd.display().to_string(), env, true);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let parsed = build_spec(&parse_command_line(&args)?, script, &ctx)?;
    for warning in &parsed.warnings {
        eprintln!("sbatch: warning: {warning}");
    }
    Ok(parsed.spec)
}

async fn wait_for(
    client: &Client,
    id: u64,
    done: impl Fn(JobState) -> bool,
    timeout: Duration,
) -> anyhow::Result<drover_state::Job> {
    let start = Instant::now();
    loop {
        let (job, _) = client.get_job(id, false, false).await?;
        if done(job.state) {
            return Ok(job);
        }
        if start.elapsed() > timeout {
            anyhow::bail!("job {id} is still {} after {timeout:?}", job.state.name());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn print_jobs(jobs: &[drover_state::Job]) -> anyhow::Result<()> {
    let formatter = crate::format::JobFormatter::new(crate::format::SQUEUE_DEFAULT).map_err(|e| anyhow::anyhow!(e))?;
    println!("{}", formatter.header());
    for job in jobs {
        println!("{}", formatter.line(job, drover_common::wall::now_ms()));
    }
    Ok(())
}

async fn demo(dir: PathBuf) -> anyhow::Result<()> {
    println!("== Starting 3 controller replicas and 2 node agents (4 simulated GPUs each) under {}", dir.display());
    let options = UpOptions { agents: 2, gpus_per_agent: 4, ..UpOptions::default() };
    let mut cluster = LocalCluster::up(&dir, options)?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    cluster.wait_agents(Duration::from_secs(30)).await?;
    let client = Arc::new(cluster.client()?);
    crate::commands::cluster::status(&client, false).await?;
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let drover = crate::commands::shims::link_all(&dir.join("bin"))?;

    println!("\n== sbatch llm-pretrain.sh   (2 nodes x 4 tasks x 4 GPUs, 14 days, --requeue)");
    let script = train_script(&drover);
    println!("{}", script.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n"));
    let train = client.submit(&spec(&["llm-pretrain.sh"], Some(&script), &work)?).await?;
    println!("Submitted batch job {train}");
    wait_for(&client, train, |s| s != JobState::Pending, Duration::from_secs(30)).await?;
    let (running, _) = client.list_jobs(&JobFilter::default()).await?;
    print_jobs(&running)?;

    let leader = cluster.wait_ready(Duration::from_secs(10)).await?;
    println!("\n== While it runs, 4 clients submit (held) jobs; replica {leader}, the leader, is SIGKILLed");
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        let spec =
            spec(&["--job-name", &format!("sweep-{w}"), "--gres=gpu:1", "--hold", "--wrap", "true"], None, &work)?;
        workers.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let sent = Instant::now();
                if let Ok(id) = client.submit(&spec).await {
                    acked.lock().unwrap().push((id, sent, Instant::now()));
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = acked.lock().unwrap().len();
    let killed_at = Instant::now();
    cluster.kill(leader)?;
    // Only submissions sent after the old leader is gone count: a reply already in flight proves nothing.
    let dead_at = Instant::now();
    println!("killed replica {leader} after {before} acknowledged submissions");
    let first_after = loop {
        if let Some((_, _, t)) = acked.lock().unwrap().iter().find(|(_, sent, _)| *sent > dead_at) {
            break t.duration_since(killed_at);
        }
        if killed_at.elapsed() > Duration::from_secs(30) {
            anyhow::bail!("no submission was acknowledged within 30 s of the leader's death");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    println!(
        "first submission acknowledged by the new leader {:.0} ms after the kill",
        first_after.as_secs_f64() * 1e3
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    let acked: Vec<u64> = acked.lock().unwrap().iter().map(|(id, _, _)| *id).collect();
    let (jobs, _) = client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await?;
    let present: std::collections::HashSet<u64> = jobs.iter().map(|j| j.id).collect();
    let lost = acked.iter().filter(|id| !present.contains(id)).count();
    let mut unique = acked.clone();
    unique.sort_unstable();
    unique.dedup();
    println!(
        "{} submissions acknowledged in all; {} lost; {} job ids handed out twice",
        acked.len(),
        lost,
        acked.len() - unique.len()
    );

    println!("\n== The training job goes on under the new leader and finishes");
    let done = wait_for(&client, train, |s| s.is_terminal(), Duration::from_secs(120)).await?;
    let output = std::fs::read_to_string(work.join(format!("llm-pretrain-{train}.out"))).unwrap_or_default();
    println!("-- llm-pretrain-{train}.out:");
    print!("{output}");
    println!(
        "-- job {train}: {} (exit {}:{}) on {}",
        done.state.name(),
        done.exit_code,
        done.exit_signal,
        drover_state::hostlist::compress_hostlist(&done.nodes)
    );

    println!("\n== Restarting replica {leader}; it catches up from the new leader");
    cluster.start(leader)?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    crate::commands::cluster::status(&client, false).await?;
    for chunk in unique.chunks(5_000) {
        client.cancel(chunk).await?;
    }
    cluster.down()?;
    let met = output.lines().filter(|l| l.contains("met rank 0") || l.contains("ranks met")).count();
    println!("\n== Cluster stopped. Ranks that met at the rendezvous: {met}/8. Acknowledged jobs lost: {lost}.");
    if lost > 0 || done.state != JobState::Completed || met != 8 {
        anyhow::bail!(
            "the demo failed: job {} ended {}, {met}/8 ranks met, {lost} jobs lost",
            train,
            done.state.name()
        );
    }
    Ok(())
}
