//! Every option `sbatch`, `srun` and `salloc` read, declared once: its long and short names, the `SBATCH_*`
//! variables that stand for it, whether it takes a value, how the value is checked, and (in [`Draft::apply`])
//! what it does to the job. Adding an option is one entry in [`OPTIONS`], one [`SbatchOption`] variant for its
//! checked value, and one arm in [`Draft::apply`]; nothing else in the parser changes.

use std::fmt;

use drover_state::container::{ContainerError, ContainerMount, ContainerSpec, ImageRef};
use drover_state::job::{ArraySpec, Dependency, ExportPolicy, GpuFreq, MemRequest};

use super::Info;
use super::resolve::{ContainerOption, Draft, GpuRequest, Source};
use super::values::{
    check_clusters, check_input, invalid, mail_type_note, parse_array, parse_constraint, parse_date, parse_dependency,
    parse_export, parse_gpu_count, parse_gres, parse_hosts, parse_limit, parse_mem_size, parse_nice, parse_no_kill,
    parse_nodes, parse_open_mode, parse_signal, parse_yes_no, positive,
};
use super::{DEFAULT_NICE, OptionError};
use crate::slurm::time::TimeSpec;

/// One parsed item of an argument list.
pub(super) enum Item {
    Option(SbatchOption),
    Wrap(String),
    Info(Info),
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
        /// The value as given, which the job sees as `SLURM_EXPORT_ENV`.
        given: String,
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
    /// `--kill-on-invalid-dep=yes|no`: cancel the job once a dependency can never be satisfied.
    KillOnInvalidDep(bool),
    /// `--gpu-freq`: the clocks of the job's GPUs.
    GpuFreq(GpuFreq),
    /// `--progress-timeout` (seconds; `None`: no hang detection for this job, whatever the defaults).
    ProgressTimeout(Option<u64>),
    /// One of pyxis's `--container-*` options (applied in order in [`Draft::finish`], where paths are resolved).
    Container(ContainerOption),
    Parsable,
    /// `--wait/-W`: sbatch returns once the job has ended, with its exit code.
    Wait,
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

/// Whether an option takes a value, as getopt's `has_arg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arg {
    No,
    Required,
    /// Attached only as `--name=value` (or `-Xvalue`); a separate next argument is never taken.
    Optional,
}

/// Checks one option's value (the flag as the user spelled it, for the error) and makes the option.
pub(super) type Parse = fn(&str, String) -> Result<Item, OptionError>;

/// What an option takes and what it becomes.
#[derive(Clone, Copy)]
pub(super) enum Takes {
    /// No value (getopt's `no_argument`): always this.
    Nothing(fn() -> Item),
    /// A value that must be given and may not be empty.
    Value(Parse),
    /// A value that must be given; the parser decides what an empty one means.
    Raw(Parse),
    /// A value only when attached (`--nice=5`); the first when there is none.
    Optional(fn() -> Item, Parse),
    /// Accepted, not acted on: warns `--long is ignored: {note}` (silent when the note is empty).
    Ignored(Arg, &'static str),
    /// Refused: the error says why.
    Refused(Arg, &'static str),
}

impl Takes {
    pub(super) fn arg(self) -> Arg {
        match self {
            Takes::Nothing(_) => Arg::No,
            Takes::Value(_) | Takes::Raw(_) => Arg::Required,
            Takes::Optional(..) => Arg::Optional,
            Takes::Ignored(arg, _) | Takes::Refused(arg, _) => arg,
        }
    }
}

/// One option: everything the parser knows of it.
pub(super) struct OptDef {
    pub long: &'static str,
    pub short: Option<char>,
    /// The input environment variables that stand for it (`sbatch` only), in the order Slurm reads them.
    pub env: &'static [&'static str],
    pub takes: Takes,
    /// Named in the "supported options" of [`OptionError::Unknown`]: the options Drover acts on.
    pub listed: bool,
}

const fn opt(long: &'static str, short: Option<char>, env: &'static [&'static str], takes: Takes) -> OptDef {
    let listed = !matches!(takes, Takes::Ignored(..) | Takes::Refused(..));
    OptDef { long, short, env, takes, listed }
}

impl OptDef {
    /// Left out of the "supported options": options whose only accepted values are what Drover does anyway, and
    /// `--help`, `--usage` and `--version`.
    const fn unlisted(self) -> OptDef {
        OptDef { listed: false, ..self }
    }
}

use Takes::{Ignored, Nothing, Optional, Raw, Refused, Value};

/// Why each accepted-and-ignored option is ignored (the warning's second half).
const PLACEMENT: &str = "Drover places jobs by node, CPU and GPU counts, not sockets, cores or threads";
const NO_REBOOT: &str = "Drover never reboots nodes for a job";
const NO_SWITCHES: &str = "Drover's placement does not count network switches";
const NO_SPEC_CORES: &str = "Drover reserves no cores for system use";

/// Every option of Slurm 22.05's `sbatch`, and Drover's `--multi-site` and `--progress-timeout`.
///
/// The order matters only for the input environment variables, which are applied in table order: a later one
/// replaces an earlier one where options replace each other (`SBATCH_GPUS_PER_NODE` over `SBATCH_GRES`, as in
/// Slurm), and warnings are listed in that order. Names are looked up, so the order changes nothing else.
pub(super) const OPTIONS: &[OptDef] = &[
    // Options with input environment variables, in the order Slurm 22.05's sbatch applies those (a later one wins
    // for options that replace each other, as the GPU options do).
    // Drover never translates #PBS lines, which is what --ignore-pbs asks for.
    opt("ignore-pbs", None, &["SBATCH_IGNORE_PBS"], Ignored(Arg::No, "")),
    opt("account", Some('A'), &["SBATCH_ACCOUNT"], Value(|_, v| option(SbatchOption::Account(v)))),
    opt("array", Some('a'), &["SBATCH_ARRAY_INX"], Value(|f, v| option(SbatchOption::Array(parse_array(f, &v)?)))),
    opt("acctg-freq", None, &["SBATCH_ACCTG_FREQ"], Ignored(Arg::Required, "Drover samples no accounting data")),
    opt("batch", None, &["SBATCH_BATCH"], Ignored(Arg::Required, "the batch script runs on the job's first node")),
    opt("bb", None, &["SBATCH_BURST_BUFFER"], Refused(Arg::Required, "burst buffers are not supported")),
    opt(
        "cluster-constraint",
        None,
        &["SBATCH_CLUSTER_CONSTRAINT"],
        Ignored(Arg::Required, "Drover runs a single cluster"),
    ),
    opt(
        "clusters",
        Some('M'),
        &["SBATCH_CLUSTERS", "SLURM_CLUSTERS"],
        Raw(|f, v| {
            check_clusters(f, &v)?;
            ignored("clusters", v, "")
        }),
    )
    .unlisted(),
    opt(
        "container",
        None,
        &["SBATCH_CONTAINER"],
        Refused(
            Arg::Required,
            "Slurm's OCI bundles (--container=PATH) are not supported; name an image with pyxis's --container-image",
        ),
    ),
    // NVIDIA pyxis's options, as its SPANK plugin adds them to srun, salloc and sbatch.
    opt(
        "container-image",
        None,
        &[],
        Value(|f, v| {
            // Checked now (a relative path is resolved against the working directory in `Draft::finish`).
            let probe = if v.starts_with("./") || v.starts_with("../") {
                ImageRef::parse_in(&v, "/")
            } else {
                ImageRef::parse(&v)
            };
            probe.map_err(|e| container_invalid(f, &v, e))?;
            container(ContainerOption::Image(v))
        }),
    ),
    opt(
        "container-mounts",
        None,
        &[],
        Value(|f, v| {
            ContainerMount::parse_list(&v, "/").map_err(|e| container_invalid(f, &v, e))?;
            container(ContainerOption::Mounts(v))
        }),
    ),
    opt(
        "container-workdir",
        None,
        &[],
        Value(|f, v| {
            if !v.starts_with('/') {
                return Err(invalid(f, &v, "the working directory inside the container must be an absolute path"));
            }
            container(ContainerOption::Workdir(v))
        }),
    ),
    opt("container-name", None, &[], Value(|_, v| container(ContainerOption::Name(v)))),
    opt("container-save", None, &[], Value(|_, v| container(ContainerOption::Save(v)))),
    opt(
        "container-writable",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::Readonly(false)))),
    ),
    opt(
        "container-readonly",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::Readonly(true)))),
    ),
    opt(
        "container-mount-home",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::MountHome(true)))),
    ),
    opt(
        "no-container-mount-home",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::MountHome(false)))),
    ),
    opt(
        "container-remap-root",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::RemapRoot(true)))),
    ),
    opt(
        "no-container-remap-root",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::RemapRoot(false)))),
    ),
    opt(
        "container-entrypoint",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::Entrypoint(true)))),
    ),
    opt(
        "no-container-entrypoint",
        None,
        &[],
        Nothing(|| Item::Option(SbatchOption::Container(ContainerOption::Entrypoint(false)))),
    ),
    opt(
        "container-env",
        None,
        &[],
        Value(|f, v| {
            let names: Vec<String> = v.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect();
            let probe = ContainerSpec { name: Some("probe".into()), env: names.clone(), ..ContainerSpec::default() };
            probe.validate().map_err(|e| container_invalid(f, &v, e))?;
            container(ContainerOption::Env(names))
        }),
    ),
    opt(
        "constraint",
        Some('C'),
        &["SBATCH_CONSTRAINT"],
        Value(|f, v| option(SbatchOption::Constraint(parse_constraint(f, &v)?))),
    ),
    opt("core-spec", Some('S'), &["SBATCH_CORE_SPEC"], Ignored(Arg::Required, NO_SPEC_CORES)),
    opt("cpu-freq", None, &["SBATCH_CPU_FREQ_REQ"], Ignored(Arg::Required, "Drover does not set CPU frequencies")),
    opt(
        "cpus-per-gpu",
        None,
        &["SBATCH_CPUS_PER_GPU"],
        Value(|f, v| option(SbatchOption::CpusPerGpu(positive(f, &v)?))),
    ),
    opt("verbose", Some('v'), &["SBATCH_DEBUG"], Ignored(Arg::No, "Drover's sbatch has no verbose output")),
    opt("delay-boot", None, &["SBATCH_DELAY_BOOT"], Ignored(Arg::Required, NO_REBOOT)),
    opt(
        "distribution",
        Some('m'),
        &["SBATCH_DISTRIBUTION"],
        Ignored(Arg::Required, "tasks are laid out in blocks, filling one node after another"),
    ),
    opt(
        "exclusive",
        None,
        &["SBATCH_EXCLUSIVE"],
        Optional(|| Item::Option(SbatchOption::Exclusive(Exclusive::Node)), |f, v| option(parse_exclusive(f, &v)?)),
    ),
    opt(
        "export",
        None,
        &["SBATCH_EXPORT"],
        Value(|f, v| {
            let (policy, set) = parse_export(f, &v)?;
            option(SbatchOption::Export { policy, set, given: v })
        }),
    ),
    opt(
        "get-user-env",
        None,
        &["SBATCH_GET_USER_ENV"],
        Ignored(Arg::Optional, "the job gets the submitting environment (--export), not a login environment"),
    ),
    opt(
        "gres",
        None,
        &["SBATCH_GRES"],
        Value(|f, v| {
            let (per_node, gpu_type) = parse_gres(f, &v)?;
            option(SbatchOption::Gpus { per_node, gpu_type })
        }),
    ),
    opt(
        "gres-flags",
        None,
        &["SBATCH_GRES_FLAGS"],
        Ignored(Arg::Required, "GPUs are chosen without regard to CPU binding"),
    ),
    opt(
        "gpus",
        Some('G'),
        &["SBATCH_GPUS"],
        Value(|f, v| gpus(f, &v, |count, gpu_type| SbatchOption::GpusTotal { count, gpu_type })),
    ),
    opt(
        "gpu-bind",
        None,
        &["SBATCH_GPU_BIND"],
        Ignored(Arg::Required, "every task sees all of the job's GPUs on its node"),
    ),
    opt(
        "gpu-freq",
        None,
        &["SBATCH_GPU_FREQ"],
        Raw(|f, v| {
            let expected = "expected [LEVEL][,memory=LEVEL][,verbose], LEVEL one of low, medium, high, highm1 or MHz";
            let freq = GpuFreq::parse(&v).map_err(|_| invalid(f, &v, expected))?;
            option(SbatchOption::GpuFreq(freq))
        }),
    ),
    opt(
        "gpus-per-node",
        None,
        &["SBATCH_GPUS_PER_NODE"],
        Value(|f, v| gpus(f, &v, |per_node, gpu_type| SbatchOption::Gpus { per_node, gpu_type })),
    ),
    opt(
        "gpus-per-socket",
        None,
        &["SBATCH_GPUS_PER_SOCKET"],
        Refused(Arg::Required, "not supported; ask for GPUs with --gpus-per-node, --gpus or --gres"),
    ),
    opt(
        "gpus-per-task",
        None,
        &["SBATCH_GPUS_PER_TASK"],
        Value(|f, v| gpus(f, &v, |count, gpu_type| SbatchOption::GpusPerTask { count, gpu_type })),
    ),
    opt("hint", None, &["SLURM_HINT", "SBATCH_HINT"], Ignored(Arg::Required, "Drover does not bind tasks to cores")),
    opt("job-name", Some('J'), &["SBATCH_JOB_NAME"], Value(|_, v| option(SbatchOption::JobName(v)))),
    opt("mem-bind", None, &["SBATCH_MEM_BIND"], Ignored(Arg::Required, "Drover does not bind memory to NUMA nodes")),
    opt(
        "mem-per-cpu",
        None,
        &["SBATCH_MEM_PER_CPU"],
        Value(|f, v| option(SbatchOption::Mem(MemRequest::PerCpu(parse_mem_size(f, &v)?)))),
    ),
    opt(
        "mem-per-gpu",
        None,
        &["SBATCH_MEM_PER_GPU"],
        Value(|f, v| option(SbatchOption::Mem(MemRequest::PerGpu(parse_mem_size(f, &v)?)))),
    ),
    opt(
        "mem",
        None,
        &["SBATCH_MEM_PER_NODE"],
        Value(|f, v| option(SbatchOption::Mem(MemRequest::PerNode(parse_mem_size(f, &v)?)))),
    ),
    opt("network", None, &["SBATCH_NETWORK"], Ignored(Arg::Required, "Drover configures no network resources")),
    opt(
        "no-kill",
        Some('k'),
        &["SBATCH_NO_KILL"],
        Optional(
            || Item::Option(SbatchOption::NoKill(true)),
            |f, v| option(SbatchOption::NoKill(parse_no_kill(f, &v)?)),
        ),
    ),
    opt("no-requeue", None, &["SBATCH_NO_REQUEUE"], Nothing(|| Item::Option(SbatchOption::Requeue(false)))),
    opt(
        "open-mode",
        None,
        &["SBATCH_OPEN_MODE"],
        Value(|f, v| option(SbatchOption::OpenAppend(parse_open_mode(f, &v)?))),
    ),
    opt("overcommit", Some('O'), &["SBATCH_OVERCOMMIT"], Ignored(Arg::No, "every task gets its own CPUs")),
    opt("partition", Some('p'), &["SBATCH_PARTITION"], Value(|_, v| option(SbatchOption::Partition(v)))),
    opt("power", None, &["SBATCH_POWER"], Ignored(Arg::Required, "Drover has no power management")),
    opt("profile", None, &["SBATCH_PROFILE"], Ignored(Arg::Required, "Drover gathers no profiles")),
    opt("qos", Some('q'), &["SBATCH_QOS"], Value(|_, v| option(SbatchOption::Qos(v)))),
    opt("switches", None, &["SBATCH_REQ_SWITCH", "SBATCH_WAIT4SWITCH"], Ignored(Arg::Required, NO_SWITCHES)),
    opt("requeue", None, &["SBATCH_REQUEUE"], Nothing(|| Item::Option(SbatchOption::Requeue(true)))),
    opt("reservation", None, &["SBATCH_RESERVATION"], Value(|_, v| option(SbatchOption::Reservation(v)))),
    opt("signal", None, &["SBATCH_SIGNAL"], Value(|f, v| option(SbatchOption::Signal(parse_signal(f, &v)?)))),
    opt("spread-job", None, &["SBATCH_SPREAD_JOB"], Ignored(Arg::No, "nodes are chosen by Drover's placement")),
    opt("thread-spec", None, &["SBATCH_THREAD_SPEC"], Ignored(Arg::Required, NO_SPEC_CORES)),
    opt("threads-per-core", None, &["SBATCH_THREADS_PER_CORE"], Ignored(Arg::Required, PLACEMENT)),
    opt("time", Some('t'), &["SBATCH_TIMELIMIT"], Value(|f, v| option(SbatchOption::TimeLimit(parse_limit(f, &v)?)))),
    opt(
        "use-min-nodes",
        None,
        &["SBATCH_USE_MIN_NODES"],
        Ignored(Arg::No, "the scheduler picks the node count within --nodes"),
    ),
    opt("wait", Some('W'), &["SBATCH_WAIT"], Nothing(|| Item::Option(SbatchOption::Wait))),
    opt(
        "wait-all-nodes",
        None,
        &["SBATCH_WAIT_ALL_NODES"],
        Ignored(Arg::Required, "the script starts as soon as the allocation is made"),
    ),
    opt("wckey", None, &["SBATCH_WCKEY"], Value(|_, v| option(SbatchOption::Wckey(v)))),
    opt("error", Some('e'), &["SBATCH_ERROR"], Value(|_, v| option(SbatchOption::Error(v)))),
    opt(
        "input",
        Some('i'),
        &["SBATCH_INPUT"],
        Raw(|f, v| {
            check_input(f, &v)?;
            ignored("input", v, "")
        }),
    )
    .unlisted(),
    opt("output", Some('o'), &["SBATCH_OUTPUT"], Value(|_, v| option(SbatchOption::Output(v)))),
    opt("multi-site", None, &["SBATCH_MULTI_SITE"], Nothing(|| Item::Option(SbatchOption::MultiSite))),
    opt(
        "progress-timeout",
        None,
        &["SBATCH_PROGRESS_TIMEOUT"],
        Value(|f, v| option(SbatchOption::ProgressTimeout(parse_limit(f, &v)?))),
    ),
    // The options with no input environment variable, in the order of Slurm's option table.
    opt("begin", Some('b'), &[], Value(|f, v| option(SbatchOption::Begin(parse_date(f, &v)?)))),
    opt("bbf", None, &[], Refused(Arg::Required, "burst buffers are not supported")),
    opt("chdir", Some('D'), &[], Value(|_, v| option(SbatchOption::Chdir(v)))),
    opt(
        "cluster",
        None,
        &[],
        Raw(|f, v| {
            check_clusters(f, &v)?;
            ignored("cluster", v, "")
        }),
    )
    .unlisted(),
    opt("comment", None, &[], Value(|_, v| option(SbatchOption::Comment(v)))),
    opt("context", None, &[], Ignored(Arg::Required, "Drover sets no SELinux context")),
    opt("contiguous", None, &[], Ignored(Arg::No, "nodes are chosen without regard to their names")),
    opt("cores-per-socket", None, &[], Ignored(Arg::Required, PLACEMENT)),
    opt("cpus-per-task", Some('c'), &[], Value(|f, v| option(SbatchOption::CpusPerTask(positive(f, &v)?)))),
    opt("deadline", None, &[], Value(|f, v| option(SbatchOption::Deadline(parse_date(f, &v)?)))),
    opt(
        "dependency",
        Some('d'),
        &[],
        Value(|f, v| {
            let (deps, any) = parse_dependency(f, &v)?;
            option(SbatchOption::Dependency { deps, any })
        }),
    ),
    opt("exclude", Some('x'), &[], Value(|f, v| option(SbatchOption::Exclude(parse_hosts(f, &v)?)))),
    opt(
        "export-file",
        None,
        &[],
        Ignored(Arg::Required, "the variables in that file are not loaded; pass them with --export"),
    ),
    opt("extra-node-info", Some('B'), &[], Ignored(Arg::Required, PLACEMENT)),
    opt(
        "gid",
        None,
        &[],
        Refused(Arg::Required, "only root may submit as another group; Drover takes the group from your credential"),
    ),
    opt("hold", Some('H'), &[], Nothing(|| Item::Option(SbatchOption::Hold))),
    opt("kill-on-invalid-dep", None, &[], Raw(|f, v| option(SbatchOption::KillOnInvalidDep(parse_yes_no(f, &v)?)))),
    opt(
        "licenses",
        Some('L'),
        &[],
        Ignored(Arg::Required, "Drover tracks no licenses; the job may start while none is free"),
    ),
    opt("mail-type", None, &[], Raw(|_, v| ignored("mail-type", v.clone(), mail_type_note(&v)))).unlisted(),
    opt("mail-user", None, &[], Ignored(Arg::Required, "Drover sends no mail")),
    opt("mcs-label", None, &[], Ignored(Arg::Required, "Drover has no MCS labels")),
    opt("mincpus", None, &[], Ignored(Arg::Required, "CPUs are reserved by --cpus-per-task and the task counts")),
    opt(
        "nice",
        None,
        &[],
        Optional(
            || Item::Option(SbatchOption::Nice(DEFAULT_NICE)),
            |f, v| option(SbatchOption::Nice(parse_nice(f, &v)?)),
        ),
    ),
    opt("nodefile", Some('F'), &[], Refused(Arg::Required, "not supported; list the nodes with --nodelist")),
    opt("nodelist", Some('w'), &[], Value(|f, v| option(SbatchOption::Nodelist(parse_hosts(f, &v)?)))),
    opt(
        "nodes",
        Some('N'),
        &[],
        Value(|f, v| {
            let (min, max) = parse_nodes(f, &v)?;
            option(SbatchOption::Nodes { min, max })
        }),
    ),
    opt("ntasks", Some('n'), &[], Value(|f, v| option(SbatchOption::Ntasks(positive(f, &v)?)))),
    opt("ntasks-per-core", None, &[], Ignored(Arg::Required, PLACEMENT)),
    opt("ntasks-per-gpu", None, &[], Value(|f, v| option(SbatchOption::NtasksPerGpu(positive(f, &v)?)))),
    opt("ntasks-per-node", None, &[], Value(|f, v| option(SbatchOption::NtasksPerNode(positive(f, &v)?)))),
    opt("ntasks-per-socket", None, &[], Ignored(Arg::Required, PLACEMENT)),
    opt("ntasks-per-tres", None, &[], Value(|f, v| option(SbatchOption::NtasksPerGpu(positive(f, &v)?)))),
    opt("oversubscribe", Some('s'), &[], Nothing(|| Item::Option(SbatchOption::Exclusive(Exclusive::Oversubscribe)))),
    opt("parsable", None, &[], Nothing(|| Item::Option(SbatchOption::Parsable))),
    opt(
        "prefer",
        None,
        &[],
        Ignored(Arg::Required, "soft feature preferences are not supported; --constraint sets hard ones"),
    ),
    opt(
        "priority",
        None,
        &[],
        Ignored(Arg::Required, "only an operator may set a job's priority; use --nice to lower it"),
    ),
    opt(
        "propagate",
        None,
        &[],
        Ignored(Arg::Optional, "the submitting shell's resource limits are not applied to the job"),
    ),
    opt("quiet", Some('Q'), &[], Nothing(|| Item::Option(SbatchOption::Quiet))),
    opt("version", Some('V'), &[], Nothing(|| Item::Info(Info::Version))).unlisted(),
    opt("help", Some('h'), &[], Nothing(|| Item::Info(Info::Help))).unlisted(),
    opt("usage", None, &[], Nothing(|| Item::Info(Info::Usage))).unlisted(),
    opt("reboot", None, &[], Ignored(Arg::No, NO_REBOOT)),
    opt("sockets-per-node", None, &[], Ignored(Arg::Required, PLACEMENT)),
    opt("tasks-per-node", None, &[], Value(|f, v| option(SbatchOption::NtasksPerNode(positive(f, &v)?)))),
    opt(
        "test-only",
        None,
        &[],
        Refused(Arg::No, "not supported yet; Drover cannot estimate a start time without submitting"),
    ),
    opt("time-min", None, &[], Value(|f, v| option(SbatchOption::TimeMin(parse_limit(f, &v)?)))),
    opt("tmp", None, &[], Ignored(Arg::Required, "Drover does not track local disk space")),
    opt(
        "uid",
        None,
        &[],
        Refused(Arg::Required, "only root may submit as another user; Drover takes the user from your credential"),
    ),
    opt("wrap", None, &[], Raw(parse_wrap)),
];

// What the table's entries are made of.

/// An option as a parse result: the table's parsers end in this.
pub(super) fn option(option: SbatchOption) -> Result<Item, OptionError> {
    Ok(Item::Option(option))
}

/// `--gpus-per-node`, `--gpus`, `--gpus-per-task`: a count and an optional type, made into the option by `make`.
pub(super) fn gpus(
    flag: &str,
    value: &str,
    make: fn(u32, Option<String>) -> SbatchOption,
) -> Result<Item, OptionError> {
    let (count, gpu_type) = parse_gpu_count(flag, value)?;
    option(make(count, gpu_type))
}

pub(super) fn parse_exclusive(flag: &str, value: &str) -> Result<SbatchOption, OptionError> {
    let mode = match value.to_ascii_lowercase().as_str() {
        "exclusive" => Exclusive::Node,
        "user" => Exclusive::User,
        "mcs" => Exclusive::Mcs,
        "oversubscribe" => Exclusive::Oversubscribe,
        _ => return Err(invalid(flag, value, "expected user, mcs or oversubscribe (or no value)")),
    };
    Ok(SbatchOption::Exclusive(mode))
}

pub(super) fn parse_wrap(flag: &str, value: String) -> Result<Item, OptionError> {
    if value.is_empty() {
        return Err(invalid(flag, &value, "expected a command to run"));
    }
    Ok(Item::Wrap(value))
}

fn container(option: ContainerOption) -> Result<Item, OptionError> {
    Ok(Item::Option(SbatchOption::Container(option)))
}

fn container_invalid(flag: &str, value: &str, error: ContainerError) -> OptionError {
    let why = error.to_string();
    // The error names the value already; keep only what follows it.
    let expected = why.split_once(": ").map_or(why.as_str(), |(_, rest)| rest);
    invalid(flag, value, expected)
}

/// An option accepted and not acted on; `note` (when not empty) says why, in a warning.
fn ignored(flag: &'static str, value: String, note: &'static str) -> Result<Item, OptionError> {
    option(SbatchOption::Ignored { flag, value: Some(value), note })
}

/// Every input environment variable and the long option it stands for, in the order they are applied.
pub fn env_options() -> impl Iterator<Item = (&'static str, &'static str)> {
    OPTIONS.iter().flat_map(|def| def.env.iter().map(move |var| (*var, def.long)))
}

pub(super) fn find_long(name: &str) -> Option<&'static OptDef> {
    OPTIONS.iter().find(|d| d.long == name)
}

pub(super) fn find_short(c: char) -> Option<&'static OptDef> {
    OPTIONS.iter().find(|d| d.short == Some(c))
}

/// Lists the supported options in [`OptionError::Unknown`]'s message.
pub(super) struct SupportedOptions;

impl fmt::Display for SupportedOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The most used first, as before; the rest alphabetically.
        let mut defs: Vec<&OptDef> = OPTIONS.iter().filter(|d| d.listed && !HIDDEN.contains(&d.long)).collect();
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

impl Draft {
    /// What one option does to the job being built. Options arrive script first, then environment, then command
    /// line; a later one overrides an earlier one unless the option says otherwise here.
    pub(super) fn apply(&mut self, source: Source, option: &SbatchOption) {
        let spec = &mut self.spec;
        match option {
            SbatchOption::JobName(v) => self.name = Some(v.clone()),
            SbatchOption::Partition(v) => spec.partition = Some(v.clone().into()),
            SbatchOption::Account(v) => spec.account = Some(v.clone().into()),
            SbatchOption::Nodes { min, max } => {
                spec.min_nodes = *min;
                spec.max_nodes = *max;
                self.nodes_given = true;
            }
            SbatchOption::Ntasks(n) => spec.ntasks = Some(*n),
            SbatchOption::NtasksPerNode(n) => spec.ntasks_per_node = Some(*n),
            SbatchOption::CpusPerTask(n) => {
                spec.cpus_per_task = *n;
                self.cpus_per_task_given = true;
            }
            SbatchOption::Gpus { per_node, gpu_type } => {
                self.gpus = Some(GpuRequest::PerNode(*per_node));
                spec.gpu_type = gpu_type.as_deref().map(Into::into);
            }
            SbatchOption::GpusTotal { count, gpu_type } => {
                self.gpus = Some(GpuRequest::Total(*count));
                spec.gpu_type = gpu_type.as_deref().map(Into::into);
            }
            SbatchOption::GpusPerTask { count, gpu_type } => {
                self.gpus = Some(GpuRequest::PerTask(*count));
                spec.gpu_type = gpu_type.as_deref().map(Into::into);
                self.gpus_per_task_given = true;
            }
            SbatchOption::CpusPerGpu(n) => self.cpus_per_gpu = Some(*n),
            SbatchOption::NtasksPerGpu(n) => self.ntasks_per_gpu = Some(*n),
            // Slurm's memory rules tell the environment's sizes from the others: see `resolve_mem`.
            SbatchOption::Mem(mem) if source == Source::Environment => self.mem_env.push(*mem),
            SbatchOption::Mem(mem) => self.mem_set.push(*mem),
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
            SbatchOption::Begin(at) => self.begin = Some(at.clone()),
            SbatchOption::Deadline(at) => self.deadline = Some(at.clone()),
            SbatchOption::Output(v) => spec.stdout = Some(v.clone().into()),
            SbatchOption::Error(v) => spec.stderr = Some(v.clone().into()),
            SbatchOption::Chdir(v) => self.chdir = Some(v.clone()),
            SbatchOption::Export { policy, set, given } => {
                spec.export = policy.clone();
                self.export_set = set.clone();
                self.export_given = Some(given.clone());
            }
            SbatchOption::Requeue(v) => spec.requeue = Some(*v),
            SbatchOption::Signal(w) => spec.signal = Some(*w),
            SbatchOption::NoKill(v) => spec.no_kill = *v,
            SbatchOption::Hold => spec.hold = true,
            SbatchOption::MultiSite => spec.multi_site = true,
            SbatchOption::KillOnInvalidDep(v) => spec.kill_on_invalid_dep = *v,
            SbatchOption::GpuFreq(freq) => spec.gpu_freq = Some(Box::new(*freq)),
            // Seconds in the spec, at most u32 (136 years); UNLIMITED or 0 turns detection off for the job.
            SbatchOption::ProgressTimeout(limit) => {
                spec.progress_timeout_s = Some(limit.map_or(0, |s| s.min(u64::from(u32::MAX)) as u32))
            }
            SbatchOption::Container(c) => self.container.push(c.clone()),
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
                self.warnings.extend(warning.map(str::to_string));
            }
            SbatchOption::Constraint(v) => spec.constraint = v.clone().into(),
            SbatchOption::Nodelist(v) => spec.nodelist = v.clone().into(),
            SbatchOption::Exclude(v) => spec.exclude = v.clone().into(),
            SbatchOption::Wckey(v) => spec.wckey = Some(v.clone().into()),
            SbatchOption::Comment(v) => spec.comment = Some(v.clone().into()),
            SbatchOption::Parsable => self.parsable = true,
            SbatchOption::Wait => self.wait = true,
            // Slurm reads --quiet in its first pass over the command line only; elsewhere it does nothing.
            SbatchOption::Quiet if source == Source::Script => {
                self.warnings.push("--quiet in a #SBATCH line has no effect; give it on the command line".to_string());
            }
            SbatchOption::Quiet => {}
            SbatchOption::Ignored { flag, note, .. } => {
                if !note.is_empty() {
                    self.warnings.push(format!("--{flag} is ignored: {note}"));
                }
            }
        }
    }
}
