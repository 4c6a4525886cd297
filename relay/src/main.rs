//! `drover-relayd`: the per-host submission relay. See `drover_relay`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use drover_auth::tls::ClientTls;
use drover_client::{Client, ClientConfig, Credentials, DEFAULT_CONFIG_PATH};
use drover_relay::Relay;

/// Where a host's relay listens unless its configuration says otherwise.
const DEFAULT_SOCKET: &str = "/run/drover-relay/relay.sock";

/// Relay local submissions to the cluster on one long-lived connection, each with its caller's own credential.
#[derive(Debug, Parser)]
#[command(name = "drover-relayd", version)]
struct Args {
    /// The host's client configuration: the controllers and the host's TLS client certificate.
    #[arg(long, env = "DROVER_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// The Unix socket to serve (made mode 0666: each caller proves who they are with their own credential).
    /// Default: the configuration's `relay_socket`, else /run/drover-relay/relay.sock.
    #[arg(long)]
    socket: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    // The daemons' one log setup: RUST_LOG filters, DROVER_LOG_FORMAT=json for a log pipeline.
    drover_observe::logging::init("info");
    if let Err(err) = run(Args::parse()).await {
        eprintln!("drover-relayd: {err:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = ClientConfig::load(&args.config)?;
    let socket = args.socket.or_else(|| config.relay_socket.clone()).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
    let tls = ClientTls::load(config.tls_files()).context("the host's TLS client files")?;
    // No credential of its own: every call forwards its caller's.
    let client = Client::with_tls(&config, tls, Credentials::none())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install a SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping");
    };
    drover_relay::serve(Relay::new(client), &socket, shutdown).await?;
    Ok(())
}
