//! `drover-relayd`: the per-host submission relay, like Slurm's `sackd`.
//!
//! A short-lived `sbatch` that talks to the leader itself loads the TLS files, connects and runs a mutual-TLS
//! handshake every time: most of what one submission costs apart from the commit. The relay keeps one client
//! (its connections to every controller, following the leader) for the life of the host and serves a Unix socket
//! that every local user may open. Each call carries its caller's own credential from the host's
//! `drover-authd`; the relay forwards it unchanged, and the controllers check it as they check any client's.
//!
//! The relay adds no trust: it has no identity of its own to lend (its client is built with
//! [`Credentials::none`], and a call without a credential is refused before anything is sent), and a caller
//! cannot get more through it than by calling the controllers directly with the same credential.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use drover_auth::credential::MAX_TOKEN_BYTES;
use drover_client::relay::{self as protocol, FrameError, MAGIC};
use drover_client::{Client, ClientError};
use drover_proto::v1::{RelayReply, RelayRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Code, Status};

pub use drover_client::relay::MAX_REQUEST_BYTES;

/// Submissions forwarded at once; beyond this a caller is told the relay is busy (`ResourceExhausted`, which
/// `sbatch` takes as "submit directly"; the cluster's own refusals reach callers under other codes).
pub const MAX_IN_FLIGHT: usize = 1_024;
/// Connections open at once, forwarded or still sending their request. Beyond this a new connection is closed at
/// once, and its command submits directly.
const MAX_CONNECTIONS: usize = 4_096;
/// How long a caller may take to send its request: a command writes it all at once, so a slower one is stuck
/// (or is not a command at all) and must not hold a connection slot.
const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// How long writing the reply may take (a caller that stopped reading).
const REPLY_TIMEOUT_MS: u64 = 5_000;

/// Request bytes held at once over every connection. A request's bytes are counted as they arrive, never on what
/// its header announces: 150 callers each announcing 16 MiB and sending all but one byte would otherwise hold
/// 2.5 GB (4,096 of them, 64 GiB). Past this a caller is told the relay is busy and its command submits directly.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;
/// Connections one local user may hold open at once (SO_PEERCRED's uid): one user cannot take every slot.
pub const MAX_CONNECTIONS_PER_UID: usize = 64;
/// A request is read this much at a time, each piece counted against [`MAX_BUFFERED_BYTES`].
const READ_CHUNK_BYTES: usize = 64 << 10;

/// What the relay holds at most; [`Limits::default`] is production's.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub buffered_bytes: usize,
    pub connections: usize,
    pub connections_per_uid: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            buffered_bytes: MAX_BUFFERED_BYTES,
            connections: MAX_CONNECTIONS,
            connections_per_uid: MAX_CONNECTIONS_PER_UID,
        }
    }
}

/// The relay: forwards each submission with its caller's credential.
pub struct Relay {
    client: Client,
    in_flight: Semaphore,
    limits: Limits,
    /// Request bytes buffered now, as permits of one byte each.
    buffered: Semaphore,
}

impl Relay {
    /// `client` must be built with [`drover_client::Credentials::none`]: the relay never sends a credential of
    /// its own.
    pub fn new(client: Client) -> Relay {
        Relay::with_limits(client, Limits::default())
    }

    pub fn with_limits(client: Client, limits: Limits) -> Relay {
        Relay {
            client,
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            limits,
            buffered: Semaphore::new(limits.buffered_bytes),
        }
    }

    /// Request bytes the relay holds now (for tests and operators).
    pub fn buffered_bytes(&self) -> usize {
        self.limits.buffered_bytes - self.buffered.available_permits()
    }

    /// One connection: read the request, forward it, answer. A caller that speaks another protocol, or stalls,
    /// gets no answer: its command falls back to the direct path.
    async fn serve_connection(&self, mut stream: UnixStream) {
        // The request's bytes stay counted until the connection is done with them.
        let mut held = Vec::new();
        let read = read_request(&mut stream, &self.buffered, &mut held);
        let request = match tokio::time::timeout(Duration::from_millis(REQUEST_TIMEOUT_MS), read).await {
            Ok(Ok(request)) => request,
            Ok(Err(RequestError::Busy)) => {
                drop(held);
                let reply = protocol::refusal(&Status::resource_exhausted(format!(
                    "the relay holds {} MiB of requests already; try again, or submit directly",
                    self.limits.buffered_bytes >> 20
                )));
                write_reply(&mut stream, &reply).await;
                return;
            }
            Ok(Err(RequestError::Frame(e @ FrameError::Magic(_)))) => {
                tracing::warn!("a caller was not answered: {e}");
                return;
            }
            Ok(Err(RequestError::Frame(e))) => {
                // The caller speaks the protocol but sent something wrong: tell it what.
                let reply = protocol::refusal(&Status::invalid_argument(format!("the relay cannot read it: {e}")));
                write_reply(&mut stream, &reply).await;
                return;
            }
            Ok(Err(RequestError::Io(e))) => {
                tracing::debug!("a caller hung up before sending its request: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(timeout_ms = REQUEST_TIMEOUT_MS, "a caller did not send its request in time");
                return;
            }
        };
        let reply = match self.submit(request).await {
            Ok(reply) => reply,
            Err(status) => protocol::refusal(&status),
        };
        write_reply(&mut stream, &reply).await;
    }

    async fn submit(&self, request: RelayRequest) -> Result<RelayReply, Status> {
        let credential = credential_of(&request.credential)?;
        let Some(submit) = request.submit else {
            return Err(Status::invalid_argument("the request holds no submission"));
        };
        let _permit = self.in_flight.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!(
                "the relay has {MAX_IN_FLIGHT} submissions in flight; try again, or submit directly"
            ))
        })?;
        let reply = self.client.submit_as(submit.spec, submit.request_id, credential).await.map_err(status_of)?;
        Ok(protocol::submitted(reply))
    }
}

/// The caller's credential as the controllers take it, or why the relay refuses to forward it.
fn credential_of(token: &str) -> Result<MetadataValue<Ascii>, Status> {
    if token.is_empty() {
        return Err(Status::unauthenticated(
            "no credential: the relay forwards its caller's own credential (from drover-authd) and has none of its \
             own to lend",
        ));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Status::unauthenticated("the credential is longer than any drover-authd issues"));
    }
    let not_a_token =
        || Status::unauthenticated("the credential is not a token drover-authd issues (not printable ASCII)");
    // HTTP header values may carry bytes over 0x7f; a token never does.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(not_a_token());
    }
    MetadataValue::try_from(token).map_err(|_| not_a_token())
}

enum RequestError {
    Frame(FrameError),
    Io(std::io::Error),
    /// The relay's byte budget is spent.
    Busy,
}

/// Reads one request frame: the magic, the length (bounded), the message. Its bytes are taken from `budget` as
/// they arrive (a piece at a time, kept in `held`), so memory follows what callers actually send.
async fn read_request<'a>(
    stream: &mut UnixStream,
    budget: &'a Semaphore,
    held: &mut Vec<tokio::sync::SemaphorePermit<'a>>,
) -> Result<RelayRequest, RequestError> {
    let mut magic = [0u8; MAGIC.len()];
    stream.read_exact(&mut magic).await.map_err(RequestError::Io)?;
    protocol::check_magic(magic).map_err(RequestError::Frame)?;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).await.map_err(RequestError::Io)?;
    let len = protocol::frame_len(header, MAX_REQUEST_BYTES).map_err(RequestError::Frame)?;
    let mut body = Vec::new();
    while body.len() < len {
        let piece = (len - body.len()).min(READ_CHUNK_BYTES);
        held.push(budget.try_acquire_many(piece as u32).map_err(|_| RequestError::Busy)?);
        let start = body.len();
        body.resize(start + piece, 0);
        stream.read_exact(&mut body[start..]).await.map_err(RequestError::Io)?;
    }
    protocol::decode_request(&body).map_err(RequestError::Frame)
}

async fn write_reply(stream: &mut UnixStream, reply: &RelayReply) {
    let frame = protocol::encode_reply(reply);
    match tokio::time::timeout(Duration::from_millis(REPLY_TIMEOUT_MS), stream.write_all(&frame)).await {
        Ok(Ok(())) => {}
        // The command went away (killed, timed out): it submits directly under the same request id, which the
        // cluster answers with this same job.
        Ok(Err(e)) => tracing::debug!("a caller hung up before its answer: {e}"),
        Err(_) => tracing::debug!("a caller did not read its answer in time"),
    }
}

/// The caller sees the error a direct call would have given: the typed refusal with its details, or the
/// client's own explanation (which controllers it tried, why the credential was refused).
fn status_of(e: ClientError) -> Status {
    let code = match &e {
        ClientError::Rejected(command) => {
            let details = drover_proto::command_error_details(command);
            return Status::with_details(Code::FailedPrecondition, command.to_string(), details.into());
        }
        ClientError::Refused(_) | ClientError::NotFound(_) => Code::FailedPrecondition,
        ClientError::Unreachable { .. } | ClientError::NoAddresses => Code::Unavailable,
        ClientError::Credential(_) => Code::Unauthenticated,
        ClientError::Protocol(_) | ClientError::Config(_) => Code::Internal,
        ClientError::Unimplemented(_) => Code::Unimplemented,
    };
    Status::new(code, e.to_string())
}

/// Serves `relay` on the Unix socket `path` (open to every local user) until `shutdown` completes.
pub async fn serve(
    relay: Relay,
    path: &Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RelayError> {
    let listener =
        drover_auth::authd::bind_public_socket(path, "drover-relayd").map_err(|e| RelayError::Socket(e.to_string()))?;
    tracing::info!(socket = %path.display(), "relaying submissions");
    let limits = relay.limits;
    let (relay, connections) = (Arc::new(relay), Arc::new(Semaphore::new(limits.connections)));
    let per_uid: Arc<std::sync::Mutex<std::collections::HashMap<u32, usize>>> = Arc::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Usually EMFILE/ENFILE: back off instead of spinning on an error that will repeat.
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the limit the connection is dropped unanswered: its command submits directly.
        let Ok(slot) = connections.clone().try_acquire_owned() else {
            tracing::warn!(limit = limits.connections, "too many connections open; one was closed unanswered");
            continue;
        };
        // The kernel's word for who opened it: no local user holds more than their share of the slots.
        let Ok(uid) = stream.peer_cred().map(|c| c.uid()) else { continue };
        let Some(share) = UidShare::take(&per_uid, uid, limits.connections_per_uid) else {
            tracing::warn!(
                uid,
                limit = limits.connections_per_uid,
                "a user holds too many relay connections; one was closed"
            );
            continue;
        };
        let relay = relay.clone();
        tokio::spawn(async move {
            relay.serve_connection(stream).await;
            drop(share);
            drop(slot);
        });
    }
    // A socket file left behind would point the next `sbatch` at nothing (it falls back, but slower).
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// One of a user's connection slots, given back when dropped.
struct UidShare {
    counts: Arc<std::sync::Mutex<std::collections::HashMap<u32, usize>>>,
    uid: u32,
}

impl UidShare {
    fn take(
        counts: &Arc<std::sync::Mutex<std::collections::HashMap<u32, usize>>>,
        uid: u32,
        limit: usize,
    ) -> Option<UidShare> {
        let mut map = counts.lock().expect("per-uid counts poisoned");
        let count = map.entry(uid).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(UidShare { counts: counts.clone(), uid })
    }
}

impl Drop for UidShare {
    fn drop(&mut self) {
        let mut map = self.counts.lock().expect("per-uid counts poisoned");
        if let Some(count) = map.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.uid);
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Socket(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_state::CommandError;

    #[test]
    fn a_refusal_reaches_the_caller_typed_and_other_errors_keep_their_text() {
        let refused = CommandError::InvalidPartition { name: "nope".into(), known: "gpu".into() };
        let status = status_of(ClientError::Rejected(refused.clone()));
        assert_eq!(drover_proto::command_error_of(&status), Some(refused));
        let status = status_of(ClientError::Unreachable { tried: "a:1".into(), last: "refused".into() });
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("cannot reach the Drover cluster: tried a:1"), "{}", status.message());
    }

    /// The relay lends no identity: a request without a credential, or with one no drover-authd could have
    /// issued, is refused before anything is sent, and the caller hears why.
    #[test]
    fn a_missing_or_impossible_credential_is_refused_before_forwarding() {
        let refused = credential_of("").unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
        assert!(refused.message().contains("none of its own"), "{}", refused.message());
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(credential_of(&long).unwrap_err().message().contains("longer than any drover-authd issues"));
        assert!(credential_of("tok\u{e9}n").unwrap_err().message().contains("not printable ASCII"));
        assert_eq!(credential_of("token").unwrap(), "token");
    }
}
