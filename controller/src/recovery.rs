//! `drover-controller`'s offline recovery commands. Each works on a stopped replica's data directory, says what it
//! did, and exits; the replica is then started as usual. Being one-shot (like `etcdutl snapshot restore`) keeps a
//! service manager that restarts the replica with the same command line from repeating them.

use std::path::Path;

use crate::config::ControllerConfig;
use crate::store::{ForceSummary, RecoveryError, RestoreSummary, open_db};

/// `--restore FILE`: fills this replica's empty data directory from a backup, as a founder of the cluster its
/// `initial_members` name.
pub fn restore(config: &ControllerConfig, file: &Path) -> Result<RestoreSummary, RecoveryError> {
    let db = open_db(&config.data_dir)?;
    let summary = crate::store::restore_backup(&db, file, &config.initial_members);
    let _ = db.flush_all();
    summary
}

/// `--force-new-cluster`: makes this replica the only member of its cluster, keeping everything it holds.
pub fn force_new_cluster(config: &ControllerConfig) -> Result<ForceSummary, RecoveryError> {
    let db = open_db(&config.data_dir)?;
    let addr = config.advertise.clone().unwrap_or_else(|| config.listen.clone());
    let summary = crate::store::force_new_cluster(&db, config.id, &addr);
    let _ = db.flush_all();
    summary
}
