//! Finding the cluster and proving who we are: the client configuration (`DROVER_CONFIG`, else
//! /etc/drover/client.toml), with the controllers from `--controllers` or `DROVER_CONTROLLERS` when given.

use drover_client::{Client, ClientConfig};

/// Builds a client from this process's configuration. Its connections live on `runtime()`.
pub fn client(flag: Option<&str>) -> anyhow::Result<Client> {
    let _context = runtime().enter();
    let config = ClientConfig::from_environment(flag)?;
    // A command is a short-lived process: start where the last one found the leader.
    Ok(Client::new(&config)?.remembering_leader())
}

/// The CLI's one runtime. Current-thread is enough for a CLI and starts faster than the multi-threaded one.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime"))
}
