//! The agent's session with the leader: register, heartbeat, receive assignments; on any failure find the
//! leader again (followers name it), within about a second of a failover.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_proto::LEADER_HINT_KEY;
use drover_proto::v1::AgentEnvelope;
use drover_proto::v1::agent_gateway_client::AgentGatewayClient;
use drover_proto::wire::{AgentMessage, ControllerMessage, decode, encode};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use crate::node::{AssignmentUpdate, NodeAgent, Timing};

/// Messages queued towards the leader.
const OUTBOX: usize = 1_024;
const CONNECT_TIMEOUT_MS: u64 = 500;
/// Pause after the first round of attempts in which every controller was tried and none led; it doubles with each
/// such round up to `RETRY_ROUND_MAX_MS`, and each pause is drawn in [half, whole] (see `run`).
const RETRY_ROUND_MS: u64 = 100;
const RETRY_ROUND_MAX_MS: u64 = 1_600;
/// The longest a registration may wait for its answer (the leader answers once the node is committed).
const REGISTER_TIMEOUT_MS: u64 = 10_000;
/// A leader that sent nothing, or renewed no lease, for this many heartbeat intervals is treated as gone.
const SILENT_HEARTBEATS: u64 = 3;
/// Heartbeats remembered while their answers are outstanding.
const MAX_IN_FLIGHT: usize = 64;
/// After a session with a leader ends, the agent waits a random pause below this (and below one heartbeat)
/// before it looks for the next leader: when a leader dies, every node in the cluster loses it in the same
/// millisecond, and 10,000 mutual-TLS handshakes at once would land on the survivors together. Half a second
/// spreads them while leaving the 5 s lease most of its length (a failover takes about 0.4 s).
const RECONNECT_JITTER_MAX_MS: u64 = 500;

enum Ended {
    /// A follower named the leader.
    Redirect(String),
    /// No session was established.
    Failed(String),
    /// A session with a leader was established and then ended.
    Lost,
}

/// A pause in [0, bound) ms, different on every node and every call (std's hasher keys are random per instance).
fn jitter(bound_ms: u64) -> Duration {
    use std::hash::BuildHasher;
    if bound_ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(std::hash::RandomState::new().hash_one(Instant::now()) % bound_ms)
}

/// Runs sessions forever, moving between controllers.
pub async fn run(agent: Arc<NodeAgent>) {
    let controllers = agent.config.controllers.clone();
    let mut next = 0usize;
    let mut redirect: Option<String> = None;
    let mut failures_in_row = 0usize;
    // Rounds in a row in which no controller led: during an election every node of the cluster asks every
    // survivor, each ask a mutual-TLS handshake, and a fixed 100 ms retry made 10 handshakes per second per node
    // on the very replicas that were electing (at 500 nodes it delayed the election by seconds). Backing off,
    // with jitter, keeps the asks to a few per node per election.
    let mut empty_rounds = 0u32;
    loop {
        let addr = redirect.take().unwrap_or_else(|| {
            next += 1;
            controllers[(next - 1) % controllers.len()].clone()
        });
        match session(&agent, &addr).await {
            Ended::Redirect(leader) => {
                tracing::debug!(%addr, %leader, "redirected to the leader");
                redirect = Some(leader);
                failures_in_row = 0;
            }
            Ended::Lost => {
                failures_in_row = 0;
                empty_rounds = 0;
                tokio::time::sleep(jitter(RECONNECT_JITTER_MAX_MS.min(agent.timing().heartbeat_ms))).await;
            }
            Ended::Failed(why) => {
                failures_in_row += 1;
                if failures_in_row % 50 == 1 {
                    tracing::info!(%addr, "no session with the leader: {why}");
                }
                if failures_in_row.is_multiple_of(controllers.len()) {
                    let round_ms = (RETRY_ROUND_MS << empty_rounds.min(8)).min(RETRY_ROUND_MAX_MS);
                    empty_rounds += 1;
                    tokio::time::sleep(Duration::from_millis(round_ms / 2) + jitter(round_ms / 2 + 1)).await;
                }
            }
        }
    }
}

/// Connects to `addr` and registers: the session's outbox and inbound stream, or how it ended (a follower names
/// the leader).
async fn open(
    agent: &Arc<NodeAgent>,
    addr: &str,
) -> Result<(mpsc::Sender<AgentMessage>, tonic::Streaming<drover_proto::v1::ControllerEnvelope>), Ended> {
    // Mutual TLS: the controller must hold a controller's certificate, and ours names this node.
    let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
    let channel = agent
        .tls
        .session_channel(addr, agent.local_ip(), timeout, Some(drover_auth::RoleKind::Controller))
        .map_err(|e| Ended::Failed(format!("cannot connect to {addr}: {e}")))?;
    let mut client = AgentGatewayClient::new(channel).max_decoding_message_size(256 << 20);
    let (tx, rx) = mpsc::channel::<AgentMessage>(OUTBOX);
    // What still runs here: a node coming back from DOWN keeps those GPUs held until the tasks are gone.
    let running = {
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || agent.running_shares()).await.unwrap_or_default()
    };
    let register =
        AgentMessage::Register { info: agent.info.clone(), running, feature_level: drover_state::feature::LEVEL };
    tx.try_send(register).map_err(|_| Ended::Failed("outbox closed".into()))?;
    let outbound = tokio_stream::wrappers::ReceiverStream::new(rx).map(|m| AgentEnvelope { json: encode(&m) });
    // No HTTP/2 pings on this channel (see `session_channel`): a leader that accepted the connection and then went
    // silent before answering the registration is given up here instead.
    let opened =
        tokio::time::timeout(Duration::from_millis(REGISTER_TIMEOUT_MS), client.session(outbound)).await.map_err(
            |_| Ended::Failed(format!("{addr} did not answer the registration within {REGISTER_TIMEOUT_MS} ms")),
        )?;
    match opened {
        Ok(response) => Ok((tx, response.into_inner())),
        Err(status) => match status.metadata().get(LEADER_HINT_KEY).and_then(|v| v.to_str().ok()) {
            Some(leader) => Err(Ended::Redirect(leader.to_string())),
            None => Err(Ended::Failed(format!("{addr}: {}", status.message()))),
        },
    }
}

async fn session(agent: &Arc<NodeAgent>, addr: &str) -> Ended {
    let (tx, mut inbound) = match open(agent, addr).await {
        Ok(opened) => opened,
        Err(ended) => return ended,
    };
    let mut heartbeat_ms = agent.timing().heartbeat_ms;
    let mut ticker = tokio::time::interval(Duration::from_millis(heartbeat_ms));
    let mut welcomed = false;
    // Heartbeats in flight: the lease an answer grants runs from when its heartbeat was sent.
    let mut sent: VecDeque<(u64, Instant)> = VecDeque::with_capacity(MAX_IN_FLIGHT);
    let mut seq = 0u64;
    let mut last_lease = Instant::now();
    let why = loop {
        let silence = Duration::from_millis(heartbeat_ms * SILENT_HEARTBEATS);
        if welcomed && last_lease.elapsed() > silence {
            // A leader that stops renewing has lost its quorum (or hangs): find the leader the quorum elected.
            break format!("the leader at {addr} renewed no lease for {} ms", silence.as_millis());
        }
        tokio::select! {
            message = tokio::time::timeout(silence, inbound.message()) => {
                let envelope = match message {
                    Err(_) => break format!("the leader at {addr} sent nothing for {} ms", silence.as_millis()),
                    Ok(Err(status)) => break format!("session with {addr} ended: {}", status.message()),
                    Ok(Ok(None)) => break format!("{addr} closed the session"),
                    Ok(Ok(Some(envelope))) => envelope,
                };
                match decode::<ControllerMessage>(&envelope.json) {
                    Ok(ControllerMessage::Welcome { leader_id, heartbeat_ms: hb, fence_after_ms, kill_wait_ms, epoch }) => {
                        heartbeat_ms = hb.max(10);
                        ticker = tokio::time::interval(Duration::from_millis(heartbeat_ms));
                        let allow_root_jobs = agent.timing().allow_root_jobs;
                        let timing = Timing { heartbeat_ms, fence_after_ms, kill_wait_ms, allow_root_jobs };
                        agent.connected(tx.clone(), timing);
                        welcomed = true;
                        last_lease = Instant::now();
                        tracing::info!(%addr, leader_id, epoch, "session with the leader established");
                    }
                    Ok(ControllerMessage::Assignments {
                        jobs, applied_index, lingering, allow_root_jobs, epoch, lingering_gpus, cluster_name, reboot,
                    }) => agent.set_assignments(AssignmentUpdate {
                        jobs, applied_index, lingering, allow_root_jobs, epoch, lingering_gpus, cluster_name, reboot,
                    }),
                    Ok(ControllerMessage::EndAcked { job_id, incarnation }) => agent.acked((job_id, incarnation)),
                    Ok(ControllerMessage::Signal { job_id, incarnation, signal, target }) => {
                        let agent = agent.clone();
                        tokio::task::spawn_blocking(move || agent.signal_job((job_id, incarnation), signal, target));
                    }
                    Ok(ControllerMessage::Lease { seq: answered, lease_ms, epoch }) => {
                        while sent.front().is_some_and(|(s, _)| *s < answered) {
                            sent.pop_front();
                        }
                        if let Some((_, at)) = sent.pop_front().filter(|(s, _)| *s == answered) {
                            agent.renew(at + Duration::from_millis(lease_ms), epoch);
                            last_lease = Instant::now();
                        }
                    }
                    Err(e) => break format!("undecodable message from {addr}: {e}"),
                }
            }
            _ = ticker.tick(), if welcomed => {
                let report = {
                    let agent = agent.clone();
                    tokio::task::spawn_blocking(move || agent.heartbeat_report()).await.unwrap_or_default()
                };
                seq += 1;
                if sent.len() == MAX_IN_FLIGHT {
                    sent.pop_front();
                }
                sent.push_back((seq, Instant::now()));
                let heartbeat = AgentMessage::Heartbeat {
                    seq,
                    problems: report.problems,
                    gpu_faults: report.gpu_faults,
                    gpus_reset: report.gpus_reset,
                    progress: report.progress,
                    health_check: report.health_check,
                    rebooted: report.rebooted,
                };
                if tx.try_send(heartbeat).is_err() {
                    break "the outbox to the leader is full".to_string();
                }
                agent.heartbeats_sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    if welcomed {
        agent.disconnected();
        tracing::info!("{why}; looking for the leader");
        return Ended::Lost;
    }
    Ended::Failed(why)
}
