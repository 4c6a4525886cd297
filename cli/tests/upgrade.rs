//! The upgrade drill: a cluster of the previous release (0.1.0, built from its commit by
//! `drover_testkit::previous`) under a stream of submissions and with jobs running is rolled to this build replica
//! by replica and agent by agent, rolled back, rolled forward again and finalized. Nothing acknowledged is lost, no
//! running job restarts, leadership changes only when a leader is restarted, and each mix of builds still runs
//! jobs end to end. Real processes on loopback.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_cli::local::{LocalCluster, UpOptions, find_binary, trivial_spec};
use drover_client::{Client, JobFilter};
use drover_state::JobState;

mod common;
use common::load::Load;

/// The two builds' binaries: the previous release's and this one's.
struct Builds {
    previous: PathBuf,
    current: PathBuf,
}

impl Builds {
    fn dir(&self, current: bool) -> &std::path::Path {
        if current { &self.current } else { &self.previous }
    }
}

fn controllers(cluster: &LocalCluster) -> Vec<u64> {
    cluster.processes.iter().filter(|p| p.role == "controller").map(|p| p.id).collect()
}

/// The leader's id and term, once one leads with a quorum behind it.
async fn leader(cluster: &LocalCluster) -> (u64, u64) {
    let id = cluster.wait_ready(Duration::from_secs(60)).await.expect("a leader");
    let status = cluster.client().unwrap().cluster_status().await.expect("status");
    let term = status.replicas.iter().find(|r| r.id == id).map_or(0, |r| r.term);
    (id, term)
}

/// Stops process `id` as an operator's service manager does (SIGTERM), and starts it again from the other build.
fn restart_as(cluster: &mut LocalCluster, id: u64, builds: &Builds, current: bool) {
    let role = cluster.process(id).unwrap().role.clone();
    cluster.signal(id, libc::SIGTERM).unwrap();
    let name = if role == "agent" { "drover-agent" } else { "drover-controller" };
    cluster.set_binary(id, Some(builds.dir(current).join(name))).unwrap();
    cluster.start(id).unwrap();
}

/// Waits until replica `id` is back in a settled cluster (see `rejoined`): every member that answers follows one
/// leader in one term, and `id` has caught up with it.
async fn caught_up(cluster: &LocalCluster, id: u64) {
    let client = cluster.client().unwrap().with_deadline(Duration::from_millis(1_500));
    let started = Instant::now();
    loop {
        if let Ok(status) = client.cluster_status().await
            && drover_testkit::local::rejoined(&status, id, 10)
        {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "replica {id} did not catch up within a minute");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rolls every replica to the `current` or previous build, followers first and the leader last (the runbook's
/// order); returns how many leaders were restarted (each costs one election).
async fn roll_replicas(cluster: &mut LocalCluster, builds: &Builds, current: bool) -> u64 {
    let (first_leader, _) = leader(cluster).await;
    let mut order: Vec<u64> = controllers(cluster).into_iter().filter(|id| *id != first_leader).collect();
    order.push(first_leader);
    for id in order {
        restart_as(cluster, id, builds, current);
        caught_up(cluster, id).await;
    }
    1
}

/// Rolls every agent; its tasks keep running under their supervisors while it is away. Waits until the leader
/// (of this build: it reports agents' versions) has a session with each, from the build it was rolled to.
async fn roll_agents(cluster: &mut LocalCluster, builds: &Builds, current: bool) {
    let agents = cluster.agents();
    for (_, id) in &agents {
        restart_as(cluster, *id, builds, current);
    }
    let want = if current { env!("CARGO_PKG_VERSION") } else { drover_testkit::previous::VERSION };
    let client = cluster.client().unwrap();
    let started = Instant::now();
    loop {
        let version = client.cluster_version().await.expect("a leader of this build");
        let rolled = version.agents.iter().filter(|a| a.version.as_ref().is_some_and(|v| v.binary_version == want));
        if rolled.count() == agents.len() {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the agents did not come back as {want}: {version:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job submitted now runs and completes: scheduling, launch on an agent and the end report all work with the
/// builds as they are mixed at this moment.
async fn a_job_runs_to_completion(client: &Client, phase: &str) {
    let id = client.submit(&trivial_spec()).await.unwrap_or_else(|e| panic!("{phase}: submit failed: {e}"));
    let started = Instant::now();
    loop {
        let (job, _) = client.get_job(id, false, false).await.expect("get job");
        if job.state == JobState::Completed {
            return;
        }
        assert!(!job.state.is_terminal(), "{phase}: job {id} ended {:?} instead of completing", job.state);
        assert!(started.elapsed() < Duration::from_secs(60), "{phase}: job {id} still {:?} after a minute", job.state);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn drover(cluster: &LocalCluster, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(find_binary("drover").unwrap())
        .args(["--controllers", &cluster.addresses()])
        .args(args)
        .env("DROVER_CONFIG", cluster.dir.join("client.toml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_rolls_from_the_previous_release_and_back_and_forward_under_load_then_finalizes() {
    let builds = Builds {
        previous: drover_testkit::previous::binaries().expect("the previous release builds"),
        current: find_binary("drover-controller").unwrap().parent().unwrap().to_path_buf(),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let options = UpOptions { agents: 2, binaries: Some(builds.previous.clone()), ..UpOptions::default() };
    let mut cluster = LocalCluster::up(&dir.path().join("cluster"), options).expect("cluster of the previous release");
    let (_, first_term) = leader(&cluster).await;
    cluster.wait_agents(Duration::from_secs(60)).await.unwrap();
    let client = Arc::new(cluster.client().unwrap());

    // Long jobs that must run through the whole drill in their first incarnation.
    let long = drover_state::JobSpec { script: "#!/bin/sh\nsleep 900\n".into(), ..trivial_spec() };
    let mut long_jobs = Vec::new();
    for _ in 0..4 {
        long_jobs.push(client.submit(&long).await.unwrap());
    }
    let started = Instant::now();
    while !futures_all_running(&client, &long_jobs).await {
        assert!(started.elapsed() < Duration::from_secs(60), "the long jobs did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let starts = start_times(&client, &long_jobs).await;
    a_job_runs_to_completion(&client, "all on the previous release").await;

    // A leader of the previous release knows nothing of versions: the new CLI says so plainly.
    let (ok, said) = drover(&cluster, &["cluster", "version"]);
    assert!(!ok && said.contains("before feature levels"), "{said}");

    // Held submissions throughout: they load the log, never the agents.
    let held = drover_state::JobSpec { hold: true, ..trivial_spec() };
    let load = Load::start_with(client.clone(), 4, held);
    load.wait_for(50).await;
    let mut leader_restarts = 0;

    // Forward: replicas, then agents.
    leader_restarts += roll_replicas(&mut cluster, &builds, true).await;
    let version = client.cluster_version().await.expect("a leader of this build reports versions");
    assert_eq!(version.active_feature_level, 1);
    assert_eq!(version.finalizable_level, drover_state::feature::LEVEL, "{version:?}");
    assert!(version.agents.iter().all(|a| a.version.as_ref().unwrap().binary_version == "0.1.0"), "{version:?}");
    a_job_runs_to_completion(&client, "replicas of this build, agents of the previous").await;
    roll_agents(&mut cluster, &builds, true).await;
    let version = client.cluster_version().await.unwrap();
    assert_eq!(version.agents.len(), 2);
    assert!(
        version.agents.iter().all(|a| a.version.as_ref().unwrap().feature_level == drover_state::feature::LEVEL),
        "{version:?}"
    );
    a_job_runs_to_completion(&client, "all on this build, not finalized").await;

    // Back: agents, then replicas. Half-way, finalizing is refused and names the replica in the way.
    roll_agents(&mut cluster, &builds, false).await;
    let (first_leader, _) = leader(&cluster).await;
    let follower = controllers(&cluster).into_iter().find(|id| *id != first_leader).unwrap();
    restart_as(&mut cluster, follower, &builds, false);
    caught_up(&cluster, follower).await;
    let refused = client.finalize_upgrade(0).await.expect_err("finalizing with a replica of the previous release");
    assert!(
        refused.to_string().contains(&format!("replica {follower}"))
            && refused.to_string().contains("before feature levels"),
        "{refused}"
    );
    a_job_runs_to_completion(&client, "replicas of both builds, agents of the previous").await;
    leader_restarts += roll_replicas(&mut cluster, &builds, false).await;
    a_job_runs_to_completion(&client, "rolled back to the previous release").await;

    // Forward again, and finalize.
    leader_restarts += roll_replicas(&mut cluster, &builds, true).await;
    roll_agents(&mut cluster, &builds, true).await;
    let (ok, said) = drover(&cluster, &["cluster", "upgrade", "finalize"]);
    assert!(ok, "{said}");
    assert!(said.contains("feature level 2 finalized"), "{said}");
    let (ok, said) = drover(&cluster, &["cluster", "version"]);
    assert!(ok && said.contains("active feature level: 2"), "{said}");
    a_job_runs_to_completion(&client, "finalized").await;

    // Past the point of no return: a replica of the previous release no longer starts on this cluster's data.
    let (current_leader, _) = leader(&cluster).await;
    let follower = controllers(&cluster).into_iter().find(|id| *id != current_leader).unwrap();
    restart_as(&mut cluster, follower, &builds, false);
    let pid = cluster.process(follower).unwrap().pid.unwrap();
    let started = Instant::now();
    // SAFETY: kill(2) with signal 0 only probes the pid.
    while unsafe { libc::kill(pid as i32, 0) } == 0 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(&cluster.process(follower).unwrap().log_file).unwrap_or_default();
    // SAFETY: as above.
    let running = unsafe { libc::kill(pid as i32, 0) } == 0;
    assert!(
        !running,
        "a replica of the previous release kept running on finalized data; its log ends:\n{}",
        tail(&log)
    );
    // It cannot read the meta record, which carries the level from finalizing on.
    let refusal = log.lines().skip_while(|l| !l.contains("failed to start")).take(4).collect::<Vec<_>>().join("\n");
    assert!(refusal.contains("cannot open the state machine"), "{}", tail(&log));
    restart_as(&mut cluster, follower, &builds, true);
    caught_up(&cluster, follower).await;

    // Nothing acknowledged was lost, the long jobs never restarted, and leadership moved only with restarts.
    let acked = load.stop().await;
    let ids: Vec<u64> = acked.iter().map(|(id, _)| *id).collect();
    assert!(ids.len() >= 50, "{} submissions acknowledged", ids.len());
    let (found, truncated) = client
        .list_jobs(&JobFilter { ids: ids.clone(), include_finished: true, ..Default::default() })
        .await
        .expect("list the acknowledged jobs");
    assert!(!truncated);
    let found: HashSet<u64> = found.iter().map(|j| j.id).collect();
    let lost: Vec<u64> = ids.iter().copied().filter(|id| !found.contains(id)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged jobs lost: {lost:?}", lost.len(), ids.len());
    for id in &long_jobs {
        let (job, _) = client.get_job(*id, false, false).await.unwrap();
        assert_eq!(job.state, JobState::Running, "long job {id}");
        assert_eq!(job.incarnation, 0, "long job {id} was restarted");
    }
    assert_eq!(start_times(&client, &long_jobs).await, starts, "a long job started again");
    let (_, last_term) = leader(&cluster).await;
    eprintln!(
        "drill: {} submissions acknowledged, none lost; terms {first_term} -> {last_term} over {leader_restarts} leader \
         restarts; the previous release on finalized data said:\n{refusal}",
        ids.len(),
    );
    // One election per leader restart, and a second when two candidates collide; anything above is a storm.
    assert!(
        last_term - first_term <= 2 * leader_restarts + 1,
        "terms went from {first_term} to {last_term} over {leader_restarts} leader restarts"
    );
    cluster.down().unwrap();
}

async fn futures_all_running(client: &Client, ids: &[u64]) -> bool {
    for id in ids {
        match client.get_job(*id, false, false).await {
            Ok((job, _)) if job.state == JobState::Running => {}
            _ => return false,
        }
    }
    true
}

async fn start_times(client: &Client, ids: &[u64]) -> Vec<Option<u64>> {
    let mut starts = Vec::new();
    for id in ids {
        starts.push(client.get_job(*id, false, false).await.unwrap().0.start_time_ms);
    }
    starts
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
