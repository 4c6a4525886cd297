//! Finding the cluster: `--controllers`, else `DROVER_CONTROLLERS`, else the config file.

use drover_client::Client;

/// The config file consulted when neither the flag nor the variable is set.
pub const CONFIG_PATH: &str = "/etc/drover/client.toml";

#[derive(serde::Deserialize)]
struct ClientConfig {
    controllers: Vec<String>,
}

/// Builds a client from the first source that names controllers. Its connections live on `runtime()`.
pub fn client(flag: Option<&str>) -> anyhow::Result<Client> {
    let _context = runtime().enter();
    if let Some(list) = flag.filter(|s| !s.trim().is_empty()) {
        return Ok(Client::from_list(list)?);
    }
    if let Ok(list) = std::env::var("DROVER_CONTROLLERS")
        && !list.trim().is_empty()
    {
        return Ok(Client::from_list(&list)?);
    }
    let path = std::env::var("DROVER_CONFIG").unwrap_or_else(|_| CONFIG_PATH.to_string());
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let config: ClientConfig =
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("client config {path} is invalid: {e}"))?;
            Ok(Client::new(config.controllers)?)
        }
        Err(_) => anyhow::bail!(
            "no controllers known: set DROVER_CONTROLLERS=host:port,... (printed by `drover local up`), pass --controllers, or write {path}"
        ),
    }
}

/// The CLI's one runtime. Current-thread is enough for a CLI and starts faster than the multi-threaded one.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime"))
}
