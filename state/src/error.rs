//! Errors `apply` returns for commands it refuses. They cross RPC (serialized in the response), so each
//! carries what a user needs to fix the request, in Slurm's wording where Slurm has one.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::job::JobId;

#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum CommandError {
    #[error("invalid partition name specified: {name:?} (partitions: {known})")]
    InvalidPartition { name: String, known: String },
    #[error("partition {name} is in state {state} and accepts no new jobs")]
    PartitionClosed { name: String, state: String },
    #[error(
        "Requested time limit is invalid (missing or exceeds some limit): {requested} exceeds partition {partition}'s MaxTime of {max}"
    )]
    TimeLimitExceeded { requested: String, partition: String, max: String },
    #[error("Node count specification invalid: {requested} nodes exceed partition {partition}'s MaxNodes of {max}")]
    TooManyNodes { requested: u32, partition: String, max: u32 },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("batch script is {size_bytes} bytes, over the cluster's limit of {limit_bytes} bytes")]
    ScriptTooLarge { size_bytes: u64, limit_bytes: u64 },
    #[error(
        "submit environment is {size_bytes} bytes, over the cluster's limit of {limit_bytes} bytes (use --export=NONE or a smaller environment)"
    )]
    EnvironmentTooLarge { size_bytes: u64, limit_bytes: u64 },
    #[error("the cluster holds {active} active jobs, its MaxJobCount; try again when some have finished")]
    TooManyJobs { active: u64 },
    #[error("Invalid job id specified: {id}")]
    InvalidJobId { id: JobId },
    #[error("Job {id} has already finished")]
    AlreadyFinished { id: JobId },
    #[error("Access/permission denied for job {id}: owned by uid {owner}, requested by uid {requester}")]
    PermissionDenied { id: JobId, owner: u32, requester: u32 },
    #[error("Job {id} is not pending (state {state}): only pending jobs can be held or released")]
    NotPending { id: JobId, state: String },
    #[error("the cluster is not initialized yet (no configuration committed)")]
    NotInitialized,
    #[error("Requested node configuration is not available: {0}")]
    NodeConfigUnavailable(String),
    #[error("Invalid node name specified: {name}")]
    InvalidNodeName { name: String },
    #[error("report for job {id} incarnation {incarnation} is stale: {why}")]
    StaleReport { id: JobId, incarnation: u64, why: String },
    #[error(
        "node {node} was declared down for its registration epoch {epoch}, but it has registered again since (epoch {current}): the decision is stale"
    )]
    StaleNodeEpoch { node: String, epoch: u64, current: u64 },
    #[error("Job {id} is not running (state {state})")]
    NotRunning { id: JobId, state: String },
    #[error(
        "Access/permission denied: {what} needs AdminLevel={needed} (requested by uid {uid}); an administrator can grant it with `drover admin grant USER {needed}`"
    )]
    NotAuthorized { uid: u32, what: String, needed: String },
    #[error("Invalid account or account/partition combination specified: {name}: {why}")]
    InvalidAccount { name: String, why: String },
    #[error("Invalid qos specification: {name}: {why}")]
    InvalidQos { name: String, why: String },
    #[error("Requested reservation is invalid: {name}: {why}")]
    InvalidReservation { name: String, why: String },
    #[error("Job dependency problem: {0}")]
    DependencyProblem(String),
    #[error(
        "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): user {user} has {active} active jobs, the cluster's MaxSubmitJobs per user is {limit}"
    )]
    TooManyUserJobs { user: String, active: u64, limit: u64 },
    #[error("Job {id} is held by an administrator: only an operator or administrator can release it")]
    AdminHold { id: JobId },
}
