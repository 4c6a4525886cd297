//! `NodeAgent`: what one node runs. It holds the leader's latest assignments and reconciles the task
//! directories on disk with them: start what is missing, stop what is cancelled, over time or no longer
//! assigned, and report how each job's batch script ended until the leader acknowledges it.
//!
//! The task directories, not memory, are the source of truth about tasks, so a restarted agent picks up
//! exactly where the last one stopped (the supervisors kept the tasks running meanwhile).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_proto::wire::{AgentMessage, Assignment, SignalTarget};
use drover_state::{JobEnd, JobId, NodeInfo, WarnSignal};
use tokio::sync::{Notify, mpsc};

use crate::config::AgentConfig;
use crate::gpu::GpuBackend;
use crate::lease;
use crate::supervise::{self, TaskStatus};

/// Why a task may not start on this node now (each says what the user can do: try again, or wait).
#[derive(Debug, thiserror::Error)]
pub enum NotNow {
    #[error("this node holds no lease from the controllers right now; try again")]
    NoLease,
    #[error("this node has not heard its assignments from the leader yet; try again")]
    NotSynced,
    #[error(
        "this node's lease (registration {lease}) and assignments (registration {assignments}) disagree; try again"
    )]
    EpochsDisagree { lease: u64, assignments: u64 },
    #[error("GPU {gpu} is still held by job {} incarnation {} (task {}), which is being stopped", .holder.0, .holder.1, .task.display())]
    GpuHeldByTask { gpu: u32, holder: JobKey, task: PathBuf },
    #[error("GPU {gpu} is still used by process(es) {pids:?}")]
    GpuUsedBy { gpu: u32, pids: Vec<u32> },
    #[error("{why}; gave up after {after_s} s")]
    GaveUp { why: Box<NotNow>, after_s: u64 },
}

/// How often the task directories are checked (task ends, time limits, kill deadlines).
pub const RECONCILE_INTERVAL_MS: u64 = 10;
/// Batch scripts started at once in one reconcile pass.
const MAX_PARALLEL_LAUNCHES: usize = 16;
/// An unacknowledged end report is sent again after this long.
const REPORT_RETRY_MS: u64 = 2_000;
/// Written into a batch directory when the agent ended the job at its time limit (survives a restart).
const TIMED_OUT_MARKER: &str = "timed_out";
/// Written into a batch directory when the agent killed the job because the node's lease ran out.
const FENCED_MARKER: &str = "fenced";
/// Written into a batch directory once the job got its `--signal` warning before its time limit.
const WARNED_MARKER: &str = "warned";
/// How long the stop signal waits for the supervisor to write the stop notice into the task's stderr.
const NOTICE_WAIT_MS: u64 = 1_000;
/// The longest warning lead time honoured before a requeue or a preemption stops a job.
const MAX_WARNING_S: u32 = 300;
/// Confirmations of lingering incarnations are repeated this often while the leader still lists them.
const RELEASE_RETRY_MS: u64 = 1_000;
/// A job's checkpoint marker file is looked at this often.
const MARKER_INTERVAL: Duration = Duration::from_secs(1);
/// Job cgroups are looked after this often: ended jobs' removed, memory sampled where the kernel keeps no peak.
const CGROUP_INTERVAL: Duration = Duration::from_secs(1);
/// How often the agent looks whether its image store changed (imports and evictions are minutes apart).
const IMAGE_STORE_INTERVAL: Duration = Duration::from_secs(10);
/// A GPU held by processes no task of this node started, for this long, is reported as a problem (the node is
/// drained with it): a task of another incarnation would have been killed well within this.
const FOREIGN_HOLDER_PROBLEM_MS: u64 = 60_000;
/// How long a step's launch waits for its GPUs to be released by a task of an earlier incarnation being stopped
/// (its SIGTERM, `KillWait`, SIGKILL) before it fails.
const STEP_GPU_WAIT_MS: u64 = 30_000;

/// A job incarnation: what task directories and reports are keyed by.
pub type JobKey = (JobId, u64);

/// One task directory: `JOB.INCARNATION.batch` or `JOB.INCARNATION.STEP.RANK`.
#[derive(Debug, Clone)]
pub struct TaskDir {
    pub key: JobKey,
    pub step: Option<(u32, u32)>,
    pub path: PathBuf,
}

impl TaskDir {
    fn parse(path: PathBuf) -> Option<TaskDir> {
        let name = path.file_name()?.to_str()?.to_string();
        let parts: Vec<&str> = name.split('.').collect();
        let key = (parts.first()?.parse().ok()?, parts.get(1)?.parse().ok()?);
        match parts.as_slice() {
            [_, _, "batch"] => Some(TaskDir { key, step: None, path }),
            [_, _, step, rank] => Some(TaskDir { key, step: Some((step.parse().ok()?, rank.parse().ok()?)), path }),
            _ => None,
        }
    }
}

/// Timing the leader decides (sent in its welcome); until the first welcome, the config's kill grace applies.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub fence_after_ms: u64,
    pub kill_wait_ms: u64,
    pub allow_root_jobs: bool,
}

struct Inner {
    assignments: HashMap<JobId, Assignment>,
    /// The cluster's name, from the latest assignments (`SLURM_CLUSTER_NAME`).
    cluster_name: String,
    /// True once this session delivered assignments: only then are unassigned tasks known to be strays.
    synced: bool,
    /// The leader state the assignments come from: older ones (a leader that has not caught up) are ignored.
    applied_index: u64,
    /// Ended incarnations this node must confirm gone, and when that was last sent.
    lingering: Vec<JobKey>,
    released_sent: Option<Instant>,
    /// The current session's outbox, while connected.
    outbox: Option<mpsc::Sender<AgentMessage>>,
    /// Until when the node may run tasks: renewed by leases from a leader backed by a quorum.
    lease_until: Instant,
    /// The tasks were killed when the lease ran out, and no lease came since.
    fenced: bool,
    /// The registration epoch the lease is for, and the one the assignments are for: tasks start only while they
    /// agree (a lease of a new registration never starts what an earlier one was assigned).
    lease_epoch: u64,
    assignments_epoch: u64,
    /// The GPUs each lingering incarnation held here: it is confirmed gone only once no process holds them.
    lingering_gpus: HashMap<JobKey, Vec<u32>>,
    /// GPUs some process holds that no task of this node was given, and since when (see
    /// `FOREIGN_HOLDER_PROBLEM_MS`).
    foreign_holders: HashMap<u32, Instant>,
    timing: Timing,
    /// Tasks being stopped: when SIGTERM went out.
    stopping: HashMap<PathBuf, Instant>,
    /// Jobs being requeued or preempted that got their `--signal` warning, and when.
    warned_to_stop: HashMap<JobKey, Instant>,
    /// Checkpoint marker files: when each job's was last looked at, and what it looked like then.
    markers: HashMap<JobKey, (Instant, Option<crate::marker::Seen>)>,
    /// What each running job's progress marker looked like when last read.
    progress_markers: HashMap<JobKey, Option<crate::marker::Seen>>,
    /// Progress seen since the last heartbeat, relayed with the next one: (job, incarnation, step).
    progress: Vec<(JobId, u64, Option<u64>)>,
    /// GPU faults remembered until the GPU is reset (RestartApp ones are reported once and not kept), by GPU.
    gpu_faults: HashMap<u32, drover_proto::wire::GpuFaultReport>,
    /// Faults reported once (restart the application), sent with the next heartbeat.
    pending_faults: Vec<drover_proto::wire::GpuFaultReport>,
    /// GPUs this agent reset after a fault, reported until a new fault hits them.
    gpus_reset: HashSet<u32>,
    /// When a reset was last tried per GPU: one try a minute.
    reset_tried: HashMap<u32, Instant>,
    /// The reboot order the leader sent (`scontrol reboot`), carried out once the node is empty.
    reboot: Option<u64>,
    /// The reboot order whose program is running now.
    rebooting: Option<u64>,
    /// Jobs whose container image digest was relayed to the leader.
    images_reported: HashSet<JobKey>,
    /// When the image store was last looked at, and what the leader was last told of it.
    image_store_checked: Option<Instant>,
    image_store_sent: Option<drover_state::node::ImageStoreSummary>,
    /// End reports: when last sent, and whether the leader acknowledged.
    reports: HashMap<JobKey, (Instant, bool)>,
    /// Jobs left unpinned (too few CPUs free to pin, or the cpuset could not be written): said once, and their
    /// later tasks here stay unpinned too.
    unpinned: HashSet<JobKey>,
    /// The largest `memory.current` seen per job, on cgroup v2 kernels that keep no `memory.peak`.
    memory_samples: HashMap<JobKey, u64>,
    /// When job cgroups were last looked after.
    cgroups_tended: Option<Instant>,
    /// GPUs whose clocks were set for a job's `--gpu-freq`, and for which incarnation; reset once it leaves.
    clocked: HashMap<u32, JobKey>,
    /// Whether this process has brought every GPU no job wants to its default clocks (a previous agent may have
    /// left some set for a job that ended while it was down).
    clocks_known: bool,
}

/// The leader's latest word on what a node runs (`ControllerMessage::Assignments`, unpacked).
#[derive(Debug, Clone, Default)]
pub struct AssignmentUpdate {
    pub jobs: Vec<Assignment>,
    pub applied_index: u64,
    pub lingering: Vec<JobKey>,
    pub allow_root_jobs: bool,
    pub epoch: u64,
    pub lingering_gpus: Vec<(JobKey, Vec<u32>)>,
    pub cluster_name: String,
    /// `scontrol reboot`'s order, once the node is empty.
    pub reboot: Option<u64>,
}

/// A snapshot of the agent for `/metrics`.
#[derive(Debug, Clone)]
pub struct Observed {
    pub connected: bool,
    pub fenced: bool,
    pub lease_left_ms: u64,
    /// Jobs assigned here and not being stopped.
    pub jobs: usize,
    /// GPU index to the job holding it.
    pub gpu_jobs: HashMap<u32, JobId>,
    pub health: Vec<crate::gpu::GpuHealth>,
}

pub struct NodeAgent {
    pub config: AgentConfig,
    pub info: NodeInfo,
    /// This binary, started as `drover-agent supervise DIR` for each task.
    pub(crate) exe: PathBuf,
    pub tasks_dir: PathBuf,
    pub gpus: Box<dyn GpuBackend>,
    /// Problems found at start (inventory mismatch), reported with every heartbeat.
    pub standing_problems: Vec<String>,
    inner: Mutex<Inner>,
    /// Wakes the reconcile loop early (new assignments, a signal).
    pub wake: Notify,
    /// The cluster key (to verify `srun` users' credentials) and this agent's TLS client side (its sessions with
    /// the controllers).
    pub key: drover_auth::ClusterKey,
    pub tls: drover_auth::ClientTls,
    /// Where jobs' cgroups go (memory limit, CPUs, usage); `None` when memory is not enforced on this node.
    pub cgroup: Option<crate::cgroup::CgroupRoot>,
    /// Held while a job's CPUs are chosen and its cpuset written, so that two jobs starting at once (parallel
    /// launches, `srun` steps) never pick the same CPUs.
    pub(crate) cpu_choice: Mutex<()>,
    /// The write ends of running steps' input FIFOs (srun's stdin), by job and step, until the input ends or the
    /// step does.
    pub(crate) step_inputs: Mutex<HashMap<(JobId, u32), Vec<crate::step_input::InputEnd>>>,
    /// The latest GPU health poll (one per heartbeat), which `/metrics` shows instead of asking NVML per scrape.
    last_health: Mutex<Vec<crate::gpu::GpuHealth>>,
    /// Heartbeats sent since the agent started.
    pub heartbeats_sent: std::sync::atomic::AtomicU64,
    /// The remedy per XID (built in, with the operator's overrides).
    pub xid_table: crate::xid::XidTable,
    /// The health-check program's latest failure (`None`: passing, or not configured).
    pub health_check: Arc<Mutex<Option<String>>>,
}

/// What a heartbeat carries besides its sequence number.
#[derive(Debug, Default)]
pub struct HeartbeatReport {
    pub problems: Vec<String>,
    pub gpu_faults: Vec<drover_proto::wire::GpuFaultReport>,
    pub gpus_reset: Vec<u32>,
    pub progress: Vec<(JobId, u64, Option<u64>)>,
    pub health_check: Option<String>,
    pub rebooted: Option<u64>,
}

/// Where the agent writes down a reboot order before running the reboot program, and the order carried out.
const REBOOT_PENDING_FILE: &str = "reboot-pending";
const REBOOT_DONE_FILE: &str = "reboot-done";
/// How long a reboot program may run (one that really reboots never returns).
const REBOOT_PROGRAM_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a GPU reset command may run.
const GPU_RESET_TIMEOUT: Duration = Duration::from_secs(120);
/// Between two tries to reset the same GPU.
const GPU_RESET_RETRY: Duration = Duration::from_secs(60);

use drover_common::wall::now_ms;

impl NodeAgent {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: AgentConfig,
        info: NodeInfo,
        exe: PathBuf,
        gpus: Box<dyn GpuBackend>,
        standing_problems: Vec<String>,
        key: drover_auth::ClusterKey,
        tls: drover_auth::ClientTls,
    ) -> std::io::Result<Arc<NodeAgent>> {
        let tasks_dir = config.state_dir.join("tasks");
        std::fs::create_dir_all(&tasks_dir)?;
        let timing = Timing {
            heartbeat_ms: 1_000,
            fence_after_ms: 10_000,
            kill_wait_ms: config.kill_wait_ms,
            allow_root_jobs: false,
        };
        // A restarted agent holds the lease its predecessor had (its tasks kept running under it).
        let lease_until =
            lease::read(&config.state_dir.join(lease::LEASE_FILE)).map_or_else(Instant::now, lease::from_boottime_ms);
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let cgroup = match (config.enforce_memory, root) {
            (false, _) => None,
            (true, false) => {
                tracing::warn!("not running as root: jobs' memory requests are scheduled but not enforced");
                None
            }
            (true, true) => match crate::cgroup::detect(&config.memory_cgroup) {
                Ok(mut root) => {
                    tracing::info!(cgroup = %root.path.display(), hierarchy = ?root.hierarchy, "memory is enforced");
                    if root.hierarchy == crate::cgroup::Hierarchy::V1Memory && root.cpuacct.is_none() {
                        tracing::warn!("no cgroup v1 cpuacct hierarchy: jobs' CPU time is not measured");
                    }
                    if config.confine_cpus {
                        match crate::cgroup::enable_cpuset(&mut root, &config.memory_cgroup) {
                            Ok(()) => tracing::info!("jobs are pinned to the CPUs they hold"),
                            Err(why) => tracing::warn!("jobs are not pinned to CPUs: {why}"),
                        }
                    }
                    Some(root)
                }
                Err(why) => {
                    tracing::warn!("jobs' memory requests are scheduled but not enforced: {why}");
                    None
                }
            },
        };
        let xid_table = crate::xid::XidTable::load(config.xid_actions.as_deref()).map_err(std::io::Error::other)?;
        Ok(Arc::new(NodeAgent {
            xid_table,
            health_check: Arc::new(Mutex::new(None)),
            config,
            info,
            exe,
            tasks_dir,
            gpus,
            standing_problems,
            inner: Mutex::new(Inner {
                assignments: HashMap::new(),
                cluster_name: String::new(),
                synced: false,
                applied_index: 0,
                lingering: Vec::new(),
                released_sent: None,
                outbox: None,
                lease_until,
                fenced: false,
                lease_epoch: 0,
                assignments_epoch: 0,
                lingering_gpus: HashMap::new(),
                foreign_holders: HashMap::new(),
                timing,
                stopping: HashMap::new(),
                warned_to_stop: HashMap::new(),
                markers: HashMap::new(),
                progress_markers: HashMap::new(),
                progress: Vec::new(),
                gpu_faults: HashMap::new(),
                pending_faults: Vec::new(),
                gpus_reset: HashSet::new(),
                reset_tried: HashMap::new(),
                reboot: None,
                rebooting: None,
                images_reported: HashSet::new(),
                image_store_checked: None,
                image_store_sent: None,
                reports: HashMap::new(),
                unpinned: HashSet::new(),
                memory_samples: HashMap::new(),
                cgroups_tended: None,
                clocked: HashMap::new(),
                clocks_known: false,
            }),
            wake: Notify::new(),
            key,
            tls,
            cgroup,
            cpu_choice: Mutex::new(()),
            step_inputs: Mutex::new(HashMap::new()),
            last_health: Mutex::new(Vec::new()),
            heartbeats_sent: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("agent state poisoned")
    }

    pub fn timing(&self) -> Timing {
        self.lock().timing
    }

    /// The cluster's name as the latest assignments gave it (empty before any).
    pub(crate) fn cluster_name(&self) -> String {
        self.lock().cluster_name.clone()
    }

    /// What `/metrics` reports: the latest health poll, and the session and lease as they stand.
    pub fn observed(&self) -> Observed {
        let inner = self.lock();
        let now = Instant::now();
        let mut gpu_jobs = HashMap::new();
        for assignment in inner.assignments.values().filter(|a| !a.cancelled()) {
            for allocation in assignment.job.allocation.iter().filter(|a| a.node == self.info.name) {
                for gpu in &allocation.gpus {
                    gpu_jobs.insert(*gpu, assignment.job.id);
                }
            }
        }
        Observed {
            connected: inner.outbox.is_some(),
            fenced: inner.fenced,
            lease_left_ms: inner.lease_until.saturating_duration_since(now).as_millis() as u64,
            jobs: inner.assignments.values().filter(|a| !a.cancelled()).count(),
            gpu_jobs,
            health: self.last_health.lock().expect("health poisoned").clone(),
        }
    }

    /// Where the lease is kept for the supervisors.
    pub fn lease_path(&self) -> PathBuf {
        self.config.state_dir.join(lease::LEASE_FILE)
    }

    /// Whether the node holds a lease now.
    pub fn lease_valid(&self) -> bool {
        self.lock().lease_until > Instant::now()
    }

    /// Whether tasks may start now, and if not, why: only under a valid lease, once this session's assignments
    /// arrived, and while the lease and the assignments are for the same registration epoch (the controller's
    /// `agents` module explains why that keeps a job from running twice).
    pub fn may_start_tasks(&self) -> Result<(), NotNow> {
        let inner = self.lock();
        if inner.lease_until <= Instant::now() {
            return Err(NotNow::NoLease);
        }
        if !inner.synced {
            return Err(NotNow::NotSynced);
        }
        if inner.lease_epoch != inner.assignments_epoch {
            return Err(NotNow::EpochsDisagree { lease: inner.lease_epoch, assignments: inner.assignments_epoch });
        }
        Ok(())
    }

    /// The node's task journal, which the supervisors append to.
    pub fn journal_path(&self) -> PathBuf {
        self.config.state_dir.join(crate::journal::JOURNAL_FILE)
    }

    /// What a registration lists as still running here: every incarnation with a task that may be alive (its
    /// supervisor runs, or died without a result), with the GPUs its tasks were given, and every incarnation whose
    /// cgroup still holds a process.
    pub fn running_shares(&self) -> Vec<drover_state::RunningShare> {
        let mut shares: std::collections::BTreeMap<JobKey, Vec<u32>> = std::collections::BTreeMap::new();
        for dir in self.task_dirs() {
            if !supervise::may_be_running(&dir.path) {
                continue;
            }
            let gpus = shares.entry(dir.key).or_default();
            if let Ok(launch) = supervise::read_launch(&dir.path) {
                for gpu in launch.gpus {
                    if !gpus.contains(&gpu) {
                        gpus.push(gpu);
                    }
                }
            }
        }
        if let Some(root) = &self.cgroup {
            for key in crate::cgroup::job_keys(root) {
                if crate::cgroup::job_has_processes(root, key.0, key.1) {
                    shares.entry(key).or_default();
                }
            }
        }
        shares
            .into_iter()
            .take(drover_state::lifecycle::MAX_RUNNING_SHARES)
            .map(|((job, incarnation), gpus)| drover_state::RunningShare { job, incarnation, gpus })
            .collect()
    }

    /// Whether `gpus` are free for a task of `key`: no task here of another incarnation that may still run was
    /// given any of them, and, before the first task of `key` starts here, no process holds them (where the GPU
    /// backend can tell). `Err` names the holder.
    pub fn gpus_free_for(&self, key: JobKey, gpus: &[u32], dirs: &[TaskDir]) -> Result<(), NotNow> {
        if gpus.is_empty() {
            return Ok(());
        }
        let mut first_here = true;
        for dir in dirs {
            if !supervise::may_be_running(&dir.path) {
                continue;
            }
            if dir.key == key {
                first_here = false;
                continue;
            }
            let Ok(launch) = supervise::read_launch(&dir.path) else { continue };
            if let Some(gpu) = launch.gpus.iter().find(|g| gpus.contains(g)) {
                return Err(NotNow::GpuHeldByTask { gpu: *gpu, holder: dir.key, task: dir.path.clone() });
            }
        }
        if !first_here {
            return Ok(());
        }
        for &gpu in gpus {
            match self.gpus.compute_processes(gpu) {
                Ok(pids) if !pids.is_empty() => {
                    self.lock().foreign_holders.entry(gpu).or_insert_with(Instant::now);
                    return Err(NotNow::GpuUsedBy { gpu, pids });
                }
                Ok(_) => {
                    self.lock().foreign_holders.remove(&gpu);
                }
                // The backend cannot see processes (no driver): the task records above are all there is.
                Err(e) => tracing::debug!(gpu, "cannot list the GPU's processes: {e}"),
            }
        }
        Ok(())
    }

    /// Waits (blocking, at most `STEP_GPU_WAIT_MS`) until `gpus` are free for a task of `key`.
    pub(crate) fn wait_for_gpus(&self, key: JobKey, gpus: &[u32]) -> Result<(), NotNow> {
        let deadline = Instant::now() + Duration::from_millis(STEP_GPU_WAIT_MS);
        loop {
            match self.gpus_free_for(key, gpus, &self.task_dirs()) {
                Ok(()) => return Ok(()),
                Err(why) if Instant::now() >= deadline => {
                    return Err(NotNow::GaveUp { why: Box::new(why), after_s: STEP_GPU_WAIT_MS / 1_000 });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The address outgoing connections leave from: the one the agent listens on, when it names one (so a
    /// host's firewall, or a test, can cut this node off by address).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        let ip = self.config.listen.parse::<std::net::SocketAddr>().ok()?.ip();
        Some(ip).filter(|ip| !ip.is_unspecified())
    }

    /// A session with the leader began; its timing is the cluster's from now on. (A session is not a lease:
    /// leases come with the answers to heartbeats.)
    pub fn connected(&self, outbox: mpsc::Sender<AgentMessage>, timing: Timing) {
        let mut inner = self.lock();
        inner.outbox = Some(outbox);
        inner.synced = false;
        inner.timing = timing;
        // Every unacknowledged end goes out again on the new session.
        inner.reports.retain(|_, (_, acked)| !*acked);
        for (sent, _) in inner.reports.values_mut() {
            *sent = Instant::now() - Duration::from_millis(REPORT_RETRY_MS);
        }
        inner.released_sent = None;
    }

    pub fn disconnected(&self) {
        let mut inner = self.lock();
        inner.outbox = None;
        inner.synced = false;
    }

    /// A leader backed by a quorum renewed the lease of registration `epoch` until `until`: record it where the
    /// supervisors look.
    pub fn renew(&self, until: Instant, epoch: u64) {
        let mut inner = self.lock();
        if inner.lease_epoch != epoch {
            tracing::info!(epoch, previous = inner.lease_epoch, "the node's lease is now for a new registration");
            inner.lease_epoch = epoch;
        }
        if until <= inner.lease_until && !inner.fenced {
            return;
        }
        inner.lease_until = inner.lease_until.max(until);
        if inner.fenced {
            tracing::info!("a leader renews the lease again; leaving the fence");
            inner.fenced = false;
        }
        let expires = lease::to_boottime_ms(inner.lease_until);
        drop(inner);
        if let Err(e) = lease::write(&self.lease_path(), expires) {
            // Supervisors would then kill their tasks at the old expiry: safe, but say why.
            tracing::error!("cannot write the lease file {}: {e}", self.lease_path().display());
        }
    }

    /// The leader's latest word on what this node runs (see `ControllerMessage::Assignments`).
    pub fn set_assignments(&self, update: AssignmentUpdate) {
        let AssignmentUpdate {
            jobs,
            applied_index,
            lingering,
            allow_root_jobs,
            epoch,
            lingering_gpus,
            cluster_name,
            reboot,
        } = update;
        let mut inner = self.lock();
        if applied_index < inner.applied_index {
            tracing::warn!(
                applied_index,
                newest = inner.applied_index,
                "ignoring assignments older than ones already received (from a leader that has not caught up)"
            );
            return;
        }
        inner.applied_index = applied_index;
        inner.timing.allow_root_jobs = allow_root_jobs;
        inner.cluster_name = cluster_name;
        inner.assignments = jobs.into_iter().map(|a| (a.job.id, a)).collect();
        inner.lingering = lingering;
        inner.lingering_gpus = lingering_gpus.into_iter().collect();
        inner.assignments_epoch = epoch;
        inner.released_sent = None;
        inner.synced = true;
        inner.reboot = reboot;
        drop(inner);
        self.wake.notify_one();
    }

    pub fn acked(&self, key: JobKey) {
        if let Some(report) = self.lock().reports.get_mut(&key) {
            report.1 = true;
        }
    }

    pub fn assignment(&self, job_id: JobId) -> Option<Assignment> {
        self.lock().assignments.get(&job_id).cloned()
    }

    /// Every task directory on disk.
    pub fn task_dirs(&self) -> Vec<TaskDir> {
        let Ok(entries) = std::fs::read_dir(&self.tasks_dir) else { return Vec::new() };
        entries.filter_map(|e| e.ok()).filter_map(|e| TaskDir::parse(e.path())).collect()
    }

    /// `scancel --signal`: to the job's tasks here that `target` names (Slurm: the steps by default, `-b` the
    /// batch shell alone, `--full` everything).
    pub fn signal_job(&self, key: JobKey, signal: i32, target: SignalTarget) {
        for dir in self.task_dirs().into_iter().filter(|d| d.key == key) {
            let delivered = match (target, dir.step) {
                (SignalTarget::Steps, Some(_)) | (SignalTarget::Full, _) => supervise::signal(&dir.path, signal),
                (SignalTarget::Batch, None) => supervise::signal_leader(&dir.path, signal),
                _ => continue,
            };
            if let Err(e) = delivered {
                tracing::warn!(task = %dir.path.display(), "signal {signal} not delivered: {e}");
            }
        }
    }

    /// A job's `--signal` warning: the batch shell alone with `B:`, else its steps (as Slurm).
    fn warn(&self, key: JobKey, warning: WarnSignal) {
        let target = if warning.batch_only { SignalTarget::Batch } else { SignalTarget::Steps };
        tracing::info!(job = key.0, incarnation = key.1, signal = warning.signal, "sending the job's --signal warning");
        self.signal_job(key, warning.signal, target);
    }

    /// One reconcile pass; blocking file work, run it on a blocking thread.
    pub fn reconcile(&self) {
        let dirs = self.task_dirs();
        let may_start = self.may_start_tasks().is_ok();
        let (assignments, lingering, synced, timing, fence_now) = {
            let mut inner = self.lock();
            let lease_valid = inner.lease_until > Instant::now();
            let fence = !lease_valid && !inner.fenced;
            if fence {
                inner.fenced = true;
            }
            (inner.assignments.clone(), inner.lingering.clone(), inner.synced, inner.timing, fence)
        };
        if fence_now {
            self.fence(&dirs, timing);
        }
        let now = now_ms();
        let mut live: HashSet<JobKey> = HashSet::new();
        let mut to_launch: Vec<&Assignment> = Vec::new();
        for a in assignments.values() {
            let key = (a.job.id, a.job.incarnation);
            // Every log line about this job carries its id and incarnation (JSON logs list the span).
            let _span = tracing::info_span!("job", id = key.0, incarnation = key.1).entered();
            live.insert(key);
            let mine: Vec<&TaskDir> = dirs.iter().filter(|d| d.key == key).collect();
            // Moved by the time the job spent suspended; none while it is (the limit does not run then).
            let limit_ms = a.job.limit_end_ms();
            let over_time = limit_ms.is_some_and(|end| now > end);
            if a.cancelled() || over_time {
                if over_time && !a.cancelled() && a.node_index == 0 {
                    self.mark(key, TIMED_OUT_MARKER);
                }
                if self.warned_before_stopping(a, &mine)
                    && (a.node_index != 0 || self.stop_notice_written(a, over_time))
                {
                    for dir in &mine {
                        self.stop(&dir.path, timing);
                    }
                }
            } else {
                self.keep_suspension(a);
                if let (Some(warning), Some(end)) = (a.job.spec.signal, limit_ms)
                    && now + u64::from(warning.before_s) * 1_000 >= end
                    && a.node_index == 0
                    && !self.batch_dir(key).join(WARNED_MARKER).exists()
                {
                    self.mark(key, WARNED_MARKER);
                    self.warn(key, warning);
                }
                if a.node_index == 0 && !a.job.spec.interactive && !mine.iter().any(|d| d.step.is_none()) && may_start {
                    // Not while a task of another incarnation may still hold its GPUs: the next pass tries again.
                    let gpus = a.job.allocation.first().map(|s| s.gpus.as_slice()).unwrap_or_default();
                    match self.gpus_free_for(key, gpus, &dirs) {
                        Ok(()) => to_launch.push(a),
                        Err(why) => tracing::debug!(job = key.0, "batch script waits for its GPUs: {why}"),
                    }
                }
            }
            if a.node_index == 0 {
                self.maybe_report(a, &mine, over_time);
                self.check_marker(a);
                self.check_image(a);
            }
        }
        self.tend_gpu_clocks(&assignments, synced);
        // Starting a supervisor is a fork, an exec and two small fsyncs: start a burst of jobs side by side.
        for batch in to_launch.chunks(MAX_PARALLEL_LAUNCHES) {
            std::thread::scope(|scope| {
                for a in batch {
                    scope.spawn(|| self.launch_batch(a));
                }
            });
        }
        if synced {
            for dir in dirs.iter().filter(|d| !live.contains(&d.key)) {
                match supervise::status(&dir.path) {
                    TaskStatus::Running { .. } => self.stop(&dir.path, timing),
                    _ => {
                        self.lock().stopping.remove(&dir.path);
                        let _ = std::fs::remove_dir_all(&dir.path);
                    }
                }
            }
            let mut inner = self.lock();
            inner.reports.retain(|key, _| live.contains(key));
            inner.warned_to_stop.retain(|key, _| live.contains(key));
            inner.markers.retain(|key, _| live.contains(key));
            inner.progress_markers.retain(|key, _| live.contains(key));
            inner.images_reported.retain(|key| live.contains(key));
            drop(inner);
            self.forget_suspensions(&live);
        }
        self.confirm_released(&lingering, &dirs);
        self.tend_cgroups(&live, &lingering, synced);
        if synced {
            self.tend_containers(&live, &lingering);
            self.report_image_store();
        }
    }

    /// `--gpu-freq`: each GPU of a job here that asked gets its clocks before the job's tasks start (this runs before
    /// the pass launches them), and its default clocks back once the job has left the node, as Slurm resets them
    /// after the job. A GPU serves one job at a time, so it is set for at most one. Resets wait for this session's
    /// assignments: before them, a running job would look gone.
    fn tend_gpu_clocks(&self, assignments: &HashMap<JobId, Assignment>, synced: bool) {
        let mut wanted: HashMap<u32, (JobKey, drover_state::job::GpuFreq)> = HashMap::new();
        for a in assignments.values() {
            let Some(freq) = a.job.spec.gpu_freq.as_deref().filter(|f| f.graphics.is_some() || f.memory.is_some())
            else {
                continue;
            };
            for &gpu in a.job.allocation.get(a.node_index as usize).map(|s| s.gpus.as_slice()).unwrap_or_default() {
                wanted.insert(gpu, ((a.job.id, a.job.incarnation), *freq));
            }
        }
        let (clocked, known) = {
            let inner = self.lock();
            (inner.clocked.clone(), inner.clocks_known)
        };
        if wanted.is_empty() && clocked.is_empty() && known {
            return;
        }
        let mut now_clocked = clocked.clone();
        if synced {
            let leftovers: Vec<u32> = if known {
                clocked.keys().copied().collect()
            } else {
                self.gpus.inventory().map(|gpus| gpus.iter().map(|g| g.index).collect()).unwrap_or_default()
            };
            // A GPU another job wants now is set for it below; setting needs no reset first.
            for gpu in leftovers.into_iter().filter(|gpu| !wanted.contains_key(gpu)) {
                match self.gpus.reset_clocks(gpu) {
                    Ok(()) if clocked.contains_key(&gpu) => tracing::info!(gpu, "GPU clocks back to their defaults"),
                    Ok(()) => {}
                    Err(e) if clocked.contains_key(&gpu) => tracing::warn!(gpu, "cannot reset the GPU's clocks: {e}"),
                    Err(e) => tracing::debug!(gpu, "cannot reset the GPU's clocks: {e}"),
                }
                now_clocked.remove(&gpu);
            }
        }
        for (gpu, (key, freq)) in wanted {
            if now_clocked.get(&gpu) == Some(&key) {
                continue;
            }
            // Tried once per job and GPU: a GPU that refuses is not asked again every pass.
            now_clocked.insert(gpu, key);
            match self.gpus.set_clocks(gpu, &freq) {
                Ok(c) => tracing::info!(
                    job = key.0,
                    incarnation = key.1,
                    gpu,
                    memory_mhz = c.memory_mhz,
                    graphics_mhz = c.graphics_mhz,
                    "GPU clocks set for --gpu-freq={freq}"
                ),
                Err(e) => tracing::warn!(job = key.0, gpu, "--gpu-freq={freq} not applied: {e}"),
            }
        }
        let mut inner = self.lock();
        inner.clocked = now_clocked;
        inner.clocks_known |= synced;
    }

    /// GPU `index`'s application clocks now (what `--gpu-freq` set, or the defaults).
    pub fn gpu_clocks(&self, index: u32) -> Result<crate::gpu::Clocks, crate::gpu::GpuError> {
        self.gpus.clocks(index)
    }

    /// Once a second: samples the memory of running jobs where the kernel keeps no peak, and removes the cgroups
    /// of incarnations the leader no longer lists here, neither running nor lingering (their usage was reported:
    /// the end by the batch node, the rest with the release). Only once this session has its assignments, so a
    /// restarted agent never removes what a running job still counts in.
    fn tend_cgroups(&self, live: &HashSet<JobKey>, lingering: &[JobKey], synced: bool) {
        let Some(root) = &self.cgroup else { return };
        {
            let mut inner = self.lock();
            if inner.cgroups_tended.is_some_and(|at| at.elapsed() < CGROUP_INTERVAL) {
                return;
            }
            inner.cgroups_tended = Some(Instant::now());
        }
        let samples: Vec<(JobKey, u64)> = live
            .iter()
            .filter_map(|&key| crate::cgroup::sample_memory(root, key.0, key.1).map(|bytes| (key, bytes)))
            .collect();
        let mut gone = Vec::new();
        if synced {
            for key in crate::cgroup::job_keys(root) {
                if live.contains(&key) || lingering.contains(&key) {
                    continue;
                }
                match crate::cgroup::remove_job(root, key.0, key.1) {
                    Ok(true) => gone.push(key),
                    // A process of the job is still in it: the next pass tries again.
                    Ok(false) => {}
                    Err(e) => tracing::warn!(job = key.0, incarnation = key.1, "cannot remove the job's cgroup: {e}"),
                }
            }
        }
        let mut inner = self.lock();
        for (key, bytes) in samples {
            let peak = inner.memory_samples.entry(key).or_default();
            *peak = (*peak).max(bytes);
        }
        for key in gone {
            inner.memory_samples.remove(&key);
            inner.unpinned.remove(&key);
        }
        if synced {
            // Also forget jobs whose cgroups went some other way (a node reboot, an operator's rmdir).
            let listed = |key: &JobKey| live.contains(key) || lingering.contains(key);
            inner.memory_samples.retain(|key, _| listed(key));
            inner.unpinned.retain(listed);
        }
    }

    /// What the job's tasks used on this node, from its cgroup (`None` where nothing was measured).
    fn measured(&self, key: JobKey) -> Option<drover_state::MeasuredUsage> {
        let root = self.cgroup.as_ref()?;
        let sampled = self.lock().memory_samples.get(&key).copied();
        crate::cgroup::job_usage(root, key.0, key.1, sampled)
    }

    pub(crate) fn is_unpinned(&self, key: JobKey) -> bool {
        self.lock().unpinned.contains(&key)
    }

    /// Leaves the job unpinned on this node, saying why once.
    pub(crate) fn warn_unpinned(&self, key: JobKey, why: &dyn std::fmt::Display) {
        if self.lock().unpinned.insert(key) {
            tracing::warn!(job = key.0, incarnation = key.1, "the job's tasks run on any CPU of this node: {why}");
        }
    }

    /// The lease ran out: kill every task now (their supervisors do too, should this agent be slow), and mark
    /// the batch tasks fenced, so their ends are reported as node failures and the jobs requeued.
    fn fence(&self, dirs: &[TaskDir], timing: Timing) {
        let mut killed = 0;
        for dir in dirs {
            if matches!(supervise::status(&dir.path), TaskStatus::Running { .. }) {
                if dir.step.is_none() {
                    let _ = std::fs::write(dir.path.join(FENCED_MARKER), b"1");
                }
                if supervise::signal(&dir.path, libc::SIGKILL).unwrap_or(false) {
                    killed += 1;
                }
            }
        }
        if killed > 0 {
            tracing::error!(
                "no lease from a leader backed by a quorum for {} ms: fencing this node, killed {killed} task(s) so that their jobs can be requeued safely elsewhere",
                timing.fence_after_ms
            );
        }
    }

    /// A job told to stop for a preemption or a drain first gets its `--signal` warning and up to its lead
    /// time (at most `MAX_WARNING_S`) to checkpoint; then the usual SIGTERM, KillWait, SIGKILL. True once it is
    /// time for those.
    fn warned_before_stopping(&self, a: &Assignment, mine: &[&TaskDir]) -> bool {
        let (Some(order), Some(warning)) = (&a.job.requeue, a.job.spec.signal) else { return true };
        if order.kind == drover_state::RequeueKind::Requested {
            // `scontrol requeue` stops the job at once, as Slurm's does: a framework that saves on the warning and
            // then asks for the requeue itself must not be warned a second time.
            return true;
        }
        let key = (a.job.id, a.job.incarnation);
        let running = mine.iter().any(|d| matches!(supervise::status(&d.path), TaskStatus::Running { .. }));
        if !running {
            return true;
        }
        let warned_at = {
            let mut inner = self.lock();
            match inner.warned_to_stop.get(&key) {
                Some(at) => Some(*at),
                None => {
                    inner.warned_to_stop.insert(key, Instant::now());
                    None
                }
            }
        };
        let Some(at) = warned_at else {
            if a.node_index == 0 {
                self.warn(key, warning);
            } else if !warning.batch_only {
                self.signal_job(key, warning.signal, SignalTarget::Steps);
            }
            return false;
        };
        at.elapsed() >= Duration::from_secs(u64::from(warning.before_s.min(MAX_WARNING_S)))
    }

    /// Tells the leader which lingering incarnations are gone here (once a second while it lists them): no task
    /// of theirs may still run, their cgroup holds no process, and no process holds the GPUs they held (where the
    /// GPU backend can tell). Only then may the leader give those GPUs to another job.
    fn confirm_released(&self, lingering: &[JobKey], dirs: &[TaskDir]) {
        if lingering.is_empty() {
            return;
        }
        let held_gpus = self.lock().lingering_gpus.clone();
        let gone: Vec<JobKey> = lingering
            .iter()
            .copied()
            .filter(|key| {
                let task_left = dirs.iter().any(|d| d.key == *key && supervise::may_be_running(&d.path));
                let in_cgroup =
                    self.cgroup.as_ref().is_some_and(|root| crate::cgroup::job_has_processes(root, key.0, key.1));
                let gpu_busy = held_gpus.get(key).is_some_and(|gpus| {
                    gpus.iter().any(|gpu| self.gpus.compute_processes(*gpu).is_ok_and(|pids| !pids.is_empty()))
                });
                if task_left || in_cgroup || gpu_busy {
                    tracing::debug!(job = key.0, incarnation = key.1, task_left, in_cgroup, gpu_busy, "not gone yet");
                }
                !task_left && !in_cgroup && !gpu_busy
            })
            .collect();
        if gone.is_empty() {
            return;
        }
        let outbox = {
            let mut inner = self.lock();
            if inner.released_sent.is_some_and(|at| at.elapsed() < Duration::from_millis(RELEASE_RETRY_MS)) {
                return;
            }
            inner.released_sent = Some(Instant::now());
            inner.outbox.clone()
        };
        if let Some(outbox) = outbox {
            // What the jobs used here: the leader records it on the finished jobs as it releases them.
            let usage = gone.iter().filter_map(|&key| Some((key, self.measured(key)?))).collect();
            let _ = outbox.try_send(AgentMessage::Released { keys: gone, usage });
        }
    }

    /// Relays the digest a running job's container image resolved to here, once, until the job's record pins one:
    /// read from what the container's supervisor recorded when it mounted the image.
    fn check_image(&self, a: &Assignment) {
        let Some(container) = a.job.spec.container.as_deref() else { return };
        let Some(image) = container.image.as_ref().filter(|_| container.pinned_digest.is_none()) else { return };
        let key = (a.job.id, a.job.incarnation);
        if self.lock().images_reported.contains(&key) {
            return;
        }
        let Some(digest) = crate::container::mounted_digest(&self.containers_dir(key), &image.to_string()) else {
            return;
        };
        let mut inner = self.lock();
        inner.images_reported.insert(key);
        if let Some(outbox) = inner.outbox.clone() {
            let _ = outbox.try_send(AgentMessage::ImageDigest { job_id: key.0, incarnation: key.1, digest });
        }
    }

    /// A running job's progress marker, read on the checkpoint marker's schedule: a change is progress, relayed
    /// with the next heartbeat (one entry per job however often it changed).
    fn check_progress_marker(&self, a: &Assignment) {
        // Only jobs watched for hangs. Every node of a job reads it (a shared checkpoint directory); the leader
        // writes one report per job however many nodes relay it.
        if a.job.progress_timeout_s().is_none() || a.cancelled() {
            return;
        }
        let key = (a.job.id, a.job.incarnation);
        let previous = self.lock().progress_markers.get(&key).cloned().flatten();
        let Some((seen, change)) = crate::marker::read_progress(&a.job, previous.as_ref()) else { return };
        let mut inner = self.lock();
        // The first look at a marker left by nothing (a fresh incarnation) is progress too: the file is new.
        inner.progress_markers.insert(key, Some(seen));
        if let Some(step) = change {
            inner.progress.retain(|(job, incarnation, _)| (*job, *incarnation) != key);
            inner.progress.push((key.0, key.1, step));
        }
    }

    /// Looks at a running job's checkpoint marker file (at most once a second) and relays a new one.
    fn check_marker(&self, a: &Assignment) {
        if a.cancelled() && a.job.requeue.is_none() {
            return;
        }
        let key = (a.job.id, a.job.incarnation);
        let previous = {
            let mut inner = self.lock();
            let entry = inner.markers.entry(key).or_insert((Instant::now() - MARKER_INTERVAL, None));
            if entry.0.elapsed() < MARKER_INTERVAL {
                return;
            }
            entry.0 = Instant::now();
            entry.1.clone()
        };
        self.check_progress_marker(a);
        let Some((seen, record)) = crate::marker::read(&a.job, previous.as_ref()) else { return };
        let outbox = {
            let mut inner = self.lock();
            if let Some(entry) = inner.markers.get_mut(&key) {
                entry.1 = Some(seen);
            }
            inner.outbox.clone()
        };
        if let (Some(outbox), Some((path, step))) = (outbox, record) {
            let _ = outbox.try_send(AgentMessage::Checkpoint { job_id: key.0, incarnation: key.1, path, step });
        }
    }

    /// What the node's image store holds (`None` when it cannot be opened: containers were never used here and the
    /// state directory is read-only, say).
    pub fn image_store_status(&self) -> Option<crate::image::StoreStatus> {
        let settings = &self.config.containers;
        let root = settings.image_store.clone().unwrap_or_else(|| self.config.state_dir.join("images"));
        // Only a store a task made: looking must not create one.
        if !root.is_dir() {
            return None;
        }
        let options = crate::image::StoreOptions {
            limit_bytes: settings.image_store_limit_mb.saturating_mul(1 << 20),
            ..crate::image::StoreOptions::default()
        };
        crate::image::ImageStore::open(&root, options).ok().map(|store| store.status())
    }

    /// Tells the leader what the image store holds when that has changed (looked at every
    /// [`IMAGE_STORE_INTERVAL`], and only on nodes that have run a container).
    fn report_image_store(&self) {
        {
            let mut inner = self.lock();
            if inner.image_store_checked.is_some_and(|at| at.elapsed() < IMAGE_STORE_INTERVAL) {
                return;
            }
            inner.image_store_checked = Some(Instant::now());
        }
        if !self.config.state_dir.join("containers").exists() {
            return;
        }
        let Some(status) = self.image_store_status() else { return };
        let summary = drover_state::node::ImageStoreSummary {
            images: u32::try_from(status.images.len()).unwrap_or(u32::MAX),
            bytes: status.total_bytes,
            limit_bytes: status.limit_bytes,
        };
        let mut inner = self.lock();
        if inner.image_store_sent == Some(summary) {
            return;
        }
        if let Some(outbox) = inner.outbox.clone()
            && outbox.try_send(AgentMessage::ImageStore { summary }).is_ok()
        {
            inner.image_store_sent = Some(summary);
        }
    }

    /// Where a job's containers on this node live (`<state>/containers/JOB.INCARNATION/NAME`).
    pub(crate) fn containers_dir(&self, key: JobKey) -> PathBuf {
        self.config.state_dir.join("containers").join(format!("{}.{}", key.0, key.1))
    }

    /// Unmounts and removes the containers of jobs that have left this node (their writable layers with them): a
    /// named container lives as long as its job here, as pyxis's do with the job scope.
    fn tend_containers(&self, live: &HashSet<JobKey>, lingering: &[JobKey]) {
        let Ok(entries) = std::fs::read_dir(self.config.state_dir.join("containers")) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((job, incarnation)) = name.split_once('.') else { continue };
            let (Ok(job), Ok(incarnation)) = (job.parse::<u64>(), incarnation.parse::<u64>()) else { continue };
            let key = (job, incarnation);
            if live.contains(&key) || lingering.contains(&key) {
                continue;
            }
            match crate::container::remove_job_containers(&entry.path()) {
                Ok(()) => tracing::info!(job, incarnation, "removed the job's containers"),
                Err(e) => tracing::warn!(job, incarnation, "cannot remove the job's containers: {e}"),
            }
        }
    }

    pub(crate) fn batch_dir(&self, key: JobKey) -> PathBuf {
        self.tasks_dir.join(format!("{}.{}.batch", key.0, key.1))
    }

    /// Leaves a marker file in a job's batch directory (it survives an agent restart).
    fn mark(&self, key: JobKey, marker: &str) {
        let dir = self.batch_dir(key);
        if dir.exists() && !dir.join(marker).exists() {
            let _ = std::fs::write(dir.join(marker), b"1");
        }
    }

    /// `scontrol suspend`/`resume`: SIGSTOP to the job's tasks here when it becomes suspended, SIGCONT when it is
    /// resumed. A marker file records what was done, so an agent restarted in between still resumes the tasks.
    fn keep_suspension(&self, a: &Assignment) {
        let key = (a.job.id, a.job.incarnation);
        let marker = self.suspension_marker(key);
        match (a.job.suspended_since().is_some(), marker.exists()) {
            (true, false) => {
                if let Err(e) = std::fs::write(&marker, b"1") {
                    tracing::warn!(job = key.0, "cannot record the suspension: {e}");
                    return;
                }
                tracing::info!(job = key.0, incarnation = key.1, "suspending the job's tasks");
                self.signal_job(key, libc::SIGSTOP, SignalTarget::Full);
            }
            (false, true) => {
                tracing::info!(job = key.0, incarnation = key.1, "resuming the job's tasks");
                self.signal_job(key, libc::SIGCONT, SignalTarget::Full);
                let _ = std::fs::remove_file(&marker);
            }
            _ => {}
        }
    }

    /// Removes the suspension markers of incarnations no longer assigned here.
    fn forget_suspensions(&self, live: &HashSet<JobKey>) {
        let Ok(entries) = std::fs::read_dir(&self.tasks_dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(|n| n.strip_suffix(".suspended")).and_then(|n| {
                let (id, inc) = n.split_once('.')?;
                Some((id.parse().ok()?, inc.parse().ok()?))
            }) else {
                continue;
            };
            if !live.contains(&key) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    fn suspension_marker(&self, key: JobKey) -> PathBuf {
        self.tasks_dir.join(format!("{}.{}.suspended", key.0, key.1))
    }

    /// Slurm's `*** JOB N ON host CANCELLED AT time [DUE TO ...] ***` for the batch task's stderr, once, before
    /// its first stop signal (scripts and log scrapers grep for it). The supervisor writes it through the task's
    /// own file (see [`supervise::NOTICE_FILE`]); true once it has, or once it had [`NOTICE_WAIT_MS`] to, so a
    /// supervisor that does not answer delays the stop by no more than that.
    fn stop_notice_written(&self, a: &Assignment, over_time: bool) -> bool {
        let dir = self.batch_dir((a.job.id, a.job.incarnation));
        if dir.join(supervise::NOTICE_WRITTEN_FILE).exists()
            || !matches!(supervise::status(&dir), TaskStatus::Running { .. })
        {
            return true;
        }
        let notice = dir.join(supervise::NOTICE_FILE);
        if let Ok(left) = std::fs::metadata(&notice).and_then(|m| m.modified()) {
            return left.elapsed().is_ok_and(|e| e >= Duration::from_millis(NOTICE_WAIT_MS));
        }
        let at = drover_common::wall::local_iso(now_ms()).unwrap_or_else(|| "Unknown".into());
        let line = stop_notice(a.job.id, &self.info.name, &at, a.job.requeue.as_ref().map(|r| r.kind), over_time);
        // Whole or not at all: the supervisor reads it when a file is closed or moved into its directory.
        let partial = dir.join("notice.partial");
        if let Err(e) = std::fs::write(&partial, line).and_then(|()| std::fs::rename(&partial, &notice)) {
            tracing::debug!(job = a.job.id, "cannot leave the stop notice: {e}");
            return true;
        }
        false
    }

    /// SIGTERM first; SIGKILL once the grace period has passed.
    fn stop(&self, dir: &Path, timing: Timing) {
        if !matches!(supervise::status(dir), TaskStatus::Running { .. }) {
            return;
        }
        let first = self.lock().stopping.get(dir).copied();
        let signal = match first {
            None => libc::SIGTERM,
            Some(at) if at.elapsed() > Duration::from_millis(timing.kill_wait_ms) => libc::SIGKILL,
            Some(_) => return,
        };
        if signal == libc::SIGTERM {
            // As slurmstepd: SIGCONT first, so a stopped task (suspended, or under a debugger) gets the SIGTERM.
            let _ = supervise::signal(dir, libc::SIGCONT);
        }
        match supervise::signal(dir, signal) {
            Ok(_) => {
                if first.is_none() {
                    self.lock().stopping.insert(dir.to_path_buf(), Instant::now());
                }
            }
            // Not started yet (no task.pid): try again on the next pass.
            Err(e) => tracing::debug!(task = %dir.display(), "signal deferred: {e}"),
        }
    }

    /// Node 0 reports the job's end: its batch script's result, or, for an interactive allocation that was
    /// cancelled or timed out, the moment its steps are gone.
    fn maybe_report(&self, a: &Assignment, mine: &[&TaskDir], over_time: bool) {
        let key = (a.job.id, a.job.incarnation);
        let batch = mine.iter().find(|d| d.step.is_none());
        let end = match batch.map(|d| supervise::status(&d.path)) {
            Some(TaskStatus::Finished(result)) => {
                let dir = self.batch_dir(key);
                Some(result.job_end(dir.join(TIMED_OUT_MARKER).exists(), dir.join(FENCED_MARKER).exists()))
            }
            Some(TaskStatus::Lost(why)) => Some(JobEnd { exit_code: 1, message: Some(why), ..JobEnd::default() }),
            Some(TaskStatus::Running { .. }) => None,
            None if a.cancelled() || (a.job.spec.interactive && over_time) => {
                let steps_done = mine.iter().all(|d| !matches!(supervise::status(&d.path), TaskStatus::Running { .. }));
                steps_done.then(|| JobEnd { timed_out: over_time && !a.cancelled(), ..JobEnd::default() })
            }
            None => None,
        };
        let Some(mut end) = end else { return };
        let outbox = {
            let mut inner = self.lock();
            let due = inner
                .reports
                .get(&key)
                .is_none_or(|(sent, acked)| !acked && sent.elapsed() > Duration::from_millis(REPORT_RETRY_MS));
            if !due {
                return;
            }
            inner.reports.insert(key, (Instant::now(), false));
            inner.outbox.clone()
        };
        // This node's share of the usage; its cgroup stays until the leader stops listing the job here.
        end.measured = self.measured(key);
        if let Some(outbox) = outbox {
            let _ = outbox.try_send(AgentMessage::JobEnded { job_id: key.0, incarnation: key.1, end });
        }
    }

    /// The client configuration tasks use for `srun`, `scontrol` and friends (empty: the CLI's default).
    pub(crate) fn client_config_path(&self) -> String {
        self.config.client_config.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
    }

    /// A task's environment with what the GPU backend adds to it (a simulated node's mark; see
    /// [`crate::gpu::GpuBackend::task_environment`]). The backend's variables win over the user's, which could
    /// otherwise hide a task from the GPU-holder check.
    pub(crate) fn with_gpu_environment(&self, mut env: Vec<(String, String)>) -> Vec<(String, String)> {
        let extra = self.gpus.task_environment();
        env.retain(|(name, _)| !extra.iter().any(|(x, _)| x == name));
        env.extend(extra);
        env
    }

    /// The problems to report with the next heartbeat: standing ones plus GPUs failing their health check.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.standing_problems.clone();
        let foreign: Vec<u32> = {
            let inner = self.lock();
            let mut gpus: Vec<u32> = inner
                .foreign_holders
                .iter()
                .filter(|(_, since)| since.elapsed() > Duration::from_millis(FOREIGN_HOLDER_PROBLEM_MS))
                .map(|(gpu, _)| *gpu)
                .collect();
            gpus.sort_unstable();
            gpus
        };
        for gpu in foreign {
            match self.gpus.compute_processes(gpu) {
                Ok(pids) if !pids.is_empty() => problems.push(format!(
                    "GPU {gpu}: used by process(es) {pids:?} for over {} s, which no task here started",
                    FOREIGN_HOLDER_PROBLEM_MS / 1_000
                )),
                _ => {
                    self.lock().foreign_holders.remove(&gpu);
                }
            }
        }
        match self.gpus.health() {
            Ok(health) => {
                for (index, why) in crate::gpu::unhealthy(&health) {
                    problems.push(format!("GPU {index}: {why}"));
                }
                self.classify_xids(&health);
                *self.last_health.lock().expect("health poisoned") = health;
            }
            Err(e) => problems.push(format!("GPU health check failed: {e}")),
        }
        problems
    }

    /// Everything the next heartbeat carries: problems (which drain the node), GPU faults by their XID remedy,
    /// GPUs reset since, progress markers seen, and the health check's failure.
    pub fn heartbeat_report(self: &Arc<NodeAgent>) -> HeartbeatReport {
        let problems = self.problems();
        self.reset_idle_gpus();
        let mut inner = self.lock();
        let mut gpu_faults: Vec<_> = inner.gpu_faults.values().cloned().collect();
        gpu_faults.sort_by_key(|f| f.gpu);
        gpu_faults.append(&mut inner.pending_faults);
        let mut gpus_reset: Vec<u32> = inner.gpus_reset.iter().copied().collect();
        gpus_reset.sort_unstable();
        let progress = std::mem::take(&mut inner.progress);
        drop(inner);
        let health_check = self.health_check.lock().expect("health check poisoned").clone();
        let rebooted = self.reboot_if_empty();
        HeartbeatReport { problems, gpu_faults, gpus_reset, progress, health_check, rebooted }
    }

    /// `scontrol reboot`: once the node has no task left (no assignment, nothing lingering, no task directory),
    /// runs the reboot program (Slurm's RebootProgram) for the leader's order, on a thread of its own. The order
    /// is written down first: a program that really reboots the machine never returns, and the agent that starts
    /// afterwards finds the order and reports it carried out. Returns the order carried out, if any, until the
    /// leader's assignments no longer name it.
    fn reboot_if_empty(self: &Arc<NodeAgent>) -> Option<u64> {
        let done_file = self.config.state_dir.join(REBOOT_DONE_FILE);
        let pending_file = self.config.state_dir.join(REBOOT_PENDING_FILE);
        // An order written down by the agent before this one: the program ran (and the machine rebooted).
        if let Ok(id) = std::fs::read_to_string(&pending_file) {
            let _ = std::fs::write(&done_file, id.trim());
            let _ = std::fs::remove_file(&pending_file);
        }
        let done: Option<u64> = std::fs::read_to_string(&done_file).ok().and_then(|t| t.trim().parse().ok());
        let (order, empty, running) = {
            let inner = self.lock();
            let empty = inner.synced && inner.assignments.is_empty() && inner.lingering.is_empty();
            (inner.reboot, empty, inner.rebooting)
        };
        let Some(order) = order else {
            if done.is_some() {
                let _ = std::fs::remove_file(&done_file);
            }
            return None;
        };
        if done == Some(order) {
            return Some(order);
        }
        if !empty || running == Some(order) || !self.task_dirs().is_empty() {
            return None;
        }
        let Some(program) = self.config.reboot_program.clone() else {
            tracing::error!(order, "a reboot is requested but no reboot_program is configured; the node waits");
            return None;
        };
        let argv: Vec<String> = program.split_whitespace().map(str::to_string).collect();
        if argv.is_empty() {
            return None;
        }
        if let Err(e) = std::fs::write(&pending_file, order.to_string()) {
            tracing::error!("cannot write down the reboot order: {e}; not rebooting");
            return None;
        }
        self.lock().rebooting = Some(order);
        tracing::warn!(order, ?argv, "the node is empty: running the reboot program");
        let agent = self.clone();
        std::thread::spawn(move || {
            let result = run_bounded(&argv[0], &argv[1..], REBOOT_PROGRAM_TIMEOUT);
            match result {
                // Still here: the program did its work without taking this process down (a node reset by a
                // BMC or a service restart, or a simulated node).
                Ok(()) => {
                    let _ = std::fs::write(&done_file, order.to_string());
                    let _ = std::fs::remove_file(&pending_file);
                }
                Err(why) => {
                    tracing::error!(order, "the reboot program failed: {why}; trying again at the next heartbeat");
                    let _ = std::fs::remove_file(&pending_file);
                }
            }
            agent.lock().rebooting = None;
        });
        None
    }

    /// Turns a poll's XID events into faults by the table's remedy: a restart-the-application one is reported once
    /// (its job is requeued); the others stay until the GPU is reset (or the agent restarts, as a reboot does).
    fn classify_xids(&self, health: &[crate::gpu::GpuHealth]) {
        use drover_state::node::XidAction;
        let mut inner = self.lock();
        for gpu in health {
            for &xid in &gpu.xid_events {
                let (action, what) = self.xid_table.classify(xid);
                let report = drover_proto::wire::GpuFaultReport {
                    gpu: gpu.index,
                    xid: Some(xid),
                    action,
                    reason: what.to_string(),
                };
                match action {
                    XidAction::Ignore => tracing::info!(gpu = gpu.index, xid, "XID {xid} ({what}): nothing to do"),
                    XidAction::RestartApp => {
                        tracing::warn!(gpu = gpu.index, xid, "XID {xid} ({what}): the job on this GPU is restarted");
                        inner.pending_faults.push(report);
                    }
                    _ => {
                        tracing::warn!(gpu = gpu.index, xid, "XID {xid} ({what}): {}", action.name());
                        inner.gpus_reset.remove(&gpu.index);
                        // The most severe remedy wins while the GPU waits for one.
                        let keep = inner.gpu_faults.get(&gpu.index).is_some_and(|f| f.action >= action);
                        if !keep {
                            inner.gpu_faults.insert(gpu.index, report);
                        }
                    }
                }
            }
        }
    }

    /// Resets GPUs whose fault asks for a reset once no task of this node uses them, with the configured command
    /// on a thread of its own (a reset takes seconds; the heartbeat must not wait for it), at most one try a minute
    /// per GPU. A reset GPU is reported back until a new fault hits it.
    fn reset_idle_gpus(self: &Arc<NodeAgent>) {
        use drover_state::node::XidAction;
        let Some(template) = self.config.gpu_reset_command.clone() else { return };
        let idle: Vec<u32> = {
            let mut inner = self.lock();
            if !inner.synced {
                return;
            }
            let busy: HashSet<u32> = inner
                .assignments
                .values()
                .flat_map(|a| a.job.allocation.get(a.node_index as usize).map(|s| s.gpus.to_vec()).unwrap_or_default())
                .chain(inner.lingering_gpus.values().flatten().copied())
                .collect();
            let candidates: Vec<u32> = inner
                .gpu_faults
                .values()
                .filter(|f| f.action == XidAction::ResetGpu && !busy.contains(&f.gpu))
                .map(|f| f.gpu)
                .filter(|gpu| inner.reset_tried.get(gpu).is_none_or(|at| at.elapsed() >= GPU_RESET_RETRY))
                .collect();
            for gpu in &candidates {
                inner.reset_tried.insert(*gpu, Instant::now());
            }
            candidates
        };
        for gpu in idle {
            if self.gpus.compute_processes(gpu).is_ok_and(|pids| !pids.is_empty()) {
                continue;
            }
            let argv: Vec<String> = template.split_whitespace().map(|w| w.replace("{gpu}", &gpu.to_string())).collect();
            if argv.is_empty() {
                return;
            }
            let agent = self.clone();
            std::thread::spawn(move || match run_bounded(&argv[0], &argv[1..], GPU_RESET_TIMEOUT) {
                Ok(()) => {
                    tracing::warn!(gpu, "GPU reset by {}; reporting it back in service", argv[0]);
                    let mut inner = agent.lock();
                    // A fault that arrived while the reset ran is not cleared by it: the GPU waits for the next.
                    if inner.reset_tried.get(&gpu).is_some_and(|at| at.elapsed() < GPU_RESET_RETRY + GPU_RESET_TIMEOUT)
                    {
                        inner.gpu_faults.remove(&gpu);
                        inner.gpus_reset.insert(gpu);
                    }
                }
                Err(why) => tracing::error!(gpu, "resetting the GPU failed: {why}; it stays drained"),
            });
        }
    }
}

/// Why an operator's command (a GPU reset, the reboot program) did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorCommandError {
    #[error("cannot start {program}: {source}")]
    Start { program: String, source: std::io::Error },
    #[error("{program} exited with {status}")]
    Failed { program: String, status: std::process::ExitStatus },
    #[error("{program} took longer than {timeout_s} s and was killed")]
    Timeout { program: String, timeout_s: u64 },
    #[error("waiting for {program}: {source}")]
    Wait { program: String, source: std::io::Error },
}

/// Runs an operator's command (no shell) for at most `timeout`: Ok when it exits 0.
fn run_bounded(program: &str, args: &[String], timeout: Duration) -> Result<(), OperatorCommandError> {
    let name = || program.to_string();
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|source| OperatorCommandError::Start { program: name(), source })?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(OperatorCommandError::Failed { program: name(), status }),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(OperatorCommandError::Timeout { program: name(), timeout_s: timeout.as_secs() });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(source) => return Err(OperatorCommandError::Wait { program: name(), source }),
        }
    }
}

/// The line slurmstepd writes into a batch job's stderr when the job is stopped, with Slurm's reasons: a
/// requeue (`scontrol requeue`, or a drained GPU), a preemption, or the time limit; a plain cancel has none.
fn stop_notice(
    job: JobId,
    node: &str,
    at: &str,
    requeue: Option<drover_state::RequeueKind>,
    over_time: bool,
) -> String {
    let why = match requeue {
        Some(drover_state::RequeueKind::Preempted) => " DUE TO PREEMPTION",
        Some(_) => " DUE TO JOB REQUEUE",
        None if over_time => " DUE TO TIME LIMIT",
        None => "",
    };
    format!("slurmstepd-{node}: error: *** JOB {job} ON {node} CANCELLED AT {at}{why} ***\n")
}

#[cfg(test)]
mod stop_notice_tests {
    use super::stop_notice;
    use drover_state::RequeueKind;

    #[test]
    fn the_stop_notice_names_the_job_the_node_and_why_as_slurmstepd_does() {
        let at = "2026-12-06T21:30:00";
        assert_eq!(
            stop_notice(1000, "node01", at, None, false),
            "slurmstepd-node01: error: *** JOB 1000 ON node01 CANCELLED AT 2026-12-06T21:30:00 ***\n"
        );
        assert!(stop_notice(7, "n", at, None, true).ends_with(" DUE TO TIME LIMIT ***\n"));
        assert!(stop_notice(7, "n", at, Some(RequeueKind::Requested), true).ends_with(" DUE TO JOB REQUEUE ***\n"));
        assert!(stop_notice(7, "n", at, Some(RequeueKind::Preempted), false).ends_with(" DUE TO PREEMPTION ***\n"));
    }
}
