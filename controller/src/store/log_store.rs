//! The Raft log and vote in RocksDB.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use rocksdb::{Direction, IteratorMode, WriteBatch};

use super::db::{CF_LOGS, CF_RAFT, Db, id_key, key_id};
use super::log_tail::LogTail;
use crate::types::{Entry, LogId, TypeConfig, Vote};

pub(super) const VOTE_KEY: &[u8] = b"vote";
pub(super) const PURGED_KEY: &[u8] = b"last_purged";

/// The most entries one read returns; openraft asks in bounded ranges, this guards against a huge one.
const MAX_READ_ENTRIES: usize = 64 * 1024;

/// Appends waiting for the group fsync; beyond this an append syncs on its own (never blocks the runtime).
const SYNC_QUEUE: usize = 4_096;

#[derive(Clone)]
pub struct LogStore {
    db: Db,
    /// Group commit: appends hand their flush callbacks to one syncing thread (see [`start_wal_syncer`]); none in
    /// the simulation, which syncs inline to stay deterministic.
    syncer: Option<std::sync::mpsc::SyncSender<IOFlushed<TypeConfig>>>,
    /// The newest entries, shared by every clone (the appender and openraft's readers), so that reading back what
    /// was just appended needs no disk read and no decode.
    tail: std::sync::Arc<std::sync::Mutex<LogTail>>,
}

/// Starts the thread that makes appends durable. It takes every callback that queued up while its previous fsync
/// ran and covers them all with one more: an fsync costs the same for one entry or a hundred, so under load the
/// appends of many concurrent proposals (and, on a follower, many replication batches) share each one, instead
/// of queueing one fsync each behind RocksDB's WAL lock. It ends when the last `LogStore` clone is gone. It holds
/// the database only while it syncs: the replica's owners close it, not this thread (a close racing the
/// process's exit on this thread crashed the simulation's test binary).
fn start_wal_syncer(db: std::sync::Weak<rocksdb::DB>) -> std::sync::mpsc::SyncSender<IOFlushed<TypeConfig>> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<IOFlushed<TypeConfig>>(SYNC_QUEUE);
    std::thread::Builder::new()
        .name("wal-sync".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut waiting = vec![first];
                waiting.extend(rx.try_iter().take(SYNC_QUEUE));
                // Every callback in `waiting` belongs to an append already written: this fsync covers all of them.
                let result = match db.upgrade() {
                    Some(db) => db.flush_wal(true).map_err(|e| io_err("syncing the log", e)),
                    None => Err(io_err("syncing the log", "the database is closed")),
                };
                for callback in waiting {
                    let result = result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
                    callback.io_completed(result);
                }
            }
        })
        .expect("starting the log sync thread");
    tx
}

fn io_err(context: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{context}: {e}"))
}

/// Stored entries and metadata in the binary codec (older JSON ones still read).
pub(super) fn encode<T: serde::Serialize>(value: &T) -> io::Result<Vec<u8>> {
    drover_state::codec::encode(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    drover_state::codec::decode(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Deletes every log entry at `from` and after.
pub(super) fn delete_log_from(db: &Db, from: u64) -> Result<(), rocksdb::Error> {
    let cf = db.cf(CF_LOGS);
    db.db
        .delete_range_cf(cf, id_key(from), id_key(u64::MAX))
        // Deleting the key u64::MAX itself, which delete_range's exclusive end leaves.
        .and_then(|()| db.db.delete_cf(cf, id_key(u64::MAX)))
}

impl LogStore {
    pub fn new(db: Db) -> LogStore {
        let syncer = (!crate::runtime::is_simulated()).then(|| start_wal_syncer(std::sync::Arc::downgrade(&db.db)));
        LogStore { db, syncer, tail: Default::default() }
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, LogTail> {
        self.tail.lock().expect("log tail poisoned")
    }

    fn get<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        let raw = self.db.db.get_cf(self.db.cf(CF_RAFT), key).map_err(|e| io_err("reading raft metadata", e))?;
        raw.map(|b| decode(&b)).transpose()
    }

    fn put<T: serde::Serialize>(&self, key: &[u8], value: &T) -> io::Result<()> {
        let bytes = encode(value)?;
        self.db.db.put_cf(self.db.cf(CF_RAFT), key, bytes).map_err(|e| io_err("writing raft metadata", e))
    }

    /// Syncs the write-ahead log on a blocking thread (fsync must not stall the runtime).
    async fn sync(&self) -> io::Result<()> {
        let db = self.db.db.clone();
        crate::runtime::run_blocking(move || db.flush_wal(true))
            .await
            .map_err(|e| io_err("sync task", e))?
            .map_err(|e| io_err("syncing the write-ahead log", e))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => *x + 1,
            Bound::Unbounded => 0,
        };
        if let Some(entries) = self.tail().read(start, MAX_READ_ENTRIES, |index| range.contains(&index)) {
            return Ok(entries);
        }
        let mut entries = Vec::new();
        let iter = self.db.db.iterator_cf(self.db.cf(CF_LOGS), IteratorMode::From(&id_key(start), Direction::Forward));
        for item in iter {
            let (key, value) = item.map_err(|e| io_err("reading the log", e))?;
            let index = key_id(&key).ok_or_else(|| io_err("reading the log", "malformed key"))?;
            if !range.contains(&index) || entries.len() >= MAX_READ_ENTRIES {
                break;
            }
            let entry: Entry = decode(&value)?;
            assert_eq!(entry.index(), index, "log entry stored under the wrong index");
            entries.push(entry);
        }
        Ok(entries)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        self.get(VOTE_KEY)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId> = self.get(PURGED_KEY)?;
        let last = self.db.db.iterator_cf(self.db.cf(CF_LOGS), IteratorMode::End).next();
        let last_log_id = match last {
            None => last_purged_log_id,
            Some(item) => {
                let (_, value) = item.map_err(|e| io_err("reading the log", e))?;
                let entry: Entry = decode(&value)?;
                Some(entry.log_id())
            }
        };
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.put(VOTE_KEY, vote)?;
        // A vote must be on disk before it is granted: otherwise a restart could vote twice in one term.
        self.sync().await
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
    {
        let mut batch = WriteBatch::default();
        let cf = self.db.cf(CF_LOGS);
        let mut written = Vec::new();
        for entry in entries {
            let value = encode(&entry)?;
            batch.put_cf(cf, id_key(entry.index()), &value);
            written.push((entry, value.len()));
        }
        // Written (readable) now; acknowledged to openraft only once fsynced. The tail's lock is held across the
        // write so that no reader sees the tail and the stored log disagree.
        let mut tail = self.tail();
        if let Err(e) = self.db.db.write(batch) {
            // Whatever part of the batch reached the log is unknown here: the disk answers reads from now on.
            tail.clear();
            return Err(io_err("appending to the log", e));
        }
        tail.appended(written);
        drop(tail);
        // Not awaited: the append returns while the fsync runs, and the callback tells openraft when it is done.
        // Simulated runs sync inline (deterministic); a full queue falls back to a sync of its own.
        let callback = match &self.syncer {
            None => callback,
            Some(syncer) => match syncer.try_send(callback) {
                Ok(()) => return Ok(()),
                Err(
                    std::sync::mpsc::TrySendError::Full(callback)
                    | std::sync::mpsc::TrySendError::Disconnected(callback),
                ) => callback,
            },
        };
        let db = self.db.db.clone();
        crate::runtime::spawn_blocking_detached(move || {
            let result = db.flush_wal(true).map_err(|e| io_err("syncing the log", e));
            callback.io_completed(result);
        });
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map(|id| id.index() + 1).unwrap_or(0);
        let mut tail = self.tail();
        tail.truncate_from(from);
        let result = delete_log_from(&self.db, from);
        if result.is_err() {
            // The disk may still hold entries past the truncation: only it can answer reads now.
            tail.clear();
        }
        result.map_err(|e| io_err("truncating the log", e))
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        // Record the purge point first: entries at or before it are ignored even if deletion is cut short.
        self.put(PURGED_KEY, &log_id)?;
        self.tail().purge_through(log_id.index());
        self.db
            .db
            .delete_range_cf(self.db.cf(CF_LOGS), id_key(0), id_key(log_id.index() + 1))
            .map_err(|e| io_err("purging the log", e))
    }
}
