//! The one write path: every writer (the client API, the agent hub, the scheduling loop, leader duties) proposes
//! commands here, and gets back the state machine's reply or a typed status a client can act on.
//!
//! The leader's clock stamps each entry here, once, so `apply` never reads one (replicas apply the same time).
//!
//! Proposals are committed in batches (group commit): while a batch is on its way through Raft, new proposals
//! wait in a queue and then go together as one batch, so one log append, one replication message per follower,
//! one fsync on each replica and one state write cover all of them. A lone proposal meets an empty pipeline and
//! goes at once: batching costs no latency when the cluster is idle, and needs no timer.
//!
//! Across sites a commit takes a WAN round trip, and waiting for the batch in flight would cost a proposal a
//! second one whenever anything else (a scheduling pass's reasons, an agent's report) was committing when it
//! came. So a batch that has been in flight longer than a commit on one site takes ([`NEXT_BATCH_AFTER_MS`]) no
//! longer holds the next back: up to [`MAX_IN_FLIGHT`] batches go through Raft at once, which replicates them
//! pipelined, and each proposal costs one round trip.

use std::sync::Arc;
use std::time::Duration;

use drover_proto::LEADER_HINT_KEY;
use drover_state::{Command, CommandError, Reply, Request};
use futures::StreamExt;
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio::time::error::Elapsed;
use tonic::Status;

use crate::runtime::now_ms;
use crate::types::{Raft, TypeConfig};

/// How long a write may wait for a quorum before the caller is told to retry.
pub const WRITE_TIMEOUT_MS: u64 = 3_000;
/// Batches submitted to Raft and not yet applied, at most. While one is in flight the next waits for it, so that
/// everything arriving meanwhile goes together, unless it has been in flight [`NEXT_BATCH_AFTER_MS`]. Always two
/// in flight (no waiting) halved the batches, and every batch costs an append, a replication message per follower,
/// an fsync and a state write on each replica: on the benchmark machine (three replicas and the load on two cores)
/// one batch in flight committed 8,218-8,792 submissions/s at 64 clients against 7,849-7,984 with two (three runs
/// each, alternating), and 4,113/s against 3,484/s at 16 clients.
pub const MAX_IN_FLIGHT: usize = 8;
/// How long the batch in flight holds the next one back. On one site a batch commits in 1-2 ms (a follower's
/// fsync and a loopback round trip), so there batches stay as large as with one in flight; across sites a commit
/// takes a round trip of tens of ms, and a proposal waits at most this long behind a batch that is not its own.
pub const NEXT_BATCH_AFTER_MS: u64 = 3;
/// The most proposals in one batch (one log append; the replication payload is bounded separately by openraft).
pub const MAX_BATCH: usize = 1_024;
/// Proposals waiting for a batch; a writer that finds the queue full waits (within its write timeout).
pub const QUEUE_CAPACITY: usize = 16_384;

/// What a writer gets back: the reply or the typed refusal from `apply`, or a status when nothing committed.
type Outcome = Result<Result<Reply, CommandError>, Status>;
type Proposal = (Request, oneshot::Sender<Outcome>);
/// Raft's results for one batch, in the batch's order.
type WriteResults = futures::stream::BoxStream<'static, Result<openraft::raft::WriteResult<TypeConfig>, Fatal>>;
type Fatal = openraft::error::Fatal<TypeConfig>;

/// This replica's write path: cheap to clone, every clone feeds the same batcher.
#[derive(Clone)]
pub struct Proposer {
    raft: Raft,
    queue: mpsc::Sender<Proposal>,
}

impl Proposer {
    /// Starts the batcher for `raft` (on the current runtime); it stops when every clone is dropped.
    pub fn new(raft: Raft) -> Proposer {
        let (queue, proposals) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(batcher(raft.clone(), proposals));
        Proposer { raft, queue }
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }
}

/// Commits one command on this replica (which must lead) and returns its reply; a refusal from `apply` becomes
/// a status carrying the typed [`CommandError`] in its details (see [`command_error_status`]).
pub async fn propose(proposer: &Proposer, command: Command) -> Result<Reply, Status> {
    propose_checked(proposer, command).await?.map_err(|e| command_error_status(&e))
}

/// Like [`propose`], but keeps a refusal from `apply` apart from a failure to commit at all.
pub async fn propose_checked(proposer: &Proposer, command: Command) -> Result<Result<Reply, CommandError>, Status> {
    let (answer, answered) = oneshot::channel();
    let write = async {
        proposer
            .queue
            .send((Request { time_ms: now_ms(), command }, answer))
            .await
            .map_err(|_| Status::unavailable("this controller replica is shutting down; retry"))?;
        answered.await.map_err(|_| Status::unavailable("this controller replica is shutting down; retry"))?
    };
    tokio::time::timeout(Duration::from_millis(WRITE_TIMEOUT_MS), write).await.map_err(|_| {
        Status::unavailable(format!(
            "the write was not committed within {WRITE_TIMEOUT_MS} ms: this replica cannot reach a quorum; retry or try another controller"
        ))
    })?
}

/// Takes the first waiting proposal, waits until the pipeline lets the next batch go (more proposals queue
/// meanwhile), and hands everything queued by then to Raft as one batch. The batcher itself hands each batch to
/// Raft, so batches enter the log in the order they were formed (and with them the leader's clock stamps); their
/// answers are awaited in tasks of their own.
async fn batcher(raft: Raft, mut proposals: mpsc::Receiver<Proposal>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let finished = Arc::new(Notify::new());
    let mut last_sent: Option<Instant> = None;
    while let Some(first) = proposals.recv().await {
        let Some(slot) = next_slot(&slots, &finished, last_sent).await else { return };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match proposals.try_recv() {
                Ok(proposal) => batch.push(proposal),
                Err(_) => break,
            }
        }
        last_sent = Some(Instant::now());
        let deadline = Instant::now() + Duration::from_millis(WRITE_TIMEOUT_MS);
        let (requests, answers): (Vec<Request>, Vec<oneshot::Sender<Outcome>>) = batch.into_iter().unzip();
        let results = tokio::time::timeout_at(deadline, raft.client_write_many(requests)).await;
        let finished = finished.clone();
        tokio::spawn(async move {
            answer_batch(results, answers, deadline).await;
            drop(slot);
            finished.notify_one();
        });
    }
}

/// Whether the next batch may go now, given the batches in flight and how long ago the newest of them went.
#[derive(Debug, PartialEq, Eq)]
enum Gate {
    /// Nothing in flight, or the newest batch has held the next back long enough.
    Go,
    /// The newest batch went this long ago and may still commit soon: wait the rest of the hold (or until it does).
    Hold(Duration),
    /// [`MAX_IN_FLIGHT`] batches in flight: wait until one is answered.
    Full,
}

fn gate(in_flight: usize, since_last_sent: Duration) -> Gate {
    let hold = Duration::from_millis(NEXT_BATCH_AFTER_MS);
    if in_flight == 0 {
        Gate::Go
    } else if since_last_sent < hold {
        Gate::Hold(hold - since_last_sent)
    } else if in_flight >= MAX_IN_FLIGHT {
        Gate::Full
    } else {
        Gate::Go
    }
}

/// Waits until [`gate`] lets the next batch go, and takes its slot. `None` when the semaphore is closed.
async fn next_slot(
    slots: &Arc<Semaphore>,
    finished: &Notify,
    last_sent: Option<Instant>,
) -> Option<OwnedSemaphorePermit> {
    loop {
        let in_flight = MAX_IN_FLIGHT - slots.available_permits();
        let since = last_sent.map_or(Duration::MAX, |sent| sent.elapsed());
        match gate(in_flight, since) {
            Gate::Go | Gate::Full => return slots.clone().acquire_owned().await.ok(),
            Gate::Hold(rest) => {
                tokio::select! {
                    // In order, not at random: the simulation replays seeds, and either wake-up only re-checks.
                    biased;
                    _ = finished.notified() => {}
                    _ = tokio::time::sleep(rest) => {}
                }
            }
        }
    }
}

/// Answers each proposer of one batch in order, from Raft's results. A batch that is not applied by `deadline`
/// (no quorum) frees its slot anyway: its proposers are told to retry. As with any write that timed out, the
/// entries may still commit later; a retried submission finds its job by request id.
async fn answer_batch(
    results: Result<Result<WriteResults, Fatal>, Elapsed>,
    answers: Vec<oneshot::Sender<Outcome>>,
    deadline: Instant,
) {
    let mut answers = answers.into_iter();
    let answer_all = async {
        let mut results = match results {
            Ok(Ok(results)) => results,
            Ok(Err(fatal)) => {
                let status = write_error(RaftError::Fatal(fatal));
                for answer in answers.by_ref() {
                    let _ = answer.send(Err(status.clone()));
                }
                return;
            }
            Err(_) => return,
        };
        while let Some(result) = results.next().await {
            let Some(answer) = answers.next() else { break };
            let outcome = match result {
                Ok(Ok(written)) => Ok(written.response),
                Ok(Err(refused)) => Err(write_error(RaftError::APIError(refused))),
                Err(fatal) => Err(write_error(RaftError::Fatal(fatal))),
            };
            let _ = answer.send(outcome);
        }
    };
    let _ = tokio::time::timeout_at(deadline, answer_all).await;
    // Anyone not answered by now (the stream ended early, or the timeout) hears "retry", not silence.
    for answer in answers {
        let _ = answer.send(Err(Status::unavailable(
            "the write's outcome is unknown (leadership changed or no quorum): it may still commit; retry (a retried submission finds its job)",
        )));
    }
}

/// A refused command as a gRPC status: the code says what kind of refusal it is, the message says it in words,
/// and the details carry the `CommandError` itself, so clients match on the type, never on the text.
pub fn command_error_status(e: &CommandError) -> Status {
    let code = match e {
        CommandError::InvalidJobId { .. } => tonic::Code::NotFound,
        CommandError::PermissionDenied { .. } | CommandError::NotAuthorized { .. } => tonic::Code::PermissionDenied,
        CommandError::NotInitialized | CommandError::TooManyJobs { .. } => tonic::Code::Unavailable,
        CommandError::FeatureNotFinalized { .. } | CommandError::FeatureLevel { .. } => tonic::Code::FailedPrecondition,
        _ => tonic::Code::InvalidArgument,
    };
    Status::with_details(code, e.to_string(), drover_proto::command_error_details(e).into())
}

/// "Ask the leader instead", with its address in the `x-drover-leader` metadata when this replica knows it.
pub fn not_leader(addr: Option<&str>) -> Status {
    match addr {
        Some(addr) => {
            let mut status = Status::failed_precondition(format!("not the leader; the leader is at {addr}"));
            name_leader(status.metadata_mut(), addr);
            status
        }
        None => Status::unavailable("no leader is elected at the moment (election in progress or no quorum); retry"),
    }
}

/// Names the leader in a reply's or refusal's `x-drover-leader` metadata, so the client's next call goes there.
pub fn name_leader(metadata: &mut tonic::metadata::MetadataMap, addr: &str) {
    if let Ok(value) = addr.parse() {
        metadata.insert(LEADER_HINT_KEY, value);
    }
}

/// A write Raft did not take: lost leadership sends the caller to the leader; a stopped replica sends it elsewhere.
pub fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Status {
    if let Some(f) = e.forward_to_leader() {
        return not_leader(f.leader_node.as_ref().map(|n| n.addr.as_str()));
    }
    match e {
        RaftError::Fatal(f) => Status::unavailable(format!("this controller replica has stopped: {f}")),
        RaftError::APIError(api) => Status::failed_precondition(api.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches stay large on one site, where the batch in flight commits within the hold; across sites a proposal
    /// waits at most the hold behind a batch that is not its own, never a whole round trip.
    #[test]
    fn the_batch_in_flight_holds_the_next_back_only_for_a_local_commit() {
        let hold = Duration::from_millis(NEXT_BATCH_AFTER_MS);
        assert_eq!(gate(0, Duration::ZERO), Gate::Go, "an idle pipeline sends at once");
        assert_eq!(gate(0, Duration::MAX), Gate::Go);
        assert_eq!(gate(1, Duration::from_millis(1)), Gate::Hold(hold - Duration::from_millis(1)));
        assert_eq!(gate(3, Duration::ZERO), Gate::Hold(hold));
        assert_eq!(gate(1, hold), Gate::Go, "a batch in flight this long is a WAN commit: pipeline the next");
        assert_eq!(gate(MAX_IN_FLIGHT - 1, hold * 10), Gate::Go);
        assert_eq!(gate(MAX_IN_FLIGHT, hold * 10), Gate::Full, "the pipeline is bounded");
    }

    #[test]
    fn a_refusal_carries_its_type_in_the_status_details() {
        let error = CommandError::PermissionDenied { id: 7, owner: 1000, requester: 1001 };
        let status = command_error_status(&error);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.message(), error.to_string());
        assert_eq!(drover_proto::command_error_of(&status), Some(error));
    }

    #[test]
    fn a_status_without_details_has_no_command_error() {
        assert_eq!(drover_proto::command_error_of(&not_leader(Some("127.0.0.1:1"))), None);
        assert_eq!(drover_proto::command_error_of(&Status::internal("x")), None);
    }
}
