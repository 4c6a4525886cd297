//! `drover`: multi-call. As `sbatch`/`squeue`/`scancel`/`scontrol` it is Slurm's command of that name; as
//! `drover` it has subcommands. The logic lives in the library (`drover_cli`); this file only dispatches.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use drover_cli::commands::{self, account, admin, cluster};
use drover_cli::connect;
use drover_cli::demo;
use drover_cli::local::{LocalCluster, UpOptions};

#[derive(Parser)]
#[command(name = "drover", version, about = "Drover: a highly available GPU workload manager with Slurm's interface")]
struct Cli {
    /// Controller addresses (host:port,...); default: $DROVER_CONTROLLERS or /etc/drover/client.toml.
    /// (Not global: `local up` has its own `--controllers N`.)
    #[arg(long)]
    controllers: Option<String>,
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Cluster membership and health.
    Cluster {
        #[command(subcommand)]
        command: ClusterCmd,
    },
    /// A whole cluster on this machine, in the background.
    Local {
        #[command(subcommand)]
        command: LocalCmd,
    },
    /// The README's tour: a local cluster, jobs, a controller killed mid-stream, nothing lost.
    Demo {
        /// Where the demo cluster lives (default: a fresh temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Fair-share accounts (sacctmgr's accounts): add, modify, delete, list. Root only for changes.
    Account {
        #[command(subcommand)]
        command: account::AccountCmd,
    },
    /// Quality of service: priority and per-user / per-account limits. Root only for changes.
    Qos {
        #[command(subcommand)]
        command: account::QosCmd,
    },
    /// Roles: grant, revoke and list operators and administrators (Slurm's AdminLevel).
    Admin {
        #[command(subcommand)]
        command: admin::AdminCmd,
    },
    /// The replicated audit log of administrative changes (operators and administrators).
    Audit {
        /// The first entry to show.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// At most this many entries.
        #[arg(short = 'n', long, default_value_t = 1_000)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// Who the controllers say you are, and your administrative level.
    Whoami,
    /// Checkpoints, from inside a job: `drover checkpoint record PATH [--step N]`.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCmd,
    },
    /// From inside a job: this incarnation is making progress (resets its --progress-timeout).
    Progress {
        /// The training step reached (shown by squeue -O LastProgress and scontrol show job).
        #[arg(long)]
        step: Option<u64>,
        #[command(flatten)]
        who: Incarnation,
    },
    /// GPUs of a node, one by one (operators): `drover node gpus drain NODE 3 --reason "..."`.
    Node {
        #[command(subcommand)]
        command: NodeCmd,
    },
    /// The cluster's CA, cluster key and certificates (for production set-ups; `local up` makes its own).
    Certs {
        #[command(subcommand)]
        command: admin::CertsCmd,
    },
    /// Symlink sbatch, srun, salloc, squeue, scancel, scontrol, sacct, sacctmgr, sinfo, sprio, sshare, sstat and
    /// sreport to this binary in DIR.
    InstallShims { dir: PathBuf },
    /// An env:// rendezvous of a step's ranks at MASTER_ADDR:MASTER_PORT (run it under srun).
    Rendezvous,
    /// Slurm commands, also reachable as `drover sbatch ...`.
    #[command(external_subcommand)]
    Slurm(Vec<String>),
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Per replica: id, address, role, term, leader, last log and applied index; job and node counts.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Add a replica (it joins as a learner, catches up, then becomes a voter).
    AddReplica { id: u64, address: String },
    /// Remove a replica from the membership.
    RemoveReplica { id: u64 },
    /// An online, checksummed backup of the cluster's state (jobs, accounting, accounts, QOS, reservations,
    /// roles, audit log) at one log index, taken by the leader without pausing submissions (administrators).
    /// Restore with `drover-controller --restore FILE` on fresh replicas, or `drover local up --restore FILE`.
    Backup { file: PathBuf },
    /// Check a backup file's checksum and say what it holds.
    VerifyBackup { file: PathBuf },
    /// Every replica's and agent's build, the feature level each understands, and the cluster's active level.
    Version {
        #[arg(long)]
        json: bool,
    },
    /// Rolling upgrades: see the README's upgrade runbook.
    Upgrade {
        #[command(subcommand)]
        command: UpgradeCmd,
    },
}

#[derive(Subcommand)]
enum UpgradeCmd {
    /// Raise the cluster's feature level once every replica runs a build that understands it (administrators).
    /// Irreversible: afterwards no replica can be rolled back to a build below the level.
    Finalize {
        /// The level to finalize (default: the highest every replica understands).
        #[arg(long)]
        level: Option<u32>,
    },
}

/// The job incarnation a report from inside a job speaks for.
#[derive(clap::Args)]
struct Incarnation {
    /// The job (default: $SLURM_JOB_ID).
    #[arg(long, env = "SLURM_JOB_ID")]
    job: u64,
    /// The incarnation reporting (default: $DROVER_INCARNATION); a report from any other is refused.
    #[arg(long, env = "DROVER_INCARNATION")]
    incarnation: u64,
}

#[derive(Subcommand)]
enum CheckpointCmd {
    /// Record PATH as this job's latest finished checkpoint: its next incarnation (after a requeue, a node
    /// failure or a preemption) starts with DROVER_RESUME_FROM=PATH. Refused unless run by the job's current
    /// incarnation.
    Record {
        path: PathBuf,
        /// The training step the checkpoint holds (DROVER_RESUME_STEP next time).
        #[arg(long)]
        step: Option<u64>,
        #[command(flatten)]
        who: Incarnation,
    },
    /// Never resume the job from this checkpoint (default: the one its next incarnation would resume from); the
    /// next resume takes the newest good one before it.
    Invalidate {
        /// The job (default: $SLURM_JOB_ID).
        #[arg(long, env = "SLURM_JOB_ID")]
        job: u64,
        path: Option<String>,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Take GPUs out of service (jobs keep the node's others), or return them.
    Gpus {
        #[command(subcommand)]
        command: GpusCmd,
    },
}

#[derive(Subcommand)]
enum GpusCmd {
    Drain {
        node: String,
        #[arg(required = true)]
        gpus: Vec<u32>,
        #[arg(long)]
        reason: String,
    },
    Resume {
        node: String,
        #[arg(required = true)]
        gpus: Vec<u32>,
    },
}

#[derive(Subcommand)]
enum LocalCmd {
    /// Start a local cluster under DIR (described in DIR/cluster.json).
    Up {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 3)]
        controllers: usize,
        /// Node agents with simulated GPUs (node01, node02, ...).
        #[arg(long, default_value_t = 0)]
        agents: usize,
        #[arg(long, default_value_t = 8)]
        gpus_per_agent: u32,
        /// Start from a backup (`drover cluster backup FILE`): every replica is restored from it first.
        #[arg(long, value_name = "FILE")]
        restore: Option<PathBuf>,
    },
    /// Stop the local cluster under DIR.
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
    /// "Power off" node NODE of the local cluster under DIR (SIGKILL its agent and its tasks): what a BMC does,
    /// for use as the controllers' fence_command in drills.
    Fence {
        #[arg(long)]
        dir: PathBuf,
        node: String,
    },
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let invoked = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
    if let Some(code) = slurm_command(&invoked, &argv[1..]) {
        std::process::exit(code);
    }
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("drover: error: {e:#}");
        std::process::exit(1);
    }
}

/// Runs a Slurm command by name, or returns `None` if `name` is not one.
fn slurm_command(name: &str, args: &[String]) -> Option<i32> {
    match name {
        "sbatch" => Some(commands::sbatch::run(args)),
        "squeue" => Some(commands::squeue::run(args)),
        "scancel" => Some(commands::scancel::run(args)),
        "scontrol" => Some(commands::scontrol::run(args)),
        "srun" => Some(commands::srun::run(args)),
        "sacct" => Some(commands::sacct::run(args)),
        "sacctmgr" => Some(commands::sacctmgr::run(args)),
        "salloc" => Some(commands::salloc::run(args)),
        "sstat" => Some(commands::sstat::run(args)),
        "sinfo" => Some(commands::sinfo::run(args)),
        "sprio" => Some(commands::sprio::run(args)),
        "sshare" => Some(commands::sshare::run(args)),
        "sreport" => Some(commands::sreport::run(args)),
        _ => None,
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Top::Slurm(args) => {
            let Some(code) = slurm_command(&args[0], &args[1..]) else {
                anyhow::bail!("unknown command {:?}; see drover --help", args[0]);
            };
            std::process::exit(code);
        }
        Top::InstallShims { dir } => commands::shims::install(&dir),
        Top::Rendezvous => commands::rendezvous::run(),
        Top::Cluster { command: ClusterCmd::VerifyBackup { file } } => cluster::verify_backup(&file),
        Top::Cluster { command } => {
            let client = connect::client(cli.controllers.as_deref())?;
            let rt = connect::runtime();
            match command {
                ClusterCmd::Status { json } => rt.block_on(cluster::status(&client, json)),
                ClusterCmd::AddReplica { id, address } => rt.block_on(cluster::add_replica(&client, id, &address)),
                ClusterCmd::RemoveReplica { id } => rt.block_on(cluster::remove_replica(&client, id)),
                ClusterCmd::Backup { file } => rt.block_on(cluster::backup(&client, &file)),
                ClusterCmd::VerifyBackup { file } => cluster::verify_backup(&file),
                ClusterCmd::Version { json } => rt.block_on(cluster::version(&client, json)),
                ClusterCmd::Upgrade { command: UpgradeCmd::Finalize { level } } => {
                    rt.block_on(cluster::finalize(&client, level.unwrap_or(0)))
                }
            }
        }
        Top::Local { command } => match command {
            LocalCmd::Up { dir, controllers, agents, gpus_per_agent, restore } => {
                if agents > 64 || gpus_per_agent > 64 {
                    anyhow::bail!("--agents and --gpus-per-agent are limited to 64 on one machine");
                }
                let options = UpOptions { controllers, agents, gpus_per_agent, restore, ..UpOptions::default() };
                let mut local = LocalCluster::up(&dir, options)?;
                let ready = connect::runtime().block_on(async {
                    local.wait_ready(Duration::from_secs(30)).await?;
                    local.wait_agents(Duration::from_secs(30)).await
                });
                if let Err(e) = ready {
                    local.down()?;
                    return Err(e);
                }
                local.detach();
                eprintln!(
                    "local cluster up in {} ({controllers} controllers, {agents} agents x {gpus_per_agent} GPUs); stop it with: drover local down --dir {}",
                    dir.display(),
                    dir.display()
                );
                for (id, url) in local.web_addresses() {
                    eprintln!("controller {id}: web page {url}/  metrics {url}/metrics");
                }
                println!(
                    "export DROVER_CONFIG={} DROVER_CONTROLLERS={}",
                    local.dir.join("client.toml").display(),
                    local.addresses()
                );
                Ok(())
            }
            LocalCmd::Fence { dir, node } => {
                let mut local = LocalCluster::load(&dir)?;
                drover_cli::local::fence_node(&mut local, &node)?;
                local.save()?;
                Ok(())
            }
            LocalCmd::Down { dir } => {
                let mut local = LocalCluster::load(&dir)?;
                local.down()?;
                eprintln!("local cluster in {} stopped", dir.display());
                Ok(())
            }
        },
        Top::Account { command } => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(account::account(&client, command))
        }
        Top::Qos { command } => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(account::qos(&client, command))
        }
        Top::Admin { command } => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(admin::admin(&client, command))
        }
        Top::Audit { from, limit, json } => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(admin::audit(&client, from, limit, json))
        }
        Top::Whoami => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(admin::whoami(&client))
        }
        Top::Certs { command } => admin::certs(command),
        Top::Checkpoint { command: CheckpointCmd::Record { path, step, who: Incarnation { job, incarnation } } } => {
            let path = if path.is_absolute() { path } else { std::env::current_dir()?.join(path) };
            let path = path.to_str().ok_or_else(|| anyhow::anyhow!("the checkpoint path is not UTF-8"))?.to_string();
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(client.record_checkpoint(job, incarnation, &path, step))?;
            Ok(())
        }
        Top::Checkpoint { command: CheckpointCmd::Invalidate { job, path } } => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(client.invalidate_checkpoint(job, path))?;
            Ok(())
        }
        Top::Progress { step, who: Incarnation { job, incarnation } } => {
            let client = connect::client(cli.controllers.as_deref())?;
            connect::runtime().block_on(client.record_progress(job, incarnation, step))?;
            Ok(())
        }
        Top::Node { command: NodeCmd::Gpus { command } } => {
            let client = connect::client(cli.controllers.as_deref())?;
            let (node, gpus, drain, reason) = match command {
                GpusCmd::Drain { node, gpus, reason } => (node, gpus, true, reason),
                GpusCmd::Resume { node, gpus } => (node, gpus, false, String::new()),
            };
            connect::runtime().block_on(client.drain_gpus(&node, gpus, drain, &reason))?;
            Ok(())
        }
        Top::Demo { dir } => demo::run(dir),
    }
}
