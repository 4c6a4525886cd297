//! Drover's scheduler: a pure, deterministic function from an immutable view of the replicated state to a plan.
//!
//! No I/O, no clock, no async: the leader runs [`schedule`] over a snapshot, commits the [`Plan`], and `apply`
//! re-validates it. Same view and config in, same plan out.

pub mod backfill;
pub mod dependency;
pub mod depth;
pub mod error;
pub mod fairshare;
mod fxhash;
pub mod model;
pub mod placement;
pub mod plan;
pub mod priority;
pub mod profile;
#[doc(hidden)]
pub mod synth;

pub use error::ScheduleError;
pub use model::*;
pub use plan::{NodeAlloc, Plan, Preemption, Reason};
pub use priority::PriorityBreakdown;

/// One scheduling pass: multifactor priority, start-now with topology-aware best-fit placement, and backfill
/// reservations for blocked jobs, honouring advance reservations and QOS limits.
pub fn schedule(view: &ClusterView, config: &SchedulerConfig) -> Result<Plan, ScheduleError> {
    backfill::Pass::new(view, config)?.run()
}
