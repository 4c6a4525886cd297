//! `drover-authd`: issues kernel-verified user credentials on a local Unix socket. See `drover_auth::authd`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use drover_auth::authd::{self, DEFAULT_SOCKET, SOCKET_ENV};
use drover_auth::credential::{ClusterKey, DEFAULT_TTL_MS};

/// Credentials live at most a day: a leaked one must not outlive a working day.
const MAX_TTL_MS: u64 = 24 * 3600 * 1000;

/// Issue signed credentials naming the calling user, as the kernel reports them, to local clients.
#[derive(Debug, Parser)]
#[command(name = "drover-authd", version)]
struct Args {
    /// The cluster key file (64 hex digits, mode 0600), the same on every host of the cluster.
    #[arg(long, env = "DROVER_AUTH_KEY")]
    key: PathBuf,
    /// The Unix socket to serve on (made mode 0666: each user gets only their own credential).
    #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// How long each credential is valid, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_TTL_MS, value_parser = clap::value_parser!(u64).range(1_000..=MAX_TTL_MS))]
    ttl_ms: u64,
    /// Write a new random key to --key (which must not exist), print its fingerprint, and exit. Copy the file to
    /// every host of the cluster.
    #[arg(long)]
    write_new_key: bool,
}

#[tokio::main]
async fn main() {
    // The daemons' one log setup: RUST_LOG filters, DROVER_LOG_FORMAT=json for a log pipeline.
    drover_observe::logging::init("info");
    if let Err(err) = run(Args::parse()).await {
        eprintln!("drover-authd: {err:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.write_new_key {
        let key = ClusterKey::generate();
        key.write_new(&args.key)?;
        println!("wrote a new cluster key to {} (fingerprint {})", args.key.display(), key.fingerprint());
        return Ok(());
    }
    let key = ClusterKey::load(&args.key)?;
    // bind's errors name the socket and the fix already.
    let listener = authd::bind(&args.socket)?;
    tracing::info!(socket = %args.socket.display(), "listening");

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install a SIGTERM handler")?;
    tokio::select! {
        () = authd::serve(listener, key, args.ttl_ms) => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
        _ = terminate.recv() => tracing::info!("terminated; stopping"),
    }
    // Leave no socket behind, so the next start (or a client) sees "no daemon" rather than a dead socket.
    if let Err(err) = std::fs::remove_file(&args.socket) {
        tracing::warn!(socket = %args.socket.display(), error = %err, "could not remove the socket");
    }
    Ok(())
}
