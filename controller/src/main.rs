//! `drover-controller --config FILE`: runs one replica until SIGTERM/SIGINT, or until its storage fails. With
//! `--restore FILE` or `--force-new-cluster` it changes a stopped replica's data directory and exits instead.

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
    /// Fill this replica's empty data directory from a backup (`drover cluster backup FILE`), as a founder of the
    /// new cluster its `initial_members` name, then exit. Start the replica normally afterwards.
    #[arg(long, value_name = "FILE", conflicts_with = "force_new_cluster")]
    restore: Option<PathBuf>,
    /// After a majority of the replicas is lost for good: make this stopped replica the only member of its cluster,
    /// keeping everything it holds (entries it never received are lost), then exit. Start it normally afterwards
    /// and add replicas back with `drover cluster add-replica`. Needs --confirm-quorum-lost.
    #[arg(long, requires = "confirm_quorum_lost")]
    force_new_cluster: bool,
    /// Confirms that the other replicas are gone for good (a forced new cluster beside a live old one would be two
    /// clusters running the same jobs).
    #[arg(long)]
    confirm_quorum_lost: bool,
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
    let args = Args::parse();
    let config = ControllerConfig::load(&args.config)?;
    if let Some(file) = &args.restore {
        let started = std::time::Instant::now();
        let done = drover_controller::recovery::restore(&config, file)?;
        println!(
            "restored {} records from {} (log index {}, taken by replica {} of version {}, sha256 {}) into {} in {:.2} s; founders: {:?}",
            done.records,
            file.display(),
            done.header.last_log_index,
            done.header.taken_by,
            done.header.binary_version,
            done.sha256,
            config.data_dir.display(),
            started.elapsed().as_secs_f64(),
            config.initial_members.keys().collect::<Vec<_>>(),
        );
        return Ok(());
    }
    if args.force_new_cluster {
        let done = drover_controller::recovery::force_new_cluster(&config)?;
        println!(
            "replica {} is now the only member of its cluster (was: {:?}); it keeps its state applied up to log index {} and {} entries after it, which it commits when it starts{}",
            config.id,
            done.old_members,
            done.applied_index,
            done.kept_unapplied,
            if done.dropped > 0 {
                format!("; {} entries from an unapplied membership change on were dropped", done.dropped)
            } else {
                String::new()
            },
        );
        return Ok(());
    }
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
