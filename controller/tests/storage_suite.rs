//! openraft's own storage test suite, run against our RocksDB log store and state machine.

use drover_controller::store::{LogStore, StateMachineStore, open_db};
use drover_controller::types::TypeConfig;
use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open_db(dir.path()).expect("open db");
        let sm = StateMachineStore::open(db.clone()).expect("open state machine");
        Ok((dir, LogStore::new(db), sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes_on_rocksdb() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(RocksBuilder).await?;
    Ok(())
}
