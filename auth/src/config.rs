//! `[security]` in a controller's or an agent's configuration file: the cluster key and the process's TLS files.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::tls::TlsFiles;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// The cluster key user credentials are signed with (`drover-authd --write-new-key FILE`; mode 0600).
    pub key_file: PathBuf,
    /// PEM files: the cluster CA (several CAs during a rotation), this process's certificate and its key.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// How often the certificate files are checked for changes (a rotation needs no restart).
    #[serde(default = "default_reload_interval_ms")]
    pub reload_interval_ms: u64,
}

fn default_reload_interval_ms() -> u64 {
    5_000
}

impl SecurityConfig {
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles { ca: self.ca.clone(), cert: self.cert.clone(), key: self.key.clone() }
    }

    /// The reload interval, never below the library's minimum.
    pub fn reload_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.reload_interval_ms.max(100))
    }
}
