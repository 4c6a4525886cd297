//! What parsing yields: each option with its value checked, before any is applied to the job.

use drover_state::job::{ArraySpec, Dependency, ExportPolicy, MemRequest};

use super::Info;
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
