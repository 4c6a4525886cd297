//! Stories about the replicated controller, told with real `drover-controller` processes on loopback.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_cli::local::{LocalCluster, UpOptions, trivial_spec};
use drover_client::{Client, JobFilter};
use drover_state::JobState;

mod common;
use common::load::Load;

fn cluster(options: UpOptions) -> (tempfile::TempDir, LocalCluster) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LocalCluster::up(&dir.path().join("cluster"), options).expect("local cluster starts");
    (dir, cluster)
}

/// Every acknowledged id must be in the state exactly once, and no id may have been acknowledged twice.
async fn assert_all_present(client: &Client, acked: &[(u64, Instant)]) {
    let ids: Vec<u64> = acked.iter().map(|(id, _)| *id).collect();
    let unique: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "a job id was acknowledged twice");
    let (jobs, truncated) =
        client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await.unwrap();
    assert!(!truncated);
    let present: HashSet<u64> = jobs.iter().map(|j| j.id).collect();
    let lost: Vec<u64> = ids.iter().copied().filter(|id| !present.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged jobs lost: {lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_mid_stream_loses_no_acknowledged_submission() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    let leader = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = Arc::new(cluster.client().unwrap());
    let load = Load::start(client.clone(), 8);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed_at = Instant::now();
    cluster.kill(leader).unwrap();
    let new_leader = cluster.wait_ready(Duration::from_secs(20)).await.unwrap();
    assert_ne!(new_leader, leader);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let acked = load.stop().await;
    let after = acked.iter().filter(|(_, t)| *t > killed_at).count();
    assert!(acked.len() > 20, "too few submissions before the kill: {}", acked.len());
    assert!(after > 0, "submissions did not resume on the new leader");
    assert_all_present(&client, &acked).await;
    // The killed replica comes back and holds every job too.
    cluster.start(leader).unwrap();
    let solo = cluster.client_at(&cluster.process(leader).unwrap().address).unwrap();
    let max_id = acked.iter().map(|(id, _)| *id).max().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stale = JobFilter { stale: true, ids: vec![max_id], ..Default::default() };
        if let Ok((jobs, _)) = solo.list_jobs(&stale).await
            && !jobs.is_empty()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted replica did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_every_replica_and_starting_again_keeps_all_state() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = cluster.client().unwrap();
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.push(client.submit(&trivial_spec()).await.unwrap());
    }
    client.cancel(&ids[0..5]).await.unwrap();
    client.hold(&ids[5..8]).await.unwrap();
    // The registry and dependency verdicts are state too.
    let account = drover_state::AccountUpdate { name: "physics".into(), shares: Some(3), ..Default::default() };
    client.admin(&drover_state::AdminOp::AddAccount(account)).await.unwrap();
    let qos = drover_state::Qos { name: "small".into(), max_jobs_per_user: Some(1), ..Default::default() };
    client.admin(&drover_state::AdminOp::PutQos { qos, create: true }).await.unwrap();
    let dep = drover_state::Dependency { kind: drover_state::DependencyKind::AfterOk, job: ids[0], task: None };
    let mut waiting = trivial_spec();
    waiting.dependency = vec![dep].into();
    let waiting = client.submit(&waiting).await.unwrap();
    // Let the scheduler settle the new job's reason first, so the comparison below sees no pass in between.
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get_job(waiting, false, false).await.unwrap().0.reason
        != drover_state::PendingReason::DependencyNeverSatisfied
    {
        assert!(Instant::now() < deadline, "the dependent job never got its reason");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let registry_before = client.registry(false).await.unwrap();
    let (before, _) = client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await.unwrap();

    for id in [1, 2, 3] {
        cluster.kill(id).unwrap();
    }
    for id in [1, 2, 3] {
        cluster.start(id).unwrap();
    }
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let (after, _) = client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await.unwrap();
    assert_eq!(before, after, "state after a full restart differs");
    let registry_after = client.registry(false).await.unwrap();
    assert_eq!(registry_before.accounts, registry_after.accounts);
    assert_eq!(registry_before.qos, registry_after.qos);
    let waiting = after.iter().find(|j| j.id == waiting).unwrap();
    assert_eq!(waiting.dependency_state, vec![drover_state::DepState::Never], "afterok on a cancelled job");
    assert_eq!(after.iter().filter(|j| j.state == JobState::Cancelled).count(), 5);
    assert_eq!(after.iter().filter(|j| j.held).count(), 3);
    let next = client.submit(&trivial_spec()).await.unwrap();
    assert_eq!(next, waiting.id + 1, "job ids continue after a restart, never reused");
    let (script_job, script) = client.get_job(ids[10], true, false).await.unwrap();
    assert_eq!(script_job.id, ids[10]);
    assert!(script.starts_with("#!/bin/sh"), "the stored script survives: {script:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_replica_rejoins_and_catches_up_by_snapshot() {
    let options = UpOptions { snapshot_after_entries: 100, keep_entries_after_snapshot: 10, ..UpOptions::default() };
    let (_dir, mut cluster) = cluster(options);
    let leader = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let client = Arc::new(cluster.client().unwrap());
    cluster.kill(victim).unwrap();
    cluster.wipe(victim).unwrap();
    let account = drover_state::AccountUpdate { name: "physics".into(), ..Default::default() };
    client.admin(&drover_state::AdminOp::AddAccount(account)).await.unwrap();
    // With the victim down, the log moves far past it and is purged behind a snapshot.
    let load = Load::start(client.clone(), 8);
    // Enough entries (however long a busy machine takes) that the log is purged behind a snapshot.
    let started = Instant::now();
    while load.acked.lock().unwrap().len() < 400 && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acked = load.stop().await;
    assert!(acked.len() >= 400, "need enough entries to force a snapshot: {}", acked.len());
    cluster.start(victim).unwrap();
    let solo = cluster.client_at(&cluster.process(victim).unwrap().address).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let jobs = loop {
        if let Ok((jobs, _)) = solo.list_jobs(&JobFilter { stale: true, ..Default::default() }).await
            && jobs.len() >= acked.len()
        {
            break jobs;
        }
        assert!(Instant::now() < deadline, "the wiped replica did not catch up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let present: HashSet<u64> = jobs.iter().map(|j| j.id).collect();
    assert!(acked.iter().all(|(id, _)| present.contains(id)), "the caught-up replica misses jobs");
    let registry = solo.registry(true).await.unwrap();
    assert!(registry.accounts.iter().any(|a| a.name == "physics"), "the snapshot carries the accounts");
    let log = std::fs::read_to_string(&cluster.process(victim).unwrap().log_file).unwrap();
    assert!(log.contains("installed snapshot"), "the wiped replica installed a snapshot; log:\n{log}");
    let snapshots = std::fs::read_dir(cluster.process(victim).unwrap().data_dir.join("snapshots"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("snap-"))
        .count();
    assert_eq!(snapshots, 1, "one snapshot kept on disk, the installed one or a newer one; log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_grows_to_five_and_shrinks_to_three_under_load() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = Arc::new(cluster.client().unwrap());
    let load = Load::start(client.clone(), 4);
    let (id4, addr4) = cluster.spawn_extra().unwrap();
    let (id5, addr5) = cluster.spawn_extra().unwrap();
    let admin = cluster.client().unwrap();
    admin.add_replica(id4, &addr4).await.unwrap();
    let m = admin.add_replica(id5, &addr5).await.unwrap();
    assert_eq!(m.voters, vec![1, 2, 3, 4, 5]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Remove two founders, the leader possibly among them.
    admin.remove_replica(1).await.unwrap();
    let m = admin.remove_replica(2).await.unwrap();
    assert_eq!(m.voters, vec![3, 4, 5]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.kill(1).unwrap();
    cluster.kill(2).unwrap();
    let acked = load.stop().await;
    let survivors = [3, 4, 5].iter().map(|id| cluster.process(*id).unwrap().address.clone()).collect::<Vec<_>>();
    let client = cluster.client_at(&survivors.join(",")).unwrap();
    let id = client.submit(&trivial_spec()).await.expect("the new membership accepts writes");
    assert!(id > acked.iter().map(|(id, _)| *id).max().unwrap_or(0));
    assert_all_present(&client, &acked).await;
    let status = client.cluster_status().await.unwrap();
    let voters: Vec<u64> = status.replicas.iter().filter(|r| r.voter).map(|r| r.id).collect();
    assert_eq!(voters, vec![3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_others_accepts_no_writes() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    // Freeze two replicas: the third can reach no one, and is a minority of one.
    cluster.signal(1, libc::SIGSTOP).unwrap();
    cluster.signal(2, libc::SIGSTOP).unwrap();
    let lonely = cluster.client_at(&cluster.process(3).unwrap().address).unwrap().with_deadline(Duration::from_secs(4));
    let started = Instant::now();
    let err = lonely.submit(&trivial_spec()).await.expect_err("a minority must not commit");
    let message = err.to_string();
    assert!(
        message.contains("quorum") || message.contains("no leader") || message.contains("not the leader"),
        "unclear error: {message}"
    );
    assert!(started.elapsed() < Duration::from_secs(15), "the refusal took {:?}", started.elapsed());
    cluster.signal(1, libc::SIGCONT).unwrap();
    cluster.signal(2, libc::SIGCONT).unwrap();
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let all = cluster.client().unwrap();
    all.submit(&trivial_spec()).await.expect("writes resume once a quorum is back");
}

/// A frozen leader (SIGSTOP: its sockets stay open and the kernel still acknowledges packets, but nothing answers)
/// must not stall a client that was talking to it: the submission moves on to the other replicas, which elect a
/// new leader, and is acknowledged. Found by the leader-isolated drill: clients waited out a 5 s timeout on the dead
/// connection, then gave up without trying the others, and the cluster looked down for 14 s after a 1 s failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_leader_freezes_submits_through_the_other_replicas() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    let leader = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    // The leader first, as in a client that has followed its hint.
    let first = cluster.process(leader).unwrap().address.clone();
    let mut addresses = vec![first.clone()];
    addresses.extend(cluster.addresses().split(',').filter(|a| *a != first).map(String::from));
    let client = cluster.client_at(&addresses.join(",")).unwrap().with_deadline(Duration::from_secs(12));
    let before = client.submit(&trivial_spec()).await.expect("the connection to the leader is open");
    cluster.signal(leader, libc::SIGSTOP).unwrap();
    let during = client.submit(&trivial_spec()).await;
    cluster.signal(leader, libc::SIGCONT).unwrap();
    let during = during.expect("the other replicas acknowledge the submission");
    assert!(during > before);
    // A status probe with a short deadline answers within about it, rather than hanging on the frozen one.
    cluster.signal(leader, libc::SIGSTOP).unwrap();
    let probe =
        cluster.client_at(&cluster.process(leader).unwrap().address).unwrap().with_deadline(Duration::from_millis(300));
    let started = Instant::now();
    let answer = probe.cluster_status().await;
    let waited = started.elapsed();
    cluster.signal(leader, libc::SIGCONT).unwrap();
    assert!(answer.is_err(), "a frozen replica cannot answer");
    assert!(waited < Duration::from_secs(3), "a 300 ms deadline waited {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_reported_with_the_addresses_tried() {
    // A real cluster's credentials and certificates, aimed at addresses where nothing listens.
    let (_dir, cluster) = cluster(UpOptions { controllers: 1, ..UpOptions::default() });
    let client = cluster.client_at("127.0.0.1:1,127.0.0.1:2").unwrap().with_deadline(Duration::from_secs(2));
    let started = Instant::now();
    let err = client.submit(&trivial_spec()).await.unwrap_err().to_string();
    assert!(err.contains("127.0.0.1:1") && err.contains("127.0.0.1:2"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_names_the_leader_so_later_calls_and_later_processes_go_there_directly() {
    let (dir, cluster) = cluster(UpOptions::default());
    let leader = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let leader_address = cluster.process(leader).unwrap().address.clone();
    // A follower first in the list, as in a client configured before the leader moved.
    let mut addresses: Vec<String> =
        cluster.addresses().split(',').filter(|a| *a != leader_address).map(String::from).collect();
    addresses.push(leader_address.clone());
    let list = addresses.join(",");

    let client = cluster.client_at(&list).unwrap();
    assert_eq!(client.current_address(), addresses[0]);
    client.submit(&trivial_spec()).await.expect("the follower forwards the submission");
    assert_eq!(client.current_address(), leader_address, "the forwarded reply names the leader");

    // A separate process remembers the leader for the next one (a shell loop of sbatch on a host without a relay:
    // with one, the relay follows the leader and the command connects to nothing else).
    let runtime_dir = dir.path().join("run");
    std::fs::create_dir_all(&runtime_dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"])
        .current_dir(dir.path())
        .env("DROVER_CONTROLLERS", &list)
        .env("DROVER_CONFIG", cluster.dir.join("client.toml"))
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env(drover_client::RELAY_SOCKET_ENV, "")
        .output()
        .unwrap();
    assert!(out.status.success(), "sbatch failed: {}", String::from_utf8_lossy(&out.stderr));
    let hints: Vec<std::path::PathBuf> =
        std::fs::read_dir(runtime_dir.join("drover")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(hints.len(), 1, "{hints:?}");
    assert_eq!(std::fs::read_to_string(&hints[0]).unwrap(), leader_address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_refused_port_makes_the_survivors_campaign_at_the_lease_end() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    let leader = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = cluster.client().unwrap();
    client.submit(&trivial_spec()).await.unwrap();
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    cluster.kill(leader).unwrap();
    let next = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    assert_ne!(next, leader);
    // The survivors saw the dead leader's port refuse connections and campaigned by hand at the lease's end,
    // in id order, instead of waiting for their election timeouts.
    let log = |id: u64| std::fs::read_to_string(&cluster.process(id).unwrap().log_file).unwrap();
    for id in &survivors {
        assert!(log(*id).contains("refuses connections: campaigning"), "replica {id}:\n{}", log(*id));
    }
    let campaigned: Vec<u64> =
        survivors.iter().copied().filter(|id| log(*id).contains("campaigning for the dead leader's place")).collect();
    assert!(campaigned.contains(&next) || campaigned.is_empty(), "leader {next}, campaigned {campaigned:?}");
    client.submit(&trivial_spec()).await.expect("the new leader acknowledges");
}

/// Waits until the cluster's leader is `want` (as the replicas report it).
async fn wait_leader(cluster: &LocalCluster, want: impl Fn(u64) -> bool, timeout: Duration, what: &str) -> u64 {
    let start = Instant::now();
    loop {
        if let Ok(leader) = cluster.wait_ready(Duration::from_secs(2)).await
            && want(leader)
        {
            return leader;
        }
        assert!(start.elapsed() < timeout, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_the_preferred_replica_and_back_after_it_restarts_losing_nothing() {
    let options = UpOptions {
        extra_toml: "[raft]\npreferred_leaders = [3]\npreferred_leader_hold_ms = 1000\n".into(),
        ..UpOptions::default()
    };
    let (_dir, mut cluster) = cluster(options);
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = Arc::new(cluster.client().unwrap());
    let load = Load::start(client.clone(), 4);

    // Whoever won the first election hands over to replica 3 once it has led for the hold period.
    wait_leader(&cluster, |l| l == 3, Duration::from_secs(20), "replica 3 (preferred) leads").await;

    // Without it, another replica leads; restarted, it catches up and is handed the leadership again.
    cluster.kill(3).unwrap();
    wait_leader(&cluster, |l| l != 3, Duration::from_secs(20), "a survivor leads").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.start(3).unwrap();
    wait_leader(&cluster, |l| l == 3, Duration::from_secs(30), "the restarted replica 3 leads again").await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let acked = load.stop().await;
    assert!(acked.len() > 10, "submissions went on throughout: {}", acked.len());
    assert_all_present(&client, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_reads_go_to_the_local_replica_while_writes_stay_with_the_leader() {
    let (_dir, mut cluster) = cluster(UpOptions::default());
    let leader = cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let addresses: Vec<String> = (1..=3).map(|id| cluster.process(id).unwrap().address.clone()).collect();
    let address_of = |id: u64| addresses[id as usize - 1].clone();
    let local = (1..=3).find(|id| *id != leader).unwrap();
    let mut config = cluster.client_config().unwrap();
    config.local_controllers = vec![address_of(local)];
    let client = Client::new(&config).unwrap();

    let id = client.submit(&trivial_spec()).await.unwrap();
    assert_eq!(client.current_address(), address_of(leader), "a write follows the leader");
    let stale = JobFilter { ids: vec![id], stale: true, ..Default::default() };
    let wait = Instant::now();
    let jobs = loop {
        let (jobs, _) = client.list_jobs(&stale).await.unwrap();
        assert_eq!(client.last_answered_address(), Some(address_of(local).as_str()), "the local replica answered");
        if !jobs.is_empty() || wait.elapsed() > Duration::from_secs(5) {
            break jobs;
        }
    };
    assert_eq!(jobs.len(), 1, "the local replica has applied the submission");
    assert_eq!(client.current_address(), address_of(leader), "a stale read does not move writes off the leader");
    let linearizable = JobFilter { ids: vec![id], ..Default::default() };
    client.list_jobs(&linearizable).await.unwrap();
    assert_eq!(client.last_answered_address(), Some(address_of(leader).as_str()));

    // With the local replica frozen, a stale read falls back to the others.
    cluster.signal(local, libc::SIGSTOP).unwrap();
    let (jobs, _) = client.list_jobs(&stale).await.unwrap();
    cluster.signal(local, libc::SIGCONT).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_ne!(client.last_answered_address(), Some(address_of(local).as_str()));
}
