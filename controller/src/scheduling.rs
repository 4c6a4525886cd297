//! The leader's scheduling loop: after every applied change (and on a slow tick), plan over an immutable view of
//! the state and commit the plan as one `ApplyPlan` entry, which `apply` re-validates.

use std::time::Duration;

use drover_state::Command;
use drover_state::first_fit::first_fit;
use openraft::async_runtime::WatchReceiver;

use crate::api::commit;
use crate::store::StateView;
use crate::types::Raft;

/// Most job starts in one plan entry (bounds the entry's size and the apply's latency).
const MAX_PLAN_ALLOCATIONS: usize = 1_000;
/// Passes run at most this often; bursts of submissions and ends share a pass.
const MIN_PASS_INTERVAL_MS: u64 = 2;
/// A pass runs at least this often, even without changes.
const IDLE_PASS_INTERVAL_MS: u64 = 1_000;

pub async fn scheduling_loop(raft: Raft, view: StateView, id: u64) {
    let mut metrics = raft.metrics();
    let mut planned_at: Option<u64> = None;
    loop {
        let (leading, applied) = {
            let m = metrics.borrow_watched();
            (m.current_leader == Some(id), m.last_applied.as_ref().map(|l| l.index()))
        };
        if leading && applied != planned_at {
            planned_at = applied;
            let plan = {
                let state = view.read();
                first_fit(&state.state, MAX_PLAN_ALLOCATIONS)
            };
            if !plan.is_empty() {
                let command = Command::ApplyPlan { allocations: plan.allocations, reasons: plan.reasons };
                if let Err(e) = commit(&raft, command).await {
                    tracing::warn!("committing a plan failed: {}", e.message());
                }
            }
            tokio::time::sleep(Duration::from_millis(MIN_PASS_INTERVAL_MS)).await;
            continue;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(IDLE_PASS_INTERVAL_MS)) => planned_at = None,
        }
    }
}
