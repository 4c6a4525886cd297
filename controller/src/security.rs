//! Who is calling: the controller's side of Drover's security.
//!
//! - **Transport:** every port speaks TLS and requires a client certificate from the cluster's CA
//!   (`drover_auth::tls`). The certificate's role says what kind of peer it is: only controllers may speak Raft,
//!   only agents may open agent sessions (and only for the node named in their certificate).
//! - **Users:** every client call carries a credential that `drover-authd` on the caller's host signed with the
//!   cluster key after asking the kernel who the caller is (SO_PEERCRED). The uid every command carries comes from
//!   it, never from the request.
//! - Certificates and the CA are re-read when their files change (no restart to rotate them).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use drover_auth::SecurityConfig;
use drover_auth::credential::{ClusterKey, identity_from_request, now_ms};
use drover_auth::tls::{ClientTls, Role, RoleKind, ServerTls, peer_role};
use tonic::transport::Channel;
use tonic::{Request, Status};

/// How long connecting to another controller may take.
const CONNECT_TIMEOUT_MS: u64 = 300;

#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("cannot load the cluster key: {0}")]
    Key(#[from] drover_auth::credential::KeyFileError),
    #[error("cannot load the TLS certificates: {0}")]
    Tls(#[from] drover_auth::tls::TlsError),
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub user: String,
}

pub struct Security {
    key: ClusterKey,
    pub server_tls: ServerTls,
    pub client_tls: ClientTls,
}

impl Security {
    pub fn load(config: &SecurityConfig) -> Result<Arc<Security>, SecurityError> {
        let key = ClusterKey::load(&config.key_file)?;
        let server_tls = ServerTls::load(config.tls_files())?;
        let client_tls = ClientTls::load(config.tls_files())?;
        let reload = config.reload_interval();
        server_tls.spawn_reloader(reload);
        client_tls.spawn_reloader(reload);
        Ok(Arc::new(Security { key, server_tls, client_tls }))
    }

    /// The user behind a client call, from its credential.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let claims = identity_from_request(&self.key, request, now_ms())?;
        // Only a token meant for the controllers: a step's credential, which its nodes have seen, is not one.
        drover_auth::credential::check_audience(&claims, "").map_err(|e| Status::unauthenticated(e.to_string()))?;
        Ok(Caller { uid: claims.uid, gid: claims.gid, user: claims.user })
    }

    /// The credential `caller` presents to the agents of step `step` of job `job` (and nowhere else), for as long as
    /// an authd credential lives.
    pub fn step_credential(&self, caller: &Caller, job: u64, step: u32, host: &str) -> String {
        let identity =
            drover_auth::credential::Identity { uid: caller.uid, gid: caller.gid, user: caller.user.clone() };
        let audience = drover_auth::credential::step_audience(job, step);
        let ttl_ms = drover_auth::credential::DEFAULT_TTL_MS;
        drover_auth::credential::sign_for(&self.key, &identity, host, now_ms(), ttl_ms, &audience)
    }

    /// Whether the peer presented a controller's certificate.
    pub fn peer_is_controller<T>(&self, request: &Request<T>) -> bool {
        matches!(peer_role(request), Ok(Role::Controller(_)))
    }

    /// A lazy TLS channel to another controller (whose certificate must say so).
    pub fn controller_channel(&self, addr: &str, local_ip: Option<IpAddr>) -> Result<Channel, Status> {
        self.client_tls
            .channel(addr, local_ip, Duration::from_millis(CONNECT_TIMEOUT_MS), Some(RoleKind::Controller))
            .map_err(|e| Status::internal(format!("cannot connect to the controller at {addr}: {e}")))
    }
}

/// Admits only peers whose certificate has the given role kind (an interceptor for whole services).
pub fn require_peer(kind: RoleKind) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request: Request<()>| {
        let role = peer_role(&request)?;
        if role.kind() != kind {
            return Err(Status::permission_denied(format!(
                "this service is for {kind:?} peers; the certificate presented says {role}"
            )));
        }
        Ok(request)
    }
}
