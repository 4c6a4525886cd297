//! `NodeAgent`: what one node runs. It holds the leader's latest assignments and reconciles the task
//! directories on disk with them: start what is missing, stop what is cancelled, over time or no longer
//! assigned, and report how each job's batch script ended until the leader acknowledges it.
//!
//! The task directories, not memory, are the source of truth about tasks, so a restarted agent picks up
//! exactly where the last one stopped (the supervisors kept the tasks running meanwhile).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drover_proto::wire::{AgentMessage, Assignment};
use drover_state::{JobEnd, JobId, NodeInfo, Usage};
use tokio::sync::{Notify, mpsc};

use crate::config::AgentConfig;
use crate::env::{Placement, StepPlacement, task_environment};
use crate::gpu::GpuBackend;
use crate::patterns::{PatternContext, expand_output_path};
use crate::supervise::{self, TaskLaunch, TaskResult, TaskStatus};

/// How often the task directories are checked (task ends, time limits, kill deadlines).
pub const RECONCILE_INTERVAL_MS: u64 = 10;
/// Batch scripts started at once in one reconcile pass.
const MAX_PARALLEL_LAUNCHES: usize = 16;
/// An unacknowledged end report is sent again after this long.
const REPORT_RETRY_MS: u64 = 2_000;
/// Written into a batch directory when the agent ended the job at its time limit (survives a restart).
const TIMED_OUT_MARKER: &str = "timed_out";

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
}

struct Inner {
    assignments: HashMap<JobId, Assignment>,
    /// True once this session delivered assignments: only then are unassigned tasks known to be strays.
    synced: bool,
    /// The current session's outbox, while connected.
    outbox: Option<mpsc::Sender<AgentMessage>>,
    last_contact: Instant,
    fenced: bool,
    timing: Timing,
    /// Tasks being stopped: when SIGTERM went out.
    stopping: HashMap<PathBuf, Instant>,
    /// End reports: when last sent, and whether the leader acknowledged.
    reports: HashMap<JobKey, (Instant, bool)>,
}

pub struct NodeAgent {
    pub config: AgentConfig,
    pub info: NodeInfo,
    /// This binary, started as `drover-agent supervise DIR` for each task.
    exe: PathBuf,
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
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

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
        let timing = Timing { heartbeat_ms: 1_000, fence_after_ms: 10_000, kill_wait_ms: config.kill_wait_ms };
        Ok(Arc::new(NodeAgent {
            config,
            info,
            exe,
            tasks_dir,
            gpus,
            standing_problems,
            inner: Mutex::new(Inner {
                assignments: HashMap::new(),
                synced: false,
                outbox: None,
                last_contact: Instant::now(),
                fenced: false,
                timing,
                stopping: HashMap::new(),
                reports: HashMap::new(),
            }),
            wake: Notify::new(),
            key,
            tls,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("agent state poisoned")
    }

    pub fn timing(&self) -> Timing {
        self.lock().timing
    }

    /// A session with the leader began; its timing is the cluster's from now on.
    pub fn connected(&self, outbox: mpsc::Sender<AgentMessage>, timing: Timing) {
        let mut inner = self.lock();
        inner.outbox = Some(outbox);
        inner.synced = false;
        inner.timing = timing;
        inner.last_contact = Instant::now();
        if inner.fenced {
            tracing::info!("a leader answers again; leaving the fence");
            inner.fenced = false;
        }
        // Every unacknowledged end goes out again on the new session.
        inner.reports.retain(|_, (_, acked)| !*acked);
        for (sent, _) in inner.reports.values_mut() {
            *sent = Instant::now() - Duration::from_millis(REPORT_RETRY_MS);
        }
    }

    pub fn disconnected(&self) {
        let mut inner = self.lock();
        inner.outbox = None;
        inner.synced = false;
    }

    /// Any message from the leader proves it still leads and still hears this node.
    pub fn contact(&self) {
        self.lock().last_contact = Instant::now();
    }

    pub fn set_assignments(&self, jobs: Vec<Assignment>) {
        let mut inner = self.lock();
        inner.assignments = jobs.into_iter().map(|a| (a.job.id, a)).collect();
        inner.synced = true;
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

    /// `scancel --signal`: to every running task of the job here.
    pub fn signal_job(&self, key: JobKey, signal: i32) {
        for dir in self.task_dirs().into_iter().filter(|d| d.key == key) {
            if let Err(e) = supervise::signal(&dir.path, signal) {
                tracing::warn!(task = %dir.path.display(), "signal {signal} not delivered: {e}");
            }
        }
    }

    /// One reconcile pass; blocking file work, run it on a blocking thread.
    pub fn reconcile(&self) {
        let dirs = self.task_dirs();
        let (assignments, synced, timing, fenced_now) = {
            let mut inner = self.lock();
            let silent = inner.last_contact.elapsed() > Duration::from_millis(inner.timing.fence_after_ms);
            let fence = silent && !inner.fenced;
            if fence {
                inner.fenced = true;
            }
            (inner.assignments.clone(), inner.synced, inner.timing, fence)
        };
        if fenced_now {
            let mut killed = 0;
            for dir in &dirs {
                if matches!(supervise::status(&dir.path), TaskStatus::Running { .. })
                    && supervise::signal(&dir.path, libc::SIGKILL).unwrap_or(false)
                {
                    killed += 1;
                }
            }
            tracing::error!(
                "no leader heard for {} ms: fencing this node, killed {killed} task(s) so that their jobs can be requeued safely elsewhere",
                timing.fence_after_ms
            );
        }
        let now = now_ms();
        let mut live: HashSet<JobKey> = HashSet::new();
        let mut to_launch: Vec<&Assignment> = Vec::new();
        for a in assignments.values() {
            let key = (a.job.id, a.job.incarnation);
            live.insert(key);
            let mine: Vec<&TaskDir> = dirs.iter().filter(|d| d.key == key).collect();
            let over_time = match (a.job.time_limit_s, a.job.start_time_ms) {
                (Some(limit_s), Some(start_ms)) => now > start_ms.saturating_add(limit_s.saturating_mul(1_000)),
                _ => false,
            };
            if a.cancelled() || over_time {
                if over_time && !a.cancelled() && a.node_index == 0 {
                    self.mark_timed_out(key);
                }
                for dir in &mine {
                    self.stop(&dir.path, timing);
                }
            } else if a.node_index == 0
                && !a.job.spec.interactive
                && !mine.iter().any(|d| d.step.is_none())
                && !self.lock().fenced
            {
                to_launch.push(a);
            }
            if a.node_index == 0 {
                self.maybe_report(a, &mine, over_time);
            }
        }
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
        }
    }

    fn batch_dir(&self, key: JobKey) -> PathBuf {
        self.tasks_dir.join(format!("{}.{}.batch", key.0, key.1))
    }

    fn mark_timed_out(&self, key: JobKey) {
        let dir = self.batch_dir(key);
        if dir.exists() && !dir.join(TIMED_OUT_MARKER).exists() {
            let _ = std::fs::write(dir.join(TIMED_OUT_MARKER), b"1");
        }
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
                Some(end_from(&result, self.batch_dir(key).join(TIMED_OUT_MARKER).exists()))
            }
            Some(TaskStatus::Lost(why)) => Some(JobEnd { exit_code: 1, message: Some(why), ..JobEnd::default() }),
            Some(TaskStatus::Running { .. }) => None,
            None if a.cancelled() || (a.job.spec.interactive && over_time) => {
                let steps_done = mine.iter().all(|d| !matches!(supervise::status(&d.path), TaskStatus::Running { .. }));
                steps_done.then(|| JobEnd { timed_out: over_time && !a.cancelled(), ..JobEnd::default() })
            }
            None => None,
        };
        let Some(end) = end else { return };
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
        if let Some(outbox) = outbox {
            let _ = outbox.try_send(AgentMessage::JobEnded { job_id: key.0, incarnation: key.1, end });
        }
    }

    fn launch_batch(&self, a: &Assignment) {
        let key = (a.job.id, a.job.incarnation);
        let dir = self.batch_dir(key);
        let spec = &a.job.spec;
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!(job = key.0, "cannot create {}: {e}", dir.display());
            return;
        }
        let script_path = dir.join("script");
        let script = a.script.clone().unwrap_or_default();
        let written = std::fs::write(&script_path, script.as_bytes()).and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script_path, std::fs::Permissions::from_mode(0o755))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            if is_root() {
                std::os::unix::fs::chown(&script_path, Some(spec.uid), Some(spec.gid))?;
            }
            Ok(())
        });
        let ctx = PatternContext {
            job_id: a.job.id,
            user: &spec.user,
            job_name: &spec.name,
            node: &self.info.name,
            node_id: 0,
            task_id: None,
            step: Some("batch".to_string()),
            restart_count: a.job.restart_count,
            array_job_id: a.job.array.map(|x| x.array_job_id),
            array_task_id: a.job.array.map(|x| x.task_id),
        };
        let work_dir = if spec.work_dir.is_empty() { "/".to_string() } else { spec.work_dir.clone() };
        // Slurm's default names array tasks' output by array and task.
        let default_out = if a.job.array.is_some() { "slurm-%A_%a.out" } else { "slurm-%j.out" };
        let stdout = expand_output_path(spec.stdout.as_deref().unwrap_or(default_out), &ctx, &work_dir);
        let stderr = spec.stderr.as_deref().map(|p| expand_output_path(p, &ctx, &work_dir));
        let gpus = a.job.allocation.first().map(|s| s.gpus.clone()).unwrap_or_default();
        let placement = Placement {
            job: &a.job,
            hosts: &a.hosts,
            node_index: 0,
            node_name: &self.info.name,
            gpus: &gpus,
            step: None,
            controllers: &self.config.controllers.join(","),
            client_config: &self.client_config_path(),
        };
        let mut argv = vec!["/bin/bash".to_string(), script_path.display().to_string()];
        argv.extend(spec.script_args.iter().cloned());
        let launch = TaskLaunch {
            argv,
            env: task_environment(&placement, spec.exported_environment()),
            cwd: work_dir,
            uid: spec.uid,
            gid: spec.gid,
            user: spec.user.clone(),
            stdout,
            stderr,
            append: spec.open_append,
        };
        let started = written
            .map_err(|e| e.to_string())
            .and_then(|_| supervise::spawn(&self.exe, &dir, &launch).map_err(|e| e.to_string()));
        match started {
            Ok(pid) => tracing::info!(job = key.0, incarnation = key.1, pid, "batch script started"),
            Err(message) => {
                tracing::error!(job = key.0, "batch script could not start: {message}");
                write_failed_result(&dir, &message);
            }
        }
    }

    /// Starts one task of a step (`srun`); its output goes to files in its directory unless the step names its own.
    pub fn launch_step_task(
        &self,
        a: &Assignment,
        launch: &drover_proto::wire::StepLaunch,
        rank: u32,
        local_rank: u32,
    ) -> Result<(PathBuf, Option<PathBuf>, Option<PathBuf>), String> {
        let key = (a.job.id, a.job.incarnation);
        let dir = self.tasks_dir.join(format!("{}.{}.{}.{}", key.0, key.1, launch.step_id, rank));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let spec = &a.job.spec;
        let ctx = PatternContext {
            job_id: a.job.id,
            user: &spec.user,
            job_name: &spec.name,
            node: &self.info.name,
            node_id: a.node_index,
            task_id: Some(rank),
            step: Some(launch.step_id.to_string()),
            restart_count: a.job.restart_count,
            array_job_id: a.job.array.map(|x| x.array_job_id),
            array_task_id: a.job.array.map(|x| x.task_id),
        };
        let cwd = if launch.cwd.is_empty() { spec.work_dir.clone() } else { launch.cwd.clone() };
        let (stdout, stderr, streamed_out, streamed_err) = match (&launch.output, &launch.error) {
            (Some(out), err) => {
                let stdout = expand_output_path(out, &ctx, &cwd);
                let stderr = err.as_deref().map(|p| expand_output_path(p, &ctx, &cwd));
                (stdout, stderr, None, None)
            }
            (None, err) => {
                let out = dir.join("stdout");
                let (stderr, streamed_err) = match err {
                    Some(p) => (Some(expand_output_path(p, &ctx, &cwd)), None),
                    None => (Some(dir.join("stderr").display().to_string()), Some(dir.join("stderr"))),
                };
                (out.display().to_string(), stderr, Some(out), streamed_err)
            }
        };
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
        if is_root() {
            // The task's user must be able to create its output files in the directory.
            let _ = std::os::unix::fs::chown(&dir, Some(spec.uid), Some(spec.gid));
        }
        let gpus = a.job.allocation.get(a.node_index as usize).map(|s| s.gpus.clone()).unwrap_or_default();
        let placement = Placement {
            job: &a.job,
            hosts: &a.hosts,
            node_index: a.node_index,
            node_name: &self.info.name,
            gpus: &gpus,
            step: Some(StepPlacement {
                step_id: launch.step_id,
                nodes: &launch.nodes,
                tasks_per_node: &launch.tasks_per_node,
                rank,
                local_rank,
            }),
            controllers: &self.config.controllers.join(","),
            client_config: &self.client_config_path(),
        };
        let task = TaskLaunch {
            argv: launch.argv.clone(),
            env: task_environment(&placement, launch.env.clone()),
            cwd,
            uid: spec.uid,
            gid: spec.gid,
            user: spec.user.clone(),
            stdout,
            stderr,
            append: spec.open_append,
        };
        supervise::spawn(&self.exe, &dir, &task).map_err(|e| e.to_string())?;
        Ok((dir, streamed_out, streamed_err))
    }

    /// The client configuration tasks use for `srun`, `scontrol` and friends (empty: the CLI's default).
    fn client_config_path(&self) -> String {
        self.config.client_config.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
    }

    /// The problems to report with the next heartbeat: standing ones plus GPUs failing their health check.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.standing_problems.clone();
        match self.gpus.health() {
            Ok(health) => {
                for (index, why) in crate::gpu::unhealthy(&health) {
                    problems.push(format!("GPU {index}: {why}"));
                }
            }
            Err(e) => problems.push(format!("GPU health check failed: {e}")),
        }
        problems
    }
}

fn end_from(result: &TaskResult, timed_out: bool) -> JobEnd {
    JobEnd {
        exit_code: result.exit_code,
        signal: result.signal,
        timed_out,
        usage: Usage { cpu_ms: result.cpu_ms, max_rss_kb: result.max_rss_kb },
        message: result.error.clone(),
    }
}

/// Records a launch that failed before a supervisor existed, as the supervisor would have.
fn write_failed_result(dir: &Path, message: &str) {
    let now = now_ms();
    let result = TaskResult {
        exit_code: supervise::EXIT_SETUP_FAILED,
        signal: 0,
        started_ms: now,
        ended_ms: now,
        cpu_ms: 0,
        max_rss_kb: 0,
        error: Some(message.to_string()),
    };
    let json = serde_json::to_vec(&result).expect("results serialize");
    let tmp = dir.join("result.json.tmp");
    if std::fs::write(&tmp, json).and_then(|_| std::fs::rename(&tmp, dir.join(supervise::RESULT_FILE))).is_err() {
        tracing::error!("cannot record the failed launch in {}", dir.display());
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
