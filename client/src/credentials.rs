//! The caller's credential: fetched from the host's `drover-authd` (which asks the kernel who we are), cached
//! until shortly before it expires, and attached to every call.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_auth::credential::{CREDENTIAL_METADATA_KEY, now_ms, unverified_claims};
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::ClientError;

/// How long one fetch from the local daemon may take.
const FETCH_TIMEOUT_MS: u64 = 2_000;
/// A cached credential is replaced once it has less than this left, so no call carries one that expires on
/// the way (a call may retry across controllers for up to the client's deadline).
const REFRESH_MARGIN_MS: u64 = 60_000;

/// A token as gRPC metadata, and when it expires (ms since the epoch).
type Cached = Option<(MetadataValue<tonic::metadata::Ascii>, u64)>;

/// Cheap to clone: clones share one cached token.
#[derive(Clone)]
pub struct Credentials {
    /// Where a fresh token comes from; `None`: nowhere (only a token given up front is ever sent).
    socket: Option<PathBuf>,
    cached: Arc<Mutex<Cached>>,
}

impl Credentials {
    pub fn from_socket(socket: &Path) -> Credentials {
        Credentials { socket: Some(socket.to_path_buf()), cached: Arc::new(Mutex::new(None)) }
    }

    /// Someone else's token, sent as it is (the relay forwarding its caller's); never replaced by one of this
    /// process's own.
    pub fn given(token: MetadataValue<tonic::metadata::Ascii>) -> Credentials {
        Credentials { socket: None, cached: Arc::new(Mutex::new(Some((token, u64::MAX)))) }
    }

    /// No credential at all: every call fails before it is sent. For a process that must never lend its own
    /// identity (the relay, whose calls each carry their caller's credential through [`Credentials::given`]).
    pub fn none() -> Credentials {
        Credentials { socket: None, cached: Arc::new(Mutex::new(None)) }
    }

    /// The current token, fetched again when the cached one is about to expire.
    pub fn token(&self) -> Result<MetadataValue<tonic::metadata::Ascii>, ClientError> {
        let mut cached = self.cached.lock().expect("credential cache poisoned");
        if let Some((token, expires_ms)) = cached.as_ref()
            && now_ms().saturating_add(REFRESH_MARGIN_MS) < *expires_ms
        {
            return Ok(token.clone());
        }
        let Some(socket) = &self.socket else {
            return match cached.as_ref() {
                Some((token, _)) => Ok(token.clone()),
                None => {
                    Err(ClientError::Credential("this client sends only the credentials its callers give it".into()))
                }
            };
        };
        let text = drover_auth::authd::fetch(socket, Duration::from_millis(FETCH_TIMEOUT_MS))
            .map_err(|e| ClientError::Credential(e.to_string()))?;
        let expires_ms = unverified_claims(&text).map_or(0, |c| c.expires_ms);
        let value = MetadataValue::try_from(text.as_str())
            .map_err(|_| ClientError::Credential("drover-authd answered with an unusable token".into()))?;
        *cached = Some((value.clone(), expires_ms));
        Ok(value)
    }

    /// Puts the credential on a request to a controller or an agent.
    pub fn attach<T>(&self, request: &mut Request<T>) -> Result<(), ClientError> {
        request.metadata_mut().insert(CREDENTIAL_METADATA_KEY, self.token()?);
        Ok(())
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        self.attach(&mut request).map_err(|e| Status::unauthenticated(e.to_string()))?;
        Ok(request)
    }
}
