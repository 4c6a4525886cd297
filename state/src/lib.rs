//! Drover's replicated state machine: the commands that change the cluster, and a deterministic `apply`.
//!
//! Nothing here does I/O or reads a clock: time comes from the leader's stamp in each entry, ids from counters
//! in the state. `apply` returns the list of records that changed, and the storage layer writes exactly those,
//! atomically with the applied log id.

pub mod command;
pub mod config;
pub mod error;
pub mod first_fit;
pub mod hostlist;
pub mod job;
pub mod lifecycle;
pub mod node;
pub mod slurm_time;
pub mod state;

pub use command::{Allocation, Command, JobEnd, JobOutcome, Reply, Request, Response};
pub use config::{ClusterConfig, Limit, Partition, PartitionState, PartitionUpdate};
pub use error::CommandError;
pub use job::{ExportPolicy, Job, JobId, JobSpec, JobState, NodeAllocation, PendingReason, Usage};
pub use node::{GpuInfo, Node, NodeHealth, NodeInfo};
pub use state::{Applied, Change, Meta, State};

/// The version of the persisted format (records and snapshots). Bumped on any incompatible change; a replica
/// refuses to open data of a version it does not know.
pub const FORMAT_VERSION: u32 = 1;
