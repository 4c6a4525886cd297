//! Roles carried in certificates as URI SANs.

use std::fmt;
use std::str::FromStr;

use x509_parser::extensions::GeneralName;

use super::TlsError;

const SCHEME: &str = "drover://";
/// Node and host names are DNS-like: at most 253 characters.
const MAX_NAME_LEN: usize = 253;

/// What a certificate's holder is in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// A controller replica, by its Raft node id.
    Controller(u64),
    /// A node agent, by its node name.
    Agent(String),
    /// A user-facing client host (CLI, tooling), by host name.
    Client(String),
}

/// A role without its name, for "I expect to be talking to a controller".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoleKind {
    Controller,
    Agent,
    Client,
}

impl Role {
    pub fn kind(&self) -> RoleKind {
        match self {
            Role::Controller(_) => RoleKind::Controller,
            Role::Agent(_) => RoleKind::Agent,
            Role::Client(_) => RoleKind::Client,
        }
    }

    /// The URI SAN form, e.g. `drover://agent/gpu-017`.
    pub fn uri(&self) -> String {
        self.to_string()
    }

    /// Parses the URI SAN form. Names are checked so a certificate cannot smuggle separators or control
    /// characters into logs and authorization decisions.
    pub fn parse(uri: &str) -> Result<Role, TlsError> {
        let bad = |reason: &str| TlsError::BadRole { uri: uri.to_owned(), reason: reason.to_owned() };
        let rest = uri.strip_prefix(SCHEME).ok_or_else(|| bad("does not start with drover://"))?;
        let (kind, name) = rest.split_once('/').ok_or_else(|| bad("expected drover://KIND/NAME"))?;
        match kind {
            "controller" => match name.parse::<u64>() {
                // Only the canonical spelling, so one controller has exactly one role string.
                Ok(id) if id.to_string() == name => Ok(Role::Controller(id)),
                _ => Err(bad("a controller's name must be its numeric id")),
            },
            "agent" => check_name(name).map(|()| Role::Agent(name.to_owned())).map_err(bad),
            "client" => check_name(name).map(|()| Role::Client(name.to_owned())).map_err(bad),
            _ => Err(bad("the kind must be controller, agent or client")),
        }
    }
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err("the name must be 1 to 253 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')) {
        return Err("the name may hold only letters, digits, '.', '-' and '_'");
    }
    Ok(())
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Controller(id) => write!(f, "{SCHEME}controller/{id}"),
            Role::Agent(name) => write!(f, "{SCHEME}agent/{name}"),
            Role::Client(name) => write!(f, "{SCHEME}client/{name}"),
        }
    }
}

impl FromStr for Role {
    type Err = TlsError;
    fn from_str(s: &str) -> Result<Role, TlsError> {
        Role::parse(s)
    }
}

impl fmt::Display for RoleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RoleKind::Controller => "controller",
            RoleKind::Agent => "agent",
            RoleKind::Client => "client",
        })
    }
}

/// The drover role in a DER certificate's URI SANs. Exactly one is required: two would make authorization depend
/// on which one a reader happens to pick.
pub fn cert_role(der: &[u8]) -> Result<Role, TlsError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::BadCertificate { reason: e.to_string() })?;
    let san = cert.subject_alternative_name().map_err(|e| TlsError::BadCertificate { reason: e.to_string() })?;
    let mut uris = san.iter().flat_map(|ext| ext.value.general_names.iter()).filter_map(|name| match name {
        GeneralName::URI(uri) if uri.starts_with(SCHEME) => Some(*uri),
        _ => None,
    });
    let first = uris.next().ok_or(TlsError::NoRole)?;
    if let Some(second) = uris.next() {
        return Err(TlsError::AmbiguousRole { first: first.to_owned(), second: second.to_owned() });
    }
    Role::parse(first)
}

/// The role of the peer that sent `req`, from its client certificate (the first one it presented: the leaf).
/// Works on servers fed by [`super::incoming`]; `unauthenticated` when there is no client certificate (a plain-TCP
/// port) or no valid drover role in it.
pub fn peer_role<T>(req: &tonic::Request<T>) -> Result<Role, tonic::Status> {
    let certs = req.peer_certs().ok_or_else(|| {
        tonic::Status::unauthenticated(
            "no client certificate: this port requires mutual TLS; give the client its tls files (ca, cert, key)",
        )
    })?;
    let leaf = certs
        .first()
        .ok_or_else(|| tonic::Status::unauthenticated("the client presented an empty certificate chain"))?;
    cert_role(leaf).map_err(|err| tonic::Status::unauthenticated(format!("client certificate refused: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_survive_a_round_trip_through_their_uri() {
        for role in [Role::Controller(3), Role::Agent("gpu-017.rack2".into()), Role::Client("login_1".into())] {
            assert_eq!(Role::parse(&role.uri()).unwrap(), role);
        }
        assert_eq!(Role::Agent("n1".into()).uri(), "drover://agent/n1");
        assert_eq!(Role::Controller(7).kind(), RoleKind::Controller);
    }

    #[test]
    fn malformed_roles_are_refused_with_a_reason() {
        for uri in [
            "https://agent/n1",
            "drover://agent",
            "drover://agent/",
            "drover://wizard/n1",
            "drover://controller/x",
            "drover://controller/007",
            "drover://controller/-1",
            "drover://agent/n1/extra",
            "drover://agent/n 1",
            "drover://client/a\nb",
        ] {
            assert!(matches!(Role::parse(uri), Err(TlsError::BadRole { .. })), "{uri:?} should be refused");
        }
        let long = format!("drover://agent/{}", "a".repeat(254));
        assert!(Role::parse(&long).is_err());
    }

    #[test]
    fn a_request_without_tls_has_no_peer_role() {
        let status = peer_role(&tonic::Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("mutual TLS"), "{}", status.message());
    }
}
