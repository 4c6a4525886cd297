//! `sbatch`'s command line and `#SBATCH` directives, turned into a [`JobSpec`].
//!
//! Pure: no I/O, no environment reads, no clock. Submission happens in two steps, because the script file can
//! only be read once its path is known:
//!
//! 1. [`parse_command_line`] parses the arguments (without `argv[0]`) into a [`CommandLine`]: the options, checked
//!    and in order, then the script path and the script's own arguments. As with Slurm, option parsing stops at
//!    the first non-option argument (the script); everything after it belongs to the script.
//! 2. The caller reads the script (from the path, or stdin when there is none), then [`build_spec`] applies the
//!    script's `#SBATCH` directives first and the command-line options after them, so the command line wins.
//!
//! Options are matched as `getopt_long` does: `--name=value` or `--name value`, `-Xvalue` or `-X value`, value-less
//! short flags may be bundled (`-HJname`), `--` ends the options. Long names must be spelled out in full (no
//! abbreviations). Supported: `--job-name/-J`, `--partition/-p`, `--account/-A`, `--nodes/-N` (`N` or `MIN-MAX`),
//! `--ntasks/-n`, `--ntasks-per-node`, `--cpus-per-task/-c`, `--gres` (`gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N`,
//! `none`), `--gpus-per-node` (`N` or `TYPE:N`), `--gpus/-G` (`N` or `TYPE:N`, the job's total), `--gpus-per-task`
//! (`N` or `TYPE:N`), `--time/-t`, `--output/-o`, `--error/-e`, `--chdir/-D`, `--export`, `--open-mode`,
//! `--exclusive`, `--constraint/-C`, `--nodelist/-w`, `--exclude/-x`, `--array/-a` (`0-15`, `0,6,16-32`, `0-15:4`,
//! with an optional `%N` limit), `--dependency/-d` (`afterok:12:13`, `afterany:5_3`, `after`, `afternotok`,
//! `singleton`; joined by `,` or `?`), `--qos/-q`, `--reservation`, `--nice[=N]`, `--requeue`, `--no-requeue`,
//! `--hold/-H`, `--parsable`, `--wrap` (command line only).
//!
//! `--nice` takes an optional value, as in Slurm (getopt's optional argument): `--nice` alone means 100, and only
//! `--nice=N` attaches a value (`--nice 50` leaves `50` as the next argument, the script). N may be negative
//! (the controller allows that to root only) and lies within ±2147483645.
//!
//! GPUs: the last of `--gres`, `--gpus-per-node`, `--gpus` and `--gpus-per-task` given wins entirely (count and
//! type), and is resolved once all options are applied. `--gpus=N` with a fixed `--nodes` count becomes
//! N / nodes per node (it must divide evenly); without one it is left to the controller as `gpus_total`.
//! `--gpus-per-task=N` needs `--ntasks` or `--ntasks-per-node` and gives each node N times the most tasks any node
//! gets. A count of 0 means no GPUs.
//!
//! Accepted and ignored (they take a value, which is checked to be present and then dropped; nothing about them
//! reaches the job): `--mail-type`, `--mail-user`, `--comment`.
//!
//! Error messages carry no `sbatch: error: ` prefix; print them as `sbatch: error: {err}`.

use std::fmt;

use drover_state::job::{ArraySpec, Dependency, ExportPolicy, JobSpec};
use drover_state::{array, dependency, slurm_time};

/// The `MaxArraySize` `sbatch` checks `--array` against (Slurm's default); the controller enforces its own too.
pub const MAX_ARRAY_SIZE: u32 = 1001;

/// `--nice` without a value (Slurm's default adjustment).
pub const DEFAULT_NICE: i32 = 100;

/// The largest `--nice` adjustment either way (Slurm's `NICE_OFFSET - 3`).
pub const MAX_NICE: i32 = 2_147_483_645;

/// The largest batch script accepted (Slurm's default `max_script_size`).
pub const MAX_SCRIPT_BYTES: usize = 4 * 1024 * 1024;

/// Who submits, from where, with which environment: everything the parser would otherwise read from the process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubmitContext {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    /// The directory `sbatch` runs in (absolute).
    pub cwd: String,
    /// The submitting process's environment, in order.
    pub env: Vec<(String, String)>,
}

/// The outcome of [`build_spec`]: the job to submit, and how to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubmit {
    pub spec: JobSpec,
    /// `--parsable` (on the command line or in a directive): print only the job id.
    pub parsable: bool,
    /// The script path from the command line, as given (`None` for `--wrap` or a script read from stdin).
    pub script_path: Option<String>,
}

/// The command line, parsed: options in the order given, then the script and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandLine {
    /// Every option except `--wrap`, checked, in command-line order (a later one overrides an earlier one).
    pub options: Vec<SbatchOption>,
    /// `--wrap=CMD`: the command to wrap in a generated `#!/bin/sh` script.
    pub wrap: Option<String>,
    /// The first non-option argument: the batch script's path.
    pub script_path: Option<String>,
    /// Everything after the script path, untouched.
    pub script_args: Vec<String>,
    /// `--parsable` was given on the command line.
    pub parsable: bool,
}

/// One option, its value checked and parsed. Directives and command-line options both parse to these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SbatchOption {
    JobName(String),
    Partition(String),
    Account(String),
    /// `--nodes`: `N` gives `min == max == N`.
    Nodes {
        min: u32,
        max: u32,
    },
    Ntasks(u32),
    NtasksPerNode(u32),
    CpusPerTask(u32),
    /// `--gres=gpu...` or `--gpus-per-node`.
    Gpus {
        per_node: u32,
        gpu_type: Option<String>,
    },
    /// `--gpus/-G`: the job's total GPUs, spread over its nodes in [`build_spec`].
    GpusTotal {
        count: u32,
        gpu_type: Option<String>,
    },
    /// `--gpus-per-task`: folded into GPUs per node in [`build_spec`].
    GpusPerTask {
        count: u32,
        gpu_type: Option<String>,
    },
    /// `--array`: task ids (sorted, unique) and the `%N` limit.
    Array(ArraySpec),
    /// `--dependency`: the entries, and whether any one suffices (`?`) rather than all (`,`).
    Dependency {
        deps: Vec<Dependency>,
        any: bool,
    },
    Qos(String),
    Reservation(String),
    /// `--nice` (100 when given without a value).
    Nice(i32),
    /// `--time`: seconds, `None` for UNLIMITED (or 0).
    TimeLimit(Option<u64>),
    Output(String),
    Error(String),
    Chdir(String),
    /// `--export`: the policy, and the `VAR=value` entries that add to or override the captured environment.
    Export {
        policy: ExportPolicy,
        set: Vec<(String, String)>,
    },
    /// `--requeue` (true) / `--no-requeue` (false).
    Requeue(bool),
    /// `--signal=[{R|B}:]SIG[@secs]`.
    Signal(drover_state::WarnSignal),
    /// `--no-kill/-k`.
    NoKill,
    /// `--open-mode=append` (true) or `truncate` (false).
    OpenAppend(bool),
    Exclusive,
    /// `--constraint`: features all required (`a&b`).
    Constraint(Vec<String>),
    /// `--nodelist` / `--exclude`: expanded host names.
    Nodelist(Vec<String>),
    Exclude(Vec<String>),
    Hold,
    Parsable,
    /// An accepted-and-ignored option (`--mail-type`, `--mail-user`, `--comment`); dropped by [`build_spec`].
    Ignored {
        flag: &'static str,
        value: String,
    },
}

/// What is wrong with one option (on the command line or in a directive).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unrecognized option {flag:?}; supported options: {}", SupportedOptions)]
    Unknown { flag: String },
    #[error("option {flag} requires a value")]
    MissingValue { flag: String },
    #[error("option {flag} takes no value, but was given {value:?}")]
    UnexpectedValue { flag: String, value: String },
    #[error("invalid {flag} value {value:?}: {expected}")]
    InvalidValue { flag: String, value: String, expected: String },
    #[error("unexpected argument {arg:?}: #SBATCH lines may hold only options")]
    UnexpectedArgument { arg: String },
    #[error("unmatched {quote} quote")]
    UnmatchedQuote { quote: char },
    #[error("--wrap is allowed only on the sbatch command line, not in a #SBATCH line")]
    WrapInScript,
}

/// Why a submission was refused. Messages carry no `sbatch: error: ` prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SbatchError {
    /// A bad option on the command line.
    #[error("{0}")]
    CommandLine(OptionError),
    /// A bad `#SBATCH` line: its 1-based number and text.
    #[error("script line {line}: {error} (in {text:?})")]
    Directive { line: usize, text: String, error: OptionError },
    #[error("no batch script given; pass a script file or --wrap")]
    NoScript,
    #[error("script arguments are not permitted with --wrap (got {arg:?}); put the whole command in --wrap=\"...\"")]
    WrapWithScript { arg: String },
    #[error(
        "This does not look like a batch script.  The first line must start with #! followed by the path to an \
         interpreter.  For instance: #!/bin/sh"
    )]
    NotABatchScript,
    #[error("batch script is empty")]
    EmptyScript,
    #[error("batch script contains only whitespace")]
    WhitespaceScript,
    #[error(
        "batch script contains DOS line breaks (\\r\\n) instead of expected UNIX line breaks (\\n), first on line \
         {line}; convert it with dos2unix"
    )]
    DosLineBreaks { line: usize },
    #[error("batch script is {size} bytes, over the limit of {limit} bytes (4 MiB)")]
    ScriptTooLarge { size: usize, limit: usize },
    /// Options that are each valid but do not fit together (checked once all are applied).
    #[error("{0}")]
    Conflict(String),
}

impl From<OptionError> for SbatchError {
    fn from(error: OptionError) -> Self {
        SbatchError::CommandLine(error)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    JobName,
    Partition,
    Account,
    Nodes,
    Ntasks,
    NtasksPerNode,
    CpusPerTask,
    Gres,
    GpusPerNode,
    GpusTotal,
    GpusPerTask,
    Array,
    Dependency,
    Qos,
    Reservation,
    Nice,
    Time,
    Output,
    Error,
    Chdir,
    Export,
    OpenMode,
    Exclusive,
    Constraint,
    Nodelist,
    Exclude,
    Requeue,
    NoRequeue,
    Signal,
    NoKill,
    Hold,
    Parsable,
    Wrap,
    Ignored,
}

/// Whether an option takes a value, as getopt's `has_arg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    No,
    Required,
    /// Attached only as `--name=value` (or `-Xvalue`); a separate next argument is never taken.
    Optional,
}

impl Kind {
    fn arg(self) -> Arg {
        match self {
            Kind::Requeue | Kind::NoRequeue | Kind::Hold | Kind::Parsable | Kind::Exclusive => Arg::No,
            Kind::Nice | Kind::NoKill => Arg::Optional,
            _ => Arg::Required,
        }
    }
}

struct OptDef {
    long: &'static str,
    short: Option<char>,
    kind: Kind,
}

const OPTIONS: &[OptDef] = &[
    OptDef { long: "job-name", short: Some('J'), kind: Kind::JobName },
    OptDef { long: "partition", short: Some('p'), kind: Kind::Partition },
    OptDef { long: "account", short: Some('A'), kind: Kind::Account },
    OptDef { long: "nodes", short: Some('N'), kind: Kind::Nodes },
    OptDef { long: "ntasks", short: Some('n'), kind: Kind::Ntasks },
    OptDef { long: "ntasks-per-node", short: None, kind: Kind::NtasksPerNode },
    OptDef { long: "cpus-per-task", short: Some('c'), kind: Kind::CpusPerTask },
    OptDef { long: "gres", short: None, kind: Kind::Gres },
    OptDef { long: "gpus-per-node", short: None, kind: Kind::GpusPerNode },
    OptDef { long: "gpus", short: Some('G'), kind: Kind::GpusTotal },
    OptDef { long: "gpus-per-task", short: None, kind: Kind::GpusPerTask },
    OptDef { long: "array", short: Some('a'), kind: Kind::Array },
    OptDef { long: "dependency", short: Some('d'), kind: Kind::Dependency },
    OptDef { long: "qos", short: Some('q'), kind: Kind::Qos },
    OptDef { long: "reservation", short: None, kind: Kind::Reservation },
    OptDef { long: "nice", short: None, kind: Kind::Nice },
    OptDef { long: "time", short: Some('t'), kind: Kind::Time },
    OptDef { long: "output", short: Some('o'), kind: Kind::Output },
    OptDef { long: "error", short: Some('e'), kind: Kind::Error },
    OptDef { long: "chdir", short: Some('D'), kind: Kind::Chdir },
    OptDef { long: "export", short: None, kind: Kind::Export },
    OptDef { long: "open-mode", short: None, kind: Kind::OpenMode },
    OptDef { long: "exclusive", short: None, kind: Kind::Exclusive },
    OptDef { long: "constraint", short: Some('C'), kind: Kind::Constraint },
    OptDef { long: "nodelist", short: Some('w'), kind: Kind::Nodelist },
    OptDef { long: "exclude", short: Some('x'), kind: Kind::Exclude },
    OptDef { long: "requeue", short: None, kind: Kind::Requeue },
    OptDef { long: "no-requeue", short: None, kind: Kind::NoRequeue },
    OptDef { long: "signal", short: None, kind: Kind::Signal },
    OptDef { long: "no-kill", short: Some('k'), kind: Kind::NoKill },
    OptDef { long: "hold", short: Some('H'), kind: Kind::Hold },
    OptDef { long: "parsable", short: None, kind: Kind::Parsable },
    OptDef { long: "wrap", short: None, kind: Kind::Wrap },
    OptDef { long: "mail-type", short: None, kind: Kind::Ignored },
    OptDef { long: "mail-user", short: None, kind: Kind::Ignored },
    OptDef { long: "comment", short: None, kind: Kind::Ignored },
];

/// Lists the supported options in [`OptionError::Unknown`]'s message.
struct SupportedOptions;

impl fmt::Display for SupportedOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, def) in OPTIONS.iter().filter(|d| d.kind != Kind::Ignored).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "--{}", def.long)?;
            if let Some(c) = def.short {
                write!(f, "/-{c}")?;
            }
        }
        Ok(())
    }
}

/// One parsed item of an argument list.
enum Item {
    Option(SbatchOption),
    Wrap(String),
}

/// What [`parse_args`] found: the items in order, and the index of the first positional argument.
struct Parsed {
    items: Vec<Item>,
    positional: Option<usize>,
}

/// `getopt_long`-style parsing of `args`. Stops at the first positional argument (or after `--`) and reports its
/// index; the caller decides whether positionals are allowed.
fn parse_args(args: &[String]) -> Result<Parsed, OptionError> {
    let mut items = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            let next = i + 1;
            return Ok(Parsed { items, positional: (next < args.len()).then_some(next) });
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (body, None),
            };
            let flag = format!("--{name}");
            let def =
                OPTIONS.iter().find(|d| d.long == name).ok_or_else(|| OptionError::Unknown { flag: flag.clone() })?;
            let value = match (def.kind.arg(), inline) {
                (Arg::Required | Arg::Optional, Some(v)) => Some(v.to_string()),
                (Arg::Required, None) => {
                    i += 1;
                    Some(args.get(i).cloned().ok_or(OptionError::MissingValue { flag: flag.clone() })?)
                }
                (Arg::No, Some(v)) => return Err(OptionError::UnexpectedValue { flag, value: v.to_string() }),
                (Arg::No | Arg::Optional, None) => None,
            };
            items.push(parse_value(def, &flag, value)?);
            i += 1;
        } else if arg.len() > 1 && arg.starts_with('-') {
            let cluster = &arg[1..];
            for (at, c) in cluster.char_indices() {
                let flag = format!("-{c}");
                let def = OPTIONS
                    .iter()
                    .find(|d| d.short == Some(c))
                    .ok_or_else(|| OptionError::Unknown { flag: flag.clone() })?;
                if def.kind.arg() == Arg::No {
                    items.push(parse_value(def, &flag, None)?);
                    continue;
                }
                let rest = &cluster[at + c.len_utf8()..];
                let value = match (rest.is_empty(), def.kind.arg()) {
                    (false, _) => Some(rest.to_string()),
                    // getopt: an optional value must be attached (`-Xvalue`).
                    (true, Arg::Optional) => None,
                    (true, _) => {
                        i += 1;
                        Some(args.get(i).cloned().ok_or(OptionError::MissingValue { flag: flag.clone() })?)
                    }
                };
                items.push(parse_value(def, &flag, value)?);
                break;
            }
            i += 1;
        } else {
            return Ok(Parsed { items, positional: Some(i) });
        }
    }
    Ok(Parsed { items, positional: None })
}

fn invalid(flag: &str, value: &str, expected: impl Into<String>) -> OptionError {
    OptionError::InvalidValue { flag: flag.to_string(), value: value.to_string(), expected: expected.into() }
}

/// Checks and parses one option's value.
fn parse_value(def: &OptDef, flag: &str, value: Option<String>) -> Result<Item, OptionError> {
    let Some(value) = value else {
        return Ok(Item::Option(match def.kind {
            Kind::Requeue => SbatchOption::Requeue(true),
            Kind::NoRequeue => SbatchOption::Requeue(false),
            Kind::Hold => SbatchOption::Hold,
            Kind::Parsable => SbatchOption::Parsable,
            Kind::Exclusive => SbatchOption::Exclusive,
            Kind::Nice => SbatchOption::Nice(DEFAULT_NICE),
            Kind::NoKill => SbatchOption::NoKill,
            _ => return Err(OptionError::MissingValue { flag: flag.to_string() }),
        }));
    };
    if value.is_empty() {
        let expected = match def.kind {
            Kind::Wrap => "expected a command to run",
            _ => "the value is empty",
        };
        return Err(invalid(flag, &value, expected));
    }
    let option = match def.kind {
        Kind::JobName => SbatchOption::JobName(value),
        Kind::Partition => SbatchOption::Partition(value),
        Kind::Account => SbatchOption::Account(value),
        Kind::Output => SbatchOption::Output(value),
        Kind::Error => SbatchOption::Error(value),
        Kind::Chdir => SbatchOption::Chdir(value),
        Kind::Nodes => parse_nodes(flag, &value)?,
        Kind::Ntasks => SbatchOption::Ntasks(positive(flag, &value)?),
        Kind::NtasksPerNode => SbatchOption::NtasksPerNode(positive(flag, &value)?),
        Kind::CpusPerTask => SbatchOption::CpusPerTask(positive(flag, &value)?),
        Kind::Gres => parse_gres(flag, &value)?,
        Kind::GpusPerNode => {
            let (per_node, gpu_type) = parse_gpu_count(flag, &value)?;
            SbatchOption::Gpus { per_node, gpu_type }
        }
        Kind::GpusTotal => {
            let (count, gpu_type) = parse_gpu_count(flag, &value)?;
            SbatchOption::GpusTotal { count, gpu_type }
        }
        Kind::GpusPerTask => {
            let (count, gpu_type) = parse_gpu_count(flag, &value)?;
            SbatchOption::GpusPerTask { count, gpu_type }
        }
        Kind::Array => {
            SbatchOption::Array(array::parse_array_value(&value, MAX_ARRAY_SIZE).map_err(|e| invalid(flag, &value, e))?)
        }
        Kind::Dependency => {
            let (deps, any) = dependency::parse_dependency_value(&value).map_err(|e| invalid(flag, &value, e))?;
            SbatchOption::Dependency { deps, any }
        }
        Kind::Qos => SbatchOption::Qos(value),
        Kind::Reservation => SbatchOption::Reservation(value),
        Kind::Nice => SbatchOption::Nice(parse_nice(flag, &value)?),
        Kind::Signal => {
            SbatchOption::Signal(drover_state::signal::parse_warn_signal(&value).map_err(|e| invalid(flag, &value, e))?)
        }
        // Slurm's `--no-kill[=off]`.
        Kind::NoKill => match value.to_ascii_lowercase().as_str() {
            "off" | "no" => SbatchOption::Ignored { flag: "no-kill", value },
            _ => SbatchOption::NoKill,
        },
        Kind::Time => match slurm_time::parse_time_limit(&value) {
            Ok(limit) => SbatchOption::TimeLimit(limit),
            Err(e) => {
                return Err(invalid(
                    flag,
                    &value,
                    format!("{}; accepted formats: {}", e.problem, slurm_time::ACCEPTED_TIME_FORMATS),
                ));
            }
        },
        Kind::Export => parse_export(flag, &value)?,
        Kind::Constraint => {
            if value.contains(['|', '[', ']', '*']) {
                return Err(invalid(flag, &value, "only AND constraints are supported (features joined with &)"));
            }
            SbatchOption::Constraint(
                value.split(['&', ',']).map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect(),
            )
        }
        Kind::Nodelist | Kind::Exclude => {
            let hosts = drover_state::hostlist::expand_hostlist(&value).map_err(|e| invalid(flag, &value, e))?;
            if def.kind == Kind::Nodelist { SbatchOption::Nodelist(hosts) } else { SbatchOption::Exclude(hosts) }
        }
        Kind::OpenMode => match value.to_ascii_lowercase().as_str() {
            "append" | "a" => SbatchOption::OpenAppend(true),
            "truncate" | "t" => SbatchOption::OpenAppend(false),
            _ => return Err(invalid(flag, &value, "expected append or truncate")),
        },
        Kind::Wrap => return Ok(Item::Wrap(value)),
        Kind::Ignored => SbatchOption::Ignored { flag: def.long, value },
        Kind::Requeue | Kind::NoRequeue | Kind::Hold | Kind::Parsable | Kind::Exclusive => {
            unreachable!("value-less options never get a value here")
        }
    };
    Ok(Item::Option(option))
}

/// A count made of digits only, fitting in u32.
fn count(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn positive(flag: &str, value: &str) -> Result<u32, OptionError> {
    match count(value) {
        Some(0) => Err(invalid(flag, value, "must be at least 1")),
        Some(n) => Ok(n),
        None => Err(invalid(flag, value, "expected a positive whole number")),
    }
}

fn parse_nodes(flag: &str, value: &str) -> Result<SbatchOption, OptionError> {
    const EXPECTED: &str = "expected a number or MIN-MAX";
    let (min, max) = match value.split_once('-') {
        Some((lo, hi)) => (count(lo), count(hi)),
        None => (count(value), count(value)),
    };
    let (Some(min), Some(max)) = (min, max) else {
        return Err(invalid(flag, value, EXPECTED));
    };
    if min == 0 || max == 0 {
        return Err(invalid(flag, value, "node counts must be at least 1"));
    }
    if min > max {
        return Err(invalid(flag, value, format!("the minimum node count {min} is more than the maximum {max}")));
    }
    Ok(SbatchOption::Nodes { min, max })
}

/// A GPU type name: letters, digits, `_`, `-`, `.`.
fn valid_type(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn parse_gres(flag: &str, value: &str) -> Result<SbatchOption, OptionError> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(SbatchOption::Gpus { per_node: 0, gpu_type: None });
    }
    const EXPECTED: &str = "expected gpu, gpu:COUNT, gpu:TYPE or gpu:TYPE:COUNT";
    let mut found: Option<SbatchOption> = None;
    for entry in value.split(',') {
        let mut parts = entry.split(':');
        let name = parts.next().unwrap_or_default();
        if name != "gpu" {
            let expected = if name.is_empty() {
                format!("an entry is empty; {EXPECTED}")
            } else {
                format!("only gpu resources are supported, not {name:?}; {EXPECTED}")
            };
            return Err(invalid(flag, value, expected));
        }
        let rest: Vec<&str> = parts.collect();
        let parsed = match rest.as_slice() {
            [] => Some((1, None)),
            [n] if count(n).is_some() => count(n).map(|n| (n, None)),
            [t] if valid_type(t) => Some((1, Some(t.to_string()))),
            [t, n] if valid_type(t) => count(n).map(|n| (n, Some(t.to_string()))),
            _ => None,
        };
        let Some((per_node, gpu_type)) = parsed else {
            return Err(invalid(flag, value, format!("{entry:?} is malformed; {EXPECTED}")));
        };
        if found.is_some() {
            return Err(invalid(flag, value, "gpu is listed more than once; give one gpu entry"));
        }
        found = Some(SbatchOption::Gpus { per_node, gpu_type });
    }
    Ok(found.expect("split yields at least one entry"))
}

/// `COUNT` or `TYPE:COUNT` (`--gpus-per-node`, `--gpus`, `--gpus-per-task`).
fn parse_gpu_count(flag: &str, value: &str) -> Result<(u32, Option<String>), OptionError> {
    const EXPECTED: &str = "expected COUNT or TYPE:COUNT";
    let parsed = match value.split_once(':') {
        Some((t, n)) if valid_type(t) => count(n).map(|n| (n, Some(t.to_string()))),
        Some(_) => None,
        None => count(value).map(|n| (n, None)),
    };
    parsed.ok_or_else(|| invalid(flag, value, EXPECTED))
}

/// `--nice=N`: a whole number, optionally signed, within ±[`MAX_NICE`].
fn parse_nice(flag: &str, value: &str) -> Result<i32, OptionError> {
    let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(flag, value, "expected a whole number, optionally negative (e.g. --nice=50)"));
    }
    match value.parse::<i64>() {
        Ok(n) if (-i64::from(MAX_NICE)..=i64::from(MAX_NICE)).contains(&n) => Ok(n as i32),
        _ => Err(invalid(flag, value, format!("the nice value must lie between -{MAX_NICE} and {MAX_NICE}"))),
    }
}

/// The GPU option that won (the last of `--gres`, `--gpus-per-node`, `--gpus`, `--gpus-per-task`).
enum GpuRequest {
    PerNode(u32),
    Total(u32),
    PerTask(u32),
}

/// Splits on commas outside single or double quotes, dropping the quote characters.
fn split_export(value: &str) -> Result<Vec<String>, char> {
    let mut entries = vec![String::new()];
    let mut quote: Option<char> = None;
    for c in value.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => entries.last_mut().expect("non-empty").push(c),
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == ',' => entries.push(String::new()),
            None => entries.last_mut().expect("non-empty").push(c),
        }
    }
    match quote {
        Some(q) => Err(q),
        None => Ok(entries),
    }
}

fn parse_export(flag: &str, value: &str) -> Result<SbatchOption, OptionError> {
    const EXPECTED: &str = "expected ALL, NONE, or a comma list of VAR and VAR=value entries (optionally with ALL)";
    let entries = split_export(value).map_err(|q| invalid(flag, value, format!("unmatched {q} quote; {EXPECTED}")))?;
    let entries: Vec<String> = entries.into_iter().filter(|e| !e.is_empty()).collect();
    if entries.is_empty() {
        return Err(invalid(flag, value, EXPECTED));
    }
    let is = |e: &str, word: &str| e.eq_ignore_ascii_case(word);
    if entries.len() == 1 && is(&entries[0], "ALL") {
        return Ok(SbatchOption::Export { policy: ExportPolicy::All, set: Vec::new() });
    }
    if entries.len() == 1 && is(&entries[0], "NONE") {
        return Ok(SbatchOption::Export { policy: ExportPolicy::None, set: Vec::new() });
    }
    let mut all = false;
    let mut names: Vec<String> = Vec::new();
    let mut set: Vec<(String, String)> = Vec::new();
    for entry in &entries {
        if is(entry, "ALL") {
            all = true;
            continue;
        }
        if is(entry, "NONE") {
            return Err(invalid(
                flag,
                value,
                "NONE cannot be combined with other entries; use --export=NONE alone, or list the variables to pass",
            ));
        }
        let (name, val) = match entry.split_once('=') {
            Some((name, val)) => (name, Some(val)),
            None => (entry.as_str(), None),
        };
        if name.is_empty() || name.chars().any(|c| c.is_whitespace()) {
            return Err(invalid(flag, value, format!("{entry:?} is not a variable name; {EXPECTED}")));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        if let Some(val) = val {
            match set.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = val.to_string(),
                None => set.push((name.to_string(), val.to_string())),
            }
        }
    }
    Ok(SbatchOption::Export { policy: ExportPolicy::Vars { all, names }, set })
}

/// Parses `sbatch`'s arguments (without `argv[0]`).
pub fn parse_command_line(args: &[String]) -> Result<CommandLine, SbatchError> {
    let parsed = parse_args(args)?;
    let mut cmd = CommandLine::default();
    for item in parsed.items {
        match item {
            Item::Wrap(command) => cmd.wrap = Some(command),
            Item::Option(option) => {
                if option == SbatchOption::Parsable {
                    cmd.parsable = true;
                }
                cmd.options.push(option);
            }
        }
    }
    if let Some(at) = parsed.positional {
        if cmd.wrap.is_some() {
            return Err(SbatchError::WrapWithScript { arg: args[at].clone() });
        }
        cmd.script_path = Some(args[at].clone());
        cmd.script_args = args[at + 1..].to_vec();
    }
    Ok(cmd)
}

/// The script Slurm generates for `--wrap=CMD`.
pub fn wrap_script(command: &str) -> String {
    format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n")
}

/// Checks a script as Slurm does before it parses directives.
fn check_script(script: &str) -> Result<(), SbatchError> {
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(SbatchError::ScriptTooLarge { size: script.len(), limit: MAX_SCRIPT_BYTES });
    }
    if script.is_empty() {
        return Err(SbatchError::EmptyScript);
    }
    if script.trim().is_empty() {
        return Err(SbatchError::WhitespaceScript);
    }
    if !script.starts_with("#!") {
        return Err(SbatchError::NotABatchScript);
    }
    if let Some(at) = script.find("\r\n") {
        let line = script[..at].matches('\n').count() + 1;
        return Err(SbatchError::DosLineBreaks { line });
    }
    Ok(())
}

/// Splits a `#SBATCH` line's remainder into arguments as Slurm does: whitespace separates, single and double
/// quotes group (and are removed), a backslash escapes the next character, an unquoted `#` starts a comment.
fn directive_words(text: &str) -> Result<Vec<String>, OptionError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                word.push(next);
            }
            in_word = true;
            continue;
        }
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c == '#' => break,
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if let Some(quote) = quote {
        return Err(OptionError::UnmatchedQuote { quote });
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// The options in a script's `#SBATCH` lines, in order. Like Slurm, only lines before the first command (a line
/// whose first non-blank character is not `#`) are read, and only lines starting exactly with `#SBATCH` count.
fn script_directives(script: &str) -> Result<Vec<SbatchOption>, SbatchError> {
    let mut options = Vec::new();
    for (index, line) in script.split('\n').enumerate() {
        let Some(rest) = line.strip_prefix("#SBATCH") else {
            if line.trim_start().starts_with('#') || line.trim().is_empty() {
                continue;
            }
            break;
        };
        let at_line = |error| SbatchError::Directive { line: index + 1, text: line.to_string(), error };
        let words = directive_words(rest).map_err(at_line)?;
        let parsed = parse_args(&words).map_err(at_line)?;
        if let Some(at) = parsed.positional {
            return Err(at_line(OptionError::UnexpectedArgument { arg: words[at].clone() }));
        }
        if words.iter().any(|w| w == "--") {
            return Err(at_line(OptionError::UnexpectedArgument { arg: "--".to_string() }));
        }
        for item in parsed.items {
            match item {
                Item::Option(option) => options.push(option),
                Item::Wrap(_) => return Err(at_line(OptionError::WrapInScript)),
            }
        }
    }
    Ok(options)
}

/// `dir` made absolute against `cwd` (lexically; nothing is looked up).
fn resolve_dir(cwd: &str, dir: &str) -> String {
    if dir.starts_with('/') {
        dir.to_string()
    } else if dir == "." {
        cwd.to_string()
    } else {
        let dir = dir.strip_prefix("./").unwrap_or(dir);
        format!("{}/{}", cwd.trim_end_matches('/'), dir)
    }
}

/// The environment the job gets under `policy`: selected from `env`, then `set` added or overriding in place.
fn export_environment(
    policy: &ExportPolicy,
    set: &[(String, String)],
    env: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = match policy {
        ExportPolicy::All => env.to_vec(),
        ExportPolicy::None => Vec::new(),
        ExportPolicy::Vars { all: true, .. } => env.to_vec(),
        ExportPolicy::Vars { all: false, names } => {
            env.iter().filter(|(name, _)| names.iter().any(|n| n == name)).cloned().collect()
        }
    };
    for (name, value) in set {
        let mut replaced = false;
        for slot in out.iter_mut().filter(|(n, _)| n == name) {
            slot.1 = value.clone();
            replaced = true;
        }
        if !replaced {
            out.push((name.clone(), value.clone()));
        }
    }
    out
}

/// Turns the winning GPU option into `gpus_per_node` (or `gpus_total`, for the controller), once the node and
/// task counts are final.
fn resolve_gpus(spec: &mut JobSpec, gpus: Option<GpuRequest>, nodes_given: bool) -> Result<(), SbatchError> {
    match gpus {
        None => {}
        Some(GpuRequest::PerNode(n)) => spec.gpus_per_node = n,
        Some(GpuRequest::Total(0) | GpuRequest::PerTask(0)) => spec.gpus_per_node = 0,
        Some(GpuRequest::Total(n)) => {
            if nodes_given && spec.min_nodes == spec.max_nodes {
                let nodes = spec.min_nodes.max(1);
                if n % nodes != 0 {
                    return Err(SbatchError::Conflict(format!(
                        "--gpus={n} cannot be spread evenly over {nodes} nodes; use --gpus-per-node"
                    )));
                }
                spec.gpus_per_node = n / nodes;
            } else {
                spec.gpus_total = Some(n);
            }
        }
        Some(GpuRequest::PerTask(n)) => {
            if spec.ntasks.is_none() && spec.ntasks_per_node.is_none() {
                return Err(SbatchError::Conflict(format!(
                    "--gpus-per-task={n} requires a task count: give --ntasks or --ntasks-per-node"
                )));
            }
            let most = most_tasks_on_a_node(spec);
            spec.gpus_per_node = n.checked_mul(most).ok_or_else(|| {
                SbatchError::Conflict(format!("--gpus-per-task={n} with {most} tasks on a node is too many GPUs"))
            })?;
            spec.gpus_per_task = Some(n);
        }
    }
    Ok(())
}

/// The most tasks any node gets under [`JobSpec::tasks_per_node`] on `min_nodes` nodes, computed rather than
/// listed: that list has one entry per node, and `--nodes=4294967295` would make it 16 GiB.
fn most_tasks_on_a_node(spec: &JobSpec) -> u32 {
    spec.max_tasks_per_node(spec.min_nodes)
}

/// Builds the job: the script's `#SBATCH` directives first, then the command line's options over them.
///
/// `script_text` is the script read from `cmd.script_path`, or from stdin when there is no path; it is ignored
/// with `--wrap`, which generates the script (and has no directives).
pub fn build_spec(
    cmd: &CommandLine,
    script_text: Option<&str>,
    ctx: &SubmitContext,
) -> Result<ParsedSubmit, SbatchError> {
    let (script, default_name) = match (&cmd.wrap, script_text) {
        (Some(command), _) => (wrap_script(command), "wrap".to_string()),
        (None, Some(text)) => {
            let name = match &cmd.script_path {
                Some(path) => path.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or(path).to_string(),
                None => "sbatch".to_string(),
            };
            (text.to_string(), name)
        }
        (None, None) => return Err(SbatchError::NoScript),
    };
    check_script(&script)?;
    let directives = if cmd.wrap.is_some() { Vec::new() } else { script_directives(&script)? };

    let mut spec = JobSpec {
        name: String::new(),
        user: ctx.user.clone(),
        uid: ctx.uid,
        gid: ctx.gid,
        script_args: cmd.script_args.clone(),
        submit_dir: ctx.cwd.clone(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        export: ExportPolicy::All,
        ..JobSpec::default()
    };
    let mut name = None;
    let mut chdir = None;
    let mut export_set: Vec<(String, String)> = Vec::new();
    let mut parsable = false;
    let mut nodes_given = false;
    let mut gpus = None;
    for option in directives.iter().chain(&cmd.options) {
        match option {
            SbatchOption::JobName(v) => name = Some(v.clone()),
            SbatchOption::Partition(v) => spec.partition = Some(v.clone()),
            SbatchOption::Account(v) => spec.account = Some(v.clone()),
            SbatchOption::Nodes { min, max } => {
                spec.min_nodes = *min;
                spec.max_nodes = *max;
                nodes_given = true;
            }
            SbatchOption::Ntasks(n) => spec.ntasks = Some(*n),
            SbatchOption::NtasksPerNode(n) => spec.ntasks_per_node = Some(*n),
            SbatchOption::CpusPerTask(n) => spec.cpus_per_task = *n,
            SbatchOption::Gpus { per_node, gpu_type } => {
                gpus = Some(GpuRequest::PerNode(*per_node));
                spec.gpu_type = gpu_type.clone();
            }
            SbatchOption::GpusTotal { count, gpu_type } => {
                gpus = Some(GpuRequest::Total(*count));
                spec.gpu_type = gpu_type.clone();
            }
            SbatchOption::GpusPerTask { count, gpu_type } => {
                gpus = Some(GpuRequest::PerTask(*count));
                spec.gpu_type = gpu_type.clone();
            }
            SbatchOption::Array(v) => spec.array = Some(v.clone()),
            SbatchOption::Dependency { deps, any } => {
                spec.dependency = deps.clone();
                spec.dependency_any = *any;
            }
            SbatchOption::Qos(v) => spec.qos = Some(v.clone()),
            SbatchOption::Reservation(v) => spec.reservation = Some(v.clone()),
            SbatchOption::Nice(v) => spec.nice = *v,
            SbatchOption::TimeLimit(limit) => spec.time_limit_s = *limit,
            SbatchOption::Output(v) => spec.stdout = Some(v.clone()),
            SbatchOption::Error(v) => spec.stderr = Some(v.clone()),
            SbatchOption::Chdir(v) => chdir = Some(v.clone()),
            SbatchOption::Export { policy, set } => {
                spec.export = policy.clone();
                export_set = set.clone();
            }
            SbatchOption::Requeue(v) => spec.requeue = Some(*v),
            SbatchOption::Signal(w) => spec.signal = Some(*w),
            SbatchOption::NoKill => spec.no_kill = true,
            SbatchOption::Hold => spec.hold = true,
            SbatchOption::OpenAppend(v) => spec.open_append = *v,
            SbatchOption::Exclusive => spec.exclusive = true,
            SbatchOption::Constraint(v) => spec.constraint = v.clone(),
            SbatchOption::Nodelist(v) => spec.nodelist = v.clone(),
            SbatchOption::Exclude(v) => spec.exclude = v.clone(),
            SbatchOption::Parsable => parsable = true,
            SbatchOption::Ignored { .. } => {}
        }
    }
    resolve_gpus(&mut spec, gpus, nodes_given)?;
    spec.name = name.unwrap_or(default_name);
    spec.work_dir = match &chdir {
        Some(dir) => resolve_dir(&ctx.cwd, dir),
        None => ctx.cwd.clone(),
    };
    spec.environment = export_environment(&spec.export, &export_set, &ctx.env);
    spec.script = script;
    Ok(ParsedSubmit { spec, parsable: parsable || cmd.parsable, script_path: cmd.script_path.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_state::job::DependencyKind;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn ctx() -> SubmitContext {
        SubmitContext {
            user: "alice".into(),
            uid: 1000,
            gid: 100,
            cwd: "/home/alice/work".into(),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/home/alice".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
        }
    }

    const SCRIPT: &str = "#!/bin/bash\necho hi\n";

    /// Parses the command line and builds with `script` (or none for --wrap).
    fn submit(list: &[&str], script: Option<&str>) -> Result<ParsedSubmit, SbatchError> {
        let cmd = parse_command_line(&args(list))?;
        build_spec(&cmd, script, &ctx())
    }

    fn spec(list: &[&str], script: &str) -> JobSpec {
        submit(list, Some(script)).unwrap_or_else(|e| panic!("{list:?}: {e}")).spec
    }

    fn cmd_err(list: &[&str]) -> String {
        match parse_command_line(&args(list)) {
            Ok(cmd) => panic!("{list:?} should fail, got {cmd:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn script_err(script: &str) -> SbatchError {
        let cmd = parse_command_line(&args(&["job.sh"])).unwrap();
        build_spec(&cmd, Some(script), &ctx()).expect_err("should fail")
    }

    // ---- defaults ----

    #[test]
    fn defaults_for_a_script_file() {
        let parsed = submit(&["dir/train.sh"], Some(SCRIPT)).unwrap();
        assert!(!parsed.parsable);
        assert_eq!(parsed.script_path.as_deref(), Some("dir/train.sh"));
        let s = parsed.spec;
        assert_eq!(s.name, "train.sh");
        assert_eq!(s.partition, None);
        assert_eq!(s.account, None);
        assert_eq!((s.user.as_str(), s.uid, s.gid), ("alice", 1000, 100));
        assert_eq!(s.script, SCRIPT);
        assert!(s.script_args.is_empty());
        assert_eq!(s.work_dir, "/home/alice/work");
        assert_eq!(s.submit_dir, "/home/alice/work");
        assert_eq!((s.stdout, s.stderr), (None, None));
        assert_eq!((s.min_nodes, s.max_nodes), (1, 1));
        assert_eq!((s.ntasks, s.ntasks_per_node), (None, None));
        assert_eq!(s.cpus_per_task, 1);
        assert_eq!((s.gpus_per_node, s.gpu_type), (0, None));
        assert_eq!(s.time_limit_s, None);
        assert_eq!(s.requeue, None);
        assert!(!s.hold);
        assert_eq!(s.export, ExportPolicy::All);
        assert_eq!(s.environment, ctx().env);
        assert_eq!((s.qos, s.reservation, s.nice), (None, None, 0));
        assert_eq!((s.dependency, s.dependency_any), (vec![], false));
        assert_eq!(s.array, None);
        assert_eq!((s.gpus_total, s.gpus_per_task), (None, None));
    }

    #[test]
    fn name_defaults_to_base_name() {
        assert_eq!(spec(&["/abs/path/run.sbatch"], SCRIPT).name, "run.sbatch");
        assert_eq!(spec(&["run"], SCRIPT).name, "run");
    }

    #[test]
    fn script_from_stdin_is_named_sbatch() {
        let parsed = submit(&["-N", "2"], Some(SCRIPT)).unwrap();
        assert_eq!(parsed.spec.name, "sbatch");
        assert_eq!(parsed.script_path, None);
        assert_eq!(parsed.spec.min_nodes, 2);
    }

    #[test]
    fn no_script_and_no_wrap() {
        let err = submit(&["-N", "2"], None).unwrap_err();
        assert_eq!(err, SbatchError::NoScript);
        assert_eq!(err.to_string(), "no batch script given; pass a script file or --wrap");
    }

    // ---- every flag form ----

    #[test]
    fn every_value_option_in_every_form() {
        // (long, short, value, check)
        type Check = fn(&JobSpec) -> bool;
        let cases: &[(&str, Option<&str>, &str, Check)] = &[
            ("job-name", Some("J"), "myjob", |s| s.name == "myjob"),
            ("partition", Some("p"), "gpu", |s| s.partition.as_deref() == Some("gpu")),
            ("account", Some("A"), "proj1", |s| s.account.as_deref() == Some("proj1")),
            ("nodes", Some("N"), "3", |s| (s.min_nodes, s.max_nodes) == (3, 3)),
            ("ntasks", Some("n"), "16", |s| s.ntasks == Some(16)),
            ("ntasks-per-node", None, "8", |s| s.ntasks_per_node == Some(8)),
            ("cpus-per-task", Some("c"), "4", |s| s.cpus_per_task == 4),
            ("gres", None, "gpu:2", |s| s.gpus_per_node == 2 && s.gpu_type.is_none()),
            ("gpus-per-node", None, "h100:8", |s| s.gpus_per_node == 8 && s.gpu_type.as_deref() == Some("h100")),
            ("time", Some("t"), "1:30:00", |s| s.time_limit_s == Some(5400)),
            ("output", Some("o"), "out-%j.txt", |s| s.stdout.as_deref() == Some("out-%j.txt")),
            ("error", Some("e"), "err-%j.txt", |s| s.stderr.as_deref() == Some("err-%j.txt")),
            ("chdir", Some("D"), "/scratch", |s| s.work_dir == "/scratch"),
            ("export", None, "NONE", |s| s.export == ExportPolicy::None && s.environment.is_empty()),
            ("array", Some("a"), "1-3%2", |s| {
                s.array == Some(ArraySpec { task_ids: vec![1, 2, 3], max_running: Some(2) })
            }),
            ("dependency", Some("d"), "afterok:12_3", |s| {
                s.dependency == [Dependency { kind: DependencyKind::AfterOk, job: 12, task: Some(3) }]
                    && !s.dependency_any
            }),
            ("qos", Some("q"), "high", |s| s.qos.as_deref() == Some("high")),
            ("reservation", None, "maint", |s| s.reservation.as_deref() == Some("maint")),
            ("gpus", Some("G"), "a100:4", |s| {
                s.gpus_total == Some(4) && s.gpus_per_node == 0 && s.gpu_type.as_deref() == Some("a100")
            }),
        ];
        for (long, short, value, check) in cases {
            let mut forms = vec![vec![format!("--{long}={value}")], vec![format!("--{long}"), value.to_string()]];
            if let Some(short) = short {
                forms.push(vec![format!("-{short}{value}")]);
                forms.push(vec![format!("-{short}"), value.to_string()]);
            }
            for mut form in forms {
                form.push("job.sh".to_string());
                let cmd = parse_command_line(&form).unwrap_or_else(|e| panic!("{form:?}: {e}"));
                assert_eq!(cmd.script_path.as_deref(), Some("job.sh"), "{form:?}");
                let s = build_spec(&cmd, Some(SCRIPT), &ctx()).unwrap().spec;
                assert!(check(&s), "{form:?} gave {s:?}");
            }
        }
    }

    #[test]
    fn value_less_flags() {
        let s = spec(&["--requeue", "job.sh"], SCRIPT);
        assert_eq!(s.requeue, Some(true));
        let s = spec(&["--no-requeue", "job.sh"], SCRIPT);
        assert_eq!(s.requeue, Some(false));
        let s = spec(&["--requeue", "--no-requeue", "job.sh"], SCRIPT);
        assert_eq!(s.requeue, Some(false));
        assert!(spec(&["--hold", "job.sh"], SCRIPT).hold);
        assert!(spec(&["-H", "job.sh"], SCRIPT).hold);
        let parsed = submit(&["--parsable", "job.sh"], Some(SCRIPT)).unwrap();
        assert!(parsed.parsable);
        assert!(parse_command_line(&args(&["--parsable", "x.sh"])).unwrap().parsable);
    }

    #[test]
    fn bundled_short_flags() {
        let s = spec(&["-HJname", "job.sh"], SCRIPT);
        assert!(s.hold);
        assert_eq!(s.name, "name");
        let s = spec(&["-Hp", "debug", "job.sh"], SCRIPT);
        assert!(s.hold);
        assert_eq!(s.partition.as_deref(), Some("debug"));
    }

    #[test]
    fn separate_value_may_start_with_a_dash() {
        // getopt takes the next argument as the value, whatever it looks like.
        let s = spec(&["-J", "-weird-", "job.sh"], SCRIPT);
        assert_eq!(s.name, "-weird-");
        let s = spec(&["--time", "-1", "job.sh"], SCRIPT);
        assert_eq!(s.time_limit_s, None);
    }

    #[test]
    fn value_may_contain_equals_signs() {
        let s = spec(&["--job-name=a=b", "job.sh"], SCRIPT);
        assert_eq!(s.name, "a=b");
    }

    #[test]
    fn later_options_override_earlier_ones() {
        let s = spec(&["-N", "2", "--nodes=4", "-p", "a", "-p", "b", "job.sh"], SCRIPT);
        assert_eq!((s.min_nodes, s.max_nodes), (4, 4));
        assert_eq!(s.partition.as_deref(), Some("b"));
    }

    #[test]
    fn ignored_options_are_accepted_and_dropped() {
        let cmd = parse_command_line(&args(&[
            "--mail-type=END,FAIL",
            "--mail-user",
            "a@b.c",
            "--comment=hello world",
            "job.sh",
        ]))
        .unwrap();
        assert_eq!(cmd.options.len(), 3);
        assert!(cmd.options.iter().all(|o| matches!(o, SbatchOption::Ignored { .. })));
        let s = build_spec(&cmd, Some(SCRIPT), &ctx()).unwrap().spec;
        assert_eq!(s, spec(&["job.sh"], SCRIPT));
        assert!(cmd_err(&["--mail-type"]).contains("--mail-type requires a value"));
    }

    #[test]
    fn command_line_keeps_options_in_order() {
        let cmd = parse_command_line(&args(&["-N2", "-t", "10", "--hold", "-N", "1-3", "x.sh", "a"])).unwrap();
        assert_eq!(
            cmd.options,
            vec![
                SbatchOption::Nodes { min: 2, max: 2 },
                SbatchOption::TimeLimit(Some(600)),
                SbatchOption::Hold,
                SbatchOption::Nodes { min: 1, max: 3 },
            ]
        );
        assert_eq!(cmd.script_path.as_deref(), Some("x.sh"));
        assert_eq!(cmd.script_args, args(&["a"]));
        assert_eq!(cmd.wrap, None);
        assert!(!cmd.parsable);
    }

    // ---- values ----

    #[test]
    fn node_ranges() {
        let s = spec(&["-N", "2-4", "job.sh"], SCRIPT);
        assert_eq!((s.min_nodes, s.max_nodes), (2, 4));
        let s = spec(&["-N", "3-3", "job.sh"], SCRIPT);
        assert_eq!((s.min_nodes, s.max_nodes), (3, 3));
    }

    #[test]
    fn bad_node_counts() {
        let msg = cmd_err(&["--nodes=two", "job.sh"]);
        assert_eq!(msg, "invalid --nodes value \"two\": expected a number or MIN-MAX");
        let msg = cmd_err(&["-N", "4-2", "job.sh"]);
        assert_eq!(msg, "invalid -N value \"4-2\": the minimum node count 4 is more than the maximum 2");
        assert!(cmd_err(&["-N0", "job.sh"]).contains("at least 1"));
        assert!(cmd_err(&["-N", "0-2", "job.sh"]).contains("at least 1"));
        for bad in ["", "-2", "2-", "1-2-3", "+2", "99999999999", "2.5", " 2"] {
            let msg = cmd_err(&["--nodes", bad, "job.sh"]);
            assert!(msg.starts_with(&format!("invalid --nodes value {bad:?}")), "{bad:?}: {msg}");
        }
    }

    #[test]
    fn bad_counts() {
        assert_eq!(cmd_err(&["-n", "0"]), "invalid -n value \"0\": must be at least 1");
        assert_eq!(cmd_err(&["--cpus-per-task=0"]), "invalid --cpus-per-task value \"0\": must be at least 1");
        assert_eq!(cmd_err(&["--ntasks-per-node=0"]), "invalid --ntasks-per-node value \"0\": must be at least 1");
        assert_eq!(cmd_err(&["-c", "four"]), "invalid -c value \"four\": expected a positive whole number");
        assert!(cmd_err(&["-n", "-3"]).contains("expected a positive whole number"));
        assert!(cmd_err(&["-n", "4294967296"]).contains("expected a positive whole number"));
    }

    #[test]
    fn ntasks_and_per_node_may_disagree() {
        let s = spec(&["-N", "2", "-n", "3", "--ntasks-per-node", "8", "job.sh"], SCRIPT);
        assert_eq!((s.ntasks, s.ntasks_per_node), (Some(3), Some(8)));
    }

    #[test]
    fn gres_forms() {
        let g = |v: &str| {
            let s = spec(&["--gres", v, "job.sh"], SCRIPT);
            (s.gpus_per_node, s.gpu_type)
        };
        assert_eq!(g("gpu"), (1, None));
        assert_eq!(g("gpu:4"), (4, None));
        assert_eq!(g("gpu:0"), (0, None));
        assert_eq!(g("gpu:a100:2"), (2, Some("a100".into())));
        assert_eq!(g("gpu:h100"), (1, Some("h100".into())));
        assert_eq!(g("none"), (0, None));
        assert_eq!(g("gpu:nvidia_h100-80gb:8"), (8, Some("nvidia_h100-80gb".into())));
    }

    #[test]
    fn gres_errors_name_the_problem() {
        let msg = cmd_err(&["--gres=gpu:2,nic:1"]);
        assert!(msg.starts_with("invalid --gres value \"gpu:2,nic:1\""), "{msg}");
        assert!(msg.contains("not \"nic\""), "{msg}");
        let msg = cmd_err(&["--gres=mps:100"]);
        assert!(msg.contains("not \"mps\""), "{msg}");
        let msg = cmd_err(&["--gres=gpu:1,gpu:2"]);
        assert!(msg.contains("more than once"), "{msg}");
        for bad in ["gpu:", "gpu:a:b", "gpu:1:2:3", "gpu:a100:", "gpu:a100:-1", "gpu:,", ",gpu", "GPU:1"] {
            let msg = cmd_err(&["--gres", bad]);
            assert!(msg.starts_with(&format!("invalid --gres value {bad:?}")), "{bad:?}: {msg}");
        }
    }

    #[test]
    fn gpus_per_node_forms() {
        let s = spec(&["--gpus-per-node=4", "job.sh"], SCRIPT);
        assert_eq!((s.gpus_per_node, s.gpu_type), (4, None));
        let s = spec(&["--gpus-per-node", "a100:2", "job.sh"], SCRIPT);
        assert_eq!((s.gpus_per_node, s.gpu_type.as_deref()), (2, Some("a100")));
        for bad in ["four", "a100", "a100:", ":2", "a b:2", "-1"] {
            let msg = cmd_err(&["--gpus-per-node", bad]);
            assert_eq!(msg, format!("invalid --gpus-per-node value {bad:?}: expected COUNT or TYPE:COUNT"));
        }
    }

    #[test]
    fn gres_and_gpus_per_node_last_wins() {
        let s = spec(&["--gres=gpu:a100:2", "--gpus-per-node=8", "job.sh"], SCRIPT);
        assert_eq!((s.gpus_per_node, s.gpu_type), (8, None));
        let s = spec(&["--gpus-per-node=8", "--gres=gpu:a100:2", "job.sh"], SCRIPT);
        assert_eq!((s.gpus_per_node, s.gpu_type.as_deref()), (2, Some("a100")));
    }

    // ---- --gpus and --gpus-per-task ----

    fn gpus_of(list: &[&str]) -> (u32, Option<String>, Option<u32>, Option<u32>) {
        let mut full = list.to_vec();
        full.push("job.sh");
        let s = spec(&full, SCRIPT);
        (s.gpus_per_node, s.gpu_type, s.gpus_total, s.gpus_per_task)
    }

    fn build_err(list: &[&str], script: &str) -> SbatchError {
        submit(list, Some(script)).expect_err("should fail")
    }

    #[test]
    fn gpus_total_with_and_without_nodes() {
        assert_eq!(gpus_of(&["--gpus=8"]), (0, None, Some(8), None));
        assert_eq!(gpus_of(&["-G", "h100:16"]), (0, Some("h100".into()), Some(16), None));
        assert_eq!(gpus_of(&["-N", "2", "--gpus=8"]), (4, None, None, None));
        assert_eq!(gpus_of(&["--gpus=8", "-N", "2"]), (4, None, None, None));
        assert_eq!(gpus_of(&["-N", "1", "-G8"]), (8, None, None, None));
        // A node range leaves the spread to the controller.
        assert_eq!(gpus_of(&["-N", "1-2", "--gpus=8"]), (0, None, Some(8), None));
        // --nodes in a directive counts too.
        let s = spec(&["--gpus=a100:6", "job.sh"], "#!/bin/sh\n#SBATCH -N 3\n");
        assert_eq!((s.gpus_per_node, s.gpu_type.as_deref(), s.gpus_total), (2, Some("a100"), None));
        assert_eq!(gpus_of(&["--gpus=0"]), (0, None, None, None));
    }

    #[test]
    fn gpus_total_must_divide_evenly() {
        let err = build_err(&["-N", "2", "--gpus=5", "job.sh"], SCRIPT);
        assert_eq!(
            err,
            SbatchError::Conflict("--gpus=5 cannot be spread evenly over 2 nodes; use --gpus-per-node".into())
        );
        assert_eq!(err.to_string(), "--gpus=5 cannot be spread evenly over 2 nodes; use --gpus-per-node");
        let err = build_err(&["job.sh"], "#!/bin/sh\n#SBATCH -N 4\n#SBATCH -G a100:6\n");
        assert_eq!(err.to_string(), "--gpus=6 cannot be spread evenly over 4 nodes; use --gpus-per-node");
    }

    #[test]
    fn gpus_per_task() {
        assert_eq!(gpus_of(&["-n", "4", "--gpus-per-task=1"]), (4, None, None, Some(1)));
        assert_eq!(gpus_of(&["--gpus-per-task=h100:2", "-n", "3"]), (6, Some("h100".into()), None, Some(2)));
        // Block distribution: 5 tasks on 2 nodes is 3 + 2, so each node needs room for 3.
        assert_eq!(gpus_of(&["-N", "2", "-n", "5", "--gpus-per-task=2"]), (6, None, None, Some(2)));
        assert_eq!(gpus_of(&["-N", "2", "--ntasks-per-node=4", "--gpus-per-task=1"]), (4, None, None, Some(1)));
        let s = spec(&["--gpus-per-task=1", "job.sh"], "#!/bin/sh\n#SBATCH --ntasks=2\n");
        assert_eq!((s.gpus_per_node, s.gpus_per_task), (2, Some(1)));
        let err = build_err(&["--gpus-per-task=1", "job.sh"], SCRIPT);
        assert_eq!(err.to_string(), "--gpus-per-task=1 requires a task count: give --ntasks or --ntasks-per-node");
        let err = build_err(&["-n", "2", "--gpus-per-task=4294967295", "job.sh"], SCRIPT);
        assert!(err.to_string().contains("too many GPUs"), "{err}");
        for bad in ["x", "a100:", ":1", "-1"] {
            let msg = cmd_err(&["--gpus-per-task", bad]);
            assert_eq!(msg, format!("invalid --gpus-per-task value {bad:?}: expected COUNT or TYPE:COUNT"));
            let msg = cmd_err(&["-G", bad]);
            assert_eq!(msg, format!("invalid -G value {bad:?}: expected COUNT or TYPE:COUNT"));
        }
    }

    /// `--gpus-per-task` with a huge `--nodes` once listed the tasks of every node to find the busiest one: a
    /// 16 GiB allocation (an abort) for `-N 4294967295`. The busiest node is now computed.
    #[test]
    fn gpus_per_task_with_huge_node_counts_does_not_list_every_node() {
        let n = u32::MAX.to_string();
        let s = spec(&["-N", &n, "--ntasks-per-node=3", "--gpus-per-task=2", "job.sh"], SCRIPT);
        assert_eq!((s.gpus_per_node, s.gpus_per_task), (6, Some(2)));
        let s = spec(&["-N", &n, "-n", "5", "--gpus-per-task=2", "job.sh"], SCRIPT);
        assert_eq!(s.gpus_per_node, 2);
        let s = spec(&["-N", &format!("1-{n}"), "-n", &n, "--gpus-per-task=1", "job.sh"], SCRIPT);
        assert_eq!(s.gpus_per_node, u32::MAX);
        assert!(matches!(
            build_err(&["-N", "2", "-n", &n, "--gpus-per-task=2"], SCRIPT),
            SbatchError::Conflict(msg) if msg.contains("too many GPUs")
        ));
    }

    /// The computed busiest node matches the listed distribution.
    #[test]
    fn most_tasks_on_a_node_matches_the_distribution() {
        for nodes in 0..6 {
            for ntasks in [None, Some(1), Some(4), Some(7), Some(13)] {
                for per_node in [None, Some(1), Some(3)] {
                    let spec = JobSpec {
                        min_nodes: nodes,
                        max_nodes: nodes,
                        ntasks,
                        ntasks_per_node: per_node,
                        ..JobSpec::default()
                    };
                    let listed = spec.tasks_per_node(spec.min_nodes).into_iter().max().unwrap_or(1);
                    assert_eq!(most_tasks_on_a_node(&spec), listed, "{nodes} {ntasks:?} {per_node:?}");
                }
            }
        }
    }

    #[test]
    fn last_gpu_option_wins() {
        assert_eq!(gpus_of(&["--gpus=8", "--gpus-per-node=2"]), (2, None, None, None));
        assert_eq!(gpus_of(&["--gpus-per-node=a100:2", "--gpus=4"]), (0, None, Some(4), None));
        assert_eq!(
            gpus_of(&["-n", "4", "--gpus-per-task=1", "--gres=gpu:v100:2"]),
            (2, Some("v100".into()), None, None)
        );
        assert_eq!(gpus_of(&["-n", "4", "--gres=gpu:2", "--gpus-per-task=1"]), (4, None, None, Some(1)));
        assert_eq!(gpus_of(&["-N", "2", "-n", "2", "--gpus-per-task=1", "--gpus=6"]), (3, None, None, None));
        // The command line's option beats a directive's, whatever their kinds.
        let s = spec(&["--gpus-per-node=1", "job.sh"], "#!/bin/sh\n#SBATCH --gpus=8\n");
        assert_eq!((s.gpus_per_node, s.gpus_total), (1, None));
        // An overridden --gpus-per-task no longer needs a task count.
        assert_eq!(gpus_of(&["--gpus-per-task=1", "--gres=none"]), (0, None, None, None));
    }

    // ---- --array, --dependency, --qos, --reservation, --nice ----

    #[test]
    fn array_values_and_errors() {
        let s = spec(&["--array=0-15:4%2", "job.sh"], SCRIPT);
        assert_eq!(s.array, Some(ArraySpec { task_ids: vec![0, 4, 8, 12], max_running: Some(2) }));
        let s = spec(&["-a", "7,1-2,2", "job.sh"], SCRIPT);
        assert_eq!(s.array.unwrap().task_ids, vec![1, 2, 7]);
        assert_eq!(spec(&["-a1000", "job.sh"], SCRIPT).array.unwrap().task_ids, vec![1000]);
        assert_eq!(spec(&["-Ha", "3", "job.sh"], SCRIPT).array.unwrap().task_ids, vec![3]);
        assert_eq!(cmd_err(&["-a", "5-1"]), "invalid -a value \"5-1\": range end 1 is below its start 5");
        assert_eq!(
            cmd_err(&["--array=0-1001"]),
            "invalid --array value \"0-1001\": task id 1001 is not below MaxArraySize 1001"
        );
        assert!(cmd_err(&["--array=1-3%0"]).contains("%0 would let no task run"));
        assert!(cmd_err(&["--array=1,,3"]).contains("an entry is empty"));
        assert_eq!(cmd_err(&["--array="]), "invalid --array value \"\": the value is empty");
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --array=1-3\n");
        assert_eq!(s.array.unwrap().task_ids, vec![1, 2, 3]);
        // Later wins entirely.
        let s = spec(&["--array=1-3%1", "--array=5", "job.sh"], SCRIPT);
        assert_eq!(s.array, Some(ArraySpec { task_ids: vec![5], max_running: None }));
        let err = script_err("#!/bin/sh\n#SBATCH -a 3-2\n");
        assert_eq!(
            err.to_string(),
            "script line 2: invalid -a value \"3-2\": range end 2 is below its start 3 (in \"#SBATCH -a 3-2\")"
        );
    }

    #[test]
    fn dependency_values_and_errors() {
        use DependencyKind::*;
        let d = |kind, job, task| Dependency { kind, job, task };
        let s = spec(&["--dependency=afterok:12:13,afterany:5_3,singleton", "job.sh"], SCRIPT);
        assert_eq!(
            s.dependency,
            vec![d(AfterOk, 12, None), d(AfterOk, 13, None), d(AfterAny, 5, Some(3)), d(Singleton, 0, None)]
        );
        assert!(!s.dependency_any);
        let s = spec(&["-d", "afterok:1?afternotok:2", "job.sh"], SCRIPT);
        assert_eq!((s.dependency, s.dependency_any), (vec![d(AfterOk, 1, None), d(AfterNotOk, 2, None)], true));
        // Later wins entirely, the any flag included.
        let s = spec(&["-d", "after:1?after:2", "-d", "after:3", "job.sh"], SCRIPT);
        assert_eq!((s.dependency, s.dependency_any), (vec![d(After, 3, None)], false));
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --dependency=singleton\n");
        assert_eq!(s.dependency, vec![d(Singleton, 0, None)]);
        let msg = cmd_err(&["-d", "aftercorr:5"]);
        assert_eq!(
            msg,
            "invalid -d value \"aftercorr:5\": dependency type \"aftercorr\" is not supported; supported: after, \
             afterok, afterany, afternotok, singleton"
        );
        assert!(cmd_err(&["--dependency=after:7+60"]).contains("time delays"));
        assert!(cmd_err(&["--dependency=afterok:1,afterok:2?afterok:3"]).contains("cannot be mixed"));
        assert!(cmd_err(&["--dependency=afterok:0"]).contains("job ids start at 1"));
        assert_eq!(cmd_err(&["--dependency="]), "invalid --dependency value \"\": the value is empty");
    }

    #[test]
    fn qos_and_reservation() {
        let s = spec(&["-q", "low", "--reservation", "r1", "job.sh"], "#!/bin/sh\n#SBATCH --qos=high\n");
        assert_eq!((s.qos.as_deref(), s.reservation.as_deref()), (Some("low"), Some("r1")));
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --qos=high --reservation=maint\n");
        assert_eq!((s.qos.as_deref(), s.reservation.as_deref()), (Some("high"), Some("maint")));
        assert_eq!(cmd_err(&["--qos="]), "invalid --qos value \"\": the value is empty");
        assert_eq!(cmd_err(&["--reservation"]), "option --reservation requires a value");
    }

    #[test]
    fn nice_takes_an_optional_value() {
        assert_eq!(spec(&["--nice", "job.sh"], SCRIPT).nice, 100);
        assert_eq!(spec(&["--nice=50", "job.sh"], SCRIPT).nice, 50);
        assert_eq!(spec(&["--nice=-5", "job.sh"], SCRIPT).nice, -5);
        assert_eq!(spec(&["--nice=+7", "job.sh"], SCRIPT).nice, 7);
        assert_eq!(spec(&["--nice=0", "job.sh"], SCRIPT).nice, 0);
        assert_eq!(spec(&["--nice=2147483645", "job.sh"], SCRIPT).nice, MAX_NICE);
        assert_eq!(spec(&["--nice=-2147483645", "job.sh"], SCRIPT).nice, -MAX_NICE);
        // getopt's optional argument: a separate word is not the value but the next argument (here the script).
        let parsed = submit(&["--nice", "50", "job.sh"], Some(SCRIPT)).unwrap();
        assert_eq!(parsed.spec.nice, 100);
        assert_eq!(parsed.script_path.as_deref(), Some("50"));
        assert_eq!(parsed.spec.script_args, args(&["job.sh"]));
        let cmd = parse_command_line(&args(&["--nice", "-N", "2"])).unwrap();
        assert_eq!(cmd.options, vec![SbatchOption::Nice(100), SbatchOption::Nodes { min: 2, max: 2 }]);
        // Directives.
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --nice\n").nice, 100);
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --nice=-3\n").nice, -3);
        assert_eq!(spec(&["--nice=1", "job.sh"], "#!/bin/sh\n#SBATCH --nice\n").nice, 1);
        let err = script_err("#!/bin/sh\n#SBATCH --nice 5\n");
        assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::UnexpectedArgument { .. }, .. }));
        // Errors.
        let range = "the nice value must lie between -2147483645 and 2147483645";
        assert_eq!(cmd_err(&["--nice=2147483646"]), format!("invalid --nice value \"2147483646\": {range}"));
        assert_eq!(
            cmd_err(&["--nice=-99999999999999999999"]),
            format!("invalid --nice value \"-99999999999999999999\": {range}")
        );
        assert!(cmd_err(&["--nice=-9223372036854775808"]).ends_with(range));
        for bad in ["abc", "1.5", "-", "--1", "5x", " 5"] {
            let msg = cmd_err(&[&format!("--nice={bad}")]);
            let expected = "expected a whole number, optionally negative (e.g. --nice=50)";
            assert_eq!(msg, format!("invalid --nice value {bad:?}: {expected}"));
        }
        assert_eq!(cmd_err(&["--nice="]), "invalid --nice value \"\": the value is empty");
    }

    #[test]
    fn time_values() {
        assert_eq!(spec(&["-t", "30", "job.sh"], SCRIPT).time_limit_s, Some(1800));
        assert_eq!(spec(&["-t", "2-00:00:00", "job.sh"], SCRIPT).time_limit_s, Some(2 * 86_400));
        assert_eq!(spec(&["-t", "UNLIMITED", "job.sh"], SCRIPT).time_limit_s, None);
        let msg = cmd_err(&["--time=2h", "job.sh"]);
        assert!(msg.starts_with("invalid --time value \"2h\": \"2h\" is not a whole number"), "{msg}");
        assert!(msg.contains("days-hours:minutes:seconds"), "{msg}");
    }

    #[test]
    fn chdir_resolution() {
        assert_eq!(spec(&["-D", "/abs", "job.sh"], SCRIPT).work_dir, "/abs");
        assert_eq!(spec(&["-D", "sub/dir", "job.sh"], SCRIPT).work_dir, "/home/alice/work/sub/dir");
        assert_eq!(spec(&["-D", "./sub", "job.sh"], SCRIPT).work_dir, "/home/alice/work/sub");
        assert_eq!(spec(&["-D", ".", "job.sh"], SCRIPT).work_dir, "/home/alice/work");
        assert_eq!(spec(&["-D", "../x", "job.sh"], SCRIPT).work_dir, "/home/alice/work/../x");
        let s = spec(&["--chdir=rel", "job.sh"], SCRIPT);
        assert_eq!(s.submit_dir, "/home/alice/work");
        let mut c = ctx();
        c.cwd = "/".into();
        let cmd = parse_command_line(&args(&["-D", "tmp", "job.sh"])).unwrap();
        assert_eq!(build_spec(&cmd, Some(SCRIPT), &c).unwrap().spec.work_dir, "/tmp");
    }

    // ---- export ----

    #[test]
    fn export_all_and_none() {
        let s = spec(&["--export=ALL", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::All);
        assert_eq!(s.environment, ctx().env);
        let s = spec(&["--export=all", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::All);
        let s = spec(&["--export", "none", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::None);
        assert!(s.environment.is_empty());
    }

    #[test]
    fn export_named_variables() {
        let s = spec(&["--export=HOME,PATH,MISSING", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::Vars { all: false, names: args(&["HOME", "PATH", "MISSING"]) });
        // In the submit environment's order; absent names are skipped.
        assert_eq!(s.environment, vec![("PATH".into(), "/usr/bin:/bin".into()), ("HOME".into(), "/home/alice".into())]);
    }

    #[test]
    fn export_all_with_assignments() {
        let s = spec(&["--export=ALL,HOME=/tmp,NEW=1,LANG", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::Vars { all: true, names: args(&["HOME", "NEW", "LANG"]) });
        assert_eq!(
            s.environment,
            vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/tmp".into()),
                ("LANG".into(), "C.UTF-8".into()),
                ("NEW".into(), "1".into()),
            ]
        );
    }

    #[test]
    fn export_list_with_assignments() {
        let s = spec(&["--export=PATH,FOO=bar,EMPTY=", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::Vars { all: false, names: args(&["PATH", "FOO", "EMPTY"]) });
        assert_eq!(
            s.environment,
            vec![("PATH".into(), "/usr/bin:/bin".into()), ("FOO".into(), "bar".into()), ("EMPTY".into(), "".into()),]
        );
    }

    #[test]
    fn export_quoted_values_may_hold_commas() {
        let s = spec(&["--export=ALL,LIST='a,b',X=\"c d\"", "job.sh"], SCRIPT);
        let env = s.environment;
        assert!(env.contains(&("LIST".into(), "a,b".into())), "{env:?}");
        assert!(env.contains(&("X".into(), "c d".into())), "{env:?}");
    }

    #[test]
    fn export_errors() {
        let msg = cmd_err(&["--export=NONE,FOO"]);
        assert!(msg.contains("NONE cannot be combined"), "{msg}");
        assert!(cmd_err(&["--export="]).contains("the value is empty"));
        assert!(cmd_err(&["--export=,"]).contains("expected ALL, NONE"));
        assert!(cmd_err(&["--export==x"]).contains("is not a variable name"));
        assert!(cmd_err(&["--export=A B"]).contains("is not a variable name"));
        assert!(cmd_err(&["--export=X='a"]).contains("unmatched ' quote"));
    }

    #[test]
    fn last_export_wins_entirely() {
        let s = spec(&["--export=ALL,FOO=1", "--export=HOME", "job.sh"], SCRIPT);
        assert_eq!(s.environment, vec![("HOME".into(), "/home/alice".into())]);
    }

    // ---- script args and positional handling ----

    #[test]
    fn everything_after_the_script_is_script_args() {
        let parsed = submit(&["-N", "2", "job.sh", "--nodes=9", "-J", "x", "plain"], Some(SCRIPT)).unwrap();
        assert_eq!(parsed.spec.script_args, args(&["--nodes=9", "-J", "x", "plain"]));
        assert_eq!(parsed.spec.min_nodes, 2);
        assert_eq!(parsed.spec.name, "job.sh");
    }

    #[test]
    fn double_dash_ends_options() {
        let cmd = parse_command_line(&args(&["-N", "2", "--", "-weird.sh", "a"])).unwrap();
        assert_eq!(cmd.script_path.as_deref(), Some("-weird.sh"));
        assert_eq!(cmd.script_args, args(&["a"]));
        let cmd = parse_command_line(&args(&["--"])).unwrap();
        assert_eq!(cmd.script_path, None);
    }

    #[test]
    fn lone_dash_is_a_positional() {
        let cmd = parse_command_line(&args(&["-"])).unwrap();
        assert_eq!(cmd.script_path.as_deref(), Some("-"));
    }

    // ---- command-line errors ----

    #[test]
    fn unknown_options() {
        let msg = cmd_err(&["--mem=4G", "job.sh"]);
        assert!(msg.starts_with("unrecognized option \"--mem\"; supported options: --job-name/-J,"), "{msg}");
        assert!(msg.contains("--gpus-per-node"), "{msg}");
        for listed in ["--array/-a", "--dependency/-d", "--qos/-q", "--reservation", "--nice", "--gpus/-G"] {
            assert!(msg.contains(listed), "{listed}: {msg}");
        }
        assert!(msg.contains("--gpus-per-task"), "{msg}");
        assert!(!msg.contains("mail-type"), "{msg}");
        assert!(cmd_err(&["-Z", "job.sh"]).starts_with("unrecognized option \"-Z\""));
        assert!(cmd_err(&["-HX"]).starts_with("unrecognized option \"-X\""));
        // No abbreviations.
        assert!(cmd_err(&["--part=gpu"]).starts_with("unrecognized option \"--part\""));
    }

    #[test]
    fn missing_values() {
        assert_eq!(cmd_err(&["--nodes"]), "option --nodes requires a value");
        assert_eq!(cmd_err(&["-N"]), "option -N requires a value");
        assert_eq!(cmd_err(&["-H", "-J"]), "option -J requires a value");
        assert_eq!(cmd_err(&["--wrap"]), "option --wrap requires a value");
        assert_eq!(cmd_err(&["--job-name="]), "invalid --job-name value \"\": the value is empty");
    }

    #[test]
    fn unexpected_values() {
        assert_eq!(cmd_err(&["--hold=yes"]), "option --hold takes no value, but was given \"yes\"");
        assert!(cmd_err(&["--parsable=1"]).contains("--parsable takes no value"));
    }

    // ---- --wrap ----

    #[test]
    fn wrap_generates_the_script() {
        let parsed = submit(&["--wrap=srun hostname", "-N", "2"], None).unwrap();
        assert_eq!(parsed.spec.script, "#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsrun hostname\n");
        assert_eq!(parsed.spec.name, "wrap");
        assert_eq!(parsed.spec.min_nodes, 2);
        assert_eq!(parsed.script_path, None);
        let parsed = submit(&["--wrap", "echo a; echo b", "-J", "named"], None).unwrap();
        assert_eq!(parsed.spec.name, "named");
        assert!(parsed.spec.script.contains("\necho a; echo b\n"));
    }

    #[test]
    fn wrap_ignores_script_text() {
        let parsed = submit(&["--wrap=true"], Some("#!/bin/sh\n#SBATCH -N 5\n")).unwrap();
        assert_eq!(parsed.spec.min_nodes, 1);
        assert_eq!(parsed.spec.script, wrap_script("true"));
    }

    #[test]
    fn wrap_with_a_script_is_an_error() {
        let err = parse_command_line(&args(&["--wrap=ls", "job.sh"])).unwrap_err();
        assert_eq!(err, SbatchError::WrapWithScript { arg: "job.sh".into() });
        assert!(err.to_string().contains("not permitted with --wrap"));
        assert!(cmd_err(&["--wrap=", "x"]).contains("expected a command to run"));
    }

    // ---- directives ----

    #[test]
    fn directives_apply() {
        let script = "#!/bin/bash\n#SBATCH --job-name=fromscript\n#SBATCH -N 2-3\n#SBATCH -p gpu --gres=gpu:a100:4\n\
                      #SBATCH --time=10 --hold\n#SBATCH --export=NONE\nsrun x\n";
        let s = spec(&["job.sh"], script);
        assert_eq!(s.name, "fromscript");
        assert_eq!((s.min_nodes, s.max_nodes), (2, 3));
        assert_eq!(s.partition.as_deref(), Some("gpu"));
        assert_eq!((s.gpus_per_node, s.gpu_type.as_deref()), (4, Some("a100")));
        assert_eq!(s.time_limit_s, Some(600));
        assert!(s.hold);
        assert!(s.environment.is_empty());
        assert_eq!(s.script, script);
    }

    #[test]
    fn command_line_overrides_directives() {
        let script = "#!/bin/bash\n#SBATCH -J fromscript\n#SBATCH -N 2-3\n#SBATCH -t 10\n#SBATCH -p a\n";
        let s = spec(&["-N", "5", "--job-name=cli", "job.sh"], script);
        assert_eq!(s.name, "cli");
        assert_eq!((s.min_nodes, s.max_nodes), (5, 5));
        // Not overridden: the directive stays.
        assert_eq!(s.time_limit_s, Some(600));
        assert_eq!(s.partition.as_deref(), Some("a"));
    }

    #[test]
    fn later_directives_override_earlier_ones() {
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH -N 2\n#SBATCH -N 4\n");
        assert_eq!(s.min_nodes, 4);
    }

    #[test]
    fn parsable_in_a_directive() {
        let parsed = submit(&["job.sh"], Some("#!/bin/sh\n#SBATCH --parsable\n")).unwrap();
        assert!(parsed.parsable);
    }

    #[test]
    fn directives_stop_at_first_command() {
        let script = "#!/bin/bash\n\n# a comment\n   # indented comment\n#SBATCH -N 2\n\t\n\
                      module load cuda\n#SBATCH -N 7\n#SBATCH --bogus\n";
        assert_eq!(spec(&["job.sh"], script).min_nodes, 2);
    }

    #[test]
    fn only_column_zero_sbatch_counts() {
        let script = "#!/bin/bash\n  #SBATCH -N 3\n# SBATCH -N 4\n#sbatch -N 5\n##SBATCH -N 6\n";
        assert_eq!(spec(&["job.sh"], script).min_nodes, 1);
    }

    #[test]
    fn directive_words_quotes_escapes_and_comments() {
        let script = "#!/bin/bash\n#SBATCH -J \"my job\" -N 2 # two nodes\n#SBATCH --comment='a # b'\n\
                      #SBATCH -o out\\ file#x\n#SBATCH --job-name='x y'z\n";
        let s = spec(&["job.sh"], script);
        assert_eq!(s.name, "x yz");
        assert_eq!(s.min_nodes, 2);
        assert_eq!(s.stdout.as_deref(), Some("out file"));
        assert_eq!(directive_words(" -J \"a b\"  -N 2").unwrap(), args(&["-J", "a b", "-N", "2"]));
        assert_eq!(directive_words("").unwrap(), Vec::<String>::new());
        assert_eq!(directive_words("  # only a comment").unwrap(), Vec::<String>::new());
        assert_eq!(directive_words("-J ''").unwrap(), args(&["-J", ""]));
    }

    #[test]
    fn empty_directive_is_fine() {
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH\n#SBATCH   \n#SBATCH -N 2\n").min_nodes, 2);
    }

    #[test]
    fn directive_errors_name_line_and_text() {
        let err = script_err("#!/bin/bash\n#SBATCH -J ok\n#SBATCH --nodes=two\necho\n");
        assert_eq!(
            err.to_string(),
            "script line 3: invalid --nodes value \"two\": expected a number or MIN-MAX (in \"#SBATCH --nodes=two\")"
        );
        let err = script_err("#!/bin/bash\n\n#SBATCH --mem=4G\n");
        assert!(err.to_string().starts_with("script line 3: unrecognized option \"--mem\""), "{err}");
        assert!(err.to_string().ends_with("(in \"#SBATCH --mem=4G\")"), "{err}");
        let err = script_err("#!/bin/bash\n#SBATCH -N\n");
        assert_eq!(err.to_string(), "script line 2: option -N requires a value (in \"#SBATCH -N\")");
        let err = script_err("#!/bin/bash\n#SBATCH -J \"open\n");
        assert_eq!(err.to_string(), "script line 2: unmatched \" quote (in \"#SBATCH -J \\\"open\")");
        let err = script_err("#!/bin/bash\n#SBATCH -N 2 extra\n");
        assert_eq!(
            err,
            SbatchError::Directive {
                line: 2,
                text: "#SBATCH -N 2 extra".into(),
                error: OptionError::UnexpectedArgument { arg: "extra".into() }
            }
        );
        let err = script_err("#!/bin/bash\n#SBATCH --wrap=ls\n");
        assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::WrapInScript, .. }));
        let err = script_err("#!/bin/bash\n#SBATCH -- x\n");
        assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::UnexpectedArgument { .. }, .. }));
        let err = script_err("#!/bin/bash\n#SBATCH -t 2h\n");
        assert!(err.to_string().starts_with("script line 2: invalid -t value \"2h\""), "{err}");
    }

    #[test]
    fn directive_errors_even_when_command_line_overrides() {
        // Slurm parses every directive, so a broken one fails even if the command line sets the same option.
        let cmd = parse_command_line(&args(&["-N", "2", "job.sh"])).unwrap();
        let err = build_spec(&cmd, Some("#!/bin/sh\n#SBATCH -N x\n"), &ctx()).unwrap_err();
        assert!(matches!(err, SbatchError::Directive { line: 2, .. }));
    }

    // ---- script checks ----

    #[test]
    fn script_must_start_with_shebang() {
        let err = script_err("echo hi\n");
        assert_eq!(err, SbatchError::NotABatchScript);
        assert!(err.to_string().starts_with(
            "This does not look like a batch script.  The first line must start with #! followed by the path to \
             an interpreter."
        ));
        assert_eq!(script_err(" #!/bin/sh\n"), SbatchError::NotABatchScript);
        assert_eq!(script_err("#SBATCH -N 2\n#!/bin/sh\n"), SbatchError::NotABatchScript);
    }

    #[test]
    fn empty_and_blank_scripts() {
        assert_eq!(script_err(""), SbatchError::EmptyScript);
        assert_eq!(script_err(" \n\t\n"), SbatchError::WhitespaceScript);
    }

    #[test]
    fn dos_line_breaks() {
        let err = script_err("#!/bin/sh\n#SBATCH -N 2\r\necho\r\n");
        assert_eq!(err, SbatchError::DosLineBreaks { line: 2 });
        assert!(err.to_string().contains("dos2unix"));
    }

    #[test]
    fn script_size_limit() {
        let mut big = String::from("#!/bin/sh\n");
        big.push_str(&"#".repeat(MAX_SCRIPT_BYTES - big.len()));
        assert_eq!(big.len(), MAX_SCRIPT_BYTES);
        let cmd = parse_command_line(&args(&["job.sh"])).unwrap();
        assert!(build_spec(&cmd, Some(&big), &ctx()).is_ok());
        big.push('\n');
        let err = build_spec(&cmd, Some(&big), &ctx()).unwrap_err();
        assert_eq!(err, SbatchError::ScriptTooLarge { size: MAX_SCRIPT_BYTES + 1, limit: MAX_SCRIPT_BYTES });
        assert_eq!(err.to_string(), "batch script is 4194305 bytes, over the limit of 4194304 bytes (4 MiB)");
        // --wrap is held to the same limit.
        let huge = "x".repeat(MAX_SCRIPT_BYTES);
        let cmd = parse_command_line(&[format!("--wrap={huge}")]).unwrap();
        assert!(matches!(build_spec(&cmd, None, &ctx()), Err(SbatchError::ScriptTooLarge { .. })));
    }

    #[test]
    fn script_without_trailing_newline() {
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH -N 3");
        assert_eq!(s.min_nodes, 3);
    }

    #[test]
    fn shebang_only_script() {
        let s = spec(&["job.sh"], "#!/bin/sh");
        assert_eq!(s.script, "#!/bin/sh");
    }
}
