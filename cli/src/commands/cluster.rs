//! `drover cluster status|add-replica|remove-replica`.

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
