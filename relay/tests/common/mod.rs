//! What the relay's tests share: a host's client configuration with real TLS files, aimed at a cluster that is
//! not there.

use std::path::{Path, PathBuf};

/// A client configuration aimed at a controller that is not there, with real TLS files.
pub fn host_config(dir: &Path) -> PathBuf {
    let pki = drover_cli::pki::Pki::create(&dir.join("pki"), "relay-test").unwrap();
    let (cert, key) = pki.issue("client", &drover_auth::Role::Client("h".into()), &["h".into()], &[]).unwrap();
    let config = drover_client::ClientConfig {
        controllers: vec!["127.0.0.1:1".into()],
        ca: pki.ca_path(),
        cert,
        key,
        auth_socket: dir.join("auth.sock"),
        local_controllers: Vec::new(),
        relay_socket: Some(dir.join("relay.sock")),
    };
    let path = dir.join("client.toml");
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path
}
