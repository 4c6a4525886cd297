//! `sbatch`'s command line, `#SBATCH` directives and `SBATCH_*` input environment variables, turned into a
//! [`JobSpec`], as Slurm 22.05's `sbatch` reads them.
//!
//! Pure: no I/O, no environment reads, no clock. The caller passes the environment, the time and the local UTC
//! offset in a [`SubmitContext`]. Submission happens in two steps, because the script file can only be read once
//! its path is known:
//!
//! 1. [`parse_command_line`] parses the arguments (without `argv[0]`) into a [`CommandLine`]: the options, checked
//!    and in order, then the script path and the script's own arguments. As with Slurm, option parsing stops at
//!    the first non-option argument (the script); everything after it belongs to the script.
//! 2. The caller reads the script (from the path, or stdin when there is none), then [`build_spec`] applies the
//!    script's `#SBATCH` directives, then the `SBATCH_*` environment variables, then the command-line options:
//!    the command line wins over the environment, the environment over the script (Slurm's order).
//!
//! Options are matched as `getopt_long` does: `--name=value` or `--name value`, `-Xvalue` or `-X value`, value-less
//! short flags may be bundled (`-HJname`), `--` ends the options. An optional value (`--nice`, `--exclusive`,
//! `--no-kill`, `--get-user-env`, `--propagate`) is taken only when attached (`--nice=5`); `--nice 5` leaves `5`
//! as the next argument. Long names must be spelled out in full (no abbreviations).
//!
//! Which options Drover acts on, which it accepts with a warning that says why they change nothing, and which it
//! refuses (because ignoring them would run the job differently from what was asked) is declared per option in
//! [`options`]'s table, with the input variables that stand for each; `sbatch --help` lists the first kind.
//! `--parsable`, `--quiet/-Q` and `--wrap` act on the command line only, as in Slurm: a `#SBATCH -Q` does nothing
//! and a `#SBATCH --wrap` is an error.
//!
//! Drover's own: `--multi-site` (also `SBATCH_MULTI_SITE`), letting a multi-node job span sites (the nodes'
//! `site` topology label); without it all of a job's nodes are on one site.
//!
//! `--nice` alone means 100; N may be negative (the controller allows that to root only) and lies within
//! ±2147483645.
//!
//! GPUs: the last of `--gres`, `--gpus-per-node`, `--gpus` and `--gpus-per-task` given wins entirely (count and
//! type), and is resolved once all options are applied. `--gpus=N` with a fixed `--nodes` count becomes
//! N / nodes per node (it must divide evenly); without one it is left to the controller as `gpus_total`.
//! `--gpus-per-task=N` needs `--ntasks` or `--ntasks-per-node` and gives each node N times the most tasks any node
//! gets. A count of 0 means no GPUs.
//!
//! Per-GPU counts are folded in after that, as Slurm's `cons_tres` works them out:
//! - `--ntasks-per-gpu=N` with GPUs asked for makes N tasks per GPU: N x GPUs per node tasks on each node (an
//!   `--ntasks` is replaced by that total, as Slurm does, with a warning); with a job total (`--gpus` and no fixed
//!   `--nodes`) the task count is N x the total. Without GPUs it asks for `--ntasks` / N GPUs (or one per node
//!   when only `--nodes` is given); `--ntasks` must then be a multiple of N. It cannot be combined with
//!   `--ntasks-per-node`, `--gpus-per-task` or a node range.
//! - `--cpus-per-gpu=N` gives each node N x its GPUs CPUs, shared by the node's tasks: `cpus_per_task` becomes
//!   N x GPUs per node / the most tasks on a node, rounded up (for a job total not yet spread over nodes, N x the
//!   total / `--ntasks`, or / the tasks on one node). It excludes `--cpus-per-task`, and has no effect (a
//!   warning) without GPUs.
//!
//! Memory: `--mem`, `--mem-per-cpu` and `--mem-per-gpu` take `SIZE[K|M|G|T][B]` in any case, MiB when no unit is
//! given; `K` rounds up to whole MiB. `--mem=0` asks for all of each node's memory. As in Slurm they exclude one
//! another: two different ones in the script or on the command line (together) are an error; one given there
//! overrides any `SBATCH_MEM_*` variable; two different `SBATCH_MEM_*` variables are an error. `--mem-per-gpu`
//! needs GPUs. A size over 2^63 - 1 MiB is refused.
//!
//! Times: `--time-min` takes `--time`'s formats and may not exceed `--time`. `--begin` and `--deadline` take
//! Slurm's `parse_time` forms, in the submitter's local time (its UTC offset at submission: a daylight-saving
//! change before the time is not accounted for): `HH:MM[:SS] [AM|PM]`, `midnight`, `noon`, `fika` (15:00),
//! `teatime` (16:00), `today`, `tomorrow`, `MMDD[YY]`, `MM/DD[/YY]`, `MM.DD[.YY]`, `YYYY-MM-DD[THH:MM[:SS]]`,
//! a date and a time together (`MM/DD-HH:MM`, `tomorrow 10:00`), `now[{+|-}COUNT[seconds|minutes|hours|days|
//! weeks]]` (singular units too; seconds by default), and `uts<epoch seconds>`. A time of day not after the
//! current minute means tomorrow; a date without a year not after now means next year; a date alone means its
//! midnight. A `--deadline` before the `--begin` is an error.
//!
//! Input environment variables: sbatch 22.05's list, applied in its order ([`env_options`] lists them). Slurm
//! has no `SBATCH_TIME_MIN`, `SBATCH_CPUS_PER_TASK` or `SBATCH_KILL_ON_INVALID_DEP`. A flag variable
//! (`SBATCH_REQUEUE`) is on when empty, `yes` or a non-zero number, and otherwise has no effect; an empty
//! variable for an option that needs a value is skipped. Only `sbatch` reads them ([`SubmitContext::sbatch_env`]).
//!
//! Directives: only lines starting exactly with `#SBATCH` (or the old `#SLURM`, with a warning) count, and they
//! are read until the first command: a line whose first non-blank character is not `#`. Blank lines and comments
//! do not stop them. Words are split as Slurm does (quotes group, a backslash escapes, an unquoted `#` starts a
//! comment), but each line is parsed on its own, so an option's value cannot continue on the next line.
//!
//! Error messages carry no `sbatch: error: ` prefix; print them as `sbatch: error: {err}`, and the warnings of
//! [`ParsedSubmit::warnings`] as `sbatch: warning: {warning}` (unless `--quiet`).

//! The parser's parts: [`options`] declares every option (names, variables, value, effect) in one table;
//! `getopt` reads arguments against the table; `values` checks values; `script` reads the script's directives;
//! `resolve` builds the job from the options once all are read.

use drover_state::job::JobSpec;

mod getopt;
mod options;
mod resolve;
mod script;
mod values;

pub use options::{Exclusive, SbatchOption, env_options};
pub use resolve::ContainerOption;
pub use script::wrap_script;

/// Whether `arg` is an sbatch-style option whose value is the next argument (`-N 2`, `--nodes 2`): a launcher
/// that picks its own options out of a command line (srun) must step over that value, not take it for the start
/// of the command.
pub fn takes_next_value(arg: &str) -> bool {
    let def = if let Some(long) = arg.strip_prefix("--") {
        if long.contains('=') {
            return false;
        }
        options::find_long(long)
    } else {
        let mut chars = arg.strip_prefix('-').unwrap_or_default().chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => options::find_short(c),
            _ => None,
        }
    };
    def.is_some_and(|d| matches!(d.takes.arg(), options::Arg::Required))
}

use getopt::{environment_options, parse_args};
use options::Item;
use options::SupportedOptions;
use resolve::{Draft, Source};
use script::{check_script, script_directives};
#[cfg(test)]
use {resolve::most_tasks_on_a_node, script::directive_words};

/// The `MaxArraySize` `sbatch` checks `--array` against (Slurm's default); the controller enforces its own too.
pub const MAX_ARRAY_SIZE: u32 = 1001;

/// `--nice` without a value (Slurm's default adjustment).
pub const DEFAULT_NICE: i32 = 100;

/// The largest `--nice` adjustment either way (Slurm's `NICE_OFFSET - 3`).
pub const MAX_NICE: i32 = 2_147_483_645;

/// The largest batch script accepted (Slurm's default `max_script_size`).
pub const MAX_SCRIPT_BYTES: usize = 4 * 1024 * 1024;

/// The largest memory size accepted, in MiB: Slurm keeps sizes in a signed 64-bit count (and flags the top bit).
pub const MAX_MEM_MB: u64 = i64::MAX as u64;

/// Who submits, from where, with which environment, and when: everything the parser would otherwise read from
/// the process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubmitContext {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    /// The directory `sbatch` runs in (absolute).
    pub cwd: String,
    /// The submitting process's environment, in order.
    pub env: Vec<(String, String)>,
    /// The time of submission, in milliseconds since the epoch (`--begin=now+1hour`, `--begin=16:00`).
    pub now_ms: u64,
    /// The submitter's local time minus UTC at `now_ms`, in seconds (`--begin=16:00` is 16:00 local time).
    pub utc_offset_s: i32,
    /// Whether the `SBATCH_*` input environment variables apply: true for `sbatch`; `srun` (and `salloc`) read
    /// their own variables in Slurm, never these.
    pub sbatch_env: bool,
    /// The submitting host's name and the submitting process's nice value, recorded in the job's environment
    /// whatever `--export` says (`SLURM_SUBMIT_HOST`, `SLURM_PRIO_PROCESS`); `None` records nothing.
    pub submission: Option<(String, i32)>,
}

/// The outcome of [`build_spec`]: the job to submit, and how to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubmit {
    pub spec: JobSpec,
    /// `--parsable` (on the command line or in a directive): print only the job id.
    pub parsable: bool,
    /// `--wait/-W`: sbatch returns once the job (every task of an array) has ended, with its exit code.
    pub wait: bool,
    /// `--quiet/-Q` on the command line: print neither the job id nor the warnings, only errors.
    pub quiet: bool,
    /// The script path from the command line, as given (`None` for `--wrap` or a script read from stdin).
    pub script_path: Option<String>,
    /// One line each, without the `sbatch: warning: ` prefix: options accepted but not acted on, and options
    /// acted on differently from how they were spelled (in the order found, each once).
    pub warnings: Vec<String>,
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
    /// `--quiet/-Q` was given on the command line (the only place Slurm reads it).
    pub quiet: bool,
    /// `--version`, `--help` or `--usage` (the first given): print it and submit nothing.
    pub info: Option<Info>,
}

/// What is wrong with one option (on the command line, in a directive or in an environment variable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unrecognized option {flag:?}; supported options: {}", SupportedOptions)]
    Unknown { flag: String },
    #[error(
        "unrecognized container option {flag:?}; the container options are pyxis's: --container-image, \
         --container-mounts, --container-workdir, --container-name, --container-save, --container-writable, \
         --container-readonly, --[no-]container-mount-home, --[no-]container-remap-root, \
         --[no-]container-entrypoint, --container-env"
    )]
    UnknownContainer { flag: String },
    #[error("option {flag} requires a value")]
    MissingValue { flag: String },
    #[error("option {flag} takes no value, but was given {value:?}")]
    UnexpectedValue { flag: String, value: String },
    #[error("invalid {flag} value {value:?}: {expected}")]
    InvalidValue { flag: String, value: String, expected: String },
    /// An option Slurm has that Drover refuses rather than ignores.
    #[error("{flag}: {reason}")]
    Refused { flag: String, reason: &'static str },
    #[error("unexpected argument {arg:?}: #SBATCH lines may hold only options")]
    UnexpectedArgument { arg: String },
    #[error("heterogeneous jobs (#SBATCH {word}) are not supported; submit the components as separate jobs")]
    HetJob { word: String },
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
    /// A bad `SBATCH_*` input environment variable.
    #[error("environment variable {var}: {error}")]
    Environment { var: String, error: OptionError },
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
    /// A container option that only fails once the job's working directory is known.
    #[error(transparent)]
    Container(#[from] drover_state::container::ContainerError),
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
pub enum Info {
    Version,
    Help,
    Usage,
}

impl Info {
    /// The text, as Slurm prints it for `--version`; a usage line and Drover's options for the others.
    pub fn text(self) -> String {
        match self {
            Info::Version => crate::format::version_line(),
            Info::Usage => "Usage: sbatch [OPTIONS...] script [args...]  (sbatch --help lists the options)".to_string(),
            Info::Help => format!(
                "Usage: sbatch [OPTIONS...] script [args...]\n       sbatch [OPTIONS...] --wrap=COMMAND\n\nOptions Drover acts on: {SupportedOptions}\n\nOther Slurm options are accepted with a warning that says why they change nothing, or refused with the reason."
            ),
        }
    }
}

/// Parses `sbatch`'s arguments (without `argv[0]`).
pub fn parse_command_line(args: &[String]) -> Result<CommandLine, SbatchError> {
    let parsed = parse_args(args)?;
    let mut cmd = CommandLine::default();
    let mut verbose = false;
    for item in parsed.items {
        match item {
            Item::Wrap(command) => cmd.wrap = Some(command),
            Item::Info(info) => {
                cmd.info.get_or_insert(info);
            }
            Item::Option(option) => {
                match &option {
                    SbatchOption::Parsable => cmd.parsable = true,
                    SbatchOption::Quiet => cmd.quiet = true,
                    SbatchOption::Ignored { flag: "verbose", .. } => verbose = true,
                    _ => {}
                }
                cmd.options.push(option);
            }
        }
    }
    if cmd.quiet && verbose {
        return Err(SbatchError::Conflict("don't specify both --verbose (-v) and --quiet (-Q)".to_string()));
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

/// Builds the job: the script's `#SBATCH` directives first, then the `SBATCH_*` environment variables (when
/// [`SubmitContext::sbatch_env`]), then the command line's options over them.
///
/// `script_text` is the script read from `cmd.script_path`, or from stdin when there is none; it is ignored
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
    let mut draft = Draft::new(cmd, ctx);
    let directives = if cmd.wrap.is_some() {
        Vec::new()
    } else {
        let (directives, old_prefix) = script_directives(&script)?;
        draft.warnings.extend(old_prefix);
        directives
    };
    let environment = if ctx.sbatch_env { environment_options(&ctx.env)? } else { Vec::new() };
    let sources = directives
        .iter()
        .map(|o| (Source::Script, o))
        .chain(environment.iter().map(|o| (Source::Environment, o)))
        .chain(cmd.options.iter().map(|o| (Source::CommandLine, o)));
    for (source, option) in sources {
        draft.apply(source, option);
    }
    draft.finish(cmd, ctx, script, default_name)
}

#[cfg(test)]
mod tests;
