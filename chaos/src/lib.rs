//! `drover-chaos`: fault drills against a Drover cluster, and the invariant checker that judges them.
//!
//! The pure core: [`history`] is what a drill records (client operations with their acknowledgements,
//! incarnations as the tasks' own logs saw them, checkpoints, faults, replica roles), [`checker`] judges a history
//! against Drover's promises without any network, clock or disk, and [`report`] turns it into a table and a
//! timeline; so the same history always gets the same verdict and a broken history can be planted in a test.
//! At the edges: [`drill`] files, the [`target`] trait with its [`local_target`] and [`docker_target`] (a compose
//! project's containers), the [`workload`] and the
//! [`runner`] that ties them together. [`sim`] runs the real controller code under a seeded simulated network
//! and clock, where a failing seed replays exactly.

pub mod checker;
pub mod docker_target;
pub mod drill;
pub mod history;
pub mod local_target;
pub mod recorder;
pub mod report;
pub mod runner;
pub mod sim;
pub mod target;
pub mod workload;

pub use checker::{Bounds, Violation, check};
pub use history::{Event, History, HistoryError};
