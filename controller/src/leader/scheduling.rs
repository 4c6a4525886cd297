//! The leader's scheduling loop: after every applied change (and on a slow tick), run one pass of the scheduler
//! library over a view of the state and commit the plan as one `ApplyPlan` entry, which `apply` re-validates.

use std::time::Duration;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use drover_proto::wire::JobInsight;
use drover_scheduler::SchedulerConfig;
use openraft::async_runtime::WatchReceiver;

use super::planner;
use crate::propose::{Proposer, propose};
use crate::store::StateView;

/// Passes run at most this often; bursts of submissions and ends share a pass.
const MIN_PASS_INTERVAL_MS: u64 = 2;
/// After a long pass the loop also waits this many times as long as the pass took, so scheduling a huge queue
/// takes at most a quarter of one core from the leader's other work (commits, reads, agent sessions). At half a
/// core (waiting once the pass time), 64 clients submitting into a queue of tens of thousands of pending jobs
/// committed 3,650/s, against 6,570/s with no passes at all: the passes' CPU, and `apply` waiting for the state
/// lock while a pass copies its view, were what held the write path back. A pass over a small queue takes well
/// under a millisecond, so jobs still start within a few milliseconds of a change.
const PAUSE_PER_PASS_TIME: u32 = 3;
/// Jobs copied into a pass's view, and pending reasons checked against the state, per hold of the state lock
/// (a few milliseconds at most).
const JOBS_PER_LOCK: usize = crate::store::JOBS_PER_READ;
/// A pass runs at least this often, even without changes (time moves reservations and ages priorities).
const IDLE_PASS_INTERVAL_MS: u64 = 1_000;

/// What the scheduling loop tells the rest of the replica: the latest pass's view of pending jobs (`sprio`,
/// `squeue --start`; on the leader only) and how long passes take (`/metrics`).
#[derive(Clone)]
pub struct Insights {
    latest: Arc<RwLock<HashMap<u64, JobInsight>>>,
    pass_seconds: drover_observe::prometheus_client::metrics::histogram::Histogram,
}

impl Default for Insights {
    fn default() -> Self {
        Insights { latest: Arc::default(), pass_seconds: drover_observe::metrics::duration_histogram() }
    }
}

impl Insights {
    pub fn latest(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, JobInsight>> {
        self.latest.read().expect("insights lock poisoned")
    }

    fn replace(&self, insights: HashMap<u64, JobInsight>) {
        *self.latest.write().expect("insights lock poisoned") = insights;
    }

    /// Wall time of each scheduling pass on this replica, including the plan's translation into commands.
    pub fn pass_seconds(&self) -> &drover_observe::prometheus_client::metrics::histogram::Histogram {
        &self.pass_seconds
    }
}

/// Slurm prints each factor multiplied by its weight.
fn insights(plan: &drover_scheduler::Plan, config: &SchedulerConfig) -> HashMap<u64, JobInsight> {
    let w = &config.weights;
    let weighted = |weight: u32, factor: f64| (f64::from(weight) * factor).round() as u64;
    let mut out: HashMap<u64, JobInsight> = plan
        .priorities
        .iter()
        .map(|(id, p)| {
            let insight = JobInsight {
                job_id: *id,
                priority: p.priority,
                age: weighted(w.age, p.age),
                fairshare: weighted(w.fairshare, p.fairshare),
                job_size: weighted(w.job_size, p.job_size),
                partition: weighted(w.partition, p.partition),
                qos: weighted(w.qos, p.qos),
                short: weighted(w.short, p.short),
                expected_start_s: None,
            };
            (*id, insight)
        })
        .collect();
    for (id, start_s) in &plan.expected_start {
        out.entry(*id).or_insert_with(|| JobInsight { job_id: *id, ..JobInsight::default() }).expected_start_s =
            Some(*start_s);
    }
    out
}

pub async fn scheduling_loop(proposer: Proposer, view: StateView, id: u64, latest: Insights) {
    let mut metrics = proposer.raft().metrics();
    let mut planned_at: Option<u64> = None;
    loop {
        let (leading, applied) = {
            let m = metrics.borrow_watched();
            (m.current_leader == Some(id), m.last_applied.as_ref().map(|l| l.index()))
        };
        if leading && applied != planned_at {
            planned_at = applied;
            let (pass_view, pass_latest) = (view.clone(), latest.clone());
            // tokio's clock, not std's: under the simulation's paused clock the pause below must not depend on
            // how fast the host ran the pass.
            let pass_started = tokio::time::Instant::now();
            // Read here, on the async side: the simulation's clock is this thread's.
            let now_ms = crate::runtime::now_ms();
            // A pass over a large queue takes milliseconds to a few hundred: keep it off the async workers.
            let command = crate::runtime::run_blocking(move || {
                // The state lock is held only to copy the view out, a bounded number of jobs at a time: neither
                // the copy nor the pass itself may stall `apply`.
                let (cluster, config) =
                    planner::view_in_chunks(|_, copy| copy(&pass_view.read().state), now_ms, JOBS_PER_LOCK);
                match drover_scheduler::schedule(&cluster, &config) {
                    Ok(plan) => {
                        pass_latest.replace(insights(&plan, &config));
                        planner::commands_in_chunks(
                            |translate| translate(&pass_view.read().state),
                            &plan,
                            JOBS_PER_LOCK,
                        )
                    }
                    Err(e) => {
                        tracing::error!("scheduling pass failed: {e}");
                        Vec::new()
                    }
                }
            })
            .await;
            let pass_took = pass_started.elapsed();
            latest.pass_seconds.observe(pass_took.as_secs_f64());
            for command in command.unwrap_or_default() {
                if let Err(e) = propose(&proposer, command).await {
                    tracing::warn!("committing a plan failed: {}", e.message());
                }
            }
            let pause = (pass_took * PAUSE_PER_PASS_TIME).max(Duration::from_millis(MIN_PASS_INTERVAL_MS));
            tokio::time::sleep(pause).await;
            continue;
        }
        tokio::select! {
            // In order, not at random: the same events give the same passes (the simulation replays seeds).
            biased;
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(IDLE_PASS_INTERVAL_MS)) => planned_at = None,
        }
    }
}
