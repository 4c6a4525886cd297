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

/// glibc's malloc arenas a replica may use. By default every thread that meets contention gets its own arena, up to
/// 8 per core, and each keeps what it freed: the scheduling passes (which copy the pending queue on blocking
/// threads) left a leader with 200,000 pending jobs at twice a follower's RSS. Two arenas keep that freed memory
/// reusable by the next pass.
const MALLOC_ARENAS: i32 = 2;

fn main() -> anyhow::Result<()> {
    // Before any thread exists, so that every allocation follows it.
    // SAFETY: mallopt only sets a tunable of the allocator; called once, before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
    // The configuration first: it sizes the runtime.
    let config = ControllerConfig::load(&Args::parse().config)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = config.worker_threads {
        runtime.worker_threads(workers);
    }
    runtime.enable_all().build()?.block_on(run(config))
}

async fn run(config: ControllerConfig) -> anyhow::Result<()> {
    drover_observe::logging::init("info,openraft=warn,h2=warn,tower=warn");
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
