//! `drover-agent`: the node agent. `drover-agent supervise DIR` is the per-task supervisor it starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use drover_agent::config::AgentConfig;
use drover_agent::gpu::{ExpectedGpus, check_inventory, open_backend};
use drover_agent::node::NodeAgent;
use drover_proto::v1::agent_service_server::AgentServiceServer;
use drover_state::NodeInfo;

#[derive(Parser, Debug)]
#[command(name = "drover-agent", about = "Drover node agent: registers this node's GPUs and runs its tasks")]
struct Args {
    /// TOML config file; the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Controller addresses, comma-separated.
    #[arg(long, value_delimiter = ',')]
    controllers: Vec<String>,
    #[arg(long)]
    listen: Option<String>,
    /// The host other nodes reach this one by (`MASTER_ADDR`).
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    state_dir: Option<PathBuf>,
    #[arg(long)]
    cpus: Option<u32>,
    /// Simulate N GPUs instead of asking NVML.
    #[arg(long)]
    simulate_gpus: Option<u32>,
    /// GPU model (e.g. H200): checked against NVML, the simulated model, and the `--gres` type.
    #[arg(long)]
    gpu_model: Option<String>,
    #[arg(long, value_delimiter = ',')]
    partitions: Vec<String>,
    /// Between SIGTERM and SIGKILL when a job is cancelled or times out (Slurm's KillWait).
    #[arg(long)]
    kill_wait_ms: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    maybe_supervise();
    drover_observe::logging::init("info,h2=warn,tower=warn,hyper=warn");
    let args = Args::parse();
    let config = load_config(&args)?;
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(run(config))
}

fn load_config(args: &Args) -> anyhow::Result<AgentConfig> {
    let mut config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig {
            name: String::new(),
            controllers: Vec::new(),
            listen: "0.0.0.0:6818".into(),
            advertise: None,
            host: None,
            state_dir: PathBuf::from("/var/lib/drover-agent"),
            cpus: None,
            memory_mb: None,
            partitions: Vec::new(),
            features: Vec::new(),
            topology: Default::default(),
            gpus: Default::default(),
            kill_wait_ms: 10_000,
            xid_actions: None,
            gpu_reset_command: None,
            reboot_program: None,
            security: None,
            client_config: None,
            enforce_memory: true,
            memory_cgroup: drover_agent::cgroup::DEFAULT_SUBDIR.to_string(),
            confine_cpus: true,
            metrics_listen: None,
            spare: false,
            containers: Default::default(),
            health_check_program: None,
            health_check_interval_s: drover_agent::config::DEFAULT_HEALTH_CHECK_INTERVAL_S,
            health_check_timeout_s: drover_agent::config::DEFAULT_HEALTH_CHECK_TIMEOUT_S,
            health_check_on_start: true,
        },
    };
    if let Some(v) = &args.name {
        config.name = v.clone();
    }
    if !args.controllers.is_empty() {
        config.controllers = args.controllers.clone();
    }
    if let Some(v) = &args.listen {
        config.listen = v.clone();
    }
    if let Some(v) = &args.host {
        config.host = Some(v.clone());
    }
    if let Some(v) = &args.state_dir {
        config.state_dir = v.clone();
    }
    if let Some(v) = args.cpus {
        config.cpus = Some(v);
    }
    if let Some(v) = args.simulate_gpus {
        config.gpus.simulate = Some(v);
    }
    if let Some(v) = &args.gpu_model {
        config.gpus.model = Some(v.clone());
    }
    if let Some(v) = args.kill_wait_ms {
        config.kill_wait_ms = v;
    }
    if !args.partitions.is_empty() {
        config.partitions = args.partitions.clone();
    }
    Ok(config.finish()?)
}

async fn run(mut config: AgentConfig) -> anyhow::Result<()> {
    let expected = ExpectedGpus { count: config.gpus.count, model_contains: config.gpus.model.clone() };
    // Simulated nodes share a host with other simulated nodes (of other test clusters, too): each marks its tasks
    // with its name and state directory, unique on the host and the same after a restart.
    let host_marker = format!("{}:{}", config.name, config.state_dir.display());
    let backend: Box<dyn drover_agent::gpu::GpuBackend> = match (config.gpus.simulate, &config.gpus.fault_file) {
        (Some(n), Some(file)) => {
            let model = config.gpus.model.clone().unwrap_or_else(|| "H200".into());
            let backend = drover_agent::gpu::SimulatedBackend::new(n, &model, &config.name);
            Box::new(backend.with_host_marker(&host_marker).with_fault_file(file))
        }
        (simulate, _) => open_backend(simulate, &config.name, &host_marker, &expected),
    };
    let gpus = backend.inventory().context("reading the GPU inventory")?;
    if config.containers.cdi_spec.is_none() {
        // Containers get their GPUs through CDI: a simulated node's stand-ins, or NVIDIA's spec where it is.
        config.containers.cdi_spec = match config.gpus.simulate {
            Some(n) => Some(
                drover_agent::cdi::write_simulated(&config.state_dir.join("cdi"), n)
                    .context("writing the simulated GPUs' CDI spec")?,
            ),
            None => drover_agent::cdi::default_spec(),
        };
    }
    // A bad XID table stops the agent here, naming the line, rather than applying half of an operator's policy.
    drover_agent::xid::XidTable::load(config.xid_actions.as_deref())?;
    let mut problems = Vec::new();
    if let Err(e) = check_inventory(&gpus, &expected) {
        tracing::error!("{e}; the node is drained until this is fixed");
        problems.push(e.to_string());
    }
    tracing::info!(node = %config.name, gpus = gpus.len(), backend = %backend.describe(), "GPU inventory");
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let bound: SocketAddr = listener.local_addr()?;
    let info = NodeInfo {
        name: config.name.clone(),
        agent_addr: config.advertise_addr(bound),
        host: config.host(),
        cpus: config.cpus.unwrap_or(1),
        memory_mb: config.memory_mb.unwrap_or(0),
        gpu_type: config.gpus.model.clone().unwrap_or_default().to_ascii_lowercase(),
        gpus,
        partitions: config.partitions.clone(),
        features: config.features.clone(),
        topology: config.topology.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        spare: config.spare,
    };
    let exe = std::env::current_exe().context("locating the drover-agent binary for task supervisors")?;
    let state_dir = config.state_dir.clone();
    let security = config.security.clone().context("the agent needs a [security] section")?;
    let key = drover_auth::ClusterKey::load(&security.key_file)?;
    let client_tls = drover_auth::ClientTls::load(security.tls_files())?;
    let server_tls = drover_auth::ServerTls::load(security.tls_files())?;
    match client_tls.role() {
        Some(drover_auth::Role::Agent(name)) if name == config.name => {}
        other => anyhow::bail!(
            "the certificate {} is for {}, not agent/{}: issue this node a certificate for its own name",
            security.cert.display(),
            other.map_or_else(|| "no drover role".to_string(), |r| r.to_string()),
            config.name
        ),
    }
    client_tls.spawn_reloader(security.reload_interval());
    server_tls.spawn_reloader(security.reload_interval());
    // Slurm's HealthCheckProgram: run once before the node registers (a node failing it registers drained), then
    // every interval; its failure drains the node with the program's last line as the reason.
    let health_check = drover_agent::health_check::HealthCheck::from_config(&config, &config.name);
    let agent = NodeAgent::new(config, info, exe, backend, problems, key, client_tls)
        .with_context(|| format!("cannot use the state directory {}", state_dir.display()))?;
    if let Some(check) = health_check {
        if let Some(reason) = check.run_at_start(&agent.health_check).await {
            tracing::warn!("{reason}; the node will be drained");
        }
        tokio::spawn(check.run_forever(agent.health_check.clone()));
    }
    let reattached = agent.task_dirs().len();
    if reattached > 0 {
        tracing::info!(tasks = reattached, "re-attaching to tasks left by the previous agent");
    }
    tracing::info!(node = %agent.info.name, addr = %agent.info.agent_addr, "agent started");
    // Mutual TLS (the accept loop sets TCP_NODELAY, or step output would wait on delayed ACKs); each step
    // launch also carries its user's credential.
    let server = tonic::transport::Server::builder()
        .add_service(AgentServiceServer::new(drover_agent::steps::StepServer(agent.clone())))
        .serve_with_incoming(drover_auth::tls::incoming(listener, server_tls));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!("agent gRPC server stopped: {e}");
        }
    });
    if let Some(addr) = &agent.config.metrics_listen {
        let listener = drover_observe::http::bind(addr).await?;
        let (_keep, stop) = tokio::sync::watch::channel(false);
        let handler: std::sync::Arc<dyn drover_observe::http::Handler> =
            std::sync::Arc::new(drover_agent::metrics::AgentMetrics(agent.clone()));
        tokio::spawn(async move {
            // Serves for the life of the process: `_keep` never sends.
            let _keep = _keep;
            drover_observe::http::serve(listener, handler, stop).await
        });
        tracing::info!(%addr, "serving /metrics");
    }
    tokio::spawn(drover_agent::session::run(agent.clone()));
    loop {
        let a = agent.clone();
        tokio::task::spawn_blocking(move || a.reconcile()).await?;
        tokio::select! {
            _ = agent.wake.notified() => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(drover_agent::node::RECONCILE_INTERVAL_MS)) => {}
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("agent stopping; its tasks keep running under their supervisors");
                return Ok(());
            }
        }
    }
}

/// `drover-agent supervise DIR` is a task supervisor, not the agent (see `drover_agent::supervise`). It is handled
/// before anything else runs because the supervisor forks, which is only safe while the process has one thread.
fn maybe_supervise() {
    let args: Vec<_> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == "supervise") {
        let Some(dir) = args.get(2) else {
            eprintln!("usage: drover-agent supervise DIR");
            std::process::exit(2);
        };
        std::process::exit(drover_agent::supervise::run_supervisor(Path::new(dir)));
    }
}
