//! The environment of a task, as Slurm and PyTorch expect it. Pure: the same job and placement always give the
//! same variables, so a requeued or re-attached task sees what the first one saw.

use drover_state::hostlist::compress_hostlist;
use drover_state::job::MemRequest;
use drover_state::{ExportPolicy, Job};

/// Where one task runs within its job (and step, for `srun`).
pub struct Placement<'a> {
    pub job: &'a Job,
    /// Per allocated node: the host name others reach it by (the first is `MASTER_ADDR`).
    pub hosts: &'a [String],
    /// This node's index in the job's allocation, and its name.
    pub node_index: u32,
    pub node_name: &'a str,
    /// GPU indices the job holds on this node.
    pub gpus: &'a [u32],
    /// For a step's task: its id, its nodes and tasks per node, and the task's global and local rank.
    pub step: Option<StepPlacement<'a>>,
    /// How to reach the controllers from inside the job (so `srun`, `scontrol`, `squeue` work there).
    pub controllers: &'a str,
    /// The node's client configuration (TLS files, authd socket) for commands run inside the job; empty: the
    /// CLI's default path.
    pub client_config: &'a str,
    /// `SLURM_CLUSTER_NAME` (unset while empty).
    pub cluster_name: &'a str,
}

/// Variables the submitting command records in the job's environment whatever `--export` says, as Slurm's
/// sbatch, salloc and srun set them in the job's: they describe the submission, not the user's environment.
pub const SUBMISSION_VARIABLES: [&str; 2] = ["SLURM_SUBMIT_HOST", "SLURM_PRIO_PROCESS"];

pub struct StepPlacement<'a> {
    pub step_id: u32,
    pub nodes: &'a [String],
    pub tasks_per_node: &'a [u32],
    pub rank: u32,
    pub local_rank: u32,
}

/// A port for the job's rendezvous: fixed per job (every task computes the same one), spread over a range
/// that avoids the well-known and the ephemeral ports.
pub fn master_port(job_id: u64) -> u16 {
    (15_000 + job_id % 15_000) as u16
}

/// Slurm's `SLURM_TASKS_PER_NODE` syntax: runs of equal counts compressed, `4(x2),3`.
pub fn tasks_per_node_string(counts: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let mut j = i;
        while j + 1 < counts.len() && counts[j + 1] == counts[i] {
            j += 1;
        }
        let run = j - i + 1;
        parts.push(if run > 1 { format!("{}(x{run})", counts[i]) } else { counts[i].to_string() });
        i = j + 1;
    }
    parts.join(",")
}

/// The whole environment of one task: the exported submit environment, then Slurm's and torch's variables
/// (which win over exported ones of the same name, as in Slurm).
/// `USER`, `LOGNAME`, `HOME` and `SHELL` of `uid` as the node's user database has them (`user`, the name the
/// controllers verified, for the first two when the node does not know the uid).
fn login_environment(uid: u32, user: &str) -> Vec<(&'static str, String)> {
    let (name, home, shell) = passwd_entry(uid).unwrap_or_else(|| (user.to_string(), String::new(), String::new()));
    let mut vars = vec![("USER", name.clone()), ("LOGNAME", name)];
    if !home.is_empty() {
        vars.push(("HOME", home));
    }
    if !shell.is_empty() {
        vars.push(("SHELL", shell));
    }
    vars
}

/// Name, home directory and shell of `uid` from the node's user database.
pub(crate) fn passwd_entry(uid: u32) -> Option<(String, String, String)> {
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: all-zero is a valid passwd (null pointers, zero ids); getpwuid_r fills it.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and buf.len() is its real size.
        let rc = unsafe { libc::getpwuid_r(uid, &mut entry, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
        match rc {
            0 if found.is_null() => return None,
            0 => {
                // SAFETY: getpwuid_r succeeded, so these point at NUL-terminated strings inside `buf`.
                let text = |p: *const libc::c_char| {
                    if p.is_null() {
                        String::new()
                    } else {
                        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
                    }
                };
                return Some((text(entry.pw_name), text(entry.pw_dir), text(entry.pw_shell)));
            }
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            _ => return None,
        }
    }
}

pub fn task_environment(p: &Placement, base: Vec<(String, String)>) -> Vec<(String, String)> {
    let spec = &p.job.spec;
    let mut env = Env(base);
    // Without the submit environment (anything but --export=ALL), Slurm still gives the task its user's login
    // variables from the node's user database, and says which export it was (checked against Slurm 22.05):
    // scripts run with --export=NONE rely on HOME and USER.
    let exports_all = matches!(spec.export, ExportPolicy::All | ExportPolicy::Vars { all: true, .. });
    if !exports_all {
        for (name, value) in login_environment(spec.uid, &spec.user) {
            if !env.0.iter().any(|(n, _)| *n == name) {
                env.0.push((name.to_string(), value));
            }
        }
    }
    // Slurm records how the job was exported, as given, whenever it was not the default.
    match &spec.export {
        ExportPolicy::All => {}
        ExportPolicy::None => env.set("SLURM_EXPORT_ENV", "NONE".to_string()),
        ExportPolicy::Vars { all, names } => {
            // As sbatch recorded it (with its `VAR=value` entries), else as the policy spells it.
            let recorded = spec.environment.iter().find(|(n, _)| n == "SLURM_EXPORT_ENV").map(|(_, v)| v.clone());
            let given = recorded.unwrap_or_else(|| {
                let names = all.then_some("ALL").into_iter().chain(names.iter().map(|n| n.as_str()));
                names.collect::<Vec<_>>().join(",")
            });
            env.set("SLURM_EXPORT_ENV", given);
        }
    }
    for name in SUBMISSION_VARIABLES {
        if let Some((_, value)) = spec.environment.iter().find(|(n, _)| n == name) {
            env.set(name, value.clone());
        }
    }
    job_variables(&mut env, p);
    resource_variables(&mut env, p);
    node_variables(&mut env, p);
    step_variables(&mut env, p);
    let mut env = env.0;
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()));
    }
    env
}

/// The task's environment as it is built: a variable set again replaces the earlier value and moves to the end.
struct Env(Vec<(String, String)>);

impl Env {
    fn set(&mut self, k: &str, v: String) {
        self.0.retain(|(name, _)| name != k);
        self.0.push((k.to_string(), v));
    }
}

/// Who and what the job is: ids, owner, partition, account, QOS, reservation, array.
fn job_variables(env: &mut Env, p: &Placement) {
    let job = p.job;
    let spec = &job.spec;
    env.set("SLURM_JOB_ID", job.id.to_string());
    env.set("SLURM_JOBID", job.id.to_string());
    env.set("SLURM_JOB_NAME", spec.name.to_string());
    env.set("SLURM_JOB_USER", spec.user.to_string());
    env.set("SLURM_JOB_UID", spec.uid.to_string());
    env.set("SLURM_JOB_GID", spec.gid.to_string());
    env.set("SLURM_JOB_PARTITION", job.partition.to_string());
    env.set("SLURM_JOB_ACCOUNT", job.account_name().to_string());
    env.set("SLURM_JOB_QOS", job.qos_name().to_string());
    if let Some(r) = &spec.reservation {
        env.set("SLURM_JOB_RESERVATION", r.to_string());
    }
    if let Some(g) = spec.gpus_per_task {
        env.set("SLURM_GPUS_PER_TASK", g.to_string());
    }
    if let Some(a) = job.array.as_deref() {
        env.set("SLURM_ARRAY_JOB_ID", a.array_job_id.to_string());
        env.set("SLURM_ARRAY_TASK_ID", a.task_id.to_string());
        env.set("SLURM_ARRAY_TASK_COUNT", a.task_count.to_string());
        env.set("SLURM_ARRAY_TASK_MAX", a.task_max.to_string());
        env.set("SLURM_ARRAY_TASK_MIN", a.task_min.to_string());
        env.set("SLURM_ARRAY_TASK_STEP", array_step(a.task_min, a.task_max, a.task_count).to_string());
    }
    if !p.cluster_name.is_empty() {
        env.set("SLURM_CLUSTER_NAME", p.cluster_name.to_string());
    }
}

/// What the job holds: its nodes, tasks, CPUs and memory.
fn resource_variables(env: &mut Env, p: &Placement) {
    let job = p.job;
    let spec = &job.spec;
    let nodelist = compress_hostlist(&job.nodes);
    let job_tasks: Vec<u32> = job.allocation.iter().map(|a| a.tasks).collect();
    env.set("SLURM_JOB_NODELIST", nodelist.clone());
    env.set("SLURM_NODELIST", nodelist);
    env.set("SLURM_JOB_NUM_NODES", job.nodes.len().to_string());
    env.set("SLURM_NNODES", job.nodes.len().to_string());
    // Slurm's sbatch sets the task count only when it was asked for (-n, --ntasks-per-node); scripts test for it.
    if spec.ntasks.is_some() || spec.ntasks_per_node.is_some() {
        env.set("SLURM_NTASKS", job_tasks.iter().sum::<u32>().to_string());
        env.set("SLURM_NPROCS", job_tasks.iter().sum::<u32>().to_string());
    }
    if let Some(per_node) = spec.ntasks_per_node {
        env.set("SLURM_NTASKS_PER_NODE", per_node.to_string());
    }
    env.set("SLURM_TASKS_PER_NODE", tasks_per_node_string(&job_tasks));
    // Only when asked for, as Slurm (the request keeps no trace of an explicit `-c 1`, which Slurm would show).
    if spec.cpus_per_task != 1 {
        env.set("SLURM_CPUS_PER_TASK", spec.cpus_per_task.to_string());
    }
    // The CPUs the job holds per node, in the same compressed form (MPI launchers and Dask read it).
    let job_cpus: Vec<u32> = job.allocation.iter().map(|a| a.cpus).collect();
    env.set("SLURM_JOB_CPUS_PER_NODE", tasks_per_node_string(&job_cpus));
    env.set("SLURM_CPUS_ON_NODE", job_cpus.get(p.node_index as usize).copied().unwrap_or(0).to_string());
    if let Some(n) = spec.cpus_per_gpu {
        env.set("SLURM_CPUS_PER_GPU", n.to_string());
    }
    if let Some(n) = spec.ntasks_per_gpu {
        env.set("SLURM_NTASKS_PER_GPU", n.to_string());
    }
    if let Some(freq) = &spec.gpu_freq {
        env.set("SLURM_GPU_FREQ", freq.to_string());
    }
    // As Slurm sets them: the request in MiB, under the name of its kind (--mem=0 shows the node's share).
    match spec.mem {
        Some(MemRequest::PerNode(0)) => {
            let share = job.allocation.get(p.node_index as usize).map_or(0, |a| a.mem_mb);
            env.set("SLURM_MEM_PER_NODE", share.to_string());
        }
        Some(MemRequest::PerNode(mb)) => env.set("SLURM_MEM_PER_NODE", mb.to_string()),
        Some(MemRequest::PerCpu(mb)) => env.set("SLURM_MEM_PER_CPU", mb.to_string()),
        Some(MemRequest::PerGpu(mb)) => env.set("SLURM_MEM_PER_GPU", mb.to_string()),
        None => {}
    }
}

/// This node's part, the job's checkpoints and restarts, and where its ranks meet and the controllers are.
fn node_variables(env: &mut Env, p: &Placement) {
    let job = p.job;
    let spec = &job.spec;
    let gpus = p.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    env.set("SLURM_NODEID", p.node_index.to_string());
    env.set("SLURMD_NODENAME", p.node_name.to_string());
    env.set("SLURM_TOPOLOGY_ADDR", p.node_name.to_string());
    // Flat topology: the address is the node alone. No cloud nodes, so no aliases (Slurm's "(null)").
    env.set("SLURM_TOPOLOGY_ADDR_PATTERN", "node".to_string());
    env.set("SLURM_NODE_ALIASES", "(null)".to_string());
    if !p.gpus.is_empty() {
        env.set("SLURM_GPUS_ON_NODE", p.gpus.len().to_string());
        env.set("SLURM_JOB_GPUS", gpus.clone());
        env.set("SLURM_STEP_GPUS", gpus.clone());
        env.set("CUDA_VISIBLE_DEVICES", gpus);
    }
    env.set("SLURM_SUBMIT_DIR", spec.submit_dir.to_string());
    // Set from the first requeue on, as Slurm: `${SLURM_RESTART_COUNT:-0}` is how scripts read it.
    if job.restart_count > 0 {
        env.set("SLURM_RESTART_COUNT", job.restart_count.to_string());
    }
    // Checkpoints: where this incarnation writes them, and the latest an earlier one recorded (resume from it).
    env.set("DROVER_CHECKPOINT_DIR", job.checkpoint_dir());
    env.set("DROVER_INCARNATION", job.incarnation.to_string());
    if let Some(checkpoint) = job.resume_from() {
        env.set("DROVER_RESUME_FROM", checkpoint.path.clone());
        if let Some(step) = checkpoint.step {
            env.set("DROVER_RESUME_STEP", step.to_string());
        }
    }
    env.set("MASTER_ADDR", p.hosts.first().cloned().unwrap_or_else(|| "localhost".to_string()));
    env.set("MASTER_PORT", master_port(job.id).to_string());
    env.set("DROVER_CONTROLLERS", p.controllers.to_string());
    if !p.client_config.is_empty() {
        env.set("DROVER_CONFIG", p.client_config.to_string());
    }
}

/// `SLURM_ARRAY_TASK_STEP`: the stride of an evenly spaced array (`2-8:2` is 2), else 1.
fn array_step(min: u32, max: u32, count: u32) -> u32 {
    if count < 2 || max <= min {
        return 1;
    }
    let span = max - min;
    if span.is_multiple_of(count - 1) { span / (count - 1) } else { 1 }
}

/// The batch step's rank, or a job step's layout and this task's ranks (Slurm's names and torchrun's).
fn step_variables(env: &mut Env, p: &Placement) {
    match &p.step {
        None => {
            env.set("SLURM_PROCID", "0".to_string());
            env.set("SLURM_LOCALID", "0".to_string());
            env.set("SLURM_GTIDS", "0".to_string());
        }
        Some(step) => {
            let total: u32 = step.tasks_per_node.iter().sum();
            let here = step.tasks_per_node.get(p.node_index as usize).copied().unwrap_or(1);
            env.set("SLURM_STEP_ID", step.step_id.to_string());
            env.set("SLURM_STEPID", step.step_id.to_string());
            env.set("SLURM_STEP_NODELIST", compress_hostlist(step.nodes));
            env.set("SLURM_STEP_NUM_NODES", step.nodes.len().to_string());
            env.set("SLURM_STEP_NUM_TASKS", total.to_string());
            env.set("SLURM_STEP_TASKS_PER_NODE", tasks_per_node_string(step.tasks_per_node));
            // Slurm 22.05's steps still carry the heterogeneous-job spelling of the job's CPUs per node.
            let job_cpus: Vec<u32> = p.job.allocation.iter().map(|a| a.cpus).collect();
            env.set("SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0", tasks_per_node_string(&job_cpus));
            // The global ranks on this node (block layout), as Slurm lists them.
            let first: u32 = step.tasks_per_node.iter().take(p.node_index as usize).sum();
            env.set("SLURM_GTIDS", (first..first + here).map(|r| r.to_string()).collect::<Vec<_>>().join(","));
            env.set("SLURM_NTASKS", total.to_string());
            env.set("SLURM_NPROCS", total.to_string());
            env.set("SLURM_PROCID", step.rank.to_string());
            env.set("SLURM_LOCALID", step.local_rank.to_string());
            env.set("WORLD_SIZE", total.to_string());
            env.set("RANK", step.rank.to_string());
            env.set("LOCAL_RANK", step.local_rank.to_string());
            env.set("LOCAL_WORLD_SIZE", here.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use drover_state::{ExportPolicy, JobSpec, JobState, NodeAllocation, PendingReason, Usage};

    use super::*;

    fn job() -> Job {
        let share =
            |node: &str, gpus: Vec<u32>| NodeAllocation { node: node.into(), gpus, cpus: 4, tasks: 4, mem_mb: 0 };
        Job {
            id: 42,
            spec: JobSpec {
                name: "train".into(),
                user: "alice".into(),
                ntasks_per_node: Some(4),
                cpus_per_task: 1,
                submit_dir: "/home/alice".into(),
                environment: vec![("HOME".into(), "/home/alice".into()), ("SLURM_JOB_ID".into(), "stale".into())]
                    .into(),
                ..JobSpec::default()
            },
            partition: "gpu".into(),
            time_limit_s: None,
            state: JobState::Running,
            reason: PendingReason::None,
            held: false,
            submit_time_ms: 0,
            start_time_ms: Some(1),
            end_time_ms: None,
            restart_count: 1,
            incarnation: 1,
            exit_code: 0,
            exit_signal: 0,
            nodes: vec!["gpu01".into(), "gpu02".into()].into(),
            cancelled_by: None,
            allocation: vec![share("gpu01", vec![0, 1, 2, 3]), share("gpu02", vec![4, 5, 6, 7])].into(),
            ending: None,
            usage: Usage::default(),
            next_step_id: 1,
            message: None,
            ..Job::default()
        }
    }

    /// The batch task's environment on gpu01 with no hosts, GPUs or controllers to show: what the spec alone sets.
    fn bare_batch_env(job: &Job) -> Vec<(String, String)> {
        let placement = Placement {
            job,
            hosts: &[],
            node_index: 0,
            node_name: "gpu01",
            gpus: &[],
            step: None,
            controllers: "",
            client_config: "",
            cluster_name: "diff",
        };
        task_environment(&placement, job.spec.exported_environment())
    }

    fn get<'a>(env: &'a [(String, String)], key: &str) -> &'a str {
        env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("{key} unset"))
    }

    #[test]
    fn a_step_task_on_the_second_node_sees_its_global_rank_and_the_first_node_as_master() {
        let job = job();
        let hosts = vec!["10.0.0.1".to_string(), "10.0.0.2".to_string()];
        let placement = Placement {
            job: &job,
            hosts: &hosts,
            node_index: 1,
            node_name: "gpu02",
            gpus: &job.allocation[1].gpus,
            step: Some(StepPlacement {
                step_id: 0,
                nodes: &job.nodes,
                tasks_per_node: &[4, 4],
                rank: 6,
                local_rank: 2,
            }),
            controllers: "127.0.0.1:1",
            client_config: "",
            cluster_name: "diff",
        };
        let env = task_environment(&placement, job.spec.exported_environment());
        assert_eq!(get(&env, "SLURM_JOB_ID"), "42", "Slurm's variables win over stale exported ones");
        assert_eq!(get(&env, "HOME"), "/home/alice");
        assert_eq!(get(&env, "SLURM_JOB_NODELIST"), "gpu[01-02]");
        assert_eq!(get(&env, "SLURM_TASKS_PER_NODE"), "4(x2)");
        assert_eq!((get(&env, "RANK"), get(&env, "LOCAL_RANK"), get(&env, "WORLD_SIZE")), ("6", "2", "8"));
        assert_eq!(get(&env, "SLURM_NODEID"), "1");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "4,5,6,7");
        assert_eq!(get(&env, "MASTER_ADDR"), "10.0.0.1");
        assert_eq!(get(&env, "MASTER_PORT"), master_port(42).to_string());
        assert_eq!(get(&env, "SLURM_RESTART_COUNT"), "1");
        assert_eq!(get(&env, "SLURM_GTIDS"), "4,5,6,7", "the ranks on this node");
        assert_eq!(get(&env, "SLURM_TOPOLOGY_ADDR"), "gpu02");
        let cpus: Vec<u32> = job.allocation.iter().map(|a| a.cpus).collect();
        assert_eq!(get(&env, "SLURM_JOB_CPUS_PER_NODE"), tasks_per_node_string(&cpus));
        assert_eq!(get(&env, "SLURM_CPUS_ON_NODE"), cpus[1].to_string());
    }

    #[test]
    fn memory_requests_show_as_slurm_sets_them() {
        let mut job = job();
        let hosts = vec!["10.0.0.1".to_string(), "10.0.0.2".to_string()];
        let env_of = |job: &Job| {
            let placement = Placement {
                job,
                hosts: &hosts,
                node_index: 0,
                node_name: "gpu01",
                gpus: &job.allocation[0].gpus,
                step: None,
                controllers: "127.0.0.1:1",
                client_config: "",
                cluster_name: "diff",
            };
            task_environment(&placement, Vec::new())
        };
        job.spec.mem = Some(MemRequest::PerGpu(8_192));
        job.spec.cpus_per_gpu = Some(2);
        let env = env_of(&job);
        assert_eq!((get(&env, "SLURM_MEM_PER_GPU"), get(&env, "SLURM_CPUS_PER_GPU")), ("8192", "2"));
        // --mem=0: the node's whole memory, as held.
        job.spec.mem = Some(MemRequest::PerNode(0));
        job.allocation[0].mem_mb = 65_536;
        assert_eq!(get(&env_of(&job), "SLURM_MEM_PER_NODE"), "65536");
    }

    /// Checked against Slurm 22.05 by the differential suite: what a batch script sees without asking, and what
    /// appears only once asked for (or once it happened).
    #[test]
    fn the_batch_step_sees_slurms_variables_and_the_task_count_only_when_asked() {
        let mut job = job();
        job.spec.ntasks_per_node = None;
        job.restart_count = 0;
        job.spec.environment =
            vec![("SLURM_SUBMIT_HOST".into(), "login1".into()), ("SLURM_PRIO_PROCESS".into(), "5".into())].into();
        job.spec.export = ExportPolicy::None;
        let env = bare_batch_env(&job);
        for (name, value) in [
            ("SLURM_CLUSTER_NAME", "diff"),
            ("SLURM_GTIDS", "0"),
            ("SLURM_NODE_ALIASES", "(null)"),
            ("SLURM_TOPOLOGY_ADDR_PATTERN", "node"),
            // Recorded at submission, kept whatever --export says.
            ("SLURM_SUBMIT_HOST", "login1"),
            ("SLURM_PRIO_PROCESS", "5"),
        ] {
            assert_eq!(get(&env, name), value, "{name}");
        }
        for absent in ["SLURM_NTASKS", "SLURM_NPROCS", "SLURM_RESTART_COUNT", "SLURM_STEP_ID", "SLURM_GPUS_ON_NODE"] {
            assert!(!env.iter().any(|(k, _)| k == absent), "{absent} is set only when asked for");
        }
        job.spec.ntasks = Some(4);
        job.restart_count = 2;
        let env = bare_batch_env(&job);
        assert_eq!((get(&env, "SLURM_NTASKS"), get(&env, "SLURM_RESTART_COUNT")), ("8", "2"));
        assert_eq!((array_step(2, 8, 4), array_step(1, 7, 3), array_step(1, 4, 3), array_step(5, 5, 1)), (2, 3, 1, 1));
    }

    #[test]
    fn export_none_passes_nothing_from_the_submit_shell() {
        let mut job = job();
        job.spec.export = ExportPolicy::None;
        assert!(job.spec.exported_environment().is_empty());
        job.spec.export = ExportPolicy::Vars { all: false, names: vec!["HOME".into(), "X=1".into()].into() };
        assert_eq!(
            job.spec.exported_environment(),
            vec![("HOME".into(), "/home/alice".into()), ("X".into(), "1".into())]
        );
    }

    /// As Slurm 22.05 (checked here): without the submit environment, the task still gets its user's login
    /// variables and `SLURM_EXPORT_ENV` (the --export value); what the job passed itself wins; with the default
    /// --export=ALL nothing is added.
    #[test]
    fn without_the_submit_environment_a_task_still_gets_its_users_login_variables() {
        let env_with = |export: ExportPolicy, uid: u32| {
            let mut job = job();
            job.spec.export = export;
            job.spec.uid = uid;
            bare_batch_env(&job)
        };
        // uid 0 is in every node's user database.
        let env = env_with(ExportPolicy::None, 0);
        assert_eq!((get(&env, "USER"), get(&env, "LOGNAME"), get(&env, "HOME")), ("root", "root", "/root"));
        assert!(!get(&env, "SHELL").is_empty());
        assert_eq!(get(&env, "SLURM_EXPORT_ENV"), "NONE");
        // A uid the node does not know: the name the controllers verified, and no invented home.
        let env = env_with(ExportPolicy::None, 4_000_000);
        assert_eq!(get(&env, "USER"), "alice");
        assert!(!env.iter().any(|(k, _)| k == "HOME"));
        // Listed variables win over the login ones; ALL adds nothing.
        let listed = ExportPolicy::Vars { all: false, names: vec!["HOME".into()].into() };
        let env = env_with(listed, 0);
        assert_eq!(get(&env, "HOME"), "/home/alice");
        assert_eq!(get(&env, "SLURM_EXPORT_ENV"), "HOME", "the --export value as given (checked against Slurm 22.05)");
        let env = env_with(ExportPolicy::All, 0);
        assert!(!env.iter().any(|(k, _)| k == "USER" || k == "SLURM_EXPORT_ENV"));
    }

    #[test]
    fn tasks_per_node_compresses_runs() {
        assert_eq!(tasks_per_node_string(&[2, 2, 2, 1]), "2(x3),1");
        assert_eq!(tasks_per_node_string(&[1]), "1");
    }
}
