//! Mutual TLS for every Drover gRPC port, through rustls (ring provider) under tonic.
//!
//! - Every process holds a certificate issued by the cluster CA, and every connection is authenticated both ways:
//!   a server accepts only clients whose certificate chains to the CA; a client accepts only servers whose
//!   certificate chains to the CA *and* names the host it dialled.
//! - What a peer may do is carried in its certificate as a URI SAN, its [`Role`]: `drover://controller/<id>`,
//!   `drover://agent/<node>`, `drover://client/<host>`. Servers read it per request with [`peer_role`].
//! - Certificates come from PEM files ([`TlsFiles`]) and are re-read without a restart ([`ServerTls::spawn_reloader`],
//!   [`ClientTls::spawn_reloader`]): the rustls configurations are built once, and their certificate resolvers and
//!   verifiers read whichever material is current. New connections use new material; established ones continue.
//!
//! Server: `Server::builder().add_service(svc).serve_with_incoming(incoming(listener, ServerTls::load(files)?))`.
//! Client: `ClientTls::load(files)?.channel("host:port", None, timeout, Some(RoleKind::Controller))?`.

mod client;
mod generate;
mod material;
mod role;
mod server;

use std::fmt;
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use client::{ClientTls, TlsConnector};
pub use generate::{CA_VALID_DAYS, MAX_VALID_DAYS, generate_ca, issue, write_pem};
pub use material::{MAX_PEM_FILE_BYTES, MIN_RELOAD_INTERVAL};
pub use role::{Role, RoleKind, cert_role, peer_role};
pub use server::{HANDSHAKE_TIMEOUT, MAX_HANDSHAKES_IN_FLIGHT, ServerTls, incoming};

/// Where a process finds its TLS material: the cluster CA (one or more certificates, so a CA rotation can trust the
/// old and new CA side by side), its own certificate chain, and its private key. All PEM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pem").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

/// Everything that can go wrong with TLS material. Messages name the file and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {source}", path.display())]
    Read { what: &'static str, path: PathBuf, source: io::Error },
    #[error("{what} {} is over {limit} bytes: point the setting at the PEM file itself", path.display())]
    TooLarge { what: &'static str, path: PathBuf, limit: u64 },
    #[error("{what} {} holds no PEM certificate (-----BEGIN CERTIFICATE-----): point the setting at the right file", path.display())]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} {} is not valid PEM ({reason}): re-issue or re-copy it", path.display())]
    BadPem { what: &'static str, path: PathBuf, reason: String },
    #[error("private key {} holds no private key ({reason}): point `key` at the key file, in PEM", path.display())]
    NoPrivateKey { path: PathBuf, reason: String },
    #[error("private key {} is unusable ({reason}): use an ECDSA P-256/P-384, Ed25519 or RSA key in PEM", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error(
        "private key {} does not belong to certificate {}: install the pair that was issued together (if they are being replaced right now, this clears on the next reload)",
        key.display(), cert.display()
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("CA file {} is unusable ({reason}): it must hold the cluster CA certificate(s) in PEM", path.display())]
    BadCa { path: PathBuf, reason: String },
    #[error("certificate {} expired on {not_after}: issue a new one", path.display())]
    Expired { path: PathBuf, not_after: String },
    #[error("cannot parse certificate: {reason}")]
    BadCertificate { reason: String },
    #[error("certificate carries no drover role (a URI SAN like drover://agent/NODE): issue it with a role")]
    NoRole,
    #[error("certificate carries two drover roles ({first} and {second}): issue one certificate per role")]
    AmbiguousRole { first: String, second: String },
    #[error("invalid drover role {uri:?}: {reason}")]
    BadRole { uri: String, reason: String },
    #[error(
        "the server's certificate has role {found} where a {expected} was expected: that address belongs to another kind of Drover process; check the configured address"
    )]
    WrongRole { expected: RoleKind, found: Role },
    #[error("invalid certificate request: {0}")]
    InvalidRequest(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("invalid address {addr:?} ({reason}): expected HOST:PORT, e.g. ctl1.example:7000 or [::1]:7000")]
    BadAddress { addr: String, reason: String },
    #[error("TLS configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
}
