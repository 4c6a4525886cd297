//! The leader's side of the agents: their sessions (`AgentGateway.Session`), liveness, and what each node is
//! told to run.
//!
//! Heartbeats never enter the log: the leader keeps `last_seen` in memory and commits only transitions
//! (`RegisterNode`, `NodeDown`, `DrainNodes`). A new leader starts every node's clock afresh, so nodes get a full
//! `node_timeout_ms` to find it before any is declared down.
//!
//! # Why a job never runs two incarnations at once
//!
//! Each registration that brings a node up starts a new *epoch* of that node (committed by `RegisterNode`). A
//! lease is for one epoch, and the rules below make every lease of epoch E expire before a `NodeDown` for E can
//! commit, so the jobs that decision requeues have no task left on the node when their next incarnation starts:
//!
//! 1. **A lease is granted only by a leader that can be sure of the node's epoch**: it leads, a quorum of
//!    controllers acknowledged it within the election timeout (`quorum_is_fresh`: a leader cut off from the
//!    quorum stops renewing, so leases it granted run out before another leader is elected), it has applied
//!    everything committed before its term (`is_caught_up`), and its applied state shows the node up at that
//!    epoch. Otherwise the heartbeat gets no lease, or, if the node is down or registered anew, the session is
//!    closed and the agent registers again.
//! 2. **A node-loss decision is final for its epoch in the term it is taken.** The liveness check condemns
//!    (node, epoch) under the same lock that every heartbeat records itself under, so a heartbeat either came
//!    first (then the node is not silent) or is refused its lease (it is condemned). It then proposes
//!    `NodeDown { epoch }` until the state shows the node down or in a later epoch, and grants that epoch no lease
//!    again. A leader decides only after `node_timeout_ms` of silence counted from its own election, and leases
//!    last `fence_after_ms` (< `node_timeout_ms`) from when the heartbeat was *sent*, so every lease it granted,
//!    and every lease an earlier leader granted (before this one was elected, by rule 1), has run out.
//! 3. **A later leader cannot grant epoch E a lease while a `NodeDown { E }` of an earlier term can still commit.**
//!    It grants only once caught up, that is, once it has committed an entry of its own term: a `NodeDown { E }`
//!    in its log is then committed and applied (the node shows down: no lease), and one that is not in its log can
//!    never commit (Raft's log matching). `apply` refuses a `NodeDown` whose epoch is not the node's current one,
//!    so a decision about an old registration never takes down a newer one.
//! 4. **The agent starts a task only under a lease of the epoch its assignments are for**, after this session's
//!    assignments arrived, and only on GPUs no task of another incarnation still holds. Its supervisors kill
//!    their tasks when the lease file expires, even if the agent is dead or hung. A returning agent lists what
//!    still runs in its registration; those GPUs linger (held) until it confirms the tasks gone.
//!
//! And no assignments go out before this leader has applied everything committed before its election: a leader
//! that has not caught up would otherwise tell agents to kill jobs it has not heard of yet.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
// tokio's clock (the wall clock in production): under the deterministic simulation's paused clock, node
// timeouts run on simulated time.
use tokio::time::Instant;

use drover_proto::v1::agent_gateway_server::AgentGateway;
use drover_proto::v1::{AgentEnvelope, ControllerEnvelope};
use drover_proto::wire::{AgentMessage, Assignment, ControllerMessage, decode, encode};
use drover_state::{Command, CommandError, Job, JobId, MeasuredUsage, NodeHealth, NodeInfo, RunningShare};
use futures::Stream;
use openraft::async_runtime::WatchReceiver;
use tokio::sync::{Notify, mpsc};
use tonic::{Request, Response, Status, Streaming};

use crate::config::AgentTiming;
use crate::propose::{Proposer, not_leader, propose, propose_checked};
use crate::store::StateView;
use crate::types::Raft;

/// Messages queued to one agent; a session that cannot keep up is closed (the agent reconnects and resyncs).
const SESSION_QUEUE: usize = 256;
/// How long an agent has to send its registration after opening a session.
const REGISTER_TIMEOUT_MS: u64 = 5_000;
/// How long a registration waits for a new leader to catch up with its commit before it is refused (the agent
/// tries again).
const REGISTER_CATCH_UP_MS: u64 = 2_000;
/// Coalesces bursts of state changes into one assignment update per node.
const ASSIGNMENT_COALESCE_MS: u64 = 1;
/// Nodes declared down per liveness tick (the rest follow on the next ticks).
const MAX_NODE_DOWNS_PER_TICK: usize = 1_024;
/// Largest inventory an agent may register (GPU list, labels).
const MAX_NODE_GPUS: usize = 64;

/// One connected agent.
struct Session {
    token: u64,
    /// The agent's build (`NodeInfo::version`) and the highest feature level it understands (1 for agents from
    /// before feature levels): what `drover cluster version` lists, and the bound on what it may be sent.
    version: (String, u32),
    tx: mpsc::Sender<ControllerMessage>,
    /// Woken when the node's assignments may have changed.
    changed: Arc<Notify>,
}

/// This replica's liveness judgement, for one term of its leadership.
#[derive(Default)]
struct Liveness {
    /// The term these records belong to; a new term starts them afresh.
    term: u64,
    /// When this replica began leading in `term`: a node not heard from since gets its full timeout from here.
    leading_since: Option<Instant>,
    last_seen: HashMap<String, Instant>,
    /// Node → the epoch this leader decided is lost in `term`: no lease for it again, and `NodeDown` is proposed
    /// until the state moves past it.
    condemned: HashMap<String, u64>,
}

impl Liveness {
    /// Starts the records afresh when leadership moved to a new term (a replica that lost and regained
    /// leadership between two ticks must not judge by its old term's clocks: another leader may have granted
    /// leases in between).
    fn for_term(&mut self, term: u64) -> &mut Liveness {
        if self.term != term {
            *self = Liveness { term, leading_since: Some(Instant::now()), ..Liveness::default() };
        }
        self
    }

    /// Whether `node` has been silent for longer than `timeout`, counting from this term's start at the earliest.
    fn silent(&self, node: &str, timeout: Duration) -> bool {
        let since = self.leading_since.unwrap_or_else(Instant::now);
        self.last_seen.get(node).copied().unwrap_or(since).max(since).elapsed() > timeout
    }
}

/// Why a heartbeat got no lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoLease {
    NotLeader,
    /// No quorum acknowledged this leader within the election timeout.
    NoQuorum,
    /// This leader has not yet applied everything committed before its term.
    NotCaughtUp,
    /// This leader decided the node's registration is lost; its `NodeDown` is on its way.
    Condemned,
    /// The node is down, unknown, or registered anew since this session began: the agent must register (again).
    Reregister(String),
}

pub struct AgentHub {
    id: u64,
    raft: Raft,
    proposer: Proposer,
    view: StateView,
    pub timing: AgentTiming,
    /// A lease is granted only while the last quorum acknowledgement is at most this old (Raft's election
    /// timeout: a leader silent to its quorum for longer may already have been replaced).
    quorum_window: Duration,
    sessions: Mutex<HashMap<String, Session>>,
    /// When each node was last heard from, and which registrations this leader decided are lost: one lock, so a
    /// lease and a node-loss decision are always ordered (see the module's comment, rule 2).
    liveness: Mutex<Liveness>,
    next_token: AtomicU64,
    /// The term in which this leader has applied everything committed before it was elected (0: none yet).
    caught_up_term: AtomicU64,
    /// Wakes sessions waiting for the catch-up.
    caught_up: Notify,
    /// Nodes whose fence command is running.
    fencing: Mutex<std::collections::HashSet<String>>,
    /// Heartbeats this replica received while it led (`/metrics`).
    heartbeats: AtomicU64,
}

impl AgentHub {
    pub fn new(
        id: u64,
        proposer: Proposer,
        view: StateView,
        timing: AgentTiming,
        quorum_window_ms: u64,
    ) -> Arc<AgentHub> {
        Arc::new(AgentHub {
            id,
            raft: proposer.raft().clone(),
            proposer,
            view,
            timing,
            quorum_window: Duration::from_millis(quorum_window_ms),
            sessions: Mutex::new(HashMap::new()),
            liveness: Mutex::new(Liveness::default()),
            next_token: AtomicU64::new(1),
            caught_up_term: AtomicU64::new(0),
            caught_up: Notify::new(),
            fencing: Mutex::new(std::collections::HashSet::new()),
            heartbeats: AtomicU64::new(0),
        })
    }

    /// Whether this replica leads and a quorum acknowledged it within the window: only then may it renew
    /// leases. (The acknowledged time is when the acknowledged request was *sent*, so it errs on the safe side.)
    /// A single-replica cluster's leader is its own quorum.
    pub fn quorum_is_fresh(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        // A leader that is the only voter is its own quorum (openraft records no acknowledgement then): nobody can
        // be elected beside it without a membership change, which it would have to commit itself.
        let sole_voter = {
            let membership = m.membership_config.membership();
            let mut voters = membership.voter_ids();
            voters.next() == Some(self.id) && voters.next().is_none()
        };
        m.current_leader == Some(self.id)
            && (sole_voter
                || m.last_quorum_acked
                    .as_ref()
                    .is_some_and(|acked| openraft::Instant::elapsed(&**acked) <= self.quorum_window))
    }

    /// Whether this leader has caught up with its own commit (see the module's comment).
    pub fn is_caught_up(&self) -> bool {
        let term = self.raft.server_metrics().borrow_watched().vote.leader_id().term;
        self.caught_up_term.load(Ordering::Acquire) == term && self.is_leader()
    }

    /// Waits, once per term, until this leader has applied everything committed before it (a read-index round
    /// waits for exactly that), then lets its sessions send assignments.
    async fn catch_up(&self) {
        let term = self.raft.server_metrics().borrow_watched().vote.leader_id().term;
        if self.caught_up_term.load(Ordering::Acquire) == term {
            return;
        }
        let read = self.raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex);
        match tokio::time::timeout(Duration::from_millis(3_000), read).await {
            Ok(Ok(_)) => {
                self.caught_up_term.store(term, Ordering::Release);
                self.caught_up.notify_waiters();
                tracing::info!(term, "leader caught up with its commit: assignments may go out");
            }
            Ok(Err(e)) => tracing::info!("leader not caught up yet: {e}"),
            Err(_) => tracing::info!("leader not caught up within 3 s; retrying"),
        }
    }

    /// Whether Raft still runs here (it stops on shutdown or a fatal storage error).
    fn is_running(&self) -> bool {
        self.raft.metrics().borrow_watched().running_state.is_ok()
    }

    fn is_leader(&self) -> bool {
        self.raft.server_metrics().borrow_watched().current_leader == Some(self.id)
    }

    fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.server_metrics().borrow_watched().clone();
        let leader = metrics.current_leader?;
        metrics.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
    }

    /// A message from `node`'s agent: it is alive.
    fn seen(&self, node: &str) {
        self.liveness.lock().expect("liveness poisoned").last_seen.insert(node.to_string(), Instant::now());
    }

    /// A heartbeat from `node`'s agent, registered in `epoch`: the lease to grant (its length in ms), or why none
    /// (the module's comment, rules 1 and 2). Public for the simulation's agents, which have no gRPC session.
    pub fn heartbeat(&self, node: &str, epoch: u64) -> Result<u64, NoLease> {
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
        {
            let mut liveness = self.liveness.lock().expect("liveness poisoned");
            liveness.last_seen.insert(node.to_string(), Instant::now());
            if liveness.condemned.get(node) == Some(&epoch) {
                return Err(NoLease::Condemned);
            }
        }
        if !self.is_leader() {
            return Err(NoLease::NotLeader);
        }
        if !self.quorum_is_fresh() {
            return Err(NoLease::NoQuorum);
        }
        if !self.is_caught_up() {
            return Err(NoLease::NotCaughtUp);
        }
        let applied = self.view.read();
        match applied.state.nodes.get(node) {
            None => Err(NoLease::Reregister(format!("node {node} is not registered"))),
            Some(n) if n.health == NodeHealth::Down => {
                Err(NoLease::Reregister(format!("node {node} was declared down ({})", n.reason)))
            }
            Some(n) if n.epoch != epoch => Err(NoLease::Reregister(format!(
                "node {node} registered anew (epoch {} since this session's {epoch})",
                n.epoch
            ))),
            Some(_) => Ok(self.timing.fence_after_ms),
        }
    }

    /// Whether this leader has decided that `node`'s current registration is lost (its `NodeDown` proposed, maybe
    /// not yet committed). The simulation's drills time their faults by it.
    pub fn is_condemned(&self, node: &str) -> bool {
        self.liveness.lock().expect("liveness poisoned").condemned.contains_key(node)
    }

    /// The node's registration epoch and whether it is up, as this replica has applied it.
    fn node_epoch(&self, node: &str) -> Option<(u64, bool)> {
        self.view.read().state.nodes.get(node).map(|n| (n.epoch, n.health == NodeHealth::Up))
    }

    /// The current term, as this replica's vote holds it.
    fn term(&self) -> u64 {
        self.raft.server_metrics().borrow_watched().vote.leader_id().term
    }

    /// Heartbeats received while leading, since this process started.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats.load(Ordering::Relaxed)
    }

    /// Agents with an open session to this replica (only a leader holds any).
    pub fn session_count(&self) -> usize {
        self.sessions.lock().expect("sessions poisoned").len()
    }

    /// Every agent with a session here: its node, build version and the feature level it understands.
    pub fn agent_versions(&self) -> Vec<(String, String, u32)> {
        let sessions = self.sessions.lock().expect("sessions poisoned");
        let mut versions: Vec<_> =
            sessions.iter().map(|(node, s)| (node.clone(), s.version.0.clone(), s.version.1)).collect();
        versions.sort();
        versions
    }

    /// `scancel --signal`: sends the signal to every node of the job that has a session here.
    pub fn signal(&self, job: &Job, signal: i32, target: drover_proto::wire::SignalTarget) {
        let sessions = self.sessions.lock().expect("sessions poisoned");
        for node in &job.nodes {
            if let Some(session) = sessions.get(node) {
                let message =
                    ControllerMessage::Signal { job_id: job.id, incarnation: job.incarnation, signal, target };
                if session.tx.try_send(message).is_err() {
                    tracing::warn!(node, job = job.id, "signal not delivered: the agent's queue is full");
                }
            }
        }
    }

    /// What `node` must run now, in a stable order, with the batch script for the jobs it leads; the applied
    /// index they come from; the node's epoch there; and the ended incarnations the node must confirm gone, with
    /// the GPUs each holds. Public for the simulation's agents.
    pub fn assignments(&self, node: &str) -> ControllerMessage {
        let (mut out, applied_index, epoch, lingering, allow_root_jobs, cluster_name) = {
            let applied = self.view.read();
            let state = &applied.state;
            let index = applied.last_applied.as_ref().map_or(0, |l| l.index());
            let allow_root_jobs = state.config().is_some_and(|c| c.allow_root_jobs);
            let cluster_name = state.config().map(|c| c.cluster_name.clone()).unwrap_or_default();
            let Some(n) = state.nodes.get(node) else {
                return ControllerMessage::Assignments {
                    jobs: Vec::new(),
                    applied_index: index,
                    lingering: Vec::new(),
                    allow_root_jobs,
                    epoch: 0,
                    lingering_gpus: Vec::new(),
                    cluster_name,
                    reboot: None,
                };
            };
            let lingering: Vec<((JobId, u64), Vec<u32>)> =
                n.lingering.iter().map(|l| ((l.job, l.incarnation), l.gpus.clone())).collect();
            let jobs: Vec<Assignment> = n
                .jobs
                .iter()
                .filter_map(|id| state.jobs.get(id))
                .map(|job| {
                    let node_index = job.nodes.iter().position(|x| x == node).unwrap_or(0) as u32;
                    let hosts = job
                        .nodes
                        .iter()
                        .map(|name| state.nodes.get(name).map(|n| n.info.host.clone()).unwrap_or_default())
                        .collect();
                    Assignment { job: (**job).clone(), hosts, node_index, script: None }
                })
                .collect();
            (jobs, index, n.epoch, lingering, allow_root_jobs, (cluster_name, n.reboot.as_ref().map(|r| r.id)))
        };
        let (cluster_name, reboot) = cluster_name;
        for a in out.iter_mut() {
            if let Err(e) = self.view.with_environment(&mut a.job) {
                tracing::error!(job = a.job.id, "cannot read the job's environment: {e}");
            }
            if a.node_index == 0 && !a.job.spec.interactive {
                match self.view.script(a.job.script_id()) {
                    Ok(script) => a.script = script,
                    Err(e) => tracing::error!(job = a.job.id, "cannot read the batch script: {e}"),
                }
            }
        }
        ControllerMessage::Assignments {
            jobs: out,
            applied_index,
            lingering: lingering.iter().map(|(key, _)| *key).collect(),
            allow_root_jobs,
            epoch,
            lingering_gpus: lingering,
            cluster_name,
            reboot,
        }
    }

    /// The agent confirmed ended incarnations gone: release what still lingers of them on its node, and record
    /// what their tasks used there.
    async fn released(&self, node: &str, keys: Vec<(JobId, u64)>, usage: Vec<((JobId, u64), MeasuredUsage)>) {
        let keys: Vec<(JobId, u64)> = {
            let applied = self.view.read();
            let Some(n) = applied.state.nodes.get(node) else { return };
            keys.into_iter().filter(|k| n.lingering.iter().any(|l| (l.job, l.incarnation) == *k)).collect()
        };
        if keys.is_empty() {
            return;
        }
        // Only figures for what is released in this entry (apply checks again); one per key.
        let mut seen = std::collections::HashSet::new();
        let usage: Vec<((JobId, u64), MeasuredUsage)> =
            usage.into_iter().filter(|(key, u)| keys.contains(key) && !u.is_empty() && seen.insert(*key)).collect();
        if let Err(e) = propose(&self.proposer, Command::ReleaseLingering { node: node.to_string(), keys, usage }).await
        {
            tracing::info!(node, "releasing lingering holds failed: {}", e.message());
        }
    }

    /// A job on this node named a finished checkpoint in its marker file: recorded for the job's incarnation
    /// (refused if that incarnation is no longer current). The agent speaks only for jobs assigned to its node.
    async fn checkpoint(&self, node: &str, job_id: JobId, incarnation: u64, path: String, step: Option<u64>) {
        let on_node = self.view.read().state.job(job_id).is_some_and(|j| j.nodes.iter().any(|n| n == node));
        if !on_node {
            return;
        }
        let command = Command::RecordCheckpoint { job_id, incarnation, path, step, by_uid: 0 };
        match propose_checked(&self.proposer, command).await {
            Ok(Ok(_)) => {}
            Ok(Err(refused)) => tracing::info!(node, job_id, incarnation, "checkpoint record refused: {refused}"),
            Err(status) => tracing::info!(node, job_id, "checkpoint record not committed: {}", status.message()),
        }
    }

    /// A node's image store changed (an import, an eviction): recorded for `scontrol show node`.
    async fn image_store(&self, node: &str, summary: drover_state::node::ImageStoreSummary) {
        let command = Command::RecordImageStore { node: node.to_string(), summary };
        if let Err(status) = propose_checked(&self.proposer, command).await {
            tracing::info!(node, "image store report not committed: {}", status.message());
        }
    }

    /// A node running a job's container named the digest its image resolved to: pinned for the job's requeues.
    /// As for checkpoints, the agent speaks only for jobs assigned to its node.
    async fn image_digest(&self, node: &str, job_id: JobId, incarnation: u64, digest: String) {
        let on_node = self.view.read().state.job(job_id).is_some_and(|j| j.nodes.iter().any(|n| n == node));
        if !on_node {
            return;
        }
        let command = Command::RecordImage { job_id, incarnation, digest };
        match propose_checked(&self.proposer, command).await {
            Ok(Ok(_)) => {}
            Ok(Err(refused)) => tracing::info!(node, job_id, incarnation, "image digest refused: {refused}"),
            Err(status) => tracing::info!(node, job_id, "image digest not committed: {}", status.message()),
        }
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
        // An agent speaks only for what runs on its node: the current incarnation of a job placed elsewhere is not
        // its to end (a compromised or confused node could otherwise end any job). Reports about earlier
        // incarnations go on to the state machine, which refuses them as stale and lets the agent forget them.
        let elsewhere = self.view.read().state.job(job_id).is_some_and(|j| {
            j.incarnation == incarnation
                && j.state == drover_state::JobState::Running
                && !j.nodes.iter().any(|n| n == node)
        });
        if elsewhere {
            tracing::warn!(node, job_id, incarnation, "job end report from a node the job does not run on: ignored");
            return;
        }
        let done = match propose_checked(&self.proposer, Command::JobEnded { job_id, incarnation, end }).await {
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

    /// Registers the node if the state needs it (a new node, a changed inventory, a node coming back from DOWN,
    /// listing what still runs there), and returns its epoch. Only once this leader has caught up, so that it
    /// judges by the newest committed state: otherwise an agent whose node a committed `NodeDown` took down could
    /// be told its old epoch still stands. Public for the simulation's agents.
    pub async fn register(&self, info: &NodeInfo, running: &[RunningShare]) -> Result<u64, Status> {
        if info.gpus.len() > MAX_NODE_GPUS {
            return Err(Status::invalid_argument(format!(
                "{} GPUs registered, at most {MAX_NODE_GPUS}",
                info.gpus.len()
            )));
        }
        drover_state::check_host(&info.host)
            .map_err(|e| Status::invalid_argument(format!("node {}: {e}", info.name)))?;
        if running.len() > drover_state::lifecycle::MAX_RUNNING_SHARES {
            return Err(Status::invalid_argument(format!(
                "{} running incarnations listed, at most {}",
                running.len(),
                drover_state::lifecycle::MAX_RUNNING_SHARES
            )));
        }
        if !self.is_caught_up() {
            let caught_up = self.caught_up.notified();
            if !self.is_caught_up() {
                let _ = tokio::time::timeout(Duration::from_millis(REGISTER_CATCH_UP_MS), caught_up).await;
            }
            if !self.is_caught_up() {
                return Err(Status::unavailable(
                    "the leader is still applying what was committed before its election; register again shortly",
                ));
            }
        }
        // Heard now, before the registration commits: the liveness scan judges an Up node with no heartbeat on
        // record by the term's start, so a node registering late in a term (thousands at once, after a power
        // event) was declared down between its commit and its session's first record (228 of 10,000 nodes in
        // `drover-bench heartbeats`).
        self.seen(&info.name);
        let needed = {
            let applied = self.view.read();
            applied.state.nodes.get(&info.name).is_none_or(|n| n.info != *info || n.health == NodeHealth::Down)
        };
        if needed {
            let command = Command::RegisterNode { info: info.clone(), running: running.to_vec() };
            propose(&self.proposer, command).await?;
        }
        match self.node_epoch(&info.name) {
            Some((epoch, true)) => Ok(epoch),
            // Declared down again between the commit and this read: the agent registers once more.
            _ => Err(Status::unavailable(format!("node {} went down while it registered; register again", info.name))),
        }
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
        let AgentMessage::Register { info, running, feature_level } =
            decode(&first.json).map_err(|e| Status::invalid_argument(e.to_string()))?
        else {
            return Err(Status::invalid_argument("the first message of a session must be Register"));
        };
        if info.name != certified {
            return Err(Status::permission_denied(format!(
                "this agent's certificate is for node {certified}, not {}: issue it a certificate for its own name",
                info.name
            )));
        }
        let epoch = hub.register(&info, &running).await?;
        let name = info.name.clone();
        hub.seen(&name);
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        let token = hub.next_token.fetch_add(1, Ordering::Relaxed);
        let changed = Arc::new(Notify::new());
        hub.sessions.lock().expect("sessions poisoned").insert(
            name.clone(),
            Session {
                token,
                version: (info.version.clone(), drover_state::feature::effective(feature_level)),
                tx: tx.clone(),
                changed: changed.clone(),
            },
        );
        let welcome = ControllerMessage::Welcome {
            leader_id: hub.id,
            heartbeat_ms: hub.timing.heartbeat_ms,
            fence_after_ms: hub.timing.fence_after_ms,
            kill_wait_ms: hub.timing.kill_wait_ms,
            epoch,
        };
        tx.send(welcome).await.map_err(|_| Status::cancelled("session closed"))?;
        tracing::info!(node = %name, epoch, "agent session opened");
        tokio::spawn(run_session(hub, name, epoch, token, inbound, tx, changed));
        let stream =
            tokio_stream::wrappers::ReceiverStream::new(rx).map(|m| Ok(ControllerEnvelope { json: encode(&m) }));
        Ok(Response::new(Box::pin(stream)))
    }
}

use tokio_stream::StreamExt as _;

/// What an agent acts on for one job: id, incarnation, stopping, time limit (s), suspended since (ms).
type JobFingerprint = (JobId, u64, bool, Option<u64>, Option<u64>);
/// What an agent was last told: each job, the lingering incarnations, whether root jobs may run and the reboot
/// order pending. A new assignment message goes out only when it changes.
type Fingerprint = (Vec<JobFingerprint>, Vec<(JobId, u64)>, (bool, Option<u64>));

async fn run_session(
    hub: Arc<AgentHub>,
    name: String,
    epoch: u64,
    token: u64,
    mut inbound: Streaming<AgentEnvelope>,
    tx: mpsc::Sender<ControllerMessage>,
    changed: Arc<Notify>,
) {
    // Server metrics change only with leadership or membership. (The full metrics change on every Raft event:
    // waking every session on each of them cost a core at 2,000 agents.)
    let mut metrics = hub.raft.server_metrics();
    let mut session = LiveSession { hub, name, epoch, tx, changed, last_sent: None, refused_leases: 0 };
    session.changed.notify_one();
    loop {
        let flow = tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(envelope)) => session.on_message(envelope).await,
                Ok(None) => Flow::Close,
                Err(e) => {
                    tracing::info!(node = %session.name, "agent session ended: {}", e.message());
                    Flow::Close
                }
            },
            _ = session.changed.notified() => session.on_change().await,
            changed_metrics = metrics.changed() => {
                if changed_metrics.is_err() || metrics.borrow_watched().current_leader != Some(session.hub.id) {
                    tracing::info!(node = %session.name, "no longer the leader; closing the agent session");
                    Flow::Close
                } else {
                    Flow::Continue
                }
            }
        };
        if flow == Flow::Close {
            break;
        }
    }
    let mut sessions = session.hub.sessions.lock().expect("sessions poisoned");
    if sessions.get(&session.name).is_some_and(|s| s.token == token) {
        sessions.remove(&session.name);
    }
}

/// Whether an agent's session goes on after an event.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// One agent's session on the leader while it runs, for one registration epoch of its node.
struct LiveSession {
    hub: Arc<AgentHub>,
    name: String,
    epoch: u64,
    tx: mpsc::Sender<ControllerMessage>,
    /// Woken when the node's assignments may have changed.
    changed: Arc<Notify>,
    /// What the agent was last sent, so an unchanged list is not sent again.
    last_sent: Option<Fingerprint>,
    /// Heartbeats in a row whose lease was refused (the first is logged).
    refused_leases: u64,
}

impl LiveSession {
    /// A message from the agent: a heartbeat renews its lease (when this leader can vouch for the node's epoch);
    /// reports of checkpoints, releases and job ends are proposed in the background.
    async fn on_message(&mut self, envelope: AgentEnvelope) -> Flow {
        let (hub, name, epoch, tx) = (&self.hub, &self.name, self.epoch, &self.tx);
        hub.seen(name);
        match decode::<AgentMessage>(&envelope.json) {
            Ok(AgentMessage::Heartbeat { seq, problems, gpu_faults, gpus_reset, progress, health_check, rebooted }) => {
                if !problems.is_empty() {
                    drain_for_problems(hub, name, &problems);
                }
                let quiet = gpu_faults.is_empty() && gpus_reset.is_empty() && progress.is_empty();
                if !quiet || health_check.is_some() || rebooted.is_some() {
                    let report = NodeReport { gpu_faults, gpus_reset, progress, health_check, rebooted };
                    act_on_report(hub, name, report);
                }
                // No lease unless this leader can vouch for the node's epoch (the module's comment): the
                // agent's lease then runs out and it looks for the leader the quorum elected, or, for a
                // node that is down or registered anew, the session ends and the agent registers again.
                match hub.heartbeat(name, epoch) {
                    Ok(lease_ms) => {
                        self.refused_leases = 0;
                        let lease = ControllerMessage::Lease { seq, lease_ms, epoch };
                        if tx.try_send(lease).is_err() {
                            tracing::warn!(node = %name, "agent is not reading its session; closing it");
                            return Flow::Close;
                        }
                    }
                    Err(NoLease::Reregister(why)) => {
                        tracing::info!(node = %name, "closing the agent's session so that it registers again: {why}");
                        return Flow::Close;
                    }
                    Err(why) => {
                        self.refused_leases += 1;
                        if self.refused_leases == 1 {
                            tracing::warn!(node = %name, ?why, "not renewing the node's lease");
                        }
                    }
                }
            }
            Ok(AgentMessage::Checkpoint { job_id, incarnation, path, step }) => {
                let (hub, name) = (hub.clone(), name.clone());
                tokio::spawn(async move { hub.checkpoint(&name, job_id, incarnation, path, step).await });
            }
            Ok(AgentMessage::ImageStore { summary }) => {
                let (hub, name) = (hub.clone(), name.clone());
                tokio::spawn(async move { hub.image_store(&name, summary).await });
            }
            Ok(AgentMessage::ImageDigest { job_id, incarnation, digest }) => {
                let (hub, name) = (hub.clone(), name.clone());
                tokio::spawn(async move { hub.image_digest(&name, job_id, incarnation, digest).await });
            }
            Ok(AgentMessage::Released { keys, usage }) => {
                let (hub, name) = (hub.clone(), name.clone());
                tokio::spawn(async move { hub.released(&name, keys, usage).await });
            }
            Ok(AgentMessage::JobEnded { job_id, incarnation, end }) => {
                let (hub, name, tx) = (hub.clone(), name.clone(), tx.clone());
                tokio::spawn(async move { hub.job_ended(&name, &tx, job_id, incarnation, end).await });
            }
            Ok(AgentMessage::Register { info, running, .. }) => {
                if info.name != *name {
                    tracing::warn!(node = %name, "agent tried to rename itself to {}", info.name);
                    return Flow::Close;
                }
                match hub.register(&info, &running).await {
                    // A registration that started a new epoch is a new session's: the agent learns the
                    // epoch from its welcome.
                    Ok(now) if now == epoch => {}
                    Ok(_) => return Flow::Close,
                    Err(e) => tracing::warn!(node = %name, "re-registration failed: {}", e.message()),
                }
            }
            Err(e) => {
                tracing::warn!(node = %name, "dropping agent session: {e}");
                return Flow::Close;
            }
        }
        Flow::Continue
    }

    /// The node's assignments may have changed: send them, once this leader has caught up, unless they are what
    /// the agent already has; a session whose epoch is over closes.
    async fn on_change(&mut self) -> Flow {
        let (hub, name, epoch, tx) = (&self.hub, &self.name, self.epoch, &self.tx);
        tokio::time::sleep(Duration::from_millis(ASSIGNMENT_COALESCE_MS)).await;
        if !hub.is_caught_up() {
            // Not before this leader has applied what was committed before it: wait for the catch-up.
            let (hub, changed) = (hub.clone(), self.changed.clone());
            tokio::spawn(async move {
                let caught_up = hub.caught_up.notified();
                if !hub.is_caught_up() {
                    let _ = tokio::time::timeout(Duration::from_millis(500), caught_up).await;
                }
                changed.notify_one();
            });
            return Flow::Continue;
        }
        let message = hub.assignments(name);
        let ControllerMessage::Assignments { jobs, lingering, allow_root_jobs, epoch: now, reboot, .. } = &message
        else {
            unreachable!("assignments() makes Assignments")
        };
        if *now != epoch || hub.node_epoch(name).is_none_or(|(_, up)| !up) {
            // Declared down, or registered anew through another session: this one speaks for an epoch
            // that is over. The agent registers again (listing what still runs) and gets a new one.
            tracing::info!(node = %name, epoch, "the node's registration changed; closing its session");
            return Flow::Close;
        }
        // What the agent acts on: the incarnations, their stop orders, time limits (scontrol update on a running
        // job) and suspensions; a change to any of them is sent.
        let jobs: Vec<JobFingerprint> = jobs
            .iter()
            .map(|a| (a.job.id, a.job.incarnation, a.cancelled(), a.job.time_limit_s, a.job.suspended_since()))
            .collect();
        let fingerprint = (jobs, lingering.clone(), (*allow_root_jobs, *reboot));
        if self.last_sent.as_ref() != Some(&fingerprint) {
            if tx.send(message).await.is_err() {
                return Flow::Close;
            }
            self.last_sent = Some(fingerprint);
        }
        Flow::Continue
    }
}

/// What a heartbeat carries besides liveness.
struct NodeReport {
    gpu_faults: Vec<drover_proto::wire::GpuFaultReport>,
    gpus_reset: Vec<u32>,
    progress: Vec<(JobId, u64, Option<u64>)>,
    health_check: Option<String>,
    rebooted: Option<u64>,
}

/// The most GPU faults and progress reports taken from one heartbeat.
const MAX_REPORTS_PER_HEARTBEAT: usize = 64;

/// GPU faults by their remedy, GPUs back from a reset, progress markers and a failed health check: proposed in
/// the background, each only when the state does not already show it (faults are repeated every heartbeat).
fn act_on_report(hub: &Arc<AgentHub>, node: &str, report: NodeReport) {
    use drover_state::node::XidAction;
    let now_ms = crate::runtime::now_ms();
    let mut commands = Vec::new();
    {
        let applied = hub.view.read();
        let Some(n) = applied.state.nodes.get(node) else { return };
        for fault in report.gpu_faults.into_iter().take(MAX_REPORTS_PER_HEARTBEAT) {
            let done = match fault.action {
                XidAction::Ignore => true,
                XidAction::RestartApp => false,
                XidAction::ResetGpu => n.drained_gpus.contains_key(&fault.gpu),
                XidAction::RebootNode | XidAction::Hardware => n.drain,
            };
            if !done {
                commands.push(Command::GpuFault { node: node.to_string(), fault });
            }
        }
        let reset: Vec<u32> = report
            .gpus_reset
            .into_iter()
            .filter(|g| n.drained_gpus.get(g).is_some_and(|d| d.action == XidAction::ResetGpu))
            .collect();
        if !reset.is_empty() {
            commands.push(Command::GpusReset { node: node.to_string(), gpus: reset });
        }
        for (job_id, incarnation, step) in report.progress.into_iter().take(MAX_REPORTS_PER_HEARTBEAT) {
            // The agent speaks only for jobs on its node.
            let on_node = n.jobs.contains(&job_id);
            if on_node && super::hangs::progress_worth_writing(&applied.state, job_id, incarnation, now_ms) {
                commands.push(Command::RecordProgress { job_id, incarnation, step, by_uid: 0 });
            }
        }
        if let Some(id) = report.rebooted
            && n.reboot.as_ref().is_some_and(|r| r.id == id)
        {
            commands.push(Command::NodeRebooted { node: node.to_string(), id });
        }
        if let Some(reason) = report.health_check
            && !n.drain
        {
            let names = vec![node.to_string()];
            commands.push(Command::DrainNodes { names, drain: true, reason, by_uid: 0, requeue_jobs: false });
        }
    }
    if commands.is_empty() {
        return;
    }
    let (hub, node) = (hub.clone(), node.to_string());
    tokio::spawn(async move {
        for command in commands {
            let kind = command.kind();
            match propose_checked(&hub.proposer, command).await {
                Ok(Ok(_)) => {}
                Ok(Err(refused)) => tracing::info!(node, kind, "node report refused: {refused}"),
                Err(e) => tracing::warn!(node, kind, "node report not committed: {}", e.message()),
            }
        }
    });
}

/// A node whose agent reports problems (failed GPUs, a wrong inventory) is drained, once, with its reasons.
fn drain_for_problems(hub: &Arc<AgentHub>, node: &str, problems: &[String]) {
    let already = hub.view.read().state.nodes.get(node).is_none_or(|n| n.drain);
    if already {
        return;
    }
    let reason: Vec<&str> = problems.iter().take(8).map(String::as_str).collect();
    // The leader drains on the node's behalf, as uid 0 (audited as the controllers' own action).
    // Its jobs are requeued: they are stopped (warning signal, SIGTERM, KillWait, SIGKILL) and resume elsewhere
    // from their checkpoints.
    let command = Command::DrainNodes {
        names: vec![node.to_string()],
        drain: true,
        reason: reason.join("; "),
        by_uid: 0,
        requeue_jobs: true,
    };
    let hub = hub.clone();
    let node = node.to_string();
    tokio::spawn(async move {
        if let Err(e) = propose(&hub.proposer, command).await {
            tracing::warn!(node, "draining for GPU health failed: {}", e.message());
        }
    });
}

/// While this replica leads: wakes each node's session when its assignments may have changed, and declares
/// silent nodes down.
pub async fn leader_loops(hub: Arc<AgentHub>) {
    let mut changes = hub.view.node_changes();
    // Liveness is judged four times a heartbeat (at most every 250 ms): a silent node is noticed within a
    // fraction of a heartbeat of its deadline. (It is a scan of the nodes in memory: cheap even at 10k nodes.)
    let mut tick = tokio::time::interval(Duration::from_millis((hub.timing.heartbeat_ms / 4).clamp(10, 250)));
    // One liveness check at a time, off this loop, so node-change notices keep flowing while it commits.
    let checking = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Hangs are judged once a second (timeouts are minutes), one check at a time.
    let hang_every = (1_000 / (hub.timing.heartbeat_ms / 4).clamp(10, 250)).max(1);
    let (mut ticks, judging_hangs) = (0u64, Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let catching_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut leadership = hub.raft.server_metrics();
    loop {
        // A new leader catches up with its commit at once (and retries until it has), before any assignment.
        if hub.is_leader() && !hub.is_caught_up() && !catching_up.swap(true, Ordering::AcqRel) {
            let (hub, catching_up) = (hub.clone(), catching_up.clone());
            tokio::spawn(async move {
                // Not after Raft stopped: its last server metrics may still say it leads, and this task would
                // keep the hub (and the store under it) alive.
                while hub.is_running() && hub.is_leader() && !hub.is_caught_up() {
                    hub.catch_up().await;
                    if !hub.is_caught_up() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                catching_up.store(false, Ordering::Release);
            });
        }
        tokio::select! {
            // In order, not at random: the deterministic simulation replays seeds.
            biased;
            changed = leadership.changed() => {
                if changed.is_err() {
                    return;
                }
            }
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
                    *hub.liveness.lock().expect("liveness poisoned") = Liveness::default();
                    continue;
                }
                hub.liveness.lock().expect("liveness poisoned").for_term(hub.term());
                // Judged only by a leader that has caught up: a decision names the node's epoch, which must be
                // the newest committed one.
                if !hub.is_caught_up() {
                    continue;
                }
                if !checking.swap(true, Ordering::AcqRel) {
                    let (hub, checking) = (hub.clone(), checking.clone());
                    tokio::spawn(async move {
                        declare_silent_nodes_down(&hub).await;
                        checking.store(false, Ordering::Release);
                    });
                }
                if hub.timing.fence_command.is_some() {
                    fence_suspects(&hub);
                }
                ticks += 1;
                if ticks % hang_every == 0 && !judging_hangs.swap(true, Ordering::AcqRel) {
                    let (hub, judging) = (hub.clone(), judging_hangs.clone());
                    tokio::spawn(async move {
                        super::hangs::declare_hung_jobs(&hub.proposer, &hub.view).await;
                        judging.store(false, Ordering::Release);
                    });
                }
            }
        }
    }
}

/// Declares down every node silent for `node_timeout_ms` (rule 2 of the module's comment): each is condemned
/// for its epoch under the liveness lock, so no lease for that epoch is granted from then on, and `NodeDown` is
/// proposed for it on every check until the state shows the node down or registered anew.
async fn declare_silent_nodes_down(hub: &Arc<AgentHub>) {
    let timeout = Duration::from_millis(hub.timing.node_timeout_ms);
    let up: Vec<(String, u64)> = {
        let applied = hub.view.read();
        applied
            .state
            .nodes
            .values()
            .filter(|n| n.health == NodeHealth::Up)
            .map(|n| (n.info.name.clone(), n.epoch))
            .collect()
    };
    let term = hub.term();
    let decided: Vec<(String, u64)> = {
        let mut guard = hub.liveness.lock().expect("liveness poisoned");
        let liveness = guard.for_term(term);
        // Done with: the state shows the node down, or up in a later epoch.
        liveness.condemned.retain(|name, epoch| up.iter().any(|(n, e)| n == name && e == epoch));
        let mut decided = Vec::new();
        for (name, epoch) in up {
            if liveness.condemned.get(&name) == Some(&epoch) || liveness.silent(&name, timeout) {
                liveness.condemned.insert(name.clone(), epoch);
                decided.push((name, epoch));
            }
        }
        decided
    };
    // All at once: openraft batches concurrent proposals, so a rack going dark costs a few fsyncs, not one each.
    let downs = decided.into_iter().take(MAX_NODE_DOWNS_PER_TICK).map(|(name, epoch)| {
        let hub = hub.clone();
        async move {
            tracing::warn!(node = %name, epoch, "no heartbeat for {} ms: declaring the node DOWN", hub.timing.node_timeout_ms);
            let command = Command::NodeDown { name: name.clone(), reason: "Not responding".into(), epoch: Some(epoch) };
            match propose_checked(&hub.proposer, command).await {
                Ok(Ok(_)) => {}
                // Registered anew meanwhile (possible only through another leader's term): nothing to do.
                Ok(Err(refused)) => tracing::info!(node = %name, "node-down decision refused: {refused}"),
                // Still condemned: the next check proposes it again.
                Err(e) => tracing::warn!(node = %name, "declaring the node down failed: {}", e.message()),
            }
        }
    });
    futures::future::join_all(downs).await;
}

/// With a fence command configured (a BMC power-off, say): a node silent for `suspect_after_ms` is fenced by
/// it, and once the command succeeds the node is declared down at once, without waiting for `node_timeout_ms`:
/// a node that is off cannot run a second incarnation. One attempt per silent node at a time. The epoch is the
/// one the node was suspected in: if it registers anew while the command runs, the decision is refused.
fn fence_suspects(hub: &Arc<AgentHub>) {
    let suspect_after = Duration::from_millis(hub.timing.suspect_after_ms);
    let candidates: Vec<(String, String, u64)> = {
        let applied = hub.view.read();
        let liveness = hub.liveness.lock().expect("liveness poisoned");
        applied
            .state
            .nodes
            .values()
            .filter(|n| n.health == NodeHealth::Up && liveness.silent(&n.info.name, suspect_after))
            .map(|n| (n.info.name.clone(), n.info.host.clone(), n.epoch))
            .collect()
    };
    for (node, host, epoch) in candidates {
        if !hub.fencing.lock().expect("fencing poisoned").insert(node.clone()) {
            continue;
        }
        let hub = hub.clone();
        tokio::spawn(async move {
            let fenced = run_fence_command(&hub, &node, &host).await;
            if fenced {
                // Off: no lease for this epoch from here on, whatever heartbeat was still on its way.
                let term = hub.term();
                hub.liveness.lock().expect("liveness poisoned").for_term(term).condemned.insert(node.clone(), epoch);
                let reason = "Not responding; fenced by the fence command".to_string();
                let command = Command::NodeDown { name: node.clone(), reason, epoch: Some(epoch) };
                match propose_checked(&hub.proposer, command).await {
                    Ok(Ok(_)) => tracing::warn!(node = %node, "node fenced and declared DOWN; its jobs are requeued"),
                    Ok(Err(refused)) => tracing::info!(node = %node, "fenced node not declared down: {refused}"),
                    Err(e) => tracing::warn!(node = %node, "declaring the fenced node down failed: {}", e.message()),
                }
            }
            hub.fencing.lock().expect("fencing poisoned").remove(&node);
        });
    }
}

/// Runs the configured fence command for one node, with a bounded time. True only if it exited 0. The template is
/// split into words once (shell quoting rules, no shell runs it) and `{node}` and `{host}` are substituted inside
/// each word, so whatever a node registered stays one argument: it can never become a second command.
async fn run_fence_command(hub: &AgentHub, node: &str, host: &str) -> bool {
    let Some(template) = &hub.timing.fence_command else { return false };
    let argv = match crate::config::fence_argv(template, node, host) {
        Ok(argv) => argv,
        Err(e) => {
            tracing::error!(node, "the fence command cannot run: {e}");
            return false;
        }
    };
    tracing::warn!(node, ?argv, "node silent: running the fence command");
    let child = tokio::process::Command::new(&argv[0]).args(&argv[1..]).kill_on_drop(true).output();
    match tokio::time::timeout(Duration::from_millis(hub.timing.fence_command_timeout_ms), child).await {
        Ok(Ok(out)) if out.status.success() => true,
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            tracing::error!(node, status = %out.status, "the fence command failed: {}", stderr.trim());
            false
        }
        Ok(Err(e)) => {
            tracing::error!(node, "the fence command could not run: {e}");
            false
        }
        Err(_) => {
            tracing::error!(node, "the fence command took longer than {} ms", hub.timing.fence_command_timeout_ms);
            false
        }
    }
}
