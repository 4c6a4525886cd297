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
//! Acted on: `--job-name/-J`, `--partition/-p`, `--account/-A`, `--nodes/-N` (`N` or `MIN-MAX`), `--ntasks/-n`,
//! `--ntasks-per-node` (or `--tasks-per-node`), `--cpus-per-task/-c`, `--gres` (`gpu`, `gpu:N`, `gpu:TYPE`,
//! `gpu:TYPE:N`, `none`), `--gpus-per-node` (`N` or `TYPE:N`), `--gpus/-G` (`N` or `TYPE:N`, the job's total),
//! `--gpus-per-task` (`N` or `TYPE:N`), `--cpus-per-gpu`, `--ntasks-per-gpu`, `--mem`, `--mem-per-cpu`,
//! `--mem-per-gpu`, `--time/-t`, `--time-min`, `--begin/-b`, `--deadline`, `--output/-o`, `--error/-e`,
//! `--chdir/-D`, `--export`, `--open-mode`, `--exclusive[=user|mcs|oversubscribe]`, `--oversubscribe/-s`,
//! `--constraint/-C`, `--nodelist/-w`, `--exclude/-x`, `--array/-a` (`0-15`, `0,6,16-32`, `0-15:4`, with an
//! optional `%N` limit), `--dependency/-d` (`afterok:12:13`, `afterany:5_3`, `after`, `afternotok`,
//! `singleton`; joined by `,` or `?`), `--qos/-q`, `--reservation`, `--nice[=N]`, `--requeue`, `--no-requeue`,
//! `--signal`, `--no-kill/-k[=off]`, `--hold/-H`, `--wckey`, `--comment`, `--parsable`, `--quiet/-Q` and `--wrap`
//! (those two on the command line only, as in Slurm: a `#SBATCH -Q` does nothing and a `#SBATCH --wrap` is an
//! error).
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
//! Accepted with a warning, because Drover does not act on them (their values are dropped): `--acctg-freq`,
//! `--batch`, `--cluster-constraint`, `--context`, `--contiguous`, `--core-spec/-S`, `--cores-per-socket`,
//! `--cpu-freq`, `--delay-boot`, `--distribution/-m`, `--export-file`, `--extra-node-info/-B`,
//! `--get-user-env`, `--gpu-bind`, `--gpu-freq`, `--gres-flags`, `--hint`, `--kill-on-invalid-dep=yes`,
//! `--licenses/-L`, `--mail-type` (not `NONE`), `--mail-user`, `--mcs-label`, `--mem-bind`, `--mincpus`,
//! `--network`, `--ntasks-per-core`, `--ntasks-per-socket`, `--overcommit/-O`, `--power`, `--prefer`,
//! `--priority`, `--profile`, `--propagate`, `--reboot`, `--sockets-per-node`, `--spread-job`, `--switches`,
//! `--thread-spec`, `--threads-per-core`, `--tmp`, `--use-min-nodes`, `--verbose/-v`, `--wait-all-nodes`,
//! `--exclusive=user|mcs` (treated as `--exclusive`) and `--oversubscribe`. Accepted silently because Drover
//! already behaves so: `--ignore-pbs`, `--kill-on-invalid-dep=no`, `--input=/dev/null`, `--clusters=` (empty).
//!
//! Refused with an error, because ignoring them would run the job differently from what was asked: `--uid`,
//! `--gid`, `--wait/-W`, `--test-only`, `--clusters/-M` (unless empty), `--bb`, `--bbf`, `--container`,
//! `--gpus-per-socket`, `--nodefile/-F`, `--input/-i` (other than `/dev/null`).
//!
//! Input environment variables (sbatch 22.05's list, applied in its order): `SBATCH_ACCOUNT`, `SBATCH_ARRAY_INX`,
//! `SBATCH_CONSTRAINT`, `SBATCH_CPUS_PER_GPU`, `SBATCH_ERROR`, `SBATCH_EXCLUSIVE`, `SBATCH_EXPORT`, `SBATCH_GPUS`,
//! `SBATCH_GPUS_PER_NODE`, `SBATCH_GPUS_PER_TASK`, `SBATCH_GRES`, `SBATCH_JOB_NAME`, `SBATCH_MEM_PER_CPU`,
//! `SBATCH_MEM_PER_GPU`, `SBATCH_MEM_PER_NODE`, `SBATCH_NO_KILL`, `SBATCH_NO_REQUEUE`, `SBATCH_OPEN_MODE`,
//! `SBATCH_OUTPUT`, `SBATCH_PARTITION`, `SBATCH_QOS`, `SBATCH_REQUEUE`, `SBATCH_RESERVATION`, `SBATCH_SIGNAL`,
//! `SBATCH_TIMELIMIT`, `SBATCH_WCKEY`, and those standing for the warned and refused options above
//! ([`ENV_OPTIONS`] lists them all). Slurm has no `SBATCH_TIME_MIN` or `SBATCH_CPUS_PER_TASK`. A flag variable
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

use std::fmt;

use drover_state::job::{ArraySpec, Dependency, ExportPolicy, JobSpec, MemRequest};
use drover_state::{array, dependency, slurm_time};

use crate::slurm::time::{ACCEPTED_DATE_FORMATS, TimeSpec, Zone, is_c_space};

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
}

/// The outcome of [`build_spec`]: the job to submit, and how to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubmit {
    pub spec: JobSpec,
    /// `--parsable` (on the command line or in a directive): print only the job id.
    pub parsable: bool,
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

/// One option, its value checked and parsed. Directives, environment variables and command-line options all
/// parse to these.
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
    /// `--cpus-per-gpu`: folded into `cpus_per_task` in [`build_spec`].
    CpusPerGpu(u32),
    /// `--ntasks-per-gpu` (or Slurm's hidden `--ntasks-per-tres`): folded into the task counts in [`build_spec`].
    NtasksPerGpu(u32),
    /// `--mem`, `--mem-per-cpu`, `--mem-per-gpu`, in MiB.
    Mem(MemRequest),
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
    /// `--time-min`: seconds, `None` for UNLIMITED (or 0).
    TimeMin(Option<u64>),
    /// `--begin/-b`: placed in time by [`build_spec`], against [`SubmitContext::now_ms`].
    Begin(TimeSpec),
    /// `--deadline`, likewise.
    Deadline(TimeSpec),
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
    /// `--no-kill/-k` (true), `--no-kill=off` or `=no` (false).
    NoKill(bool),
    /// `--open-mode=append` (true) or `truncate` (false).
    OpenAppend(bool),
    /// `--exclusive[=...]` and `--oversubscribe/-s`.
    Exclusive(Exclusive),
    /// `--constraint`: features all required (`a&b`).
    Constraint(Vec<String>),
    /// `--nodelist` / `--exclude`: expanded host names.
    Nodelist(Vec<String>),
    Exclude(Vec<String>),
    Wckey(String),
    Comment(String),
    Hold,
    /// `--multi-site` (Drover): the job's nodes may be on several sites.
    MultiSite,
    Parsable,
    /// `--quiet/-Q`: acted on from the command line only.
    Quiet,
    /// An option Drover accepts and does not act on; [`build_spec`] drops it and, when `note` is not empty, warns
    /// `--{flag} is ignored: {note}`.
    Ignored {
        /// The long name, without its dashes (`gpu-bind`).
        flag: &'static str,
        value: Option<String>,
        note: &'static str,
    },
}

/// How a job shares its nodes: `--exclusive[=MODE]` and `--oversubscribe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusive {
    /// `--exclusive`: whole nodes, shared with no other job.
    Node,
    /// `--exclusive=user`: Slurm shares the nodes with the same user's jobs only; Drover shares them with none.
    User,
    /// `--exclusive=mcs`: likewise, for jobs of the same MCS label.
    Mcs,
    /// `--exclusive=oversubscribe` or `--oversubscribe/-s`: not exclusive (Drover never oversubscribes).
    Oversubscribe,
}

/// What is wrong with one option (on the command line, in a directive or in an environment variable).
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
    CpusPerGpu,
    NtasksPerGpu,
    Mem,
    MemPerCpu,
    MemPerGpu,
    Array,
    Dependency,
    Qos,
    Reservation,
    Nice,
    Time,
    TimeMin,
    Begin,
    Deadline,
    Output,
    Error,
    Chdir,
    Export,
    OpenMode,
    Exclusive,
    Oversubscribe,
    Constraint,
    Nodelist,
    Exclude,
    Requeue,
    NoRequeue,
    Signal,
    NoKill,
    Hold,
    MultiSite,
    Wckey,
    Comment,
    Parsable,
    Quiet,
    /// `--version/-V`, `--help/-h`, `--usage`: print and exit 0 before anything else, as Slurm's getopt loop does.
    Info(Info),
    Wrap,
    /// `--clusters/-M`: refused unless empty.
    Clusters,
    /// `--input/-i`: refused unless `/dev/null` (where a batch script's stdin already comes from).
    Input,
    /// `--kill-on-invalid-dep=yes|no`: `no` is what Drover does.
    KillOnInvalidDep,
    /// `--mail-type`: `NONE` is what Drover does.
    MailType,
    /// Accepted, not acted on: warns `--long is ignored: {note}` (silent when the note is empty).
    Unused(Arg, &'static str),
    /// Refused: the error says why.
    Refused(Arg, &'static str),
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
            Kind::Requeue
            | Kind::NoRequeue
            | Kind::Hold
            | Kind::MultiSite
            | Kind::Parsable
            | Kind::Quiet
            | Kind::Info(_)
            | Kind::Oversubscribe => Arg::No,
            Kind::Nice | Kind::NoKill | Kind::Exclusive => Arg::Optional,
            Kind::Unused(arg, _) | Kind::Refused(arg, _) => arg,
            _ => Arg::Required,
        }
    }

    /// Listed in the "supported options" of [`OptionError::Unknown`]: the options Drover acts on.
    fn listed(self) -> bool {
        !matches!(
            self,
            Kind::Unused(..)
                | Kind::Refused(..)
                | Kind::Info(_)
                | Kind::Clusters
                | Kind::Input
                | Kind::KillOnInvalidDep
                | Kind::MailType
        )
    }
}

struct OptDef {
    long: &'static str,
    short: Option<char>,
    kind: Kind,
}

const fn opt(long: &'static str, short: Option<char>, kind: Kind) -> OptDef {
    OptDef { long, short, kind }
}

/// Why each accepted-and-ignored option is ignored (the warning's second half).
const PLACEMENT: &str = "Drover places jobs by node, CPU and GPU counts, not sockets, cores or threads";
const NO_REBOOT: &str = "Drover never reboots nodes for a job";
const NO_SWITCHES: &str = "Drover's placement does not count network switches";
const NO_SPEC_CORES: &str = "Drover reserves no cores for system use";

/// Every option of Slurm 22.05's `sbatch` except `--help`, `--usage` and `--version`, in the order of its
/// option table.
const OPTIONS: &[OptDef] = &[
    opt("account", Some('A'), Kind::Account),
    opt("acctg-freq", None, Kind::Unused(Arg::Required, "Drover samples no accounting data")),
    opt("array", Some('a'), Kind::Array),
    opt("batch", None, Kind::Unused(Arg::Required, "the batch script runs on the job's first node")),
    opt("begin", Some('b'), Kind::Begin),
    opt("bb", None, Kind::Refused(Arg::Required, "burst buffers are not supported")),
    opt("bbf", None, Kind::Refused(Arg::Required, "burst buffers are not supported")),
    opt("cluster-constraint", None, Kind::Unused(Arg::Required, "Drover runs a single cluster")),
    opt("chdir", Some('D'), Kind::Chdir),
    opt("cluster", None, Kind::Clusters),
    opt("clusters", Some('M'), Kind::Clusters),
    opt("comment", None, Kind::Comment),
    opt(
        "container",
        None,
        Kind::Refused(
            Arg::Required,
            "OCI containers are not supported; start the container from inside the batch script",
        ),
    ),
    opt("context", None, Kind::Unused(Arg::Required, "Drover sets no SELinux context")),
    opt("contiguous", None, Kind::Unused(Arg::No, "nodes are chosen without regard to their names")),
    opt("constraint", Some('C'), Kind::Constraint),
    opt("core-spec", Some('S'), Kind::Unused(Arg::Required, NO_SPEC_CORES)),
    opt("cores-per-socket", None, Kind::Unused(Arg::Required, PLACEMENT)),
    opt("cpu-freq", None, Kind::Unused(Arg::Required, "Drover does not set CPU frequencies")),
    opt("cpus-per-gpu", None, Kind::CpusPerGpu),
    opt("cpus-per-task", Some('c'), Kind::CpusPerTask),
    opt("deadline", None, Kind::Deadline),
    opt("delay-boot", None, Kind::Unused(Arg::Required, NO_REBOOT)),
    opt("dependency", Some('d'), Kind::Dependency),
    opt(
        "distribution",
        Some('m'),
        Kind::Unused(Arg::Required, "tasks are laid out in blocks, filling one node after another"),
    ),
    opt("error", Some('e'), Kind::Error),
    opt("exclude", Some('x'), Kind::Exclude),
    opt("exclusive", None, Kind::Exclusive),
    opt("export", None, Kind::Export),
    opt(
        "export-file",
        None,
        Kind::Unused(Arg::Required, "the variables in that file are not loaded; pass them with --export"),
    ),
    opt("extra-node-info", Some('B'), Kind::Unused(Arg::Required, PLACEMENT)),
    opt(
        "get-user-env",
        None,
        Kind::Unused(Arg::Optional, "the job gets the submitting environment (--export), not a login environment"),
    ),
    opt(
        "gid",
        None,
        Kind::Refused(
            Arg::Required,
            "only root may submit as another group; Drover takes the group from your credential",
        ),
    ),
    opt("gpu-bind", None, Kind::Unused(Arg::Required, "every task sees all of the job's GPUs on its node")),
    opt("gpu-freq", None, Kind::Unused(Arg::Required, "Drover does not set GPU clocks")),
    opt("gpus", Some('G'), Kind::GpusTotal),
    opt("gpus-per-node", None, Kind::GpusPerNode),
    opt(
        "gpus-per-socket",
        None,
        Kind::Refused(Arg::Required, "not supported; ask for GPUs with --gpus-per-node, --gpus or --gres"),
    ),
    opt("gpus-per-task", None, Kind::GpusPerTask),
    opt("gres", None, Kind::Gres),
    opt("gres-flags", None, Kind::Unused(Arg::Required, "GPUs are chosen without regard to CPU binding")),
    opt("hint", None, Kind::Unused(Arg::Required, "Drover does not bind tasks to cores")),
    opt("hold", Some('H'), Kind::Hold),
    // Drover never translates #PBS lines, which is what --ignore-pbs asks for.
    opt("ignore-pbs", None, Kind::Unused(Arg::No, "")),
    opt("input", Some('i'), Kind::Input),
    opt("job-name", Some('J'), Kind::JobName),
    opt("kill-on-invalid-dep", None, Kind::KillOnInvalidDep),
    opt(
        "licenses",
        Some('L'),
        Kind::Unused(Arg::Required, "Drover tracks no licenses; the job may start while none is free"),
    ),
    opt("mail-type", None, Kind::MailType),
    opt("mail-user", None, Kind::Unused(Arg::Required, "Drover sends no mail")),
    opt("mcs-label", None, Kind::Unused(Arg::Required, "Drover has no MCS labels")),
    opt("mem", None, Kind::Mem),
    opt("mem-bind", None, Kind::Unused(Arg::Required, "Drover does not bind memory to NUMA nodes")),
    opt("mem-per-cpu", None, Kind::MemPerCpu),
    opt("mem-per-gpu", None, Kind::MemPerGpu),
    opt("mincpus", None, Kind::Unused(Arg::Required, "CPUs are reserved by --cpus-per-task and the task counts")),
    opt("multi-site", None, Kind::MultiSite),
    opt("network", None, Kind::Unused(Arg::Required, "Drover configures no network resources")),
    opt("nice", None, Kind::Nice),
    opt("no-kill", Some('k'), Kind::NoKill),
    opt("no-requeue", None, Kind::NoRequeue),
    opt("nodefile", Some('F'), Kind::Refused(Arg::Required, "not supported; list the nodes with --nodelist")),
    opt("nodelist", Some('w'), Kind::Nodelist),
    opt("nodes", Some('N'), Kind::Nodes),
    opt("ntasks", Some('n'), Kind::Ntasks),
    opt("ntasks-per-core", None, Kind::Unused(Arg::Required, PLACEMENT)),
    opt("ntasks-per-gpu", None, Kind::NtasksPerGpu),
    opt("ntasks-per-node", None, Kind::NtasksPerNode),
    opt("ntasks-per-socket", None, Kind::Unused(Arg::Required, PLACEMENT)),
    opt("ntasks-per-tres", None, Kind::NtasksPerGpu),
    opt("open-mode", None, Kind::OpenMode),
    opt("output", Some('o'), Kind::Output),
    opt("overcommit", Some('O'), Kind::Unused(Arg::No, "every task gets its own CPUs")),
    opt("oversubscribe", Some('s'), Kind::Oversubscribe),
    opt("parsable", None, Kind::Parsable),
    opt("partition", Some('p'), Kind::Partition),
    opt("power", None, Kind::Unused(Arg::Required, "Drover has no power management")),
    opt(
        "prefer",
        None,
        Kind::Unused(Arg::Required, "soft feature preferences are not supported; --constraint sets hard ones"),
    ),
    opt(
        "priority",
        None,
        Kind::Unused(Arg::Required, "only an operator may set a job's priority; use --nice to lower it"),
    ),
    opt("profile", None, Kind::Unused(Arg::Required, "Drover gathers no profiles")),
    opt(
        "propagate",
        None,
        Kind::Unused(Arg::Optional, "the submitting shell's resource limits are not applied to the job"),
    ),
    opt("qos", Some('q'), Kind::Qos),
    opt("quiet", Some('Q'), Kind::Quiet),
    opt("version", Some('V'), Kind::Info(Info::Version)),
    opt("help", Some('h'), Kind::Info(Info::Help)),
    opt("usage", None, Kind::Info(Info::Usage)),
    opt("reboot", None, Kind::Unused(Arg::No, NO_REBOOT)),
    opt("requeue", None, Kind::Requeue),
    opt("reservation", None, Kind::Reservation),
    opt("signal", None, Kind::Signal),
    opt("sockets-per-node", None, Kind::Unused(Arg::Required, PLACEMENT)),
    opt("spread-job", None, Kind::Unused(Arg::No, "nodes are chosen by Drover's placement")),
    opt("switches", None, Kind::Unused(Arg::Required, NO_SWITCHES)),
    opt("tasks-per-node", None, Kind::NtasksPerNode),
    opt(
        "test-only",
        None,
        Kind::Refused(Arg::No, "not supported yet; Drover cannot estimate a start time without submitting"),
    ),
    opt("thread-spec", None, Kind::Unused(Arg::Required, NO_SPEC_CORES)),
    opt("threads-per-core", None, Kind::Unused(Arg::Required, PLACEMENT)),
    opt("time", Some('t'), Kind::Time),
    opt("time-min", None, Kind::TimeMin),
    opt("tmp", None, Kind::Unused(Arg::Required, "Drover does not track local disk space")),
    opt(
        "uid",
        None,
        Kind::Refused(
            Arg::Required,
            "only root may submit as another user; Drover takes the user from your credential",
        ),
    ),
    opt("use-min-nodes", None, Kind::Unused(Arg::No, "the scheduler picks the node count within --nodes")),
    opt("verbose", Some('v'), Kind::Unused(Arg::No, "Drover's sbatch has no verbose output")),
    opt(
        "wait",
        Some('W'),
        Kind::Refused(
            Arg::No,
            "not supported yet; sbatch returns once the job is queued (follow it with squeue or sacct)",
        ),
    ),
    opt("wait-all-nodes", None, Kind::Unused(Arg::Required, "the script starts as soon as the allocation is made")),
    opt("wckey", None, Kind::Wckey),
    opt("wrap", None, Kind::Wrap),
];

/// The input environment variables Slurm 22.05's `sbatch` reads, in the order it applies them (a later one wins
/// for the same option), and the long option each stands for. `SBATCH_REQ_SWITCH` and `SBATCH_WAIT4SWITCH` stand
/// for Slurm's two halves of `--switches`; `SBATCH_DEBUG` for `--verbose`.
pub const ENV_OPTIONS: &[(&str, &str)] = &[
    ("SBATCH_IGNORE_PBS", "ignore-pbs"),
    ("SBATCH_ACCOUNT", "account"),
    ("SBATCH_ARRAY_INX", "array"),
    ("SBATCH_ACCTG_FREQ", "acctg-freq"),
    ("SBATCH_BATCH", "batch"),
    ("SBATCH_BURST_BUFFER", "bb"),
    ("SBATCH_CLUSTER_CONSTRAINT", "cluster-constraint"),
    ("SBATCH_CLUSTERS", "clusters"),
    ("SLURM_CLUSTERS", "clusters"),
    ("SBATCH_CONTAINER", "container"),
    ("SBATCH_CONSTRAINT", "constraint"),
    ("SBATCH_CORE_SPEC", "core-spec"),
    ("SBATCH_CPU_FREQ_REQ", "cpu-freq"),
    ("SBATCH_CPUS_PER_GPU", "cpus-per-gpu"),
    ("SBATCH_DEBUG", "verbose"),
    ("SBATCH_DELAY_BOOT", "delay-boot"),
    ("SBATCH_DISTRIBUTION", "distribution"),
    ("SBATCH_EXCLUSIVE", "exclusive"),
    ("SBATCH_EXPORT", "export"),
    ("SBATCH_GET_USER_ENV", "get-user-env"),
    ("SBATCH_GRES", "gres"),
    ("SBATCH_GRES_FLAGS", "gres-flags"),
    ("SBATCH_GPUS", "gpus"),
    ("SBATCH_GPU_BIND", "gpu-bind"),
    ("SBATCH_GPU_FREQ", "gpu-freq"),
    ("SBATCH_GPUS_PER_NODE", "gpus-per-node"),
    ("SBATCH_GPUS_PER_SOCKET", "gpus-per-socket"),
    ("SBATCH_GPUS_PER_TASK", "gpus-per-task"),
    ("SLURM_HINT", "hint"),
    ("SBATCH_HINT", "hint"),
    ("SBATCH_JOB_NAME", "job-name"),
    ("SBATCH_MEM_BIND", "mem-bind"),
    ("SBATCH_MEM_PER_CPU", "mem-per-cpu"),
    ("SBATCH_MEM_PER_GPU", "mem-per-gpu"),
    ("SBATCH_MEM_PER_NODE", "mem"),
    ("SBATCH_NETWORK", "network"),
    ("SBATCH_NO_KILL", "no-kill"),
    ("SBATCH_NO_REQUEUE", "no-requeue"),
    ("SBATCH_OPEN_MODE", "open-mode"),
    ("SBATCH_OVERCOMMIT", "overcommit"),
    ("SBATCH_PARTITION", "partition"),
    ("SBATCH_POWER", "power"),
    ("SBATCH_PROFILE", "profile"),
    ("SBATCH_QOS", "qos"),
    ("SBATCH_REQ_SWITCH", "switches"),
    ("SBATCH_REQUEUE", "requeue"),
    ("SBATCH_RESERVATION", "reservation"),
    ("SBATCH_SIGNAL", "signal"),
    ("SBATCH_SPREAD_JOB", "spread-job"),
    ("SBATCH_THREAD_SPEC", "thread-spec"),
    ("SBATCH_THREADS_PER_CORE", "threads-per-core"),
    ("SBATCH_TIMELIMIT", "time"),
    ("SBATCH_USE_MIN_NODES", "use-min-nodes"),
    ("SBATCH_WAIT", "wait"),
    ("SBATCH_WAIT_ALL_NODES", "wait-all-nodes"),
    ("SBATCH_WAIT4SWITCH", "switches"),
    ("SBATCH_WCKEY", "wckey"),
    ("SBATCH_ERROR", "error"),
    ("SBATCH_INPUT", "input"),
    ("SBATCH_OUTPUT", "output"),
    // Drover's own option, named as Slurm names its flag variables.
    ("SBATCH_MULTI_SITE", "multi-site"),
];

/// Lists the supported options in [`OptionError::Unknown`]'s message.
struct SupportedOptions;

impl fmt::Display for SupportedOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The most used first, as before; the rest alphabetically.
        let mut defs: Vec<&OptDef> = OPTIONS.iter().filter(|d| d.kind.listed() && !HIDDEN.contains(&d.long)).collect();
        defs.sort_by_key(|d| (LISTED_FIRST.iter().position(|l| *l == d.long).unwrap_or(LISTED_FIRST.len()), d.long));
        for (i, def) in defs.iter().enumerate() {
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

/// Aliases left out of [`SupportedOptions`] (Slurm's man page does not list them either).
const HIDDEN: &[&str] = &["ntasks-per-tres", "tasks-per-node"];

/// The options named first in [`SupportedOptions`], in this order.
const LISTED_FIRST: &[&str] = &[
    "job-name",
    "partition",
    "account",
    "nodes",
    "ntasks",
    "ntasks-per-node",
    "cpus-per-task",
    "gres",
    "gpus-per-node",
    "gpus",
    "gpus-per-task",
    "mem",
    "mem-per-cpu",
    "mem-per-gpu",
    "time",
    "output",
    "error",
];

fn find_long(name: &str) -> Option<&'static OptDef> {
    OPTIONS.iter().find(|d| d.long == name)
}

/// One parsed item of an argument list.
enum Item {
    Option(SbatchOption),
    Wrap(String),
    Info(Info),
}

/// What `sbatch` prints instead of submitting.
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
            let def = find_long(name).ok_or_else(|| OptionError::Unknown { flag: flag.clone() })?;
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
    let ignored = |value: Option<String>, note: &'static str| SbatchOption::Ignored { flag: def.long, value, note };
    if let Kind::Refused(_, reason) = def.kind {
        return Err(OptionError::Refused { flag: flag.to_string(), reason });
    }
    let Some(value) = value else {
        return Ok(Item::Option(match def.kind {
            Kind::Requeue => SbatchOption::Requeue(true),
            Kind::NoRequeue => SbatchOption::Requeue(false),
            Kind::Hold => SbatchOption::Hold,
            Kind::MultiSite => SbatchOption::MultiSite,
            Kind::Parsable => SbatchOption::Parsable,
            Kind::Quiet => SbatchOption::Quiet,
            Kind::Info(info) => return Ok(Item::Info(info)),
            Kind::Exclusive => SbatchOption::Exclusive(Exclusive::Node),
            Kind::Oversubscribe => SbatchOption::Exclusive(Exclusive::Oversubscribe),
            Kind::Nice => SbatchOption::Nice(DEFAULT_NICE),
            Kind::NoKill => SbatchOption::NoKill(true),
            Kind::Unused(_, note) => ignored(None, note),
            _ => return Err(OptionError::MissingValue { flag: flag.to_string() }),
        }));
    };
    // Values Drover drops are not checked (Slurm checks some, but none of them changes what Drover runs), except
    // those that decide whether there is anything to warn about.
    match def.kind {
        Kind::Unused(_, note) => return Ok(Item::Option(ignored(Some(value), note))),
        Kind::MailType => {
            let note = if value.eq_ignore_ascii_case("NONE") { "" } else { "Drover sends no mail" };
            return Ok(Item::Option(ignored(Some(value), note)));
        }
        Kind::KillOnInvalidDep => {
            let note = match value.to_ascii_lowercase().as_str() {
                "yes" => "a job whose dependency can never be satisfied stays pending (DependencyNeverSatisfied)",
                "no" => "",
                _ => return Err(invalid(flag, &value, "expected yes or no")),
            };
            return Ok(Item::Option(ignored(Some(value), note)));
        }
        Kind::Clusters if value.is_empty() => return Ok(Item::Option(ignored(Some(value), ""))),
        Kind::Clusters => {
            return Err(OptionError::Refused {
                flag: flag.to_string(),
                reason: "Drover runs a single cluster; federation (submitting to other clusters) is not supported",
            });
        }
        Kind::Input if value == "/dev/null" => return Ok(Item::Option(ignored(Some(value), ""))),
        Kind::Input => {
            return Err(OptionError::Refused {
                flag: flag.to_string(),
                reason: "not supported: a batch script's stdin is /dev/null; redirect it inside the script",
            });
        }
        _ => {}
    }
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
        Kind::Wckey => SbatchOption::Wckey(value),
        Kind::Comment => SbatchOption::Comment(value),
        Kind::Nodes => parse_nodes(flag, &value)?,
        Kind::Ntasks => SbatchOption::Ntasks(positive(flag, &value)?),
        Kind::NtasksPerNode => SbatchOption::NtasksPerNode(positive(flag, &value)?),
        Kind::CpusPerTask => SbatchOption::CpusPerTask(positive(flag, &value)?),
        Kind::CpusPerGpu => SbatchOption::CpusPerGpu(positive(flag, &value)?),
        Kind::NtasksPerGpu => SbatchOption::NtasksPerGpu(positive(flag, &value)?),
        Kind::Mem => SbatchOption::Mem(MemRequest::PerNode(parse_mem_size(flag, &value)?)),
        Kind::MemPerCpu => SbatchOption::Mem(MemRequest::PerCpu(parse_mem_size(flag, &value)?)),
        Kind::MemPerGpu => SbatchOption::Mem(MemRequest::PerGpu(parse_mem_size(flag, &value)?)),
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
        // Slurm's `--no-kill[=set|off|no]`.
        Kind::NoKill => match value.to_ascii_lowercase().as_str() {
            "set" => SbatchOption::NoKill(true),
            "off" | "no" => SbatchOption::NoKill(false),
            _ => return Err(invalid(flag, &value, "expected set, off or no (or no value)")),
        },
        Kind::Exclusive => match value.to_ascii_lowercase().as_str() {
            "exclusive" => SbatchOption::Exclusive(Exclusive::Node),
            "user" => SbatchOption::Exclusive(Exclusive::User),
            "mcs" => SbatchOption::Exclusive(Exclusive::Mcs),
            "oversubscribe" => SbatchOption::Exclusive(Exclusive::Oversubscribe),
            _ => return Err(invalid(flag, &value, "expected user, mcs or oversubscribe (or no value)")),
        },
        Kind::Time | Kind::TimeMin => {
            let limit = slurm_time::parse_time_limit(&value).map_err(|e| {
                invalid(flag, &value, format!("{}; accepted formats: {}", e.problem, slurm_time::ACCEPTED_TIME_FORMATS))
            })?;
            if def.kind == Kind::Time { SbatchOption::TimeLimit(limit) } else { SbatchOption::TimeMin(limit) }
        }
        Kind::Begin | Kind::Deadline => {
            let at = TimeSpec::parse(&value).map_err(|problem| {
                invalid(flag, &value, format!("{problem}; accepted formats: {ACCEPTED_DATE_FORMATS}"))
            })?;
            if def.kind == Kind::Begin { SbatchOption::Begin(at) } else { SbatchOption::Deadline(at) }
        }
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
        Kind::Requeue
        | Kind::NoRequeue
        | Kind::Hold
        | Kind::MultiSite
        | Kind::Parsable
        | Kind::Quiet
        | Kind::Info(_)
        | Kind::Oversubscribe
        | Kind::Unused(..)
        | Kind::Refused(..)
        | Kind::Clusters
        | Kind::Input
        | Kind::KillOnInvalidDep
        | Kind::MailType => unreachable!("value-less and dropped options are handled above"),
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

/// A memory size as Slurm's `str_to_mbytes` reads it, in MiB: digits (an optional leading `+`), then an optional
/// unit `K`, `M`, `G` or `T` in either case, optionally followed by `B`. No unit means MiB; `K` rounds up.
fn parse_mem_size(flag: &str, value: &str) -> Result<u64, OptionError> {
    const EXPECTED: &str = "expected a whole number with an optional unit K, M, G or T (MiB when none), e.g. 4G";
    let unsigned = value.strip_prefix('+').unwrap_or(value);
    let digits_end = unsigned.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(unsigned.len());
    let (digits, unit) = unsigned.split_at(digits_end);
    if digits.is_empty() {
        return Err(invalid(flag, value, EXPECTED));
    }
    let unit = unit.to_ascii_uppercase();
    let unit = match unit.as_str() {
        "" => "M",
        "B" => return Err(invalid(flag, value, EXPECTED)),
        u => u.strip_suffix('B').unwrap_or(u),
    };
    let too_large = || invalid(flag, value, format!("the size is too large (at most {MAX_MEM_MB} MiB)"));
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    let mb = match unit {
        "K" => Some(n.div_ceil(1024)),
        "M" => Some(n),
        "G" => n.checked_mul(1 << 10),
        "T" => n.checked_mul(1 << 20),
        _ => return Err(invalid(flag, value, EXPECTED)),
    };
    mb.filter(|mb| *mb <= MAX_MEM_MB).ok_or_else(too_large)
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

// ---- --export ----

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
    Ok(SbatchOption::Export { policy: ExportPolicy::Vars { all, names: names.into() }, set })
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

/// C's `isspace` for a char (ASCII only, as in the C locale Slurm's directive reader runs in).
fn is_c_space_char(c: char) -> bool {
    c.is_ascii() && is_c_space(c as u8)
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
            None if is_c_space_char(c) => {
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

/// The options in a script's directives, in order, and a warning if it used Slurm's old `#SLURM` prefix.
///
/// As in Slurm's `_opt_batch_script`, only lines starting exactly with `#SBATCH` (or `#SLURM`) are directives,
/// and they are read until the first command: a line with something other than C whitespace before its first
/// `#`, or no `#` at all but something that is not whitespace. Blank lines and comments do not stop the scan.
fn script_directives(script: &str) -> Result<(Vec<SbatchOption>, Option<String>), SbatchError> {
    let mut options = Vec::new();
    let mut old_prefix = None;
    for (index, line) in script.split('\n').enumerate() {
        let rest = match (line.strip_prefix("#SBATCH"), line.strip_prefix("#SLURM")) {
            (Some(rest), _) => rest,
            (None, Some(rest)) => {
                old_prefix.get_or_insert_with(|| {
                    format!(
                        "script line {}: change #SLURM to #SBATCH in your script, and check the options are valid \
                         in sbatch",
                        index + 1
                    )
                });
                rest
            }
            (None, None) => {
                let first = line.bytes().find(|b| !is_c_space(*b));
                match first {
                    None | Some(b'#') => continue,
                    Some(_) => break,
                }
            }
        };
        let at_line = |error| SbatchError::Directive { line: index + 1, text: line.to_string(), error };
        let words = directive_words(rest).map_err(at_line)?;
        if let Some(word) =
            words.first().filter(|w| w.eq_ignore_ascii_case("hetjob") || w.eq_ignore_ascii_case("packjob"))
        {
            return Err(at_line(OptionError::HetJob { word: word.clone() }));
        }
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
                // Read from the command line only: a script cannot make sbatch print and submit nothing.
                Item::Info(_) => {}
            }
        }
    }
    Ok((options, old_prefix))
}

/// Whether an environment variable turns a value-less option on, as Slurm reads flag variables: empty, `yes`
/// (any case) or a non-zero whole number. Anything else leaves the option alone.
fn env_flag_on(value: &str) -> bool {
    if value.is_empty() || value.eq_ignore_ascii_case("yes") {
        return true;
    }
    let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits.bytes().any(|b| b != b'0')
}

/// The options the `SBATCH_*` input environment variables set, in [`ENV_OPTIONS`] order.
fn environment_options(env: &[(String, String)]) -> Result<Vec<SbatchOption>, SbatchError> {
    let mut options = Vec::new();
    for (var, long) in ENV_OPTIONS {
        // The first of duplicate names, as getenv finds it.
        let Some((_, value)) = env.iter().find(|(name, _)| name == var) else { continue };
        let def = find_long(long).expect("ENV_OPTIONS names known options");
        let value = match def.kind.arg() {
            Arg::No if env_flag_on(value) => None,
            Arg::No => continue,
            Arg::Optional if value.is_empty() => None,
            // An empty value for an option that needs one says nothing: skipped rather than refused.
            Arg::Required if value.is_empty() => continue,
            Arg::Optional | Arg::Required => Some(value.clone()),
        };
        let at_var = |error| SbatchError::Environment { var: var.to_string(), error };
        match parse_value(def, &format!("--{long}"), value).map_err(at_var)? {
            Item::Option(option) => options.push(option),
            Item::Wrap(_) | Item::Info(_) => {
                unreachable!("no variable stands for --wrap, --version, --help or --usage")
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

/// The GPU option that won (the last of `--gres`, `--gpus-per-node`, `--gpus`, `--gpus-per-task`).
enum GpuRequest {
    PerNode(u32),
    Total(u32),
    PerTask(u32),
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

/// Where an option came from. Slurm's exclusivity rules treat the script and the command line alike ("set by
/// the command line") and let either override the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Script,
    Environment,
    CommandLine,
}

/// `--ntasks-per-gpu=N`, folded into the task counts (and, without GPUs, into a GPU request) as Slurm's
/// `gres_job_state_validate` does. Runs after [`resolve_gpus`].
fn fold_ntasks_per_gpu(
    spec: &mut JobSpec,
    per_gpu: u32,
    nodes_given: bool,
    gpus_per_task_given: bool,
    warnings: &mut Vec<String>,
) -> Result<(), SbatchError> {
    let conflict = |msg: String| Err(SbatchError::Conflict(msg));
    if spec.ntasks_per_node.is_some() {
        return conflict("--ntasks-per-node is mutually exclusive with --ntasks-per-gpu".to_string());
    }
    if gpus_per_task_given {
        return conflict("--gpus-per-task is mutually exclusive with --ntasks-per-gpu".to_string());
    }
    if spec.min_nodes != spec.max_nodes {
        return conflict("--ntasks-per-gpu cannot be used with a node range (--nodes=MIN-MAX)".to_string());
    }
    let too_many = || SbatchError::Conflict(format!("--ntasks-per-gpu={per_gpu} makes too many tasks"));
    spec.ntasks_per_gpu = Some(per_gpu);
    let total = if spec.gpus_per_node > 0 {
        let per_node = per_gpu.checked_mul(spec.gpus_per_node).ok_or_else(too_many)?;
        spec.ntasks_per_node = Some(per_node);
        per_node.checked_mul(spec.min_nodes.max(1)).ok_or_else(too_many)?
    } else if let Some(gpus) = spec.gpus_total.filter(|g| *g > 0) {
        gpus.checked_mul(per_gpu).ok_or_else(too_many)?
    } else {
        // No GPUs asked for: they follow from the task count, one GPU per N tasks.
        let tasks = match (spec.ntasks, nodes_given) {
            (Some(tasks), _) => tasks,
            (None, true) => spec.min_nodes.checked_mul(per_gpu).ok_or_else(too_many)?,
            (None, false) => {
                return conflict(format!(
                    "--ntasks-per-gpu={per_gpu} needs GPUs (--gpus, --gpus-per-node or --gres) or a task count \
                     (--ntasks or --nodes)"
                ));
            }
        };
        if tasks % per_gpu != 0 {
            return conflict(format!("--ntasks={tasks} has to be a multiple of --ntasks-per-gpu={per_gpu}"));
        }
        spec.ntasks = Some(tasks);
        spec.gpu_type = None;
        return resolve_gpus(spec, Some(GpuRequest::Total(tasks / per_gpu)), nodes_given);
    };
    if let Some(asked) = spec.ntasks.filter(|n| *n != total) {
        warnings.push(format!(
            "--ntasks={asked} is replaced by {total}: --ntasks-per-gpu={per_gpu} times the job's GPUs, as Slurm does"
        ));
    }
    if spec.ntasks.is_some() || spec.gpus_total.is_some() {
        spec.ntasks = Some(total);
    }
    Ok(())
}

/// `--cpus-per-gpu=N`, folded into `cpus_per_task`: each node's tasks share N CPUs per GPU on the node. Runs
/// after the GPU and task counts are final.
fn fold_cpus_per_gpu(spec: &mut JobSpec, per_gpu: u32, warnings: &mut Vec<String>) -> Result<(), SbatchError> {
    spec.cpus_per_gpu = Some(per_gpu);
    let (gpus, tasks) = if spec.gpus_per_node > 0 {
        (spec.gpus_per_node, most_tasks_on_a_node(spec))
    } else if let Some(total) = spec.gpus_total.filter(|g| *g > 0) {
        // Not yet spread over nodes: the job's CPUs for its GPUs, shared by all of its tasks.
        (total, spec.ntasks.unwrap_or_else(|| most_tasks_on_a_node(spec)))
    } else {
        warnings.push(format!("--cpus-per-gpu={per_gpu} has no effect: the job asks for no GPUs"));
        return Ok(());
    };
    let cpus = (u64::from(per_gpu) * u64::from(gpus)).div_ceil(u64::from(tasks.max(1)));
    spec.cpus_per_task = u32::try_from(cpus).map_err(|_| {
        SbatchError::Conflict(format!("--cpus-per-gpu={per_gpu} with {gpus} GPUs is too many CPUs per task"))
    })?;
    Ok(())
}

/// The memory option that wins, by Slurm's rules: at most one kind from the script and the command line (the
/// last of that kind), which then overrides the environment; else at most one kind from the environment.
fn resolve_mem(script_or_cli: &[MemRequest], env: &[MemRequest]) -> Result<Option<MemRequest>, SbatchError> {
    let kinds = |list: &[MemRequest]| {
        let mut seen = [false; 3];
        for mem in list {
            seen[match mem {
                MemRequest::PerNode(_) => 0,
                MemRequest::PerCpu(_) => 1,
                MemRequest::PerGpu(_) => 2,
            }] = true;
        }
        seen.iter().filter(|s| **s).count()
    };
    if kinds(script_or_cli) > 1 {
        return Err(SbatchError::Conflict("--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive".into()));
    }
    if let Some(last) = script_or_cli.last() {
        return Ok(Some(*last));
    }
    if kinds(env) > 1 {
        return Err(SbatchError::Conflict(
            "SBATCH_MEM_PER_NODE, SBATCH_MEM_PER_CPU, and SBATCH_MEM_PER_GPU are mutually exclusive".into(),
        ));
    }
    Ok(env.last().copied())
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
    let mut warnings = Vec::new();
    let directives = if cmd.wrap.is_some() {
        Vec::new()
    } else {
        let (directives, old_prefix) = script_directives(&script)?;
        warnings.extend(old_prefix);
        directives
    };
    let environment = if ctx.sbatch_env { environment_options(&ctx.env)? } else { Vec::new() };

    let mut spec = JobSpec {
        name: Default::default(),
        user: ctx.user.as_str().into(),
        uid: ctx.uid,
        gid: ctx.gid,
        script_args: cmd.script_args.clone().into(),
        submit_dir: ctx.cwd.as_str().into(),
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
    let mut gpus_per_task_given = false;
    let mut cpus_per_task_given = false;
    let mut cpus_per_gpu = None;
    let mut ntasks_per_gpu = None;
    let (mut mem_set, mut mem_env) = (Vec::new(), Vec::new());
    let (mut begin, mut deadline) = (None, None);
    let sources = directives
        .iter()
        .map(|o| (Source::Script, o))
        .chain(environment.iter().map(|o| (Source::Environment, o)))
        .chain(cmd.options.iter().map(|o| (Source::CommandLine, o)));
    for (source, option) in sources {
        match option {
            SbatchOption::JobName(v) => name = Some(v.clone()),
            SbatchOption::Partition(v) => spec.partition = Some(v.clone().into()),
            SbatchOption::Account(v) => spec.account = Some(v.clone().into()),
            SbatchOption::Nodes { min, max } => {
                spec.min_nodes = *min;
                spec.max_nodes = *max;
                nodes_given = true;
            }
            SbatchOption::Ntasks(n) => spec.ntasks = Some(*n),
            SbatchOption::NtasksPerNode(n) => spec.ntasks_per_node = Some(*n),
            SbatchOption::CpusPerTask(n) => {
                spec.cpus_per_task = *n;
                cpus_per_task_given = true;
            }
            SbatchOption::Gpus { per_node, gpu_type } => {
                gpus = Some(GpuRequest::PerNode(*per_node));
                spec.gpu_type = gpu_type.as_deref().map(Into::into);
            }
            SbatchOption::GpusTotal { count, gpu_type } => {
                gpus = Some(GpuRequest::Total(*count));
                spec.gpu_type = gpu_type.as_deref().map(Into::into);
            }
            SbatchOption::GpusPerTask { count, gpu_type } => {
                gpus = Some(GpuRequest::PerTask(*count));
                spec.gpu_type = gpu_type.as_deref().map(Into::into);
                gpus_per_task_given = true;
            }
            SbatchOption::CpusPerGpu(n) => cpus_per_gpu = Some(*n),
            SbatchOption::NtasksPerGpu(n) => ntasks_per_gpu = Some(*n),
            SbatchOption::Mem(mem) if source == Source::Environment => mem_env.push(*mem),
            SbatchOption::Mem(mem) => mem_set.push(*mem),
            SbatchOption::Array(v) => spec.array = Some(v.clone()),
            SbatchOption::Dependency { deps, any } => {
                spec.dependency = deps.clone().into();
                spec.dependency_any = *any;
            }
            SbatchOption::Qos(v) => spec.qos = Some(v.clone().into()),
            SbatchOption::Reservation(v) => spec.reservation = Some(v.clone().into()),
            SbatchOption::Nice(v) => spec.nice = *v,
            SbatchOption::TimeLimit(limit) => spec.time_limit_s = *limit,
            SbatchOption::TimeMin(limit) => spec.time_min_s = *limit,
            SbatchOption::Begin(at) => begin = Some(at),
            SbatchOption::Deadline(at) => deadline = Some(at),
            SbatchOption::Output(v) => spec.stdout = Some(v.clone().into()),
            SbatchOption::Error(v) => spec.stderr = Some(v.clone().into()),
            SbatchOption::Chdir(v) => chdir = Some(v.clone()),
            SbatchOption::Export { policy, set } => {
                spec.export = policy.clone();
                export_set = set.clone();
            }
            SbatchOption::Requeue(v) => spec.requeue = Some(*v),
            SbatchOption::Signal(w) => spec.signal = Some(*w),
            SbatchOption::NoKill(v) => spec.no_kill = *v,
            SbatchOption::Hold => spec.hold = true,
            SbatchOption::MultiSite => spec.multi_site = true,
            SbatchOption::OpenAppend(v) => spec.open_append = *v,
            SbatchOption::Exclusive(mode) => {
                spec.exclusive = *mode != Exclusive::Oversubscribe;
                let warning = match mode {
                    Exclusive::Node => None,
                    Exclusive::User => {
                        Some("--exclusive=user is treated as --exclusive: the job's nodes run no other job")
                    }
                    Exclusive::Mcs => {
                        Some("--exclusive=mcs is treated as --exclusive: the job's nodes run no other job")
                    }
                    Exclusive::Oversubscribe => {
                        Some("--oversubscribe only lifts --exclusive: Drover never oversubscribes CPUs or GPUs")
                    }
                };
                warnings.extend(warning.map(str::to_string));
            }
            SbatchOption::Constraint(v) => spec.constraint = v.clone().into(),
            SbatchOption::Nodelist(v) => spec.nodelist = v.clone().into(),
            SbatchOption::Exclude(v) => spec.exclude = v.clone().into(),
            SbatchOption::Wckey(v) => spec.wckey = Some(v.clone().into()),
            SbatchOption::Comment(v) => spec.comment = Some(v.clone().into()),
            SbatchOption::Parsable => parsable = true,
            // Slurm reads --quiet in its first pass over the command line only; elsewhere it does nothing.
            SbatchOption::Quiet if source == Source::Script => {
                warnings.push("--quiet in a #SBATCH line has no effect; give it on the command line".to_string());
            }
            SbatchOption::Quiet => {}
            SbatchOption::Ignored { flag, note, .. } => {
                if !note.is_empty() {
                    warnings.push(format!("--{flag} is ignored: {note}"));
                }
            }
        }
    }
    spec.mem = resolve_mem(&mem_set, &mem_env)?;
    resolve_gpus(&mut spec, gpus, nodes_given)?;
    if let Some(n) = ntasks_per_gpu {
        fold_ntasks_per_gpu(&mut spec, n, nodes_given, gpus_per_task_given, &mut warnings)?;
    }
    if let Some(n) = cpus_per_gpu {
        if cpus_per_task_given {
            return Err(SbatchError::Conflict("--cpus-per-gpu is mutually exclusive with --cpus-per-task".into()));
        }
        fold_cpus_per_gpu(&mut spec, n, &mut warnings)?;
    }
    if matches!(spec.mem, Some(MemRequest::PerGpu(_))) && spec.gpus_per_node == 0 && spec.gpus_total.is_none() {
        return Err(SbatchError::Conflict(
            "--mem-per-gpu needs GPUs: give --gpus, --gpus-per-node, --gpus-per-task or --gres".into(),
        ));
    }
    if let (Some(min), Some(limit)) = (spec.time_min_s, spec.time_limit_s)
        && min > limit
    {
        return Err(SbatchError::Conflict(format!(
            "--time-min ({}) is longer than --time ({})",
            slurm_time::format_duration(min),
            slurm_time::format_duration(limit)
        )));
    }
    let place = |flag: &str, at: Option<&TimeSpec>| -> Result<Option<u64>, SbatchError> {
        let Some(at) = at else { return Ok(None) };
        let now_s = i64::try_from(ctx.now_ms / 1_000).unwrap_or(i64::MAX);
        let secs = at
            .resolve(now_s, Zone::Offset(ctx.utc_offset_s), false)
            .ok_or_else(|| SbatchError::Conflict(format!("{flag} names a time before 1970 or beyond any calendar")))?;
        Ok(Some(u64::try_from(secs).unwrap_or(0).saturating_mul(1_000)))
    };
    spec.begin_ms = place("--begin", begin)?;
    spec.deadline_ms = place("--deadline", deadline)?;
    if let (Some(begin), Some(deadline)) = (spec.begin_ms, spec.deadline_ms)
        && deadline < begin
    {
        return Err(SbatchError::Conflict(
            "Incompatible begin and deadline time specification: --deadline is before --begin".into(),
        ));
    }
    spec.name = name.unwrap_or(default_name).into();
    spec.work_dir = match &chdir {
        Some(dir) => resolve_dir(&ctx.cwd, dir).into(),
        None => ctx.cwd.as_str().into(),
    };
    spec.environment = export_environment(&spec.export, &export_set, &ctx.env).into();
    spec.script = script.into();
    let mut unique: Vec<String> = Vec::with_capacity(warnings.len());
    for warning in warnings {
        if !unique.contains(&warning) {
            unique.push(warning);
        }
    }
    Ok(ParsedSubmit {
        spec,
        parsable: parsable || cmd.parsable,
        quiet: cmd.quiet,
        script_path: cmd.script_path.clone(),
        warnings: unique,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::time::{civil_from_days, days_from_civil};
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
            // Tuesday 2026-03-10, 14:30:15 local time, one hour east of UTC.
            now_ms: NOW_MS,
            utc_offset_s: 3_600,
            sbatch_env: true,
        }
    }

    /// 2026-03-10T13:30:15Z.
    const NOW_MS: u64 = 1_773_149_415_000;

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

    fn warnings(list: &[&str]) -> Vec<String> {
        submit(list, Some(SCRIPT)).unwrap_or_else(|e| panic!("{list:?}: {e}")).warnings
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
        assert_eq!((s.dependency.to_vec(), s.dependency_any), (vec![], false));
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
                s.array == Some(ArraySpec { task_ids: vec![1, 2, 3].into(), max_running: Some(2) })
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
            ("mem", None, "4G", |s| s.mem == Some(MemRequest::PerNode(4096))),
            ("mem-per-cpu", None, "2000", |s| s.mem == Some(MemRequest::PerCpu(2000))),
            ("tasks-per-node", None, "4", |s| s.ntasks_per_node == Some(4)),
            ("time-min", None, "30", |s| s.time_min_s == Some(1800)),
            ("begin", Some("b"), "now+60", |s| s.begin_ms == Some(NOW_MS + 60_000)),
            ("deadline", None, "now+1hour", |s| s.deadline_ms == Some(NOW_MS + 3_600_000)),
            ("wckey", None, "proj", |s| s.wckey.as_deref() == Some("proj")),
            ("comment", None, "a note", |s| s.comment.as_deref() == Some("a note")),
            ("signal", None, "USR1@90", |s| s.signal.is_some_and(|w| w.before_s == 90)),
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

    /// Issue 30: Slurm's sbatch answers --version/-V, --help/-h and --usage with exit 0 and submits nothing (checked
    /// against Debian's Slurm 22.05); Drover refused them as unknown options.
    #[test]
    fn version_help_and_usage_print_instead_of_submitting() {
        let line = |args: &[&str]| parse_command_line(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).unwrap();
        assert_eq!(line(&["--version"]).info, Some(Info::Version));
        assert_eq!(line(&["-V"]).info, Some(Info::Version));
        assert_eq!(line(&["-Q", "-h", "job.sh"]).info, Some(Info::Help), "before the script, with other options");
        assert_eq!(line(&["--usage", "--version"]).info, Some(Info::Usage), "the first one wins");
        assert_eq!(line(&["job.sh", "--version"]).info, None, "after the script: the script's own argument");
        assert!(Info::Version.text().starts_with("slurm 22.05"));
        assert!(Info::Help.text().contains("--job-name/-J"));
        // A directive cannot make sbatch print and submit nothing.
        let parsed = build_spec(&line(&[]), Some("#!/bin/sh\n#SBATCH --version\ntrue\n"), &ctx()).unwrap();
        assert_eq!(parsed.spec.name, "sbatch");
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
    fn ignored_options_are_accepted_dropped_and_warned_about() {
        let cmd = parse_command_line(&args(&["--mail-type=END,FAIL", "--mail-user", "a@b.c", "job.sh"])).unwrap();
        assert_eq!(cmd.options.len(), 2);
        assert!(cmd.options.iter().all(|o| matches!(o, SbatchOption::Ignored { .. })));
        let parsed = build_spec(&cmd, Some(SCRIPT), &ctx()).unwrap();
        assert_eq!(parsed.spec, spec(&["job.sh"], SCRIPT));
        // One warning per option, even though both say the same.
        assert_eq!(
            parsed.warnings,
            ["--mail-type is ignored: Drover sends no mail", "--mail-user is ignored: Drover sends no mail"]
        );
        assert!(cmd_err(&["--mail-type"]).contains("--mail-type requires a value"));
        // Asking for no mail is what Drover does anyway.
        assert!(warnings(&["--mail-type=NONE", "job.sh"]).is_empty());
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
        (s.gpus_per_node, s.gpu_type.map(String::from), s.gpus_total, s.gpus_per_task)
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
        assert_eq!(s.array, Some(ArraySpec { task_ids: vec![0, 4, 8, 12].into(), max_running: Some(2) }));
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
        assert_eq!(s.array, Some(ArraySpec { task_ids: vec![5].into(), max_running: None }));
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
        assert_eq!(
            (s.dependency.to_vec(), s.dependency_any),
            (vec![d(AfterOk, 1, None), d(AfterNotOk, 2, None)], true)
        );
        // Later wins entirely, the any flag included.
        let s = spec(&["-d", "after:1?after:2", "-d", "after:3", "job.sh"], SCRIPT);
        assert_eq!((s.dependency.to_vec(), s.dependency_any), (vec![d(After, 3, None)], false));
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
        assert_eq!(s.export, ExportPolicy::Vars { all: false, names: args(&["HOME", "PATH", "MISSING"]).into() });
        // In the submit environment's order; absent names are skipped.
        assert_eq!(s.environment, vec![("PATH".into(), "/usr/bin:/bin".into()), ("HOME".into(), "/home/alice".into())]);
    }

    #[test]
    fn export_all_with_assignments() {
        let s = spec(&["--export=ALL,HOME=/tmp,NEW=1,LANG", "job.sh"], SCRIPT);
        assert_eq!(s.export, ExportPolicy::Vars { all: true, names: args(&["HOME", "NEW", "LANG"]).into() });
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
        assert_eq!(s.export, ExportPolicy::Vars { all: false, names: args(&["PATH", "FOO", "EMPTY"]).into() });
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
        // sbatch has no --x11 (salloc and srun do).
        let msg = cmd_err(&["--x11", "job.sh"]);
        assert!(msg.starts_with("unrecognized option \"--x11\"; supported options: --job-name/-J,"), "{msg}");
        assert!(msg.contains("--gpus-per-node"), "{msg}");
        for listed in ["--array/-a", "--dependency/-d", "--qos/-q", "--reservation", "--nice", "--gpus/-G"] {
            assert!(msg.contains(listed), "{listed}: {msg}");
        }
        assert!(msg.contains("--gpus-per-task"), "{msg}");
        for listed in ["--mem", "--mem-per-gpu", "--cpus-per-gpu", "--begin/-b", "--time-min", "--wckey", "--comment"] {
            assert!(msg.contains(listed), "{listed}: {msg}");
        }
        // Only what Drover acts on is listed; hidden aliases neither.
        for unlisted in ["mail-type", "gpu-bind", "--uid", "--wait", "--tasks-per-node", "ntasks-per-tres"] {
            assert!(!msg.contains(unlisted), "{unlisted}: {msg}");
        }
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
        let err = script_err("#!/bin/bash\n\n#SBATCH --x11=all\n");
        assert!(err.to_string().starts_with("script line 3: unrecognized option \"--x11\""), "{err}");
        assert!(err.to_string().ends_with("(in \"#SBATCH --x11=all\")"), "{err}");
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

    // ---- memory ----

    fn mem_of(list: &[&str]) -> Option<MemRequest> {
        let mut full = list.to_vec();
        full.push("job.sh");
        spec(&full, SCRIPT).mem
    }

    #[test]
    fn memory_sizes_take_slurms_units() {
        use MemRequest::*;
        assert_eq!(mem_of(&[]), None);
        assert_eq!(mem_of(&["--mem=500"]), Some(PerNode(500)));
        assert_eq!(mem_of(&["--mem", "4G"]), Some(PerNode(4096)));
        assert_eq!(mem_of(&["--mem=4g"]), Some(PerNode(4096)));
        assert_eq!(mem_of(&["--mem=4GB"]), Some(PerNode(4096)));
        assert_eq!(mem_of(&["--mem=4gb"]), Some(PerNode(4096)));
        assert_eq!(mem_of(&["--mem=16384M"]), Some(PerNode(16384)));
        assert_eq!(mem_of(&["--mem=8mb"]), Some(PerNode(8)));
        assert_eq!(mem_of(&["--mem=2T"]), Some(PerNode(2 << 20)));
        assert_eq!(mem_of(&["--mem=+5"]), Some(PerNode(5)));
        // K rounds up to whole MiB.
        assert_eq!(mem_of(&["--mem=1024K"]), Some(PerNode(1)));
        assert_eq!(mem_of(&["--mem=1025k"]), Some(PerNode(2)));
        assert_eq!(mem_of(&["--mem=1K"]), Some(PerNode(1)));
        assert_eq!(mem_of(&["--mem=0K"]), Some(PerNode(0)));
        // 0 is all of each node's memory.
        assert_eq!(mem_of(&["--mem=0"]), Some(PerNode(0)));
        assert_eq!(mem_of(&["--mem-per-cpu=2G"]), Some(PerCpu(2048)));
        assert_eq!(mem_of(&["--gres=gpu:1", "--mem-per-gpu=40G"]), Some(PerGpu(40960)));
        let largest = "8796093022207T"; // 2^63 - 2^20 MiB
        assert_eq!(mem_of(&["--mem", largest]), Some(PerNode(MAX_MEM_MB - (1 << 20) + 1)));
        assert_eq!(mem_of(&["--mem=9223372036854775807"]), Some(PerNode(MAX_MEM_MB)));
    }

    #[test]
    fn bad_memory_sizes_say_what_is_accepted() {
        let expected = "expected a whole number with an optional unit K, M, G or T (MiB when none), e.g. 4G";
        for bad in ["G", "4X", "4GiB", "4 G", "-1", "1.5G", "4B", "B", "4GBB", "0x10", " 4"] {
            assert_eq!(cmd_err(&["--mem", bad]), format!("invalid --mem value {bad:?}: {expected}"), "{bad:?}");
        }
        assert_eq!(cmd_err(&["--mem-per-cpu="]), "invalid --mem-per-cpu value \"\": the value is empty");
        let too_large = "the size is too large (at most 9223372036854775807 MiB)";
        for huge in [
            "9223372036854775808",
            "8796093022208T",
            "9007199254740992G",
            "18446744073709551616",
            "99999999999999999999999K",
        ] {
            assert_eq!(cmd_err(&["--mem-per-gpu", huge]), format!("invalid --mem-per-gpu value {huge:?}: {too_large}"));
        }
    }

    #[test]
    fn memory_options_exclude_one_another_as_in_slurm() {
        use MemRequest::*;
        let exclusive = "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive";
        let err = build_err(&["--mem=4G", "--mem-per-cpu=1G", "job.sh"], SCRIPT);
        assert_eq!(err, SbatchError::Conflict(exclusive.into()));
        // The script counts as the command line here: Slurm refuses a script's --mem with a --mem-per-cpu given
        // to sbatch, rather than letting one win.
        let err = build_err(&["--mem-per-cpu=1G", "job.sh"], "#!/bin/sh\n#SBATCH --mem=4G\n");
        assert_eq!(err.to_string(), exclusive);
        // The same option again: the last wins.
        assert_eq!(mem_of(&["--mem=1G", "--mem=2G"]), Some(PerNode(2048)));
        assert_eq!(spec(&["--mem=2G", "job.sh"], "#!/bin/sh\n#SBATCH --mem=8G\n").mem, Some(PerNode(2048)));
    }

    #[test]
    fn mem_per_gpu_needs_gpus() {
        let err = build_err(&["--mem-per-gpu=10G", "job.sh"], SCRIPT);
        assert_eq!(
            err.to_string(),
            "--mem-per-gpu needs GPUs: give --gpus, --gpus-per-node, --gpus-per-task or --gres"
        );
        assert!(build_err(&["--gres=gpu:0", "--mem-per-gpu=10G", "job.sh"], SCRIPT).to_string().contains("needs GPUs"));
        // A job total the controller spreads later is GPUs too.
        assert_eq!(mem_of(&["--gpus=16", "--mem-per-gpu=10G"]), Some(MemRequest::PerGpu(10240)));
    }

    // ---- --cpus-per-gpu and --ntasks-per-gpu ----

    #[test]
    fn cpus_per_gpu_shares_each_gpus_cpus_among_the_nodes_tasks() {
        let cpus = |list: &[&str]| {
            let mut full = list.to_vec();
            full.push("job.sh");
            let s = spec(&full, SCRIPT);
            (s.cpus_per_task, s.cpus_per_gpu)
        };
        // One task per node (the default) gets all of its node's CPUs for GPUs.
        assert_eq!(cpus(&["--gres=gpu:4", "--cpus-per-gpu=8"]), (32, Some(8)));
        assert_eq!(cpus(&["--cpus-per-gpu=8", "--gpus-per-node=4", "--ntasks-per-node=4"]), (8, Some(8)));
        // 10 CPUs over 3 tasks: each gets 4.
        assert_eq!(cpus(&["-n", "3", "--gpus-per-node=2", "--cpus-per-gpu=5"]), (4, Some(5)));
        // Tasks in blocks: 3 tasks on 2 nodes is 2 + 1; the busier node's tasks share its 32 CPUs.
        assert_eq!(cpus(&["-N", "2", "-n", "3", "--gres=gpu:4", "--cpus-per-gpu=8"]), (16, Some(8)));
        // --gpus-per-task: GPUs per node follow the tasks first.
        assert_eq!(cpus(&["-n", "2", "--gpus-per-task=2", "--cpus-per-gpu=3"]), (6, Some(3)));
        // A job total not yet spread: its CPUs shared by all of its tasks, or by one task per node.
        assert_eq!(cpus(&["--gpus=8", "--cpus-per-gpu=4", "-n", "4"]), (8, Some(4)));
        assert_eq!(cpus(&["--gpus=8", "--cpus-per-gpu=4"]), (32, Some(4)));
        // --gpus over a fixed node count is per node.
        assert_eq!(cpus(&["-N", "2", "--gpus=8", "--cpus-per-gpu=4"]), (16, Some(4)));
    }

    #[test]
    fn cpus_per_gpu_conflicts_and_edges() {
        let exclusive = "--cpus-per-gpu is mutually exclusive with --cpus-per-task";
        assert_eq!(
            build_err(&["-c", "2", "--gres=gpu:1", "--cpus-per-gpu=4", "job.sh"], SCRIPT).to_string(),
            exclusive
        );
        assert_eq!(
            build_err(&["--gres=gpu:1", "-c", "2", "job.sh"], "#!/bin/sh\n#SBATCH --cpus-per-gpu=4\n").to_string(),
            exclusive
        );
        // Without GPUs there is nothing to multiply: a warning, and the default one CPU per task.
        let parsed = submit(&["--cpus-per-gpu=4", "job.sh"], Some(SCRIPT)).unwrap();
        assert_eq!(parsed.spec.cpus_per_task, 1);
        assert_eq!(parsed.warnings, ["--cpus-per-gpu=4 has no effect: the job asks for no GPUs"]);
        assert_eq!(cmd_err(&["--cpus-per-gpu=0"]), "invalid --cpus-per-gpu value \"0\": must be at least 1");
        let err = build_err(&["--gpus-per-node=100000", "--cpus-per-gpu=4294967295", "job.sh"], SCRIPT);
        assert!(err.to_string().contains("too many CPUs per task"), "{err}");
    }

    fn tasks_of(list: &[&str]) -> (Option<u32>, Option<u32>, u32, Option<u32>, Option<u32>) {
        let mut full = list.to_vec();
        full.push("job.sh");
        let s = spec(&full, SCRIPT);
        (s.ntasks, s.ntasks_per_node, s.gpus_per_node, s.gpus_total, s.ntasks_per_gpu)
    }

    #[test]
    fn ntasks_per_gpu_with_gpus_sets_the_tasks() {
        // N tasks for each GPU of each node.
        assert_eq!(
            tasks_of(&["-N", "2", "--gpus-per-node=4", "--ntasks-per-gpu=2"]),
            (None, Some(8), 4, None, Some(2))
        );
        assert_eq!(tasks_of(&["--gres=gpu:a100:8", "--ntasks-per-gpu=1"]), (None, Some(8), 8, None, Some(1)));
        // An --ntasks that agrees stays; one that does not is replaced, as Slurm does, with a warning.
        assert_eq!(
            tasks_of(&["-N", "2", "-n", "16", "--gres=gpu:4", "--ntasks-per-gpu=2"]),
            (Some(16), Some(8), 4, None, Some(2))
        );
        let parsed =
            submit(&["-N", "2", "-n", "5", "--gres=gpu:4", "--ntasks-per-gpu=2", "job.sh"], Some(SCRIPT)).unwrap();
        assert_eq!((parsed.spec.ntasks, parsed.spec.ntasks_per_node), (Some(16), Some(8)));
        assert_eq!(
            parsed.warnings,
            ["--ntasks=5 is replaced by 16: --ntasks-per-gpu=2 times the job's GPUs, as Slurm does"]
        );
        // A job total: N tasks per GPU of it.
        assert_eq!(tasks_of(&["--gpus=8", "--ntasks-per-gpu=2"]), (Some(16), None, 0, Some(8), Some(2)));
        // Slurm's hidden --ntasks-per-tres is the same thing.
        assert_eq!(tasks_of(&["--gpus-per-node=2", "--ntasks-per-tres=3"]), (None, Some(6), 2, None, Some(3)));
    }

    #[test]
    fn ntasks_per_gpu_without_gpus_asks_for_them() {
        // One GPU for every N tasks, a job total (the controller spreads it) ...
        assert_eq!(tasks_of(&["-n", "8", "--ntasks-per-gpu=2"]), (Some(8), None, 0, Some(4), Some(2)));
        // ... or per node, when --nodes is fixed.
        assert_eq!(tasks_of(&["-N", "2", "-n", "8", "--ntasks-per-gpu=2"]), (Some(8), None, 2, None, Some(2)));
        // --nodes alone: N tasks per node, hence one GPU per node.
        assert_eq!(tasks_of(&["-N", "2", "--ntasks-per-gpu=3"]), (Some(6), None, 1, None, Some(3)));
        let err = build_err(&["-n", "7", "--ntasks-per-gpu=2", "job.sh"], SCRIPT);
        assert_eq!(err.to_string(), "--ntasks=7 has to be a multiple of --ntasks-per-gpu=2");
        let err = build_err(&["-N", "4", "-n", "6", "--ntasks-per-gpu=2", "job.sh"], SCRIPT);
        assert_eq!(err.to_string(), "--gpus=3 cannot be spread evenly over 4 nodes; use --gpus-per-node");
        let err = build_err(&["--ntasks-per-gpu=2", "job.sh"], SCRIPT);
        assert!(err.to_string().starts_with("--ntasks-per-gpu=2 needs GPUs"), "{err}");
    }

    #[test]
    fn ntasks_per_gpu_refuses_what_slurm_refuses() {
        let err = |list: &[&str]| build_err(list, SCRIPT).to_string();
        assert_eq!(
            err(&["--ntasks-per-node=2", "--gres=gpu:2", "--ntasks-per-gpu=1", "job.sh"]),
            "--ntasks-per-node is mutually exclusive with --ntasks-per-gpu"
        );
        assert_eq!(
            err(&["-n", "2", "--gpus-per-task=1", "--gres=gpu:2", "--ntasks-per-gpu=1", "job.sh"]),
            "--gpus-per-task is mutually exclusive with --ntasks-per-gpu"
        );
        assert_eq!(
            err(&["-N", "1-2", "--gres=gpu:2", "--ntasks-per-gpu=1", "job.sh"]),
            "--ntasks-per-gpu cannot be used with a node range (--nodes=MIN-MAX)"
        );
        assert!(err(&["--gpus-per-node=65536", "--ntasks-per-gpu=65536", "job.sh"]).contains("too many tasks"));
    }

    // ---- --wckey, --comment, --time-min ----

    #[test]
    fn wckey_comment_and_time_min_are_recorded() {
        let s =
            spec(&["--wckey=ml", "--comment", "sweep 3 of 8", "--time-min=1:00:00", "-t", "4:00:00", "job.sh"], SCRIPT);
        assert_eq!((s.wckey.as_deref(), s.comment.as_deref()), (Some("ml"), Some("sweep 3 of 8")));
        assert_eq!((s.time_min_s, s.time_limit_s), (Some(3600), Some(4 * 3600)));
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --comment=\"from the script\" --time-min=2-0\n");
        assert_eq!((s.comment.as_deref(), s.time_min_s), (Some("from the script"), Some(2 * 86_400)));
        // UNLIMITED (or 0) is no minimum, as for --time.
        assert_eq!(spec(&["--time-min=UNLIMITED", "job.sh"], SCRIPT).time_min_s, None);
        assert_eq!(spec(&["--time-min=0", "-t", "10", "job.sh"], SCRIPT).time_min_s, None);
        // Without --time the partition's limit applies, which only the controller knows.
        assert_eq!(spec(&["--time-min=90", "job.sh"], SCRIPT).time_min_s, Some(5400));
    }

    #[test]
    fn time_min_errors() {
        assert_eq!(
            build_err(&["--time-min=2:00:00", "-t", "60", "job.sh"], SCRIPT).to_string(),
            "--time-min (2:00:00) is longer than --time (1:00:00)"
        );
        let msg = cmd_err(&["--time-min=1h"]);
        assert!(msg.starts_with("invalid --time-min value \"1h\": \"1h\" is not a whole number"), "{msg}");
        assert_eq!(cmd_err(&["--wckey="]), "invalid --wckey value \"\": the value is empty");
    }

    // ---- --begin and --deadline ----

    /// Milliseconds since the epoch of a local time in the test context (UTC+1).
    fn local_ms(date: (i64, i64, i64), clock: (i64, i64, i64)) -> u64 {
        let (y, mo, d) = date;
        let (h, mi, s) = clock;
        ((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - 3600) * 1000) as u64
    }

    fn begin(value: &str) -> u64 {
        spec(&[&format!("--begin={value}"), "job.sh"], SCRIPT).begin_ms.unwrap_or_else(|| panic!("{value}"))
    }

    const TODAY: (i64, i64, i64) = (2026, 3, 10);
    const TOMORROW: (i64, i64, i64) = (2026, 3, 11);

    #[test]
    fn the_calendar_arithmetic_matches_known_dates() {
        for (date, days) in [
            ((1970, 1, 1), 0),
            ((1969, 12, 31), -1),
            ((2000, 2, 29), 11_016),
            ((2000, 3, 1), 11_017),
            ((2024, 12, 31), 20_088),
            ((2026, 3, 10), 20_522),
            ((2100, 3, 1), 47_541),
        ] {
            assert_eq!(days_from_civil(date.0, date.1, date.2), days, "{date:?}");
            assert_eq!(civil_from_days(days), date);
        }
        assert_eq!(local_ms(TODAY, (14, 30, 15)), NOW_MS);
    }

    #[test]
    fn begin_at_a_time_of_day_is_the_next_one() {
        // Now is 14:30:15 local.
        assert_eq!(begin("16:00"), local_ms(TODAY, (16, 0, 0)));
        assert_eq!(begin("14:31"), local_ms(TODAY, (14, 31, 0)));
        assert_eq!(begin("23:59:59"), local_ms(TODAY, (23, 59, 59)));
        // Not after the current minute: tomorrow (Slurm compares hours and minutes only).
        assert_eq!(begin("14:30:59"), local_ms(TOMORROW, (14, 30, 59)));
        assert_eq!(begin("9:05"), local_ms(TOMORROW, (9, 5, 0)));
        assert_eq!(begin("00:00"), local_ms(TOMORROW, (0, 0, 0)));
        // AM and PM, with or without a space, in any case.
        assert_eq!(begin("4:00 PM"), local_ms(TODAY, (16, 0, 0)));
        assert_eq!(begin("4:00pm"), local_ms(TODAY, (16, 0, 0)));
        assert_eq!(begin("12:00 pm"), local_ms(TOMORROW, (12, 0, 0)));
        assert_eq!(begin("12:15am"), local_ms(TOMORROW, (0, 15, 0)));
        assert_eq!(begin("11:00 AM"), local_ms(TOMORROW, (11, 0, 0)));
        // Named times.
        assert_eq!(begin("midnight"), local_ms(TOMORROW, (0, 0, 0)));
        assert_eq!(begin("noon"), local_ms(TOMORROW, (12, 0, 0)));
        assert_eq!(begin("fika"), local_ms(TODAY, (15, 0, 0)));
        assert_eq!(begin("teatime"), local_ms(TODAY, (16, 0, 0)));
        assert_eq!(begin("NOON"), local_ms(TOMORROW, (12, 0, 0)));
    }

    #[test]
    fn begin_on_a_day() {
        // A day alone is its midnight, even today's (already past: the job is eligible at once).
        assert_eq!(begin("today"), local_ms(TODAY, (0, 0, 0)));
        assert_eq!(begin("tomorrow"), local_ms(TOMORROW, (0, 0, 0)));
        assert_eq!(begin("tomorrow 10:00"), local_ms(TOMORROW, (10, 0, 0)));
        assert_eq!(begin("teatime tomorrow"), local_ms(TOMORROW, (16, 0, 0)));
        assert_eq!(begin("today 9:00"), local_ms(TODAY, (9, 0, 0)));
        assert_eq!(begin("2026-01-20T12:34:00"), local_ms((2026, 1, 20), (12, 34, 0)));
        assert_eq!(begin("2026-01-20T12:34"), local_ms((2026, 1, 20), (12, 34, 0)));
        assert_eq!(begin("2027-12-01"), local_ms((2027, 12, 1), (0, 0, 0)));
        assert_eq!(begin("2027-12-1 18:00"), local_ms((2027, 12, 1), (18, 0, 0)));
        // Without a year: this year if still ahead, else next year.
        assert_eq!(begin("0315"), local_ms((2026, 3, 15), (0, 0, 0)));
        assert_eq!(begin("03/15"), local_ms((2026, 3, 15), (0, 0, 0)));
        assert_eq!(begin("3/15"), local_ms((2026, 3, 15), (0, 0, 0)));
        assert_eq!(begin("03.15"), local_ms((2026, 3, 15), (0, 0, 0)));
        assert_eq!(begin("03/09"), local_ms((2027, 3, 9), (0, 0, 0)));
        // Today's date at midnight has passed: next year, as in Slurm.
        assert_eq!(begin("0310"), local_ms((2027, 3, 10), (0, 0, 0)));
        assert_eq!(begin("03/10-16:00"), local_ms((2026, 3, 10), (16, 0, 0)));
        // Two-digit years; 00 counts as no year, as in Slurm.
        assert_eq!(begin("031527"), local_ms((2027, 3, 15), (0, 0, 0)));
        assert_eq!(begin("03/15/27"), local_ms((2027, 3, 15), (0, 0, 0)));
        assert_eq!(begin("03.15.27"), local_ms((2027, 3, 15), (0, 0, 0)));
        assert_eq!(begin("03/15/00"), local_ms((2026, 3, 15), (0, 0, 0)));
        // A day past the month's end rolls over, as mktime does: February 31 is March 3.
        assert_eq!(begin("2027-02-31"), local_ms((2027, 3, 3), (0, 0, 0)));
    }

    #[test]
    fn begin_relative_to_now() {
        assert_eq!(begin("now"), NOW_MS);
        assert_eq!(begin("now+60"), NOW_MS + 60_000);
        assert_eq!(begin("now+60seconds"), NOW_MS + 60_000);
        assert_eq!(begin("now+1second"), NOW_MS + 1_000);
        assert_eq!(begin("now+90minutes"), NOW_MS + 90 * 60_000);
        assert_eq!(begin("now+1hour"), NOW_MS + 3_600_000);
        assert_eq!(begin("now+2HOURS"), NOW_MS + 7_200_000);
        assert_eq!(begin("now + 2 days"), NOW_MS + 2 * 86_400_000);
        assert_eq!(begin("now+1week"), NOW_MS + 7 * 86_400_000);
        assert_eq!(begin("now-1hour"), NOW_MS - 3_600_000);
        assert_eq!(begin("uts1800000000"), 1_800_000_000_000);
        // The short option.
        assert_eq!(spec(&["-b", "now+5minutes", "job.sh"], SCRIPT).begin_ms, Some(NOW_MS + 300_000));
    }

    #[test]
    fn begin_uses_the_submitters_utc_offset() {
        let mut c = ctx();
        c.utc_offset_s = -5 * 3600;
        let cmd = parse_command_line(&args(&["--begin=16:00", "job.sh"])).unwrap();
        // 16:00 at UTC-5 is 21:00 UTC; now there is 09:30 so it is today.
        let utc = days_from_civil(2026, 3, 10) * 86_400 + 21 * 3600;
        assert_eq!(build_spec(&cmd, Some(SCRIPT), &c).unwrap().spec.begin_ms, Some(utc as u64 * 1000));
    }

    #[test]
    fn bad_begin_values_are_refused() {
        for bad in [
            "now+1h",
            "now+",
            "now+hours",
            "nowish",
            "now+1hour30minutes",
            "tomorow",
            "25:00",
            "10:60",
            "10:5",
            "10:00:61",
            "13:00pm",
            "1:00 xm",
            "13/01",
            "00/10",
            "03/32",
            "2026-1-20",
            "2026-13-01",
            "03/15/2027",
            "12pm",
            "uts5",
            "uts",
            "  ",
            "-",
            "T",
            "next friday",
        ] {
            let msg = cmd_err(&["--begin", bad]);
            assert!(msg.starts_with(&format!("invalid --begin value {bad:?}: ")), "{bad:?}: {msg}");
            assert!(msg.ends_with(ACCEPTED_DATE_FORMATS), "{bad:?}: {msg}");
        }
        // Slurm's scan skips a capital T as the date/time separator, so a capitalized word is not a keyword.
        assert!(cmd_err(&["--begin=Today"]).contains("unexpected \"oday\""));
        assert!(cmd_err(&["--deadline=now+1fortnight"]).starts_with("invalid --deadline value"));
        let err = build_err(&["--begin=1969-12-31", "job.sh"], SCRIPT);
        assert_eq!(err.to_string(), "--begin names a time before 1970 or beyond any calendar");
    }

    #[test]
    fn deadline_must_not_precede_begin() {
        let s = spec(&["--begin=now+1hour", "--deadline=tomorrow", "job.sh"], SCRIPT);
        assert_eq!((s.begin_ms, s.deadline_ms), (Some(NOW_MS + 3_600_000), Some(local_ms(TOMORROW, (0, 0, 0)))));
        let s = spec(&["--deadline=now+2days", "job.sh"], SCRIPT);
        assert_eq!((s.begin_ms, s.deadline_ms), (None, Some(NOW_MS + 2 * 86_400_000)));
        let err = build_err(&["--begin=tomorrow", "--deadline=now+1hour", "job.sh"], SCRIPT);
        assert_eq!(err.to_string(), "Incompatible begin and deadline time specification: --deadline is before --begin");
        // In a directive too, with the same clock.
        let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --begin=now+10minutes\n");
        assert_eq!(s.begin_ms, Some(NOW_MS + 600_000));
    }

    // ---- options Drover does not act on ----

    #[test]
    fn unused_options_warn_and_take_their_values_as_getopt_does() {
        // (argv before the script, the one warning)
        let cases: &[(&[&str], &str)] = &[
            (&["--gpu-bind=closest"], "--gpu-bind is ignored: every task sees all of the job's GPUs on its node"),
            (&["--gpu-bind", "single:1"], "--gpu-bind is ignored"),
            (&["--distribution=block:cyclic"], "--distribution is ignored: tasks are laid out in blocks"),
            (&["-m", "cyclic"], "--distribution is ignored"),
            (&["-mcyclic"], "--distribution is ignored"),
            (&["--hint", "nomultithread"], "--hint is ignored: Drover does not bind tasks to cores"),
            (&["--mcs-label=g"], "--mcs-label is ignored"),
            (&["--profile=task"], "--profile is ignored"),
            (&["--acctg-freq", "task=30"], "--acctg-freq is ignored"),
            (&["--propagate"], "--propagate is ignored"),
            (&["--propagate=STACK,CORE"], "--propagate is ignored"),
            (&["--get-user-env"], "--get-user-env is ignored"),
            (&["--get-user-env=10L"], "--get-user-env is ignored"),
            (
                &["--kill-on-invalid-dep=yes"],
                "--kill-on-invalid-dep is ignored: a job whose dependency can never be satisfied stays pending",
            ),
            (&["--tmp=100G"], "--tmp is ignored: Drover does not track local disk space"),
            (&["--ntasks-per-core=1"], "--ntasks-per-core is ignored"),
            (&["--ntasks-per-socket", "2"], "--ntasks-per-socket is ignored"),
            (&["--cores-per-socket=8"], "--cores-per-socket is ignored"),
            (&["--sockets-per-node=2"], "--sockets-per-node is ignored"),
            (&["--threads-per-core=1"], "--threads-per-core is ignored"),
            (&["-B", "2:8:1"], "--extra-node-info is ignored"),
            (&["-S", "2"], "--core-spec is ignored"),
            (&["--thread-spec=2"], "--thread-spec is ignored"),
            (&["--mincpus=16"], "--mincpus is ignored"),
            (&["--switches=1@10:00"], "--switches is ignored"),
            (&["--power=level"], "--power is ignored"),
            (&["-L", "matlab:1"], "--licenses is ignored: Drover tracks no licenses"),
            (&["--licenses=a,b"], "--licenses is ignored"),
            (&["--spread-job"], "--spread-job is ignored"),
            (&["--use-min-nodes"], "--use-min-nodes is ignored"),
            (&["--overcommit"], "--overcommit is ignored"),
            (&["-O"], "--overcommit is ignored"),
            (&["--export-file=vars.env"], "--export-file is ignored: the variables in that file are not loaded"),
            (&["--priority=TOP"], "--priority is ignored: only an operator may set a job's priority"),
            (&["--delay-boot=10"], "--delay-boot is ignored: Drover never reboots nodes for a job"),
            (&["--reboot"], "--reboot is ignored"),
            (&["--cpu-freq=high"], "--cpu-freq is ignored"),
            (&["--gpu-freq=high"], "--gpu-freq is ignored"),
            (&["--network=x"], "--network is ignored"),
            (&["--mem-bind=local"], "--mem-bind is ignored"),
            (&["--gres-flags=enforce-binding"], "--gres-flags is ignored"),
            (&["--prefer=a100"], "--prefer is ignored"),
            (&["--contiguous"], "--contiguous is ignored"),
            (&["--batch=feature"], "--batch is ignored"),
            (&["--cluster-constraint=x"], "--cluster-constraint is ignored"),
            (&["--context=unconfined_u"], "--context is ignored"),
            (&["--wait-all-nodes=1"], "--wait-all-nodes is ignored"),
            (&["--verbose"], "--verbose is ignored: Drover's sbatch has no verbose output"),
            (&["-vv"], "--verbose is ignored"),
            (&["--exclusive=user"], "--exclusive=user is treated as --exclusive: the job's nodes run no other job"),
            (&["--exclusive=MCS"], "--exclusive=mcs is treated as --exclusive"),
            (&["--oversubscribe"], "--oversubscribe only lifts --exclusive: Drover never oversubscribes CPUs or GPUs"),
            (&["-s"], "--oversubscribe only lifts --exclusive"),
        ];
        let plain = spec(&["job.sh"], SCRIPT);
        for (list, warning) in cases {
            let mut full = list.to_vec();
            full.extend(["job.sh", "arg"]);
            let parsed = submit(&full, Some(SCRIPT)).unwrap_or_else(|e| panic!("{list:?}: {e}"));
            // The script is still the script: an optional value was not taken from the next word.
            assert_eq!(parsed.script_path.as_deref(), Some("job.sh"), "{list:?}");
            assert_eq!(parsed.spec.script_args, ["arg"], "{list:?}");
            assert_eq!(parsed.warnings.len(), 1, "{list:?}: {:?}", parsed.warnings);
            assert!(parsed.warnings[0].starts_with(warning), "{list:?}: {:?}", parsed.warnings);
            // And nothing else about the job changed (bar the exclusive flag).
            let mut s = parsed.spec;
            s.exclusive = false;
            s.script_args.clear();
            assert_eq!(s, plain, "{list:?}");
        }
    }

    #[test]
    fn unused_options_in_directives_and_silent_ones() {
        let parsed =
            submit(&["job.sh"], Some("#!/bin/sh\n#SBATCH --hint=compute_bound -m block\n#SBATCH --hint=x\n")).unwrap();
        // Each warning once.
        assert_eq!(
            parsed.warnings,
            [
                "--hint is ignored: Drover does not bind tasks to cores",
                "--distribution is ignored: tasks are laid out in blocks, filling one node after another"
            ]
        );
        // What Drover does anyway needs no warning.
        for quiet in [
            &["--ignore-pbs"][..],
            &["--kill-on-invalid-dep=no"],
            &["--mail-type=none"],
            &["--clusters="],
            &["-M", ""],
            &["--input=/dev/null"],
            &["--exclusive"],
            &["--exclusive=exclusive"],
        ] {
            let mut full = quiet.to_vec();
            full.push("job.sh");
            assert_eq!(warnings(&full), Vec::<String>::new(), "{quiet:?}");
        }
        // Value-less ones refuse a value; some values are still checked.
        assert_eq!(cmd_err(&["--reboot=yes"]), "option --reboot takes no value, but was given \"yes\"");
        assert_eq!(
            cmd_err(&["--kill-on-invalid-dep=maybe"]),
            "invalid --kill-on-invalid-dep value \"maybe\": expected yes or no"
        );
        assert_eq!(cmd_err(&["--hint"]), "option --hint requires a value");
    }

    #[test]
    fn exclusive_takes_an_optional_mode() {
        assert!(spec(&["--exclusive", "job.sh"], SCRIPT).exclusive);
        assert!(spec(&["--exclusive=user", "job.sh"], SCRIPT).exclusive);
        assert!(!spec(&["--exclusive=oversubscribe", "job.sh"], SCRIPT).exclusive);
        // The later of --exclusive and --oversubscribe wins, as both set Slurm's one sharing field.
        assert!(!spec(&["--exclusive", "-s", "job.sh"], SCRIPT).exclusive);
        assert!(spec(&["-s", "--exclusive", "job.sh"], SCRIPT).exclusive);
        assert!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --exclusive\n").exclusive);
        // getopt's optional value: `--exclusive user` leaves `user` as the script.
        assert_eq!(submit(&["--exclusive", "user"], Some(SCRIPT)).unwrap().script_path.as_deref(), Some("user"));
        assert_eq!(
            cmd_err(&["--exclusive=node"]),
            "invalid --exclusive value \"node\": expected user, mcs or oversubscribe (or no value)"
        );
    }

    #[test]
    fn multi_site_comes_from_the_flag_a_directive_or_its_variable() {
        assert!(!spec(&["-N", "3", "job.sh"], SCRIPT).multi_site, "one site by default");
        assert!(spec(&["--multi-site", "job.sh"], SCRIPT).multi_site);
        assert!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --multi-site\n").multi_site);
        assert!(with_env(&[("SBATCH_MULTI_SITE", "1")], &["job.sh"], SCRIPT).unwrap().spec.multi_site);
        assert!(!with_env(&[("SBATCH_MULTI_SITE", "0")], &["job.sh"], SCRIPT).unwrap().spec.multi_site);
        assert!(cmd_err(&["--multi-site=yes"]).contains("--multi-site"));
    }

    #[test]
    fn no_kill_takes_set_off_or_no() {
        assert!(spec(&["-k", "job.sh"], SCRIPT).no_kill);
        assert!(spec(&["--no-kill=set", "job.sh"], SCRIPT).no_kill);
        assert!(!spec(&["--no-kill=off", "job.sh"], SCRIPT).no_kill);
        // A later =off undoes an earlier one.
        assert!(!spec(&["--no-kill=off", "job.sh"], "#!/bin/sh\n#SBATCH --no-kill\n").no_kill);
        assert_eq!(
            cmd_err(&["--no-kill=yes"]),
            "invalid --no-kill value \"yes\": expected set, off or no (or no value)"
        );
    }

    #[test]
    fn options_drover_refuses() {
        let cases: &[(&[&str], &str)] = &[
            (&["--uid=0"], "--uid: only root may submit as another user; Drover takes the user from your credential"),
            (&["--gid", "wheel"], "--gid: only root may submit as another group"),
            (&["--wait"], "--wait: not supported yet"),
            (&["-W"], "-W: not supported yet"),
            (&["--test-only"], "--test-only: not supported yet"),
            (&["--clusters=other"], "--clusters: Drover runs a single cluster"),
            (&["-M", "a,b"], "-M: Drover runs a single cluster"),
            (&["--cluster=x"], "--cluster: Drover runs a single cluster"),
            (&["-i", "input.txt"], "-i: not supported: a batch script's stdin is /dev/null"),
            (&["--gpus-per-socket=1"], "--gpus-per-socket: not supported"),
            (&["--bb=capacity=1G"], "--bb: burst buffers are not supported"),
            (&["--bbf=bb.conf"], "--bbf: burst buffers are not supported"),
            (&["--container=/img"], "--container: OCI containers are not supported"),
            (&["-F", "hosts"], "-F: not supported; list the nodes with --nodelist"),
        ];
        for (list, error) in cases {
            let mut full = list.to_vec();
            full.push("job.sh");
            let msg = cmd_err(&full);
            assert!(msg.starts_with(error), "{list:?}: {msg}");
        }
        // Even bundled, and in a directive.
        assert!(cmd_err(&["-HW"]).starts_with("-W: not supported yet"));
        let err = script_err("#!/bin/sh\n#SBATCH --uid=root\n");
        assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::Refused { .. }, .. }), "{err}");
    }

    // ---- --quiet ----

    #[test]
    fn quiet_is_read_from_the_command_line_only() {
        let parsed = submit(&["-Q", "--hint=x", "job.sh"], Some(SCRIPT)).unwrap();
        // The warnings are still there; sbatch does not print them.
        assert!(parsed.quiet);
        assert_eq!(parsed.warnings.len(), 1);
        assert!(submit(&["--quiet", "--parsable", "job.sh"], Some(SCRIPT)).unwrap().quiet);
        let parsed = submit(&["job.sh"], Some("#!/bin/sh\n#SBATCH -Q\n")).unwrap();
        assert!(!parsed.quiet);
        assert_eq!(parsed.warnings, ["--quiet in a #SBATCH line has no effect; give it on the command line"]);
        assert_eq!(cmd_err(&["-Q", "-v", "job.sh"]), "don't specify both --verbose (-v) and --quiet (-Q)");
        assert_eq!(cmd_err(&["-vQ"]), "don't specify both --verbose (-v) and --quiet (-Q)");
    }

    // ---- input environment variables ----

    fn with_env(vars: &[(&str, &str)], list: &[&str], script: &str) -> Result<ParsedSubmit, SbatchError> {
        let mut c = ctx();
        c.env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        build_spec(&parse_command_line(&args(list))?, Some(script), &c)
    }

    #[test]
    fn environment_variables_set_options() {
        let vars = [
            ("SBATCH_PARTITION", "gpu"),
            ("SBATCH_ACCOUNT", "proj"),
            ("SBATCH_JOB_NAME", "from-env"),
            ("SBATCH_TIMELIMIT", "2:00:00"),
            ("SBATCH_GPUS_PER_NODE", "h100:4"),
            ("SBATCH_MEM_PER_GPU", "80G"),
            ("SBATCH_CPUS_PER_GPU", "12"),
            ("SBATCH_QOS", "high"),
            ("SBATCH_RESERVATION", "r1"),
            ("SBATCH_WCKEY", "wk"),
            ("SBATCH_CONSTRAINT", "ib"),
            ("SBATCH_ARRAY_INX", "0-3%2"),
            ("SBATCH_OUTPUT", "out-%j"),
            ("SBATCH_ERROR", "err-%j"),
            ("SBATCH_OPEN_MODE", "append"),
            ("SBATCH_SIGNAL", "USR1@120"),
            ("SBATCH_REQUEUE", "1"),
            ("SBATCH_NO_KILL", ""),
            ("SBATCH_EXCLUSIVE", ""),
        ];
        let s = with_env(&vars, &["job.sh"], SCRIPT).unwrap().spec;
        assert_eq!(
            (s.partition.as_deref(), s.account.as_deref(), s.name.as_str()),
            (Some("gpu"), Some("proj"), "from-env")
        );
        assert_eq!((s.time_limit_s, s.gpus_per_node, s.gpu_type.as_deref()), (Some(7200), 4, Some("h100")));
        assert_eq!((s.mem, s.cpus_per_task, s.cpus_per_gpu), (Some(MemRequest::PerGpu(80 * 1024)), 48, Some(12)));
        assert_eq!(
            (s.qos.as_deref(), s.reservation.as_deref(), s.wckey.as_deref()),
            (Some("high"), Some("r1"), Some("wk"))
        );
        assert_eq!(s.constraint, ["ib"]);
        assert_eq!(s.array, Some(ArraySpec { task_ids: vec![0, 1, 2, 3].into(), max_running: Some(2) }));
        assert_eq!((s.stdout.as_deref(), s.stderr.as_deref(), s.open_append), (Some("out-%j"), Some("err-%j"), true));
        assert_eq!(s.signal.map(|w| w.before_s), Some(120));
        assert_eq!((s.requeue, s.no_kill, s.exclusive), (Some(true), true, true));
        // The variables themselves still reach the job (--export=ALL).
        assert!(s.environment.contains(&("SBATCH_PARTITION".into(), "gpu".into())));
    }

    #[test]
    fn command_line_beats_environment_beats_script() {
        let script = "#!/bin/sh\n#SBATCH -p from-script -t 10 -J script-name\n";
        let vars = [("SBATCH_PARTITION", "from-env"), ("SBATCH_TIMELIMIT", "20")];
        let s = with_env(&vars, &["job.sh"], script).unwrap().spec;
        assert_eq!(
            (s.partition.as_deref(), s.time_limit_s, s.name.as_str()),
            (Some("from-env"), Some(1200), "script-name")
        );
        let s = with_env(&vars, &["-p", "from-cli", "job.sh"], script).unwrap().spec;
        assert_eq!((s.partition.as_deref(), s.time_limit_s), (Some("from-cli"), Some(1200)));
        // SBATCH_EXPORT=NONE, overridden by --export on the command line.
        let s = with_env(&[("SBATCH_EXPORT", "NONE")], &["job.sh"], SCRIPT).unwrap().spec;
        assert!(s.environment.is_empty());
        let s = with_env(&[("SBATCH_EXPORT", "NONE")], &["--export=HOME", "job.sh"], SCRIPT).unwrap().spec;
        assert_eq!(s.environment, vec![("HOME".to_string(), "/home/alice".to_string())]);
    }

    #[test]
    fn environment_variables_apply_in_slurms_order() {
        // SBATCH_GPUS comes after SBATCH_GRES in Slurm's table, wherever they stand in the environment.
        let s = with_env(&[("SBATCH_GPUS", "8"), ("SBATCH_GRES", "gpu:2")], &["job.sh"], SCRIPT).unwrap().spec;
        assert_eq!((s.gpus_per_node, s.gpus_total), (0, Some(8)));
        // A duplicate name: the first, as getenv finds it.
        let s = with_env(&[("SBATCH_QOS", "a"), ("SBATCH_QOS", "b")], &["job.sh"], SCRIPT).unwrap().spec;
        assert_eq!(s.qos.as_deref(), Some("a"));
    }

    #[test]
    fn memory_variables_give_way_to_options() {
        use MemRequest::*;
        let mem = |vars: &[(&str, &str)], list: &[&str], script: &str| with_env(vars, list, script).map(|p| p.spec.mem);
        // An option of any kind, in the script or on the command line, overrides the variables.
        assert_eq!(mem(&[("SBATCH_MEM_PER_CPU", "1G")], &["--mem=4G", "job.sh"], SCRIPT), Ok(Some(PerNode(4096))));
        assert_eq!(
            mem(&[("SBATCH_MEM_PER_NODE", "1G")], &["job.sh"], "#!/bin/sh\n#SBATCH --mem-per-cpu=2G\n"),
            Ok(Some(PerCpu(2048)))
        );
        assert_eq!(mem(&[("SBATCH_MEM_PER_NODE", "1G")], &["job.sh"], SCRIPT), Ok(Some(PerNode(1024))));
        // Two kinds among the variables alone are an error.
        let err = mem(&[("SBATCH_MEM_PER_NODE", "1G"), ("SBATCH_MEM_PER_CPU", "1G")], &["job.sh"], SCRIPT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "SBATCH_MEM_PER_NODE, SBATCH_MEM_PER_CPU, and SBATCH_MEM_PER_GPU are mutually exclusive"
        );
        assert_eq!(
            mem(&[("SBATCH_MEM_PER_NODE", "1G"), ("SBATCH_MEM_PER_CPU", "1G")], &["--mem=2G", "job.sh"], SCRIPT),
            Ok(Some(PerNode(2048)))
        );
    }

    #[test]
    fn flag_variables_follow_slurms_truth_rules() {
        let requeue = |value: &str| with_env(&[("SBATCH_REQUEUE", value)], &["job.sh"], SCRIPT).unwrap().spec.requeue;
        for on in ["", "1", "yes", "YES", "-1", "007"] {
            assert_eq!(requeue(on), Some(true), "{on:?}");
        }
        for off in ["0", "no", "true", "000"] {
            assert_eq!(requeue(off), None, "{off:?}");
        }
        let s = with_env(&[("SBATCH_NO_REQUEUE", "1"), ("SBATCH_REQUEUE", "1")], &["job.sh"], SCRIPT).unwrap().spec;
        // SBATCH_REQUEUE comes later in Slurm's table.
        assert_eq!(s.requeue, Some(true));
        // Optional values: empty is no value.
        let s = with_env(&[("SBATCH_EXCLUSIVE", "user")], &["job.sh"], SCRIPT).unwrap();
        assert!(s.spec.exclusive);
        assert_eq!(s.warnings.len(), 1);
        let s = with_env(&[("SBATCH_NO_KILL", "off")], &["job.sh"], SCRIPT).unwrap().spec;
        assert!(!s.no_kill);
        // A waiting sbatch is refused, unless the variable turns it off.
        let err = with_env(&[("SBATCH_WAIT", "1")], &["job.sh"], SCRIPT).unwrap_err();
        assert!(err.to_string().starts_with("environment variable SBATCH_WAIT: --wait: not supported yet"), "{err}");
        assert!(with_env(&[("SBATCH_WAIT", "0")], &["job.sh"], SCRIPT).is_ok());
    }

    #[test]
    fn bad_or_empty_variables() {
        let err = with_env(&[("SBATCH_MEM_PER_CPU", "4X")], &["job.sh"], SCRIPT).unwrap_err();
        assert!(matches!(&err, SbatchError::Environment { var, .. } if var == "SBATCH_MEM_PER_CPU"));
        assert!(
            err.to_string().starts_with("environment variable SBATCH_MEM_PER_CPU: invalid --mem-per-cpu value \"4X\""),
            "{err}"
        );
        let err = with_env(&[("SLURM_CLUSTERS", "other")], &["job.sh"], SCRIPT).unwrap_err();
        assert!(err.to_string().starts_with("environment variable SLURM_CLUSTERS: --clusters:"), "{err}");
        // Empty says nothing.
        let s = with_env(&[("SBATCH_PARTITION", ""), ("SBATCH_TIMELIMIT", "")], &["job.sh"], SCRIPT).unwrap().spec;
        assert_eq!((s.partition, s.time_limit_s), (None, None));
        // Warned options warn from the environment too.
        let parsed = with_env(&[("SLURM_HINT", "nomultithread")], &["job.sh"], SCRIPT).unwrap();
        assert_eq!(parsed.warnings, ["--hint is ignored: Drover does not bind tasks to cores"]);
    }

    #[test]
    fn only_sbatch_reads_sbatch_variables() {
        let mut c = ctx();
        c.sbatch_env = false;
        c.env.push(("SBATCH_PARTITION".into(), "gpu".into()));
        c.env.push(("SBATCH_WAIT".into(), "1".into()));
        let cmd = parse_command_line(&args(&["job.sh"])).unwrap();
        assert_eq!(build_spec(&cmd, Some(SCRIPT), &c).unwrap().spec.partition, None);
    }

    // ---- directive scanning, as Slurm's ----

    #[test]
    fn old_slurm_prefix_is_read_with_a_warning() {
        let parsed = submit(&["job.sh"], Some("#!/bin/sh\n#SLURM -N 2\n#SBATCH -J x\n#SLURM -t 5\n")).unwrap();
        assert_eq!((parsed.spec.min_nodes, parsed.spec.time_limit_s), (2, Some(300)));
        assert_eq!(
            parsed.warnings,
            ["script line 2: change #SLURM to #SBATCH in your script, and check the options are valid in sbatch"]
        );
    }

    #[test]
    fn directives_stop_where_slurm_stops() {
        // C whitespace (vertical tab, form feed) before a comment keeps the scan going ...
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n\x0b# c\n\x0c\n#SBATCH -N 2\n").min_nodes, 2);
        // ... but a no-break space is not C whitespace: that line is a command.
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n\u{a0}# c\n#SBATCH -N 2\n").min_nodes, 1);
        // Inside a directive only C whitespace separates words.
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH -J a\u{a0}b\x0b-N\x0c3\n").name, "a\u{a0}b");
        assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH -J a\u{a0}b\x0b-N\x0c3\n").min_nodes, 3);
    }

    #[test]
    fn heterogeneous_jobs_are_refused_clearly() {
        let err = script_err("#!/bin/sh\n#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 2\n");
        assert_eq!(
            err.to_string(),
            "script line 3: heterogeneous jobs (#SBATCH hetjob) are not supported; submit the components as \
             separate jobs (in \"#SBATCH hetjob\")"
        );
        assert!(matches!(
            script_err("#!/bin/sh\n#SBATCH packjob\n"),
            SbatchError::Directive { error: OptionError::HetJob { .. }, .. }
        ));
    }
}
