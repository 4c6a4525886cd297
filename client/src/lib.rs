//! The Drover client: talks to any controller, follows the leader, and retries within a deadline.
//!
//! Clients find the cluster through a list of controller addresses (`DROVER_CONTROLLERS`). A call goes to the
//! last address that answered; an unreachable controller or one without a leader makes it try the next; a
//! follower's leader hint sends it straight to the leader. Writes carry a request id, so a retry after a lost
//! reply never creates a second job.
//!
//! Every connection is mutual TLS with the host's client certificate, and every call carries the user's
//! credential from the host's `drover-authd` (see [`ClientConfig`]): the controllers take the caller's uid from
//! it, so no request names its caller.

mod config;
mod credentials;
mod leader_hint;
pub mod relay;

pub use config::{ClientConfig, DEFAULT_CONFIG_PATH, RELAY_SOCKET_ENV};
pub use credentials::Credentials;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drover_auth::tls::{ClientTls, RoleKind};
use tonic::service::interceptor::InterceptedService;

use drover_proto::LEADER_HINT_KEY;
use drover_proto::v1::drover_service_client::DroverServiceClient;
use drover_proto::v1::*;
use drover_state::{CommandError, Job, JobSpec};
use thiserror::Error;
use tonic::transport::Channel;
use tonic::{Code, Status};

pub use drover_proto::v1::{ClusterStatusReply, JobOutcome, ReplicaStatus};

/// How long one connection attempt may take before the next controller is tried.
const CONNECT_TIMEOUT_MS: u64 = 500;
/// How long one RPC may take on one controller.
const RPC_TIMEOUT_MS: u64 = 5_000;
/// The least time an attempt is given, even when the deadline is nearly spent.
const MIN_ATTEMPT_MS: u64 = 100;
/// The default time a whole call (with retries across controllers and elections) may take.
pub const DEFAULT_DEADLINE_MS: u64 = 15_000;
/// Give up sooner when no controller answers at all (nothing listening, host down): a user should hear
/// within seconds that the addresses are wrong or the cluster is down.
const NO_ANSWER_GIVE_UP_MS: u64 = 3_000;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("no controller addresses given: set DROVER_CONTROLLERS or pass --controllers")]
    NoAddresses,
    #[error("cannot reach the Drover cluster: tried {tried}; last error: {last}")]
    Unreachable { tried: String, last: String },
    /// The cluster refused the command; the typed reason (match on it, never on its text).
    #[error("{0}")]
    Rejected(CommandError),
    /// Refused for a reason with no `CommandError` (a malformed request, a permission the API checks itself).
    #[error("{0}")]
    Refused(String),
    #[error("job {0} not found")]
    NotFound(u64),
    #[error("malformed reply from controller: {0}")]
    Protocol(String),
    #[error("{0}")]
    Config(String),
    #[error("cannot prove who you are to the cluster: {0}")]
    Credential(String),
    /// The controller does not know the call: a build older than this client's.
    #[error("the controller does not know this call (a build older than this client): {0}")]
    Unimplemented(String),
}

impl ClientError {
    fn from_status(status: &Status) -> ClientError {
        match drover_proto::command_error_of(status) {
            Some(e) => ClientError::Rejected(e),
            None if status.code() == Code::Unimplemented => ClientError::Unimplemented(status.message().to_string()),
            None => ClientError::Refused(status.message().to_string()),
        }
    }
}

/// How long a backup stream may go without a chunk before the client gives up on it.
const BACKUP_IDLE_MS: u64 = 120_000;

/// A controller connection that attaches the caller's credential to every call.
type Service = InterceptedService<Channel, Credentials>;

pub struct Client {
    addresses: Vec<String>,
    channels: Vec<Channel>,
    credentials: Credentials,
    tls: ClientTls,
    /// Index of the controller that answered last (most likely the leader).
    current: AtomicUsize,
    /// Whether the leader is remembered across processes (command-line tools; see `leader_hint`).
    remember_leader: bool,
    /// The index the leader-hint file holds (`usize::MAX`: none), so it is rewritten only when the leader moves.
    remembered: AtomicUsize,
    deadline: Duration,
    request_seq: AtomicU64,
    client_tag: String,
    /// Indices (into `addresses`) of the controllers at this host's site, tried first by stale reads.
    local: Vec<usize>,
    /// Index of the controller that answered the latest call (stale reads included).
    last_answered: AtomicUsize,
}

/// A job spec as a submission carries it: the compact record codec, not JSON (the leader decodes every
/// submission on its hot path).
pub fn encode_spec(spec: &JobSpec) -> Result<Vec<u8>, ClientError> {
    drover_state::codec::encode(spec).map_err(|e| ClientError::Protocol(e.to_string()))
}

/// A request id for a process's one submission, before (or without) a [`Client`]: unique per process and
/// moment, like [`Client::new_request_id`]'s.
pub fn one_off_request_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{:x}-0", std::process::id(), nanos)
}

/// Whether an error means "try another controller" rather than "the request is wrong".
fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Aborted
    ) || (status.code() == Code::FailedPrecondition && status.metadata().get(LEADER_HINT_KEY).is_some())
        // An `Internal` that this side made from a broken connection (it carries its cause, as in `no_answer`);
        // never one a controller sent, whatever its text says.
        || (status.code() == Code::Internal && std::error::Error::source(status).is_some())
}

/// Whether the error means no controller process answered (as opposed to a controller saying "not now").
fn no_answer(status: &Status) -> bool {
    // Client-side transport failures carry their cause; statuses a controller sent over the wire do not.
    status.code() == Code::DeadlineExceeded || std::error::Error::source(status).is_some()
}

impl Client {
    /// A client for the controllers `config` names (any subset works; all of them is best), with its TLS
    /// certificate and its credential source.
    pub fn new(config: &ClientConfig) -> Result<Client, ClientError> {
        Client::with_credentials(config, Credentials::from_socket(&config.auth_socket))
    }

    /// Like [`Client::new`], with a credential source the caller already holds (and may have used: a command
    /// that tried the relay first sends the same token directly).
    pub fn with_credentials(config: &ClientConfig, credentials: Credentials) -> Result<Client, ClientError> {
        let tls = ClientTls::load(config.tls_files())
            .map_err(|e| ClientError::Config(format!("the client's TLS files: {e}")))?;
        Client::with_tls(config, tls, credentials)
    }

    /// Like [`Client::new`], with TLS and credentials already loaded (long-running tools share them).
    pub fn with_tls(config: &ClientConfig, tls: ClientTls, credentials: Credentials) -> Result<Client, ClientError> {
        let mut addresses: Vec<String> =
            config.controllers.iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
        if addresses.is_empty() {
            return Err(ClientError::NoAddresses);
        }
        // A local controller missing from the list is still a controller of the cluster: add it at the end.
        let mut local = Vec::new();
        for addr in config.local_controllers.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
            let index = match addresses.iter().position(|a| a == addr) {
                Some(index) => index,
                None => {
                    addresses.push(addr.to_string());
                    addresses.len() - 1
                }
            };
            if !local.contains(&index) {
                local.push(index);
            }
        }
        let mut channels = Vec::new();
        for addr in &addresses {
            let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
            let channel = tls
                .channel(addr, None, timeout, Some(RoleKind::Controller))
                .map_err(|e| ClientError::Config(format!("invalid controller address {addr:?}: {e}")))?;
            channels.push(channel);
        }
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        Ok(Client {
            addresses,
            channels,
            credentials,
            tls,
            current: AtomicUsize::new(0),
            remember_leader: false,
            remembered: AtomicUsize::new(usize::MAX),
            deadline: Duration::from_millis(DEFAULT_DEADLINE_MS),
            request_seq: AtomicU64::new(0),
            client_tag: format!("{}-{:x}", std::process::id(), nanos),
            local,
            last_answered: AtomicUsize::new(usize::MAX),
        })
    }

    /// The TLS settings, for connections to agents (`srun`).
    pub fn tls(&self) -> &ClientTls {
        &self.tls
    }

    /// The caller's credential source, for calls to agents (`srun`).
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Starts at the leader the last process on this host saw, and remembers a new one for the next process: for
    /// short-lived commands (a shell loop of `sbatch`), which would otherwise start at the first controller every
    /// time. Long-running clients keep the leader in memory and leave the file alone.
    pub fn remembering_leader(mut self) -> Client {
        if let Some(index) = leader_hint::load(&self.addresses) {
            self.current.store(index, Ordering::Relaxed);
            self.remembered.store(index, Ordering::Relaxed);
        }
        self.remember_leader = true;
        self
    }

    pub fn with_deadline(mut self, deadline: Duration) -> Client {
        self.deadline = deadline;
        self
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// The controller the next call goes to first: the one that answered last, or the leader it named.
    pub fn current_address(&self) -> &str {
        &self.addresses[self.current.load(Ordering::Relaxed) % self.addresses.len()]
    }

    /// The controller that answered the latest call, if any has.
    pub fn last_answered_address(&self) -> Option<&str> {
        self.addresses.get(self.last_answered.load(Ordering::Relaxed)).map(String::as_str)
    }

    /// A fresh id for one logical write; reused across its retries.
    pub fn new_request_id(&self) -> String {
        format!("{}-{}", self.client_tag, self.request_seq.fetch_add(1, Ordering::Relaxed))
    }

    /// Runs `call` against controllers until it succeeds, fails for a reason retrying cannot fix, or the
    /// deadline passes.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: FnMut(DroverServiceClient<Service>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_from(&[], &self.credentials, call).await
    }

    /// A read any replica may answer from its own state: the local controllers first, then as [`Client::call`].
    async fn read<T, F, Fut>(&self, stale: bool, call: F) -> Result<T, ClientError>
    where
        F: FnMut(DroverServiceClient<Service>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let first: &[usize] = if stale { &self.local } else { &[] };
        self.call_from(first, &self.credentials, call).await
    }

    /// Tries the controllers in `first` once each, in order, then the usual rotation from the current one. An
    /// answer from one of `first` does not move the current controller: the leader stays where writes go.
    async fn call_from<T, F, Fut>(
        &self,
        first: &[usize],
        credentials: &Credentials,
        mut call: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(DroverServiceClient<Service>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut last_answer = start;
        // What a controller last said, which explains a failure better than a later attempt's silence.
        let mut last_said: Option<String> = None;
        let mut attempt = 0usize;
        loop {
            let preferred = first.get(attempt).copied();
            let index = preferred.unwrap_or_else(|| self.current.load(Ordering::Relaxed) % self.channels.len());
            // Fail fast, before any network, when there is no credential to send.
            credentials.token()?;
            let client = DroverServiceClient::with_interceptor(self.channels[index].clone(), credentials.clone())
                .max_decoding_message_size(256 << 20);
            // One attempt never outlives the caller's deadline (a status probe with a short deadline must not hang
            // on a frozen replica for the full RPC timeout).
            let left = self.deadline.saturating_sub(start.elapsed()).max(Duration::from_millis(MIN_ATTEMPT_MS));
            let attempt_timeout = left.min(Duration::from_millis(RPC_TIMEOUT_MS));
            let result = tokio::time::timeout(attempt_timeout, call(client)).await;
            let status = match result {
                Ok(Ok(reply)) => {
                    self.last_answered.store(index, Ordering::Relaxed);
                    if preferred.is_none() {
                        self.answered(index, reply.metadata());
                    }
                    return Ok(reply.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!("no answer within {} ms", attempt_timeout.as_millis())),
            };
            if !retryable(&status) {
                return Err(ClientError::from_status(&status));
            }
            let this = format!("{}: {}", self.addresses[index], status.message());
            if !no_answer(&status) {
                last_answer = Instant::now();
                last_said = Some(this.clone());
            }
            let last = match &last_said {
                Some(said) if no_answer(&status) => format!("{this}; before that {said}"),
                _ => this,
            };
            attempt += 1;
            // Give up early only once every controller has had its chance: one silent replica (frozen, cut off)
            // says nothing about the others.
            if attempt >= self.channels.len() && last_answer.elapsed() >= Duration::from_millis(NO_ANSWER_GIVE_UP_MS) {
                return Err(ClientError::Unreachable { tried: self.addresses.join(", "), last });
            }
            let hinted = self.hinted(status.metadata());
            if preferred.is_none() || hinted.is_some() {
                let next = hinted.unwrap_or(index + 1);
                self.current.store(next % self.channels.len(), Ordering::Relaxed);
            }
            if start.elapsed() >= self.deadline {
                return Err(ClientError::Unreachable { tried: self.addresses.join(", "), last });
            }
            // After a full round without success, back off a little (an election takes a few hundred ms).
            if hinted.is_none() && attempt.is_multiple_of(self.channels.len()) {
                tokio::time::sleep(Duration::from_millis(50 * (attempt / self.channels.len()).min(4) as u64)).await;
            }
        }
    }

    /// The position of the leader a reply or refusal names (`x-drover-leader`), if it is one of ours.
    fn hinted(&self, metadata: &tonic::metadata::MetadataMap) -> Option<usize> {
        let hint = metadata.get(LEADER_HINT_KEY).and_then(|v| v.to_str().ok())?;
        self.addresses.iter().position(|a| a == hint)
    }

    /// Notes who answered: a follower that forwarded the call names the leader, so the next call goes there
    /// directly; a new leader is remembered for the next process (see `leader_hint`).
    fn answered(&self, index: usize, metadata: &tonic::metadata::MetadataMap) {
        let leader = self.hinted(metadata).unwrap_or(index);
        self.current.store(leader, Ordering::Relaxed);
        if self.remember_leader && self.remembered.swap(leader, Ordering::Relaxed) != leader {
            leader_hint::store(&self.addresses, &self.addresses[leader]);
        }
    }

    /// Submits a job; returns its id once the submission is committed on a quorum.
    pub async fn submit(&self, spec: &JobSpec) -> Result<u64, ClientError> {
        self.submit_encoded(encode_spec(spec)?, self.new_request_id()).await
    }

    /// Submits a spec already encoded ([`encode_spec`]) under `request_id`: a retry with the same id, from this
    /// process or through the relay, returns the first submission's job.
    pub async fn submit_encoded(&self, spec: Vec<u8>, request_id: String) -> Result<u64, ClientError> {
        let request = SubmitJobRequest { spec, request_id };
        let reply = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.submit_job(request).await }
            })
            .await?;
        Ok(reply.job_id)
    }

    /// Submits a spec already in the record codec, under a request id the caller chose, with the caller's own
    /// credential: what `drover-relayd` does for each local submission. The reply says whether the id was a
    /// duplicate.
    pub async fn submit_as(
        &self,
        spec: Vec<u8>,
        request_id: String,
        credential: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    ) -> Result<SubmitJobReply, ClientError> {
        let request = SubmitJobRequest { spec, request_id };
        self.call_from(&[], &Credentials::given(credential), |mut c| {
            let request = request.clone();
            async move { c.submit_job(request).await }
        })
        .await
    }

    async fn job_ids(&self, kind: JobIdsKind, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        let request = JobIdsRequest { job_ids: ids.to_vec(), user_hold: matches!(kind, JobIdsKind::UserHold) };
        let reply = self
            .call(|mut c| {
                let request = request.clone();
                async move {
                    match kind {
                        JobIdsKind::Cancel => c.cancel_jobs(request).await,
                        JobIdsKind::Hold | JobIdsKind::UserHold => c.hold_jobs(request).await,
                        JobIdsKind::Release => c.release_jobs(request).await,
                        JobIdsKind::Top => c.top_jobs(request).await,
                        JobIdsKind::Suspend => c.suspend_jobs(request).await,
                        JobIdsKind::Resume => c.resume_jobs(request).await,
                    }
                }
            })
            .await?;
        Ok(reply.outcomes)
    }

    pub async fn cancel(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::Cancel, ids).await
    }

    pub async fn hold(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::Hold, ids).await
    }

    /// `scontrol suspend` (operators): the jobs' tasks stop where they are, keeping their allocation.
    pub async fn suspend(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::Suspend, ids).await
    }

    /// `scontrol resume`: suspended jobs go on.
    pub async fn resume(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::Resume, ids).await
    }

    /// `scontrol uhold`: a hold the job's owner may release, even when an operator places it.
    pub async fn uhold(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::UserHold, ids).await
    }

    pub async fn release(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::Release, ids).await
    }

    /// `scontrol update jobid=N ...` on a pending job.
    pub async fn update_job(&self, id: u64, update: &drover_state::JobUpdate) -> Result<(), ClientError> {
        let update_json = serde_json::to_vec(update).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.call(|mut c| {
            let request = UpdateJobRequest { job_id: id, update_json: update_json.clone() };
            async move { c.update_job(request).await }
        })
        .await?;
        Ok(())
    }

    /// `scontrol top`.
    pub async fn top(&self, ids: &[u64]) -> Result<Vec<JobOutcome>, ClientError> {
        self.job_ids(JobIdsKind::Top, ids).await
    }

    /// Accounts, QOS and reservations (`drover account`, `drover qos`, `scontrol ... reservation`).
    ///
    /// Not deduplicated like submissions: a retry after a lost reply may answer "already exists" for an add
    /// that did happen, which the caller can tell from a fresh `registry()`.
    pub async fn admin(&self, op: &drover_state::AdminOp) -> Result<(), ClientError> {
        let op_json = serde_json::to_vec(op).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.call(|mut c| {
            let request = AdminRequest { op_json: op_json.clone() };
            async move { c.admin(request).await }
        })
        .await?;
        Ok(())
    }

    /// The registry of accounts (with fair-share figures), QOS and reservations.
    pub async fn registry(&self, stale: bool) -> Result<drover_proto::wire::Registry, ClientError> {
        let consistency = consistency(stale);
        let reply =
            self.read(stale, |mut c| async move { c.get_registry(GetRegistryRequest { consistency }).await }).await?;
        drover_proto::wire::decode(&reply.json).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// One job (active or finished) and, if asked, its script.
    pub async fn get_job(&self, id: u64, with_script: bool, stale: bool) -> Result<(Job, String), ClientError> {
        let consistency = consistency(stale);
        let reply = self
            .read(stale, |mut c| async move { c.get_job(GetJobRequest { job_id: id, consistency, with_script }).await })
            .await
            .map_err(|e| match e {
                ClientError::Rejected(CommandError::InvalidJobId { .. }) => ClientError::NotFound(id),
                other => other,
            })?;
        let job = serde_json::from_slice(&reply.job_json).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok((job, reply.script))
    }

    pub async fn list_jobs(&self, filter: &JobFilter) -> Result<(Vec<Job>, bool), ClientError> {
        let request = ListJobsRequest {
            consistency: consistency(filter.stale),
            job_ids: filter.ids.clone(),
            users: filter.users.clone(),
            states: filter.states.clone(),
            include_finished: filter.include_finished,
            limit: filter.limit,
            finished_since_ms: filter.finished_since_ms,
        };
        let reply = self
            .read(filter.stale, |mut c| {
                let request = request.clone();
                async move { c.list_jobs(request).await }
            })
            .await?;
        let jobs = serde_json::from_slice(&reply.jobs_json).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok((jobs, reply.truncated))
    }

    pub async fn cluster_status(&self) -> Result<ClusterStatusReply, ClientError> {
        self.call(|mut c| async move { c.cluster_status(ClusterStatusRequest { local_only: false }).await }).await
    }

    /// Every replica's and agent's build and the cluster's active feature level (from the leader).
    pub async fn cluster_version(&self) -> Result<ClusterVersionReply, ClientError> {
        self.call(|mut c| async move { c.cluster_version(ClusterVersionRequest {}).await }).await
    }

    /// Raises the cluster's feature level to `level` (0: the highest every replica understands); administrators.
    pub async fn finalize_upgrade(&self, level: u32) -> Result<ClusterVersionReply, ClientError> {
        self.call(|mut c| async move { c.finalize_upgrade(FinalizeUpgradeRequest { level }).await }).await
    }

    pub async fn add_replica(&self, id: u64, address: &str) -> Result<MembershipReply, ClientError> {
        let address = address.to_string();
        self.call(|mut c| {
            let request = AddReplicaRequest { id, address: address.clone() };
            async move { c.add_replica(request).await }
        })
        .await
    }

    /// Streams a backup of the cluster's state from the leader into `out` (administrators); returns the bytes
    /// written. The caller keeps the file only once `drover_proto::backup::verify_backup` accepts it.
    pub async fn backup(&self, out: &mut impl std::io::Write) -> Result<u64, ClientError> {
        let mut stream = self.call(|mut c| async move { c.backup(BackupRequest {}).await }).await?;
        let mut bytes = 0u64;
        loop {
            // The leader flushes and checkpoints its database before the first chunk: a few seconds at most.
            let next = tokio::time::timeout(Duration::from_millis(BACKUP_IDLE_MS), stream.message()).await;
            let chunk = match next {
                Err(_) => {
                    return Err(ClientError::Protocol(format!(
                        "the backup stream stalled: nothing for {} s",
                        BACKUP_IDLE_MS / 1000
                    )));
                }
                Ok(Err(status)) => return Err(ClientError::from_status(&status)),
                Ok(Ok(None)) => return Ok(bytes),
                Ok(Ok(Some(chunk))) => chunk,
            };
            out.write_all(&chunk.data)
                .map_err(|e| ClientError::Config(format!("cannot write the backup where asked: {e}")))?;
            bytes += chunk.data.len() as u64;
        }
    }

    pub async fn remove_replica(&self, id: u64) -> Result<MembershipReply, ClientError> {
        self.call(|mut c| async move { c.remove_replica(RemoveReplicaRequest { id }).await }).await
    }

    /// `scancel --signal`: delivers `signal` to the running tasks of the jobs that `target` names (the steps by
    /// default, as Slurm; the batch shell alone; or everything).
    pub async fn signal(&self, ids: &[u64], signal: i32, target: SignalTarget) -> Result<Vec<JobOutcome>, ClientError> {
        let request = SignalJobsRequest { job_ids: ids.to_vec(), signal, target: target as i32 };
        let reply = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.signal_jobs(request).await }
            })
            .await?;
        Ok(reply.outcomes)
    }

    /// `scontrol requeue` / `requeuehold`: the running jobs end and go back to the queue (held, with `hold`).
    pub async fn requeue(&self, ids: &[u64], hold: bool) -> Result<Vec<JobOutcome>, ClientError> {
        let request = RequeueJobsRequest { job_ids: ids.to_vec(), hold };
        let reply = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.requeue_jobs(request).await }
            })
            .await?;
        Ok(reply.outcomes)
    }

    /// `drover checkpoint record`: incarnation `incarnation` of job `job_id` finished the checkpoint at `path`.
    pub async fn record_checkpoint(
        &self,
        job_id: u64,
        incarnation: u64,
        path: &str,
        step: Option<u64>,
    ) -> Result<(), ClientError> {
        let request = RecordCheckpointRequest { job_id, incarnation, path: path.to_string(), step };
        self.call(|mut c| {
            let request = request.clone();
            async move { c.record_checkpoint(request).await }
        })
        .await?;
        Ok(())
    }

    /// `drover progress`: incarnation `incarnation` of job `job_id` is alive (at `step`, if known).
    pub async fn record_progress(&self, job_id: u64, incarnation: u64, step: Option<u64>) -> Result<(), ClientError> {
        let request = RecordProgressRequest { job_id, incarnation, step };
        self.call(|mut c| async move { c.record_progress(request).await }).await?;
        Ok(())
    }

    /// `drover checkpoint invalidate`: never resume job `job_id` from `path` (default: its next resume's choice).
    pub async fn invalidate_checkpoint(&self, job_id: u64, path: Option<String>) -> Result<(), ClientError> {
        let request = InvalidateCheckpointRequest { job_id, path };
        self.call(|mut c| {
            let request = request.clone();
            async move { c.invalidate_checkpoint(request).await }
        })
        .await?;
        Ok(())
    }

    /// `drover node gpus drain|resume`: GPUs of `node` out of service (or back).
    pub async fn drain_gpus(&self, node: &str, gpus: Vec<u32>, drain: bool, reason: &str) -> Result<(), ClientError> {
        let request = DrainGpusRequest { node: node.to_string(), gpus, drain, reason: reason.to_string() };
        self.call(|mut c| {
            let request = request.clone();
            async move { c.drain_gpus(request).await }
        })
        .await?;
        Ok(())
    }

    /// `scontrol reboot` (or `cancel_reboot` with `cancel`) of `names` (`all`: every node).
    pub async fn reboot_nodes(&self, request: RebootNodesRequest) -> Result<(), ClientError> {
        self.call(|mut c| {
            let request = request.clone();
            async move { c.reboot_nodes(request).await }
        })
        .await?;
        Ok(())
    }

    /// Ends an interactive allocation (`srun` outside a job) with its step's exit.
    pub async fn complete_job(
        &self,
        job_id: u64,
        incarnation: u64,
        exit_code: i32,
        signal: i32,
    ) -> Result<(), ClientError> {
        let request = CompleteJobRequest { job_id, incarnation, exit_code, signal };
        self.call(|mut c| async move { c.complete_job(request).await }).await?;
        Ok(())
    }

    /// Numbers a new step of a running job.
    /// Numbers a new step of `job_id` and records what it runs (`name`), where and how many tasks.
    /// Returns the step's number and the credential its agents accept for it (and nothing else does).
    pub async fn create_step(
        &self,
        job_id: u64,
        name: &str,
        nodes: &[String],
        tasks: u32,
    ) -> Result<(u32, String), ClientError> {
        let request = CreateStepRequest { job_id, name: name.to_string(), nodes: nodes.to_vec(), tasks };
        let reply = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.create_step(request).await }
            })
            .await?;
        Ok((reply.step_id, reply.credential))
    }

    /// Records how a step ended: the largest exit code of its tasks, a signal that killed one, or that it was
    /// interrupted.
    pub async fn end_step(
        &self,
        job_id: u64,
        step_id: u32,
        exit_code: i32,
        signal: i32,
        cancelled: bool,
    ) -> Result<(), ClientError> {
        let request = EndStepRequest { job_id, step_id, exit_code, signal, cancelled };
        self.call(|mut c| async move { c.end_step(request).await }).await?;
        Ok(())
    }

    pub async fn list_nodes(&self, stale: bool) -> Result<Vec<drover_state::Node>, ClientError> {
        Ok(self.nodes_and_config(stale).await?.0)
    }

    /// Nodes and the cluster configuration (partitions), as one consistent read.
    pub async fn nodes_and_config(
        &self,
        stale: bool,
    ) -> Result<(Vec<drover_state::Node>, Option<drover_state::ClusterConfig>), ClientError> {
        let consistency = consistency(stale);
        let reply =
            self.read(stale, |mut c| async move { c.list_nodes(ListNodesRequest { consistency }).await }).await?;
        let nodes = serde_json::from_slice(&reply.nodes_json).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let config = serde_json::from_slice(&reply.config_json).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok((nodes, config))
    }

    /// The leader's latest priorities and expected starts of pending jobs (all of them when `ids` is empty).
    pub async fn job_insights(&self, ids: &[u64]) -> Result<Vec<drover_proto::wire::JobInsight>, ClientError> {
        let request = JobIdsRequest { job_ids: ids.to_vec(), user_hold: false };
        let reply = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.job_insights(request).await }
            })
            .await?;
        drover_proto::wire::decode(&reply.json).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `scontrol update partitionname=...`.
    pub async fn update_partition(&self, update: &drover_state::PartitionUpdate) -> Result<(), ClientError> {
        let update_json = serde_json::to_vec(update).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.call(|mut c| {
            let request = UpdatePartitionRequest { update_json: update_json.clone() };
            async move { c.update_partition(request).await }
        })
        .await?;
        Ok(())
    }

    /// The administrative change log (`drover audit`), from entry `from_id` on.
    pub async fn audit(&self, from_id: u64, limit: u32) -> Result<Vec<drover_state::AuditEntry>, ClientError> {
        let reply = self.call(|mut c| async move { c.list_audit(ListAuditRequest { from_id, limit }).await }).await?;
        drover_proto::wire::decode(&reply.json).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Who the cluster says the caller is (`drover whoami`).
    pub async fn who_am_i(&self) -> Result<WhoAmIReply, ClientError> {
        self.call(|mut c| async move { c.who_am_i(Empty {}).await }).await
    }

    /// `scontrol update nodename=... state=drain|resume reason=...`.
    pub async fn drain_nodes(&self, names: &[String], drain: bool, reason: &str) -> Result<(), ClientError> {
        let request = DrainNodesRequest { names: names.to_vec(), drain, reason: reason.to_string() };
        self.call(|mut c| {
            let request = request.clone();
            async move { c.drain_nodes(request).await }
        })
        .await?;
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum JobIdsKind {
    Cancel,
    Hold,
    UserHold,
    Release,
    Top,
    Suspend,
    Resume,
}

fn consistency(stale: bool) -> i32 {
    if stale { ReadConsistency::Stale as i32 } else { ReadConsistency::Linearizable as i32 }
}

/// Filters for listings (`squeue`, `sacct`).
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub ids: Vec<u64>,
    pub users: Vec<String>,
    pub states: Vec<String>,
    pub include_finished: bool,
    pub stale: bool,
    pub limit: u32,
    /// With `include_finished`: only jobs that ended at or after this (ms since the epoch; 0 = any).
    pub finished_since_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retries are decided by what happened, not by what a message says: a controller's `Internal` is final
    /// even if its text mentions a transport; one this client made from a broken connection is retried.
    #[test]
    fn only_a_broken_connection_makes_an_internal_error_retryable() {
        assert!(!retryable(&Status::internal("transport of the snapshot failed")));
        let mut broken = Status::internal("h2 protocol error");
        broken.set_source(std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(retryable(&broken));
        assert!(retryable(&Status::unavailable("leader stepped down")));
        assert!(!retryable(&Status::invalid_argument("bad spec")));
    }
}
