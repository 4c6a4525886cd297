//! The simulated replica-to-replica network: openraft's messages, serialized to JSON as the gRPC transport
//! does (so a serde bug shows here too), delivered to the target replica's real `Raft` after a seeded delay, or
//! lost, or refused by a partition or a crashed target.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_controller::network::SnapshotHeader;
use drover_controller::store::{SnapshotFile, StateView};
use drover_controller::types::{Raft, ReplicaNode, SnapshotMeta, TypeConfig, Vote};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::trace::Trace;
use crate::history::{Event, EventKind};

/// A live replica as the network and the drivers reach it.
pub struct Replica {
    pub raft: Raft,
    /// The replica's write path (batches proposals), as the real controller's.
    pub proposer: drover_controller::propose::Proposer,
    pub view: StateView,
    /// The leader's side of the agent protocol: heartbeats, leases, silent nodes declared down.
    pub hub: Arc<drover_controller::leader::agents::AgentHub>,
    /// The replica's background duties (scheduling loop, leader duties): aborted when it crashes.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Link conditions; the fault schedule changes them.
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    /// Directed links that deliver nothing (a symmetric partition blocks both directions).
    pub blocked: BTreeSet<(u64, u64)>,
    /// Each message (request or reply) is lost with this probability, in thousandths.
    pub loss_permille: u32,
    /// Agents (node names) that reach no replica: their heartbeats and reports are lost.
    pub agents_cut: BTreeSet<String>,
    /// Links a node-return drill blocks (kept apart from `blocked`, so that an ordinary fault healing the same
    /// link does not end the drill's partition early).
    pub drill_blocked: BTreeSet<(u64, u64)>,
    /// While a node-return drill runs, the ordinary schedule starts no replica fault: the leader must stay long
    /// enough for the cut-off node to be declared down.
    pub drill_running: bool,
    /// One-way delays are uniform in 0..=max_delay_ms; differing delays reorder messages.
    pub max_delay_ms: u64,
}

/// Everything the simulated network shares: the live replicas, the link conditions, the seeded RNG, the trace.
pub struct NetState {
    pub replicas: BTreeMap<u64, Replica>,
    pub data_dirs: BTreeMap<u64, PathBuf>,
    pub conditions: Conditions,
    rng: SmallRng,
    pub trace: Trace,
    /// What the simulated clients and agents saw, in order, for the checker.
    pub events: Vec<Event>,
    pub delivered: u64,
    pub lost: u64,
    pub snapshots_received: u64,
    pub reregistrations: u64,
    /// Quarantined nodes the simulated operator resumed.
    pub quarantines_resumed: u64,
    /// The cluster configuration every replica's leader duties commit.
    pub cluster: drover_state::ClusterConfig,
}

pub type Net = Arc<Mutex<NetState>>;

pub fn new_net(seed: u64, data_dirs: BTreeMap<u64, PathBuf>, conditions: Conditions) -> Net {
    Arc::new(Mutex::new(NetState {
        replicas: BTreeMap::new(),
        data_dirs,
        conditions,
        // A different stream from the workload's and the faults', so adding a fault kind does not reshuffle
        // every message delay.
        rng: SmallRng::seed_from_u64(seed ^ 0x6e65_7477_6f72_6b00),
        trace: Trace::default(),
        events: Vec::new(),
        delivered: 0,
        lost: 0,
        snapshots_received: 0,
        quarantines_resumed: 0,
        cluster: drover_state::ClusterConfig::default(),
        reregistrations: 0,
    }))
}

pub fn lock(net: &Net) -> std::sync::MutexGuard<'_, NetState> {
    net.lock().expect("sim network lock poisoned")
}

/// What happens to one message.
enum Fate {
    Deliver { delay_ms: u64 },
    Lose,
}

impl NetState {
    /// Records what a client, agent or the fault schedule saw, in the history and the trace.
    pub fn event(&mut self, kind: EventKind) {
        let at_ms = self.trace.now_us() / 1_000;
        let json = serde_json::to_string(&kind).expect("events serialize");
        self.trace.record(format_args!("event {json}"), &[]);
        self.events.push(Event { at_ms, kind });
    }

    fn fate(&mut self, from: u64, to: u64) -> Fate {
        let c = &self.conditions;
        let blocked = c.blocked.contains(&(from, to)) || c.drill_blocked.contains(&(from, to));
        let (loss, max_delay) = (c.loss_permille, c.max_delay_ms);
        // Draw both numbers always, so the RNG stream does not depend on the conditions' branches.
        let roll: u32 = self.rng.random_range(0..1000);
        let delay_ms = self.rng.random_range(0..=max_delay);
        if blocked || roll < loss {
            self.lost += 1;
            Fate::Lose
        } else {
            Fate::Deliver { delay_ms }
        }
    }
}

/// The factory openraft asks for one client per peer.
#[derive(Clone)]
pub struct SimNetwork {
    pub from: u64,
    pub net: Net,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = SimPeer;

    async fn new_client(&mut self, target: u64, _node: &ReplicaNode) -> SimPeer {
        SimPeer { from: self.from, to: target, net: self.net.clone() }
    }
}

pub struct SimPeer {
    from: u64,
    to: u64,
    net: Net,
}

fn unreachable(message: String) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::from_string(message))
}

impl SimPeer {
    /// Carries one message over the simulated link: decides its fate, waits its delay, and hands the target's
    /// `Raft` the decoded message. A lost message costs the sender its whole timeout, as a silent TCP peer does.
    async fn hop(
        &self,
        from: u64,
        to: u64,
        kind: &str,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<Raft, RPCError<TypeConfig>> {
        let fate = lock(&self.net).fate(from, to);
        match fate {
            Fate::Lose => {
                tokio::time::sleep(ttl).await;
                Err(unreachable(format!("{kind} {from}->{to} lost")))
            }
            Fate::Deliver { delay_ms } => {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                let mut net = lock(&self.net);
                // The target may have crashed, or the link been cut, while the message was in flight.
                if net.conditions.blocked.contains(&(from, to)) || net.conditions.drill_blocked.contains(&(from, to)) {
                    net.lost += 1;
                    return Err(unreachable(format!("{kind} {from}->{to} cut in flight")));
                }
                let Some(replica) = net.replicas.get(&to) else {
                    return Err(unreachable(format!("replica {to} is down")));
                };
                let raft = replica.raft.clone();
                net.delivered += 1;
                net.trace.record(format_args!("deliver {kind} {from}->{to}"), bytes);
                Ok(raft)
            }
        }
    }

    /// One request and its reply, each crossing the network as JSON.
    async fn call<Req, Resp, E, F, Fut>(
        &self,
        kind: &str,
        rpc: Req,
        ttl: Duration,
        handle: F,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize + DeserializeOwned,
        Resp: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(Raft, Req) -> Fut,
        Fut: Future<Output = Result<Resp, E>>,
    {
        let exchange = async {
            let request = serde_json::to_vec(&rpc).expect("openraft requests serialize");
            let target = self.hop(self.from, self.to, kind, &request, ttl).await?;
            let decoded: Req = serde_json::from_slice(&request).expect("openraft requests round-trip through JSON");
            let response = handle(target, decoded)
                .await
                .map_err(|e| RPCError::Network(NetworkError::from_string(format!("replica {}: {e}", self.to))))?;
            let reply = serde_json::to_vec(&response).expect("openraft replies serialize");
            self.hop(self.to, self.from, &format!("{kind}-reply"), &reply, ttl).await?;
            Ok(serde_json::from_slice(&reply).expect("openraft replies round-trip through JSON"))
        };
        match tokio::time::timeout(ttl, exchange).await {
            Ok(result) => result,
            Err(_) => Err(unreachable(format!("{kind} {}->{} timed out", self.from, self.to))),
        }
    }

    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let network = |e: &dyn std::fmt::Display| StreamingError::Network(NetworkError::from_string(e.to_string()));
        let header = SnapshotHeader { vote, meta: snapshot.meta.clone() };
        let header = serde_json::to_vec(&header).expect("snapshot headers serialize");
        let mut data = Vec::new();
        snapshot.snapshot.write_to(&mut data).map_err(|e| network(&e))?;
        let ttl = Duration::from_millis(SNAPSHOT_TIMEOUT_MS);
        let target = self.hop(self.from, self.to, "snapshot", &data, ttl).await.map_err(|e| network(&e))?;
        let header: SnapshotHeader = serde_json::from_slice(&header).expect("snapshot headers round-trip");
        let path = {
            let mut net = lock(&self.net);
            net.snapshots_received += 1;
            let dir = net.data_dirs[&self.to].join("snapshots");
            dir.join(format!("recv-sim-{}.part", net.snapshots_received))
        };
        std::fs::write(&path, &data).map_err(|e| network(&e))?;
        let meta: SnapshotMeta = header.meta;
        let snapshot =
            openraft::alias::SnapshotOf::<TypeConfig, SnapshotFile> { meta, snapshot: SnapshotFile { path } };
        let response = target.install_full_snapshot(header.vote, snapshot).await.map_err(|e| network(&e))?;
        let reply = serde_json::to_vec(&response).expect("snapshot replies serialize");
        self.hop(self.to, self.from, "snapshot-reply", &reply, ttl).await.map_err(|e| network(&e))?;
        Ok(serde_json::from_slice(&reply).expect("snapshot replies round-trip"))
    }
}

/// The longest a simulated snapshot transfer may take (the real transport allows minutes for huge states).
const SNAPSHOT_TIMEOUT_MS: u64 = 10_000;

impl RaftNetworkV2<TypeConfig> for SimPeer {
    type SnapshotData = SnapshotFile;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("append", rpc, option.hard_ttl(), |raft, rpc| async move { raft.append_entries(rpc).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", rpc, option.hard_ttl(), |raft, rpc| async move { raft.vote(rpc).await }).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("pre_vote", rpc, option.hard_ttl(), |raft, rpc| async move { raft.pre_vote(rpc).await }).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = self.send_snapshot(vote, snapshot) => result,
        }
    }
}
