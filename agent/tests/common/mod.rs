//! A real `NodeAgent` named n1 for tests that drive it directly (no controller): a throwaway CA and agent
//! certificate, two simulated GPUs, its state under `dir`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_agent::config::AgentConfig;
use drover_agent::gpu::SimulatedBackend;
use drover_agent::node::NodeAgent;
use drover_auth::tls::{Role, generate_ca, issue, write_pem};
use drover_state::NodeInfo;

/// `extra_toml` is appended to the agent's configuration; `supervisor` is the binary it starts tasks with.
pub fn agent(dir: &Path, extra_toml: &str, supervisor: PathBuf) -> Arc<NodeAgent> {
    let ca = generate_ca("test").unwrap();
    write_pem(&ca, &dir.join("ca.pem"), &dir.join("ca.key"), 0o600).unwrap();
    let cert = issue(&ca, &Role::Agent("n1".into()), &[], &["127.0.0.1".parse().unwrap()], 30).unwrap();
    write_pem(&cert, &dir.join("n1.pem"), &dir.join("n1.key"), 0o600).unwrap();
    let files = drover_auth::TlsFiles { ca: dir.join("ca.pem"), cert: dir.join("n1.pem"), key: dir.join("n1.key") };
    let config: AgentConfig = toml::from_str(&format!(
        "name = \"n1\"\ncontrollers = [\"127.0.0.1:1\"]\nstate_dir = {:?}\n{extra_toml}",
        dir.join("state").display().to_string()
    ))
    .unwrap();
    NodeAgent::new(
        config,
        NodeInfo { name: "n1".into(), ..NodeInfo::default() },
        supervisor,
        // Each test's node is its own on this host: tests running beside it must not hold its GPUs.
        Box::new(SimulatedBackend::new(2, "H200", "n1").with_host_marker(&dir.display().to_string())),
        Vec::new(),
        drover_auth::ClusterKey::generate(),
        drover_auth::ClientTls::load(files).unwrap(),
    )
    .unwrap()
}
