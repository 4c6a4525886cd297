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

use drover_auth::credential::{CREDENTIAL_METADATA_KEY, MAX_TOKEN_BYTES};
use drover_client::{Client, ClientError};
use drover_proto::v1::drover_relay_server::{DroverRelay, DroverRelayServer};
use drover_proto::v1::{SubmitJobReply, SubmitJobRequest};
use tokio::sync::Semaphore;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

/// The largest submission the relay accepts: the controllers' own limit on a request.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;
/// Submissions forwarded at once; beyond this a caller is told the relay is busy (`ResourceExhausted`, which
/// `sbatch` takes as "submit directly"; the cluster's own refusals reach callers under other codes).
pub const MAX_IN_FLIGHT: usize = 1_024;
/// Calls one local connection may have open at once (a command opens one connection for one call).
const MAX_CALLS_PER_CONNECTION: usize = 64;

/// The relay's gRPC service: forwards each submission with its caller's credential.
pub struct Relay {
    client: Arc<Client>,
    in_flight: Semaphore,
}

impl Relay {
    /// `client` must be built with [`drover_client::Credentials::none`]: the relay never sends a credential of
    /// its own.
    pub fn new(client: Client) -> Relay {
        Relay { client: Arc::new(client), in_flight: Semaphore::new(MAX_IN_FLIGHT) }
    }

    pub fn into_service(self) -> DroverRelayServer<Relay> {
        DroverRelayServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES)
    }
}

#[tonic::async_trait]
impl DroverRelay for Relay {
    async fn submit_job(&self, request: Request<SubmitJobRequest>) -> Result<Response<SubmitJobReply>, Status> {
        let credential = match request.metadata().get(CREDENTIAL_METADATA_KEY) {
            Some(value) if value.len() <= MAX_TOKEN_BYTES => value.clone(),
            Some(_) => return Err(Status::unauthenticated("the credential is longer than any drover-authd issues")),
            None => {
                return Err(Status::unauthenticated(
                    "no credential: the relay forwards its caller's own credential (from drover-authd) and has none \
                     of its own to lend",
                ));
            }
        };
        let _permit = self.in_flight.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!(
                "the relay has {MAX_IN_FLIGHT} submissions in flight; try again, or submit directly"
            ))
        })?;
        let message = request.into_inner();
        let reply = self.client.submit_as(message.spec, message.request_id, credential).await.map_err(status_of)?;
        Ok(Response::new(reply))
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
    let result = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(MAX_CALLS_PER_CONNECTION)
        .add_service(relay.into_service())
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    // A socket file left behind would point the next `sbatch` at nothing (it falls back, but slower).
    let _ = std::fs::remove_file(path);
    result.map_err(|e| RelayError::Serve(e.to_string()))
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Socket(String),
    #[error("serving the relay socket failed: {0}")]
    Serve(String),
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
}
