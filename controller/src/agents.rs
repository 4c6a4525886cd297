//! The leader's side of the agents: their sessions (`AgentGateway.Session`), liveness, and what each node is
//! told to run.
//!
//! Heartbeats never enter the log: the leader keeps `last_seen` in memory and commits only transitions
//! (`RegisterNode`, `NodeDown`, `DrainNodes`). A new leader starts every node's clock afresh, so nodes get a full
//! `node_timeout_ms` to find it before any is declared down.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_proto::v1::agent_gateway_server::AgentGateway;
use drover_proto::v1::{AgentEnvelope, ControllerEnvelope};
use drover_proto::wire::{AgentMessage, Assignment, ControllerMessage, decode, encode};
use drover_state::{Command, CommandError, Job, JobId, NodeHealth, NodeInfo};
use futures::Stream;
use openraft::async_runtime::WatchReceiver;
use tokio::sync::{Notify, mpsc};
use tonic::{Request, Response, Status, Streaming};

use crate::api::{commit, commit_command, not_leader};
use crate::config::AgentTiming;
use crate::store::StateView;
use crate::types::Raft;

/// Messages queued to one agent; a session that cannot keep up is closed (the agent reconnects and resyncs).
const SESSION_QUEUE: usize = 256;
/// How long an agent has to send its registration after opening a session.
const REGISTER_TIMEOUT_MS: u64 = 5_000;
/// Coalesces bursts of state changes into one assignment update per node.
const ASSIGNMENT_COALESCE_MS: u64 = 1;
/// Nodes declared down per liveness tick (the rest follow on the next ticks).
const MAX_NODE_DOWNS_PER_TICK: usize = 1_024;
/// Largest inventory an agent may register (GPU list, labels).
const MAX_NODE_GPUS: usize = 64;

/// One connected agent.
struct Session {
    token: u64,
    tx: mpsc::Sender<ControllerMessage>,
    /// Woken when the node's assignments may have changed.
    changed: Arc<Notify>,
}

pub struct AgentHub {
    id: u64,
    raft: Raft,
    view: StateView,
    pub timing: AgentTiming,
    sessions: Mutex<HashMap<String, Session>>,
    /// When each node was last heard from, by this replica while it leads.
    last_seen: Mutex<HashMap<String, Instant>>,
    next_token: AtomicU64,
}

impl AgentHub {
    pub fn new(id: u64, raft: Raft, view: StateView, timing: AgentTiming) -> Arc<AgentHub> {
        Arc::new(AgentHub {
            id,
            raft,
            view,
            timing,
            sessions: Mutex::new(HashMap::new()),
            last_seen: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
        })
    }

    fn is_leader(&self) -> bool {
        self.raft.server_metrics().borrow_watched().current_leader == Some(self.id)
    }

    fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.server_metrics().borrow_watched().clone();
        let leader = metrics.current_leader?;
        metrics.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
    }

    fn seen(&self, node: &str) {
        self.last_seen.lock().expect("last_seen poisoned").insert(node.to_string(), Instant::now());
    }

    /// `scancel --signal`: sends the signal to every node of the job that has a session here.
    pub fn signal(&self, job: &Job, signal: i32) {
        let sessions = self.sessions.lock().expect("sessions poisoned");
        for node in &job.nodes {
            if let Some(session) = sessions.get(node) {
                let message = ControllerMessage::Signal { job_id: job.id, incarnation: job.incarnation, signal };
                if session.tx.try_send(message).is_err() {
                    tracing::warn!(node, job = job.id, "signal not delivered: the agent's queue is full");
                }
            }
        }
    }

    /// What `node` must run now, in a stable order, with the batch script for the jobs it leads.
    fn assignments(&self, node: &str) -> Vec<Assignment> {
        let mut out: Vec<Assignment> = {
            let applied = self.view.read();
            let state = &applied.state;
            let Some(n) = state.nodes.get(node) else { return Vec::new() };
            n.jobs
                .iter()
                .filter_map(|id| state.jobs.get(id))
                .map(|job| {
                    let node_index = job.nodes.iter().position(|x| x == node).unwrap_or(0) as u32;
                    let hosts = job
                        .nodes
                        .iter()
                        .map(|name| state.nodes.get(name).map(|n| n.info.host.clone()).unwrap_or_default())
                        .collect();
                    Assignment { job: job.clone(), hosts, node_index, script: None }
                })
                .collect()
        };
        for a in out.iter_mut().filter(|a| a.node_index == 0 && !a.job.spec.interactive) {
            match self.view.script(a.job.script_id()) {
                Ok(script) => a.script = script,
                Err(e) => tracing::error!(job = a.job.id, "cannot read the batch script: {e}"),
            }
        }
        out
    }

    /// Commits a report from an agent, then acknowledges it (a stale or already-committed report is
    /// acknowledged too: the agent may forget it either way).
    async fn job_ended(
        &self,
        node: &str,
        tx: &mpsc::Sender<ControllerMessage>,
        job_id: JobId,
        incarnation: u64,
        end: drover_state::JobEnd,
    ) {
        let done = match commit_command(&self.raft, Command::JobEnded { job_id, incarnation, end }).await {
            Ok(Ok(_)) => true,
            Ok(Err(refused)) => {
                tracing::info!(node, job_id, incarnation, "job end report refused: {refused}");
                matches!(refused, CommandError::StaleReport { .. })
            }
            Err(status) => {
                tracing::info!(node, job_id, incarnation, "job end report not committed: {}", status.message());
                false
            }
        };
        if done {
            let _ = tx.send(ControllerMessage::EndAcked { job_id, incarnation }).await;
        }
    }

    async fn register(&self, info: &NodeInfo) -> Result<(), Status> {
        if info.gpus.len() > MAX_NODE_GPUS {
            return Err(Status::invalid_argument(format!(
                "{} GPUs registered, at most {MAX_NODE_GPUS}",
                info.gpus.len()
            )));
        }
        let needed = {
            let applied = self.view.read();
            applied.state.nodes.get(&info.name).is_none_or(|n| n.info != *info || n.health == NodeHealth::Down)
        };
        if needed {
            commit(&self.raft, Command::RegisterNode { info: info.clone() }).await?;
        }
        Ok(())
    }
}

/// The gRPC face of the hub.
pub struct Gateway(pub Arc<AgentHub>);

type SessionStream = Pin<Box<dyn Stream<Item = Result<ControllerEnvelope, Status>> + Send>>;

#[tonic::async_trait]
impl AgentGateway for Gateway {
    type SessionStream = SessionStream;

    async fn session(&self, request: Request<Streaming<AgentEnvelope>>) -> Result<Response<SessionStream>, Status> {
        let hub = self.0.clone();
        if !hub.is_leader() {
            return Err(not_leader(hub.leader_addr().as_deref()));
        }
        // The interceptor admitted agents only; this agent may speak for the node its certificate names, no other.
        let certified = match drover_auth::tls::peer_role(&request)? {
            drover_auth::tls::Role::Agent(node) => node,
            other => return Err(Status::permission_denied(format!("{other} is not an agent"))),
        };
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(Duration::from_millis(REGISTER_TIMEOUT_MS), inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no registration within 5 s"))??
            .ok_or_else(|| Status::cancelled("session closed before registering"))?;
        let AgentMessage::Register { info } = decode(&first.json).map_err(Status::invalid_argument)? else {
            return Err(Status::invalid_argument("the first message of a session must be Register"));
        };
        if info.name != certified {
            return Err(Status::permission_denied(format!(
                "this agent's certificate is for node {certified}, not {}: issue it a certificate for its own name",
                info.name
            )));
        }
        hub.register(&info).await?;
        let name = info.name.clone();
        hub.seen(&name);
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        let token = hub.next_token.fetch_add(1, Ordering::Relaxed);
        let changed = Arc::new(Notify::new());
        hub.sessions
            .lock()
            .expect("sessions poisoned")
            .insert(name.clone(), Session { token, tx: tx.clone(), changed: changed.clone() });
        let welcome = ControllerMessage::Welcome {
            leader_id: hub.id,
            heartbeat_ms: hub.timing.heartbeat_ms,
            fence_after_ms: hub.timing.fence_after_ms,
            kill_wait_ms: hub.timing.kill_wait_ms,
        };
        tx.send(welcome).await.map_err(|_| Status::cancelled("session closed"))?;
        tracing::info!(node = %name, "agent session opened");
        tokio::spawn(run_session(hub, name, token, inbound, tx, changed));
        let stream =
            tokio_stream::wrappers::ReceiverStream::new(rx).map(|m| Ok(ControllerEnvelope { json: encode(&m) }));
        Ok(Response::new(Box::pin(stream)))
    }
}

use tokio_stream::StreamExt as _;

async fn run_session(
    hub: Arc<AgentHub>,
    name: String,
    token: u64,
    mut inbound: Streaming<AgentEnvelope>,
    tx: mpsc::Sender<ControllerMessage>,
    changed: Arc<Notify>,
) {
    // Server metrics change only with leadership or membership. (The full metrics change on every Raft event:
    // waking every session on each of them cost a core at 2,000 agents.)
    let mut metrics = hub.raft.server_metrics();
    let mut last_sent: Option<Vec<(JobId, u64, bool)>> = None;
    changed.notify_one();
    loop {
        tokio::select! {
            message = inbound.message() => {
                let envelope = match message {
                    Ok(Some(envelope)) => envelope,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(node = %name, "agent session ended: {}", e.message());
                        break;
                    }
                };
                hub.seen(&name);
                match decode::<AgentMessage>(&envelope.json) {
                    Ok(AgentMessage::Heartbeat { problems }) => {
                        if !problems.is_empty() {
                            drain_for_problems(&hub, &name, &problems);
                        }
                        if tx.try_send(ControllerMessage::Alive).is_err() {
                            tracing::warn!(node = %name, "agent is not reading its session; closing it");
                            break;
                        }
                    }
                    Ok(AgentMessage::JobEnded { job_id, incarnation, end }) => {
                        let (hub, name, tx) = (hub.clone(), name.clone(), tx.clone());
                        tokio::spawn(async move { hub.job_ended(&name, &tx, job_id, incarnation, end).await });
                    }
                    Ok(AgentMessage::Register { info }) => {
                        if info.name != name {
                            tracing::warn!(node = %name, "agent tried to rename itself to {}", info.name);
                            break;
                        }
                        if let Err(e) = hub.register(&info).await {
                            tracing::warn!(node = %name, "re-registration failed: {}", e.message());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, "dropping agent session: {e}");
                        break;
                    }
                }
            }
            _ = changed.notified() => {
                tokio::time::sleep(Duration::from_millis(ASSIGNMENT_COALESCE_MS)).await;
                let jobs = hub.assignments(&name);
                let fingerprint: Vec<(JobId, u64, bool)> =
                    jobs.iter().map(|a| (a.job.id, a.job.incarnation, a.cancelled())).collect();
                if last_sent.as_ref() != Some(&fingerprint) {
                    if tx.send(ControllerMessage::Assignments { jobs }).await.is_err() {
                        break;
                    }
                    last_sent = Some(fingerprint);
                }
            }
            changed_metrics = metrics.changed() => {
                if changed_metrics.is_err() || metrics.borrow_watched().current_leader != Some(hub.id) {
                    tracing::info!(node = %name, "no longer the leader; closing the agent session");
                    break;
                }
            }
        }
    }
    let mut sessions = hub.sessions.lock().expect("sessions poisoned");
    if sessions.get(&name).is_some_and(|s| s.token == token) {
        sessions.remove(&name);
    }
}

/// A node whose agent reports problems (failed GPUs, a wrong inventory) is drained, once, with its reasons.
fn drain_for_problems(hub: &Arc<AgentHub>, node: &str, problems: &[String]) {
    let already = hub.view.read().state.nodes.get(node).is_none_or(|n| n.drain);
    if already {
        return;
    }
    let reason: Vec<&str> = problems.iter().take(8).map(String::as_str).collect();
    // The leader drains on the node's behalf, as uid 0 (audited as the controllers' own action).
    let command =
        Command::DrainNodes { names: vec![node.to_string()], drain: true, reason: reason.join("; "), by_uid: 0 };
    let hub = hub.clone();
    let node = node.to_string();
    tokio::spawn(async move {
        if let Err(e) = commit(&hub.raft, command).await {
            tracing::warn!(node, "draining for GPU health failed: {}", e.message());
        }
    });
}

/// While this replica leads: wakes each node's session when its assignments may have changed, and declares
/// silent nodes down.
pub async fn leader_loops(hub: Arc<AgentHub>) {
    let mut changes = hub.view.node_changes();
    let mut tick = tokio::time::interval(Duration::from_millis(hub.timing.heartbeat_ms.min(1_000)));
    let mut leading_since: Option<Instant> = None;
    // One liveness check at a time, off this loop, so node-change notices keep flowing while it commits.
    let checking = Arc::new(std::sync::atomic::AtomicBool::new(false));
    loop {
        tokio::select! {
            change = changes.recv() => {
                let sessions = hub.sessions.lock().expect("sessions poisoned");
                match change {
                    Ok(name) if name != "*" => {
                        if let Some(s) = sessions.get(&name) {
                            s.changed.notify_one();
                        }
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        sessions.values().for_each(|s| s.changed.notify_one());
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
            _ = tick.tick() => {
                if !hub.is_leader() {
                    leading_since = None;
                    hub.last_seen.lock().expect("last_seen poisoned").clear();
                    continue;
                }
                let since = *leading_since.get_or_insert_with(Instant::now);
                if !checking.swap(true, Ordering::AcqRel) {
                    let (hub, checking) = (hub.clone(), checking.clone());
                    tokio::spawn(async move {
                        declare_silent_nodes_down(&hub, since).await;
                        checking.store(false, Ordering::Release);
                    });
                }
            }
        }
    }
}

async fn declare_silent_nodes_down(hub: &Arc<AgentHub>, leading_since: Instant) {
    let timeout = Duration::from_millis(hub.timing.node_timeout_ms);
    let up: Vec<String> = {
        let applied = hub.view.read();
        applied.state.nodes.values().filter(|n| n.health == NodeHealth::Up).map(|n| n.info.name.clone()).collect()
    };
    let silent: Vec<String> = {
        let seen = hub.last_seen.lock().expect("last_seen poisoned");
        up.into_iter()
            .filter(|name| seen.get(name).copied().unwrap_or(leading_since).max(leading_since).elapsed() > timeout)
            .collect()
    };
    // All at once: openraft batches concurrent proposals, so a rack going dark costs a few fsyncs, not one each.
    let downs = silent.into_iter().take(MAX_NODE_DOWNS_PER_TICK).map(|name| {
        let hub = hub.clone();
        async move {
            tracing::warn!(node = %name, "no heartbeat for {} ms: declaring the node DOWN", hub.timing.node_timeout_ms);
            let reason = "Not responding".to_string();
            if let Err(e) = commit(&hub.raft, Command::NodeDown { name: name.clone(), reason }).await {
                tracing::warn!(node = %name, "declaring the node down failed: {}", e.message());
            }
        }
    });
    futures::future::join_all(downs).await;
}
