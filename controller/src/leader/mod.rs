//! What a replica does only while it leads: the agents' sessions and liveness (`agents`), the scheduling loop
//! (`scheduling`, with `planner` translating between the replicated state and the scheduler library), and
//! committing the cluster configuration once. Everything here writes through [`crate::propose`], like the
//! client API, and stands down when leadership moves.

pub mod agents;
pub mod placement;
pub mod planner;
pub mod scheduling;

use std::time::Duration;

use drover_state::Command;
use openraft::async_runtime::WatchReceiver;

use crate::propose::Proposer;
use crate::store::StateView;

/// While this replica leads: commit the cluster configuration if none is committed yet. Public for the
/// deterministic simulation, which assembles replicas without the gRPC server.
pub async fn leader_duties(proposer: Proposer, view: StateView, id: u64, cluster: drover_state::ClusterConfig) {
    let mut metrics = proposer.raft().metrics();
    loop {
        let is_leader = metrics.borrow_watched().current_leader == Some(id);
        if is_leader && view.read().state.config().is_none() {
            let command = Command::InitCluster { config: cluster.clone() };
            if let Err(e) = crate::propose::propose(&proposer, command).await {
                tracing::warn!("committing the cluster configuration failed: {}", e.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            continue;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
