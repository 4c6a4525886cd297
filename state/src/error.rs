//! Errors `apply` returns for commands it refuses. They cross RPC (serialized in the response), so each
//! carries what a user needs to fix the request, in Slurm's wording where Slurm has one.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use drover_common::model::PartitionState;

use crate::model::job::{JobId, JobState};
use crate::model::role::AdminLevel;

#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum CommandError {
    #[error("invalid partition name specified: {name:?} (partitions: {known})")]
    InvalidPartition { name: String, known: String },
    #[error("partition {name} is in state {} and accepts no new jobs", .state.name())]
    PartitionClosed { name: String, state: PartitionState },
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
    #[error("Job {id} is not pending (state {}): only pending jobs can be held or released", .state.name())]
    NotPending { id: JobId, state: JobState },
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
    /// `cancelling`: the job is COMPLETING because it was cancelled (no requeue can win over that).
    #[error("Job {id} is not running (state {}{})", .state.name(), if *.cancelling { " (being cancelled)" } else { "" })]
    NotRunning { id: JobId, state: JobState, cancelling: bool },
    #[error(
        "Access/permission denied: {what} needs AdminLevel={level} (requested by uid {uid}); an administrator can grant it with `drover admin grant USER {level}`",
        level = .needed.name()
    )]
    NotAuthorized { uid: u32, what: String, needed: AdminLevel },
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
    /// `scontrol suspend` of a job that is not running, or `resume` of one that is not suspended (Slurm's words).
    #[error("{}", if *.suspend && *.state == JobState::Pending { "Job is pending execution" } else if *.suspend && *.state == JobState::Suspended { "Job already suspended" } else if *.suspend { "Job/step already completing or completed" } else { "Job is not suspended" })]
    NotSuspendable { id: JobId, state: JobState, suspend: bool },
    /// `scontrol top` of a held job (Slurm's words).
    #[error("Job is in held state, pending scheduler release")]
    HeldPendingRelease { id: JobId },
    /// A command that uses something newer than the cluster's active feature level (see `feature`).
    #[error(
        "{feature} needs cluster feature level {needed}, and the cluster is at level {active}: once every replica runs a build that understands it (see `drover cluster version`), run `drover cluster upgrade finalize`"
    )]
    FeatureNotFinalized { feature: String, needed: u32, active: u32 },
    /// `drover cluster upgrade finalize` to a level this replica cannot take (lower than the active one, or
    /// higher than its build understands).
    #[error("cannot set the cluster's feature level to {requested}: {why}")]
    FeatureLevel { requested: u32, why: String },
}

/// Why `apply` refused one planned allocation: the plan was made on a view the log has since moved past (or a
/// forged plan), so the job stays pending and the next pass plans it again. Typed, so the leader and the tests
/// match on what went wrong; the text is for the log.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum AllocationRefusal {
    #[error("job is no longer active")]
    Gone,
    #[error("job is {} (held: {held})", .state.name())]
    NotStartable { state: JobState, held: bool },
    #[error("an earlier incarnation of the job may still run: its tasks are not yet confirmed gone")]
    EarlierIncarnationLingers,
    #[error("{planned} nodes planned, the job asks for {min}-{max}")]
    NodeCount { planned: u32, min: u32, max: u32 },
    #[error("node {node} planned twice")]
    NodeTwice { node: String },
    #[error("unknown node {node}")]
    UnknownNode { node: String },
    #[error("node {node} is {state}")]
    NodeUnschedulable { node: String, state: String },
    #[error("node {node} is a hot spare, kept for jobs restarting after a node failure")]
    HotSpare { node: String },
    #[error("node {node} is outside the job's --nodelist/--exclude/--constraint")]
    NotAccepted { node: String },
    #[error("--exclusive needs all of node {node} and it is shared or partly given")]
    NotWhole { node: String },
    #[error("node {node} is held exclusively by job {holder}")]
    HeldExclusively { node: String, holder: JobId },
    #[error("{planned} GPUs planned on {node}, the job asks for {asked}")]
    GpuCount { node: String, planned: u32, asked: u32 },
    #[error("GPU {gpu} on {node} does not exist or is planned twice")]
    NoSuchGpu { node: String, gpu: u32 },
    #[error("GPU {gpu} on {node} is held by job {holder}")]
    GpuHeld { node: String, gpu: u32, holder: JobId },
    #[error("GPU {gpu} on {node} is still held by an ended incarnation")]
    GpuLingers { node: String, gpu: u32 },
    #[error("GPU {gpu} on {node} is drained")]
    GpuDrained { node: String, gpu: u32 },
    #[error("{planned} CPUs planned on {node}, {free} free")]
    Cpus { node: String, planned: u32, free: u32 },
    #[error("{planned} MiB planned on {node}, the job asks for {asked}")]
    MemoryMismatch { node: String, planned: u64, asked: u64 },
    #[error("{planned} MiB planned on {node}, {free} free")]
    Memory { node: String, planned: u64, free: u64 },
}
