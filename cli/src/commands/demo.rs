//! `drover demo`: starts a 3-controller local cluster, submits a multi-node GPU job and a stream of jobs,
//! SIGKILLs the leader in the middle of the stream, and shows that every acknowledged job survived and that
//! submissions resumed on the new leader. (Running the jobs needs node agents, which this build does not have
//! yet: the jobs stay PENDING.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_client::{Client, JobFilter};

use crate::local::{LocalCluster, UpOptions};
use crate::sbatch_args::{SubmitContext, build_spec, parse_command_line};

const TRAIN_SCRIPT: &str = "#!/bin/bash
#SBATCH --job-name=llm-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --time=14-00:00:00
#SBATCH --requeue
srun python train.py --resume-from \"${DROVER_RESUME_FROM:-none}\"
";

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

fn spec(args: &[&str], script: Option<&str>) -> anyhow::Result<drover_state::JobSpec> {
    let (user, uid, gid) = crate::identity::current_user();
    let ctx = SubmitContext { user, uid, gid, cwd: std::env::current_dir()?.display().to_string(), env: vec![] };
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    Ok(build_spec(&parse_command_line(&args)?, script, &ctx)?.spec)
}

async fn demo(dir: PathBuf) -> anyhow::Result<()> {
    println!("== Starting 3 controller replicas under {}", dir.display());
    let mut cluster = LocalCluster::up(&dir, UpOptions::default())?;
    let leader = cluster.wait_ready(Duration::from_secs(30)).await?;
    let client = Arc::new(Client::from_list(&cluster.addresses())?);
    super::cluster::status(&client, false).await?;
    println!("\n== sbatch llm-pretrain.sh   (2 nodes x 4 GPUs, 14 days, --requeue)");
    let train = client.submit(&spec(&["train.sh"], Some(TRAIN_SCRIPT))?).await?;
    println!("Submitted batch job {train}");

    println!("\n== 4 clients submit jobs; replica {leader} (the leader) is SIGKILLed mid-stream");
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        let spec = spec(&["--job-name", &format!("sweep-{w}"), "--gres=gpu:1", "--wrap", "python sweep.py"], None)?;
        workers.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let sent = Instant::now();
                if let Ok(id) = client.submit(&spec).await {
                    acked.lock().unwrap().push((id, sent, Instant::now()));
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
    println!("\n== Restarting replica {leader}; it catches up from the new leader");
    cluster.start(leader)?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    super::cluster::status(&client, false).await?;
    println!("\n== squeue -j {train}");
    let (train_jobs, _) = client.list_jobs(&JobFilter { ids: vec![train], ..Default::default() }).await?;
    let formatter = crate::format::JobFormatter::new(crate::format::SQUEUE_DEFAULT).map_err(|e| anyhow::anyhow!(e))?;
    println!("{}", formatter.header());
    for job in &train_jobs {
        println!("{}", formatter.line(job, super::now_ms()));
    }
    println!("(the job stays PENDING: node agents arrive with the next milestone)");
    cluster.down()?;
    println!("\n== Cluster stopped. Acknowledged jobs lost: {lost}.");
    if lost > 0 {
        anyhow::bail!("{lost} acknowledged jobs were lost");
    }
    Ok(())
}
