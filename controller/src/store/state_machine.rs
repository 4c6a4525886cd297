//! The state machine: `drover_state::State` in memory, its records in RocksDB, snapshots as RocksDB checkpoints.

use std::fs::File;
use std::io;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use drover_state::{Change, Job, JobId, Meta, Node, Reply, State};
use futures::{Stream, StreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use rocksdb::{IteratorMode, WriteBatch};
use serde::{Deserialize, Serialize};

use super::db::{
    CF_AUDIT, CF_DEDUP, CF_ENVIRONMENTS, CF_HISTORY, CF_JOBS, CF_NODES, CF_OBJECTS, CF_RAFT, CF_SCRIPTS, CF_SM, Db,
    SM_FAMILIES, id_key,
};
use super::snapshot::{CHECKPOINT_SUFFIX, RECEIVED_SUFFIX, SnapshotFile, SnapshotReader, open_checkpoint};
use crate::types::{LogId, SnapshotMeta, StoredMembership, TypeConfig};

type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>;

pub(super) const APPLIED_KEY: &[u8] = b"applied";
pub(super) const MEMBERSHIP_KEY: &[u8] = b"membership";
const META_KEY: &[u8] = b"meta";
/// In CF_RAFT (which an install does not wipe): the current snapshot, and a marker while one is being installed.
const CURRENT_SNAPSHOT_KEY: &[u8] = b"current_snapshot";
const INSTALLING_KEY: &[u8] = b"installing_snapshot";
/// The most jobs `load_applied` reserves room for before reading them (the estimate is RocksDB's, not exact).
const MAX_PRESIZED_JOBS: u64 = 4_000_000;
/// Records per write batch while installing a snapshot (bounds memory).
const INSTALL_BATCH_RECORDS: usize = 10_000;

fn io_err(context: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{context}: {e}"))
}

use super::log_store::{decode, encode};

#[derive(Serialize, Deserialize)]
struct DedupRecord {
    seq: u64,
    job_id: JobId,
}

#[derive(Serialize, Deserialize, Clone)]
struct CurrentSnapshot {
    meta: SnapshotMeta,
    file_name: String,
}

/// What the API reads: the in-memory state plus the applied position.
pub struct Applied {
    pub state: State,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

/// A cheap, cloneable read handle on the state machine for the API and the leader's loops.
#[derive(Clone)]
pub struct StateView {
    inner: Arc<RwLock<Applied>>,
    db: Db,
    /// Names of nodes whose assignments may have changed, after each applied batch (`*` = all of them, after a
    /// snapshot install). The leader's agent sessions listen, so only the affected agents are told.
    node_changes: tokio::sync::broadcast::Sender<String>,
}

/// Node-change notices buffered per listener; a listener that falls further behind re-checks every node.
const NODE_CHANGES_CAPACITY: usize = 16_384;

/// Active jobs per hold of the state lock when a reader walks all of them (a few milliseconds).
pub const JOBS_PER_READ: usize = 4_096;

/// Calls `f` on every active job in id order, `per_call` jobs per call of `with_state` (which takes the state lock
/// for that call). A walk over a million jobs in one hold held the lock for a third of a second: `apply` waited
/// for it, every other reader queued behind `apply` (the lock favours writers), both async workers stopped, and
/// the leader's heartbeats with them. Jobs seen in different calls may be a moment apart.
pub fn for_each_job_in_chunks(with_state: impl Fn(&mut dyn FnMut(&State)), per_call: usize, mut f: impl FnMut(&Job)) {
    let per_call = per_call.max(1);
    let mut next_id = 0;
    loop {
        let mut visited = 0;
        with_state(&mut |state| {
            for (id, job) in state.jobs.range(next_id..).take(per_call) {
                f(job);
                next_id = id + 1;
                visited += 1;
            }
        });
        if visited < per_call {
            return;
        }
    }
}

impl StateView {
    pub fn read(&self) -> RwLockReadGuard<'_, Applied> {
        self.inner.read().expect("state lock poisoned")
    }

    /// Every active job, in id order, `JOBS_PER_READ` per hold of the state lock (see `for_each_job_in_chunks`).
    pub fn for_each_job(&self, f: impl FnMut(&Job)) {
        for_each_job_in_chunks(|walk| walk(&self.read().state), JOBS_PER_READ, f)
    }

    /// The database behind the view (backups read it through a checkpoint).
    pub(super) fn db(&self) -> &Db {
        &self.db
    }

    pub fn node_changes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.node_changes.subscribe()
    }

    /// A job by id: active from memory, finished from the accounting history.
    pub fn job(&self, id: JobId) -> io::Result<Option<Job>> {
        if let Some(job) = self.read().state.job(id) {
            return Ok(Some(job.clone()));
        }
        self.history_job(id)
    }

    pub fn history_job(&self, id: JobId) -> io::Result<Option<Job>> {
        let raw = self.db.db.get_cf(self.db.cf(CF_HISTORY), id_key(id)).map_err(|e| io_err("reading history", e))?;
        raw.map(|b| decode(&b)).transpose()
    }

    pub fn script(&self, id: JobId) -> io::Result<Option<String>> {
        let raw = self.db.db.get_cf(self.db.cf(CF_SCRIPTS), id_key(id)).map_err(|e| io_err("reading scripts", e))?;
        Ok(raw.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Puts back the submit environment that `apply` stored apart from the job (`Change::PutEnvironment`), for
    /// the launch and for its owner's `get_job`. A job with one inline (written by a build before format 5, or
    /// submitted with none) is left as it is.
    pub fn with_environment(&self, job: &mut Job) -> io::Result<()> {
        if !job.spec.environment.is_empty() {
            return Ok(());
        }
        let key = id_key(job.script_id());
        let raw = self.db.db.get_cf(self.db.cf(CF_ENVIRONMENTS), key).map_err(|e| io_err("reading environments", e))?;
        if let Some(bytes) = raw {
            job.spec.environment = decode::<Vec<(String, String)>>(&bytes)?.into();
        }
        Ok(())
    }

    /// Audit entries in id order from `from_id`, at most `limit`.
    pub fn audit(&self, from_id: u64, limit: usize) -> io::Result<Vec<drover_state::AuditEntry>> {
        let mode = IteratorMode::From(&id_key(from_id), rocksdb::Direction::Forward);
        let mut out = Vec::new();
        for item in self.db.db.iterator_cf(self.db.cf(CF_AUDIT), mode).take(limit) {
            let (_, value) = item.map_err(|e| io_err("reading the audit log", e))?;
            out.push(decode(&value)?);
        }
        Ok(out)
    }

    /// Finished jobs in id order with ids in `ids` (inclusive), at most `limit` of them that pass `keep`. The
    /// range bounds the walk: a lookup of a few ids must not decode the whole history after them.
    pub fn history(
        &self,
        ids: std::ops::RangeInclusive<JobId>,
        limit: usize,
        mut keep: impl FnMut(&Job) -> bool,
    ) -> io::Result<Vec<Job>> {
        let mut out = Vec::new();
        let end = id_key(*ids.end());
        let iter = self.db.db.iterator_cf(
            self.db.cf(CF_HISTORY),
            IteratorMode::From(&id_key(*ids.start()), rocksdb::Direction::Forward),
        );
        for item in iter {
            let (key, value) = item.map_err(|e| io_err("reading history", e))?;
            if key.as_ref() > end.as_slice() {
                break;
            }
            let job: Job = decode(&value)?;
            if keep(&job) {
                out.push(job);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }
}

pub struct StateMachineStore {
    db: Db,
    view: StateView,
    snapshot_seq: u64,
}

impl StateMachineStore {
    /// Opens the state machine over `db`, finishing an interrupted snapshot install first.
    pub fn open(db: Db) -> io::Result<StateMachineStore> {
        let raft_cf = db.cf(CF_RAFT);
        if db.db.get_cf(raft_cf, INSTALLING_KEY).map_err(|e| io_err("reading install marker", e))?.is_some() {
            let current: CurrentSnapshot = decode(
                &db.db
                    .get_cf(raft_cf, CURRENT_SNAPSHOT_KEY)
                    .map_err(|e| io_err("reading current snapshot", e))?
                    .ok_or_else(|| io_err("install marker without a snapshot", db.dir.display()))?,
            )?;
            tracing::warn!(snapshot = %current.file_name, "finishing a snapshot install interrupted by a crash");
            load_snapshot_records(&db, &db.snapshot_dir().join(&current.file_name))?;
        }
        remove_unfinished_builds(&db);
        let applied = load_applied(&db)?;
        let (node_changes, _) = tokio::sync::broadcast::channel(NODE_CHANGES_CAPACITY);
        let view = StateView { inner: Arc::new(RwLock::new(applied)), db: db.clone(), node_changes };
        Ok(StateMachineStore { db, view, snapshot_seq: 0 })
    }

    pub fn view(&self) -> StateView {
        self.view.clone()
    }
}

/// Reads the persisted state machine records into memory.
fn load_applied(db: &Db) -> io::Result<Applied> {
    let sm = db.cf(CF_SM);
    let get = |key: &[u8]| db.db.get_cf(sm, key).map_err(|e| io_err("reading state machine", e));
    let last_applied: Option<LogId> = get(APPLIED_KEY)?.map(|b| decode(&b)).transpose()?;
    let membership: StoredMembership = get(MEMBERSHIP_KEY)?.map(|b| decode(&b)).transpose()?.unwrap_or_default();
    let meta: Meta = get(META_KEY)?.map(|b| decode(&b)).transpose()?.unwrap_or_default();
    if !drover_state::READABLE_FORMAT_VERSIONS.contains(&meta.format_version) {
        return Err(io_err(
            "state machine format",
            format!("found version {}, this build reads {}", meta.format_version, drover_state::FORMAT_VERSION),
        ));
    }
    let level = drover_state::feature::effective(meta.feature_level);
    if level > drover_state::feature::LEVEL {
        return Err(io_err(
            "cluster feature level",
            format!(
                "the cluster in {} was finalized at feature level {level}, and this build understands levels up to {}: \
                 a finalized upgrade cannot be rolled back; run the build the cluster was upgraded to",
                db.dir.display(),
                drover_state::feature::LEVEL
            ),
        ));
    }
    // Sized up front: growing a vector of a million jobs copies it again at every doubling.
    let estimate = db.db.property_int_value_cf(db.cf(CF_JOBS), "rocksdb.estimate-num-keys").ok().flatten();
    let mut jobs = Vec::with_capacity(estimate.unwrap_or(0).min(MAX_PRESIZED_JOBS) as usize);
    // The raw iterator lends each value instead of copying it into a new allocation: a million fewer copies.
    let mut records = db.db.raw_iterator_cf(db.cf(CF_JOBS));
    records.seek_to_first();
    while let Some(value) = records.value() {
        jobs.push(Box::new(decode::<Job>(value)?));
        records.next();
    }
    records.status().map_err(|e| io_err("reading jobs", e))?;
    let mut nodes = Vec::new();
    for item in db.db.iterator_cf(db.cf(CF_NODES), IteratorMode::Start) {
        let (_, value) = item.map_err(|e| io_err("reading nodes", e))?;
        nodes.push(decode::<Node>(&value)?);
    }
    let mut dedup = Vec::new();
    for item in db.db.iterator_cf(db.cf(CF_DEDUP), IteratorMode::Start) {
        let (key, value) = item.map_err(|e| io_err("reading dedup table", e))?;
        let record: DedupRecord = decode(&value)?;
        dedup.push((record.seq, String::from_utf8_lossy(&key).into_owned(), record.job_id));
    }
    dedup.sort_by_key(|(seq, _, _)| *seq);
    let mut objects = Vec::new();
    for item in db.db.iterator_cf(db.cf(CF_OBJECTS), IteratorMode::Start) {
        let (_, value) = item.map_err(|e| io_err("reading accounts, QOS and reservations", e))?;
        objects.push(decode::<drover_state::Object>(&value)?);
    }
    // The newest finished jobs, for dependencies on jobs that just ended (see drover_state::dependents).
    let mut finished = Vec::new();
    for item in db.db.iterator_cf(db.cf(CF_HISTORY), IteratorMode::End).take(drover_state::dependents::FATE_CAPACITY) {
        let (_, value) = item.map_err(|e| io_err("reading history", e))?;
        finished.push(decode::<Job>(&value)?);
    }
    let records = drover_state::Records { meta, jobs, nodes, dedup, objects, finished };
    Ok(Applied { state: State::restore(records), last_applied, membership })
}

/// History records written by the batch being built, newest version of each: a batch is not readable until it is
/// written, and a later entry of the same batch may amend a record an earlier one archived.
type PendingHistory = std::collections::HashMap<JobId, Job>;

/// Adds one state change to the batch.
fn write_change(db: &Db, batch: &mut WriteBatch, pending: &mut PendingHistory, change: &Change) -> io::Result<()> {
    match change {
        Change::Meta(meta) => batch.put_cf(db.cf(CF_SM), META_KEY, encode(meta)?),
        Change::PutJob(job) => batch.put_cf(db.cf(CF_JOBS), id_key(job.id), encode(job)?),
        Change::PutScript { id, script } => batch.put_cf(db.cf(CF_SCRIPTS), id_key(*id), script.as_bytes()),
        Change::PutEnvironment { id, environment } => {
            batch.put_cf(db.cf(CF_ENVIRONMENTS), id_key(*id), encode(environment)?)
        }
        Change::ArchiveJob(job) => {
            batch.delete_cf(db.cf(CF_JOBS), id_key(job.id));
            batch.put_cf(db.cf(CF_HISTORY), id_key(job.id), encode(job)?);
            pending.insert(job.id, (**job).clone());
        }
        Change::AddNodeUsage { job_id, incarnation, usage } => {
            // Read-modify-write of replicated data only (the history every replica holds), so every replica
            // amends the same way. A record of another incarnation, or one that has this node's figure already,
            // is left alone.
            let record = match pending.get(job_id) {
                Some(job) => Some(job.clone()),
                None => db
                    .db
                    .get_cf(db.cf(CF_HISTORY), id_key(*job_id))
                    .map_err(|e| io_err("reading history", e))?
                    .map(|bytes| decode::<Job>(&bytes))
                    .transpose()?,
            };
            if let Some(mut job) = record.filter(|job| job.incarnation == *incarnation)
                && job.record_node_usage(&usage.node, usage.usage)
            {
                batch.put_cf(db.cf(CF_HISTORY), id_key(*job_id), encode(&job)?);
                pending.insert(*job_id, job);
            }
        }
        Change::PutDedup { request_id, job_id, seq } => {
            batch.put_cf(db.cf(CF_DEDUP), request_id.as_bytes(), encode(&DedupRecord { seq: *seq, job_id: *job_id })?)
        }
        Change::DeleteDedup { request_id, .. } => batch.delete_cf(db.cf(CF_DEDUP), request_id.as_bytes()),
        Change::PutNode(node) => batch.put_cf(db.cf(CF_NODES), node.info.name.as_bytes(), encode(node)?),
        Change::PutObject(object) => batch.put_cf(db.cf(CF_OBJECTS), object.key().as_bytes(), encode(object)?),
        Change::DeleteObject(key) => batch.delete_cf(db.cf(CF_OBJECTS), key.as_bytes()),
        Change::PutAudit(entry) => batch.put_cf(db.cf(CF_AUDIT), id_key(entry.id), encode(entry)?),
        Change::DeleteAudit(id) => batch.delete_cf(db.cf(CF_AUDIT), id_key(*id)),
        Change::UnarchiveJob(id) => {
            batch.delete_cf(db.cf(CF_HISTORY), id_key(*id));
            pending.remove(id);
        }
    }
    Ok(())
}

/// The nodes whose set of assigned jobs (or those jobs' orders, like a cancel) a change affects.
fn touched_nodes(change: &Change, touched: &mut std::collections::BTreeSet<String>) {
    match change {
        Change::PutNode(node) => {
            touched.insert(node.info.name.clone());
        }
        Change::PutJob(job) | Change::ArchiveJob(job) => touched.extend(job.nodes.iter().cloned()),
        _ => {}
    }
}

/// Wipes the state machine families and fills them from a snapshot file, in bounded batches.
pub(super) fn load_snapshot_records(db: &Db, path: &std::path::Path) -> io::Result<()> {
    // Validate the whole file before destroying anything.
    let mut check = SnapshotReader::open(path)?;
    while check.next_record()?.is_some() {}
    for name in SM_FAMILIES {
        // Keys are 8-byte ids or short ASCII strings (request ids are limited to 128 bytes at the API).
        let (from, to): (&[u8], &[u8]) = (&[], &[0xFF; 256]);
        db.db.delete_range_cf(db.cf(name), from, to).map_err(|e| io_err("clearing state", e))?;
    }
    let mut reader = SnapshotReader::open(path)?;
    let mut batch = WriteBatch::default();
    while let Some((family, key, value)) = reader.next_record()? {
        batch.put_cf(db.cf(SM_FAMILIES[family as usize]), key, value);
        if batch.len() >= INSTALL_BATCH_RECORDS {
            db.db.write(std::mem::take(&mut batch)).map_err(|e| io_err("installing snapshot", e))?;
        }
    }
    db.db.write(batch).map_err(|e| io_err("installing snapshot", e))?;
    db.db.flush_wal(true).map_err(|e| io_err("syncing installed snapshot", e))?;
    db.db.delete_cf(db.cf(CF_RAFT), INSTALLING_KEY).map_err(|e| io_err("clearing install marker", e))?;
    db.db.flush_wal(true).map_err(|e| io_err("syncing installed snapshot", e))
}

/// Keeps only the newest snapshot (and none of the half-received ones older than it).
fn remove_old_snapshots(db: &Db, keep: &str) {
    let Ok(entries) = std::fs::read_dir(db.snapshot_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == keep {
            continue;
        }
        if name.ends_with(RECEIVED_SUFFIX) {
            let _ = std::fs::remove_file(entry.path());
        } else if name.ends_with(CHECKPOINT_SUFFIX) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Checkpoints a crash left half-built (`BUILDING_PREFIX`); only called at open, when no build runs.
fn remove_unfinished_builds(db: &Db) {
    let Ok(entries) = std::fs::read_dir(db.snapshot_dir()) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(BUILDING_PREFIX) {
            tracing::warn!(path = %entry.path().display(), "removing a snapshot a crash left half-built");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The name of a checkpoint while it is built (RocksDB itself builds it in `<name>.tmp` first).
const BUILDING_PREFIX: &str = "building-";

pub struct SnapshotBuilder {
    db: Db,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let db = self.db.clone();
        let seq = self.seq;
        crate::runtime::run_blocking(move || build_snapshot_blocking(&db, seq))
            .await
            .map_err(|e| io_err("snapshot task", e))?
    }
}

pub(super) fn build_snapshot_blocking(db: &Db, seq: u64) -> io::Result<Snapshot> {
    // Everything applied so far becomes durable before the log that produced it may be purged.
    db.db.flush_wal(true).map_err(|e| io_err("syncing before snapshot", e))?;
    let tag = format!("b{}-{seq}", std::process::id());
    let building = db.snapshot_dir().join(format!("{BUILDING_PREFIX}{tag}"));
    // One atomic point in time across all families; applies go on meanwhile, and the checkpoint holds exactly
    // the batches written before it (each apply is one batch, so it also holds the applied id that goes with them).
    rocksdb::checkpoint::Checkpoint::new(&db.db)
        .and_then(|c| c.create_checkpoint(&building))
        .map_err(|e| io_err(&format!("creating checkpoint {}", building.display()), e))?;
    let (last_log_id, membership) = applied_in_checkpoint(&building)?;
    let file_name = snapshot_file_name(&last_log_id, &tag, CHECKPOINT_SUFFIX);
    let path = db.snapshot_dir().join(&file_name);
    std::fs::rename(&building, &path)?;
    File::open(db.snapshot_dir())?.sync_all()?;
    let meta = SnapshotMeta { last_log_id, last_membership: membership };
    let current = CurrentSnapshot { meta: meta.clone(), file_name: file_name.clone() };
    db.db
        .put_cf(db.cf(CF_RAFT), CURRENT_SNAPSHOT_KEY, encode(&current)?)
        .map_err(|e| io_err("recording snapshot", e))?;
    db.db.flush_wal(true).map_err(|e| io_err("recording snapshot", e))?;
    remove_old_snapshots(db, &file_name);
    tracing::info!(snapshot = %file_name, "built snapshot");
    Ok(Snapshot { meta, snapshot: SnapshotFile { path } })
}

/// The applied log id and membership a checkpoint holds (the snapshot's metadata, or a backup's header).
pub(super) fn applied_in_checkpoint(dir: &std::path::Path) -> io::Result<(Option<LogId>, StoredMembership)> {
    let checkpoint = open_checkpoint(dir)?;
    let sm = checkpoint.cf_handle(CF_SM).ok_or_else(|| io_err("checkpoint", "no state machine family"))?;
    let get = |key: &[u8]| checkpoint.get_cf(sm, key).map_err(|e| io_err("reading checkpoint", e));
    let last_log_id: Option<LogId> = get(APPLIED_KEY)?.map(|b| decode(&b)).transpose()?;
    let membership: StoredMembership = get(MEMBERSHIP_KEY)?.map(|b| decode(&b)).transpose()?.unwrap_or_default();
    Ok((last_log_id, membership))
}

/// `snap-<term>-<node>-<index>-<tag><suffix>`: sortable by position, unique per build or receipt.
fn snapshot_file_name(last_log_id: &Option<LogId>, tag: &str, suffix: &str) -> String {
    let position = match last_log_id {
        Some(id) => format!("{}-{}", id.committed_leader_id(), id.index()),
        None => "empty".to_string(),
    };
    let clean: String = position.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("snap-{clean}-{tag}{suffix}")
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let applied = self.view.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        // Everything openraft hands over in one call goes to disk in one atomic batch; then every proposer is
        // answered. The stream is drained first so that no lock is held across an await.
        let mut items = Vec::new();
        while let Some(item) = entries.next().await {
            items.push(item?);
        }
        let mut batch = WriteBatch::default();
        let mut pending = PendingHistory::new();
        let mut answers = Vec::new();
        let mut touched = std::collections::BTreeSet::new();
        let mut meta_changed = false;
        {
            let mut applied = self.view.inner.write().expect("state lock poisoned");
            for (entry, responder) in items {
                let log_id = entry.log_id();
                let response = match entry.payload {
                    EntryPayload::Blank => Ok(Reply::Nothing),
                    EntryPayload::Normal(request) => {
                        if let drover_state::Command::SetFeatureLevel { level, .. } = &request.command
                            && *level > drover_state::feature::LEVEL
                        {
                            // Applying it anyway would leave this replica's state unlike the others'; stopping
                            // keeps the log, and a newer build on this data directory carries on from here.
                            return Err(io_err(
                                "applying the log",
                                format!(
                                    "entry {log_id} raises the cluster's feature level to {level}, and this build \
                                     understands levels up to {}: run a newer build on this replica",
                                    drover_state::feature::LEVEL
                                ),
                            ));
                        }
                        let outcome = applied.state.apply(&request);
                        for change in &outcome.changes {
                            if let Change::Meta(_) = change {
                                // Nearly every entry changes the meta (a submission takes the next id); it is one
                                // key, so it is written once per batch, as it stands after the batch, below.
                                meta_changed = true;
                                continue;
                            }
                            write_change(&self.db, &mut batch, &mut pending, change)?;
                            touched_nodes(change, &mut touched);
                        }
                        outcome.response
                    }
                    EntryPayload::Membership(membership) => {
                        applied.membership = StoredMembership::new(Some(log_id), membership);
                        batch.put_cf(self.db.cf(CF_SM), MEMBERSHIP_KEY, encode(&applied.membership)?);
                        Ok(Reply::Nothing)
                    }
                };
                applied.last_applied = Some(log_id);
                if let Some(responder) = responder {
                    answers.push((responder, response));
                }
            }
            if meta_changed {
                batch.put_cf(self.db.cf(CF_SM), META_KEY, encode(&applied.state.meta)?);
            }
            batch.put_cf(self.db.cf(CF_SM), APPLIED_KEY, encode(&applied.last_applied)?);
        }
        // A failed write leaves memory ahead of disk; the error makes openraft stop this replica (it must
        // restart from disk), so no answer is sent for state that was not stored.
        self.db.db.write(batch).map_err(|e| io_err(&format!("writing state in {}", self.db.dir.display()), e))?;
        for (responder, response) in answers {
            responder.send(response);
        }
        for name in touched {
            let _ = self.view.node_changes.send(name);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        SnapshotBuilder { db: self.db.clone(), seq: self.snapshot_seq }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotFile) -> io::Result<()> {
        let db = self.db.clone();
        self.snapshot_seq += 1;
        let file_name = snapshot_file_name(
            &meta.last_log_id,
            &format!("i{}-{}", std::process::id(), self.snapshot_seq),
            RECEIVED_SUFFIX,
        );
        let current = CurrentSnapshot { meta: meta.clone(), file_name: file_name.clone() };
        let loaded = crate::runtime::run_blocking(move || -> io::Result<Applied> {
            let path = db.snapshot_dir().join(&file_name);
            if snapshot.path.is_dir() {
                // Another replica's checkpoint handed over in-process (openraft's storage suite does this): its
                // records, in the transfer format.
                let mut out = std::io::BufWriter::new(File::create(&path)?);
                snapshot.write_to(&mut out)?;
                out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            } else if snapshot.path != path {
                std::fs::rename(&snapshot.path, &path)?;
            }
            // Marker and current snapshot first (synced): a crash mid-install is finished at the next start.
            let raft_cf = db.cf(CF_RAFT);
            db.db.put_cf(raft_cf, CURRENT_SNAPSHOT_KEY, encode(&current)?).map_err(|e| io_err("install", e))?;
            db.db.put_cf(raft_cf, INSTALLING_KEY, b"1").map_err(|e| io_err("install", e))?;
            db.db.flush_wal(true).map_err(|e| io_err("install", e))?;
            load_snapshot_records(&db, &path)?;
            remove_old_snapshots(&db, &file_name);
            load_applied(&db)
        })
        .await
        .map_err(|e| io_err("install task", e))??;
        assert_eq!(loaded.last_applied, meta.last_log_id, "installed snapshot disagrees with its metadata");
        tracing::info!(last_log_id = ?meta.last_log_id, "installed snapshot");
        *self.view.inner.write().expect("state lock poisoned") = loaded;
        let _ = self.view.node_changes.send("*".to_string());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let raw = self.db.db.get_cf(self.db.cf(CF_RAFT), CURRENT_SNAPSHOT_KEY).map_err(|e| io_err("snapshot", e))?;
        let Some(raw) = raw else { return Ok(None) };
        let current: CurrentSnapshot = decode(&raw)?;
        let path = self.db.snapshot_dir().join(&current.file_name);
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some(Snapshot { meta: current.meta, snapshot: SnapshotFile { path } }))
    }
}

#[cfg(test)]
mod tests {
    use drover_state::{MeasuredUsage, NodeUsage};

    use super::*;
    use crate::store::db::open_db;

    fn usage(node: &str, cpu_ms: u64) -> Change {
        let usage = NodeUsage { node: node.into(), usage: MeasuredUsage { cpu_ms: Some(cpu_ms), mem_peak_kb: None } };
        Change::AddNodeUsage { job_id: 7, incarnation: 1, usage }
    }

    /// A walk over all jobs holds the lock for a bounded chunk at a time, visits every job once, in id order.
    #[test]
    fn a_walk_over_the_jobs_takes_the_lock_a_chunk_at_a_time() {
        let mut state = State::default();
        for id in (1..=10).chain([1_000, u64::from(u32::MAX)]) {
            state.jobs.insert(id, Box::new(Job { id, ..Job::default() }));
        }
        for per_call in [1, 3, 12, 4_096] {
            let (holds, in_hold, most) = (std::cell::Cell::new(0), std::cell::Cell::new(0), std::cell::Cell::new(0));
            let mut seen = Vec::new();
            for_each_job_in_chunks(
                |walk| {
                    holds.set(holds.get() + 1);
                    in_hold.set(0);
                    walk(&state);
                },
                per_call,
                |job| {
                    in_hold.set(in_hold.get() + 1);
                    most.set(most.get().max(in_hold.get()));
                    seen.push(job.id);
                },
            );
            assert_eq!(seen, state.jobs.keys().copied().collect::<Vec<_>>(), "{per_call} per hold");
            assert!(most.get() <= per_call, "{} jobs in one hold, {per_call} allowed", most.get());
            assert_eq!(holds.get(), 12 / per_call + 1, "{per_call} per hold");
        }
    }

    /// Fills a database with `n` jobs (with scripts) in batches, the way applies write them.
    fn fill(db: &Db, ids: std::ops::Range<u64>) {
        for chunk in ids.collect::<Vec<_>>().chunks(500) {
            let mut batch = WriteBatch::default();
            for &id in chunk {
                let job = Job {
                    id,
                    spec: drover_state::JobSpec { name: format!("job-{id}").into(), ..Default::default() },
                    ..Job::default()
                };
                batch.put_cf(db.cf(CF_JOBS), id_key(id), encode(&job).unwrap());
                batch.put_cf(db.cf(CF_SCRIPTS), id_key(id), format!("#!/bin/sh\necho {id}\n{}", "x".repeat(400)));
            }
            db.db.write(batch).unwrap();
        }
    }

    fn records(db: &Db, family: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        db.db
            .iterator_cf(db.cf(family), IteratorMode::Start)
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect()
    }

    /// Building a snapshot must not copy the state (about 250 MB per replica at 900,000 jobs, on every replica at
    /// once, every `snapshot_after_entries`): the snapshot's data files are the database's own, hard-linked.
    #[test]
    fn a_snapshot_shares_the_databases_files_instead_of_copying_the_state() {
        let tmp = tempfile::TempDir::new().unwrap();
        let db = open_db(tmp.path()).unwrap();
        fill(&db, 1..20_001);
        db.db.flush_cf(db.cf(CF_JOBS)).unwrap();
        db.db.flush_cf(db.cf(CF_SCRIPTS)).unwrap();
        let state_bytes: u64 = records(&db, CF_JOBS)
            .iter()
            .chain(&records(&db, CF_SCRIPTS))
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum();

        let snapshot = build_snapshot_blocking(&db, 1).unwrap();
        let mut copied = 0;
        let mut shared = 0;
        for entry in walk(&snapshot.snapshot.path) {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&entry).unwrap();
            if meta.nlink() > 1 { shared += meta.len() } else { copied += meta.len() }
        }
        // The records compress in the database's files, so the links hold fewer bytes than the records.
        assert!(shared > 0, "the snapshot links none of the database's files");
        assert!(copied * 10 < state_bytes, "the snapshot copied {copied} bytes of a {state_bytes}-byte state");
    }

    fn walk(path: &std::path::Path) -> Vec<std::path::PathBuf> {
        if !path.is_dir() {
            return vec![path.to_path_buf()];
        }
        std::fs::read_dir(path).unwrap().flat_map(|e| walk(&e.unwrap().path())).collect()
    }

    /// A snapshot holds the state as of its point in time, whatever is written after it; streamed out of the
    /// checkpoint and installed on another replica, it gives that replica the same records, and a later build
    /// replaces the older snapshot on disk.
    #[test]
    fn a_snapshot_streams_its_point_in_time_and_installs_elsewhere() {
        let (a, b) = (tempfile::TempDir::new().unwrap(), tempfile::TempDir::new().unwrap());
        let (src, dst) = (open_db(a.path()).unwrap(), open_db(b.path()).unwrap());
        fill(&src, 1..3_001);
        let snapshot = build_snapshot_blocking(&src, 1).unwrap();
        let expected = (records(&src, CF_JOBS), records(&src, CF_SCRIPTS));
        fill(&src, 3_001..3_101);
        src.db.delete_cf(src.cf(CF_JOBS), id_key(1)).unwrap();

        let received = b.path().join("received.snap");
        let mut out = std::io::BufWriter::new(File::create(&received).unwrap());
        assert!(snapshot.snapshot.write_to(&mut out).unwrap() >= 6_000);
        std::io::Write::flush(&mut out).unwrap();
        drop(out);
        fill(&dst, 5_000..5_010);
        load_snapshot_records(&dst, &received).unwrap();
        assert_eq!((records(&dst, CF_JOBS), records(&dst, CF_SCRIPTS)), expected);

        let second = build_snapshot_blocking(&src, 2).unwrap();
        assert!(!snapshot.snapshot.path.exists(), "the older snapshot is removed");
        assert!(second.snapshot.path.is_dir());
        assert_eq!(records(&src, CF_JOBS).len(), 3_099);
    }

    /// A replica of an older build refuses data finalized past what it understands, naming the level, instead of
    /// misreading it; and it stops rather than apply an entry that raises the level past its build.
    #[tokio::test]
    async fn a_level_above_this_build_is_refused_at_open_and_at_apply() {
        use openraft::vote::RaftLeaderId;
        let beyond = drover_state::feature::LEVEL + 1;
        let tmp = tempfile::TempDir::new().unwrap();
        let db = open_db(tmp.path()).unwrap();
        let meta = Meta { feature_level: beyond, ..Meta::default() };
        db.db.put_cf(db.cf(CF_SM), META_KEY, encode(&meta).unwrap()).unwrap();
        let err = StateMachineStore::open(db).err().expect("refused").to_string();
        assert!(
            err.contains(&format!("finalized at feature level {beyond}"))
                && err.contains(&format!("levels up to {}", drover_state::feature::LEVEL)),
            "{err}"
        );

        let tmp = tempfile::TempDir::new().unwrap();
        let mut store = StateMachineStore::open(open_db(tmp.path()).unwrap()).unwrap();
        let log_id = LogId::new(openraft::vote::leader_id_adv::CommittedLeaderId::new(1, 1), 3);
        let request = drover_state::Request {
            time_ms: 1,
            command: drover_state::Command::SetFeatureLevel { level: beyond, by_uid: 0 },
        };
        let entry = crate::types::Entry { log_id, payload: EntryPayload::Normal(request) };
        let err = store.apply(futures::stream::iter(vec![Ok((entry, None))])).await.unwrap_err().to_string();
        assert!(err.contains(&format!("raises the cluster's feature level to {beyond}")), "{err}");
        assert_eq!(store.view().read().state.feature_level(), drover_state::feature::BASE_LEVEL);
    }

    /// A data directory written by a format-3 build holds JSON: its state, dedup table and log entries read as
    /// they are, and what this build writes over them is binary.
    #[tokio::test]
    async fn json_records_of_format_3_still_load() {
        use openraft::RaftLogReader;
        use openraft::storage::RaftLogStorage;
        use openraft::vote::RaftLeaderId;
        let tmp = tempfile::TempDir::new().unwrap();
        let db = open_db(tmp.path()).unwrap();
        let meta = Meta { format_version: 3, next_job_id: 8, ..Meta::default() };
        let job =
            Job { id: 7, spec: drover_state::JobSpec { name: "old".into(), ..Default::default() }, ..Job::default() };
        let put = |cf: &str, key: &[u8], value: Vec<u8>| db.db.put_cf(db.cf(cf), key, value).unwrap();
        put(CF_SM, META_KEY, serde_json::to_vec(&meta).unwrap());
        put(CF_JOBS, &id_key(7), serde_json::to_vec(&job).unwrap());
        put(CF_DEDUP, b"req-1", serde_json::to_vec(&DedupRecord { seq: 0, job_id: 7 }).unwrap());
        let log_id = LogId::new(openraft::vote::leader_id_adv::CommittedLeaderId::new(1, 1), 5);
        let entry = crate::types::Entry::new_blank(log_id);
        put(super::super::db::CF_LOGS, &id_key(5), serde_json::to_vec(&entry).unwrap());

        let store = StateMachineStore::open(db.clone()).unwrap();
        let view = store.view();
        assert_eq!(view.read().state.job(7).map(|j| j.spec.name.to_string()), Some("old".to_string()));
        assert_eq!(view.read().state.meta.next_job_id, 8);
        let mut log = super::super::LogStore::new(db.clone());
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id));
        assert_eq!(log.try_get_log_entries(5..6).await.unwrap(), vec![entry]);

        let (mut batch, mut pending) = (WriteBatch::default(), PendingHistory::new());
        write_change(&db, &mut batch, &mut pending, &Change::PutJob(Box::new(job.clone()))).unwrap();
        db.db.write(batch).unwrap();
        let raw = db.db.get_cf(db.cf(CF_JOBS), id_key(7)).unwrap().unwrap();
        assert_eq!(raw[0], drover_state::codec::BINARY_TAG, "rewritten in the binary format");
        assert_eq!(decode::<Job>(&raw).unwrap(), job);
    }

    /// The submit environment is written apart from the job; a reader that needs it (the launch, its owner's
    /// `get_job`) gets it back by the job's script id, every task of an array from the one copy. A job written
    /// by a build before format 5 holds its own, which is kept.
    #[tokio::test]
    async fn the_environment_stored_apart_is_put_back_for_the_launch() {
        let tmp = tempfile::TempDir::new().unwrap();
        let db = open_db(tmp.path()).unwrap();
        let store = StateMachineStore::open(db.clone()).unwrap();
        let environment = vec![("PATH".to_string(), "/usr/bin".to_string()), ("LR".to_string(), "3e-4".to_string())];
        let (mut batch, mut pending) = (WriteBatch::default(), PendingHistory::new());
        let change = Change::PutEnvironment { id: 10, environment: environment.clone() };
        write_change(&db, &mut batch, &mut pending, &change).unwrap();
        db.db.write(batch).unwrap();
        let view = store.view();

        let array = drover_state::ArrayTask {
            array_job_id: 10,
            task_id: 1,
            task_count: 2,
            task_min: 0,
            task_max: 1,
            max_running: None,
        };
        let mut task = Job { id: 11, array: Some(Box::new(array)), ..Job::default() };
        view.with_environment(&mut task).unwrap();
        assert_eq!(task.spec.environment.to_vec(), environment, "the array's copy, under its first id");
        let mut alone = Job { id: 12, ..Job::default() };
        view.with_environment(&mut alone).unwrap();
        assert!(alone.spec.environment.is_empty(), "a job submitted without one has none");
        let inline = vec![("OLD".to_string(), "1".to_string())];
        let mut old = Job { id: 10, ..Job::default() };
        old.spec.environment = inline.clone().into();
        view.with_environment(&mut old).unwrap();
        assert_eq!(old.spec.environment.to_vec(), inline, "an older job's own environment is kept");
    }

    /// A snapshot checkpointed by a build before format 5 has no environments family: it still streams, as a
    /// snapshot with none.
    #[test]
    fn a_checkpoint_from_before_the_environments_family_still_streams() {
        let (a, b) = (tempfile::TempDir::new().unwrap(), tempfile::TempDir::new().unwrap());
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let before = SM_FAMILIES.iter().filter(|f| !super::super::db::FAMILIES_SINCE_FORMAT_5.contains(f));
        let raw = rocksdb::DB::open_cf(&opts, a.path().join("db"), before).unwrap();
        let db = Db { db: std::sync::Arc::new(raw), dir: a.path().to_path_buf() };
        fill(&db, 1..11);
        let old = b.path().join("old.ckpt");
        rocksdb::checkpoint::Checkpoint::new(&db.db).unwrap().create_checkpoint(&old).unwrap();
        let mut out = Vec::new();
        let count = SnapshotFile { path: old }.write_to(&mut out).unwrap();
        assert_eq!(count, 20, "ten jobs and their scripts");
    }

    /// A node's usage reaches a job already in the history, archived by an earlier batch or earlier in the same
    /// one; figures for another incarnation, a node already counted or a job never archived change nothing.
    #[test]
    fn node_usage_amends_the_history_record_of_its_incarnation() {
        let tmp = tempfile::TempDir::new().unwrap();
        let db = open_db(tmp.path()).unwrap();
        let job =
            Job { id: 7, incarnation: 1, nodes: vec!["n1".into(), "n2".into(), "n3".into()].into(), ..Job::default() };
        let write = |changes: &[Change]| {
            let (mut batch, mut pending) = (WriteBatch::default(), PendingHistory::new());
            for change in changes {
                write_change(&db, &mut batch, &mut pending, change).unwrap();
            }
            db.db.write(batch).unwrap();
        };
        let read = || -> Job { decode(&db.db.get_cf(db.cf(CF_HISTORY), id_key(7)).unwrap().unwrap()).unwrap() };
        write(&[Change::ArchiveJob(Box::new(job.clone())), usage("n1", 10)]);
        assert_eq!(read().measured_cpu_ms(), Some(10), "amended within the batch that archived it");
        write(&[usage("n2", 20), usage("n2", 999)]);
        assert_eq!(read().measured_cpu_ms(), Some(30), "a later batch; one figure per node");
        let other = NodeUsage { node: "n3".into(), usage: MeasuredUsage { cpu_ms: Some(5), mem_peak_kb: None } };
        write(&[Change::AddNodeUsage { job_id: 7, incarnation: 0, usage: other.clone() }]);
        write(&[Change::AddNodeUsage { job_id: 8, incarnation: 1, usage: other }]);
        assert_eq!(read().measured_cpu_ms(), Some(30));
        assert!(db.db.get_cf(db.cf(CF_HISTORY), id_key(8)).unwrap().is_none());
    }
}
