//! `drover-chaos`: fault drills against a Drover cluster, and the invariant checker that judges them.
//!
//! This crate starts with its pure core: [`history`] is what a drill records (client operations with their
//! acknowledgements, incarnations as agents and task logs saw them, checkpoints, faults), and [`checker`] judges a
//! history against Drover's promises without any network, clock or disk, so that the same history always gets the
//! same verdict and a broken history can be planted in a test. The drill runner and its targets build on it.

pub mod checker;
pub mod history;
pub mod sim;

pub use checker::{Bounds, Violation, check};
pub use history::{Event, History, HistoryError};
