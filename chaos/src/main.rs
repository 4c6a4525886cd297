//! `drover-chaos`: runs fault drills against a Drover cluster and judges what they recorded.
//!
//! - `drover-chaos run chaos/drills/leader-kill.toml`: brings up a local cluster, runs the drill, prints the
//!   report, leaves `history.jsonl`, `report.txt` and `timeline.svg` in the output directory; exits 1 when an
//!   invariant was broken.
//! - `drover-chaos run DRILL --docker-target chaos-target.toml`: the same against a running compose cluster
//!   (`deploy/compose/`): faults are `docker kill/stop/start/pause`, `docker network disconnect` and iptables in
//!   the containers' namespaces; the drill's `[cluster]` shape is not used, the compose files define the cluster.
//! - `drover-chaos check HISTORY`: the checker alone, on a saved history.
//! - `drover-chaos report HISTORY`: the table and the timeline again, from a saved history.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use drover_chaos::checker::{Bounds, check};
use drover_chaos::docker_target::DockerTarget;
use drover_chaos::drill::{Drill, FaultKind};
use drover_chaos::history::History;
use drover_chaos::local_target::LocalTarget;
use drover_chaos::report::{Summary, timeline_svg};
use drover_chaos::target::Target;

#[derive(Parser)]
#[command(name = "drover-chaos", about = "Fault drills against a Drover cluster, judged by an invariant checker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a drill file against a local cluster it brings up (needs root: the faults are iptables rules).
    Run {
        drill: PathBuf,
        /// Where the cluster and the results go (default: a new directory under /tmp).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Run against the containers this file describes (`chaos-target.toml`, written by
        /// deploy/compose/setup.sh) instead of bringing up a local cluster.
        #[arg(long, value_name = "FILE")]
        docker_target: Option<PathBuf>,
    },
    /// Judges a recorded history.
    Check {
        history: PathBuf,
        /// Liveness bound after the last heal (s); without it liveness is not judged.
        #[arg(long)]
        finish_within_s: Option<u64>,
    },
    /// Prints the summary and writes the timeline of a recorded history.
    Report {
        history: PathBuf,
        #[arg(long, default_value = "timeline.svg")]
        svg: PathBuf,
    },
}

fn read_history(path: &PathBuf) -> anyhow::Result<History> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    History::read(std::io::BufReader::new(file)).with_context(|| format!("reading {}", path.display()))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { drill, dir, docker_target } => {
            let drill = Drill::load(&drill)?;
            let dir = dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!(
                    "drover-chaos-{}-{}",
                    drill.name,
                    drover_chaos::recorder::unix_ms() / 1000
                ))
            });
            let mut target: Box<dyn Target> = match docker_target {
                Some(file) => {
                    let target = DockerTarget::open(&file)?;
                    if let Some(socket) = target.auth_socket()
                        && std::env::var_os("DROVER_AUTH_SOCKET").is_none()
                    {
                        // SAFETY: no other thread exists yet (the runtime is built below), so nothing reads the
                        // environment concurrently.
                        unsafe { std::env::set_var("DROVER_AUTH_SOCKET", socket) };
                    }
                    println!(
                        "drill {}: against the containers of {} (its [cluster] shape is not used); results in {}",
                        drill.name,
                        file.display(),
                        dir.display()
                    );
                    Box::new(target)
                }
                None => {
                    let disk = drill.faults.iter().any(|f| f.kind == FaultKind::DiskFull);
                    println!("drill {}: cluster and results in {}", drill.name, dir.display());
                    Box::new(LocalTarget::up(&dir, &drill.cluster, disk)?)
                }
            };
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let results = dir.join("results");
            let outcome = runtime.block_on(async {
                // Ctrl-C or SIGTERM ends the drill early, but never before the faults are undone and the cluster
                // stopped: a firewall rule left behind would cut off whatever later uses the address.
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
                tokio::select! {
                    outcome = drover_chaos::runner::run(&drill, target.as_mut(), &results) => outcome,
                    _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; the faults are undone and the cluster stopped")),
                    _ = term.recv() => Err(anyhow::anyhow!("terminated; the faults are undone and the cluster stopped")),
                }
            });
            target.teardown()?;
            let outcome = outcome?;
            let summary = Summary::of(&outcome.history, &outcome.violations);
            let table = summary.table(&drill.name, &outcome.violations);
            std::fs::write(outcome.out_dir.join("report.txt"), &table)?;
            std::fs::write(outcome.out_dir.join("timeline.svg"), timeline_svg(&outcome.history, &drill.name))?;
            println!("\n{table}\nhistory, report and timeline in {}", outcome.out_dir.display());
            if !outcome.violations.is_empty() {
                std::process::exit(1);
            }
        }
        Command::Check { history, finish_within_s } => {
            let history = read_history(&history)?;
            let violations = check(&history, Bounds { finish_within_ms: finish_within_s.map(|s| s * 1000) });
            for v in &violations {
                println!("{v}");
            }
            println!("{} events, {} violations", history.events.len(), violations.len());
            if !violations.is_empty() {
                std::process::exit(1);
            }
        }
        Command::Report { history, svg } => {
            let h = read_history(&history)?;
            let violations = check(&h, Bounds::default());
            print!("{}", Summary::of(&h, &violations).table(&history.display().to_string(), &violations));
            std::fs::write(&svg, timeline_svg(&h, &history.display().to_string()))?;
            println!("timeline in {}", svg.display());
        }
    }
    Ok(())
}
