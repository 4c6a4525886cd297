//! The openraft type configuration: what our log entries carry and how replicas are named.

use serde::{Deserialize, Serialize};

/// A replica as the membership config records it: its id is the key, this is the value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReplicaNode {
    /// The `host:port` every other replica and client uses to reach this one (gRPC).
    pub addr: String,
}

impl std::fmt::Display for ReplicaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.addr)
    }
}

openraft::declare_raft_types!(
    /// Drover's Raft: entries carry a `drover_state::Request`, `apply` answers a `drover_state::Response`.
    pub TypeConfig:
        D = drover_state::Request,
        R = drover_state::Response,
        NodeId = u64,
        Node = ReplicaNode,
        // Tokio, with openraft's RNG seedable for the deterministic simulation (see `runtime`).
        AsyncRuntime = crate::runtime::DroverRuntime,
);

pub type Raft = openraft::Raft<TypeConfig, crate::store::StateMachineStore>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
