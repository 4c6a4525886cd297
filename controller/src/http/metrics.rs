//! `/metrics`: Raft progress, the queue, nodes and GPUs, agents, scheduling passes and checkpoints, as this
//! replica sees them. Gauges are read at scrape time from Raft's metrics and the applied state; only what exists
//! as it happens (heartbeats, passes, leader changes) is counted as it happens.

use std::collections::BTreeMap;

use drover_observe::metrics::{Exposition, labels};
use drover_state::{JobState, NodeHealth};
use openraft::async_runtime::WatchReceiver;

use crate::api::Api;

pub fn exposition(api: &Api, leader_changes: u64) -> Exposition {
    let mut out = Exposition::default();
    raft(&mut out, api, leader_changes);
    state(&mut out, api);
    out.gauge("agent_sessions", "Agents with an open session to this replica (only the leader holds any).", {
        api.leader.session_count() as f64
    });
    out.counter("agent_heartbeats", "Agent heartbeats this replica received while it led.", api.leader.heartbeats());
    out.histogram(
        "scheduler_pass_seconds",
        "Wall time of each scheduling pass on this replica while it led (plan and its translation to commands).",
        api.leader.pass_seconds(),
    );
    out.histogram(
        "scheduler_shallow_pass_seconds",
        "Wall time of each shallow pass (the best-ranked pending jobs only, between deep passes over a long queue).",
        api.leader.shallow_pass_seconds(),
    );
    out
}

fn raft(out: &mut Exposition, api: &Api, leader_changes: u64) {
    let m = api.raft.metrics().borrow_watched().clone();
    let index = |l: &Option<crate::types::LogId>| l.as_ref().map_or(0, |l| l.index()) as f64;
    let last_log = m.last_log_index.unwrap_or(0) as f64;
    let applied = index(&m.last_applied);
    let leading = m.current_leader == Some(api.id);
    out.gauge("raft_term", "The current Raft term.", m.current_term as f64);
    out.gauge("raft_is_leader", "1 on the leader, 0 elsewhere.", f64::from(u8::from(leading)));
    out.gauge("raft_leader_id", "The leader this replica knows (0: none).", m.current_leader.unwrap_or(0) as f64);
    out.gauge("raft_last_log_index", "Index of the last entry in this replica's log.", last_log);
    out.gauge(
        "raft_committed_index",
        "Index of the last entry this replica knows to be committed.",
        index(&m.local_committed),
    );
    out.gauge("raft_applied_index", "Index of the last entry applied to this replica's state.", applied);
    out.gauge(
        "raft_apply_lag_entries",
        "Entries in this replica's log not yet applied.",
        (last_log - applied).max(0.0),
    );
    out.gauge("raft_snapshot_index", "Index the latest snapshot covers.", index(&m.snapshot));
    out.gauge("raft_voters", "Voting members in the current membership.", {
        m.membership_config.membership().voter_ids().count() as f64
    });
    out.counter("raft_leader_changes", "Leaders this replica saw take over since it started.", leader_changes);
    // Only the leader knows how far each follower got.
    let lag: BTreeMap<u64, f64> = match (&m.replication, leading) {
        (Some(replication), true) => replication
            .iter()
            .filter(|(id, _)| **id != api.id)
            .map(|(id, matched)| (*id, (last_log - index(matched)).max(0.0)))
            .collect(),
        _ => BTreeMap::new(),
    };
    out.labelled(
        "raft_replication_lag_entries",
        "On the leader: entries each follower has yet to acknowledge.",
        lag.into_iter().map(|(id, lag)| (labels([("follower", &id.to_string())]), lag)),
    );
    if let (true, Some(acked)) = (leading, m.last_quorum_acked.as_ref()) {
        out.gauge("raft_quorum_ack_age_seconds", "On the leader: time since a quorum last acknowledged it.", {
            openraft::Instant::elapsed(&**acked).as_secs_f64()
        });
    }
}

fn state(out: &mut Exposition, api: &Api) {
    let now_ms = crate::runtime::now_ms();
    let mut by_state: BTreeMap<&str, f64> = BTreeMap::new();
    let mut pending_by_reason: BTreeMap<&str, f64> = BTreeMap::new();
    let (mut restarts, mut without_checkpoint, mut oldest_checkpoint_s) = (0u64, 0u64, 0.0f64);
    // Hang detection: running jobs held to a progress timeout, and the least time left before one is called hung.
    let (mut watched, mut least_margin_s) = (0u64, f64::INFINITY);
    // A chunk of jobs per hold of the state lock: a scrape must not hold off `apply` for a walk over every job.
    api.view.for_each_job(|job| {
        *by_state.entry(job.state.name()).or_default() += 1.0;
        if job.state == JobState::Pending {
            *pending_by_reason.entry(job.reason.name()).or_default() += 1.0;
        }
        restarts += u64::from(job.restart_count);
        if let Some(hung_at_ms) = job.hung_at_ms() {
            watched += 1;
            least_margin_s = least_margin_s.min(hung_at_ms.saturating_sub(now_ms) as f64 / 1_000.0);
        }
        if job.state == JobState::Running {
            match &job.checkpoint {
                Some(checkpoint) => {
                    let age_s = now_ms.saturating_sub(checkpoint.time_ms) as f64 / 1_000.0;
                    oldest_checkpoint_s = oldest_checkpoint_s.max(age_s);
                }
                None => without_checkpoint += 1,
            }
        }
    });
    let applied = api.view.read();
    let state = &applied.state;
    out.labelled(
        "jobs",
        "Jobs in the controller's memory by state (finished jobs move to the accounting history).",
        by_state.into_iter().map(|(s, n)| (labels([("state", s)]), n)),
    );
    out.labelled(
        "pending_jobs",
        "Pending jobs by reason, as squeue shows it.",
        pending_by_reason.into_iter().map(|(r, n)| (labels([("reason", r)]), n)),
    );
    out.counter(
        "jobs_submitted",
        "Job ids handed out since the cluster began.",
        state.meta.next_job_id.saturating_sub(1),
    );
    out.gauge("job_restarts", "Restarts (requeues) of the jobs still pending or running, summed.", restarts as f64);
    out.gauge(
        "checkpoint_age_max_seconds",
        "Among running jobs with a checkpoint: time since the oldest latest checkpoint (work a failure would lose).",
        oldest_checkpoint_s,
    );
    out.gauge("running_jobs_without_checkpoint", "Running jobs that have recorded no checkpoint.", {
        without_checkpoint as f64
    });
    out.gauge("running_jobs_with_progress_timeout", "Running jobs held to a progress timeout.", watched as f64);
    out.gauge(
        "progress_margin_min_seconds",
        "Among running jobs with a progress timeout: the least time left before one is called hung (0: none).",
        if least_margin_s.is_finite() { least_margin_s } else { 0.0 },
    );

    // Goodput: sums kept by `apply` as incarnations end (since `goodput_since`), so no history scan.
    let g = state.goodput_totals();
    let hours = |gpu_ms: u64| gpu_ms as f64 / 3_600_000.0;
    out.counter("goodput_ended_incarnations", "Job incarnations ended since goodput counting began.", {
        g.ended_incarnations
    });
    out.counter("goodput_failed_incarnations", "Incarnations ended by a node failure (NODE_FAIL).", {
        g.failed_incarnations
    });
    out.counter("goodput_preempted_incarnations", "Incarnations ended by preemption.", g.preempted_incarnations);
    out.gauge("goodput_allocated_gpu_hours", "GPU-hours held by ended incarnations.", hours(g.allocated_gpu_ms));
    out.labelled(
        "goodput_lost_gpu_hours",
        "GPU-hours of work lost since each incarnation's last checkpoint, by cause.",
        [("failure", g.lost_to_failures_gpu_ms), ("preemption", g.lost_to_preemption_gpu_ms)]
            .into_iter()
            .map(|(cause, ms)| (labels([("cause", cause)]), hours(ms))),
    );
    out.gauge(
        "goodput_down_after_failures_seconds",
        "Wall time jobs waited between a failed incarnation and their next start.",
        g.down_after_failures_ms as f64 / 1_000.0,
    );
    // NaN until an incarnation has ended: no GPU time yet, so no ratio (the series exists for dashboards).
    out.gauge(
        "goodput_ratio",
        "Effective training time ratio: (allocated - lost) / allocated GPU time; NaN before any incarnation ended.",
        g.effective_ratio().unwrap_or(f64::NAN),
    );

    let mut nodes_by_state: BTreeMap<&str, f64> = BTreeMap::new();
    let (mut total, mut allocated, mut unavailable) = (0usize, 0usize, 0usize);
    for node in state.nodes.values() {
        *nodes_by_state.entry(node.state_name()).or_default() += 1.0;
        total += node.info.gpus.len();
        allocated += node.allocated_gpus.len();
        if node.health == NodeHealth::Down || node.drain {
            unavailable += node.info.gpus.len() - node.allocated_gpus.len().min(node.info.gpus.len());
        }
    }
    out.labelled(
        "nodes",
        "Nodes by Slurm state word (IDLE, MIXED, ALLOCATED, DRAINING, DRAINED, DOWN).",
        nodes_by_state.into_iter().map(|(s, n)| (labels([("state", s)]), n)),
    );
    out.gauge("gpus", "GPUs registered by all nodes.", total as f64);
    out.gauge("gpus_allocated", "GPUs held by running jobs.", allocated as f64);
    out.gauge("gpus_unavailable", "Free GPUs on nodes that are down or drained.", unavailable as f64);
}
