//! `sinfo`: partitions and node states, in Slurm's formats.

use std::collections::BTreeMap;

use clap::Parser;
use drover_state::hostlist::compress_hostlist;
use drover_state::slurm_time::format_time_limit;
use drover_state::{ClusterConfig, Node, State};

#[derive(Parser, Debug)]
#[command(name = "sinfo", disable_help_flag = true, about = "Partitions and nodes of a Drover cluster")]
struct Args {
    /// One line per node.
    #[arg(short = 'N', long = "Node")]
    node_oriented: bool,
    /// Why nodes are down or drained.
    #[arg(short = 'R', long = "list-reasons")]
    reasons: bool,
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Advance reservations instead of partitions.
    #[arg(short = 'T', long = "reservation")]
    reservations: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    #[arg(long = "controllers")]
    controllers: Option<String>,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    match sinfo(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sinfo: error: {e:#}");
            1
        }
    }
}

/// Slurm's compact state names (`%t`).
fn short_state(node: &Node) -> &'static str {
    match node.state_name() {
        "IDLE" => "idle",
        "MIXED" => "mix",
        "ALLOCATED" => "alloc",
        "DOWN" => "down",
        "DRAINED" => "drain",
        "DRAINING" => "drng",
        _ => "unk",
    }
}

fn sinfo(args: &[String]) -> anyhow::Result<()> {
    let args = Args::try_parse_from(std::iter::once("sinfo".to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    let client = crate::connect::client(args.controllers.as_deref())?;
    if args.reservations {
        let registry = crate::connect::runtime().block_on(client.registry(false))?;
        print!("{}", super::reservation::sinfo_table(&registry, args.noheader));
        return Ok(());
    }
    let (nodes, config) = crate::connect::runtime().block_on(client.nodes_and_config(false))?;
    let config = config.unwrap_or_default();
    print!("{}", render(&args, &nodes, &config));
    Ok(())
}

fn render(args: &Args, nodes: &[Node], config: &ClusterConfig) -> String {
    // Membership is the state machine's rule, evaluated over a state holding just these nodes.
    let mut state = State::default();
    state.meta.config = Some(config.clone());
    for node in nodes {
        state.nodes.insert(node.info.name.clone(), node.clone());
    }
    let partitions: Vec<_> =
        config.partitions.iter().filter(|p| args.partitions.is_empty() || args.partitions.contains(&p.name)).collect();
    let mut out = String::new();
    if args.reasons {
        if !args.noheader {
            out.push_str(&format!("{:<20} {:<9} {:<19} {}\n", "REASON", "USER", "TIMESTAMP", "NODELIST"));
        }
        let mut by_reason: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for node in nodes.iter().filter(|n| !n.reason.is_empty()) {
            by_reason.entry(node.reason.as_str()).or_default().push(node.info.name.clone());
        }
        for (reason, names) in by_reason {
            let since = nodes.iter().find(|n| n.reason == reason).map(|n| n.since_ms);
            let stamp = crate::format::format_timestamp(since);
            out.push_str(&format!("{:<20} {:<9} {:<19} {}\n", reason, "root", stamp, compress_hostlist(&names)));
        }
        return out;
    }
    if args.node_oriented {
        if !args.noheader {
            out.push_str(&format!("{:<9} {:>5} {:<9} {:>5}\n", "NODELIST", "NODES", "PARTITION", "STATE"));
        }
        for node in nodes {
            for p in partitions.iter().filter(|p| state.node_in_partition(&node.info, &p.name)) {
                let star = if p.default { "*" } else { "" };
                out.push_str(&format!(
                    "{:<9} {:>5} {:<9} {:>5}\n",
                    node.info.name,
                    1,
                    format!("{}{star}", p.name),
                    short_state(node)
                ));
            }
        }
        return out;
    }
    if !args.noheader {
        out.push_str(&format!(
            "{:<9} {:>5} {:>10} {:>6} {:>6} {}\n",
            "PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"
        ));
    }
    for p in partitions {
        let mut by_state: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for node in nodes.iter().filter(|n| state.node_in_partition(&n.info, &p.name)) {
            by_state.entry(short_state(node)).or_default().push(node.info.name.clone());
        }
        let name = if p.default { format!("{}*", p.name) } else { p.name.clone() };
        let avail = p.state.name().to_ascii_lowercase();
        let limit = match p.max_time_s {
            None => "infinite".to_string(),
            some => format_time_limit(some),
        };
        if by_state.is_empty() {
            out.push_str(&format!("{name:<9} {avail:>5} {limit:>10} {:>6} {:>6} {}\n", 0, "n/a", ""));
        }
        for (st, names) in by_state {
            out.push_str(&format!(
                "{name:<9} {avail:>5} {limit:>10} {:>6} {st:>6} {}\n",
                names.len(),
                compress_hostlist(&names)
            ));
        }
    }
    out
}
