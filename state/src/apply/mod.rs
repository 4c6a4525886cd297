//! What each command does to the state: [`State::apply`](crate::State::apply) dispatches to these handlers, one
//! file per family of commands. Each is an `impl State` block over the data in [`crate::model`].
//!
//! - `submit`: the submit checks and a new job (or array) entering the queue;
//! - `jobs`: cancel, hold and release, top, update of pending jobs;
//! - `lifecycle`: nodes registering and going down, plans starting jobs, steps, job ends, lingering holds;
//! - `requeue`: requeue, preemption and checkpoints;
//! - `dependents`: `--dependency` verdicts after every command;
//! - `admin`: accounts, QOS, reservations, roles, membership;
//! - `goodput`: the goodput sums kept as incarnations end.

pub mod admin;
pub mod dependents;
pub mod goodput;
pub(crate) mod jobs;
pub mod lifecycle;
pub mod requeue;
pub(crate) mod resilience;
pub(crate) mod submit;
