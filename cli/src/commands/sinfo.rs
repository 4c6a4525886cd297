//! `sinfo`: partitions and nodes in Slurm 22.05's layouts: the partition summary (a line per partition and node
//! state), `-N` (a line per node and partition), `-R` (why nodes are down or drained), `-s` (node counts per
//! partition), `-l`, and any `-o`/`-O` format. Nodes share a line exactly when Slurm's would: same partition, and
//! every shown field prints the same for them. Scripts and dashboards that parse `sinfo -h -o ...` (node states,
//! GPU counts, drain reasons) therefore read Drover as they read Slurm.

use crate::command::Common;
use std::cmp::Ordering;
use std::time::Duration;

use clap::Parser;
use drover_state::hostlist::{compress_hostlist, expand_hostlist};
use drover_state::slurm_time::format_duration;
use drover_state::{ClusterConfig, Node, NodeHealth, Partition, PartitionState, State};

use crate::format::{Item, convert_num_unit, format_timestamp, pad};
use crate::slurm::nodes::{node_gres, node_gres_used, node_state};

/// Slurm 22.05's default layouts, in their `-O` spelling (as sinfo itself defines them).
const DEFAULT_FORMAT: &str = "partition:9 ,available:.5 ,time:.10 ,nodes:.6 ,statecompact:.6 ,nodelist:0";
const DEFAULT_LONG: &str = "partition:9 ,available:.5 ,time:.10 ,size:.10 ,root:.4 ,oversubscribe:.8 ,groups:.10 ,nodes:.6 ,statelong:.11 ,nodelist:0";
const NODE_FORMAT: &str = "nodelist:0 ,nodes:.6 ,partition:.9 ,statecompact:6";
const NODE_LONG: &str = "nodelist:0 ,nodes:.6 ,partition:.9 ,statelong:.11 ,cpus:4 ,socketcorethread:.8 ,memory:.6 ,disk:.8 ,weight:.6 ,features:.8 ,reason:20";
const SUMMARY_FORMAT: &str = "partition:9 ,available:.5 ,time:.10 ,nodeaiot:.16 ,nodelist:0";
const REASONS_FORMAT: &str = "reason:20 ,user:9 ,timestamp:19 ,nodelist:0";
const REASONS_LONG: &str = "reason:20 ,userlong:12 ,timestamp:19 ,statecompact:6 ,nodelist:0";
/// `-R` without `-t`: nodes that are down, failed or drained.
const REASON_STATES: &str = "down,fail,drain";
/// The narrowest node list and partition columns of the default layouts (they widen to the longest value).
const MIN_AUTO_WIDTH: usize = 9;
/// The most seconds `-i` waits between reports (Slurm takes any; a day is plenty).
const MAX_ITERATE_S: u64 = 86_400;
/// The longest format accepted (`-o`, `-O`, `SINFO_FORMAT`): a bound on the work per line.
const MAX_FORMAT_BYTES: usize = 4_096;

#[derive(Parser, Debug)]
#[command(
    name = "sinfo",
    disable_help_flag = true,
    disable_version_flag = true,
    about = "Partitions and nodes of a Drover cluster"
)]
struct Args {
    /// Accepted for compatibility: every partition is shown already.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Only nodes that do not respond (Drover: nodes declared down).
    #[arg(short = 'd', long = "dead")]
    dead: bool,
    /// Lines group only nodes of exactly equal CPUs, memory and the other sizes shown.
    #[arg(short = 'e', long = "exact")]
    exact: bool,
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Report again every N seconds.
    #[arg(short = 'i', long = "iterate")]
    iterate: Option<u64>,
    /// Long layouts (more columns, full state names).
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// Only these nodes (a hostlist).
    #[arg(short = 'n', long = "nodes")]
    nodes: Option<String>,
    /// One line per node (and partition).
    #[arg(short = 'N', long = "Node")]
    node_oriented: bool,
    /// Output format (`%P %.5a %.10l %.6D %.6t %N`).
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Output format by field name (`NodeList:20,StateLong,Gres:30`).
    #[arg(short = 'O', long = "Format")]
    format_long: Option<String>,
    /// Only these partitions (comma-separated).
    #[arg(short = 'p', long = "partition")]
    partitions: Option<String>,
    /// Only nodes that respond.
    #[arg(short = 'r', long = "responding")]
    responding: bool,
    /// Why nodes are down or drained.
    #[arg(short = 'R', long = "list-reasons")]
    reasons: bool,
    /// Node counts per partition (allocated/idle/other/total).
    #[arg(short = 's', long = "summarize")]
    summarize: bool,
    /// Sort keys (`-S P,-t`): `+`/`-`/`#` then a format letter.
    #[arg(short = 'S', long = "sort", allow_hyphen_values = true)]
    sort: Option<String>,
    /// Only nodes in these states (comma-separated, `&` for all of them), or `all`.
    #[arg(short = 't', long = "states")]
    states: Option<String>,
    /// Advance reservations instead of partitions.
    #[arg(short = 'T', long = "reservation")]
    reservations: bool,
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[arg(long = "hide")]
    hide: bool,
    /// Accepted for compatibility: Drover runs one cluster.
    #[arg(long = "local")]
    local: bool,
    #[arg(long = "federation")]
    federation: bool,
    /// CPU counts as plain numbers (no `K` suffix).
    #[arg(long = "noconvert")]
    noconvert: bool,
    #[arg(long = "usage")]
    usage: bool,
    #[command(flatten)]
    common: Common,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

const USAGE: &str = "Usage: sinfo [-abdelNRrsTv] [-i seconds] [-t states] [-p partition] [-n nodes]\n             [-S fields] [-o format] [-O Format] [--federation] [--local]";

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("sinfo", sinfo(args))
}

fn sinfo(args: &[String]) -> anyhow::Result<i32> {
    let args: Args = crate::command::parse_args("sinfo", args)?;
    if args.version {
        println!("{}", crate::format::version_line());
        return Ok(0);
    }
    if args.usage {
        println!("{USAGE}");
        return Ok(0);
    }
    let _ = (args.hide, args.local, args.federation);
    let Some(options) = options(&args)? else { return Ok(1) };
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    loop {
        let mut out = String::new();
        if !args.noheader && (args.iterate.is_some() || args.verbose > 0 || args.long) {
            out.push_str(&crate::slurm::time::ctime(super::now_ms()));
            out.push('\n');
        }
        if args.reservations {
            let registry = rt.block_on(client.registry(false))?;
            out.push_str(&crate::slurm::reservations::sinfo_table(&registry, args.noheader));
        } else {
            let (nodes, config) = rt.block_on(client.nodes_and_config(false))?;
            out.push_str(&report(&options, &nodes, &config.unwrap_or_default()));
        }
        print!("{out}");
        match args.iterate {
            Some(secs) => {
                println!();
                std::thread::sleep(Duration::from_secs(secs.clamp(1, MAX_ITERATE_S)));
            }
            None => return Ok(0),
        }
    }
}

/// What to print, from the options (and `SINFO_*` variables). `None` when an error has been reported already.
fn options(args: &Args) -> anyhow::Result<Option<Options>> {
    if args.long && (args.format.is_some() || args.format_long.is_some()) {
        eprintln!(
            "sinfo: fatal: Options -o(--format) and -l(--long) are mutually exclusive. Please remove one and retry."
        );
        return Ok(None);
    }
    if args.all && args.partitions.is_some() {
        anyhow::bail!("Conflicting options, -a and -p, specified. Please choose one or the other.");
    }
    if args.iterate == Some(0) {
        anyhow::bail!("Error: invalid entry for --iterate=0");
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let pick = |short: &'static str, long: &'static str| if args.long { long } else { short };
    // The default layouts widen their node list and partition columns to fit (Slurm's field flags).
    let (format, long_form, auto) = match (&args.format_long, &args.format) {
        (Some(f), _) => (f.clone(), true, Auto::default()),
        (None, Some(f)) => (f.clone(), false, Auto::default()),
        (None, None) if args.summarize => (SUMMARY_FORMAT.to_string(), true, Auto { node: false, part: true }),
        (None, None) if args.node_oriented => {
            (pick(NODE_FORMAT, NODE_LONG).to_string(), true, Auto { node: true, part: true })
        }
        (None, None) if args.reasons => (pick(REASONS_FORMAT, REASONS_LONG).to_string(), true, Auto::default()),
        (None, None) => match env("SINFO_FORMAT") {
            Some(f) => (f, false, Auto::default()),
            None => (pick(DEFAULT_FORMAT, DEFAULT_LONG).to_string(), true, Auto { node: false, part: true }),
        },
    };
    if format.len() > MAX_FORMAT_BYTES {
        anyhow::bail!("the format is {} bytes, over the {MAX_FORMAT_BYTES}-byte limit", format.len());
    }
    let mut format = if long_form {
        let (format, invalid) = NodeFormat::long(&format);
        for name in invalid {
            // Slurm 22.05's wording, "job" and all.
            eprintln!("sinfo: error: Invalid job format specification: {name}");
        }
        format
    } else {
        let (format, invalid) = NodeFormat::short(&format);
        for code in invalid {
            eprintln!("Invalid node format specification: {code}");
        }
        format
    };
    format.auto = auto;
    let states = match args.states.as_deref() {
        Some(text) => match StateFilter::parse(text) {
            Ok(filter) => filter,
            Err(BadState(bad)) => {
                eprintln!("sinfo: error: Bad state string: \"{bad}\"");
                eprintln!("sinfo: error: valid states: {}", VALID_STATES.join(","));
                return Ok(None);
            }
        },
        None if args.reasons => StateFilter::parse(REASON_STATES).ok().flatten(),
        None => None,
    };
    let partitions = args.partitions.clone().or_else(|| if args.all { None } else { env("SINFO_PARTITION") });
    let nodes = match &args.nodes {
        Some(list) => Some(expand_hostlist(list).map_err(|_| anyhow::anyhow!("'{list}' invalid entry for --nodes"))?),
        None => None,
    };
    let sort = args.sort.clone().or_else(|| env("SINFO_SORT"));
    Ok(Some(Options {
        format,
        node_flag: args.node_oriented,
        list_reasons: args.reasons,
        exact: args.exact,
        noheader: args.noheader,
        convert: !args.noconvert,
        filter: Filter {
            partitions: partitions.map(|p| p.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()),
            nodes,
            states,
            dead: args.dead,
            responding: args.responding,
        },
        sort: sort.unwrap_or_else(|| if args.node_oriented { "N" } else { "#P,-t" }.to_string()),
    }))
}

/// Everything a report depends on besides the cluster's nodes and partitions.
struct Options {
    format: NodeFormat,
    /// `-N`: every node (and partition) on its own line.
    node_flag: bool,
    /// `-R`: lines ignore partitions; a node appears once.
    list_reasons: bool,
    /// `-e`: sizes (CPUs, memory, ...) must be equal to share a line, not only the shown text.
    exact: bool,
    noheader: bool,
    /// CPU counts with unit suffixes (`1K`), unless `--noconvert`.
    convert: bool,
    filter: Filter,
    /// Slurm's `-S` keys.
    sort: String,
}

/// Which nodes and partitions are reported.
#[derive(Default)]
struct Filter {
    partitions: Option<Vec<String>>,
    nodes: Option<Vec<String>>,
    states: Option<StateFilter>,
    dead: bool,
    responding: bool,
}

impl Filter {
    fn keeps(&self, node: &Node) -> bool {
        let state = NodeState::of(node);
        self.nodes.as_ref().is_none_or(|names| names.contains(&node.info.name))
            && (!self.dead || state.no_respond)
            && (!self.responding || !state.no_respond)
            && self.states.as_ref().is_none_or(|s| s.matches(node))
    }
}

/// Slurm's base node states (`NODE_STATE_*`), for the ones a Drover node can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Down = 1,
    Idle = 2,
    Allocated = 3,
    Mixed = 5,
}

/// A node's state as Slurm would hold it: a base state and the DRAIN and NO_RESPOND flags. A node Drover has
/// declared down is not responding, as `scontrol show node` says (`DOWN+NOT_RESPONDING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NodeState {
    base: Base,
    drain: bool,
    no_respond: bool,
    /// An up, undrained hot spare (Drover): idle ones print as `spare`, so the pool has its own line.
    spare: bool,
    /// `scontrol reboot` pending: Slurm's `@` suffix.
    reboot: bool,
}

impl NodeState {
    fn of(node: &Node) -> NodeState {
        let base = match node.state_name() {
            "DOWN" => Base::Down,
            "IDLE" | "DRAINED" => Base::Idle,
            "ALLOCATED" => Base::Allocated,
            "MIXED" => Base::Mixed,
            // Draining: what the node would be without the drain, by the state machine's own rule.
            _ => {
                let mut undrained = node.clone();
                undrained.drain = false;
                if undrained.state_name() == "ALLOCATED" { Base::Allocated } else { Base::Mixed }
            }
        };
        let spare = node.spare && !node.drain && node.health == NodeHealth::Up;
        let (drain, no_respond, reboot) = (node.drain, node.health == NodeHealth::Down, node.reboot.is_some());
        NodeState { base, drain, no_respond, spare, reboot }
    }

    /// Slurm's state word as a number (`node_state`), which `-S t` sorts by: the flags weigh most.
    fn bits(self) -> u32 {
        const DRAIN: u32 = 0x0200;
        const NO_RESPOND: u32 = 0x0800;
        self.base as u32 + if self.drain { DRAIN } else { 0 } + if self.no_respond { NO_RESPOND } else { 0 }
    }

    fn busy(self) -> bool {
        matches!(self.base, Base::Allocated | Base::Mixed)
    }

    /// `%t`: `idle`, `mix`, `alloc`, `down*`, `drain`, `drng`, ...
    fn compact(self) -> String {
        let word = match (self.drain, self.base) {
            (true, Base::Allocated | Base::Mixed) => "drng",
            (true, _) => "drain",
            (false, Base::Down) => "down",
            (false, Base::Idle) if self.spare => "spare",
            (false, Base::Idle) => "idle",
            (false, Base::Allocated) => "alloc",
            (false, Base::Mixed) => "mix",
        };
        format!("{word}{}{}", if self.no_respond { "*" } else { "" }, if self.reboot { "@" } else { "" })
    }

    /// `%T`: `idle`, `mixed`, `allocated`, `down*`, `drained`, `draining`, ...
    fn long(self) -> String {
        let word = match (self.drain, self.base) {
            (true, Base::Allocated | Base::Mixed) => "draining",
            (true, _) => "drained",
            (false, Base::Down) => "down",
            (false, Base::Idle) if self.spare => "spare",
            (false, Base::Idle) => "idle",
            (false, Base::Allocated) => "allocated",
            (false, Base::Mixed) => "mixed",
        };
        format!("{word}{}{}", if self.no_respond { "*" } else { "" }, if self.reboot { "@" } else { "" })
    }
}

/// One `-t` state (prefixes of Slurm's names match, as in Slurm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Base(Base),
    /// `alloc`: any node with allocated CPUs (mixed ones too).
    Allocated,
    Drain,
    Drained,
    Draining,
    NoRespond,
    /// Drover's hot spares (`-t spare`).
    Spare,
    /// A state Slurm knows and Drover's nodes are never in (`future`, `maint`, `powered_down`, ...).
    Never,
}

/// The states Slurm lists when `-t` names none it knows.
const VALID_STATES: &[&str] = &[
    "unknown",
    "down",
    "idle",
    "allocated",
    "error",
    "mixed",
    "future",
    "drain",
    "drained",
    "draining",
    "no_respond",
    "reserved",
    "perfctrs",
    "completing",
    "power_down",
    "power_up",
    "fail",
    "maint",
    "reboot",
    "spare",
];

/// `-t`: the states asked for, and whether a node must be in all of them (`&`) or any (`,`).
/// A node state word Slurm would not know (sinfo prints it with the valid ones).
#[derive(Debug, Clone, PartialEq, Eq)]
struct BadState(String);

#[derive(Debug, Clone, PartialEq, Eq)]
struct StateFilter {
    wanted: Vec<Wanted>,
    all_of: bool,
}

impl StateFilter {
    /// `None` for `all`; the first word Slurm would not know as the error.
    fn parse(text: &str) -> Result<Option<StateFilter>, BadState> {
        if text.eq_ignore_ascii_case("all") {
            return Ok(None);
        }
        let wanted = text
            .split([',', '&'])
            .filter(|w| !w.is_empty())
            .map(|w| Self::word(w).ok_or_else(|| BadState(w.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(StateFilter { wanted, all_of: text.contains('&') }))
    }

    /// Slurm's `_node_state_id`: the base states (long or compact name) first, then the flags, each matched by
    /// the user's text being a prefix of the name.
    fn word(word: &str) -> Option<Wanted> {
        const NAMES: &[(&[&str], Wanted)] = &[
            (&["UNKNOWN", "UNK"], Wanted::Never),
            (&["DOWN"], Wanted::Base(Base::Down)),
            (&["IDLE"], Wanted::Base(Base::Idle)),
            (&["ALLOCATED", "ALLOC"], Wanted::Allocated),
            (&["ERROR"], Wanted::Never),
            (&["MIXED", "MIX"], Wanted::Base(Base::Mixed)),
            (&["FUTURE", "FUTR"], Wanted::Never),
            (&["PLANNED", "PLND"], Wanted::Never),
            (&["DRAIN"], Wanted::Drain),
            (&["DRAINED"], Wanted::Drained),
            (&["RESV", "RESERVED"], Wanted::Never),
            (&["PERFCTRS", "NPC"], Wanted::Never),
            (&["DRAINING", "DRNG"], Wanted::Draining),
            (&["COMPLETING", "COMP"], Wanted::Never),
            (&["NO_RESPOND"], Wanted::NoRespond),
            (&["SPARE"], Wanted::Spare),
            (&["POWERING_DOWN", "POWRING_DN", "POWERED_DOWN", "POWERED_DN", "POWER_DOWN", "POW_DN"], Wanted::Never),
            (&["POWERING_UP", "POW_UP", "POWER_UP"], Wanted::Never),
            (&["FAIL"], Wanted::Never),
            (&["MAINT"], Wanted::Never),
            (&["REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT", "BOOT"], Wanted::Never),
            (&["CLOUD"], Wanted::Never),
        ];
        let upper = word.to_ascii_uppercase();
        NAMES.iter().find(|(names, _)| names.iter().any(|n| n.starts_with(&upper))).map(|(_, w)| *w)
    }

    fn matches(&self, node: &Node) -> bool {
        let state = NodeState::of(node);
        let hit = |w: &Wanted| match w {
            Wanted::Base(b) => state.base == *b,
            Wanted::Allocated => node.allocated_cpus > 0 || !node.allocated_gpus.is_empty(),
            Wanted::Drain => state.drain,
            Wanted::Draining => state.drain && state.busy(),
            Wanted::Drained => state.drain && !state.busy(),
            Wanted::NoRespond => state.no_respond,
            Wanted::Spare => state.spare,
            Wanted::Never => false,
        };
        if self.all_of { self.wanted.iter().all(hit) } else { self.wanted.iter().any(hit) }
    }
}

/// A column of sinfo's output: the `%` letter and `-O` name Slurm gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Avail,
    NodesAI,
    FeaturesAct,
    MaxCpusPerNode,
    Cpus,
    CpusState,
    Disk,
    Nodes,
    FreeMem,
    Reason,
    Features,
    NodesAIOT,
    Groups,
    Gres,
    Oversubscribe,
    Timestamp,
    PrioJobFactor,
    Time,
    DefaultTime,
    Memory,
    PreemptMode,
    Hostnames,
    NodeList,
    NodeAddr,
    CpuLoad,
    PriorityTier,
    Partition,
    Root,
    PartitionName,
    Size,
    AllocNodes,
    StateCompact,
    StateLong,
    User,
    UserLong,
    Version,
    Cluster,
    Weight,
    Sockets,
    Cores,
    Threads,
    Sct,
    AllocMem,
    Comment,
    Extra,
    GresUsed,
    Port,
    StateComplete,
}

/// Each field: its `-o` letter, its `-O` names and its header, as Slurm 22.05 has them.
const FIELDS: &[(Field, Option<char>, &[&str], &str)] = &[
    (Field::Avail, Some('a'), &["available"], "AVAIL"),
    (Field::NodesAI, Some('A'), &["nodeai"], "NODES(A/I)"),
    (Field::FeaturesAct, Some('b'), &["features_act"], "ACTIVE_FEATURES"),
    (Field::MaxCpusPerNode, Some('B'), &["maxcpuspernode"], "MAX_CPUS_PER_NODE"),
    (Field::Cpus, Some('c'), &["cpus"], "CPUS"),
    (Field::CpusState, Some('C'), &["cpusstate"], "CPUS(A/I/O/T)"),
    (Field::Disk, Some('d'), &["disk"], "TMP_DISK"),
    (Field::Nodes, Some('D'), &["nodes"], "NODES"),
    (Field::FreeMem, Some('e'), &["freemem"], "FREE_MEM"),
    (Field::Reason, Some('E'), &["reason"], "REASON"),
    (Field::Features, Some('f'), &["features"], "AVAIL_FEATURES"),
    (Field::NodesAIOT, Some('F'), &["nodeaiot"], "NODES(A/I/O/T)"),
    (Field::Groups, Some('g'), &["groups"], "GROUPS"),
    (Field::Gres, Some('G'), &["gres"], "GRES"),
    (Field::Oversubscribe, Some('h'), &["oversubscribe", "share"], "OVERSUBSCRIBE"),
    (Field::Timestamp, Some('H'), &["timestamp"], "TIMESTAMP"),
    (Field::PrioJobFactor, Some('I'), &["priorityjobfactor"], "PRIO_JOB_FACTOR"),
    (Field::Time, Some('l'), &["time"], "TIMELIMIT"),
    (Field::DefaultTime, Some('L'), &["defaulttime"], "DEFAULTTIME"),
    (Field::Memory, Some('m'), &["memory"], "MEMORY"),
    (Field::PreemptMode, Some('M'), &["preemptmode"], "PREEMPT_MODE"),
    (Field::Hostnames, Some('n'), &["nodehost"], "HOSTNAMES"),
    (Field::NodeList, Some('N'), &["nodelist"], "NODELIST"),
    (Field::NodeAddr, Some('o'), &["nodeaddr"], "NODE_ADDR"),
    (Field::CpuLoad, Some('O'), &["cpusload"], "CPU_LOAD"),
    (Field::PriorityTier, Some('p'), &["prioritytier"], "PRIO_TIER"),
    (Field::Partition, Some('P'), &["partition"], "PARTITION"),
    (Field::Root, Some('r'), &["root"], "ROOT"),
    (Field::PartitionName, Some('R'), &["partitionname"], "PARTITION"),
    (Field::Size, Some('s'), &["size"], "JOB_SIZE"),
    (Field::AllocNodes, Some('S'), &["allocnodes"], "ALLOCNODES"),
    (Field::StateCompact, Some('t'), &["statecompact"], "STATE"),
    (Field::StateLong, Some('T'), &["statelong"], "STATE"),
    (Field::User, Some('u'), &["user"], "USER"),
    (Field::UserLong, Some('U'), &["userlong"], "USER"),
    (Field::Version, Some('v'), &["version"], "VERSION"),
    (Field::Cluster, Some('V'), &["cluster"], "CLUSTER"),
    (Field::Weight, Some('w'), &["weight"], "WEIGHT"),
    (Field::Sockets, Some('X'), &["sockets"], "SOCKETS"),
    (Field::Cores, Some('Y'), &["cores"], "CORES"),
    (Field::Threads, Some('Z'), &["threads"], "THREADS"),
    (Field::Sct, Some('z'), &["socketcorethread"], "S:C:T"),
    (Field::AllocMem, None, &["allocmem"], "ALLOCMEM"),
    (Field::Comment, None, &["comment"], "COMMENT"),
    (Field::Extra, None, &["extra"], "EXTRA"),
    (Field::GresUsed, None, &["gresused"], "GRES_USED"),
    (Field::Port, None, &["port"], "PORT"),
    (Field::StateComplete, None, &["statecomplete"], "STATECOMPLETE"),
];

impl Field {
    fn from_code(code: char) -> Option<Field> {
        FIELDS.iter().find(|(_, c, _, _)| *c == Some(code)).map(|(f, ..)| *f)
    }

    fn from_name(name: &str) -> Option<Field> {
        FIELDS.iter().find(|(_, _, names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name))).map(|(f, ..)| *f)
    }

    fn header(self) -> &'static str {
        FIELDS.iter().find(|(f, ..)| *f == self).map(|(.., h)| *h).expect("every field has a row")
    }

    /// The node list columns (and their headers) are never cut; every other header and value is.
    fn cuts_header(self) -> bool {
        !matches!(self, Field::NodeList | Field::Hostnames | Field::NodeAddr)
    }

    /// What partitions must agree on to share a line when this field is shown (Slurm's partition match flags).
    fn partition_key(self, p: &Partition) -> Option<String> {
        match self {
            Field::Partition | Field::PartitionName => Some(p.name.clone()),
            Field::Avail => Some(p.state.name().to_string()),
            Field::Time => Some(format!("{:?}", p.max_time_s)),
            Field::DefaultTime => Some(format!("{:?}", p.default_time_s)),
            Field::Size => Some(format!("{:?}", p.max_nodes)),
            Field::PreemptMode => Some(p.preempt_mode.name().to_string()),
            Field::PriorityTier => Some(p.priority_tier.to_string()),
            _ => None,
        }
    }

    /// What nodes must agree on to share a line when this field is shown (Slurm's node match flags; the sizes
    /// only with `-e`).
    fn node_key(self, node: &Node, exact: bool) -> Option<String> {
        let info = &node.info;
        match self {
            // A node's own name or address: never shared, so each node gets a line.
            Field::Hostnames | Field::NodeAddr => Some(info.name.clone()),
            Field::Features | Field::FeaturesAct => Some(features(node)),
            Field::Gres => Some(node_gres(node)),
            Field::GresUsed => Some(node_gres_used(node)),
            Field::Reason => Some(node.reason.clone()),
            Field::Timestamp => Some(reason_time(node).to_string()),
            Field::User | Field::UserLong => Some(reason_user(node).to_string()),
            Field::StateCompact | Field::StateLong => Some(NodeState::of(node).long()),
            Field::StateComplete => Some(node_state(node)),
            Field::AllocMem => Some(node.allocated_mem_mb.to_string()),
            _ if !exact => None,
            Field::Cpus | Field::CpusState => Some(info.cpus.to_string()),
            Field::Memory => Some(info.memory_mb.to_string()),
            Field::FreeMem => Some(node.free_mem_mb().to_string()),
            Field::Port => Some(port(node)),
            Field::Version => Some(info.version.clone()),
            _ => None,
        }
    }
}

/// Which columns the default layouts widen to their longest value (the node list, the partition).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Auto {
    node: bool,
    part: bool,
}

/// A parsed output format.
#[derive(Debug, Clone, PartialEq)]
struct NodeFormat {
    items: Vec<Item<Field>>,
    auto: Auto,
}

impl NodeFormat {
    /// A `-o` format: `%[.][WIDTH]X` fields between literal text (`.` right-justifies; `%-10P`, which Slurm
    /// would refuse, is read as left-justified, as Drover's squeue reads it). `%all` is every field, `|`-separated.
    /// Unknown letters stay in the output as text and come back in the second value for Slurm's error line.
    fn short(format: &str) -> (NodeFormat, Vec<String>) {
        let everything = format.eq_ignore_ascii_case("%all");
        let expanded;
        let format = if everything {
            let lower = ('b'..='z').map(|c| format!("|%{c}"));
            let upper = ('A'..='Z').map(|c| format!("|%{c} "));
            expanded = std::iter::once("%a".to_string()).chain(lower).chain(upper).collect::<String>();
            expanded.as_str()
        } else {
            format
        };
        let (items, invalid) = crate::format::parse_percent_format(format, Field::from_code, everything);
        (NodeFormat { items, auto: Auto::default() }, invalid)
    }

    /// A `-O` format: comma-separated `Name[:[.]WIDTH[SUFFIX]]` (width 20 when no `:` is given; 0: as wide as
    /// the value). Unknown names print nothing (but their suffix) and come back in the second value.
    fn long(format: &str) -> (NodeFormat, Vec<String>) {
        let mut items = Vec::new();
        let mut invalid = Vec::new();
        for token in format.split(',').filter(|t| !t.is_empty()) {
            let (name, width, right, suffix) = crate::format::parse_long_token(token);
            if name.eq_ignore_ascii_case("all") {
                items.extend(NodeFormat::short("%all").0.items);
            } else {
                match Field::from_name(name) {
                    Some(field) => items.push(Item::Field { field, width, right }),
                    None => invalid.push(name.to_string()),
                }
            }
            if !suffix.is_empty() {
                items.push(Item::Text(suffix.to_string()));
            }
        }
        (NodeFormat { items, auto: Auto::default() }, invalid)
    }

    fn fields(&self) -> impl Iterator<Item = Field> + '_ {
        self.items.iter().filter_map(|i| match i {
            Item::Field { field, .. } => Some(*field),
            Item::Text(_) => None,
        })
    }

    /// The header line, or a row's line (`None`: the header).
    fn line(&self, row: Option<&Row>, cx: &Context) -> String {
        let mut out = String::new();
        for item in &self.items {
            match item {
                Item::Text(t) => out.push_str(t),
                Item::Field { field, width, right } => {
                    let width = match field {
                        Field::NodeList | Field::Hostnames if self.auto.node => cx.node_width,
                        Field::Partition | Field::PartitionName if self.auto.part => cx.part_width,
                        _ => *width,
                    };
                    match row {
                        None => out.push_str(&pad(field.header(), width, *right, field.cuts_header())),
                        Some(row) => out.push_str(&pad(&value(*field, row, width, cx), width, *right, true)),
                    }
                }
            }
        }
        out.push('\n');
        out
    }
}

/// One line of output: nodes of one partition (for `-R`, of any) that print alike.
struct Row<'a> {
    /// Index into the configured partitions.
    part: usize,
    nodes: Vec<&'a Node>,
}

/// What rendering a row needs besides the row.
struct Context<'a> {
    partitions: &'a [Partition],
    cluster_name: &'a str,
    convert: bool,
    /// The widths the default layouts give the node list and partition columns.
    node_width: usize,
    part_width: usize,
}

/// The report: the header and a line per row, grouped and sorted as Slurm 22.05's sinfo does.
fn report(options: &Options, nodes: &[Node], config: &ClusterConfig) -> String {
    // Membership is the state machine's rule, evaluated over a state holding just these nodes.
    let mut state = State::default();
    state.meta.config = Some(config.clone());
    let mut nodes: Vec<&Node> = nodes.iter().filter(|n| options.filter.keeps(n)).collect();
    nodes.sort_by(|a, b| host_order(&a.info.name, &b.info.name));
    let shown = |p: &Partition| options.filter.partitions.as_ref().is_none_or(|names| names.contains(&p.name));
    let fields: Vec<Field> = options.format.fields().collect();
    let partition_shown = fields.iter().any(|f| matches!(f, Field::Partition | Field::PartitionName));
    let mut rows: Vec<Row> = Vec::new();
    // Every partition has a line, even with no node to show, when partitions are what lines are about.
    if !options.node_flag && partition_shown {
        rows.extend(
            config.partitions.iter().enumerate().filter(|(_, p)| shown(p)).map(|(i, _)| Row { part: i, nodes: vec![] }),
        );
    }
    for (index, partition) in config.partitions.iter().enumerate().filter(|(_, p)| shown(p)) {
        for node in nodes.iter().copied().filter(|n| state.node_in_partition(&n.info, &partition.name)) {
            insert(&mut rows, index, node, options, &fields, &config.partitions);
        }
    }
    let cx = Context {
        partitions: &config.partitions,
        cluster_name: &config.cluster_name,
        convert: options.convert,
        node_width: rows.iter().map(|r| node_list(&r.nodes).chars().count()).max().unwrap_or(0).max(MIN_AUTO_WIDTH),
        part_width: rows
            .iter()
            .map(|r| &config.partitions[r.part])
            .map(|p| p.name.chars().count() + usize::from(p.default))
            .max()
            .unwrap_or(0)
            .max(MIN_AUTO_WIDTH),
    };
    sort_rows(&mut rows, &options.sort, &cx);
    let mut out = String::new();
    if !options.noheader {
        out.push_str(&options.format.line(None, &cx));
    }
    for row in &rows {
        out.push_str(&options.format.line(Some(row), &cx));
    }
    out
}

/// Adds `node` of partition `part` to the first line it belongs on, or starts a line (Slurm's
/// `_insert_node_ptr`).
fn insert<'a>(
    rows: &mut Vec<Row<'a>>,
    part: usize,
    node: &'a Node,
    options: &Options,
    fields: &[Field],
    partitions: &[Partition],
) {
    let same_partition = |row: &Row| {
        options.list_reasons
            || row.part == part
            || fields.iter().all(|f| f.partition_key(&partitions[row.part]) == f.partition_key(&partitions[part]))
    };
    let same_node = |row: &Row| {
        !options.node_flag
            && fields.iter().all(|f| f.node_key(row.nodes[0], options.exact) == f.node_key(node, options.exact))
    };
    match rows.iter_mut().find(|row| same_partition(row) && (row.nodes.is_empty() || same_node(row))) {
        // A node already on the line (it is in several partitions that print alike) is shown once.
        Some(row) if row.nodes.iter().any(|n| n.info.name == node.info.name) => {}
        Some(row) => row.nodes.push(node),
        None => rows.push(Row { part, nodes: vec![node] }),
    }
}

/// Slurm's `-S`: keys applied from the last to the first, each a stable sort; `-` reverses a key and `#P` sorts
/// partitions in their configured order rather than by name.
fn sort_rows(rows: &mut [Row], keys: &str, cx: &Context) {
    let keys: Vec<char> = keys.chars().collect();
    for i in (0..keys.len()).rev() {
        let key = keys[i];
        if matches!(key, ',' | '#' | '+' | '-') {
            continue;
        }
        let reverse = i > 0 && keys[i - 1] == '-';
        let part_order = i > 0 && keys[i - 1] == '#';
        rows.sort_by(|a, b| {
            let order = compare(key, a, b, part_order, cx);
            if reverse { order.reverse() } else { order }
        });
    }
}

fn compare(key: char, a: &Row, b: &Row, part_order: bool, cx: &Context) -> Ordering {
    let (pa, pb) = (&cx.partitions[a.part], &cx.partitions[b.part]);
    let first = |row: &Row| row.nodes.first().map(|n| n.info.name.clone()).unwrap_or_default();
    let state = |row: &Row| row.nodes.first().map_or(0, |n| NodeState::of(n).bits());
    let min = |row: &Row, f: fn(&Node) -> u64| row.nodes.iter().map(|n| f(n)).min().unwrap_or(0);
    match key {
        'P' | 'R' if part_order => a.part.cmp(&b.part),
        'P' | 'R' => pa.name.cmp(&pb.name),
        't' | 'T' => state(a).cmp(&state(b)),
        'N' | 'n' | 'o' => host_order(&first(a), &first(b)),
        'D' => a.nodes.len().cmp(&b.nodes.len()),
        'A' | 'F' => counts(a).alloc.cmp(&counts(b).alloc),
        'a' => avail_rank(pa.state).cmp(&avail_rank(pb.state)),
        'c' => min(a, |n| u64::from(n.info.cpus)).cmp(&min(b, |n| u64::from(n.info.cpus))),
        'm' => min(a, |n| n.info.memory_mb).cmp(&min(b, |n| n.info.memory_mb)),
        'e' => min(a, Node::free_mem_mb).cmp(&min(b, Node::free_mem_mb)),
        'E' => reason(a).cmp(&reason(b)),
        'H' => a.nodes.first().map(|n| reason_time(n)).cmp(&b.nodes.first().map(|n| reason_time(n))),
        'f' | 'b' => a.nodes.first().map(|n| features(n)).cmp(&b.nodes.first().map(|n| features(n))),
        'l' => pa.max_time_s.unwrap_or(u64::MAX).cmp(&pb.max_time_s.unwrap_or(u64::MAX)),
        'p' => pa.priority_tier.cmp(&pb.priority_tier),
        's' => pa.max_nodes.unwrap_or(u32::MAX).cmp(&pb.max_nodes.unwrap_or(u32::MAX)),
        'M' => pa.preempt_mode.name().cmp(pb.preempt_mode.name()),
        // Keys of values every Drover node shares (weight, sockets, ...) leave the order as it is.
        _ => Ordering::Equal,
    }
}

/// Slurm's `PARTITION_*` values, in the order `-S a` sorts them.
fn avail_rank(state: PartitionState) -> u8 {
    match state {
        PartitionState::Inactive => 0,
        PartitionState::Down => 1,
        PartitionState::Drain => 2,
        PartitionState::Up => 3,
    }
}

/// Host names in hostlist order: by prefix, then by the number at the end (`node2` before `node10`).
fn host_order(a: &str, b: &str) -> Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = s.split_at(s.len() - digits);
        (prefix.to_string(), number.parse::<u128>().ok(), s.to_string())
    };
    split(a).cmp(&split(b))
}

/// Node counts of a line: allocated (or mixed, or draining with jobs), idle, other (down or drained), total.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    alloc: u64,
    idle: u64,
    other: u64,
    total: u64,
}

fn counts(row: &Row) -> Counts {
    let mut c = Counts::default();
    for node in &row.nodes {
        let state = NodeState::of(node);
        if state.busy() {
            c.alloc += 1;
        } else if state.drain || state.base == Base::Down {
            c.other += 1;
        } else {
            c.idle += 1;
        }
        c.total += 1;
    }
    c
}

/// CPU counts of a line, the same way: allocated, idle, other (on down or drained nodes), total.
fn cpu_counts(row: &Row) -> Counts {
    let mut c = Counts::default();
    for node in &row.nodes {
        let state = NodeState::of(node);
        let total = u64::from(node.info.cpus);
        let used = u64::from(node.allocated_cpus).min(total);
        c.alloc += used;
        c.total += total;
        if state.drain || state.base == Base::Down {
            c.other += total - used;
        } else {
            c.idle += total - used;
        }
    }
    c
}

fn node_list(nodes: &[&Node]) -> String {
    let names: Vec<String> = nodes.iter().map(|n| n.info.name.clone()).collect();
    compress_hostlist(&names)
}

fn features(node: &Node) -> String {
    if node.info.features.is_empty() { "(null)".to_string() } else { node.info.features.join(",") }
}

fn reason(row: &Row) -> String {
    row.nodes.first().map(|n| n.reason.clone()).unwrap_or_default()
}

/// When the reason was set (the node's current state began then); 0 without a reason.
fn reason_time(node: &Node) -> u64 {
    if node.reason.is_empty() { 0 } else { node.since_ms }
}

/// Who set the reason. Drover does not record it; drains are an administrator's, as `scontrol show node` says.
fn reason_user(node: &Node) -> &'static str {
    if node.reason.is_empty() { "Unknown" } else { "root" }
}

/// The agent's port (Slurm's slurmd `Port`).
fn port(node: &Node) -> String {
    node.info.agent_addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).unwrap_or(0).to_string()
}

/// Slurm's min/max strings: `64`, `32+` (not a range), or `32-64` (a range).
fn min_max(values: impl Iterator<Item = u64>, range: bool, show: impl Fn(u64) -> String) -> String {
    let values: Vec<u64> = values.collect();
    let (min, max) = (values.iter().copied().min().unwrap_or(0), values.iter().copied().max().unwrap_or(0));
    match () {
        () if min == max => show(max),
        () if range => format!("{}-{}", show(min), show(max)),
        () => format!("{}+", show(min)),
    }
}

/// A field's text for one line (before padding to `width`, which only the partition's `*` looks at).
fn value(field: Field, row: &Row, width: usize, cx: &Context) -> String {
    let p = &cx.partitions[row.part];
    let first = row.nodes.first().copied();
    let cpus = |v: u64| if cx.convert { convert_num_unit(v, 0) } else { v.to_string() };
    let of_first = |f: fn(&Node) -> String, none: &str| first.map_or_else(|| none.to_string(), f);
    match field {
        Field::Avail => p.state.name().to_ascii_lowercase(),
        Field::NodesAI => {
            let c = counts(row);
            format!("{}/{}", c.alloc, c.idle)
        }
        Field::NodesAIOT => {
            let c = counts(row);
            format!("{}/{}/{}/{}", c.alloc, c.idle, c.other, c.total)
        }
        Field::CpusState => {
            let c = cpu_counts(row);
            format!("{}/{}/{}/{}", c.alloc, c.idle, c.other, c.total)
        }
        Field::Features | Field::FeaturesAct => of_first(features, "(null)"),
        Field::MaxCpusPerNode => "UNLIMITED".to_string(),
        Field::Cpus => min_max(row.nodes.iter().map(|n| u64::from(n.info.cpus)), false, cpus),
        Field::Disk => "0".to_string(),
        Field::Nodes => row.nodes.len().to_string(),
        // Memory no job holds (Drover does not sample the OS's free memory), as scontrol's FreeMem.
        Field::FreeMem => min_max(row.nodes.iter().map(|n| n.free_mem_mb()), true, |v| v.to_string()),
        Field::Memory => min_max(row.nodes.iter().map(|n| n.info.memory_mb), false, |v| v.to_string()),
        Field::AllocMem => row.nodes.last().map_or(0, |n| n.allocated_mem_mb).to_string(),
        Field::Reason => first.map(|n| n.reason.as_str()).filter(|r| !r.is_empty()).unwrap_or("none").to_string(),
        Field::Groups | Field::AllocNodes => "all".to_string(),
        Field::Gres => of_first(node_gres, "(null)"),
        Field::GresUsed => of_first(node_gres_used, "(null)"),
        Field::Oversubscribe => "NO".to_string(),
        Field::Timestamp => match first.map(reason_time) {
            Some(ms) if ms > 0 => format_timestamp(Some(ms)),
            _ => "Unknown".to_string(),
        },
        Field::PrioJobFactor => "1".to_string(),
        Field::Time => p.max_time_s.map_or_else(|| "infinite".to_string(), format_duration),
        Field::DefaultTime => p.default_time_s.map_or_else(|| "n/a".to_string(), format_duration),
        Field::PreemptMode => p.preempt_mode.name().to_string(),
        Field::Hostnames | Field::NodeList => node_list(&row.nodes),
        Field::NodeAddr => {
            let hosts: Vec<String> = row.nodes.iter().map(|n| n.info.host.clone()).collect();
            compress_hostlist(&hosts)
        }
        Field::CpuLoad => "N/A".to_string(),
        Field::PriorityTier => p.priority_tier.to_string(),
        Field::Partition => {
            let mut name = p.name.clone();
            if p.default {
                // Slurm marks the default partition, overwriting the last character when the name fills the width.
                if width == 0 || name.chars().count() < width {
                    name.push('*');
                } else {
                    name = name.chars().take(width - 1).chain(std::iter::once('*')).collect();
                }
            }
            name
        }
        Field::PartitionName => p.name.clone(),
        Field::Root => "no".to_string(),
        Field::Size => match p.max_nodes {
            Some(1) => "1".to_string(),
            Some(max) => format!("1-{}", convert_num_unit(u64::from(max), 0)),
            None => "1-infinite".to_string(),
        },
        Field::StateCompact => first.map_or_else(|| "n/a".to_string(), |n| NodeState::of(n).compact()),
        Field::StateLong => first.map_or_else(|| "n/a".to_string(), |n| NodeState::of(n).long()),
        Field::StateComplete => first.map_or_else(|| "n/a".to_string(), |n| node_state(n).to_ascii_lowercase()),
        Field::User => first.map_or("Unknown", reason_user).to_string(),
        Field::UserLong => match first.map(reason_user) {
            Some("root") => "root(0)".to_string(),
            _ => "Unknown".to_string(),
        },
        Field::Version => first.map(|n| n.info.version.clone()).filter(|v| !v.is_empty()).unwrap_or("N/A".into()),
        Field::Cluster => if cx.cluster_name.is_empty() { "N/A" } else { cx.cluster_name }.to_string(),
        Field::Weight | Field::Sockets | Field::Cores | Field::Threads => "1".to_string(),
        Field::Sct => "1:1:1".to_string(),
        Field::Comment | Field::Extra => "(null)".to_string(),
        Field::Port => of_first(port, "0"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use drover_state::{GpuInfo, NodeInfo};

    use super::*;

    fn node(name: &str, gpus: u32) -> Node {
        let info = NodeInfo {
            name: name.into(),
            agent_addr: "127.0.0.1:7100".into(),
            host: "127.0.0.1".into(),
            cpus: 64,
            memory_mb: 512_000,
            gpus: (0..gpus).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
            gpu_type: "h200".into(),
            partitions: vec![],
            features: vec![],
            topology: BTreeMap::new(),
            version: "0.1.0".into(),
            spare: false,
        };
        Node::new(info, 1_700_000_000_000)
    }

    /// A job holding `gpus` GPUs and 8 CPUs on `n`.
    fn busy(mut n: Node, gpus: u32) -> Node {
        n.jobs = BTreeSet::from([7]);
        n.allocated_cpus = 8;
        n.allocated_mem_mb = 64_000;
        n.allocated_gpus = (0..gpus).map(|g| (g, 7)).collect();
        n
    }

    fn drained(mut n: Node, reason: &str) -> Node {
        n.drain = true;
        n.reason = reason.into();
        n
    }

    /// gpu (default, 1 day, every node) and debug (10 minutes, gpu04 only).
    fn config() -> ClusterConfig {
        let gpu = Partition { max_time_s: Some(86_400), ..Partition::fallback() };
        let debug = Partition {
            name: "debug".into(),
            default: false,
            nodes: "gpu04".into(),
            max_time_s: Some(600),
            ..Partition::fallback()
        };
        ClusterConfig { cluster_name: "test".into(), partitions: vec![gpu, debug], ..ClusterConfig::default() }
    }

    fn cluster() -> Vec<Node> {
        vec![
            busy(node("gpu01", 8), 8),
            busy(node("gpu02", 8), 2),
            node("gpu03", 8),
            drained(node("gpu04", 8), "bad fan"),
        ]
    }

    /// `sinfo ARGS` against `nodes`, as its report would print (no controller involved).
    fn sinfo(args: &[&str], nodes: &[Node]) -> String {
        let args = Args::try_parse_from(std::iter::once("sinfo").chain(args.iter().copied())).unwrap();
        let options = options(&args).unwrap().expect("valid options");
        report(&options, nodes, &config())
    }

    #[test]
    fn the_default_layout_has_a_line_per_partition_and_state_with_the_default_partition_starred() {
        let out = sinfo(&[], &cluster());
        assert_eq!(
            out,
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
             gpu*         up 1-00:00:00      1  drain gpu04\n\
             gpu*         up 1-00:00:00      1    mix gpu02\n\
             gpu*         up 1-00:00:00      1  alloc gpu01\n\
             gpu*         up 1-00:00:00      1   idle gpu03\n\
             debug        up      10:00      1  drain gpu04\n"
        );
    }

    #[test]
    fn nodes_alike_share_a_line_and_a_partition_without_nodes_to_show_still_gets_one() {
        let nodes = vec![node("gpu01", 8), node("gpu02", 8), node("gpu03", 8), drained(node("gpu04", 8), "x")];
        let out = sinfo(&["-h", "-t", "idle", "-o", "%P %D %t %N"], &nodes);
        // Slurm counts a drained idle node as idle; debug's only node is that one.
        assert_eq!(out, "gpu* 1 drain gpu04\ngpu* 3 idle gpu[01-03]\ndebug 1 drain gpu04\n");
        let out = sinfo(&["-h", "-t", "mix", "-o", "%P %D %t %N"], &nodes);
        assert_eq!(out, "gpu* 0 n/a \ndebug 0 n/a \n");
    }

    #[test]
    fn node_oriented_lines_widen_the_node_and_partition_columns() {
        let out = sinfo(&["-N"], &cluster());
        assert_eq!(
            out,
            "NODELIST   NODES PARTITION STATE \n\
             gpu01          1      gpu* alloc \n\
             gpu02          1      gpu* mix   \n\
             gpu03          1      gpu* idle  \n\
             gpu04          1      gpu* drain \n\
             gpu04          1     debug drain \n"
        );
        assert_eq!(
            sinfo(&["-N", "-h", "-o", "%N %t", "-p", "gpu"], &cluster()),
            "gpu01 alloc\ngpu02 mix\ngpu03 idle\ngpu04 drain\n"
        );
    }

    #[test]
    fn list_reasons_shows_each_down_or_drained_node_once_with_its_reason() {
        let mut nodes = cluster();
        nodes.push({
            let mut n = node("gpu05", 8);
            n.health = NodeHealth::Down;
            n.reason = "Not responding".into();
            n
        });
        let out = sinfo(&["-R"], &nodes);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "REASON               USER      TIMESTAMP           NODELIST");
        assert_eq!(lines.len(), 3, "{out}");
        // Down (not responding) sorts before drained, as Slurm's state numbers do.
        assert!(lines[1].starts_with("Not responding       root      20") && lines[1].ends_with(" gpu05"), "{out}");
        assert!(lines[2].starts_with("bad fan              root      20") && lines[2].ends_with(" gpu04"), "{out}");
        // Long reasons are cut to the column, as in Slurm; %E alone prints them whole.
        let long = vec![drained(node("gpu01", 8), "config expects 8 GPUs but found 4")];
        assert!(sinfo(&["-R", "-h"], &long).starts_with("config expects 8 GPU root"));
        assert_eq!(sinfo(&["-R", "-h", "-o", "%E|%N"], &long), "config expects 8 GPUs but found 4|gpu01\n");
        assert_eq!(sinfo(&["-N", "-h", "-o", "%N %t", "-t", "down"], &nodes), "gpu05 down*\n");
    }

    #[test]
    fn summarize_counts_allocated_idle_other_and_total_per_partition() {
        let out = sinfo(&["-s"], &cluster());
        assert_eq!(
            out,
            "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST\n\
             gpu*         up 1-00:00:00          2/1/1/4 gpu[01-04]\n\
             debug        up      10:00          0/0/1/1 gpu04\n"
        );
    }

    #[test]
    fn format_widths_justify_and_cut_as_slurms_print_str() {
        let out =
            sinfo(&["-h", "-p", "gpu", "-o", "%-10P|%.5D|%3t|%c|%G|%m|%e|%C"], &[node("gpu01", 8), node("gpu02", 8)]);
        assert_eq!(out, "gpu*      |    2|idl|64|gpu:h200:8|512000|512000|0/128/0/128\n");
        let out = sinfo(&["-o", "%9P %.5a %l"], &[]);
        assert_eq!(out, "PARTITION AVAIL TIMELIMIT\ngpu*         up 1-00:00:00\ndebug        up 10:00\n");
        let out = sinfo(&["-h", "-o", "%4P"], &[]);
        assert_eq!(out, "gpu*\ndebu\n", "a name as wide as the column is cut");
    }

    #[test]
    fn long_formats_take_names_widths_and_suffixes() {
        let nodes = vec![busy(node("gpu01", 8), 2), node("gpu02", 8)];
        let out = sinfo(
            &[
                "-N",
                "-p",
                "gpu",
                "-O",
                "NodeList:8,StateLong:.10 ,Gres:12,GresUsed:22,CPUsState:14,Memory:8,AllocMem:7,FreeMem:7,Partition",
            ],
            &nodes,
        );
        assert_eq!(
            out,
            "NODELIST     STATE GRES        GRES_USED             CPUS(A/I/O/T) MEMORY  ALLOCMEFREE_MEPARTITION           \n\
             gpu01        mixed gpu:h200:8  gpu:h200:2(IDX:0-1)   8/56/0/64     512000  64000  448000 gpu*                \n\
             gpu02         idle gpu:h200:8  gpu:h200:0(IDX:N/A)   0/64/0/64     512000  0      512000 gpu*                \n"
        );
    }

    #[test]
    fn unknown_fields_and_states_are_reported() {
        let (format, invalid) = NodeFormat::short("%P %! %N");
        assert_eq!(invalid, ["!"]);
        assert_eq!(format.items[1], Item::Text(" %! ".into()));
        let (_, invalid) = NodeFormat::long("NodeList,StatePrecise,Gres");
        assert_eq!(invalid, ["StatePrecise"]);
        assert_eq!(StateFilter::parse("idle,bogus"), Err(BadState("bogus".to_string())));
        assert_eq!(StateFilter::parse("ALL"), Ok(None));
        let drng = StateFilter::parse("drng&mix").unwrap().unwrap();
        assert!(drng.all_of);
        let mut n = busy(node("gpu01", 8), 2);
        assert!(!drng.matches(&n));
        n.drain = true;
        assert!(drng.matches(&n));
        assert_eq!(NodeState::of(&n).compact(), "drng");
        assert_eq!(NodeState::of(&n).long(), "draining");
    }

    #[test]
    fn an_idle_hot_spare_has_its_own_state_word() {
        let mut n = node("gpu01", 8);
        n.spare = true;
        assert_eq!((NodeState::of(&n).compact(), NodeState::of(&n).long()), ("spare".into(), "spare".into()));
        let spares = StateFilter::parse("spare").unwrap().unwrap();
        assert!(spares.matches(&n));
        // Drained, a spare is not usable: it shows as drained, like any node.
        n.drain = true;
        assert_eq!(NodeState::of(&n).long(), "drained");
        assert!(!spares.matches(&n));
        n.drain = false;
        n.spare = false;
        assert_eq!(NodeState::of(&n).long(), "idle");
    }

    #[test]
    fn exact_matching_splits_lines_by_size() {
        let mut small = node("gpu02", 8);
        small.info.cpus = 32;
        let nodes = vec![node("gpu01", 8), small];
        assert_eq!(sinfo(&["-h", "-p", "gpu", "-o", "%D %c %N"], &nodes), "2 32+ gpu[01-02]\n");
        assert_eq!(sinfo(&["-h", "-e", "-p", "gpu", "-o", "%D %c %N"], &nodes), "1 64 gpu01\n1 32 gpu02\n");
    }

    #[test]
    fn sort_keys_reorder_lines() {
        assert_eq!(
            sinfo(&["-h", "-N", "-o", "%N", "-p", "gpu", "-S", "-N"], &cluster()),
            "gpu04\ngpu03\ngpu02\ngpu01\n"
        );
        assert_eq!(sinfo(&["-h", "-o", "%P", "-S", "P"], &cluster()).lines().next(), Some("debug"));
        assert_eq!(host_order("node2", "node10"), Ordering::Less);
    }
}
