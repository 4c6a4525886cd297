//! Hang detection, while this replica leads: a running job with a progress timeout that reported nothing (no
//! `drover progress`, no checkpoint, no progress marker) for that long is declared hung (`JobHung`), which requeues
//! it from its last good checkpoint. The decision is re-checked on apply against the log's time, so a report that
//! commits first wins, and a new leader repeating an old one's decision changes nothing.

use std::collections::HashSet;

use drover_state::{Command, JobId, State};

use crate::propose::{Proposer, propose_checked};
use crate::store::StateView;

/// The most hang decisions proposed per check: a whole rack's jobs hanging at once are declared over a few checks.
const MAX_HUNG_PER_CHECK: usize = 64;

/// Progress reports closer together than this are answered without a log entry (the deadline moves by at most
/// this much less): a tenth of the job's timeout, between 1 s and 60 s; 60 s for a job without one.
pub fn min_progress_interval_ms(timeout_s: Option<u64>) -> u64 {
    match timeout_s {
        Some(timeout_s) => (timeout_s.saturating_mul(1_000) / 10).clamp(1_000, 60_000),
        None => 60_000,
    }
}

/// Whether a progress report is worth a log entry: the job's recorded progress is older than the minimum interval.
/// A report `apply` would refuse (unknown job, another incarnation) is written, so its sender hears why.
pub fn progress_worth_writing(state: &State, job_id: JobId, incarnation: u64, now_ms: u64) -> bool {
    let Some(job) = state.jobs.get(&job_id) else { return true };
    if job.incarnation != incarnation {
        return true;
    }
    match job.progress() {
        Some(progress) => now_ms.saturating_sub(progress.time_ms) >= min_progress_interval_ms(job.progress_timeout_s()),
        None => true,
    }
}

/// The running jobs whose progress deadline has passed at `now_ms` (walked through the nodes: only jobs holding a
/// node can be running, so a million pending jobs cost nothing here).
pub fn overdue(state: &State, now_ms: u64) -> Vec<(JobId, u64)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for node in state.nodes.values() {
        for id in &node.jobs {
            if !seen.insert(*id) {
                continue;
            }
            if let Some(job) = state.jobs.get(id)
                && job.hung_at_ms().is_some_and(|at| now_ms >= at)
            {
                out.push((*id, job.incarnation));
                if out.len() >= MAX_HUNG_PER_CHECK {
                    return out;
                }
            }
        }
    }
    out
}

/// Proposes `JobHung` for every overdue job.
pub async fn declare_hung_jobs(proposer: &Proposer, view: &StateView) {
    let hung = overdue(&view.read().state, crate::runtime::now_ms());
    let decisions = hung.into_iter().map(|(job_id, incarnation)| async move {
        tracing::warn!(
            job = job_id,
            incarnation,
            "no progress within the job's progress timeout: requeueing it as hung"
        );
        match propose_checked(proposer, Command::JobHung { job_id, incarnation }).await {
            Ok(Ok(_)) => {}
            Ok(Err(refused)) => tracing::info!(job = job_id, "hang decision refused: {refused}"),
            Err(e) => tracing::warn!(job = job_id, "declaring the job hung failed: {}", e.message()),
        }
    });
    futures::future::join_all(decisions).await;
}
