//! Building the job from its options: [`Draft`] gathers them (each option's effect is in
//! [`Draft::apply`](super::options)), then [`Draft::finish`] resolves what depends on several of them, as Slurm
//! does once all are read: GPUs over nodes and tasks, per-GPU counts, memory, times and the environment.

use drover_state::container::{ContainerMount, ContainerSpec, ImageRef};
use drover_state::job::{ExportPolicy, JobSpec, MemRequest};
use drover_state::slurm_time;

use super::{CommandLine, ParsedSubmit, SbatchError, SubmitContext};
use crate::slurm::time::{TimeSpec, Zone};

/// One pyxis option as given; relative paths are resolved once the job's working directory is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerOption {
    Image(String),
    Mounts(String),
    Workdir(String),
    Name(String),
    Save(String),
    Readonly(bool),
    MountHome(bool),
    RemapRoot(bool),
    Entrypoint(bool),
    Env(Vec<String>),
}

/// The job while its options are applied, and what the options said that is resolved only once all are read.
pub(super) struct Draft {
    pub spec: JobSpec,
    /// `--job-name`; the script's name when not given.
    pub name: Option<String>,
    /// `--chdir`, made absolute against the submit directory at the end.
    pub chdir: Option<String>,
    /// `--export`'s `VAR=value` entries.
    pub export_set: Vec<(String, String)>,
    /// The winning `--export` value as given (`SLURM_EXPORT_ENV`).
    pub export_given: Option<String>,
    pub parsable: bool,
    /// `--wait`: return when the job has ended.
    pub wait: bool,
    pub nodes_given: bool,
    /// The last GPU option given (they replace each other entirely).
    pub gpus: Option<GpuRequest>,
    pub gpus_per_task_given: bool,
    pub cpus_per_task_given: bool,
    pub cpus_per_gpu: Option<u32>,
    pub ntasks_per_gpu: Option<u32>,
    /// Memory sizes from the script and command line, and from the environment: Slurm's rules tell them apart.
    pub mem_set: Vec<MemRequest>,
    pub mem_env: Vec<MemRequest>,
    pub begin: Option<TimeSpec>,
    pub deadline: Option<TimeSpec>,
    /// In the order found; each is listed once in the result.
    pub warnings: Vec<String>,
    /// pyxis's options, in the order given (a later one wins).
    pub container: Vec<ContainerOption>,
}

impl Draft {
    /// A job with Slurm's defaults, for the submitting user, before any option.
    pub(super) fn new(cmd: &CommandLine, ctx: &SubmitContext) -> Draft {
        let spec = JobSpec {
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
        Draft {
            spec,
            name: None,
            chdir: None,
            export_set: Vec::new(),
            export_given: None,
            parsable: false,
            wait: false,
            nodes_given: false,
            gpus: None,
            gpus_per_task_given: false,
            cpus_per_task_given: false,
            cpus_per_gpu: None,
            ntasks_per_gpu: None,
            mem_set: Vec::new(),
            mem_env: Vec::new(),
            begin: None,
            deadline: None,
            container: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Resolves what depends on several options, checks that they fit together, and makes the submission.
    pub(super) fn finish(
        mut self,
        cmd: &CommandLine,
        ctx: &SubmitContext,
        script: String,
        default_name: String,
    ) -> Result<ParsedSubmit, SbatchError> {
        self.resolve_resources()?;
        self.resolve_times(ctx)?;
        let Draft { mut spec, name, chdir, export_set, export_given, parsable, wait, warnings, container, .. } = self;
        spec.name = name.unwrap_or(default_name).into();
        spec.work_dir = match &chdir {
            Some(dir) => resolve_dir(&ctx.cwd, dir).into(),
            None => ctx.cwd.as_str().into(),
        };
        spec.container = container_spec(&container, &spec.work_dir)?.map(Box::new);
        let mut environment = export_environment(&spec.export, &export_set, &ctx.env);
        // `SLURM_EXPORT_ENV` as the job will see it: the --export value as given (`FOO,X=1`, quotes and all),
        // which the policy alone no longer spells. The job gets it with any list (see the agent's environment).
        if let (ExportPolicy::Vars { .. }, Some(given)) = (&spec.export, export_given) {
            environment.retain(|(n, _)| n != "SLURM_EXPORT_ENV");
            environment.push(("SLURM_EXPORT_ENV".to_string(), given));
        }
        if let Some((host, nice)) = &ctx.submission {
            for (name, value) in [("SLURM_SUBMIT_HOST", host.clone()), ("SLURM_PRIO_PROCESS", nice.to_string())] {
                environment.retain(|(n, _)| n != name);
                environment.push((name.to_string(), value));
            }
        }
        spec.environment = environment.into();
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
            wait,
            quiet: cmd.quiet,
            script_path: cmd.script_path.clone(),
            warnings: unique,
        })
    }

    /// Memory, GPUs, then the per-GPU counts folded in, as Slurm's `cons_tres` works them out.
    fn resolve_resources(&mut self) -> Result<(), SbatchError> {
        let spec = &mut self.spec;
        spec.mem = resolve_mem(&self.mem_set, &self.mem_env)?;
        resolve_gpus(spec, self.gpus.take(), self.nodes_given)?;
        if let Some(n) = self.ntasks_per_gpu {
            fold_ntasks_per_gpu(spec, n, self.nodes_given, self.gpus_per_task_given, &mut self.warnings)?;
        }
        if let Some(n) = self.cpus_per_gpu {
            if self.cpus_per_task_given {
                return Err(SbatchError::Conflict("--cpus-per-gpu is mutually exclusive with --cpus-per-task".into()));
            }
            fold_cpus_per_gpu(spec, n, &mut self.warnings)?;
        }
        if matches!(spec.mem, Some(MemRequest::PerGpu(_))) && spec.gpus_per_node == 0 && spec.gpus_total.is_none() {
            return Err(SbatchError::Conflict(
                "--mem-per-gpu needs GPUs: give --gpus, --gpus-per-node, --gpus-per-task or --gres".into(),
            ));
        }
        Ok(())
    }

    /// `--time-min` against `--time`, and `--begin` and `--deadline` placed against the submission's clock.
    fn resolve_times(&mut self, ctx: &SubmitContext) -> Result<(), SbatchError> {
        let spec = &mut self.spec;
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
            let secs = at.resolve(now_s, Zone::Offset(ctx.utc_offset_s), false).ok_or_else(|| {
                SbatchError::Conflict(format!("{flag} names a time before 1970 or beyond any calendar"))
            })?;
            Ok(Some(u64::try_from(secs).unwrap_or(0).saturating_mul(1_000)))
        };
        spec.begin_ms = place("--begin", self.begin.as_ref())?;
        spec.deadline_ms = place("--deadline", self.deadline.as_ref())?;
        if let (Some(begin), Some(deadline)) = (spec.begin_ms, spec.deadline_ms)
            && deadline < begin
        {
            return Err(SbatchError::Conflict(
                "Incompatible begin and deadline time specification: --deadline is before --begin".into(),
            ));
        }
        Ok(())
    }
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
pub(super) enum GpuRequest {
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
pub(super) fn most_tasks_on_a_node(spec: &JobSpec) -> u32 {
    spec.max_tasks_per_node(spec.min_nodes)
}

/// Where an option came from. Slurm's exclusivity rules treat the script and the command line alike ("set by
/// the command line") and let either override the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
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

/// pyxis's options folded into one container (`None` when none was given), relative paths resolved against the
/// job's working directory, where pyxis resolves them on the node.
fn container_spec(options: &[ContainerOption], work_dir: &str) -> Result<Option<ContainerSpec>, SbatchError> {
    if options.is_empty() {
        return Ok(None);
    }
    let mut spec = ContainerSpec::default();
    for option in options {
        match option {
            ContainerOption::Image(text) => spec.image = Some(ImageRef::parse_in(text, work_dir)?),
            ContainerOption::Mounts(text) => spec.mounts = ContainerMount::parse_list(text, work_dir)?,
            ContainerOption::Workdir(dir) => spec.workdir = Some(dir.clone()),
            ContainerOption::Name(name) => spec.name = Some(name.clone()),
            ContainerOption::Save(path) => spec.save = Some(resolve_dir(work_dir, path)),
            ContainerOption::Readonly(on) => spec.readonly = *on,
            ContainerOption::MountHome(on) => spec.mount_home = *on,
            ContainerOption::RemapRoot(on) => spec.remap_root = *on,
            ContainerOption::Entrypoint(on) => spec.entrypoint = *on,
            ContainerOption::Env(names) => spec.env = names.clone(),
        }
    }
    if spec.image.is_none() && spec.name.is_none() {
        // Flags such as --container-mounts alone configure nothing to run in: pyxis ignores them too.
        return Ok(None);
    }
    spec.validate()?;
    Ok(Some(spec))
}
