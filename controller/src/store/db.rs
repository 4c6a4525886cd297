//! Opening the RocksDB, its column families, and the on-disk format version.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DB, Options};
use thiserror::Error;

/// Column families. Changing their meaning requires a new `drover_state::FORMAT_VERSION`.
pub const CF_RAFT: &str = "raft"; // vote, last purged log id, format version
pub const CF_LOGS: &str = "logs"; // log index (u64 BE) -> entry
pub const CF_SM: &str = "sm"; // applied log id, membership, drover meta, install marker
pub const CF_JOBS: &str = "jobs"; // active job id (u64 BE) -> Job
pub const CF_SCRIPTS: &str = "scripts"; // job id -> script text
pub const CF_HISTORY: &str = "history"; // finished job id -> Job (accounting, read by sacct)
pub const CF_DEDUP: &str = "dedup"; // client request id -> (seq, job id)
pub const CF_NODES: &str = "nodes"; // node name -> Node
pub const CF_OBJECTS: &str = "objects"; // "account/NAME", "qos/NAME", "reservation/NAME", "role/UID" -> Object
pub const CF_AUDIT: &str = "audit"; // audit entry id (u64 BE) -> AuditEntry (format 3)
pub const CF_ENVIRONMENTS: &str = "environments"; // job id -> submit environment, [(name, value)] (format 5)

/// The state machine's column families, in snapshot order (new families go last, so older snapshots still
/// number theirs the same way).
pub const SM_FAMILIES: [&str; 9] =
    [CF_SM, CF_JOBS, CF_SCRIPTS, CF_HISTORY, CF_DEDUP, CF_NODES, CF_OBJECTS, CF_AUDIT, CF_ENVIRONMENTS];
/// Families a snapshot checkpointed by an older build may lack (it was built before they existed): they are
/// empty there.
pub const FAMILIES_SINCE_FORMAT_5: [&str; 1] = [CF_ENVIRONMENTS];

const FORMAT_KEY: &[u8] = b"format_version";
/// The memtables of all families together: memory every replica holds at its busiest, on top of the state
/// (128 MiB was an eighth of a replica at a million jobs). At 5,000 submissions/s, about 3 MB/s of writes, a
/// flush comes every ten seconds or so, in the background.
const DB_WRITE_BUFFER_BYTES: usize = 32 << 20;
/// The write-ahead log, across all families.
const MAX_WAL_BYTES: u64 = 256 << 20;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot open the data directory {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error(
        "the data directory {path} holds format version {found}; this build reads version {expected}. Upgrade or move the directory away."
    )]
    Format { path: PathBuf, found: String, expected: u32 },
    #[error("data in {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
}

/// A shared handle to the replica's database and where it lives (for error messages and snapshot files).
#[derive(Clone)]
pub struct Db {
    pub db: Arc<DB>,
    pub dir: PathBuf,
}

impl Db {
    pub fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        // Every family is created at open; a missing one is a programming error, not bad input.
        self.db.cf_handle(name).unwrap_or_else(|| panic!("column family {name} missing"))
    }

    pub fn snapshot_dir(&self) -> PathBuf {
        self.dir.join("snapshots")
    }

    /// Writes every family's memtable to its files and syncs them, so that the next start has no write-ahead log
    /// to replay (up to `MAX_WAL_BYTES`: more than a second at a million jobs). For a clean shutdown, after the
    /// last write; a crash still recovers from the log.
    pub fn flush_all(&self) -> Result<(), rocksdb::Error> {
        for name in [CF_RAFT, CF_LOGS].into_iter().chain(SM_FAMILIES) {
            self.db.flush_cf(self.cf(name))?;
        }
        Ok(())
    }
}

/// Opens (or creates) the database under `dir/db`, checking the format version.
pub fn open_db(dir: &Path) -> Result<Db, StoreError> {
    let open_err = |message: String| StoreError::Open { path: dir.to_path_buf(), message };
    std::fs::create_dir_all(dir.join("snapshots")).map_err(|e| open_err(e.to_string()))?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Two cores: keep background work small and predictable.
    opts.increase_parallelism(2);
    opts.set_max_background_jobs(2);
    // Bounds on memory and on restart: all families' memtables together stay under DB_WRITE_BUFFER_BYTES (by
    // default each of the ten could hold 128 MiB), and the write-ahead log is cut at MAX_WAL_BYTES by flushing
    // the families that still pin old log files (RocksDB's default lets it reach four times all memtables,
    // several GiB, and all of it is replayed at the next start).
    opts.set_db_write_buffer_size(DB_WRITE_BUFFER_BYTES);
    opts.set_max_total_wal_size(MAX_WAL_BYTES);
    let families = [CF_RAFT, CF_LOGS]
        .into_iter()
        .chain(SM_FAMILIES)
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db_path = dir.join("db");
    let db = DB::open_cf_descriptors(&opts, &db_path, families).map_err(|e| open_err(e.to_string()))?;
    let db = Db { db: Arc::new(db), dir: dir.to_path_buf() };
    check_format(&db)?;
    Ok(db)
}

fn check_format(db: &Db) -> Result<(), StoreError> {
    let expected = drover_state::FORMAT_VERSION;
    let cf = db.cf(CF_RAFT);
    let found = db
        .db
        .get_cf(cf, FORMAT_KEY)
        .map_err(|e| StoreError::Corrupt { path: db.dir.clone(), message: e.to_string() })?;
    match found {
        None => {
            // A fresh directory: stamp it (synced) before anything else is written.
            db.db
                .put_cf(cf, FORMAT_KEY, expected.to_be_bytes())
                .and_then(|_| db.db.flush_wal(true))
                .map_err(|e| StoreError::Open { path: db.dir.clone(), message: e.to_string() })
        }
        Some(bytes) if bytes.as_slice() == expected.to_be_bytes() => Ok(()),
        Some(bytes) if drover_state::READABLE_FORMAT_VERSIONS.iter().any(|v| bytes.as_slice() == v.to_be_bytes()) => {
            // An older format this build upgrades in place: the families it lacks were created at open.
            db.db
                .put_cf(cf, FORMAT_KEY, expected.to_be_bytes())
                .and_then(|_| db.db.flush_wal(true))
                .map_err(|e| StoreError::Open { path: db.dir.clone(), message: e.to_string() })
        }
        Some(bytes) => Err(StoreError::Format { path: db.dir.clone(), found: format!("{bytes:?}"), expected }),
    }
}

pub fn id_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

pub fn key_id(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}
