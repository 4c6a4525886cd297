//! How a client finds and proves itself to a cluster: the controllers, the host's TLS client certificate, and
//! the socket of the host's `drover-authd`.

use std::path::{Path, PathBuf};

use drover_auth::tls::TlsFiles;
use serde::{Deserialize, Serialize};

use crate::ClientError;

/// Read when neither `DROVER_CONFIG` nor a flag names another file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/drover/client.toml";

/// A client's configuration file (`/etc/drover/client.toml`; `drover local up` writes one in its directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// `host:port` of the controllers. `DROVER_CONTROLLERS` (comma-separated) or `--controllers` override it.
    #[serde(default)]
    pub controllers: Vec<String>,
    /// The cluster CA and this host's client certificate and key (PEM). The key is the host's, readable by its
    /// users: it proves the connection comes from a cluster host; who the user is, the credential says.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The host's `drover-authd` socket. `DROVER_AUTH_SOCKET` overrides it.
    #[serde(default = "default_socket")]
    pub auth_socket: PathBuf,
    /// Controllers at this host's site, nearest first. Stale reads (`squeue --stale`) go to them first: any
    /// replica answers those from its own state, so a remote site's commands need not cross the WAN to the
    /// leader. Writes and linearizable reads still go to the leader. `DROVER_LOCAL_CONTROLLERS` overrides it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_controllers: Vec<String>,
    /// The host's `drover-relayd` socket, if it runs one: `sbatch` submits through it (no TLS handshake of its
    /// own) and submits directly when it is not there. The relay serves the controllers of this file, so a
    /// command aimed at others (`--controllers`, `DROVER_CONTROLLERS`) does not use it. `DROVER_RELAY_SOCKET`
    /// overrides it; empty means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_socket: Option<PathBuf>,
}

/// Names the relay socket over the configuration file's (empty: no relay).
pub const RELAY_SOCKET_ENV: &str = "DROVER_RELAY_SOCKET";

fn default_socket() -> PathBuf {
    PathBuf::from(drover_auth::authd::DEFAULT_SOCKET)
}

impl ClientConfig {
    pub fn load(path: &Path) -> Result<ClientConfig, ClientError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ClientError::Config(format!(
                "cannot read the client configuration {}: {e} (`drover local up` prints the DROVER_CONFIG to use; a \
                 production host has {DEFAULT_CONFIG_PATH})",
                path.display()
            ))
        })?;
        toml::from_str(&text)
            .map_err(|e| ClientError::Config(format!("client configuration {} is invalid: {e}", path.display())))
    }

    /// The configuration this process should use: the file `DROVER_CONFIG` names (else the default path), with
    /// the controllers from `flag`, else `DROVER_CONTROLLERS`, else the file; and the socket from
    /// `DROVER_AUTH_SOCKET` when set.
    pub fn from_environment(flag: Option<&str>) -> Result<ClientConfig, ClientError> {
        let path = std::env::var("DROVER_CONFIG").unwrap_or_else(|_| DEFAULT_CONFIG_PATH.to_string());
        let mut config = ClientConfig::load(Path::new(&path))?;
        let listed = flag
            .filter(|s| !s.trim().is_empty())
            .map(str::to_string)
            .or_else(|| std::env::var("DROVER_CONTROLLERS").ok().filter(|s| !s.trim().is_empty()));
        if let Some(list) = listed {
            config.aim_at(split_list(&list));
        }
        if let Some(socket) = std::env::var_os(RELAY_SOCKET_ENV) {
            config.relay_socket = (!socket.is_empty()).then(|| PathBuf::from(socket));
        }
        if let Ok(list) = std::env::var("DROVER_LOCAL_CONTROLLERS") {
            config.local_controllers = split_list(&list);
        }
        if let Ok(socket) = std::env::var(drover_auth::authd::SOCKET_ENV)
            && !socket.is_empty()
        {
            config.auth_socket = PathBuf::from(socket);
        }
        if config.controllers.is_empty() {
            return Err(ClientError::Config(format!(
                "no controllers known: set DROVER_CONTROLLERS=host:port,... (printed by `drover local up`), pass \
                 --controllers, or list them in {path}"
            )));
        }
        Ok(config)
    }

    /// Aims at `controllers` instead of the file's. The relay serves the file's controllers, so it is dropped
    /// unless they are the same ones (in any order).
    fn aim_at(&mut self, controllers: Vec<String>) {
        let (mut given, mut filed) = (controllers.clone(), self.controllers.clone());
        given.sort();
        filed.sort();
        if given != filed {
            self.relay_socket = None;
        }
        self.controllers = controllers;
    }

    /// The same configuration aimed at other controllers (a comma-separated list), without the relay (which
    /// serves this file's controllers).
    pub fn with_controllers(&self, list: &str) -> ClientConfig {
        ClientConfig { controllers: split_list(list), relay_socket: None, ..self.clone() }
    }

    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles { ca: self.ca.clone(), cert: self.cert.clone(), key: self.key.clone() }
    }
}

fn split_list(list: &str) -> Vec<String> {
    list.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClientConfig {
        toml::from_str(
            r#"
            controllers = ["a:1", "b:1", "c:1"]
            ca = "/ca.pem"
            cert = "/c.pem"
            key = "/c.key"
            relay_socket = "/run/drover/relay.sock"
            "#,
        )
        .unwrap()
    }

    #[test]
    fn the_relay_is_used_only_for_the_controllers_it_serves() {
        let mut same = config();
        same.aim_at(split_list("c:1, a:1,b:1"));
        assert_eq!(same.relay_socket.as_deref(), Some(Path::new("/run/drover/relay.sock")), "same cluster");
        let mut other = config();
        other.aim_at(split_list("a:1,b:1"));
        assert_eq!(other.relay_socket, None, "another set of controllers is another cluster");
        assert_eq!(config().with_controllers("x:1").relay_socket, None);
    }
}
