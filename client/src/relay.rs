//! A submission through the host's relay (`drover-relayd`), from a short-lived command's side.
//!
//! A new process that talks to the leader itself pays for its TLS files, a TCP connection and a mutual-TLS
//! handshake on every `sbatch`: most of what one costs, apart from the commit. The relay keeps one connection open
//! and forwards each submission on it with the caller's own credential; the command only opens a Unix socket.
//! When the relay is not there (not installed, stopped, crashed mid-call) the command submits directly under the
//! same request id, so a submission the relay did forward before it died is never made twice.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use drover_auth::credential::CREDENTIAL_METADATA_KEY;
use drover_proto::v1::SubmitJobRequest;
use drover_proto::v1::drover_relay_client::DroverRelayClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{ClientError, Credentials, DEFAULT_DEADLINE_MS};

/// How long connecting to the local socket may take: the relay is on this host, so anything slower means it is
/// stuck, and the direct path is the better bet.
const CONNECT_TIMEOUT_MS: u64 = 500;
/// The relay's own retries across controllers take up to the client deadline; a little more for the hop.
const CALL_TIMEOUT_MS: u64 = DEFAULT_DEADLINE_MS + 1_000;

/// What became of a submission offered to the relay.
#[derive(Debug)]
pub enum RelayAttempt {
    /// Committed: the job id.
    Submitted(u64),
    /// The cluster (or the relay, for a malformed call) refused it: the final answer, as a direct call would
    /// have had it.
    Refused(ClientError),
    /// No relay answered (why, for a log line): submit directly, with the same request id.
    Unavailable(String),
}

/// Offers one encoded submission to the relay on `socket`, with the caller's credential.
pub async fn submit(socket: &Path, credentials: &Credentials, spec: Vec<u8>, request_id: &str) -> RelayAttempt {
    // Without a credential there is nothing to forward, and the direct path would fail the same way.
    let token = match credentials.token() {
        Ok(token) => token,
        Err(e) => return RelayAttempt::Refused(e),
    };
    let channel = match connect(socket).await {
        Ok(channel) => channel,
        Err(e) => return RelayAttempt::Unavailable(format!("{}: {e}", socket.display())),
    };
    let mut request = tonic::Request::new(SubmitJobRequest { spec, request_id: request_id.to_string() });
    request.metadata_mut().insert(CREDENTIAL_METADATA_KEY, token);
    match DroverRelayClient::new(channel).submit_job(request).await {
        Ok(reply) => RelayAttempt::Submitted(reply.into_inner().job_id),
        // A status the relay sent is its answer; one made here from a broken connection means the relay is gone.
        Err(status) if std::error::Error::source(&status).is_some() => {
            RelayAttempt::Unavailable(format!("{}: {}", socket.display(), status.message()))
        }
        // The relay's own limit on submissions in flight (it passes the cluster's refusals on under other codes):
        // the direct path is not limited by it.
        Err(status) if status.code() == tonic::Code::ResourceExhausted => {
            RelayAttempt::Unavailable(format!("{}: {}", socket.display(), status.message()))
        }
        Err(status) => RelayAttempt::Refused(ClientError::from_status(&status)),
    }
}

/// A connection to the relay on `socket`, with the deadlines a command's call through it gets.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://drover-relayd.local")
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .timeout(Duration::from_millis(CALL_TIMEOUT_MS))
        .connect_with_connector(UnixConnector(socket.to_path_buf()))
        .await
}

/// Dials the relay's Unix socket: a tower `Service<Uri>` for [`Endpoint::connect_with_connector`] (the URI is
/// ignored).
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl tower_service::Service<Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { UnixStream::connect(path).await.map(TokioIo::new) })
    }
}
