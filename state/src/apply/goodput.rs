//! Goodput: how much of the GPU time given to jobs became training progress that was kept, and how much was
//! thrown away by failures and preemptions. Pure functions over a job's incarnations, used by `apply` for the
//! cluster's running totals ([`crate::State::goodput_totals`]) and by `sacct`/`sreport` for per-job and windowed
//! figures, so both sides count the same way.
//!
//! # Definitions
//! An *incarnation* is one run of a job on an allocation, from its start to its end (a requeue starts the next
//! one). For each incarnation that ran, with `G` GPUs held at its end (a `--no-kill` job that lost a node counts
//! the GPUs it still held), and `C` the time of the latest checkpoint recorded *during that incarnation*:
//! - **allocated** GPU time: `G × (end − start)`, whatever the outcome.
//! - **lost** GPU time: `G × (end − C)`, or `G × (end − start)` when it recorded no checkpoint: the progress made
//!   since the last checkpoint is gone, and the next incarnation redoes it. Counted only for incarnations that
//!   ended in
//!   - `NODE_FAIL` (node lost, agent fenced for lack of contact, GPU fault with the node drained): a failure of
//!     the cluster, not of the job. Counted as *lost to failures*, and in `failed_incarnations`.
//!   - `PREEMPTED` (PreemptMode=REQUEUE or CANCEL, for a more urgent job): not a failure, but lost work all the
//!     same. Counted apart, as *lost to preemption*, in `preempted_incarnations`, so a report can tell a
//!     policy's cost from broken hardware's.
//!
//!   Not counted as lost: `COMPLETED`; `REQUEUED` (`scontrol requeue`, a choice of the job's owner or an operator,
//!   typically from inside the job right after it checkpointed); and the job's own failures (`FAILED`,
//!   `OUT_OF_MEMORY`, `TIMEOUT`, `CANCELLED`): Drover requeues none of them by itself, and whether the time before
//!   them was useful is the job's business, not the cluster's.
//! - **down time** after a failure: the wall-clock time from a `NODE_FAIL` incarnation's end to the next
//!   incarnation's start (no GPU is held meanwhile, so it is reported in ms, not GPU time). It is counted once
//!   the next incarnation starts. The next incarnation's time from its start to its first checkpoint (loading
//!   the checkpoint, warming up, redoing the lost steps) is partly restart overhead too, but cannot be told apart
//!   from new progress here: it is counted as allocated time that was kept.
//! - **effective training time ratio** (`Goodput` in `sacct`/`sreport`):
//!   `(allocated − lost to failures − lost to preemption) / allocated`; 1.0 for a job that never lost work,
//!   undefined (`None`, printed empty) when nothing was allocated.
//!
//! Times are the leader's stamps in the log entries (start, checkpoint, end), in ms; GPU time is in GPU-ms.
//! Nothing here reads a clock: a still-running incarnation is counted up to the `now_ms` its caller passes.

pub use crate::model::goodput_totals::GoodputTotals;
use crate::model::job::{IncarnationRecord, Job, JobState};

/// Why an incarnation's unsaved progress counts as lost, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    Failure,
    Preemption,
}

/// Whether an incarnation that ended in `state` lost its progress since its last checkpoint, and to what.
pub fn loss_of(state: JobState) -> Option<Loss> {
    match state {
        JobState::NodeFail => Some(Loss::Failure),
        JobState::Preempted => Some(Loss::Preemption),
        _ => None,
    }
}

/// One incarnation that ran, as goodput sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incarnation {
    pub incarnation: u64,
    /// GPUs held (at its end).
    pub gpus: u32,
    pub start_ms: u64,
    /// `None` while it runs.
    pub end_ms: Option<u64>,
    /// How it ended (`RUNNING`/`COMPLETING` while it runs).
    pub state: JobState,
    /// The latest checkpoint it recorded itself.
    pub last_checkpoint_ms: Option<u64>,
}

/// A time window `[start_ms, end_ms)`; [`ALL_TIME`] for totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
}

pub const ALL_TIME: Window = Window { start_ms: 0, end_ms: u64::MAX };

impl Window {
    /// How much of `[from, to)` lies inside the window, in ms.
    pub fn overlap_ms(&self, from_ms: u64, to_ms: u64) -> u64 {
        to_ms.min(self.end_ms).saturating_sub(from_ms.max(self.start_ms))
    }

    pub fn contains(&self, t_ms: u64) -> bool {
        self.start_ms <= t_ms && t_ms < self.end_ms
    }
}

impl Incarnation {
    /// An ended incarnation from the job's history; `None` for one that never started.
    pub fn of_record(record: &IncarnationRecord) -> Option<Incarnation> {
        Some(Incarnation {
            incarnation: record.incarnation,
            gpus: record.gpus,
            start_ms: record.start_ms?,
            end_ms: Some(record.end_ms),
            state: record.state,
            last_checkpoint_ms: record.last_checkpoint_ms,
        })
    }

    /// The job's current (or, for a finished job, final) incarnation, if it started and is not already in the
    /// history (a job that failed past the requeue limit is archived with its last incarnation recorded there).
    pub fn current(job: &Job) -> Option<Incarnation> {
        let start_ms = job.start_time_ms?;
        if job.history.last().is_some_and(|h| h.incarnation == job.incarnation) {
            return None;
        }
        let end_ms = if job.state.is_terminal() { Some(job.end_time_ms.unwrap_or(start_ms)) } else { None };
        Some(Incarnation {
            incarnation: job.incarnation,
            gpus: job.allocated_gpus() as u32,
            start_ms,
            end_ms,
            state: job.state,
            last_checkpoint_ms: job.incarnation_checkpoint_ms(),
        })
    }

    /// When its unsaved progress began: its last checkpoint, else its start (a checkpoint stamped before the
    /// start cannot be one of its own; clamped all the same).
    pub fn unsaved_since_ms(&self) -> u64 {
        self.last_checkpoint_ms.map_or(self.start_ms, |c| c.max(self.start_ms))
    }

    /// What this incarnation adds to the sums, within `window`; a running one counts up to `now_ms`, as allocated
    /// time only. The counters count it if it ended inside the window.
    pub fn totals(&self, window: Window, now_ms: u64) -> GoodputTotals {
        let gpus = u64::from(self.gpus);
        let end_ms = self.end_ms.unwrap_or(now_ms).max(self.start_ms);
        let mut totals =
            GoodputTotals { allocated_gpu_ms: gpus * window.overlap_ms(self.start_ms, end_ms), ..Default::default() };
        let Some(ended_ms) = self.end_ms else { return totals };
        let ended_inside = window.contains(ended_ms);
        totals.ended_incarnations = u64::from(ended_inside);
        let lost_gpu_ms = gpus * window.overlap_ms(self.unsaved_since_ms(), end_ms);
        match loss_of(self.state) {
            Some(Loss::Failure) => {
                totals.lost_to_failures_gpu_ms = lost_gpu_ms;
                totals.failed_incarnations = u64::from(ended_inside);
            }
            Some(Loss::Preemption) => {
                totals.lost_to_preemption_gpu_ms = lost_gpu_ms;
                totals.preempted_incarnations = u64::from(ended_inside);
            }
            None => {}
        }
        totals
    }
}

/// Down time between a failed incarnation (ended at `failed_end_ms` in `state`) and the next one's start, within
/// `window`: 0 unless it failed.
pub fn down_ms(state: JobState, failed_end_ms: u64, next_start_ms: u64, window: Window) -> u64 {
    if loss_of(state) == Some(Loss::Failure) { window.overlap_ms(failed_end_ms, next_start_ms) } else { 0 }
}

/// Every incarnation of `job` that ran, oldest first: the history's (at most [`crate::model::job::MAX_HISTORY`]), then
/// the current one.
pub fn incarnations(job: &Job) -> Vec<Incarnation> {
    job.history.iter().filter_map(Incarnation::of_record).chain(Incarnation::current(job)).collect()
}

/// A job's goodput within `window`, its running incarnation counted up to `now_ms`. For [`ALL_TIME`], the
/// incarnations dropped from a long history are included (`Job::dropped_goodput`); a narrower window cannot
/// place them in time and leaves them out.
pub fn of_job_in(job: &Job, window: Window, now_ms: u64) -> GoodputTotals {
    let mut totals = match &job.dropped_goodput {
        Some(dropped) if window == ALL_TIME => **dropped,
        _ => GoodputTotals::default(),
    };
    let all = incarnations(job);
    for (i, inc) in all.iter().enumerate() {
        totals.add(&inc.totals(window, now_ms));
        if let (Some(end_ms), Some(next)) = (inc.end_ms, all.get(i + 1)) {
            totals.down_after_failures_ms += down_ms(inc.state, end_ms, next.start_ms, window);
        }
    }
    totals
}

/// A job's goodput over its whole life so far.
pub fn of_job(job: &Job, now_ms: u64) -> GoodputTotals {
    of_job_in(job, ALL_TIME, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::{Checkpoint, NodeAllocation};

    const S: u64 = 1_000;

    fn record(
        incarnation: u64,
        gpus: u32,
        start_s: u64,
        end_s: u64,
        state: JobState,
        ckpt_s: Option<u64>,
    ) -> IncarnationRecord {
        IncarnationRecord {
            incarnation,
            start_ms: Some(start_s * S),
            end_ms: end_s * S,
            nodes: "gpu01".into(),
            state,
            reason: String::new(),
            resumed_from: None,
            gpus,
            last_checkpoint_ms: ckpt_s.map(|c| c * S),
        }
    }

    /// A finished job of `gpus` GPUs on one node: its final incarnation from `start_s` to `end_s`.
    fn finished(gpus: u32, start_s: u64, end_s: u64, state: JobState, history: Vec<IncarnationRecord>) -> Job {
        Job {
            id: 1,
            state,
            incarnation: history.len() as u64,
            restart_count: history.len() as u32,
            start_time_ms: Some(start_s * S),
            end_time_ms: Some(end_s * S),
            allocation: vec![NodeAllocation { node: "gpu01".into(), gpus: (0..gpus).collect(), ..Default::default() }]
                .into(),
            history: history.into(),
            ..Job::default()
        }
    }

    #[test]
    fn a_failure_loses_the_gpu_time_since_the_incarnations_last_checkpoint() {
        // Incarnation 0 checkpoints 100 s in and dies 150 s in, on 8 GPUs: 8 × 50 GPU-s lost. Incarnation 1
        // starts 30 s later and completes after 200 s.
        let failed = record(0, 8, 1_000, 1_150, JobState::NodeFail, Some(1_100));
        let job = finished(8, 1_180, 1_380, JobState::Completed, vec![failed]);
        let g = of_job(&job, 99_999 * S);
        assert_eq!(g.lost_to_failures_gpu_ms, 8 * 50 * S);
        assert_eq!(g.allocated_gpu_ms, 8 * (150 + 200) * S);
        assert_eq!((g.ended_incarnations, g.failed_incarnations, g.preempted_incarnations), (2, 1, 0));
        assert_eq!(g.down_after_failures_ms, 30 * S);
        let ratio = g.effective_ratio().unwrap();
        assert!((ratio - 300.0 / 350.0).abs() < 1e-12, "{ratio}");
    }

    #[test]
    fn a_failure_without_a_checkpoint_loses_the_whole_incarnation() {
        let failed = record(0, 4, 0, 600, JobState::NodeFail, None);
        let job = finished(4, 700, 1_300, JobState::Completed, vec![failed]);
        let g = of_job(&job, 0);
        assert_eq!(g.lost_to_failures_gpu_ms, 4 * 600 * S);
        assert_eq!(g.effective_ratio(), Some(0.5));
    }

    #[test]
    fn a_checkpoint_of_an_earlier_incarnation_does_not_save_a_later_one() {
        // The job's latest checkpoint is incarnation 0's: incarnation 1 recorded none, so it loses everything.
        let first = record(0, 2, 0, 100, JobState::NodeFail, Some(50));
        let mut job = finished(2, 110, 160, JobState::NodeFail, vec![first]);
        job.checkpoint = Some(Box::new(Checkpoint { path: "/c".into(), step: None, incarnation: 0, time_ms: 50 * S }));
        let g = of_job(&job, 0);
        assert_eq!(g.lost_to_failures_gpu_ms, 2 * (50 + 50) * S);
        assert_eq!(g.failed_incarnations, 2);
        // Once incarnation 1 records its own, only the time since counts.
        job.checkpoint = Some(Box::new(Checkpoint { path: "/d".into(), step: None, incarnation: 1, time_ms: 150 * S }));
        assert_eq!(of_job(&job, 0).lost_to_failures_gpu_ms, 2 * (50 + 10) * S);
    }

    #[test]
    fn a_preemption_is_lost_work_counted_apart_from_failures() {
        let preempted = record(0, 8, 0, 150, JobState::Preempted, Some(100));
        let job = finished(8, 200, 400, JobState::Completed, vec![preempted]);
        let g = of_job(&job, 0);
        assert_eq!((g.lost_to_failures_gpu_ms, g.lost_to_preemption_gpu_ms), (0, 8 * 50 * S));
        assert_eq!((g.failed_incarnations, g.preempted_incarnations), (0, 1));
        assert_eq!(g.down_after_failures_ms, 0, "waiting after a preemption is not down time after a failure");
        assert_eq!(g.lost_gpu_ms(), 8 * 50 * S);
    }

    #[test]
    fn a_clean_run_and_a_requested_requeue_lose_nothing() {
        let clean = finished(8, 0, 3_600, JobState::Completed, vec![]);
        let g = of_job(&clean, 0);
        assert_eq!((g.allocated_gpu_ms, g.lost_gpu_ms()), (8 * 3_600 * S, 0));
        assert_eq!(g.effective_ratio(), Some(1.0));
        let requeued = record(0, 8, 0, 100, JobState::Requeued, None);
        let g = of_job(&finished(8, 110, 200, JobState::Completed, vec![requeued]), 0);
        assert_eq!((g.lost_gpu_ms(), g.effective_ratio()), (0, Some(1.0)));
        let failed_itself = finished(8, 0, 100, JobState::Failed, vec![]);
        assert_eq!(of_job(&failed_itself, 0).effective_ratio(), Some(1.0), "the job's own failure is its business");
        assert_eq!(of_job(&Job::default(), 0).effective_ratio(), None, "a job that never ran has no ratio");
    }

    #[test]
    fn a_running_incarnation_counts_allocated_time_up_to_now_and_no_loss() {
        let failed = record(0, 1, 0, 10, JobState::NodeFail, Some(4));
        let mut job = finished(1, 12, 0, JobState::Running, vec![failed]);
        job.end_time_ms = None;
        let g = of_job(&job, 20 * S);
        assert_eq!(g.allocated_gpu_ms, (10 + 8) * S);
        assert_eq!((g.lost_to_failures_gpu_ms, g.ended_incarnations, g.down_after_failures_ms), (6 * S, 1, 2 * S));
    }

    #[test]
    fn a_job_archived_past_the_requeue_limit_counts_its_last_incarnation_once() {
        let last = record(0, 2, 0, 10, JobState::NodeFail, None);
        let mut job = finished(2, 0, 10, JobState::NodeFail, vec![last]);
        job.incarnation = 0;
        let g = of_job(&job, 0);
        assert_eq!((g.allocated_gpu_ms, g.ended_incarnations), (2 * 10 * S, 1));
    }

    #[test]
    fn a_window_clips_allocated_and_lost_time_and_counts_ends_inside_it() {
        let failed = record(0, 2, 0, 100, JobState::NodeFail, Some(60));
        let job = finished(2, 120, 200, JobState::Completed, vec![failed]);
        let window = Window { start_ms: 80 * S, end_ms: 150 * S };
        let g = of_job_in(&job, window, 0);
        assert_eq!(g.allocated_gpu_ms, 2 * (20 + 30) * S);
        assert_eq!(g.lost_to_failures_gpu_ms, 2 * 20 * S);
        assert_eq!((g.ended_incarnations, g.failed_incarnations), (1, 1), "the completion at 200 s is outside");
        assert_eq!(g.down_after_failures_ms, 20 * S);
        let before = of_job_in(&job, Window { start_ms: 0, end_ms: 50 * S }, 0);
        assert_eq!((before.allocated_gpu_ms, before.lost_gpu_ms(), before.failed_incarnations), (2 * 50 * S, 0, 0));
    }
}
