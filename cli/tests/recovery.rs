//! Stories about what is not a minority failure: backups taken under load and restored into a new cluster, a
//! damaged backup refused, and a cluster rebuilt from the one replica left after a majority is lost for good.
//! Real `drover-controller` processes on loopback.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_cli::local::{LocalCluster, UpOptions, trivial_spec};
use drover_client::{Client, JobFilter};
use drover_state::{Job, JobState};

mod common;
use common::load::Load;

fn cluster(dir: &std::path::Path, options: UpOptions) -> LocalCluster {
    LocalCluster::up(dir, options).expect("local cluster starts")
}

async fn all_jobs(client: &Client) -> HashMap<u64, Job> {
    let (jobs, truncated) =
        client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await.expect("list jobs");
    assert!(!truncated);
    jobs.into_iter().map(|j| (j.id, j)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_submissions_restores_every_acknowledged_job_into_a_new_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Snapshots every 200 entries: the backup must not depend on whether the log was purged.
    let options = UpOptions { snapshot_after_entries: 200, keep_entries_after_snapshot: 20, ..UpOptions::default() };
    let mut old = cluster(&dir.path().join("old"), options);
    old.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = Arc::new(old.client().unwrap());
    // State beside the jobs: an account, a QOS, a cancelled and a held job (accounting rows for the first).
    let account = drover_state::AccountUpdate { name: "physics".into(), shares: Some(3), ..Default::default() };
    client.admin(&drover_state::AdminOp::AddAccount(account)).await.unwrap();
    let qos = drover_state::Qos { name: "small".into(), max_jobs_per_user: Some(1), ..Default::default() };
    client.admin(&drover_state::AdminOp::PutQos { qos, create: true }).await.unwrap();
    let cancelled = client.submit(&trivial_spec()).await.unwrap();
    client.cancel(&[cancelled]).await.unwrap();
    let held = client.submit(&trivial_spec()).await.unwrap();
    client.hold(&[held]).await.unwrap();

    let load = Load::start(client.clone(), 8);
    load.wait_for(300).await;
    let backup = dir.path().join("cluster.backup");
    let backup_started = Instant::now();
    let drover = drover_cli::local::find_binary("drover").unwrap();
    let config = old.dir.join("client.toml");
    let output = std::process::Command::new(&drover)
        .args(["--controllers", &old.addresses(), "cluster", "backup"])
        .arg(&backup)
        .env("DROVER_CONFIG", &config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "drover cluster backup failed: {said}");
    assert!(said.contains("sha256"), "the backup names its checksum: {said}");
    // Submissions went on while the backup was taken.
    let during = load.count();
    load.wait_for(during + 100).await;
    let acked = load.stop().await;
    let before_backup: Vec<u64> = acked.iter().filter(|(_, t)| *t < backup_started).map(|(id, _)| *id).collect();
    assert!(acked.iter().any(|(_, t)| *t > backup_started), "submissions continued during the backup");
    let old_jobs = all_jobs(&client).await;
    let old_registry = client.registry(false).await.unwrap();
    old.down().unwrap();

    let options = UpOptions { restore: Some(backup.clone()), ..UpOptions::default() };
    let new = cluster(&dir.path().join("new"), options);
    new.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = new.client().unwrap();
    let new_jobs = all_jobs(&client).await;
    let lost: Vec<u64> = before_backup.iter().copied().filter(|id| !new_jobs.contains_key(id)).collect();
    assert!(lost.is_empty(), "jobs acknowledged before the backup began are missing: {lost:?}");
    for (id, job) in &new_jobs {
        let was = old_jobs.get(id).expect("a restored job existed in the old cluster");
        assert_eq!((job.state, job.held, &job.spec.name), (was.state, was.held, &was.spec.name), "job {id}");
    }
    assert_eq!(new_jobs[&cancelled].state, JobState::Cancelled, "the accounting record of a finished job");
    assert!(new_jobs[&held].held);
    let registry = client.registry(false).await.unwrap();
    assert_eq!(registry.accounts, old_registry.accounts);
    assert_eq!(registry.qos, old_registry.qos);
    // The new cluster goes on from the backup: new ids after the restored ones, never reused.
    let next = client.submit(&trivial_spec()).await.unwrap();
    assert!(new_jobs.keys().all(|id| *id < next), "job {next} reuses an id");
    let (_, script) = client.get_job(before_backup[0], true, false).await.unwrap();
    assert!(script.starts_with("#!/bin/sh"), "the stored script survives: {script:?}");
    eprintln!(
        "restored {} of {} acknowledged jobs ({} acknowledged before the backup began; {} after it, not in it)",
        new_jobs.len(),
        acked.len(),
        before_backup.len(),
        acked.len() - before_backup.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_with_a_flipped_byte_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut old = cluster(&dir.path().join("old"), UpOptions::default());
    old.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = old.client().unwrap();
    for _ in 0..20 {
        client.submit(&trivial_spec()).await.unwrap();
    }
    let backup = dir.path().join("b");
    let mut file = std::fs::File::create(&backup).unwrap();
    client.backup(&mut file).await.unwrap();
    drop(file);
    old.down().unwrap();
    let mut bytes = std::fs::read(&backup).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&backup, &bytes).unwrap();

    let drover = drover_cli::local::find_binary("drover").unwrap();
    let output = std::process::Command::new(&drover).args(["cluster", "verify-backup"]).arg(&backup).output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(said.contains("is damaged") && said.contains("checksum"), "{said}");

    let options = UpOptions { restore: Some(backup.clone()), ..UpOptions::default() };
    let refused = LocalCluster::up(&dir.path().join("new"), options).err().expect("a damaged backup is refused");
    let said = refused.to_string();
    assert!(said.contains("is damaged") && said.contains("checksum"), "{said}");
    // Nothing was restored: the data directory holds no state.
    let data = dir.path().join("new").join("controller-1").join("data");
    let restored = std::fs::read_dir(data.join("snapshots")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(restored, 0, "a refused restore left a snapshot behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_survivor_of_a_lost_quorum_starts_a_new_cluster_that_keeps_everything_it_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut old = cluster(&dir.path().join("c"), UpOptions::default());
    let leader = old.wait_ready(Duration::from_secs(30)).await.unwrap();
    let client = Arc::new(old.client().unwrap().with_deadline(Duration::from_secs(3)));
    let load = Load::start(client.clone(), 8);
    load.wait_for(300).await;
    // A site fire: both followers gone for good, mid-stream. The leader can no longer commit.
    let lost: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    for id in &lost {
        old.kill(*id).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let acked = load.stop().await;
    old.kill(leader).unwrap();
    for id in &lost {
        old.wipe(*id).unwrap();
    }

    let said = old.force_new_cluster(leader).unwrap();
    assert!(said.contains("is now the only member"), "{said}");
    let started = Instant::now();
    old.start(leader).unwrap();
    let solo = old.client_at(&old.process(leader).unwrap().address).unwrap();
    let accepted = loop {
        if let Ok(id) = solo.submit(&trivial_spec()).await {
            break id;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the forced cluster never accepted a submission");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let to_accepting = started.elapsed();
    let jobs = all_jobs(&solo).await;
    let missing: Vec<u64> = acked.iter().map(|(id, _)| *id).filter(|id| !jobs.contains_key(id)).collect();
    assert!(missing.is_empty(), "acknowledged jobs lost by the forced new cluster: {missing:?}");
    let acked_ids: HashSet<u64> = acked.iter().map(|(id, _)| *id).collect();
    let extra = jobs.keys().filter(|id| !acked_ids.contains(id) && **id != accepted).count();
    eprintln!(
        "forced new cluster from replica {leader}: {} acknowledged, 0 lost, {extra} unacknowledged kept (proposed after the quorum was lost, committed by the new cluster); accepting submissions {} ms after start",
        acked.len(),
        to_accepting.as_millis()
    );

    // The runbook's next step: replicas come back empty and are added one by one.
    for id in &lost {
        old.start(*id).unwrap();
        let address = old.process(*id).unwrap().address.clone();
        solo.add_replica(*id, &address).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = solo.cluster_status().await.unwrap();
        if status.replicas.iter().filter(|r| r.voter && r.reachable).count() == 3 {
            break;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = lost
                .iter()
                .map(|id| std::fs::read_to_string(&old.process(*id).unwrap().log_file).unwrap_or_default())
                .collect();
            panic!("the replicas added back are not all voting: {status:?}\n{}", logs.join("\n----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back = old.client_at(&old.process(lost[0]).unwrap().address).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let caught_up = back.list_jobs(&JobFilter { stale: true, ..Default::default() }).await.map(|(j, _)| j.len());
        if caught_up.is_ok_and(|n| n >= jobs.len()) {
            break;
        }
        assert!(Instant::now() < deadline, "a re-added replica did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
