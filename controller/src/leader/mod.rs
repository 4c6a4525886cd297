//! What a replica does only while it leads: the agents' sessions and liveness (`agents`), the scheduling loop
//! (`scheduling`, with `planner` translating between the replicated state and the scheduler library), and
//! committing the cluster configuration once. Everything here writes through [`crate::propose`], like the
//! client API, and stands down when leadership moves.

pub mod agents;
pub mod hangs;
pub mod placement;
pub mod planner;
pub mod scheduling;
pub mod shallow;

use std::sync::Arc;
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

/// What the client API and the HTTP pages may ask of the leader's machinery, and no more: signals go to the
/// agents directly (not through the log), the latest scheduling pass's priorities and expected starts, `sshare`'s
/// rows, and the figures `/metrics` shows. The API holds this handle, never the sessions or the loop themselves.
#[derive(Clone)]
pub struct LeaderHandle {
    hub: Arc<agents::AgentHub>,
    insights: scheduling::Insights,
}

impl LeaderHandle {
    pub fn new(hub: Arc<agents::AgentHub>, insights: scheduling::Insights) -> LeaderHandle {
        LeaderHandle { hub, insights }
    }

    /// Sends a signal to the job's tasks on every node of it that has a session with this replica.
    pub fn signal(&self, job: &drover_state::Job, signal: i32, target: drover_proto::wire::SignalTarget) {
        self.hub.signal(job, signal, target);
    }

    /// The agents with a session here: node, build version, feature level understood.
    pub fn agent_versions(&self) -> Vec<(String, String, u32)> {
        self.hub.agent_versions()
    }

    /// The latest pass's priorities and expected starts (empty on a replica that does not lead).
    pub fn insights(&self) -> std::sync::RwLockReadGuard<'_, scheduling::InsightTable> {
        self.insights.latest()
    }

    /// `sshare`'s rows from the replicated state, computed as the scheduler computes fair share.
    pub fn share_rows(&self, view: &StateView, now_ms: u64) -> Vec<drover_proto::wire::ShareRow> {
        planner::share_rows(|_, walk| walk(&view.read().state), now_ms, crate::store::JOBS_PER_READ)
    }

    pub fn session_count(&self) -> usize {
        self.hub.session_count()
    }

    pub fn heartbeats(&self) -> u64 {
        self.hub.heartbeats()
    }

    pub fn pass_seconds(&self) -> &drover_observe::prometheus_client::metrics::histogram::Histogram {
        self.insights.pass_seconds()
    }

    pub fn shallow_pass_seconds(&self) -> &drover_observe::prometheus_client::metrics::histogram::Histogram {
        self.insights.shallow_pass_seconds()
    }
}
