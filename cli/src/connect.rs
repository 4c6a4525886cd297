//! Finding the cluster and proving who we are: the client configuration (`DROVER_CONFIG`, else
//! /etc/drover/client.toml), with the controllers from `--controllers` or `DROVER_CONTROLLERS` when given.

use drover_client::relay::{self, RelayAttempt};
use drover_client::{Client, ClientConfig, Credentials};
use drover_state::JobSpec;

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

/// Submits one job as a short-lived command should: through the host's relay (`drover-relayd`) when the
/// configuration names one for this cluster and it answers, else directly. One request id covers both, so
/// falling back after a relay that died mid-call never submits twice.
pub fn submit(flag: Option<&str>, spec: &JobSpec) -> anyhow::Result<u64> {
    let config = ClientConfig::from_environment(flag)?;
    let spec = drover_client::encode_spec(spec)?;
    let request_id = drover_client::one_off_request_id();
    let credentials = Credentials::from_socket(&config.auth_socket);
    if let Some(socket) = config.relay_socket.as_deref().filter(|s| s.exists()) {
        // Without a credential there is nothing to forward, and the direct path would fail the same way.
        let token = credentials.token()?;
        let token = token.to_str().map_err(|_| anyhow::anyhow!("drover-authd answered with an unusable token"))?;
        match relay::submit(socket, token, spec.clone(), &request_id) {
            RelayAttempt::Submitted(job_id) => return Ok(job_id),
            RelayAttempt::Refused(e) => return Err(e.into()),
            // Not running, or gone mid-call: the direct path below, under the same request id.
            RelayAttempt::Unavailable(_) => {}
        }
    }
    let _context = runtime().enter();
    let client = Client::with_credentials(&config, credentials)?.remembering_leader();
    Ok(runtime().block_on(client.submit_encoded(spec, request_id))?)
}
