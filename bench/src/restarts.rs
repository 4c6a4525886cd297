//! `drover-bench restarts`: planned leader restarts (SIGTERM, as a service manager stops a replica for an
//! upgrade) under a stream of submissions, for this build and, in the same run, for the previous release
//! (0.1.0, built from its commit in the release profile by `previous-release --release`), which stops without
//! handing leadership over.
//! Per restart: the longest time no submission was acknowledged, from the signal until the replica is back and
//! the cluster settled; and whether any acknowledged submission was lost.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use drover_testkit::local::{LocalCluster, UpOptions, trivial_spec};

use crate::percentile_ms;

#[derive(clap::Args)]
pub struct RestartsArgs {
    /// Leader restarts per build.
    #[arg(long, default_value_t = 10)]
    restarts: usize,
    /// Clients submitting throughout.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Also run the previous release (built from its commit on first use), for the comparison.
    #[arg(long)]
    previous: bool,
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub async fn restarts(args: RestartsArgs, dir: PathBuf) -> anyhow::Result<()> {
    if args.restarts == 0 || args.clients == 0 {
        bail!("--restarts and --clients must be at least 1");
    }
    let mut builds = vec![("this build", None)];
    if args.previous {
        builds.push(("the previous release (0.1.0)", Some(drover_testkit::previous::release_binaries()?)));
    }
    for (name, binaries) in builds {
        let tag = if binaries.is_some() { "previous" } else { "current" };
        let options = UpOptions { binaries, ..UpOptions::default() };
        let mut cluster = LocalCluster::up(&dir.join(tag), options)?;
        cluster.wait_ready(Duration::from_secs(30)).await?;
        let pauses = one_build(&mut cluster, args.restarts, args.clients).await?;
        println!(
            "restarts ({name}): {} leader SIGTERMs, {} clients: longest pause in acknowledgements p50={:.0} ms \
             max={:.0} ms",
            args.restarts,
            args.clients,
            percentile_ms(&pauses, 0.5),
            percentile_ms(&pauses, 1.0),
        );
        cluster.down()?;
    }
    Ok(())
}

async fn one_build(cluster: &mut LocalCluster, restarts: usize, clients: usize) -> anyhow::Result<Vec<Duration>> {
    let client = Arc::new(cluster.client()?);
    let stop = Arc::new(AtomicBool::new(false));
    let acks: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, stop, acks) = (client.clone(), stop.clone(), acks.clone());
            tokio::spawn(async move {
                let spec = drover_state::JobSpec { hold: true, ..trivial_spec() };
                while !stop.load(Ordering::Relaxed) {
                    match client.submit(&spec).await {
                        Ok(id) => acks.lock().unwrap().push((id, Instant::now())),
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut pauses = Vec::new();
    for round in 0..restarts {
        let leader = agreed_leader(cluster).await?;
        let signalled = Instant::now();
        tokio::task::block_in_place(|| cluster.signal(leader, libc::SIGTERM))?;
        let exited_at = Instant::now();
        cluster.start(leader)?;
        settled(cluster, leader).await?;
        let back = Instant::now();
        // Until acknowledgements resume after the replica is back (a pause may outlast it).
        while !acks.lock().unwrap().iter().any(|(_, t)| *t > back) {
            if back.elapsed() > Duration::from_secs(30) {
                bail!("round {}: nothing acknowledged within 30 s of the replica coming back", round + 1);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut times: Vec<Instant> =
            acks.lock().unwrap().iter().map(|(_, t)| *t).filter(|t| *t >= signalled).collect();
        times.sort();
        // Up to the first acknowledgement after the replica is back: the pause may run past `back`.
        if let Some(after) = times.iter().position(|t| *t > back) {
            times.truncate(after + 1);
        } else {
            bail!("round {}: nothing acknowledged since the replica came back", round + 1);
        }
        let mut pause = times.first().map_or(back - signalled, |first| *first - signalled);
        for pair in times.windows(2) {
            pause = pause.max(pair[1] - pair[0]);
        }
        let exited = exited_at - signalled;
        println!(
            "restart {:>2}: leader {leader} SIGTERMed, gone after {:>4.0} ms, longest pause {:>5.0} ms ({} acks in {:.0} ms)",
            round + 1,
            ms(exited),
            ms(pause),
            times.len(),
            ms(back - signalled)
        );
        pauses.push(pause);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await?;
    }
    let ids: Vec<u64> = acks.lock().unwrap().iter().map(|(id, _)| *id).collect();
    let found = crate::recovery::present(&client, &ids).await?;
    let lost = ids.iter().filter(|id| !found.contains(id)).count();
    println!("  {} submissions acknowledged, {lost} lost", ids.len());
    if lost > 0 {
        bail!("{lost} acknowledged submissions lost");
    }
    Ok(pauses)
}

/// The leader every replica follows: a replica restarted within its lease claims its old leadership for a
/// moment, and signalling it then would measure nothing.
async fn agreed_leader(cluster: &LocalCluster) -> anyhow::Result<u64> {
    let client = cluster.client()?.with_deadline(Duration::from_millis(1_000));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if let Ok(status) = client.cluster_status().await
            && let Some(leader) = status.replicas.iter().find(|r| r.role == "leader")
            && drover_testkit::local::rejoined(&status, leader.id, 10)
        {
            return Ok(leader.id);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the replicas did not agree on a leader within 60 s")
}

async fn settled(cluster: &LocalCluster, id: u64) -> anyhow::Result<()> {
    let client = cluster.client()?.with_deadline(Duration::from_millis(1_000));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if let Ok(status) = client.cluster_status().await
            && drover_testkit::local::rejoined(&status, id, 10)
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("replica {id} did not rejoin within 60 s of its restart")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
