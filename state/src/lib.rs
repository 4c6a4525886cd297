//! Drover's replicated state machine: the commands that change the cluster, and a deterministic `apply`.
//!
//! Nothing here does I/O or reads a clock: time comes from the leader's stamp in each entry, ids from counters
//! in the state. `apply` returns the list of records that changed, and the storage layer writes exactly those,
//! atomically with the applied log id.

pub mod apply;
pub mod array;
pub mod codec;
pub mod command;
pub mod dependency;
pub mod error;
pub mod feature;
pub mod first_fit;
pub use drover_common::hostlist;
pub mod model;
pub mod signal;
pub mod spare;
pub use drover_common::slurm_time;
pub mod state;
pub mod thin_str;
pub mod tolerant;

// The old public paths (`drover_state::job::JobSpec`) stay: the data lives in `model`, the handlers in `apply`.
pub use apply::{admin, dependents, goodput, lifecycle, requeue};
pub use model::{account, audit, config, container, job, node, qos, reservation, role};

pub use account::{Account, AccountUpdate};
pub use admin::{AdminOp, Object};
pub use audit::AuditEntry;
pub use command::{Allocation, Command, JobEnd, JobOutcome, JobUpdate, Reply, Request, Response, StepStart};
pub use config::{ClusterConfig, Limit, Partition, PartitionState, PartitionUpdate, PreemptMode};
pub use error::{AllocationRefusal, CommandError};
pub use goodput::GoodputTotals;
pub use job::{
    ArraySpec, ArrayTask, Checkpoint, DepState, Dependency, DependencyKind, ExportPolicy, IncarnationRecord, Job,
    JobId, JobSpec, JobState, MeasuredUsage, NodeAllocation, NodeUsage, PendingReason, RequeueKind, RequeueOrder,
    StepEnd, StepRecord, Usage, WarnSignal,
};
pub use node::{GpuInfo, Lingering, Node, NodeHealth, NodeInfo, RunningShare, check_host};
pub use qos::{DEFAULT_QOS, Qos};
pub use reservation::{Reservation, ReservationFlag, ReservationUpdate};
pub use role::{AdminLevel, RoleGrant};
pub use state::{Applied, Change, Meta, Records, Resolved, State};
pub use thin_str::ThinStr;

/// The version of the persisted format (records and snapshots). Bumped on any incompatible change; a replica
/// refuses to open data of a version it does not know. A field added at the end of a struct with a serde default
/// (checkpoints and restart history, measured usage, goodput) is no such change and keeps the version (see
/// `codec`).
pub const FORMAT_VERSION: u32 = 5;
/// Versions this build opens and upgrades in place: version 1 lacks the registry of accounts, QOS and
/// reservations, which version 2 adds in a family of its own (so version-1 data is valid, empty-registry data);
/// version 3 adds roles (in the registry family) and the audit log (a family of its own), both empty before;
/// version 4 writes log entries, Raft messages and records in the binary `codec` (its reader still takes the
/// JSON of versions 1 to 3, so older records are valid as they are); version 5 stores a job's submit environment
/// once, in a family of its own, instead of in the job (older jobs keep theirs inline, which the launch still
/// reads).
pub const READABLE_FORMAT_VERSIONS: [u32; 5] = [1, 2, 3, 4, 5];
