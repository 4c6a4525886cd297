//! `drover-controller --config FILE`: runs one replica until SIGTERM/SIGINT, or until its storage fails.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use drover_controller::{Controller, ControllerConfig};

#[derive(Parser)]
#[command(name = "drover-controller", about = "One Raft replica of the Drover controller")]
struct Args {
    /// The replica's TOML configuration.
    #[arg(long, short = 'c', env = "DROVER_CONTROLLER_CONFIG")]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    drover_observe::logging::init("info,openraft=warn,h2=warn,tower=warn");
    let args = Args::parse();
    let config = ControllerConfig::load(&args.config)?;
    let data_dir = config.data_dir.clone();
    let controller = Controller::start(config).await.context("drover-controller failed to start")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        reason = controller.fatal() => {
            // Storage failed (disk full, I/O error): stop serving rather than apply a half state.
            anyhow::bail!("replica stopped: storage in {} failed: {reason}", data_dir.display());
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    controller.shutdown().await;
    Ok(())
}
