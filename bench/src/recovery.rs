//! `drover-bench recovery`: what the operations runbooks cost at a given state size. A cluster is filled with N
//! jobs; then a backup is taken while clients keep submitting (time, size, the submissions acknowledged
//! meanwhile), restored into a fresh 3-replica cluster (time per replica, time until it accepts submissions, every
//! acknowledged job checked), and finally two replicas are killed for good and a new cluster is forced from the
//! third (time from the command to the first accepted submission, acknowledged jobs lost).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use drover_client::{Client, JobFilter};
use drover_testkit::local::{LocalCluster, UpOptions, trivial_spec};

#[derive(clap::Args)]
pub struct RecoveryArgs {
    /// Jobs in the state before the backup.
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// Clients that fill the state and keep submitting during the backup.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn options(jobs: u64) -> UpOptions {
    UpOptions {
        snapshot_after_entries: 100_000,
        keep_entries_after_snapshot: 10_000,
        extra_toml: format!("[cluster.limits]\nmax_jobs_per_user = {}\n", (jobs * 2).max(100_000)),
        ..UpOptions::default()
    }
}

pub async fn recovery(args: RecoveryArgs, dir: PathBuf) -> anyhow::Result<()> {
    let mut old = LocalCluster::up(&dir.join("old"), options(args.jobs))?;
    old.wait_ready(Duration::from_secs(30)).await?;
    let client = Arc::new(old.client()?);
    let fill = Instant::now();
    super::fill(&client, args.jobs, args.clients).await;
    println!("fill: {} jobs in {:.1} s", args.jobs, fill.elapsed().as_secs_f64());

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (client, clients, stop) = (client.clone(), args.clients, stop.clone());
        tokio::spawn(async move { super::load(&[client], clients, stop).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let backup = dir.join("cluster.backup");
    let started = Instant::now();
    let backup_client = old.client()?.with_deadline(Duration::from_secs(60));
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&backup)?);
    backup_client.backup(&mut out).await?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    let took = started.elapsed();
    let verified = drover_proto::backup::verify_backup(&backup)?;
    let verify_took = started.elapsed() - took;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (acked, latency) = load.await?;
    let during = acked.iter().filter(|(_, t)| *t >= started && *t <= started + took).count();
    let ahead = Duration::from_millis(500);
    let before_rate = acked.iter().filter(|(_, t)| *t < started && *t >= started - ahead).count() as f64 / 0.5;
    let before: Vec<u64> = acked.iter().filter(|(_, t)| *t < started).map(|(id, _)| *id).collect();
    println!(
        "backup: {} jobs' state at log index {} in {:.2} s, {:.1} MB ({} bytes per job), checked from disk in {:.2} s; submissions went on: {} acknowledged during it ({:.0}/s; {:.0}/s in the 0.5 s before; p99 {:.1} ms over the whole load)",
        args.jobs + before.len() as u64,
        verified.header.last_log_index,
        took.as_secs_f64(),
        verified.file_bytes as f64 / 1e6,
        verified.file_bytes / (args.jobs + acked.len() as u64).max(1),
        verify_took.as_secs_f64(),
        during,
        during as f64 / took.as_secs_f64(),
        before_rate,
        latency.value_at_quantile(0.99) as f64 / 1000.0
    );
    let old_total = client.cluster_status().await?.next_job_id - 1;
    old.down()?;

    let new_dir = dir.join("new");
    let started = Instant::now();
    let mut new = LocalCluster::up(&new_dir, UpOptions { restore: Some(backup.clone()), ..options(args.jobs) })?;
    let restored = started.elapsed();
    new.wait_ready(Duration::from_secs(600)).await?;
    // A restored leader with a million pending jobs has a busy first minute (the first scheduling passes): reads
    // get a deadline to match.
    let client = new.client()?.with_deadline(Duration::from_secs(60));
    let accepting = loop {
        if client.submit(&trivial_spec()).await.is_ok() {
            break started.elapsed();
        }
    };
    println!(
        "restore: 3 replicas restored from the backup in {:.2} s (one after another), first submission accepted {:.2} s after the restore began",
        restored.as_secs_f64(),
        accepting.as_secs_f64(),
    );
    // Every job acknowledged before the backup began must be there, each looked up by id (10,000 per call).
    let expected: Vec<u64> = (1..=args.jobs).chain(before.iter().copied()).collect();
    let checking = Instant::now();
    let found = present(&client, &expected).await?;
    let status = client.cluster_status().await?;
    println!(
        "restore check: {} jobs held ({} were acknowledged before the backup began; the rest committed before its checkpoint, and one submitted since), {} of those missing, each looked up by id in {:.1} s (the old cluster had {old_total} when it stopped)",
        status.pending_jobs + status.running_jobs,
        expected.len(),
        expected.len() - found.len(),
        checking.elapsed().as_secs_f64()
    );
    force(&mut new, &client).await
}

/// Which of `ids` the cluster holds, asked in chunks (a listing returns at most 100,000 jobs).
pub(crate) async fn present(client: &Client, ids: &[u64]) -> anyhow::Result<HashSet<u64>> {
    let mut found = HashSet::new();
    for chunk in ids.chunks(10_000) {
        let filter = JobFilter { ids: chunk.to_vec(), include_finished: true, ..Default::default() };
        let (jobs, _) = client.list_jobs(&filter).await?;
        found.extend(jobs.into_iter().map(|j| j.id));
    }
    Ok(found)
}

/// Kills the followers for good, then the leader; forces a new cluster from the leader's data.
async fn force(cluster: &mut LocalCluster, client: &Client) -> anyhow::Result<()> {
    let leader = cluster.wait_ready(Duration::from_secs(30)).await?;
    let all: Vec<u64> = (1..client.cluster_status().await?.next_job_id).collect();
    let before: Vec<u64> = all.iter().step_by((all.len() / 2_000).max(1)).copied().collect();
    for id in [1, 2, 3].into_iter().filter(|id| *id != leader) {
        cluster.kill(id)?;
    }
    cluster.kill(leader)?;
    // The killed replica's last threads may still hold the database lock for a moment after it is gone from
    // the process table: the command says so, and is tried again.
    let started = Instant::now();
    let said = loop {
        let attempt = Instant::now();
        match cluster.force_new_cluster(leader) {
            Ok(said) => break said,
            Err(e) if e.to_string().contains("still running") && started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100).saturating_sub(attempt.elapsed())).await;
            }
            Err(e) => return Err(e),
        }
    };
    let forced = started.elapsed();
    cluster.start(leader)?;
    let solo = cluster
        .client_at(&cluster.process(leader).map(|p| p.address.clone()).unwrap_or_default())?
        .with_deadline(Duration::from_secs(60));
    let accepted = loop {
        if solo.submit(&trivial_spec()).await.is_ok() {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(600) {
            anyhow::bail!("the forced cluster accepted nothing in 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = present(&solo, &before).await?;
    let lost = before.len() - after.len();
    let held = solo.cluster_status().await?;
    println!(
        "force-new-cluster: rewrite {:.2} s, first submission accepted {:.2} s after the command began; {} of {} jobs held after it, {lost} of a sample of {} missing ({})",
        forced.as_secs_f64(),
        accepted.as_secs_f64(),
        held.pending_jobs + held.running_jobs,
        all.len() + 1,
        before.len(),
        said.trim()
    );
    Ok(())
}
