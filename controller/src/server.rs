//! Assembles one controller replica: storage, Raft, the gRPC server, and the leader's background duties.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use drover_proto::v1::ClusterStatusRequest;
use drover_proto::v1::agent_gateway_server::AgentGatewayServer;
use drover_proto::v1::drover_service_client::DroverServiceClient;
use drover_proto::v1::drover_service_server::DroverServiceServer;
use drover_proto::v1::raft_service_server::RaftServiceServer;
use openraft::async_runtime::WatchReceiver;
use thiserror::Error;
use tokio::sync::watch;

use crate::api::Api;
use crate::config::ControllerConfig;
use crate::leader::agents::{AgentHub, Gateway};
use crate::leader::leader_duties;
use crate::network::Network;
use crate::raft_service::RaftServer;
use crate::security::require_peer;
use crate::store::{LogStore, StateMachineStore, StateView, open_db};
use crate::types::{Raft, ReplicaNode};
use drover_auth::tls::RoleKind;
use tonic::service::interceptor::InterceptedService;

/// Largest gRPC message accepted: a 4 MiB script plus its environment and JSON overhead.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot open the state machine in {path}: {message}")]
    StateMachine { path: String, message: String },
    #[error("invalid raft settings: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    #[error("raft failed to start: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
}

/// A running replica.
/// How long a leader stopping on purpose waits for its handover to take effect before it stops anyway.
const SHUTDOWN_HANDOVER_WAIT_MS: u64 = 2_000;

pub struct Controller {
    pub id: u64,
    pub raft: Raft,
    pub view: StateView,
    pub addr: SocketAddr,
    /// Where `/metrics` and the web page are served, when `http_listen` is set.
    pub http_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    db: crate::store::Db,
    /// `raft.preferred_leaders`: who a leader stopping on purpose hands over to first.
    preferred_leaders: Vec<u64>,
}

/// Opens the data directory and loads the state machine from it, saying how long each took.
fn open_state(config: &ControllerConfig) -> Result<(crate::store::Db, StateMachineStore), StartError> {
    let started = std::time::Instant::now();
    let db = open_db(&config.data_dir)?;
    let opened_ms = started.elapsed().as_millis();
    let sm = StateMachineStore::open(db.clone()).map_err(|e| StartError::StateMachine {
        path: config.data_dir.display().to_string(),
        message: e.to_string(),
    })?;
    tracing::info!(
        opened_ms,
        loaded_ms = started.elapsed().as_millis() - opened_ms,
        active_jobs = sm.view().read().state.jobs.len(),
        "data directory opened and the state loaded"
    );
    Ok((db, sm))
}

/// Serves Raft, the agents' gateway and the client API on the replica's port, over mutual TLS, until shutdown.
fn serve_grpc(
    listener: tokio::net::TcpListener,
    security: &crate::security::Security,
    raft_server: RaftServer,
    hub: Arc<AgentHub>,
    api: Arc<Api>,
    mut shutdown_rx: watch::Receiver<bool>,
) {
    // Only controllers speak Raft and only agents open agent sessions: a client certificate is refused
    // there before any message is decoded.
    let raft_service = RaftServiceServer::new(raft_server).max_decoding_message_size(256 << 20);
    let gateway = AgentGatewayServer::new(Gateway(hub))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(256 << 20);
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // Bound concurrent streams per connection so one client cannot hog a replica.
        .max_concurrent_streams(1024)
        .add_service(InterceptedService::new(raft_service, require_peer(RoleKind::Controller)))
        .add_service(InterceptedService::new(gateway, require_peer(RoleKind::Agent)))
        .add_service(
            DroverServiceServer::from_arc(api)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(256 << 20),
        );
    // Mutual TLS on every connection (the accept loop also sets TCP_NODELAY on accepted sockets).
    let incoming = drover_auth::tls::incoming(listener, security.server_tls.clone());
    tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown_rx.wait_for(|s| *s).await;
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
            tracing::error!("gRPC server stopped: {e}");
        }
    });
}

impl Controller {
    pub async fn start(config: ControllerConfig) -> Result<Controller, StartError> {
        let (db, sm) = open_state(&config)?;
        let view = sm.view();
        // After the data directory (whose problems are the more urgent to report), before anything listens.
        let security = crate::security::Security::load(&config.security)?;
        let raft_config = Arc::new(config.openraft_config()?);
        let listen: SocketAddr = config.listen.parse().map_err(|e: std::net::AddrParseError| StartError::Listen {
            addr: config.listen.clone(),
            message: e.to_string(),
        })?;
        let local_ip = Some(listen.ip()).filter(|ip| !ip.is_unspecified());
        let network = Network { local_ip, security: security.clone() };
        let raft = Raft::new(config.id, raft_config, network, LogStore::new(db.clone()), sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| StartError::Listen { addr: config.listen.clone(), message: e.to_string() })?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Listen { addr: config.listen.clone(), message: e.to_string() })?;
        let (shutdown, shutdown_rx) = watch::channel(false);

        let heard = crate::leader_watch::LastHeard::default();
        let raft_server = RaftServer {
            raft: raft.clone(),
            snapshot_dir: db.snapshot_dir(),
            received: AtomicU64::new(0),
            heard: heard.clone(),
        };
        // One write path per replica: every writer's proposals are batched together.
        let proposer = crate::propose::Proposer::new(raft.clone());
        let hub = AgentHub::new(
            config.id,
            proposer.clone(),
            view.clone(),
            config.agents.clone(),
            config.raft.election_timeout_min_ms,
        );
        let insights = crate::leader::scheduling::Insights::default();
        let api = Arc::new(Api::new(
            config.id,
            proposer.clone(),
            view.clone(),
            local_ip,
            crate::leader::LeaderHandle::new(hub.clone(), insights.clone()),
            security.clone(),
        ));
        // Bound before the gRPC port starts serving, so a taken port fails the start with a clear error.
        let http_listener = match &config.http_listen {
            Some(addr) => Some(
                drover_observe::http::bind(addr)
                    .await
                    .map_err(|e| StartError::Listen { addr: addr.clone(), message: e.to_string() })?,
            ),
            None => None,
        };
        serve_grpc(listener, &security, raft_server, hub.clone(), api.clone(), shutdown_rx);

        let http_addr = match http_listener {
            Some(listener) => {
                let addr = listener.local_addr().ok();
                let web: Arc<dyn drover_observe::http::Handler> = crate::http::Web::new(api.clone());
                tokio::spawn(drover_observe::http::serve(listener, web, shutdown.subscribe()));
                addr
            }
            None => None,
        };
        tokio::spawn(bootstrap(raft.clone(), config.id, config.initial_members.clone(), security.clone()));
        tokio::spawn(crate::leader_watch::watch(raft.clone(), config.id, heard, config.raft.clone()));
        tokio::spawn(crate::leader::placement::prefer_leaders(
            raft.clone(),
            config.id,
            config.raft.preferred_leaders.clone(),
            config.raft.preferred_leader_hold_ms,
        ));
        tokio::spawn(leader_duties(proposer.clone(), view.clone(), config.id, config.cluster.clone()));
        tokio::spawn(crate::leader::agents::leader_loops(hub));
        tokio::spawn(crate::leader::scheduling::scheduling_loop(proposer, view.clone(), config.id, insights));
        #[cfg(feature = "raft-stats")]
        tokio::spawn(log_raft_stats(raft.clone(), config.id));
        tracing::info!(id = config.id, %addr, ?http_addr, data_dir = %config.data_dir.display(), "controller replica started");
        let preferred_leaders = config.raft.preferred_leaders.clone();
        Ok(Controller { id: config.id, raft, view, addr, http_addr, shutdown, db, preferred_leaders })
    }

    /// Resolves when Raft stops on a fatal error (a failed disk write, say), with that error.
    pub async fn fatal(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(e) = &metrics.borrow_watched().running_state {
                return e.to_string();
            }
            if metrics.changed().await.is_err() {
                return "raft stopped".to_string();
            }
        }
    }

    pub async fn shutdown(self) {
        // A leader stopping on purpose (an upgrade, a restart) hands over first: the cluster then elects nobody
        // by timeout, and agents renew their leases with the new leader well inside `fence_after_ms`.
        crate::leader::placement::hand_over_before_stopping(
            &self.raft,
            self.id,
            &self.preferred_leaders,
            SHUTDOWN_HANDOVER_WAIT_MS,
        )
        .await;
        let _ = self.shutdown.send(true);
        let _ = self.raft.shutdown().await;
        // Raft has stopped writing: the memtables go to disk now, so that the next start replays no log.
        let (db, started) = (self.db, std::time::Instant::now());
        match crate::runtime::run_blocking(move || db.flush_all()).await {
            Ok(Ok(())) => tracing::info!(took_ms = started.elapsed().as_millis() as u64, "flushed the database"),
            Ok(Err(e)) => {
                tracing::warn!("flushing the database at shutdown failed (the next start replays its log): {e}")
            }
            Err(e) => tracing::warn!("flushing the database at shutdown failed: {e}"),
        }
    }
}

/// Initializes a brand-new cluster exactly once: only the lowest-id founder does it, only on an empty data
/// directory, and only after every founder answered that it holds no data. A restarted or wiped replica finds
/// initialized peers and waits to be replicated to instead.
/// The `raft-stats` diagnostic: while this replica leads, openraft's latency histograms per stage of a log
/// entry, logged every 10 s (a benchmark reads them from the controller's log).
#[cfg(feature = "raft-stats")]
async fn log_raft_stats(raft: Raft, id: u64) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        if openraft::async_runtime::WatchReceiver::borrow_watched(&raft.metrics()).current_leader != Some(id) {
            continue;
        }
        match raft.runtime_stats().await {
            Ok(stats) => tracing::info!("raft runtime stats:\n{}", stats.display().human_readable().multiline()),
            Err(_) => return,
        }
    }
}

async fn bootstrap(raft: Raft, id: u64, founders: BTreeMap<u64, String>, security: Arc<crate::security::Security>) {
    if founders.keys().next() != Some(&id) {
        return;
    }
    loop {
        match raft.is_initialized().await {
            Ok(false) => {}
            _ => return,
        }
        let mut all_fresh = true;
        for (peer, addr) in founders.iter().filter(|(p, _)| **p != id) {
            match peer_is_fresh(&security, addr).await {
                Some(true) => {}
                Some(false) => {
                    tracing::info!(peer, "a founder already holds cluster data; not initializing");
                    return;
                }
                None => all_fresh = false,
            }
        }
        if all_fresh {
            let members: BTreeMap<u64, ReplicaNode> =
                founders.iter().map(|(id, addr)| (*id, ReplicaNode { addr: addr.clone() })).collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(?founders, "initialized a new cluster"),
                Err(e) => tracing::info!("not initializing: {e}"),
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `Some(true)` if the replica at `addr` answered and has no log and no term; `None` if it did not answer.
async fn peer_is_fresh(security: &crate::security::Security, addr: &str) -> Option<bool> {
    let channel = security.controller_channel(addr, None).ok()?;
    let mut client = DroverServiceClient::new(channel);
    let mut request = tonic::Request::new(ClusterStatusRequest { local_only: true });
    request.set_timeout(Duration::from_millis(1_000));
    let reply = client.cluster_status(request).await.ok()?.into_inner();
    let me = reply.replicas.first()?;
    Some(me.term == 0 && me.last_log_index == 0 && !me.has_leader)
}
