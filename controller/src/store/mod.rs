//! Persistence: one RocksDB per replica holding the Raft log, the vote, and the state machine's records, in
//! separate column families.
//!
//! Durability: log entries and votes are fsynced (`flush_wal(true)`) before openraft is told they are stored.
//! State machine writes are not fsynced on every apply (the log can replay them), but each apply is one
//! atomic batch that includes the applied log id, and the WAL is synced before a snapshot lets the log be
//! purged. So a crash at any point leaves a state that equals "the log applied up to some index".

mod backup;
mod db;
mod log_store;
mod log_tail;
mod snapshot;
mod state_machine;

pub use backup::{BackupSummary, ForceSummary, RecoveryError, RestoreSummary, force_new_cluster, restore_backup};
pub use db::{Db, StoreError, open_db};
pub use log_store::LogStore;
pub use snapshot::SnapshotFile;
pub use state_machine::{JOBS_PER_READ, StateMachineStore, StateView, for_each_job_in_chunks};
