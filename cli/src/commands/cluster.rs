//! `drover cluster status|add-replica|remove-replica|backup|verify-backup|version|upgrade finalize`.

use drover_client::Client;

pub async fn status(client: &Client, json: bool) -> anyhow::Result<()> {
    let status = client.cluster_status().await?;
    if json {
        let replicas: Vec<serde_json::Value> = status
            .replicas
            .iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id, "address": r.address, "role": r.role, "term": r.term,
                    "leader": if r.has_leader { Some(r.leader_id) } else { None },
                    "last_log_index": r.last_log_index, "applied_index": r.applied_index,
                    "voter": r.voter, "reachable": r.reachable, "error": r.error,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "answered_by": status.answered_by,
            "replicas": replicas,
            "jobs": { "pending": status.pending_jobs, "running": status.running_jobs, "next_job_id": status.next_job_id },
            "nodes": { "total": status.nodes_total },
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "{:<4} {:<22} {:<12} {:>6} {:>7} {:>10} {:>10}",
        "ID", "ADDRESS", "ROLE", "TERM", "LEADER", "LAST_LOG", "APPLIED"
    );
    for r in &status.replicas {
        let leader = if r.has_leader { r.leader_id.to_string() } else { "-".into() };
        println!(
            "{:<4} {:<22} {:<12} {:>6} {:>7} {:>10} {:>10}{}",
            r.id,
            r.address,
            r.role,
            r.term,
            leader,
            r.last_log_index,
            r.applied_index,
            if r.error.is_empty() { String::new() } else { format!("  ({})", r.error) }
        );
    }
    println!(
        "jobs: {} pending, {} running; next job id {}; nodes: {}",
        status.pending_jobs, status.running_jobs, status.next_job_id, status.nodes_total
    );
    Ok(())
}

pub async fn add_replica(client: &Client, id: u64, address: &str) -> anyhow::Result<()> {
    let m = client.add_replica(id, address).await?;
    println!("replica {id} at {address} added; voters {:?}, learners {:?}", m.voters, m.learners);
    Ok(())
}

pub async fn remove_replica(client: &Client, id: u64) -> anyhow::Result<()> {
    let m = client.remove_replica(id).await?;
    println!("replica {id} removed; voters {:?}, learners {:?}", m.voters, m.learners);
    Ok(())
}

/// `drover cluster backup FILE`: the leader's state into `FILE.partial`, synced, checked from disk, then renamed to
/// `FILE`; a failed or damaged backup never takes the name of a good one.
pub async fn backup(client: &Client, file: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let started = std::time::Instant::now();
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let written = async {
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?,
        );
        client.backup(&mut out).await?;
        let out = out.into_inner().map_err(|e| e.into_error())?;
        out.sync_all().with_context(|| format!("cannot sync {}", partial.display()))?;
        drover_proto::backup::verify_backup(&partial).map_err(anyhow::Error::from)
    }
    .await;
    let verified = match written {
        Ok(verified) => verified,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e.context("backup failed; no backup file was written"));
        }
    };
    std::fs::rename(&partial, file)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), file.display()))?;
    let h = &verified.header;
    println!(
        "backup of the state at log index {} (term {}, taken by replica {}, format {}) written to {}: {} bytes, sha256 {}, in {:.2} s",
        h.last_log_index,
        h.last_log_term,
        h.taken_by,
        h.state_format_version,
        file.display(),
        verified.file_bytes,
        verified.sha256,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `drover cluster verify-backup FILE`: checks a backup's checksum and says what it holds.
pub fn verify_backup(file: &std::path::Path) -> anyhow::Result<()> {
    let verified = drover_proto::backup::verify_backup(file)?;
    let h = &verified.header;
    println!(
        "{}: a good backup of the state at log index {} (term {}), taken by replica {} of {:?} (version {}, state format {}); {} bytes, sha256 {}",
        file.display(),
        h.last_log_index,
        h.last_log_term,
        h.taken_by,
        h.replicas.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        h.binary_version,
        h.state_format_version,
        verified.file_bytes,
        verified.sha256
    );
    Ok(())
}

/// What a replica or agent that gave no version is: a build from before feature levels.
const BEFORE_LEVELS: &str = "(before 0.2.0)";

/// `drover cluster version`.
pub async fn version(client: &Client, json: bool) -> anyhow::Result<()> {
    let report = client.cluster_version().await.map_err(before_levels)?;
    print_version(&report, json)
}

/// `drover cluster upgrade finalize [--level N]`.
pub async fn finalize(client: &Client, level: u32) -> anyhow::Result<()> {
    let before = client.cluster_version().await.map_err(before_levels)?.active_feature_level;
    let report = client.finalize_upgrade(level).await.map_err(before_levels)?;
    if report.active_feature_level == before {
        println!("the cluster is already at feature level {before}; nothing to finalize");
    } else {
        println!(
            "feature level {} finalized (was {before}); replicas can no longer be rolled back to a build below it",
            report.active_feature_level
        );
    }
    Ok(())
}

/// A leader from before feature levels does not know the call: say so instead of "unimplemented".
fn before_levels(e: drover_client::ClientError) -> anyhow::Error {
    if let drover_client::ClientError::Unimplemented(_) = e {
        return anyhow::anyhow!(
            "the leader runs a build from before feature levels (0.1), which neither reports versions nor finalizes \
             upgrades: upgrade the replicas first ({e})"
        );
    }
    e.into()
}

fn print_version(report: &drover_proto::v1::ClusterVersionReply, json: bool) -> anyhow::Result<()> {
    let build = |v: &Option<drover_proto::v1::SoftwareVersion>| match v {
        Some(v) => (v.binary_version.clone(), drover_state::feature::effective(v.feature_level)),
        None => (BEFORE_LEVELS.to_string(), drover_state::feature::BASE_LEVEL),
    };
    if json {
        let replicas: Vec<serde_json::Value> = report
            .replicas
            .iter()
            .map(|r| {
                let (version, level) = build(&r.version);
                serde_json::json!({
                    "id": r.id, "address": r.address, "voter": r.voter, "reachable": r.reachable,
                    "version": if r.reachable { Some(version) } else { None },
                    "feature_level": if r.reachable { Some(level) } else { None },
                    "error": r.error,
                })
            })
            .collect();
        let agents: Vec<serde_json::Value> = report
            .agents
            .iter()
            .map(|a| {
                let (version, level) = build(&a.version);
                serde_json::json!({ "node": a.node, "version": version, "feature_level": level })
            })
            .collect();
        let doc = serde_json::json!({
            "active_feature_level": report.active_feature_level,
            "finalizable_level": report.finalizable_level,
            "leader": report.leader_id,
            "replicas": replicas,
            "agents": agents,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("active feature level: {}", report.active_feature_level);
    match report.finalizable_level {
        0 => println!("finalizable: no (a replica did not answer)"),
        level if level > report.active_feature_level => {
            println!("finalizable: level {level} (drover cluster upgrade finalize; irreversible)")
        }
        _ => println!("finalizable: nothing above the active level"),
    }
    println!();
    println!("{:<10} {:<22} {:<7} {:<16} {:>6}", "REPLICA", "ADDRESS", "VOTER", "VERSION", "LEVEL");
    for r in &report.replicas {
        let (version, level) = build(&r.version);
        let (version, level) = if r.reachable { (version, level.to_string()) } else { ("?".into(), "?".into()) };
        let leader = if r.id == report.leader_id { " (leader)" } else { "" };
        println!(
            "{:<10} {:<22} {:<7} {:<16} {:>6}{}{}",
            r.id,
            r.address,
            if r.voter { "yes" } else { "no" },
            version,
            level,
            leader,
            if r.error.is_empty() { String::new() } else { format!("  ({})", r.error) }
        );
    }
    if !report.agents.is_empty() {
        println!();
        println!("{:<16} {:<16} {:>6}", "AGENT", "VERSION", "LEVEL");
        for a in &report.agents {
            let (version, level) = build(&a.version);
            println!("{:<16} {:<16} {:>6}", a.node, version, level);
        }
    }
    println!();
    for level in &report.levels {
        println!("level {} ({}): {}", level.level, level.name, level.summary);
    }
    Ok(())
}
