//! The JSON the web page draws: what `sinfo`, `squeue`, `drover cluster status` and `scontrol show job` say,
//! without anything private. The page answers without credentials, so it carries no script, environment,
//! arguments, output paths or working directories; names, users and states are what `squeue` shows any user.

use drover_observe::http::Response;
use drover_state::{Job, JobState};
use serde_json::{Value, json};

use crate::api::Api;

/// Rows of the queue table: a dashboard of a 100k-job queue shows the first ones and says how many there are.
const MAX_QUEUE_ROWS: usize = 500;

pub async fn overview(api: &Api) -> Response {
    let replicas: Vec<Value> = api
        .replica_statuses(false)
        .await
        .into_iter()
        .map(|r| {
            json!({
                "id": r.id, "address": r.address, "role": r.role, "term": r.term,
                "leader": r.has_leader.then_some(r.leader_id), "last_log_index": r.last_log_index,
                "applied_index": r.applied_index, "voter": r.voter, "reachable": r.reachable, "error": r.error,
            })
        })
        .collect();
    // Running first, then pending, each in id order, as `squeue` sorts by default: gathered a chunk of jobs per
    // hold of the state lock, so a page view never holds off `apply` for a walk over every job.
    let (mut running, mut waiting) = (Vec::new(), Vec::new());
    let (mut running_total, mut waiting_total, mut pending_total) = (0usize, 0usize, 0usize);
    api.view.for_each_job(|job| {
        pending_total += usize::from(job.state == JobState::Pending);
        let (rows, total) = match job.state {
            JobState::Running => (&mut running, &mut running_total),
            _ if job.state.is_terminal() => return,
            _ => (&mut waiting, &mut waiting_total),
        };
        *total += 1;
        if rows.len() < MAX_QUEUE_ROWS {
            rows.push(queue_row(job));
        }
    });
    let queue: Vec<Value> = running.into_iter().chain(waiting).take(MAX_QUEUE_ROWS).collect();
    let applied = api.view.read();
    let state = &applied.state;
    let nodes: Vec<Value> = state
        .nodes
        .values()
        .map(|n| {
            json!({
                "name": n.info.name, "state": n.state_name(), "reason": n.reason,
                "site": n.info.topology.get("site"), "gpu_model": n.info.gpus.first().map(|g| g.name.clone()),
                "gpus": n.info.gpus.len(), "gpus_allocated": n.allocated_gpus.len(), "jobs": n.jobs,
            })
        })
        .collect();
    let gpus: usize = state.nodes.values().map(|n| n.info.gpus.len()).sum();
    let gpus_allocated: usize = state.nodes.values().map(|n| n.allocated_gpus.len()).sum();
    let body = json!({
        "cluster": state.config().map(|c| c.cluster_name.clone()),
        "answered_by": api.id,
        "applied_index": applied.last_applied.as_ref().map_or(0, |l| l.index()),
        "replicas": replicas,
        "nodes": nodes,
        "summary": {
            "pending": pending_total,
            "running": running_total,
            "gpus": gpus, "gpus_allocated": gpus_allocated,
        },
        "goodput": goodput_json(state.goodput_totals()),
        "goodput_since_ms": state.goodput_since_ms(),
        "goodput_accounts": state.account_goodput()
            .filter(|(_, g)| !g.is_zero())
            .map(|(account, g)| { let mut row = goodput_json(g); row["account"] = json!(account); row })
            .collect::<Vec<_>>(),
        "queue_total": running_total + waiting_total,
        "queue": queue,
    });
    Response::json(body.to_string())
}

fn queue_row(job: &Job) -> Value {
    json!({
        "id": job.id, "name": job.spec.name, "user": job.spec.user, "account": job.account,
        "partition": job.partition, "state": job.state.name(), "reason": job.reason.name(),
        "gpus": gpus(job), "nodes": job.nodes, "restarts": job.restart_count,
        "submit_ms": job.submit_time_ms, "start_ms": job.start_time_ms,
    })
}

/// One job's timeline: submitted, each ended incarnation (where, how long, how it ended, what it resumed from),
/// the current one, and its latest checkpoint. Finished jobs come from the accounting history.
pub fn job(api: &Api, id: u64) -> Response {
    let job = match api.view.job(id) {
        Ok(Some(job)) => job,
        Ok(None) => return Response::error(404, format!("no job {id} (never submitted, or purged from history)")),
        Err(e) => return Response::error(500, format!("reading job {id}: {e}")),
    };
    let incarnations: Vec<Value> = job
        .history
        .iter()
        .map(|h| {
            json!({
                "incarnation": h.incarnation, "start_ms": h.start_ms, "end_ms": h.end_ms, "nodes": h.nodes,
                "state": h.state.name(), "reason": h.reason, "resumed": h.resumed_from.is_some(),
                "gpus": h.gpus, "last_checkpoint_ms": h.last_checkpoint_ms,
            })
        })
        .collect();
    let body = json!({
        "id": job.id, "name": job.spec.name, "user": job.spec.user, "account": job.account,
        "partition": job.partition, "qos": job.qos, "state": job.state.name(), "reason": job.reason.name(),
        "gpus": gpus(&job), "nodes": job.nodes, "restarts": job.restart_count,
        "incarnation": job.incarnation, "submit_ms": job.submit_time_ms, "start_ms": job.start_time_ms,
        "end_ms": job.end_time_ms, "exit_code": job.exit_code, "time_limit_s": job.time_limit_s,
        // No path: the page is unauthenticated, and a checkpoint's path names the user's directories.
        "checkpoint": job.checkpoint.as_ref().map(|c| json!({
            "step": c.step, "incarnation": c.incarnation, "time_ms": c.time_ms,
        })),
        // The current incarnation's last progress (hang detection), and the timeout it is held to.
        "progress": job.progress().map(|p| json!({ "step": p.step, "time_ms": p.time_ms })),
        "progress_timeout_s": job.progress_timeout_s(),
        "history": incarnations,
        "goodput": goodput_json(&drover_state::goodput::of_job(&job, crate::runtime::now_ms())),
        "answered_by": api.id,
    });
    Response::json(body.to_string())
}

/// GPU-hours allocated and lost, and the effective training time ratio (`sreport cluster goodput`'s columns).
fn goodput_json(g: &drover_state::GoodputTotals) -> Value {
    let hours = |gpu_ms: u64| gpu_ms as f64 / 3_600_000.0;
    json!({
        "allocated_gpu_hours": hours(g.allocated_gpu_ms),
        "lost_to_failures_gpu_hours": hours(g.lost_to_failures_gpu_ms),
        "lost_to_preemption_gpu_hours": hours(g.lost_to_preemption_gpu_ms),
        "failed_incarnations": g.failed_incarnations,
        "preempted_incarnations": g.preempted_incarnations,
        "down_after_failures_s": g.down_after_failures_ms as f64 / 1_000.0,
        "ratio": g.effective_ratio(),
    })
}

/// GPUs held, or asked for while none are held.
fn gpus(job: &Job) -> usize {
    if job.allocation.is_empty() { job.spec.total_gpus() as usize } else { job.allocated_gpus() }
}
