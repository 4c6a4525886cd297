//! Drover's security layer.
//!
//! - [`credential`]: who a *user* is. A kernel-verified identity, signed with the cluster key by `drover-authd` on
//!   the user's host and checked by controllers (MUNGE's model).
//! - [`authd`]: the daemon that issues those credentials over a local Unix socket, and the client call for it.
//! - [`tls`]: which *process* is on the other end of a gRPC connection. Mutual TLS on every port, certificates
//!   reloaded from files without a restart, and the process's role carried in its certificate.

pub mod authd;
pub mod config;
pub mod credential;
pub mod tls;

pub use config::SecurityConfig;
pub use credential::{Claims, ClusterKey, CredentialError, Identity};
pub use tls::{ClientTls, Role, RoleKind, ServerTls, TlsError, TlsFiles};
