//! A cluster's keys and certificates on disk: the CA, the cluster key for user credentials, and certificates
//! issued to controllers, agents and client hosts. `drover local up` makes a throwaway set; `drover certs`
//! makes a production one (see the README's security section).
//!
//! Layout of the directory:
//!
//! | file | mode | what |
//! |---|---|---|
//! | `ca.pem` | 0644 | the CA certificate every process trusts |
//! | `ca.key` | 0600 | the CA's key: keep it off the cluster in production |
//! | `cluster.key` | 0600 | the key drover-authd signs credentials with; controllers and agents verify with it |
//! | `NAME.pem`, `NAME.key` | 0644, 0600 (0644 for client hosts) | issued certificates |

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use drover_auth::ClusterKey;
use drover_auth::tls::{Pem, Role, generate_ca, issue, write_pem};

/// Certificates issued here are valid this long (rotate with `drover certs issue` and no restart).
pub const VALID_DAYS: u32 = 825;

pub struct Pki {
    pub dir: PathBuf,
    ca: Pem,
}

impl Pki {
    /// Creates a CA and a cluster key in `dir` (which must not hold them yet).
    pub fn create(dir: &Path, cluster_name: &str) -> anyhow::Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if dir.join("ca.pem").exists() {
            bail!("{} already holds a CA (ca.pem); use it, or choose another directory", dir.display());
        }
        let ca = generate_ca(&format!("Drover cluster CA ({cluster_name})"))?;
        write_pem(&ca, &dir.join("ca.pem"), &dir.join("ca.key"), 0o600)?;
        ClusterKey::generate().write_new(&dir.join("cluster.key"))?;
        Ok(Pki { dir: dir.to_path_buf(), ca })
    }

    /// Opens an existing directory made by [`Pki::create`].
    pub fn open(dir: &Path) -> anyhow::Result<Pki> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).with_context(|| format!("cannot read {}", dir.join(name).display()))
        };
        Ok(Pki { dir: dir.to_path_buf(), ca: Pem { cert_pem: read("ca.pem")?, key_pem: read("ca.key")? } })
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn cluster_key_path(&self) -> PathBuf {
        self.dir.join("cluster.key")
    }

    /// Issues a certificate for `role` as `NAME.pem`/`NAME.key` and returns their paths. A client host's key is
    /// readable by everyone on the host (it identifies the host; users prove themselves with credentials).
    pub fn issue(&self, name: &str, role: &Role, dns: &[String], ips: &[IpAddr]) -> anyhow::Result<(PathBuf, PathBuf)> {
        let pem = issue(&self.ca, role, dns, ips, VALID_DAYS)?;
        let (cert, key) = (self.dir.join(format!("{name}.pem")), self.dir.join(format!("{name}.key")));
        let key_mode = if matches!(role, Role::Client(_)) { 0o644 } else { 0o600 };
        write_pem(&pem, &cert, &key, key_mode)?;
        Ok((cert, key))
    }
}
