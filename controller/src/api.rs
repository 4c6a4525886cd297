//! The client API (`DroverService`). Writes go through Raft on the leader; a follower forwards them (one hop)
//! or, when it cannot, answers with the leader's address in the `x-drover-leader` metadata entry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

// The leader's clock for stamping entries: the wall clock, or the simulation's (see `runtime`).
use crate::leader::LeaderHandle;
use crate::runtime::now_ms;

use drover_proto::v1::drover_service_client::DroverServiceClient;
use drover_proto::v1::drover_service_server::DroverService;
use drover_proto::v1::*;
use drover_state::{Command, CommandError, Job, JobSpec, JobState, Reply};
use openraft::ReadPolicy;
use openraft::async_runtime::WatchReceiver;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::propose::{WRITE_TIMEOUT_MS, command_error_status, name_leader, not_leader, propose, write_error};
use crate::security::{Caller, Security};
use crate::store::StateView;
use crate::types::{Raft, ReplicaNode};
use drover_state::AdminLevel;

/// How long a forwarded call may take.
const FORWARD_TIMEOUT_MS: u64 = 3_500;
/// How long a call waits on a follower for a new leader during an election (a failover takes about half a second).
const LEADER_WAIT_MS: u64 = 1_500;
/// The most jobs one listing returns.
pub const MAX_LIST_JOBS: usize = 100_000;
/// The most job ids one cancel/hold/release names.
const MAX_IDS_PER_REQUEST: usize = 10_000;
/// Client request ids are short opaque tokens (they are stored as keys).
const MAX_REQUEST_ID_BYTES: usize = 128;
/// Marks a forwarded call, so a follower never forwards twice.
const FORWARDED_KEY: &str = "x-drover-forwarded";
/// A backup streams in chunks of this size, at most this many buffered ahead of the client.
const BACKUP_CHUNK_BYTES: usize = 1 << 20;
const BACKUP_CHUNKS_IN_FLIGHT: usize = 8;
/// The backup thread's nice value (0 is the replica's own; 19 the lowest priority).
const BACKUP_NICE: libc::c_int = 10;
/// The most audit entries one listing returns.
const MAX_LIST_AUDIT: usize = 10_000;
/// A step runs on its job's nodes (a job has at most so many) under a program name of bounded length.
const MAX_STEP_NODES: usize = 100_000;
const MAX_STEP_NAME_BYTES: usize = 4_096;

pub struct Api {
    pub id: u64,
    /// What the API may ask of the leader's sessions and scheduling loop.
    pub leader: LeaderHandle,
    /// Forwarded calls leave from this replica's own address, like its Raft traffic.
    local_ip: Option<std::net::IpAddr>,
    /// Verifies callers' credentials; makes the TLS connections to the leader.
    security: std::sync::Arc<Security>,
    pub raft: Raft,
    /// Writes go through the replica's batching write path.
    proposer: crate::propose::Proposer,
    pub view: StateView,
    peers: Mutex<HashMap<String, DroverServiceClient<Channel>>>,
    /// One backup at a time per replica: each holds a checkpoint of the database on disk while it streams.
    backup_slot: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Hands a backup's bytes to its gRPC stream in chunks; fails (and so stops the backup) when the client is gone.
struct ChunkSender {
    tx: tokio::sync::mpsc::Sender<Result<BackupChunk, Status>>,
    buf: Vec<u8>,
}

impl std::io::Write for ChunkSender {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(BACKUP_CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == BACKUP_CHUNK_BYTES {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(BACKUP_CHUNK_BYTES));
        self.tx
            .blocking_send(Ok(BackupChunk { data }))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client stopped reading the backup"))
    }
}

fn internal(context: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{context}: {e}"))
}

/// What to do with a call on this replica.
enum Route {
    Local,
    /// To the leader, by id and address.
    Forward(u64, String),
}

impl Api {
    pub fn new(
        id: u64,
        proposer: crate::propose::Proposer,
        view: StateView,
        local_ip: Option<std::net::IpAddr>,
        leader: LeaderHandle,
        security: std::sync::Arc<Security>,
    ) -> Api {
        let raft = proposer.raft().clone();
        Api {
            id,
            leader,
            local_ip,
            security,
            raft,
            proposer,
            view,
            peers: Mutex::new(HashMap::new()),
            backup_slot: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The leader's id and address as this replica knows them.
    fn leader(&self) -> Option<(u64, String)> {
        // Server metrics change only with leadership and membership: cheap to read on every call.
        let metrics = self.raft.server_metrics().borrow_watched().clone();
        let leader = metrics.current_leader?;
        let node = metrics.membership_config.membership().get_node(&leader)?.clone();
        Some((leader, node.addr))
    }

    /// Where a call goes. During an election, the call waits here (bounded) for the new leader rather than
    /// sending the client away to poll.
    async fn route<T>(&self, request: &Request<T>) -> Result<Route, Status> {
        let leader = match self.leader() {
            Some(leader) => Some(leader),
            None => self.wait_for_leader(None, wait_budget(request)).await,
        };
        match leader {
            Some((id, _)) if id == self.id => Ok(Route::Local),
            Some((id, addr)) if request.metadata().get(FORWARDED_KEY).is_none() => Ok(Route::Forward(id, addr)),
            Some((_, addr)) => Err(not_leader(Some(&addr))),
            None => Err(not_leader(None)),
        }
    }

    /// Waits up to `budget` until this replica knows a leader other than `not` (the one that just stopped
    /// answering), and returns it. Server metrics change with leadership, so this wakes as soon as one is elected.
    async fn wait_for_leader(&self, not: Option<u64>, budget: Duration) -> Option<(u64, String)> {
        let mut metrics = self.raft.server_metrics();
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            if let Some(leader) = self.leader().filter(|(id, _)| Some(*id) != not) {
                return Some(leader);
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }

    fn peer(&self, addr: &str) -> Result<DroverServiceClient<Channel>, Status> {
        let mut peers = self.peers.lock().expect("peer map poisoned");
        if let Some(client) = peers.get(addr) {
            return Ok(client.clone());
        }
        let channel = self.security.controller_channel(addr, self.local_ip)?;
        let client = DroverServiceClient::new(channel).max_decoding_message_size(256 << 20);
        peers.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// Sends a call on to the leader: the same message with the caller's credential (the leader verifies it
    /// again), marked so the leader never forwards it further.
    async fn forward<Req, Resp, F, Fut>(
        &self,
        leader: u64,
        addr: &str,
        request: Request<Req>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(DroverServiceClient<Channel>, Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
    {
        let credential = request.metadata().get(drover_auth::credential::CREDENTIAL_METADATA_KEY).cloned();
        let started = tokio::time::Instant::now();
        let budget = wait_budget(&request);
        let mut forwarded = Request::new(request.into_inner());
        forwarded.set_timeout(Duration::from_millis(FORWARD_TIMEOUT_MS));
        forwarded.metadata_mut().insert(FORWARDED_KEY, "1".parse().expect("ascii"));
        if let Some(credential) = credential {
            forwarded.metadata_mut().insert(drover_auth::credential::CREDENTIAL_METADATA_KEY, credential);
        }
        let mut response = match call(self.peer(addr)?, forwarded).await {
            Ok(response) => response,
            Err(status) if no_answer_from(&status) => {
                // The leader is gone (crashed, cut off): once a new one is elected, send the client there.
                let budget = budget.saturating_sub(started.elapsed());
                return Err(match self.wait_for_leader(Some(leader), budget).await {
                    Some((_, new)) => not_leader(Some(&new)),
                    None => forward_failed(addr, status),
                });
            }
            Err(status) => return Err(forward_failed(addr, status)),
        };
        // Tell the client where the leader is, so its next call skips this hop.
        name_leader(response.metadata_mut(), addr);
        Ok(response)
    }

    async fn write(&self, command: Command) -> Result<Reply, Status> {
        propose(&self.proposer, command).await
    }

    /// Whether a progress report should be written (see [`crate::leader::hangs::progress_worth_writing`]).
    fn progress_worth_writing(&self, job_id: u64, incarnation: u64) -> bool {
        crate::leader::hangs::progress_worth_writing(&self.view.read().state, job_id, incarnation, now_ms())
    }

    /// Refuses a command that the current state would refuse, without a log entry (`apply` decides again on the
    /// state it commits on).
    fn precheck(&self, command: &Command) -> Result<(), Status> {
        match self.view.read().state.precheck(command, now_ms()) {
            Ok(()) | Err(CommandError::NotInitialized) => Ok(()),
            Err(e) => Err(command_error_status(&e)),
        }
    }

    /// The caller's administrative level, from the replicated roles.
    fn level(&self, caller: &Caller) -> AdminLevel {
        self.view.read().state.level_of(caller.uid)
    }

    /// Refuses a caller below `needed` (the state machine checks again for everything it applies).
    fn require(&self, caller: &Caller, needed: AdminLevel, what: &str) -> Result<(), Status> {
        self.view.read().state.require_level(caller.uid, needed, what).map_err(|e| command_error_status(&e))
    }

    /// What one caller may see of another's job (Slurm's PrivateData): not its environment or arguments.
    /// The ids whose finished jobs a listing of `ids` may return: all of them when none are named; otherwise from
    /// the lowest to the highest named, or to the last task of a named array (an array's id names its tasks, whose
    /// ids follow it).
    fn history_range(&self, ids: &std::collections::HashSet<u64>) -> std::io::Result<std::ops::RangeInclusive<u64>> {
        let (Some(&from), Some(&to)) = (ids.iter().min(), ids.iter().max()) else {
            return Ok(1..=u64::MAX);
        };
        let mut last = to;
        for &id in ids {
            let tasks = self.view.job(id)?.and_then(|j| j.array.filter(|a| a.array_job_id == id).map(|a| a.task_count));
            last = last.max(id.saturating_add(u64::from(tasks.unwrap_or(1)).saturating_sub(1)));
        }
        Ok(from..=last)
    }

    fn redact(&self, caller: &Caller, jobs: &mut [Job]) {
        if self.level(caller) >= AdminLevel::Operator {
            return;
        }
        for job in jobs.iter_mut().filter(|j| j.spec.uid != caller.uid) {
            job.spec.environment.clear();
            job.spec.script_args.clear();
        }
    }

    /// Waits until this leader's state reflects every write acknowledged before the call (read index).
    ///
    /// The leader's lease (openraft's, the election timeout, renewed by every quorum acknowledgement) answers
    /// without a round trip; only when it has lapsed does the read go through a ReadIndex round, which waits for
    /// the next heartbeat round (tens of ms: `squeue` took ~50 ms that way). The lease assumes bounded clock drift
    /// over one election timeout, as etcd's and TiKV's lease reads do.
    async fn linearize(&self) -> Result<(), Status> {
        if self.raft.ensure_linearizable(ReadPolicy::LeaseRead).await.is_ok() {
            return Ok(());
        }
        let read = self.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(Duration::from_millis(WRITE_TIMEOUT_MS), read).await {
            Err(_) => Err(Status::unavailable("leadership could not be confirmed by a quorum in time; retry")),
            Ok(Err(e)) => match e.forward_to_leader() {
                Some(f) => Err(not_leader(f.leader_node.as_ref().map(|n| n.addr.as_str()))),
                None => Err(Status::unavailable(format!("linearizable read failed: {e}"))),
            },
            Ok(Ok(_)) => Ok(()),
        }
    }

    async fn job_ids_command(
        &self,
        request: Request<JobIdsRequest>,
        make: fn(Vec<u64>, u32, bool) -> Command,
        call: &'static str,
    ) -> Result<Response<JobOutcomesReply>, Status> {
        if let Route::Forward(leader, addr) = self.route(&request).await? {
            return self
                .forward(leader, &addr, request, |mut peer, fwd| async move {
                    match call {
                        "cancel" => peer.cancel_jobs(fwd).await,
                        "hold" => peer.hold_jobs(fwd).await,
                        "top" => peer.top_jobs(fwd).await,
                        "suspend" => peer.suspend_jobs(fwd).await,
                        "resume" => peer.resume_jobs(fwd).await,
                        _ => peer.release_jobs(fwd).await,
                    }
                })
                .await;
        }
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        if message.job_ids.is_empty() || message.job_ids.len() > MAX_IDS_PER_REQUEST {
            return Err(Status::invalid_argument(format!(
                "name between 1 and {MAX_IDS_PER_REQUEST} job ids (got {})",
                message.job_ids.len()
            )));
        }
        let reply = self.write(make(message.job_ids, caller.uid, message.user_hold)).await?;
        let Reply::Jobs(outcomes) = reply else {
            return Err(Status::internal("unexpected reply to a job command"));
        };
        Ok(Response::new(JobOutcomesReply { outcomes: outcomes.into_iter().map(outcome).collect() }))
    }

    /// This replica's status and, unless `local_only`, every other member's as it answers (an unreachable one
    /// says why), by id. The web page shows the same table as `drover cluster status`.
    pub async fn replica_statuses(&self, local_only: bool) -> Vec<ReplicaStatus> {
        let mut replicas = vec![self.local_status()];
        if local_only {
            return replicas;
        }
        let members: Vec<(u64, ReplicaNode)> = {
            let m = self.raft.metrics().borrow_watched().clone();
            m.membership_config.membership().nodes().map(|(id, n)| (*id, n.clone())).collect()
        };
        let mut asks = Vec::new();
        for (id, node) in members.into_iter().filter(|(id, _)| *id != self.id) {
            let address = node.addr.clone();
            let unreachable = move |error: String| ReplicaStatus {
                id,
                address: address.clone(),
                role: "unreachable".into(),
                reachable: false,
                error,
                ..Default::default()
            };
            let client = match self.peer(&node.addr) {
                Ok(client) => client,
                Err(e) => {
                    replicas.push(unreachable(e.message().to_string()));
                    continue;
                }
            };
            asks.push(async move {
                let mut client = client;
                let mut req = Request::new(ClusterStatusRequest { local_only: true });
                req.set_timeout(Duration::from_millis(1_000));
                match client.cluster_status(req).await {
                    Ok(r) => r.into_inner().replicas.into_iter().next().unwrap_or_default(),
                    Err(e) => unreachable(e.message().to_string()),
                }
            });
        }
        replicas.extend(futures::future::join_all(asks).await);
        replicas.sort_by_key(|r| r.id);
        replicas
    }

    fn local_status(&self) -> ReplicaStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voter = membership.voter_ids().any(|v| v == self.id);
        let role = match m.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Follower if !voter => "learner",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "shutdown",
        };
        let address = membership.get_node(&self.id).map(|n| n.addr.clone()).unwrap_or_default();
        ReplicaStatus {
            id: self.id,
            address,
            role: role.to_string(),
            term: m.current_term,
            leader_id: m.current_leader.unwrap_or(0),
            has_leader: m.current_leader.is_some(),
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.as_ref().map(|l| l.index()).unwrap_or(0),
            voter,
            reachable: true,
            error: match &m.running_state {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            },
            version: Some(drover_proto::this_build()),
        }
    }

    /// `drover cluster version`, as this replica (the leader) sees the cluster now.
    async fn version_report(&self) -> ClusterVersionReply {
        let replicas: Vec<MemberVersion> = self
            .replica_statuses(false)
            .await
            .into_iter()
            .map(|r| MemberVersion {
                id: r.id,
                address: r.address,
                voter: r.voter,
                version: r.version,
                reachable: r.reachable,
                error: r.error,
            })
            .collect();
        let agents = self
            .leader
            .agent_versions()
            .into_iter()
            .map(|(node, binary_version, feature_level)| AgentVersion {
                node,
                // An agent from before feature levels says only its build (level 1 is implied).
                version: Some(SoftwareVersion { binary_version, feature_level, state_format_version: 0 }),
            })
            .collect();
        ClusterVersionReply {
            active_feature_level: self.view.read().state.feature_level(),
            leader_id: self.id,
            finalizable_level: finalizable_level(&replicas),
            replicas,
            agents,
            levels: drover_state::feature::LEVELS
                .iter()
                .map(|l| FeatureLevelInfo { level: l.level, name: l.name.to_string(), summary: l.summary.to_string() })
                .collect(),
        }
    }
}

/// The highest feature level a member understands: `None` when it did not answer (it cannot be asked, so nothing
/// may be finalized past it); a member that answered without a version is a build from before feature levels.
fn member_level(r: &MemberVersion) -> Option<u32> {
    match (&r.version, r.reachable) {
        (_, false) => None,
        (Some(v), true) => Some(drover_state::feature::effective(v.feature_level)),
        (None, true) => Some(drover_state::feature::BASE_LEVEL),
    }
}

/// The highest feature level every member understands (0 while one does not answer).
fn finalizable_level(replicas: &[MemberVersion]) -> u32 {
    replicas.iter().map(|r| member_level(r).unwrap_or(0)).min().unwrap_or(0)
}

/// Why finalizing `level` must wait, naming each member that stands in the way.
fn finalize_blockers(replicas: &[MemberVersion], level: u32) -> Vec<String> {
    let blocks = |r: &MemberVersion| match (member_level(r), &r.version) {
        (None, _) => Some(format!("did not answer ({})", r.error)),
        (Some(_), None) => Some("runs a build from before feature levels (level 1)".to_string()),
        (Some(understood), Some(v)) if understood < level => {
            Some(format!("runs {} (levels up to {understood})", v.binary_version))
        }
        _ => None,
    };
    replicas.iter().filter_map(|r| blocks(r).map(|why| format!("replica {} at {} {why}", r.id, r.address))).collect()
}

/// One job's outcome on the wire.
fn outcome(o: drover_state::JobOutcome) -> JobOutcome {
    match o.result {
        Ok(()) => JobOutcome { job_id: o.id, ok: true, ..Default::default() },
        Err(e) => JobOutcome {
            job_id: o.id,
            ok: false,
            error: e.to_string(),
            error_details: drover_proto::command_error_details(&e),
        },
    }
}

/// A forward that got no answer means this replica cannot reach the leader: say so, and let the client try
/// another controller.
/// How long a call may wait here for a new leader: `LEADER_WAIT_MS`, and at most half of what is left of the
/// caller's own deadline (gRPC's `grpc-timeout`), so the caller still hears the reason rather than timing out.
fn wait_budget<T>(request: &Request<T>) -> Duration {
    let most = Duration::from_millis(LEADER_WAIT_MS);
    let caller = request.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(grpc_timeout);
    caller.map_or(most, |left| most.min(left / 2))
}

/// gRPC's timeout header: an integer and a unit (H, M, S, m, u, n).
fn grpc_timeout(text: &str) -> Option<Duration> {
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3_600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn no_answer_from(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled | tonic::Code::Unknown
    )
}

fn forward_failed(addr: &str, status: Status) -> Status {
    match status.code() {
        _ if no_answer_from(&status) => Status::unavailable(format!(
            "this controller cannot reach the leader at {addr} ({}); it may be cut off from the quorum",
            status.message()
        )),
        _ => status,
    }
}

fn parse_consistency(value: i32) -> ReadConsistency {
    ReadConsistency::try_from(value).unwrap_or(ReadConsistency::Linearizable)
}

/// Whether a job passes `squeue`/`sacct` style filters.
/// A set, not the request's list: a listing tests every job against it, and 10,000 ids tested by a linear
/// search against a million jobs took long enough (10^10 comparisons) to starve the replica into elections.
fn job_matches(job: &Job, ids: &std::collections::HashSet<u64>, users: &[String], states: &[JobState]) -> bool {
    // An array's id names all of its tasks (`scancel 123`, `squeue -j 123`), as in Slurm.
    (ids.is_empty() || ids.contains(&job.id) || job.array.as_deref().is_some_and(|a| ids.contains(&a.array_job_id)))
        && (users.is_empty() || users.iter().any(|u| *u == job.spec.user))
        && (states.is_empty() || states.contains(&job.state))
}

/// A follower sends the call on to the leader (one hop) and returns its answer; the leader serves it below.
macro_rules! forward_if_follower {
    ($api:ident, $request:ident, $method:ident) => {
        if let Route::Forward(leader, addr) = $api.route(&$request).await? {
            return $api.forward(leader, &addr, $request, |mut peer, fwd| async move { peer.$method(fwd).await }).await;
        }
    };
}

/// A linearizable read is served by the leader once it has confirmed its leadership; a stale one by any replica.
macro_rules! linearizable_read {
    ($api:ident, $request:ident, $method:ident) => {
        if parse_consistency($request.get_ref().consistency) == ReadConsistency::Linearizable {
            forward_if_follower!($api, $request, $method);
            $api.linearize().await?;
        }
    };
}

#[tonic::async_trait]
impl DroverService for Api {
    async fn submit_job(&self, request: Request<SubmitJobRequest>) -> Result<Response<SubmitJobReply>, Status> {
        forward_if_follower!(self, request, submit_job);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        let mut spec: JobSpec = drover_state::codec::decode(&message.spec)
            .map_err(|e| Status::invalid_argument(format!("malformed job spec: {e}")))?;
        // The job runs as whoever the credential says submitted it, whatever the spec claims.
        spec.uid = caller.uid;
        spec.gid = caller.gid;
        spec.user = caller.user.as_str().into();
        let rid = message.request_id;
        if rid.len() > MAX_REQUEST_ID_BYTES || !rid.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Status::invalid_argument(format!(
                "request_id must be at most {MAX_REQUEST_ID_BYTES} printable ASCII bytes"
            )));
        }
        let request_id = if rid.is_empty() { None } else { Some(rid) };
        let command = Command::SubmitJob { spec: Box::new(spec), request_id };
        self.precheck(&command)?;
        match self.write(command).await? {
            Reply::Submitted { job_id, duplicate } => Ok(Response::new(SubmitJobReply { job_id, duplicate })),
            other => Err(internal("unexpected reply to submit", format!("{other:?}"))),
        }
    }

    async fn cancel_jobs(&self, request: Request<JobIdsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        self.job_ids_command(request, |ids, by_uid, _| Command::CancelJobs { ids, by_uid }, "cancel").await
    }

    async fn hold_jobs(&self, request: Request<JobIdsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        self.job_ids_command(
            request,
            |ids, by_uid, user_hold| Command::HoldJobs { ids, by_uid, user_hold: Some(user_hold) },
            "hold",
        )
        .await
    }

    async fn release_jobs(&self, request: Request<JobIdsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        self.job_ids_command(request, |ids, by_uid, _| Command::ReleaseJobs { ids, by_uid }, "release").await
    }

    async fn get_job(&self, request: Request<GetJobRequest>) -> Result<Response<GetJobReply>, Status> {
        linearizable_read!(self, request, get_job);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        let job = self
            .view
            .job(message.job_id)
            .map_err(|e| internal("reading job", e))?
            .ok_or_else(|| command_error_status(&CommandError::InvalidJobId { id: message.job_id }))?;
        let script = if message.with_script {
            if job.spec.uid != caller.uid && self.level(&caller) < AdminLevel::Operator {
                return Err(command_error_status(&CommandError::PermissionDenied {
                    id: job.id,
                    owner: job.spec.uid,
                    requester: caller.uid,
                }));
            }
            self.view.script(job.script_id()).map_err(|e| internal("reading script", e))?.unwrap_or_default()
        } else {
            String::new()
        };
        let mut jobs = [job];
        self.view.with_environment(&mut jobs[0]).map_err(|e| internal("reading the job's environment", e))?;
        self.redact(&caller, &mut jobs);
        let job_json = serde_json::to_vec(&jobs[0]).map_err(|e| internal("encoding job", e))?;
        Ok(Response::new(GetJobReply { job_json, script }))
    }

    async fn list_jobs(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsReply>, Status> {
        linearizable_read!(self, request, list_jobs);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        let mut states = Vec::new();
        for name in &message.states {
            states.push(
                JobState::parse(name)
                    .ok_or_else(|| Status::invalid_argument(format!("Invalid job state specified: {name}")))?,
            );
        }
        let limit = match message.limit as usize {
            0 => MAX_LIST_JOBS,
            n => n.min(MAX_LIST_JOBS),
        };
        let ids: std::collections::HashSet<u64> = message.job_ids.iter().copied().collect();
        // A bounded number of jobs per hold of the state lock: a walk over a million jobs in one hold stalls
        // `apply`, and with it the leader's heartbeats.
        let mut jobs: Vec<Job> = Vec::new();
        self.view.for_each_job(|job| {
            if jobs.len() <= limit && job_matches(job, &ids, &message.users, &states) {
                jobs.push(job.clone());
            }
        });
        if message.include_finished && jobs.len() <= limit {
            let room = limit + 1 - jobs.len();
            let range = self.history_range(&ids).map_err(|e| internal("reading history", e))?;
            let since_ms = message.finished_since_ms;
            let (view, users) = (self.view.clone(), message.users.clone());
            // On the blocking pool: a walk over a long history takes a while, and on an async worker it held up
            // the leader's Raft heartbeats with it (its agents' leases went unrenewed for want of a quorum).
            let finished = crate::runtime::run_blocking(move || {
                view.history(range, room, |j| {
                    j.end_time_ms.unwrap_or(0) >= since_ms && job_matches(j, &ids, &users, &states)
                })
            })
            .await
            .and_then(|read| read)
            .map_err(|e| internal("reading history", e))?;
            jobs.extend(finished);
            jobs.sort_by_key(|j| j.id);
        }
        let truncated = jobs.len() > limit;
        jobs.truncate(limit);
        self.redact(&caller, &mut jobs);
        let jobs_json = serde_json::to_vec(&jobs).map_err(|e| internal("encoding jobs", e))?;
        Ok(Response::new(ListJobsReply { jobs_json, truncated }))
    }

    async fn cluster_status(
        &self,
        request: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusReply>, Status> {
        // Controllers ask each other (bootstrap, status gathering) with their certificates alone; everyone else
        // needs a user credential, as for any other call.
        if !self.security.peer_is_controller(&request) {
            self.security.caller(&request)?;
        }
        let (mut active, mut running) = (0u64, 0u64);
        self.view.for_each_job(|job| {
            active += 1;
            running += u64::from(job.state == JobState::Running);
        });
        let (pending, next_job_id) = (active - running, self.view.read().state.meta.next_job_id);
        let replicas = self.replica_statuses(request.get_ref().local_only).await;
        Ok(Response::new(ClusterStatusReply {
            answered_by: self.id,
            replicas,
            pending_jobs: pending,
            running_jobs: running,
            next_job_id,
            nodes_total: self.view.read().state.nodes.len() as u64,
        }))
    }

    async fn add_replica(&self, request: Request<AddReplicaRequest>) -> Result<Response<MembershipReply>, Status> {
        forward_if_follower!(self, request, add_replica);
        let caller = self.security.caller(&request)?;
        self.require(&caller, AdminLevel::Administrator, "changing the replica membership")?;
        let message = request.into_inner();
        if message.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(Status::invalid_argument(format!("{:?} is not an IP:port address", message.address)));
        }
        let detail = format!("id={} address={}", message.id, message.address);
        // Learner first: it catches up (log or snapshot) without counting towards the quorum, and only then
        // becomes a voter, so adding a slow or empty replica never stalls commits.
        let node = ReplicaNode { addr: message.address };
        self.raft.add_learner(message.id, node, true).await.map_err(write_error)?;
        let voters: std::collections::BTreeSet<u64> = [message.id].into();
        self.raft.change_membership(openraft::ChangeMembers::AddVoterIds(voters), false).await.map_err(write_error)?;
        self.record_audit(&caller, "add_replica", detail).await;
        Ok(Response::new(self.membership()))
    }

    async fn remove_replica(
        &self,
        request: Request<RemoveReplicaRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        forward_if_follower!(self, request, remove_replica);
        let caller = self.security.caller(&request)?;
        self.require(&caller, AdminLevel::Administrator, "changing the replica membership")?;
        let id = request.into_inner().id;
        let membership = self.membership();
        if !membership.voters.contains(&id) && !membership.learners.contains(&id) {
            return Err(Status::not_found(format!("replica {id} is not a member")));
        }
        if membership.voters.len() <= 1 && membership.voters.contains(&id) {
            return Err(Status::failed_precondition("cannot remove the last voting replica"));
        }
        let ids: std::collections::BTreeSet<u64> = [id].into();
        // Removing a voter also drops it as a node (retain = false), so the leader stops replicating to it.
        self.raft
            .change_membership(openraft::ChangeMembers::RemoveVoters(ids.clone()), false)
            .await
            .map_err(write_error)?;
        if self.membership().learners.contains(&id) {
            self.raft.change_membership(openraft::ChangeMembers::RemoveNodes(ids), false).await.map_err(write_error)?;
        }
        self.record_audit(&caller, "remove_replica", format!("id={id}")).await;
        Ok(Response::new(self.membership()))
    }

    async fn signal_jobs(&self, request: Request<SignalJobsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        forward_if_follower!(self, request, signal_jobs);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        if !(1..=64).contains(&message.signal) {
            return Err(Status::invalid_argument(format!("Invalid signal {}", message.signal)));
        }
        if message.job_ids.is_empty() || message.job_ids.len() > MAX_IDS_PER_REQUEST {
            return Err(Status::invalid_argument(format!("name between 1 and {MAX_IDS_PER_REQUEST} job ids")));
        }
        self.linearize().await?;
        let privileged = self.level(&caller) >= AdminLevel::Operator;
        let mut outcomes = Vec::new();
        for id in message.job_ids {
            let job = self.view.read().state.job(id).cloned();
            let refusal = match job {
                None => Some(CommandError::InvalidJobId { id }),
                Some(job) if !privileged && caller.uid != job.spec.uid => {
                    Some(CommandError::PermissionDenied { id, owner: job.spec.uid, requester: caller.uid })
                }
                Some(job) if job.nodes.is_empty() => {
                    Some(CommandError::NotRunning { id, state: job.state, cancelling: false })
                }
                Some(job) => {
                    let target = match SignalTarget::try_from(message.target).unwrap_or(SignalTarget::Steps) {
                        SignalTarget::Steps => drover_proto::wire::SignalTarget::Steps,
                        SignalTarget::Batch => drover_proto::wire::SignalTarget::Batch,
                        SignalTarget::Full => drover_proto::wire::SignalTarget::Full,
                    };
                    self.leader.signal(&job, message.signal, target);
                    None
                }
            };
            outcomes.push(outcome(drover_state::JobOutcome { id, result: refusal.map_or(Ok(()), Err) }));
        }
        Ok(Response::new(JobOutcomesReply { outcomes }))
    }

    async fn complete_job(&self, request: Request<CompleteJobRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, complete_job);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let job = self.view.read().state.job(m.job_id).cloned();
        let job = job.ok_or_else(|| command_error_status(&CommandError::AlreadyFinished { id: m.job_id }))?;
        if caller.uid != job.spec.uid && self.level(&caller) < AdminLevel::Operator {
            return Err(command_error_status(&CommandError::PermissionDenied {
                id: m.job_id,
                owner: job.spec.uid,
                requester: caller.uid,
            }));
        }
        if !job.spec.interactive {
            return Err(Status::failed_precondition(format!(
                "job {} is a batch job: it ends when its script does (use scancel to stop it)",
                m.job_id
            )));
        }
        let end =
            drover_state::JobEnd { exit_code: m.exit_code, signal: m.signal, by_client: true, ..Default::default() };
        self.write(Command::JobEnded { job_id: m.job_id, incarnation: m.incarnation, end }).await?;
        Ok(Response::new(Empty {}))
    }

    async fn create_step(&self, request: Request<CreateStepRequest>) -> Result<Response<CreateStepReply>, Status> {
        forward_if_follower!(self, request, create_step);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        if m.nodes.len() > MAX_STEP_NODES || m.name.len() > MAX_STEP_NAME_BYTES {
            return Err(Status::invalid_argument(format!(
                "a step names at most {MAX_STEP_NODES} nodes and a program name of at most {MAX_STEP_NAME_BYTES} bytes"
            )));
        }
        let step =
            (!m.nodes.is_empty()).then_some(drover_state::StepStart { name: m.name, nodes: m.nodes, tasks: m.tasks });
        match self.write(Command::CreateStep { job_id: m.job_id, by_uid: caller.uid, step }).await? {
            Reply::Step { step_id } => {
                let credential =
                    self.security.step_credential(&caller, m.job_id, step_id, &format!("controller-{}", self.id));
                Ok(Response::new(CreateStepReply { step_id, credential }))
            }
            other => Err(internal("unexpected reply to create step", format!("{other:?}"))),
        }
    }

    async fn end_step(&self, request: Request<EndStepRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, end_step);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let command = Command::EndStep {
            job_id: m.job_id,
            step_id: m.step_id,
            exit_code: m.exit_code,
            signal: m.signal,
            cancelled: m.cancelled,
            by_uid: caller.uid,
        };
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn list_nodes(&self, request: Request<ListNodesRequest>) -> Result<Response<ListNodesReply>, Status> {
        linearizable_read!(self, request, list_nodes);
        self.security.caller(&request)?;
        let (nodes, config): (Vec<drover_state::Node>, _) = {
            let applied = self.view.read();
            (applied.state.nodes.values().cloned().collect(), applied.state.config().cloned())
        };
        let nodes_json = serde_json::to_vec(&nodes).map_err(|e| internal("encoding nodes", e))?;
        let config_json = serde_json::to_vec(&config).map_err(|e| internal("encoding config", e))?;
        Ok(Response::new(ListNodesReply { nodes_json, config_json }))
    }

    async fn job_insights(&self, request: Request<JobIdsRequest>) -> Result<Response<InsightsReply>, Status> {
        forward_if_follower!(self, request, job_insights);
        self.security.caller(&request)?;
        let ids = request.into_inner().job_ids;
        let mut list: Vec<drover_proto::wire::JobInsight> = {
            let latest = self.leader.insights();
            if ids.is_empty() {
                latest.first(MAX_LIST_JOBS)
            } else {
                ids.iter().filter_map(|id| latest.get(*id)).collect()
            }
        };
        list.sort_by_key(|i| i.job_id);
        Ok(Response::new(InsightsReply { json: drover_proto::wire::encode(&list) }))
    }

    async fn update_partition(&self, request: Request<UpdatePartitionRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, update_partition);
        let caller = self.security.caller(&request)?;
        let update: drover_state::PartitionUpdate = serde_json::from_slice(&request.into_inner().update_json)
            .map_err(|e| Status::invalid_argument(format!("malformed partition update: {e}")))?;
        let command = Command::UpdatePartition { update, by_uid: caller.uid };
        self.precheck(&command)?;
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn admin(&self, request: Request<AdminRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, admin);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        let op: drover_state::AdminOp = serde_json::from_slice(&message.op_json)
            .map_err(|e| Status::invalid_argument(format!("malformed administrative request: {e}")))?;
        let command = Command::Admin { op, by_uid: caller.uid };
        self.precheck(&command)?;
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn get_registry(&self, request: Request<GetRegistryRequest>) -> Result<Response<GetRegistryReply>, Status> {
        linearizable_read!(self, request, get_registry);
        self.security.caller(&request)?;
        let now_ms = now_ms();
        let shares = self.leader.share_rows(&self.view, now_ms);
        let registry = {
            let applied = self.view.read();
            let state = &applied.state;
            drover_proto::wire::Registry {
                accounts: state.accounts.values().cloned().collect(),
                qos: state.all_qos(),
                reservations: state.reservations.values().filter(|r| !r.ended_at(now_ms)).cloned().collect(),
                shares,
                roles: state.roles.values().cloned().collect(),
                now_ms,
            }
        };
        Ok(Response::new(GetRegistryReply { json: drover_proto::wire::encode(&registry) }))
    }

    async fn update_job(&self, request: Request<UpdateJobRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, update_job);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        let update: drover_state::JobUpdate = serde_json::from_slice(&message.update_json)
            .map_err(|e| Status::invalid_argument(format!("malformed job update: {e}")))?;
        self.write(Command::UpdateJob { id: message.job_id, by_uid: caller.uid, update }).await?;
        Ok(Response::new(Empty {}))
    }

    async fn top_jobs(&self, request: Request<JobIdsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        self.job_ids_command(request, |ids, by_uid, _| Command::TopJobs { ids, by_uid }, "top").await
    }

    async fn suspend_jobs(&self, request: Request<JobIdsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        let make = |ids, by_uid, _| Command::SuspendJobs { ids, by_uid, suspend: true };
        self.job_ids_command(request, make, "suspend").await
    }

    async fn resume_jobs(&self, request: Request<JobIdsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        let make = |ids, by_uid, _| Command::SuspendJobs { ids, by_uid, suspend: false };
        self.job_ids_command(request, make, "resume").await
    }

    async fn drain_nodes(&self, request: Request<DrainNodesRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, drain_nodes);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let command = Command::DrainNodes {
            names: m.names,
            drain: m.drain,
            reason: m.reason,
            by_uid: caller.uid,
            requeue_jobs: false,
        };
        self.precheck(&command)?;
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn list_audit(&self, request: Request<ListAuditRequest>) -> Result<Response<ListAuditReply>, Status> {
        forward_if_follower!(self, request, list_audit);
        let caller = self.security.caller(&request)?;
        self.require(&caller, AdminLevel::Operator, "reading the audit log")?;
        self.linearize().await?;
        let m = request.into_inner();
        let limit = match m.limit as usize {
            0 => MAX_LIST_AUDIT,
            n => n.min(MAX_LIST_AUDIT),
        };
        let entries = self.view.audit(m.from_id.max(1), limit).map_err(|e| internal("reading the audit log", e))?;
        Ok(Response::new(ListAuditReply { json: drover_proto::wire::encode(&entries) }))
    }

    async fn requeue_jobs(&self, request: Request<RequeueJobsRequest>) -> Result<Response<JobOutcomesReply>, Status> {
        forward_if_follower!(self, request, requeue_jobs);
        let caller = self.security.caller(&request)?;
        let message = request.into_inner();
        if message.job_ids.is_empty() || message.job_ids.len() > MAX_IDS_PER_REQUEST {
            return Err(Status::invalid_argument(format!("name between 1 and {MAX_IDS_PER_REQUEST} job ids")));
        }
        // Finished jobs are in the history, which `State` does not hold: each goes in a command of its own with
        // its record (Slurm requeues a COMPLETED batch job too). The rest go together.
        let mut finished = Vec::new();
        let mut active = Vec::new();
        for id in message.job_ids {
            let record = if self.view.read().state.jobs.contains_key(&id) {
                None
            } else {
                self.view.history_job(id).map_err(|e| internal("reading history", e))?
            };
            match record {
                Some(job) if job.state.is_terminal() => finished.push(job),
                _ => active.push(id),
            }
        }
        let mut outcomes = Vec::new();
        if !active.is_empty() {
            let command = Command::RequeueJobs { ids: active, by_uid: caller.uid, hold: message.hold };
            let Reply::Jobs(some) = self.write(command).await? else {
                return Err(Status::internal("unexpected reply to a requeue"));
            };
            outcomes.extend(some);
        }
        for job in finished {
            let command = Command::RequeueFinished { job: Box::new(job), by_uid: caller.uid, hold: message.hold };
            let Reply::Jobs(some) = self.write(command).await? else {
                return Err(Status::internal("unexpected reply to a requeue"));
            };
            outcomes.extend(some);
        }
        Ok(Response::new(JobOutcomesReply { outcomes: outcomes.into_iter().map(outcome).collect() }))
    }

    async fn record_checkpoint(&self, request: Request<RecordCheckpointRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, record_checkpoint);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let command = Command::RecordCheckpoint {
            job_id: m.job_id,
            incarnation: m.incarnation,
            path: m.path,
            step: m.step,
            by_uid: caller.uid,
        };
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn record_progress(&self, request: Request<RecordProgressRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, record_progress);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        // Every rank of a large job may report every step: only reports that move the hang deadline by a useful
        // amount (or name a new step after a quiet while) are written to the log; the rest are answered at once.
        if !self.progress_worth_writing(m.job_id, m.incarnation) {
            return Ok(Response::new(Empty {}));
        }
        let command =
            Command::RecordProgress { job_id: m.job_id, incarnation: m.incarnation, step: m.step, by_uid: caller.uid };
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn invalidate_checkpoint(
        &self,
        request: Request<InvalidateCheckpointRequest>,
    ) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, invalidate_checkpoint);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let command = Command::InvalidateCheckpoint { job_id: m.job_id, path: m.path, by_uid: caller.uid };
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn drain_gpus(&self, request: Request<DrainGpusRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, drain_gpus);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let command =
            Command::DrainGpus { node: m.node, gpus: m.gpus, drain: m.drain, reason: m.reason, by_uid: caller.uid };
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    async fn reboot_nodes(&self, request: Request<RebootNodesRequest>) -> Result<Response<Empty>, Status> {
        forward_if_follower!(self, request, reboot_nodes);
        let caller = self.security.caller(&request)?;
        let m = request.into_inner();
        let names = if m.all { self.view.read().state.nodes.keys().cloned().collect() } else { m.names };
        let command = if m.cancel {
            Command::CancelReboot { names, by_uid: caller.uid }
        } else {
            let next_state = match m.next_state.to_ascii_lowercase().as_str() {
                "" => None,
                "resume" => Some(drover_state::node::NextState::Resume),
                "down" => Some(drover_state::node::NextState::Down),
                other => {
                    return Err(Status::invalid_argument(format!("Invalid nextstate {other:?}: use RESUME or DOWN")));
                }
            };
            Command::RebootNodes { names, asap: m.asap, next_state, reason: m.reason, by_uid: caller.uid }
        };
        self.precheck(&command)?;
        self.write(command).await?;
        Ok(Response::new(Empty {}))
    }

    type BackupStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<BackupChunk, Status>> + Send>>;

    async fn cluster_version(
        &self,
        request: Request<ClusterVersionRequest>,
    ) -> Result<Response<ClusterVersionReply>, Status> {
        forward_if_follower!(self, request, cluster_version);
        self.security.caller(&request)?;
        Ok(Response::new(self.version_report().await))
    }

    async fn finalize_upgrade(
        &self,
        request: Request<FinalizeUpgradeRequest>,
    ) -> Result<Response<ClusterVersionReply>, Status> {
        forward_if_follower!(self, request, finalize_upgrade);
        let caller = self.security.caller(&request)?;
        self.require(&caller, AdminLevel::Administrator, "finalizing an upgrade")?;
        let report = self.version_report().await;
        let level = match request.into_inner().level {
            0 => report.finalizable_level.max(report.active_feature_level),
            level => level,
        };
        let blockers = finalize_blockers(&report.replicas, level);
        if !blockers.is_empty() {
            return Err(Status::failed_precondition(format!(
                "cannot finalize feature level {level}: {}; upgrade them (or remove them from the cluster) and try again",
                blockers.join("; ")
            )));
        }
        if level == report.active_feature_level {
            return Ok(Response::new(report));
        }
        self.write(Command::SetFeatureLevel { level, by_uid: caller.uid }).await?;
        tracing::info!(level, uid = caller.uid, "upgrade finalized");
        Ok(Response::new(self.version_report().await))
    }

    async fn backup(&self, request: Request<BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        // Streamed from the leader itself (not forwarded: a stream of gigabytes has no place on a second hop), so
        // the state is what the cluster has committed; a follower names the leader and the client goes there.
        if let Route::Forward(_, addr) = self.route(&request).await? {
            return Err(not_leader(Some(&addr)));
        }
        let caller = self.security.caller(&request)?;
        // The backup holds every user's scripts and environments.
        self.require(&caller, AdminLevel::Administrator, "taking a backup")?;
        let Ok(permit) = self.backup_slot.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(
                "a backup is already being taken on this replica; wait for it to finish",
            ));
        };
        self.record_audit(&caller, "backup", String::new()).await;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<BackupChunk, Status>>(BACKUP_CHUNKS_IN_FLIGHT);
        let (view, id) = (self.view.clone(), self.id);
        // A thread of its own at a lower CPU priority: reading, hashing and sending a million jobs' records takes
        // seconds of CPU, and on a small machine the replica's Raft and apply threads must win every contest with
        // it (the leader's heartbeats and submissions come first; the backup just takes longer).
        let spawned = std::thread::Builder::new().name("backup".into()).spawn(move || {
            use std::io::Write as _;
            // SAFETY: setpriority on this thread's own id (Linux applies PRIO_PROCESS with a tid per thread).
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, BACKUP_NICE);
            }
            let _permit = permit;
            let mut out = ChunkSender { tx: tx.clone(), buf: Vec::with_capacity(BACKUP_CHUNK_BYTES) };
            let result = view.write_backup(id, now_ms(), &mut out).and_then(|summary| out.flush().map(|()| summary));
            match result {
                Ok(summary) => tracing::info!(
                    bytes = summary.bytes,
                    index = summary.header.last_log_index,
                    sha256 = %summary.sha256,
                    "backup taken"
                ),
                Err(e) => {
                    tracing::warn!("backup failed: {e}");
                    let _ = tx.blocking_send(Err(Status::internal(format!("backup failed on the leader: {e}"))));
                }
            }
        });
        if let Err(e) = spawned {
            return Err(internal("starting the backup thread", e));
        }
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn who_am_i(&self, request: Request<Empty>) -> Result<Response<WhoAmIReply>, Status> {
        let caller = self.security.caller(&request)?;
        let level = self.level(&caller);
        Ok(Response::new(WhoAmIReply {
            uid: caller.uid,
            gid: caller.gid,
            user: caller.user,
            admin_level: level.name().to_string(),
        }))
    }
}

impl Api {
    /// Records a change made outside the state machine (membership) in the audit log. The change already took
    /// effect, so a failure to record it is logged rather than reported as the change failing.
    async fn record_audit(&self, caller: &Caller, action: &str, detail: String) {
        let command = Command::RecordAudit { by_uid: caller.uid, action: action.to_string(), detail };
        if let Err(e) = self.write(command).await {
            tracing::error!(uid = caller.uid, action, "the audit entry was not recorded: {}", e.message());
        }
    }

    fn membership(&self) -> MembershipReply {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        MembershipReply { voters: membership.voter_ids().collect(), learners: membership.learner_ids().collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizing_waits_for_every_member_and_names_those_in_the_way() {
        let member = |id: u64, level: Option<u32>, reachable: bool| MemberVersion {
            id,
            address: format!("10.0.0.{id}:7100"),
            voter: true,
            version: level.map(|feature_level| SoftwareVersion {
                binary_version: "0.2.0".into(),
                feature_level,
                state_format_version: 5,
            }),
            reachable,
            error: if reachable { String::new() } else { "connection refused".into() },
        };
        let all_new = [member(1, Some(2), true), member(2, Some(2), true), member(3, Some(2), true)];
        assert_eq!(finalizable_level(&all_new), 2);
        assert!(finalize_blockers(&all_new, 2).is_empty());
        let one_old = [member(1, Some(2), true), member(2, None, true), member(3, Some(2), true)];
        assert_eq!(finalizable_level(&one_old), 1);
        assert_eq!(
            finalize_blockers(&one_old, 2),
            vec!["replica 2 at 10.0.0.2:7100 runs a build from before feature levels (level 1)".to_string()]
        );
        let one_gone = [member(1, Some(2), true), member(2, Some(2), false), member(3, Some(2), true)];
        assert_eq!(finalizable_level(&one_gone), 0, "nothing is finalized past a replica that cannot be asked");
        assert!(finalize_blockers(&one_gone, 2)[0].contains("did not answer (connection refused)"));
        assert!(finalize_blockers(&all_new, 3).iter().all(|b| b.contains("levels up to 2")));
    }

    #[test]
    fn a_callers_grpc_timeout_bounds_the_wait_for_a_new_leader() {
        assert_eq!(grpc_timeout("529m"), Some(Duration::from_millis(529)));
        assert_eq!(grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(grpc_timeout("100000u"), Some(Duration::from_millis(100)));
        assert_eq!(grpc_timeout("x"), None);
        assert_eq!(grpc_timeout(""), None);
        let mut request = Request::new(());
        assert_eq!(wait_budget(&request), Duration::from_millis(LEADER_WAIT_MS));
        request.metadata_mut().insert("grpc-timeout", "800m".parse().unwrap());
        assert_eq!(wait_budget(&request), Duration::from_millis(400));
    }
}
