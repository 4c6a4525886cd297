//! The sums that goodput is reported in, apart from how they are counted (`crate::apply::goodput`): jobs and accounts keep
//! them, and the counting reads jobs, so the sums sit below both.

use serde::{Deserialize, Serialize};

/// Sums of GPU time given to jobs and lost by them: one job's (`sacct`), one account's or the whole cluster's
/// (kept in the replicated state, see [`crate::State::goodput_totals`]). All times in ms, GPU time in GPU-ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct GoodputTotals {
    /// GPU time held by incarnations (every incarnation that ran, whatever its end).
    pub allocated_gpu_ms: u64,
    /// GPU time since the last checkpoint of incarnations that ended in `NODE_FAIL`.
    pub lost_to_failures_gpu_ms: u64,
    /// GPU time since the last checkpoint of incarnations that ended `PREEMPTED`.
    pub lost_to_preemption_gpu_ms: u64,
    /// Incarnations that ran and ended (a running one is not counted until it ends).
    pub ended_incarnations: u64,
    /// Of those, the ones that ended in `NODE_FAIL`, and `PREEMPTED`.
    pub failed_incarnations: u64,
    pub preempted_incarnations: u64,
    /// Wall-clock time from each failed incarnation's end to its job's next start.
    pub down_after_failures_ms: u64,
}

impl GoodputTotals {
    /// Lost GPU time, failures and preemptions together.
    pub fn lost_gpu_ms(&self) -> u64 {
        self.lost_to_failures_gpu_ms.saturating_add(self.lost_to_preemption_gpu_ms)
    }

    /// The effective training time ratio, `(allocated − lost) / allocated`; `None` when nothing was allocated.
    pub fn effective_ratio(&self) -> Option<f64> {
        if self.allocated_gpu_ms == 0 {
            return None;
        }
        let kept = self.allocated_gpu_ms.saturating_sub(self.lost_gpu_ms());
        Some(kept as f64 / self.allocated_gpu_ms as f64)
    }

    /// Adds `other` to these sums.
    pub fn add(&mut self, other: &GoodputTotals) {
        self.allocated_gpu_ms = self.allocated_gpu_ms.saturating_add(other.allocated_gpu_ms);
        self.lost_to_failures_gpu_ms = self.lost_to_failures_gpu_ms.saturating_add(other.lost_to_failures_gpu_ms);
        self.lost_to_preemption_gpu_ms = self.lost_to_preemption_gpu_ms.saturating_add(other.lost_to_preemption_gpu_ms);
        self.ended_incarnations = self.ended_incarnations.saturating_add(other.ended_incarnations);
        self.failed_incarnations = self.failed_incarnations.saturating_add(other.failed_incarnations);
        self.preempted_incarnations = self.preempted_incarnations.saturating_add(other.preempted_incarnations);
        self.down_after_failures_ms = self.down_after_failures_ms.saturating_add(other.down_after_failures_ms);
    }

    pub fn is_zero(&self) -> bool {
        *self == GoodputTotals::default()
    }
}
