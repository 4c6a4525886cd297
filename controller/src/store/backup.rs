//! Backups, restores and forced new clusters: the three ways state leaves or enters a data directory outside Raft.
//!
//! - **Backup** (online): a RocksDB checkpoint of the state machine (hard links, one atomic point in time across
//!   all families, taken while applies go on), streamed as a checksummed backup file
//!   (`drover_proto::backup`) and removed.
//! - **Restore** into an empty data directory: the records are loaded, then the state is stamped as applied at
//!   the backup's log index under a log id of term 0 (no term of the new cluster's can be older), with the new
//!   cluster's founders as its membership, and the log is marked purged up to it. The replica then starts as a
//!   member of an initialized cluster whose log begins after the backup: founders that restored the same file
//!   elect a leader among themselves; a founder left empty is brought up to date by a snapshot, as a replica
//!   that fell behind would be. A snapshot is built at once so that one exists to send.
//! - **Force new cluster** on a survivor of a lost quorum: its membership becomes itself alone. It keeps
//!   everything it applied and every entry it holds after that (its log is committed by the new one-member
//!   quorum), except from the first membership change in that unapplied tail onward, which would otherwise undo
//!   the new membership.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use drover_proto::backup::{BACKUP_FORMAT, BackupFileError, BackupHeader, BackupWriter, verify_backup};
use openraft::vote::RaftLeaderId;
use openraft::{EntryPayload, Membership};
use rocksdb::IteratorMode;
use thiserror::Error;

use super::db::{CF_LOGS, CF_RAFT, CF_SM, Db, id_key, key_id};
use super::log_store::{PURGED_KEY, VOTE_KEY, decode, delete_log_from, encode};
use super::snapshot::SnapshotFile;
use super::state_machine::{
    APPLIED_KEY, MEMBERSHIP_KEY, applied_in_checkpoint, build_snapshot_blocking, load_snapshot_records,
};
use crate::types::{Entry, LogId, ReplicaNode, StoredMembership};

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error(transparent)]
    File(#[from] BackupFileError),
    #[error("{0} (is the replica still running? stop it first)")]
    Open(#[from] super::db::StoreError),
    #[error("{what} in {dir}: {source}")]
    Store { dir: PathBuf, what: String, source: io::Error },
    #[error(
        "the data directory {dir} already holds a replica's data ({what}); restore only into an empty data directory (move this one away first)"
    )]
    NotEmpty { dir: PathBuf, what: String },
    #[error("a restore needs the new cluster's founders: set initial_members in the replica's configuration")]
    NoFounders,
    #[error(
        "backup {path} holds state format {found}; this build reads {readable:?}. Restore it with a release that reads it."
    )]
    StateFormat { path: PathBuf, found: u32, readable: &'static [u32] },
    #[error(
        "the data directory {dir} holds no applied state: there is nothing to start a new cluster from (was this replica ever a member?)"
    )]
    NothingApplied { dir: PathBuf },
}

fn store_err(db: &Db, what: &str) -> impl FnOnce(io::Error) -> RecoveryError {
    let (dir, what) = (db.dir.clone(), what.to_string());
    move |source| RecoveryError::Store { dir, what, source }
}

/// What a backup holds, as the leader reports it when done.
#[derive(Debug, Clone)]
pub struct BackupSummary {
    pub header: BackupHeader,
    pub bytes: u64,
    pub sha256: String,
}

/// Writes a backup of the applied state to `out`. Blocking; applies go on meanwhile.
pub fn write_backup(db: &Db, taken_by: u64, taken_at_ms: u64, out: impl Write) -> io::Result<BackupSummary> {
    let dir = db.dir.join("backups");
    std::fs::create_dir_all(&dir)?;
    // Checkpoints that a crash left behind (hard links that pin old files' disk space) go first; a replica takes
    // one backup at a time (`Api`'s backup slot), so none of them is in use.
    for leftover in std::fs::read_dir(&dir)?.flatten() {
        let _ = std::fs::remove_dir_all(leftover.path());
    }
    let checkpoint = dir.join(format!("backup-{}-{}", std::process::id(), taken_at_ms));
    let guard = RemoveOnDrop(checkpoint.clone());
    db.db.flush_wal(true).map_err(|e| io::Error::other(format!("syncing before the backup: {e}")))?;
    rocksdb::checkpoint::Checkpoint::new(&db.db)
        .and_then(|c| c.create_checkpoint(&checkpoint))
        .map_err(|e| io::Error::other(format!("creating checkpoint {}: {e}", checkpoint.display())))?;
    let (last_applied, membership) = applied_in_checkpoint(&checkpoint)?;
    let last_applied = last_applied.ok_or_else(|| io::Error::other("nothing applied yet: no state to back up"))?;
    let header = BackupHeader {
        backup_format: BACKUP_FORMAT,
        state_format_version: drover_state::FORMAT_VERSION,
        last_log_index: last_applied.index(),
        last_log_term: last_applied.committed_leader_id().term,
        replicas: membership.membership().nodes().map(|(id, node)| (*id, node.addr.clone())).collect(),
        taken_by,
        taken_at_ms,
        binary_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let mut writer = BackupWriter::start(out, &header)?;
    SnapshotFile { path: checkpoint }.write_to(&mut writer)?;
    let (bytes, sha256) = writer.finish()?;
    drop(guard);
    Ok(BackupSummary { header, bytes, sha256 })
}

impl super::StateView {
    /// Writes a backup of the applied state to `out` (see [`write_backup`]).
    pub fn write_backup(&self, taken_by: u64, taken_at_ms: u64, out: impl Write) -> io::Result<BackupSummary> {
        write_backup(self.db(), taken_by, taken_at_ms, out)
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreSummary {
    pub header: BackupHeader,
    pub sha256: String,
    pub records: u64,
}

/// Restores `path` into the empty data directory of `db`, as a member of a new cluster of `founders`.
pub fn restore_backup(db: &Db, path: &Path, founders: &BTreeMap<u64, String>) -> Result<RestoreSummary, RecoveryError> {
    if founders.is_empty() {
        return Err(RecoveryError::NoFounders);
    }
    // Checked before the directory is judged, so that a bad file is named as such whatever the directory holds.
    let verified = verify_backup(path)?;
    if !drover_state::READABLE_FORMAT_VERSIONS.contains(&verified.header.state_format_version) {
        return Err(RecoveryError::StateFormat {
            path: path.to_path_buf(),
            found: verified.header.state_format_version,
            readable: &drover_state::READABLE_FORMAT_VERSIONS,
        });
    }
    refuse_unless_empty(db)?;
    // The body is a snapshot in the transfer format: copied out as one, it loads through the same checked path
    // as a snapshot sent by a leader (validated whole before anything is written).
    let body = db.snapshot_dir().join(format!("restore-{}.snap", std::process::id()));
    let copied = (|| -> io::Result<()> {
        let mut input = File::open(path)?;
        input.seek(SeekFrom::Start(verified.body_offset))?;
        let mut out = BufWriter::new(File::create(&body)?);
        let n = io::copy(&mut input.take(verified.body_len), &mut out)?;
        if n != verified.body_len {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "backup changed while being restored"));
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    let loaded = copied.and_then(|()| load_snapshot_records(db, &body));
    let _ = std::fs::remove_file(&body);
    loaded.map_err(store_err(db, "loading the backup's records"))?;
    let records = count_records(db);
    // Term 0: below every term the new cluster will elect, as openraft's own initial membership entry is.
    let at = LogId::new(openraft::vote::leader_id_adv::CommittedLeaderId::new(0, 0), verified.header.last_log_index);
    let nodes: BTreeMap<u64, ReplicaNode> =
        founders.iter().map(|(id, addr)| (*id, ReplicaNode { addr: addr.clone() })).collect();
    stamp(db, at, Membership::from(nodes), true).map_err(store_err(db, "recording the restored position"))?;
    build_snapshot_blocking(db, 0).map_err(store_err(db, "building a snapshot of the restored state"))?;
    Ok(RestoreSummary { header: verified.header, sha256: verified.sha256, records })
}

/// Refuses a data directory that has ever been part of a cluster (a vote, a log or applied state).
fn refuse_unless_empty(db: &Db) -> Result<(), RecoveryError> {
    let not_empty = |what: &str| Err(RecoveryError::NotEmpty { dir: db.dir.clone(), what: what.to_string() });
    let raft = db.cf(CF_RAFT);
    let read = |cf, key: &[u8]| db.db.get_cf(cf, key).map_err(|e| io::Error::other(e.to_string()));
    if read(raft, VOTE_KEY).map_err(store_err(db, "reading the vote"))?.is_some() {
        return not_empty("a vote");
    }
    if read(raft, PURGED_KEY).map_err(store_err(db, "reading the log"))?.is_some()
        || db.db.iterator_cf(db.cf(CF_LOGS), IteratorMode::Start).next().is_some()
    {
        return not_empty("a log");
    }
    if read(db.cf(CF_SM), APPLIED_KEY).map_err(store_err(db, "reading the state"))?.is_some() {
        return not_empty("applied state");
    }
    Ok(())
}

fn count_records(db: &Db) -> u64 {
    super::db::SM_FAMILIES.iter().map(|name| db.db.iterator_cf(db.cf(name), IteratorMode::Start).count() as u64).sum()
}

/// Writes the applied position and membership, and with `purged` the log's purge point, in one synced batch.
fn stamp(db: &Db, at: LogId, membership: Membership<u64, ReplicaNode>, purged: bool) -> io::Result<()> {
    let mut batch = rocksdb::WriteBatch::default();
    batch.put_cf(db.cf(CF_SM), APPLIED_KEY, encode(&Some(at))?);
    batch.put_cf(db.cf(CF_SM), MEMBERSHIP_KEY, encode(&StoredMembership::new(Some(at), membership))?);
    if purged {
        // A restore: the log up to `at` belonged to another cluster; this one's begins after it.
        batch.put_cf(db.cf(CF_RAFT), PURGED_KEY, encode(&at)?);
    }
    db.db.write(batch).map_err(|e| io::Error::other(e.to_string()))?;
    db.db.flush_wal(true).map_err(|e| io::Error::other(e.to_string()))
}

/// What forcing a new cluster kept and dropped.
#[derive(Debug, Clone)]
pub struct ForceSummary {
    pub applied_index: u64,
    /// Entries after the applied ones that the new cluster will commit.
    pub kept_unapplied: u64,
    /// Entries dropped from the first membership change after the applied ones onward.
    pub dropped: u64,
    pub old_members: Vec<u64>,
}

/// Makes the replica in `db` the only member of its cluster (see the module documentation).
pub fn force_new_cluster(db: &Db, id: u64, addr: &str) -> Result<ForceSummary, RecoveryError> {
    let (applied, old) = {
        let sm = db.cf(CF_SM);
        let get = |key: &[u8]| db.db.get_cf(sm, key).map_err(|e| io::Error::other(e.to_string()));
        let applied: Option<Option<LogId>> =
            get(APPLIED_KEY).and_then(|b| b.map(|b| decode(&b)).transpose()).map_err(store_err(db, "reading"))?;
        let old: StoredMembership = get(MEMBERSHIP_KEY)
            .and_then(|b| b.map(|b| decode(&b)).transpose())
            .map_err(store_err(db, "reading"))?
            .unwrap_or_default();
        (applied.flatten(), old)
    };
    let Some(applied) = applied else { return Err(RecoveryError::NothingApplied { dir: db.dir.clone() }) };
    let (mut kept, mut cut_from) = (0u64, None);
    for item in
        db.db.iterator_cf(db.cf(CF_LOGS), IteratorMode::From(&id_key(applied.index() + 1), rocksdb::Direction::Forward))
    {
        let (key, value) =
            item.map_err(|e| io::Error::other(e.to_string())).map_err(store_err(db, "reading the log"))?;
        let entry: Entry = decode(&value).map_err(store_err(db, "reading the log"))?;
        if matches!(entry.payload, EntryPayload::Membership(_)) {
            cut_from = key_id(&key);
            break;
        }
        kept += 1;
    }
    let mut dropped = 0;
    if let Some(from) = cut_from {
        dropped =
            db.db.iterator_cf(db.cf(CF_LOGS), IteratorMode::From(&id_key(from), rocksdb::Direction::Forward)).count()
                as u64;
        delete_log_from(db, from)
            .map_err(|e| io::Error::other(e.to_string()))
            .map_err(store_err(db, "cutting the log"))?;
    }
    let nodes: BTreeMap<u64, ReplicaNode> = [(id, ReplicaNode { addr: addr.to_string() })].into();
    // The vote is kept (terms only go up), and so is the log before `applied`. The membership's log id is the
    // applied entry's: the entry that set the old membership is older, but nothing reads that index back (entries
    // up to `applied` are applied, and snapshots carry the membership).
    stamp(db, applied, Membership::from(nodes), false).map_err(store_err(db, "recording the new membership"))?;
    Ok(ForceSummary {
        applied_index: applied.index(),
        kept_unapplied: kept,
        dropped,
        old_members: old.membership().voter_ids().collect(),
    })
}

#[cfg(test)]
mod tests {
    use drover_state::{Job, Meta};
    use openraft::RaftLogReader;
    use openraft::entry::RaftEntry;
    use openraft::storage::{RaftLogStorage, RaftStateMachine};

    use super::super::db::{CF_JOBS, open_db};
    use super::super::{LogStore, StateMachineStore};
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(openraft::vote::leader_id_adv::CommittedLeaderId::new(term, 1), index)
    }

    fn members(ids: &[u64]) -> Membership<u64, ReplicaNode> {
        Membership::from(
            ids.iter().map(|id| (*id, ReplicaNode { addr: format!("10.0.0.{id}:7100") })).collect::<BTreeMap<_, _>>(),
        )
    }

    /// A data directory as a format-3 build left it: JSON records, applied up to `applied` by a 3-member cluster.
    fn old_cluster_dir(dir: &Path, applied: LogId) -> Db {
        let db = open_db(dir).unwrap();
        let put = |cf: &str, key: &[u8], value: Vec<u8>| db.db.put_cf(db.cf(cf), key, value).unwrap();
        let meta = Meta { format_version: 3, next_job_id: 8, ..Meta::default() };
        put(CF_SM, b"meta", serde_json::to_vec(&meta).unwrap());
        let job =
            Job { id: 7, spec: drover_state::JobSpec { name: "old".into(), ..Default::default() }, ..Job::default() };
        put(CF_JOBS, &id_key(7), serde_json::to_vec(&job).unwrap());
        put(CF_SM, APPLIED_KEY, encode(&Some(applied)).unwrap());
        put(CF_SM, MEMBERSHIP_KEY, encode(&StoredMembership::new(Some(log_id(1, 1)), members(&[1, 2, 3]))).unwrap());
        db
    }

    #[tokio::test]
    async fn a_backup_of_an_older_format_restores_into_a_new_cluster_that_continues_after_it() {
        let tmp = tempfile::tempdir().unwrap();
        let source = old_cluster_dir(&tmp.path().join("old"), log_id(4, 57));
        let taken = tmp.path().join("taken");
        // A checkpoint an earlier backup's crash left behind.
        std::fs::create_dir_all(source.dir.join("backups").join("backup-999-1")).unwrap();
        let summary = write_backup(&source, 1, 1_000, File::create(&taken).unwrap()).unwrap();
        assert_eq!((summary.header.last_log_index, summary.header.last_log_term), (57, 4));
        assert_eq!(summary.header.replicas.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(!source.dir.join("backups").read_dir().unwrap().any(|_| true), "checkpoints, old and new, are removed");
        // As a format-3 build would have labelled it.
        let verified = verify_backup(&taken).unwrap();
        let bytes = std::fs::read(&taken).unwrap();
        let body = &bytes[verified.body_offset as usize..][..verified.body_len as usize];
        let backup = tmp.path().join("format-3.backup");
        let header = BackupHeader { state_format_version: 3, ..verified.header };
        let mut writer = BackupWriter::start(File::create(&backup).unwrap(), &header).unwrap();
        writer.write_all(body).unwrap();
        writer.finish().unwrap();

        let founders: BTreeMap<u64, String> =
            [(4, "10.1.0.4:7100".to_string()), (5, "10.1.0.5:7100".to_string())].into();
        let fresh = open_db(&tmp.path().join("new")).unwrap();
        let restored = restore_backup(&fresh, &backup, &founders).unwrap();
        assert_eq!(restored.header.last_log_index, 57);
        let mut sm = StateMachineStore::open(fresh.clone()).unwrap();
        let view = sm.view();
        assert_eq!(view.read().state.job(7).map(|j| j.spec.name.to_string()), Some("old".to_string()));
        assert_eq!(view.read().state.meta.next_job_id, 8);
        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|a| (a.committed_leader_id().term, a.index())), Some((0, 57)), "term 0: older than any");
        assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), vec![4, 5], "the new founders");
        let mut log = LogStore::new(fresh.clone());
        let state = log.get_log_state().await.unwrap();
        assert_eq!((state.last_purged_log_id, state.last_log_id), (applied, applied), "the log begins after it");
        assert!(sm.get_current_snapshot().await.unwrap().is_some(), "a snapshot to send to founders left empty");
    }

    #[test]
    fn a_restore_refuses_a_data_directory_that_was_part_of_a_cluster_and_a_cluster_without_founders() {
        let tmp = tempfile::tempdir().unwrap();
        let source = old_cluster_dir(&tmp.path().join("old"), log_id(4, 57));
        let backup = tmp.path().join("b");
        write_backup(&source, 1, 1, File::create(&backup).unwrap()).unwrap();
        let founders: BTreeMap<u64, String> = [(1, "10.0.0.1:7100".to_string())].into();
        let err = restore_backup(&source, &backup, &founders).unwrap_err();
        assert!(matches!(err, RecoveryError::NotEmpty { .. }), "{err}");
        assert!(err.to_string().contains("restore only into an empty data directory"), "{err}");
        let fresh = open_db(&tmp.path().join("new")).unwrap();
        let err = restore_backup(&fresh, &backup, &BTreeMap::new()).unwrap_err();
        assert!(matches!(err, RecoveryError::NoFounders), "{err}");
    }

    #[tokio::test]
    async fn a_forced_new_cluster_keeps_its_unapplied_entries_up_to_a_membership_change() {
        let tmp = tempfile::tempdir().unwrap();
        let db = old_cluster_dir(&tmp.path().join("survivor"), log_id(4, 5));
        let mut log = LogStore::new(db.clone());
        let mut batch = rocksdb::WriteBatch::default();
        for index in 3..=9 {
            let entry = if index == 8 {
                Entry::new_membership(log_id(4, index), members(&[1, 2, 3, 4]))
            } else {
                Entry::new_blank(log_id(4, index))
            };
            batch.put_cf(db.cf(CF_LOGS), id_key(index), encode(&entry).unwrap());
        }
        db.db.write(batch).unwrap();
        let forced = force_new_cluster(&db, 2, "10.0.0.2:7100").unwrap();
        assert_eq!((forced.applied_index, forced.kept_unapplied, forced.dropped), (5, 2, 2));
        assert_eq!(forced.old_members, vec![1, 2, 3]);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index()), Some(7), "entries 6 and 7 stay, to be committed");
        assert_eq!(log.try_get_log_entries(6..8).await.unwrap().len(), 2);
        let mut sm = StateMachineStore::open(db.clone()).unwrap();
        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|a| a.index()), Some(5));
        assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), vec![2]);

        let empty = open_db(&tmp.path().join("empty")).unwrap();
        let err = force_new_cluster(&empty, 1, "10.0.0.1:7100").unwrap_err();
        assert!(matches!(err, RecoveryError::NothingApplied { .. }), "{err}");
    }
}
