//! Per-task supervisors: every task runs under a small supervisor process of its own, so that restarting the agent
//! (an upgrade, a crash) does not kill running tasks. A restarted agent finds each task's directory, asks
//! [`status`] and either keeps watching or reports the [`TaskResult`] the supervisor left behind.
//!
//! # Process model
//!
//! ```text
//! agent ──spawn()──> drover-agent supervise DIR      (short-lived: forks, waits until the supervisor is ready, exits)
//!                        └─fork─> supervisor         (own session, parent is init or a subreaper, never the agent)
//!                                    └─> task        (own process group, pgid = task pid, the user's uid/gids)
//! ```
//!
//! The supervisor is not the agent's child, so the agent never has to reap it and a dying agent takes nothing with
//! it. Signals go to the task's process group ([`signal`]); the supervisor is outside that group, keeps waiting, and
//! records how the task ended. A SIGTERM sent to the supervisor itself is passed on to the task's group (one that
//! arrives before the task started is passed on as soon as it has), so stopping a supervisor (an operator's `kill`)
//! ends its task with a result instead of orphaning it. Only SIGKILL orphans the task; [`status`] then says
//! [`TaskStatus::Lost`] and [`signal`] can still reach the task through `task.pid`.
//!
//! When the task's main process ends, whatever it left running is killed (SIGKILL), as Slurm does at the end of a
//! step, so a forgotten background process cannot hold a GPU the next job was given. The supervisor is a child
//! subreaper, so this includes processes that left the task's process group or session (`setsid`, double forks);
//! only processes some other daemon starts on the task's behalf (`systemd-run`, `at`) escape: catching those needs
//! a cgroup per task.
//!
//! Deployment note: a service manager that kills the agent's whole cgroup on restart (systemd's default
//! `KillMode=control-group`) kills the supervisors too; the agent's unit needs `KillMode=process`.
//!
//! # Files in DIR
//!
//! | file | written by | content |
//! |------|------------|---------|
//! | `launch.json` | [`spawn`] (atomically, mode 0600: it holds the task's environment) | [`TaskLaunch`] |
//! | `supervisor.pid` | the supervisor, before [`spawn`] returns | `PID START_TICKS` |
//! | `task.pid` | the supervisor, right after the task started | `PID PGID START_TICKS` |
//! | `result.json` | the supervisor (atomically), last | [`TaskResult`] |
//! | `supervisor.log` | the supervisor, appended | its own problems; its stdout and stderr are /dev/null |
//!
//! `START_TICKS` is field 22 of `/proc/PID/stat` (start time since boot, in clock ticks): a pid is only trusted, and
//! only ever signalled, while the process holding it started at that very tick, so a recycled pid is never hit.

use std::ffi::{CStr, CString};
use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The task's launch description, written by [`spawn`].
pub const LAUNCH_FILE: &str = "launch.json";
/// `PID START_TICKS` of the supervisor.
pub const SUPERVISOR_PID_FILE: &str = "supervisor.pid";
/// `PID PGID START_TICKS` of the task.
pub const TASK_PID_FILE: &str = "task.pid";
/// How the task ended; its presence means the task is over.
pub const RESULT_FILE: &str = "result.json";
/// A line the agent leaves for the task's stderr when it stops the task (Slurm's `*** JOB N ON host CANCELLED AT
/// ... ***`): the supervisor writes it through the file it opened as the job's user, so the agent never opens a
/// user's path as root.
pub const NOTICE_FILE: &str = "notice";
/// Left by the supervisor once the notice is in the task's stderr: the agent sends its stop signal only then, so
/// the line comes before whatever the task writes as it stops (as slurmstepd's does).
pub const NOTICE_WRITTEN_FILE: &str = "notice.written";
/// The supervisor's own log.
pub const SUPERVISOR_LOG: &str = "supervisor.log";

/// Largest `launch.json` accepted: an environment is a few KiB, a huge file is a bug or an attack on the node.
pub const MAX_LAUNCH_BYTES: u64 = 8 << 20;
/// Largest pid or result file read; they are a few dozen bytes.
const MAX_SMALL_FILE_BYTES: u64 = 64 << 10;

/// Exit code recorded when the program could not be executed and the error has no errno; with one, the exit code
/// is the errno, as slurmstepd's (2 for a missing program).
pub const EXIT_EXEC_FAILED: i32 = 127;
/// Exit code recorded when the task could not be set up (output file, working directory, user switch).
pub const EXIT_SETUP_FAILED: i32 = 1;

/// How long the supervisor keeps killing and reaping what the task left behind before it gives up and records the
/// result anyway (a process stuck in the kernel, e.g. on a dead NFS server or a wedged GPU, cannot be killed).
const LEFTOVER_DEADLINE: Duration = Duration::from_secs(60);

/// The supervisor's own `PATH` (it execs nothing by name; this is for the record).
const SUPERVISOR_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// `PATH` searched when the task's environment has none: what execvp(3) uses.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Everything needed to start one task; the agent writes it as `DIR/launch.json` before starting the supervisor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TaskLaunch {
    /// The program and its arguments, e.g. `["/bin/bash", "/var/lib/drover/tasks/12.0.batch.0/script"]`. A program
    /// without a `/` is looked up in the `PATH` of `env` (not the agent's).
    pub argv: Vec<String>,
    /// The task's complete environment: nothing of the agent's leaks into the task.
    pub env: Vec<(String, String)>,
    /// Absolute working directory, entered as the task's user.
    pub cwd: String,
    /// The user the task runs as. A supervisor running as root switches to it (and never runs the task as root unless
    /// `uid` is 0); any other supervisor refuses a task that is not its own user's.
    pub uid: u32,
    pub gid: u32,
    /// The user's name, for the supplementary groups (getgrouplist). Empty: only `gid`.
    #[serde(default)]
    pub user: String,
    /// Absolute path of the task's standard output (patterns already expanded).
    pub stdout: String,
    /// Absolute path of the task's standard error; `None` means the stdout file.
    pub stderr: Option<String>,
    /// `--open-mode=append`; otherwise the files are truncated.
    pub append: bool,
    /// The node's lease file (see `crate::lease`): the supervisor kills its task when the lease expires, even if
    /// the agent is dead or hung. `None` only for tasks started outside an agent (tests).
    #[serde(default)]
    pub lease_file: Option<String>,
    /// Directories to create (with parents) as the task's user before it starts, e.g. its checkpoint directory.
    #[serde(default)]
    pub make_dirs: Vec<String>,
    /// The job's cgroups on this node, which the task joins before it runs (`None`: not confined, not measured).
    /// (`memory` in launch files of agents from before CPU pinning.)
    #[serde(default, alias = "memory")]
    pub cgroup: Option<TaskCgroup>,
    /// The GPUs the task was given on this node (what a returning agent lists as still held, and the journal
    /// records).
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// The node's task journal (`crate::journal`): the supervisor records the task's start, and its end once
    /// everything it left behind is reaped. `None`: not recorded (tasks started outside an agent).
    #[serde(default)]
    pub journal: Option<String>,
    /// The cluster lets jobs run as root (its `allow_root_jobs`): without it a root supervisor refuses a task for
    /// uid 0, whoever wrote the launch.
    #[serde(default)]
    pub allow_root: bool,
    /// Absolute path of the FIFO the task reads its standard input from (srun's input, which the agent writes);
    /// `None`: `/dev/null`.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The node's name, for Slurm's `slurmstepd-NODE: error:` lines in the task's stderr (empty: `slurmstepd`).
    #[serde(default)]
    pub node: String,
    /// The task runs inside this container (`--container-image`); see `crate::container`.
    #[serde(default)]
    pub container: Option<crate::container::ContainerLaunch>,
}

/// Which job cgroups a task joins, with the job's memory limit and CPUs on this node (see `crate::cgroup`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCgroup {
    pub root: crate::cgroup::CgroupRoot,
    pub job: u64,
    pub incarnation: u64,
    /// 0: no limit (the job asked for no memory, or the node does not track it).
    pub limit_mb: u64,
    /// The CPUs the agent chose for the job here; empty: not pinned.
    #[serde(default)]
    pub cpus: Vec<u32>,
}

/// How a task ended, as the supervisor saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TaskResult {
    /// The exit status; 0 when the task was killed by a signal.
    pub exit_code: i32,
    /// The terminating signal, 0 if the task exited (Slurm prints `ExitCode` as `exit_code:signal`).
    pub signal: i32,
    /// Wall clock, milliseconds since the Unix epoch.
    pub started_ms: u64,
    pub ended_ms: u64,
    /// User plus system CPU time of the task and everything it started.
    pub cpu_ms: u64,
    /// Peak resident memory of the largest process of the task, in KiB.
    pub max_rss_kb: u64,
    /// Why the task could not be started, e.g. `execve(/bin/nonexistent): No such file or directory`.
    pub error: Option<String>,
    /// The supervisor killed the task because the node's lease expired (a fence, not the job's own failure).
    #[serde(default)]
    pub fenced: bool,
    /// The kernel's OOM killer killed it: the job went over its memory (Slurm's OUT_OF_MEMORY).
    #[serde(default)]
    pub oom: bool,
}

impl TaskResult {
    /// The job's end as its batch task's result says (`fenced`: the node's lease ran out and the tasks were killed).
    pub fn job_end(&self, timed_out: bool, fenced: bool) -> drover_state::JobEnd {
        drover_state::JobEnd {
            exit_code: self.exit_code,
            signal: self.signal,
            timed_out,
            usage: drover_state::Usage { cpu_ms: self.cpu_ms, max_rss_kb: self.max_rss_kb },
            message: self.error.clone(),
            fenced: fenced || self.fenced,
            oom: self.oom,
            // Read from the job's cgroup when the report goes out (see `NodeAgent::measured`).
            measured: None,
            by_client: false,
        }
    }
}

/// What [`status`] finds in a task directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    /// The supervisor is alive; `pid` is the supervisor's (the task's own pid is in `task.pid` once it started).
    Running {
        pid: u32,
    },
    Finished(TaskResult),
    /// Neither a result nor a live supervisor; the text says why.
    Lost(String),
}

/// Errors of [`spawn`], [`read_launch`] and [`signal`]; each names the file or directory involved. The underlying
/// error is part of the message and kept in `cause` (not chained as `source`, which would print it twice).
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("cannot {action} {}: {cause}", path.display())]
    Io { action: &'static str, path: PathBuf, cause: io::Error },
    #[error(
        "{} is {size} bytes, more than the {limit}-byte limit; a task's launch description should be far smaller",
        path.display()
    )]
    TooLarge { path: PathBuf, size: u64, limit: u64 },
    #[error("{} is not valid JSON for this file: {cause}", path.display())]
    Json { path: PathBuf, cause: serde_json::Error },
    #[error("invalid task launch for {}: {reason}", path.display())]
    InvalidLaunch { path: PathBuf, reason: String },
    #[error(
        "{} is malformed ({reason}); it is written only by the supervisor, so the task directory was damaged",
        path.display()
    )]
    BadPidFile { path: PathBuf, reason: String },
    #[error("{} already holds a task ({file} exists); every task needs a fresh directory", dir.display())]
    AlreadyLaunched { dir: PathBuf, file: &'static str },
    #[error("cannot start the supervisor {} for {}: {cause}", exe.display(), dir.display())]
    SpawnSupervisor { exe: PathBuf, dir: PathBuf, cause: io::Error },
    #[error(
        "the supervisor for {} failed before it was ready ({status}); see {}",
        dir.display(),
        dir.join(SUPERVISOR_LOG).display()
    )]
    SupervisorFailed { dir: PathBuf, status: String },
    #[error("the task in {} has not started yet (no {TASK_PID_FILE}); try again in a moment", dir.display())]
    NotStarted { dir: PathBuf },
    #[error("cannot send signal {signal} to the task's process group {pgid} ({}): {cause}", dir.display())]
    Kill { dir: PathBuf, signal: i32, pgid: i32, cause: io::Error },
    #[error(
        "the {what} {} is not root's alone (owner uid {uid}, mode {mode:o}): refusing to act on it as root",
        path.display()
    )]
    NotRootsAlone { what: &'static str, path: PathBuf, uid: u32, mode: u32 },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SuperviseError {
    move |cause| SuperviseError::Io { action, path: path.to_path_buf(), cause }
}

/// Writes `DIR/launch.json` and starts `exe supervise DIR` detached from the caller (own session, stdio on /dev/null,
/// working directory `/`). Returns the supervisor's pid once the supervisor has written `supervisor.pid`, so
/// [`status`] says `Running` (or `Finished`) from the moment this returns, never `Lost`.
///
/// It blocks for the few milliseconds the supervisor needs to start; call it from a blocking context
/// (`spawn_blocking`) in async code. `dir` is created if needed and must not hold an earlier task.
pub fn spawn(exe: &Path, dir: &Path, launch: &TaskLaunch) -> Result<u32, SuperviseError> {
    validate_launch(launch, &dir.join(LAUNCH_FILE))?;
    fs::create_dir_all(dir).map_err(io_error("create the task directory", dir))?;
    let dir = dir.canonicalize().map_err(io_error("resolve the task directory", dir))?;
    for file in [SUPERVISOR_PID_FILE, TASK_PID_FILE, RESULT_FILE] {
        if dir.join(file).exists() {
            return Err(SuperviseError::AlreadyLaunched { dir, file });
        }
    }
    let launch_path = dir.join(LAUNCH_FILE);
    let json =
        serde_json::to_vec_pretty(launch).map_err(|cause| SuperviseError::Json { path: launch_path.clone(), cause })?;
    if json.len() as u64 > MAX_LAUNCH_BYTES {
        // Refused here, where the caller can act on it, rather than by a supervisor that could only log it.
        return Err(SuperviseError::TooLarge { path: launch_path, size: json.len() as u64, limit: MAX_LAUNCH_BYTES });
    }
    write_atomic(&launch_path, &json, 0o600, true).map_err(io_error("write", &launch_path))?;

    let spawn_error = |cause| SuperviseError::SpawnSupervisor { exe: exe.to_path_buf(), dir: dir.clone(), cause };
    // Its own process group at once, so a signal to the agent's group (Ctrl-C on an agent in a terminal) cannot hit
    // the supervisor during the moment before it has its own session.
    // A clean environment: the supervisor runs as root, and nothing the agent's own environment carries
    // (LD_PRELOAD, LD_LIBRARY_PATH, a stray RUST_LOG) may reach it or, through it, a task.
    let mut intermediate = Command::new(exe)
        .arg("supervise")
        .arg(&dir)
        .env_clear()
        .env("PATH", SUPERVISOR_PATH)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(spawn_error)?;
    let exit = intermediate.wait().map_err(spawn_error)?;
    if !exit.success() {
        return Err(SuperviseError::SupervisorFailed { dir, status: exit.to_string() });
    }
    let (pid, _) = read_supervisor_pid(&dir)?;
    Ok(pid)
}

/// A root supervisor trusts its task directory only if nobody but root can change what is in it: the directory
/// and `launch.json` belong to root, and neither group nor others may write them (a job's user who could would
/// choose the command, the uid and the files root acts on). A supervisor that is not root runs its own user's
/// task and has nothing to protect.
pub fn check_control_files(dir: &Path) -> Result<(), SuperviseError> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    for (path, what) in [(dir.to_path_buf(), "task directory"), (dir.join(LAUNCH_FILE), "launch file")] {
        let meta = fs::symlink_metadata(&path).map_err(io_error("inspect", &path))?;
        if meta.file_type().is_symlink() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(SuperviseError::NotRootsAlone { what, path, uid: meta.uid(), mode: meta.mode() & 0o7777 });
        }
    }
    Ok(())
}

/// Reads and checks `DIR/launch.json` (at most [`MAX_LAUNCH_BYTES`]).
pub fn read_launch(dir: &Path) -> Result<TaskLaunch, SuperviseError> {
    let path = dir.join(LAUNCH_FILE);
    let bytes = read_limited(&path, MAX_LAUNCH_BYTES)?;
    let launch: TaskLaunch =
        serde_json::from_slice(&bytes).map_err(|cause| SuperviseError::Json { path: path.clone(), cause })?;
    validate_launch(&launch, &path)?;
    Ok(launch)
}

/// What the task in `dir` is doing: `Finished` once `result.json` exists, `Running` while the supervisor (checked by
/// pid and start time) is alive, `Lost` otherwise. A restarted agent calls this to re-attach to its tasks.
pub fn status(dir: &Path) -> TaskStatus {
    if let Ok(Some(result)) = read_result(dir) {
        return TaskStatus::Finished(result);
    }
    let supervisor = read_supervisor_pid(dir);
    if let Ok((pid, start)) = supervisor
        && process_alive(pid, start)
    {
        return TaskStatus::Running { pid };
    }
    // The supervisor may have written its result and exited between the two looks.
    match read_result(dir) {
        Ok(Some(result)) => TaskStatus::Finished(result),
        Ok(None) => match supervisor {
            Ok(_) => TaskStatus::Lost(format!("supervisor for {} died without a result", dir.display())),
            Err(e) => TaskStatus::Lost(format!("no live supervisor for {}: {e}", dir.display())),
        },
        Err(e) => TaskStatus::Lost(format!("supervisor for {} died and left a damaged result: {e}", dir.display())),
    }
}

/// Whether anything of the task in `dir` may still run: its supervisor is alive, or, with the supervisor gone
/// without a result (SIGKILLed), the task's own main process is. A finished or vanished directory: no.
pub fn may_be_running(dir: &Path) -> bool {
    match status(dir) {
        TaskStatus::Running { .. } => true,
        TaskStatus::Finished(_) => false,
        TaskStatus::Lost(_) => {
            let path = dir.join(TASK_PID_FILE);
            read_limited(&path, MAX_SMALL_FILE_BYTES)
                .and_then(|bytes| parse_task_pid(&path, &bytes))
                .is_ok_and(|(pid, _, start)| process_alive(pid, start))
        }
    }
}

/// Sends `signal` to the task's process group, which holds the task and everything it started (unless they left
/// it), but not the supervisor. `Ok(false)` when the task is already gone. Works without a live supervisor, so a
/// task whose supervisor was killed can still be stopped.
///
/// In the first moments after [`spawn`] the task may not have started yet: that is
/// [`SuperviseError::NotStarted`], worth a retry a few milliseconds later. (To cancel a task that has not started,
/// SIGTERM its supervisor instead: the supervisor passes it on the moment the task starts.)
pub fn signal(dir: &Path, signal: i32) -> Result<bool, SuperviseError> {
    deliver(dir, signal, true)
}

/// Like [`signal`], but to the task's main process alone, not the rest of its group (`scancel -b`: the batch
/// shell, not its children).
pub fn signal_leader(dir: &Path, signal: i32) -> Result<bool, SuperviseError> {
    deliver(dir, signal, false)
}

fn deliver(dir: &Path, signal: i32, whole_group: bool) -> Result<bool, SuperviseError> {
    if dir.join(RESULT_FILE).exists() {
        return Ok(false);
    }
    // The pid comes from a file: only from one nobody but root could have written, and only for a process of
    // the task's job (below), so no job can aim a root signal at another process.
    check_control_files(dir)?;
    let path = dir.join(TASK_PID_FILE);
    let (pid, pgid, start) = match read_limited(&path, MAX_SMALL_FILE_BYTES) {
        Ok(bytes) => parse_task_pid(&path, &bytes)?,
        Err(SuperviseError::Io { cause, .. }) if cause.kind() == io::ErrorKind::NotFound => {
            return match read_supervisor_pid(dir) {
                Ok((spid, sstart)) if process_alive(spid, sstart) && !dir.join(RESULT_FILE).exists() => {
                    Err(SuperviseError::NotStarted { dir: dir.to_path_buf() })
                }
                _ => Ok(false),
            };
        }
        Err(e) => return Err(e),
    };
    let Some(stat) = proc_stat(pid) else { return Ok(false) };
    if stat.start_ticks != start {
        return Ok(false);
    }
    if let Ok(launch) = read_launch(dir)
        && let Some(c) = &launch.cgroup
        && !crate::cgroup::process_in_job(&c.root, c.job, c.incarnation, pid)
        && !stat.is_dead()
    {
        return Err(SuperviseError::BadPidFile {
            path: dir.join(TASK_PID_FILE),
            reason: format!("process {pid} is not in job {}.{}'s cgroup", c.job, c.incarnation),
        });
    }
    // SAFETY: kill has no memory-safety preconditions. While the leader exists (even as a zombie) its pid, and so
    // the group id, cannot be reused, and we just checked that it is the leader we started.
    let target = if whole_group { -pgid } else { pid as i32 };
    if unsafe { libc::kill(target, signal) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Ok(false);
        }
        return Err(SuperviseError::Kill { dir: dir.to_path_buf(), signal, pgid, cause: err });
    }
    // A zombie leader has ended; the signal still went to whatever it left in the group.
    Ok(!stat.is_dead())
}

/// The body of `drover-agent supervise DIR`; returns the process's exit code.
///
/// It forks at once (the parent returns 0 as soon as the child has written `supervisor.pid`, which is what [`spawn`]
/// waits for), so it must be called from a single-threaded process: first thing in `main`, before any runtime. It
/// also closes every inherited descriptor above stderr.
/// The child starts the task, waits for it and writes `result.json`; a task that cannot be started gets a result
/// too (exit code execve's errno, [`EXIT_EXEC_FAILED`] or [`EXIT_SETUP_FAILED`] with `error` set, and a Slurm-style line in the
/// task's stderr file when that file could be opened).
pub fn run_supervisor(dir: &Path) -> i32 {
    // Descriptors the agent leaked without close-on-exec (a listening socket, a lock file) would otherwise stay open
    // here for the task's lifetime, blocking a restarted agent, and be inherited by the task.
    close_inherited_descriptors();
    let dir = match dir.canonicalize() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("drover-agent supervise: cannot open the task directory {}: {e}", dir.display());
            return 1;
        }
    };
    let mut log = Log::open(&dir);
    let (ready_read, ready_write) = match pipe() {
        Ok(fds) => fds,
        Err(e) => {
            log.line(format_args!("cannot create a pipe: {e}"));
            return 1;
        }
    };
    // SAFETY: documented requirement: the process is single-threaded here, so the child is a complete copy.
    match unsafe { libc::fork() } {
        -1 => {
            log.line(format_args!("cannot fork the supervisor: {}", io::Error::last_os_error()));
            return 1;
        }
        0 => drop(ready_read),
        _ => {
            // The short-lived parent: report readiness to spawn() through the exit code. EOF without the byte means
            // the supervisor failed before it was ready (and logged why).
            drop(ready_write);
            let mut byte = [0u8; 1];
            return match File::from(ready_read).read(&mut byte) {
                Ok(1) => 0,
                _ => 1,
            };
        }
    }

    // SAFETY: setsid has no memory-safety preconditions; a forked child is never a group leader, so it succeeds.
    unsafe { libc::setsid() };
    let me = std::process::id();
    let Some(own) = proc_stat(me) else {
        log.line(format_args!("cannot read /proc/{me}/stat"));
        return 1;
    };
    let pid_path = dir.join(SUPERVISOR_PID_FILE);
    if let Err(e) = write_atomic(&pid_path, format!("{me} {}\n", own.start_ticks).as_bytes(), 0o644, false) {
        log.line(format_args!("cannot write {}: {e}", pid_path.display()));
        return 1;
    }
    let _ = File::from(ready_write).write_all(b"R");
    ignore_hangup_and_interrupt();
    forward_sigterm_to_task();
    // Orphans of the task are re-parented to us rather than to init, so we can kill and reap all of them.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        log.line(format_args!(
            "cannot become a subreaper ({}); escaped processes may survive",
            io::Error::last_os_error()
        ));
    }

    let result = supervise(&dir, &mut log);
    let path = dir.join(RESULT_FILE);
    let json = serde_json::to_vec_pretty(&result).unwrap_or_default();
    match write_atomic(&path, &json, 0o644, true) {
        Ok(()) => 0,
        Err(e) => {
            log.line(format_args!("cannot write {}: {e}", path.display()));
            1
        }
    }
}

/// Starts the task, waits for it and everything it left behind, and says how it ended.
fn supervise(dir: &Path, log: &mut Log) -> TaskResult {
    if let Err(why) = check_control_files(dir) {
        return failed(log, None, Failure::setup(why.to_string(), None));
    }
    let launch = match read_launch(dir) {
        Ok(launch) => launch,
        Err(e) => return failed(log, None, Failure::setup(e.to_string(), None)),
    };
    let _ = STEPD_NAME.set(if launch.node.is_empty() {
        "slurmstepd".into()
    } else {
        format!("slurmstepd-{}", launch.node)
    });
    let creds = match credentials(&launch) {
        Ok(creds) => creds,
        Err(failure) => return failed(log, None, failure),
    };
    let prepared = match as_user(creds.as_ref(), || prepare(&launch)) {
        Ok(Ok(prepared)) => prepared,
        Ok(Err((failure, stderr))) => return failed(log, stderr.as_ref(), failure),
        Err(e) => return failed(log, None, Failure::setup(format!("cannot switch to uid {}: {e}", launch.uid), None)),
    };
    // The container, once the output files are open (its errors go there): the image may take minutes to pull.
    let container = match &launch.container {
        Some(c) => match enter_container_prepared(&launch, c, creds.as_ref(), log) {
            Ok(ready) => Some(ready),
            Err(failure) => return failed(log, Some(&prepared.stderr), failure),
        },
        None => None,
    };
    if container.is_some() && TERM_PENDING.load(Ordering::SeqCst) {
        // Cancelled while the image was pulled: nothing to start.
        let failure = Failure { exit_code: 0, error: "stopped before the task started".into(), message: None };
        return TaskResult { signal: libc::SIGTERM, ..failed(log, None, failure) };
    }
    let rootfs = container.as_ref().map(|ready| ready.rootfs.clone());
    let started = match spawn_task(&launch, creds.as_ref(), prepared, container, log) {
        Ok(started) => started,
        Err(result) => return *result,
    };
    let pid = started.child.id() as i32;
    let pgid = pid; // the child made itself a group leader before exec
    TASK_PGID.store(pgid, Ordering::SeqCst);
    if TERM_PENDING.swap(false, Ordering::SeqCst) {
        // SAFETY: kill has no memory-safety preconditions; pgid is our live child's group.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
    }
    let error = record_task(dir, pid, pgid, log);
    record_in_journal(dir, &launch, crate::journal::JournalEvent::Start, log);
    let stderr = started.stderr.as_ref().and_then(|f| f.try_clone().ok());
    let result = await_task(dir, &launch, started, error, log);
    if let (Some(c), Some(rootfs)) = (&launch.container, rootfs)
        && let Some(path) = c.spec.save.as_deref().filter(|_| c.save_here)
    {
        save_container(c, &rootfs, path, creds.as_ref(), stderr.as_ref(), log);
    }
    result
}

/// The task's container made ready on the host (see `crate::container::prepare`), with the user's rights where the
/// user's files are read: an image file, registry credentials.
fn enter_container_prepared(
    launch: &TaskLaunch,
    c: &crate::container::ContainerLaunch,
    creds: Option<&Credentials>,
    log: &mut Log,
) -> Result<crate::container::Ready, Failure> {
    let home = crate::container::home_of(launch.uid);
    let credentials = match &home {
        Some(home) => as_user(creds, || crate::image::RegistryCredentials::load(Path::new(home)))
            .unwrap_or_else(|_| crate::image::RegistryCredentials::none()),
        None => crate::image::RegistryCredentials::none(),
    };
    let open_as_user = |path: &str| {
        as_user(creds, || OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(path)).and_then(|r| r)
    };
    let path_as_user = |path: &str| {
        as_user(creds, || OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_CLOEXEC).open(path))
            .and_then(|r| r)
    };
    let started = Instant::now();
    let task = crate::container::Task {
        uid: launch.uid,
        gid: launch.gid,
        user: &launch.user,
        home: home.as_deref(),
        argv: &launch.argv,
        env: &launch.env,
    };
    let ready = crate::container::prepare(c, &task, &open_as_user, &path_as_user, &credentials).map_err(|e| {
        let message = format!("container: {e}");
        Failure::setup(message.clone(), Some(message))
    })?;
    log.line(format_args!(
        "container {} ({}) ready in {} ms{}",
        c.spec.image.as_ref().map_or_else(|| c.spec.name.clone().unwrap_or_default(), |i| i.to_string()),
        ready.digest,
        started.elapsed().as_millis(),
        if ready.idmapped || launch.uid == 0 {
            ""
        } else {
            "; the image store cannot be idmapped here, so the image's files stay root's"
        }
    ));
    Ok(ready)
}

/// `--container-save` once the task has ended; a failure is reported in the task's stderr, the task's own result
/// stands.
fn save_container(
    c: &crate::container::ContainerLaunch,
    rootfs: &Path,
    path: &str,
    creds: Option<&Credentials>,
    stderr: Option<&File>,
    log: &mut Log,
) {
    let create_as_user = |path: &str| {
        as_user(creds, || {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
        })
        .and_then(|r| r)
    };
    if let Err(e) = crate::container::save(rootfs, Path::new(&c.dir), path, &create_as_user) {
        let message = format!("container: cannot save the container to {path}: {e}");
        log.line(&message);
        if let Some(mut stderr) = stderr {
            let name = STEPD_NAME.get().map_or("slurmstepd", String::as_str);
            let _ = writeln!(stderr, "{name}: error: {message}");
        }
    }
}

/// A task that has been spawned: its process, when it started, and its memory cgroup with the OOM kills counted
/// there before it (other tasks of the job share the cgroup: any new one is this task's).
struct Started {
    child: std::process::Child,
    started_ms: u64,
    memory_cgroup: Option<PathBuf>,
    oom_before: u64,
    /// The task's stderr, shared with it (one offset), for the agent's notice when it stops the task.
    stderr: Option<File>,
}

/// Starts the task as its user: the job's cgroups joined between fork and exec (so nothing it allocates or
/// spends escapes them), its output files, its environment. A task that cannot start is the result, with why.
fn spawn_task(
    launch: &TaskLaunch,
    creds: Option<&Credentials>,
    prepared: Prepared,
    container: Option<crate::container::Ready>,
    log: &mut Log,
) -> Result<Started, Box<TaskResult>> {
    let failed = |log: &mut Log, stderr: Option<&File>, failure| Box::new(failed(log, stderr, failure));
    let Prepared { stdin, stdout, stderr, program } = prepared;
    // Inside a container: the image's entrypoint may come first, the environment is merged with the image's, and
    // the program is looked up in the container's PATH by execvp after pivot_root.
    let (argv, env, program, plan) = match container {
        Some(ready) => {
            let program = PathBuf::from(&ready.argv[0]);
            (ready.argv, ready.env, program, Some(ready.plan))
        }
        None => (launch.argv.clone(), launch.env.clone(), program, None),
    };
    // What each container step does, for the error when one fails (the plan itself moves into the child's closure).
    let descriptions = plan.as_ref().map(|p| p.descriptions.clone());
    let stderr_for_errors = stderr.try_clone().ok();
    // The job's cgroups, joined by the task itself between fork and exec (so nothing it allocates or spends
    // escapes them).
    let joining = match launch.cgroup.as_ref().map(|c| join_points(c, log)).transpose() {
        Ok(joining) => joining,
        Err(failure) => return Err(failed(log, Some(&stderr), failure)),
    };
    // At most two to join (memory, v1 cpuacct): a fixed array, since the child may not allocate.
    let mut procs_fds = [-1; 2];
    assert!(joining.as_ref().is_none_or(|j| j.required.len() <= procs_fds.len()), "more cgroups than expected");
    for (fd, file) in procs_fds.iter_mut().zip(joining.iter().flat_map(|j| &j.required)) {
        *fd = file.as_raw_fd();
    }
    let cpuset_fd = joining.as_ref().and_then(|j| j.cpuset.as_ref()).map_or(-1, |file| file.as_raw_fd());
    // OOM kills counted so far (other tasks of the job share the cgroup): any new one is this task's.
    let oom_before = match (&joining, &launch.cgroup) {
        (Some(j), Some(c)) => crate::cgroup::oom_kills(&j.cgroup.memory, c.root.hierarchy),
        _ => 0,
    };

    let (stage_read, stage_write) = match pipe() {
        Ok(fds) => fds,
        Err(e) => {
            return Err(failed(log, Some(&stderr), Failure::setup(format!("cannot create a pipe: {e}"), None)));
        }
    };
    let mut command = Command::new(&program);
    command
        .arg0(&argv[0])
        .args(&argv[1..])
        .stdin(stdin.map_or_else(Stdio::null, Stdio::from))
        .stdout(stdout)
        .stderr(stderr);
    take_task_environment(&env);
    let stage_fd = stage_write.as_raw_fd();
    let child_creds = creds.cloned();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls (signal, setpgid,
    // setgroups, setgid, setuid, write, and for a container unshare, mount, pivot_root, fork of a helper that only
    // writes two files) on data prepared before the fork; it allocates nothing.
    unsafe {
        command.pre_exec(move || prepare_child(stage_fd, procs_fds, cpuset_fd, child_creds.as_ref(), plan.as_ref()))
    };
    let started_ms = now_ms();
    let spawned = command.spawn();
    // The job's variables were this root process's only for the fork: it starts nothing else, but nothing of the
    // user's (TZ, locale, resolver settings) stays in it either.
    drop_task_environment();
    drop(command); // closes our copies of the task's output files
    drop(stage_write);
    // The task has joined (or failed to): close the cgroup.procs files.
    let memory_cgroup = joining.map(|j| j.cgroup.memory);
    let child = match spawned {
        Ok(child) => {
            // The stages the task went through before its exec (the pipe closed at the exec): a cpuset it could
            // not join left it unpinned, which costs it nothing but is worth a line.
            let mut stages = Vec::new();
            let _ = File::from(stage_read).read_to_end(&mut stages);
            if stages.contains(&STAGE_CPUSET_SKIPPED) {
                log.line("the task could not join the job's cpuset and runs on any CPU");
            }
            child
        }
        Err(e) => {
            let mut stages = Vec::new();
            let _ = File::from(stage_read).read_to_end(&mut stages);
            let failure = Failure::from_child_setup(stages.last().copied(), launch, &e, descriptions.as_deref());
            return Err(failed(log, stderr_for_errors.as_ref(), failure));
        }
    };
    Ok(Started { child, started_ms, memory_cgroup, oom_before, stderr: stderr_for_errors })
}

/// Records the task's pid, group and start time where the agent finds them; a task nobody can signal cannot be
/// cancelled or fenced, so one whose record fails is killed at once (the error says why).
fn record_task(dir: &Path, pid: i32, pgid: i32, log: &mut Log) -> Option<String> {
    let task_pid_path = dir.join(TASK_PID_FILE);
    let recorded = match proc_stat(pid as u32) {
        Some(stat) => {
            write_atomic(&task_pid_path, format!("{pid} {pgid} {}\n", stat.start_ticks).as_bytes(), 0o644, false)
        }
        None => Err(io::Error::other(format!("cannot read /proc/{pid}/stat"))),
    };
    if let Err(e) = recorded {
        // A task nobody can signal cannot be cancelled or fenced: do not let it run.
        let message = format!("cannot record the task's pid in {}: {e}", task_pid_path.display());
        log.line(&message);
        // SAFETY: pgid is our unreaped child's group (it is reaped only after `await_task` waited for it).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        return Some(message);
    }
    None
}

/// Waits for the task to end (or its lease to run out), kills what it left behind, reaps it, and says how it
/// ended.
fn await_task(dir: &Path, launch: &TaskLaunch, started: Started, error: Option<String>, log: &mut Log) -> TaskResult {
    let Started { child, started_ms, memory_cgroup, oom_before, stderr } = started;
    let pid = child.id() as i32;
    let pgid = pid;
    let mut notice = Notice::watch(dir, stderr, log);
    let fenced = match launch.lease_file.as_deref() {
        Some(lease) => wait_within_lease(pid, pgid, Path::new(lease), &mut notice, log),
        None => {
            wait_for_exit_without_reaping(pid, log);
            false
        }
    };
    let ended_ms = now_ms();
    // The leader is a zombie now, so its pid, and the group id, cannot have been reused: kill what it left behind.
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    TASK_PGID.store(-1, Ordering::SeqCst);
    let wait_status = reap(pid, log);
    reap_leftovers(log, Instant::now() + LEFTOVER_DEADLINE);
    // Nothing of the task is left to hold its GPUs (a process stuck in the kernel past the deadline aside, which
    // the log says).
    record_in_journal(dir, launch, crate::journal::JournalEvent::End, log);
    // A notice left while nothing watched (no lease file to wait on) still reaches the file, after the task's output.
    notice.deliver(log);

    let usage = children_usage();
    let (exit_code, signal) = decode_wait_status(wait_status);
    log.line(format_args!("task {pid} ended: exit code {exit_code}, signal {signal}"));
    // The job's cgroups stay: other tasks of the job may still use them, and the agent reads the job's usage from
    // them when the job ends here, then removes them.
    let oom = match (&memory_cgroup, &launch.cgroup) {
        (Some(dir), Some(c)) => {
            // As Slurm: any process of the task killed for memory (often a child, while the shell lives on to
            // exit 137) makes it OUT_OF_MEMORY.
            let killed = crate::cgroup::oom_kills(dir, c.root.hierarchy) > oom_before;
            if killed {
                log.line(format_args!("the task went over the job's {} MiB of memory", c.limit_mb));
            }
            killed
        }
        _ => false,
    };
    TaskResult {
        exit_code,
        signal,
        started_ms,
        ended_ms,
        cpu_ms: usage.cpu_ms,
        max_rss_kb: usage.max_rss_kb,
        error,
        fenced,
        oom,
    }
}

/// The agent's notice of why it stops the task (see [`NOTICE_FILE`]), watched for with inotify on the task's
/// directory so it is written the moment it is left, through the task's own stderr.
struct Notice {
    dir: PathBuf,
    stderr: Option<File>,
    /// inotify on `dir` (closes and creations of files there); `None` where the kernel gives none.
    watch: Option<OwnedFd>,
    written: bool,
}

impl Notice {
    fn watch(dir: &Path, stderr: Option<File>, log: &mut Log) -> Notice {
        let watch = stderr.as_ref().and_then(|_| {
            // SAFETY: inotify_init1 takes flags and returns a new descriptor or -1.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
            if fd < 0 {
                log.line(format_args!("no inotify for the stop notice: {}", io::Error::last_os_error()));
                return None;
            }
            // SAFETY: a descriptor the kernel just gave us, owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
            // SAFETY: a valid inotify descriptor and a NUL-terminated path.
            let wd = unsafe {
                libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO)
            };
            (wd >= 0).then_some(fd)
        });
        Notice { dir: dir.to_path_buf(), stderr, watch, written: false }
    }

    /// Drains the watch's events (they only say "look again").
    fn drain(&self) {
        let Some(fd) = &self.watch else { return };
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a buffer of the given length; the descriptor is non-blocking.
        while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }

    /// Writes the notice to the task's stderr if the agent left one and it is not written yet.
    fn deliver(&mut self, log: &mut Log) {
        self.drain();
        if self.written {
            return;
        }
        let Some(stderr) = self.stderr.as_mut() else { return };
        let Ok(bytes) = read_limited(&self.dir.join(NOTICE_FILE), MAX_SMALL_FILE_BYTES) else { return };
        self.written = true;
        if let Err(e) = stderr.write_all(&bytes) {
            log.line(format_args!("cannot write the stop notice to the task's stderr: {e}"));
        }
        if let Err(e) = fs::write(self.dir.join(NOTICE_WRITTEN_FILE), b"1") {
            log.line(format_args!("cannot mark the stop notice written: {e}"));
        }
    }
}

/// Appends the task's start or end to the node's journal, if the launch names one. A journal that cannot be
/// written costs the record, never the task.
fn record_in_journal(dir: &Path, launch: &TaskLaunch, event: crate::journal::JournalEvent, log: &mut Log) {
    let Some(journal) = &launch.journal else { return };
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let mut parts = name.splitn(3, '.');
    let (Some(Ok(job)), Some(Ok(incarnation)), Some(task)) =
        (parts.next().map(str::parse), parts.next().map(str::parse), parts.next())
    else {
        log.line(format_args!("task directory {name:?} names no job; not journaled"));
        return;
    };
    let entry = crate::journal::JournalEntry {
        event,
        job,
        incarnation,
        task: task.to_string(),
        gpus: launch.gpus.clone(),
        wall_ms: now_ms(),
        boot_ms: crate::lease::boottime_ms(),
    };
    if let Err(e) = crate::journal::append(Path::new(journal), &entry) {
        log.line(format_args!("cannot append to the node's journal {journal}: {e}"));
    }
}

/// A job's cgroups with their `cgroup.procs` files open for the task to write itself into.
struct Joining {
    cgroup: crate::cgroup::JobCgroup,
    /// Memory and, on cgroup v1, cpuacct: the task must join them.
    required: Vec<File>,
    /// cgroup v1's cpuset, when the job is pinned: not joining it leaves the task unpinned, not failed.
    cpuset: Option<File>,
}

/// The job's cgroups (created with its limit and CPUs if the agent has not made them already: a supervisor also
/// runs without an agent) and their `cgroup.procs` files.
fn join_points(c: &TaskCgroup, log: &mut Log) -> Result<Joining, Failure> {
    let cgroup = crate::cgroup::create_job(&c.root, c.job, c.incarnation, c.limit_mb, &c.cpus).map_err(|e| {
        Failure::setup(format!("cannot set up the job's cgroup under {}: {e}", c.root.path.display()), None)
    })?;
    if let Some(why) = &cgroup.unpinned {
        log.line(format_args!("{why}; the task runs on any CPU"));
    }
    let open = |dir: &Path| {
        let path = crate::cgroup::procs_file(dir);
        OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| Failure::setup(format!("cannot open {}: {e}", path.display()), None))
    };
    let required = cgroup.required().into_iter().map(open).collect::<Result<Vec<File>, Failure>>()?;
    let cpuset = match cgroup.cpuset.as_deref().map(open).transpose() {
        Ok(file) => file,
        Err(failure) => {
            log.line(format_args!("{}; the task runs on any CPU", failure.error));
            None
        }
    };
    Ok(Joining { cgroup, required, cpuset })
}

/// What the task needs that must be opened or checked as its user.
struct Prepared {
    stdin: Option<File>,
    stdout: File,
    stderr: File,
    program: PathBuf,
}

/// Opens the output files, enters the working directory and finds the program, all with the task user's rights (the
/// caller switches), so that a task can only write where its user may: never `--output=/etc/passwd` as root.
/// On failure also returns the stderr file when it is already open, for the error message.
fn prepare(launch: &TaskLaunch) -> Result<Prepared, (Failure, Option<File>)> {
    for dir in &launch.make_dirs {
        fs::create_dir_all(dir).map_err(|e| {
            let message = format!("cannot create directory {dir}: {}", os_message(&e));
            (Failure::setup(message.clone(), Some(message)), None)
        })?;
    }
    let stdout = open_output(&launch.stdout, launch.append).map_err(|e| {
        let message = format!("Could not open stdout file {}: {}", launch.stdout, os_message(&e));
        (Failure::setup(format!("open({}): {}", launch.stdout, os_message(&e)), Some(message)), None)
    })?;
    let stderr = match launch.stderr.as_deref().filter(|path| *path != launch.stdout) {
        Some(path) => open_output(path, launch.append).map_err(|e| {
            let message = format!("Could not open stderr file {path}: {}", os_message(&e));
            // The only file left to tell the user is stdout.
            let report = stdout.try_clone().ok();
            (Failure::setup(format!("open({path}): {}", os_message(&e)), Some(message)), report)
        })?,
        // The same open file, not a second open of the same path, so the two streams share one offset and
        // interleave instead of overwriting each other.
        None => stdout.try_clone().map_err(|e| (Failure::setup(format!("dup(stdout): {e}"), None), None))?,
    };
    let program = if launch.container.is_some() {
        // The working directory and the program are the container's, entered and found after pivot_root.
        PathBuf::from(&launch.argv[0])
    } else {
        if let Err(e) = std::env::set_current_dir(&launch.cwd) {
            let message = format!("couldn't chdir to `{}': {}", launch.cwd, os_message(&e));
            return Err((
                Failure::setup(format!("chdir({}): {}", launch.cwd, os_message(&e)), Some(message)),
                Some(stderr),
            ));
        }
        let Some(program) = resolve_program(&launch.argv[0], &launch.env) else {
            let name = &launch.argv[0];
            let failure = Failure {
                exit_code: libc::ENOENT,
                error: format!("execve({name}): No such file or directory"),
                message: Some(format!("execve(): {name}: No such file or directory")),
            };
            return Err((failure, Some(stderr)));
        };
        program
    };
    // srun's input: a FIFO the agent already holds open for writing, so this open does not wait.
    let stdin = match &launch.stdin {
        Some(path) => Some(open_input(path).map_err(|e| {
            let message = format!("Could not open stdin file {path}: {}", os_message(&e));
            (Failure::setup(format!("open({path}): {}", os_message(&e)), Some(message)), Some(stderr_copy(&stderr)))
        })?),
        None => None,
    };
    Ok(Prepared { stdin, stdout, stderr, program })
}

fn open_output(path: &str, append: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    // Without blocking: the user may have made the file a FIFO that nobody reads, and a blocking open would hang
    // here, before there is a task to signal, so the job could be neither cancelled nor timed out and would hold
    // its GPUs for ever. A FIFO without a reader fails at once (ENXIO); one with a reader opens, and gets back its
    // blocking mode below, as the task expects of its output.
    options.create(true).mode(0o644).custom_flags(libc::O_NONBLOCK);
    if append {
        options.append(true);
    } else {
        options.write(true).truncate(true);
    }
    // Tools create the log directory around the time they submit (some just after `sbatch` returns), and Drover
    // can start a job within milliseconds where Slurm's scheduling pass leaves them a second: a missing directory
    // gets a short grace before the job fails for it.
    let give_up = std::time::Instant::now() + std::time::Duration::from_millis(OUTPUT_DIR_GRACE_MS);
    loop {
        match options.open(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && std::time::Instant::now() < give_up => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            result => return result.and_then(blocking),
        }
    }
}

/// The task's input FIFO, opened for reading without waiting for a writer (the agent holds one), then blocking
/// again as the task expects of its stdin.
fn open_input(path: &str) -> io::Result<File> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !std::os::unix::fs::FileTypeExt::is_fifo(&file.metadata()?.file_type()) {
        return Err(io::Error::other("not the FIFO the agent made"));
    }
    blocking(file)
}

/// A copy of the stderr file for a failure report (`/dev/null` if the descriptor cannot be duplicated).
fn stderr_copy(stderr: &File) -> File {
    stderr.try_clone().unwrap_or_else(|_| File::open("/dev/null").expect("/dev/null opens"))
}

/// `file` with `O_NONBLOCK` cleared.
fn blocking(file: File) -> io::Result<File> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; F_GETFL and F_SETFL touch only its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// How long a task waits for its output file's directory to appear.
pub const OUTPUT_DIR_GRACE_MS: u64 = 5_000;

/// Finds the program like execvp(3) does, but in the task's `PATH`, not the supervisor's.
fn resolve_program(name: &str, env: &[(String, String)]) -> Option<PathBuf> {
    if name.contains('/') {
        // Absolute or relative to the working directory; execve reports anything wrong with it.
        return Some(PathBuf::from(name));
    }
    // The last PATH wins, as it does for Command::envs.
    let search = env.iter().rev().find(|(key, _)| key == "PATH").map_or(DEFAULT_PATH, |(_, value)| value.as_str());
    search
        .split(':')
        .map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(name))
        .find(|candidate| fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Why a task could not be started: the exit code and `error` of its result, and the line for its stderr file.
#[derive(Debug)]
struct Failure {
    exit_code: i32,
    error: String,
    /// Without the `slurmstepd: error: ` prefix, which is added when written.
    message: Option<String>,
}

impl Failure {
    fn setup(error: String, message: Option<String>) -> Failure {
        Failure { exit_code: EXIT_SETUP_FAILED, error, message }
    }

    /// Turns the last stage the child reached before exec into a message; see [`prepare_child`].
    fn from_child_setup(
        stage: Option<u8>,
        launch: &TaskLaunch,
        e: &io::Error,
        container: Option<&[String]>,
    ) -> Failure {
        use crate::container::{
            STAGE_CONTAINER_CWD, STAGE_CONTAINER_HOOKS, STAGE_CONTAINER_NAMESPACE, STAGE_CONTAINER_NO_NEW_PRIVS,
            STAGE_CONTAINER_OPS, STAGE_CONTAINER_PIVOT, STAGE_CONTAINER_USERNS,
        };
        let why = os_message(e);
        let name = &launch.argv[0];
        let in_container = |what: String| {
            let message = format!("container: cannot {what}: {why}");
            Failure::setup(message.clone(), Some(message))
        };
        match stage {
            Some(op) if op >= STAGE_CONTAINER_OPS => {
                let index = usize::from(op - STAGE_CONTAINER_OPS);
                let what = container.and_then(|d| d.get(index)).cloned().unwrap_or_else(|| "set up a mount".into());
                in_container(what)
            }
            Some(hook) if (STAGE_CONTAINER_HOOKS..STAGE_CONTAINER_OPS).contains(&hook) => {
                // Hook descriptions follow the mount ops' (see `container::hooks_for`).
                let index = usize::from(hook - STAGE_CONTAINER_HOOKS);
                let what = container
                    .and_then(|d| d.iter().filter(|d| d.starts_with("run the CDI hook")).nth(index))
                    .cloned()
                    .unwrap_or_else(|| "run a CDI hook".into());
                in_container(what)
            }
            Some(STAGE_CONTAINER_NAMESPACE) => in_container("make a mount namespace".into()),
            Some(STAGE_CONTAINER_PIVOT) => in_container("switch to the container's root".into()),
            Some(STAGE_CONTAINER_USERNS) => in_container("remap the user to root (a user namespace)".into()),
            Some(STAGE_CONTAINER_NO_NEW_PRIVS) => in_container("set no_new_privs".into()),
            Some(STAGE_CONTAINER_CWD) => {
                let dir = launch.container.as_ref().and_then(|c| c.spec.workdir.clone()).unwrap_or_default();
                let message = format!("couldn't chdir to `{dir}' inside the container: {why}");
                Failure::setup(message.clone(), Some(message))
            }
            Some(STAGE_EXEC) if container.is_some() => Failure {
                exit_code: e.raw_os_error().unwrap_or(EXIT_EXEC_FAILED),
                error: format!("execve({name}) in the container: {why}"),
                message: Some(format!("execve(): {name}: {why} (in the container)")),
            },
            Some(STAGE_EXEC) => Failure {
                // As slurmstepd, whose task exits with execve's errno (2 for a missing program).
                exit_code: e.raw_os_error().unwrap_or(EXIT_EXEC_FAILED),
                error: format!("execve({name}): {why}"),
                message: Some(format!("execve(): {name}: {why}")),
            },
            Some(STAGE_PROCESS_GROUP) => Failure::setup(format!("setpgid(): {why}"), None),
            Some(STAGE_CGROUP) => Failure::setup(format!("joining the job's cgroup: {why}"), None),
            Some(STAGE_SETGROUPS) => Failure::setup(format!("setgroups() for user {:?}: {why}", launch.user), None),
            Some(STAGE_SETGID) => Failure::setup(format!("setgid({}): {why}", launch.gid), None),
            Some(STAGE_SETUID) => Failure::setup(format!("setuid({}): {why}", launch.uid), None),
            _ => Failure::setup(format!("cannot start the task: {why}"), None),
        }
    }
}

/// How this supervisor signs its lines in the task's stderr, as slurmstepd does (`slurmstepd-node01`); set once the
/// launch is read (this process supervises one task).
static STEPD_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records a task that never started: the message in its stderr file (when open) and in our log.
fn failed(log: &mut Log, stderr: Option<&File>, failure: Failure) -> TaskResult {
    log.line(format_args!("task not started: {}", failure.error));
    if let (Some(mut file), Some(message)) = (stderr, &failure.message) {
        let name = STEPD_NAME.get().map_or("slurmstepd", String::as_str);
        let _ = writeln!(file, "{name}: error: {message}");
    }
    let now = now_ms();
    TaskResult {
        exit_code: failure.exit_code,
        signal: 0,
        started_ms: now,
        ended_ms: now,
        cpu_ms: 0,
        max_rss_kb: 0,
        error: Some(failure.error),
        fenced: false,
        oom: false,
    }
}

/// The identity a root supervisor gives the task.
#[derive(Clone, Debug)]
struct Credentials {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

/// `None`: run the task with our own identity (it is ours, or root's and we are root).
fn credentials(launch: &TaskLaunch) -> Result<Option<Credentials>, Failure> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        if launch.uid == euid {
            return Ok(None);
        }
        return Err(Failure::setup(
            format!(
                "cannot switch user: the supervisor runs as uid {euid}, not as root, so it cannot start a task as \
                 uid {}; run the agent as root or submit as uid {euid}",
                launch.uid
            ),
            None,
        ));
    }
    if launch.uid == 0 {
        if !launch.allow_root {
            return Err(Failure::setup(
                "jobs may not run as root on this cluster (allow_root_jobs is off)".to_string(),
                None,
            ));
        }
        return Ok(None);
    }
    let groups = if launch.user.is_empty() {
        vec![launch.gid]
    } else {
        let name = CString::new(launch.user.as_str())
            .map_err(|_| Failure::setup(format!("user name {:?} contains a NUL byte", launch.user), None))?;
        match lookup_uid(&name) {
            Ok(Some(uid)) if uid == launch.uid => group_list(&name, launch.gid),
            Ok(Some(uid)) => {
                return Err(Failure::setup(
                    format!(
                        "user {:?} is uid {uid} on this node but the task is for uid {}; fix the node's user database",
                        launch.user, launch.uid
                    ),
                    None,
                ));
            }
            // Unknown here (no shared user database): the task still runs as its uid, with its primary group only.
            Ok(None) => vec![launch.gid],
            Err(e) => return Err(Failure::setup(format!("cannot look up user {:?}: {e}", launch.user), None)),
        }
    };
    Ok(Some(Credentials { uid: launch.uid, gid: launch.gid, groups }))
}

fn lookup_uid(name: &CStr) -> io::Result<Option<libc::uid_t>> {
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: all-zero is a valid passwd (null pointers, zero ids); getpwnam_r fills it.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and buf.len() is its real size.
        let rc = unsafe { libc::getpwnam_r(name.as_ptr(), &mut entry, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
        match rc {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some(entry.pw_uid)),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            libc::ENOENT | libc::ESRCH => return Ok(None),
            rc => return Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

/// The user's groups from the node's group database (primary first), as login would set them.
fn group_list(name: &CStr, gid: libc::gid_t) -> Vec<libc::gid_t> {
    let mut capacity: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; capacity as usize];
        let mut count = capacity;
        // SAFETY: groups has room for `count` entries.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            return groups;
        }
        if capacity >= 65536 {
            return vec![gid];
        }
        capacity = count.max(capacity * 2).min(65536);
    }
}

/// Runs `f` with the task user's effective identity (root regains its own afterwards), so files are opened and the
/// working directory is entered with exactly the user's rights. The supervisor is single-threaded, so the switch
/// affects nothing else. `Err` if the switch (or the switch back) failed.
fn as_user<T>(creds: Option<&Credentials>, f: impl FnOnce() -> T) -> io::Result<T> {
    let Some(creds) = creds else { return Ok(f()) };
    let saved_groups = current_groups()?;
    // SAFETY (all calls below): plain credential syscalls on valid pointers and lengths.
    let saved_egid = unsafe { libc::getegid() };
    let check = |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    let switched = (|| {
        check(unsafe { libc::setgroups(creds.groups.len(), creds.groups.as_ptr()) })?;
        check(unsafe { libc::setegid(creds.gid) })?;
        check(unsafe { libc::seteuid(creds.uid) })
    })();
    let out = switched.map(|()| f());
    // Back to root in the reverse order: only a root euid may change groups.
    check(unsafe { libc::seteuid(0) })?;
    check(unsafe { libc::setegid(saved_egid) })?;
    check(unsafe { libc::setgroups(saved_groups.len(), saved_groups.as_ptr()) })?;
    out
}

fn current_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: a zero size only asks for the count.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if count < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; count as usize];
    // SAFETY: groups has room for `count` entries.
    let count = unsafe { libc::getgroups(count, groups.as_mut_ptr()) };
    if count < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(count as usize);
    Ok(groups)
}

// Stages the child reports, one byte each, before it attempts them: the last byte received tells which step failed,
// since the error std passes back from a failed pre_exec or exec is only an errno.
const STAGE_CGROUP: u8 = 6;
/// Not a failure: the task could not join the job's v1 cpuset and goes on unpinned (read after a good start).
const STAGE_CPUSET_SKIPPED: u8 = 7;
const STAGE_PROCESS_GROUP: u8 = 1;
const STAGE_SETGROUPS: u8 = 2;
const STAGE_SETGID: u8 = 3;
const STAGE_SETUID: u8 = 4;
const STAGE_EXEC: u8 = 5;

/// `SLURM_TASK_PID`, the task's own pid, written by the task's process itself between fork and exec.
const TASK_PID_VAR: &std::ffi::CStr = c"SLURM_TASK_PID";
/// Room for any pid (at most 10 digits), overwritten in place by [`write_task_pid`].
const TASK_PID_PLACEHOLDER: &str = "0000000000";

/// Makes the task's environment this supervisor's own (it is single-threaded, and needs its own no more), with a
/// placeholder for `SLURM_TASK_PID`: std hands a `Command`'s own environment to exec as a copy the child cannot
/// reach, but the process environment it can, so the child writes its pid there without allocating.
fn take_task_environment(env: &[(String, String)]) {
    drop_task_environment();
    // SAFETY (both): as above; names and values were checked by `validate_launch` (no NUL, no '=' in names).
    for (name, value) in env {
        unsafe { std::env::set_var(name, value) };
    }
    unsafe { std::env::set_var(TASK_PID_VAR.to_str().expect("ASCII"), TASK_PID_PLACEHOLDER) };
}

/// Empties this supervisor's environment again once the task is started.
fn drop_task_environment() {
    let names: Vec<std::ffi::OsString> = std::env::vars_os().map(|(name, _)| name).collect();
    for name in names {
        // SAFETY: the supervisor runs no other thread (see `run_supervisor`).
        unsafe { std::env::remove_var(name) };
    }
}

/// Writes this process's pid over the `SLURM_TASK_PID` placeholder: getenv, getpid and stores into memory this
/// process owns, nothing that allocates (it runs between fork and exec).
fn write_task_pid() {
    // SAFETY: getenv returns a pointer into this process's environment, or null.
    let value = unsafe { libc::getenv(TASK_PID_VAR.as_ptr()) };
    if value.is_null() {
        return;
    }
    // SAFETY: getpid cannot fail.
    let mut pid = unsafe { libc::getpid() } as u32;
    let mut digits = [0u8; 10];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (pid % 10) as u8;
        n += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    for (i, digit) in digits[..n].iter().rev().enumerate() {
        // SAFETY: the placeholder's value has TASK_PID_PLACEHOLDER.len() (10) bytes and a NUL after them, and a
        // pid has at most 10 digits; index n is at most 10, the NUL's place.
        unsafe { *value.add(i) = *digit as libc::c_char };
    }
    // SAFETY: as above.
    unsafe { *value.add(n) = 0 };
}

/// Runs in the task's process between fork and exec: async-signal-safe calls only, no allocation. `procs` are the
/// `cgroup.procs` files the task must join (-1: none), `cpuset` the one it may fail to join.
fn prepare_child(
    stage: RawFd,
    procs: [RawFd; 2],
    cpuset: RawFd,
    creds: Option<&Credentials>,
    container: Option<&crate::container::Plan>,
) -> io::Result<()> {
    let mark = |byte: u8| {
        // SAFETY: write(2) of one byte from a live stack value.
        unsafe { libc::write(stage, (&byte as *const u8).cast(), 1) };
    };
    write_task_pid();
    let check = |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    // SAFETY (all calls below): async-signal-safe syscalls on valid arguments.
    unsafe {
        // Ignored signals stay ignored across exec; the task must get the defaults back.
        libc::signal(libc::SIGHUP, libc::SIG_DFL);
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        for fd in procs.into_iter().filter(|&fd| fd >= 0) {
            // "0" is the writing process: the task joins its job's cgroups while still privileged.
            mark(STAGE_CGROUP);
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        if cpuset >= 0 && libc::write(cpuset, b"0".as_ptr().cast(), 1) != 1 {
            mark(STAGE_CPUSET_SKIPPED);
        }
        mark(STAGE_PROCESS_GROUP);
        check(libc::setpgid(0, 0))?;
        if let Some(plan) = container {
            crate::container::enter(plan, &mark)?;
        }
        match (creds, container.and_then(|p| p.remap)) {
            (Some(creds), Some((uid, gid))) => {
                mark(STAGE_SETGROUPS);
                check(libc::setgroups(creds.groups.len(), creds.groups.as_ptr()))?;
                crate::container::remap_root(uid, gid, &mark)?;
            }
            (Some(creds), None) => {
                mark(STAGE_SETGROUPS);
                check(libc::setgroups(creds.groups.len(), creds.groups.as_ptr()))?;
                mark(STAGE_SETGID);
                check(libc::setgid(creds.gid))?;
                mark(STAGE_SETUID);
                check(libc::setuid(creds.uid))?;
            }
            (None, _) => {}
        }
        if let Some(plan) = container {
            // Nothing the image holds (a setuid binary, a file capability) can raise the task's privileges.
            mark(crate::container::STAGE_CONTAINER_NO_NEW_PRIVS);
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            mark(crate::container::STAGE_CONTAINER_CWD);
            check(libc::chdir(plan.cwd.as_ptr()))?;
        }
    }
    mark(STAGE_EXEC);
    Ok(())
}

/// The task's process group while it runs, for the SIGTERM handler: 0 before it started, -1 once it has ended.
static TASK_PGID: AtomicI32 = AtomicI32::new(0);
/// A SIGTERM arrived before the task had started; it is passed on once it has.
static TERM_PENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn pass_signal_to_task(signal: libc::c_int) {
    let pgid = TASK_PGID.load(Ordering::SeqCst);
    if pgid == 0 {
        TERM_PENDING.store(true, Ordering::SeqCst);
    } else if pgid > 0 {
        // SAFETY: kill and errno access are async-signal-safe; errno is restored for the interrupted code.
        unsafe {
            let saved = *libc::__errno_location();
            libc::kill(-pgid, signal);
            *libc::__errno_location() = saved;
        }
    }
}

fn forward_sigterm_to_task() {
    // SAFETY: installs a handler that only does async-signal-safe work.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = pass_signal_to_task as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
    }
}

fn close_inherited_descriptors() {
    // SAFETY: closing descriptors nothing in this fresh process uses yet (std holds none at startup).
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 0) };
    if closed != 0 {
        // Kernels before 5.9 lack close_range: close what /proc lists (collected first, the listing is an fd too).
        let fds: Vec<RawFd> = fs::read_dir("/proc/self/fd")
            .map(|entries| entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        for fd in fds.into_iter().filter(|&fd| fd > 2) {
            // SAFETY: as above; closing an fd that is already gone only returns EBADF.
            unsafe { libc::close(fd) };
        }
    }
}

/// The supervisor has no terminal and its own session; a stray hangup or interrupt must not cost the task its
/// result.
fn ignore_hangup_and_interrupt() {
    // SAFETY: setting a disposition to SIG_IGN is always sound.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
}

/// Blocks until the task's main process has ended, leaving it a zombie so its pid stays reserved.
/// Waits for the task's main process to exit (without reaping it), killing its process group if the node's
/// lease expires first. True if it was fenced that way.
///
/// It sleeps until the task exits or the lease, as last read, runs out (a pidfd wakes it at the exit itself), then
/// reads the lease again: a renewed lease costs one wake-up per lease period, and an exit is noticed at once.
fn wait_within_lease(pid: i32, pgid: i32, lease: &Path, notice: &mut Notice, log: &mut Log) -> bool {
    let pidfd = open_pidfd(pid);
    let mut fenced = false;
    loop {
        notice.deliver(log);
        if exited_without_reaping(pid, log) {
            return fenced;
        }
        let now = crate::lease::boottime_ms();
        match crate::lease::read(lease) {
            Some(expires) if expires > now => {
                let wait_ms = (expires - now).min(crate::lease::MAX_CHECK_INTERVAL_MS);
                wait_for_exit_or_timeout(pidfd.as_ref(), notice.watch.as_ref(), wait_ms);
            }
            _ if !fenced => {
                log.line(format_args!("the node's lease ({}) expired: killing the task (fenced)", lease.display()));
                // SAFETY: pgid is our unreaped child's group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                fenced = true;
            }
            _ => wait_for_exit_or_timeout(pidfd.as_ref(), notice.watch.as_ref(), crate::lease::MAX_CHECK_INTERVAL_MS),
        }
    }
}

/// Whether the task's main process has exited (it stays unreaped: its pid and group stay ours).
fn exited_without_reaping(pid: i32, log: &mut Log) -> bool {
    exited_unreaped(pid).unwrap_or_else(|err| {
        log.line(format_args!("waitid({pid}): {err}"));
        true
    })
}

/// Whether our child `pid` has exited, leaving it unreaped (a zombie until `wait`, so its pid and process group
/// cannot be reused meanwhile). An error means it is not our child any more (reaped elsewhere): nothing is left
/// to wait for, and `wait` reports it.
pub(crate) fn exited_unreaped(pid: i32) -> io::Result<bool> {
    loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out pointer. WNOHANG: returns at once; si_pid stays 0 while the process runs.
        let rc = unsafe {
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT | libc::WNOHANG)
        };
        if rc == 0 {
            // SAFETY: waitid filled `info`.
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// A pidfd for our child, readable once it exits (Linux 5.3+); `None` where the kernel has none (then the wait
/// below is a plain sleep).
fn open_pidfd(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor the kernel just gave us, owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sleeps until the task exits, the notice watch fires, or `timeout_ms` passes.
fn wait_for_exit_or_timeout(pidfd: Option<&OwnedFd>, watch: Option<&OwnedFd>, timeout_ms: u64) {
    let timeout = timeout_ms.min(i32::MAX as u64) as i32;
    match pidfd {
        Some(fd) => {
            let mut fds = [libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }; 2];
            let mut n = 1;
            if let Some(w) = watch {
                fds[1] = libc::pollfd { fd: w.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                n = 2;
            }
            // SAFETY: `n` valid pollfds; EINTR just means "look again", which the caller does.
            unsafe { libc::poll(fds.as_mut_ptr(), n, timeout) };
        }
        None => std::thread::sleep(Duration::from_millis(timeout_ms.min(crate::lease::CHECK_INTERVAL_MS))),
    }
}

fn wait_for_exit_without_reaping(pid: i32, log: &mut Log) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out pointer.
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            return;
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            log.line(format_args!("waitid({pid}): {err}"));
            return;
        }
    }
}

/// Reaps the task's main process; its raw wait status.
fn reap(pid: i32, log: &mut Log) -> libc::c_int {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: a valid status pointer; the rusage pointer may be null (totals come from RUSAGE_CHILDREN).
        let rc = unsafe { libc::wait4(pid, &mut status, 0, std::ptr::null_mut()) };
        if rc == pid {
            return status;
        }
        let err = io::Error::last_os_error();
        if rc < 0 && err.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        log.line(format_args!("wait4({pid}): {err}"));
        return 0;
    }
}

/// Kills and reaps every process still below us (the task's leftovers, including ones that left its process group
/// and orphans re-parented to us), until none is left or the deadline passes.
fn reap_leftovers(log: &mut Log, deadline: Instant) {
    let me = std::process::id();
    loop {
        loop {
            // SAFETY: a null status pointer is allowed.
            let rc = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            if rc > 0 {
                continue;
            }
            if rc == 0 {
                break; // children remain, none has ended yet
            }
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return; // ECHILD: nothing left
        }
        let children = children_of(me);
        if Instant::now() >= deadline {
            log.line(format_args!("giving up on leftover processes that ignore SIGKILL: {children:?}"));
            return;
        }
        for child in children {
            // SAFETY: an unreaped child's pid cannot be reused, and only we reap our children.
            unsafe { libc::kill(child as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Our direct children, from `/proc` (parent pid is field 4 of `/proc/PID/stat`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|stat| stat.ppid == parent))
        .collect()
}

struct Usage {
    cpu_ms: u64,
    max_rss_kb: u64,
}

/// CPU and peak memory of everything we reaped: the task and all its descendants we collected.
fn children_usage() -> Usage {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let ms = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1000 + (t.tv_usec.max(0) as u64) / 1000;
    Usage { cpu_ms: ms(usage.ru_utime) + ms(usage.ru_stime), max_rss_kb: usage.ru_maxrss.max(0) as u64 }
}

fn decode_wait_status(status: libc::c_int) -> (i32, i32) {
    if libc::WIFSIGNALED(status) { (0, libc::WTERMSIG(status)) } else { (libc::WEXITSTATUS(status), 0) }
}

fn validate_launch(launch: &TaskLaunch, path: &Path) -> Result<(), SuperviseError> {
    let invalid = |reason: String| Err(SuperviseError::InvalidLaunch { path: path.to_path_buf(), reason });
    if launch.argv.first().is_none_or(|program| program.is_empty()) {
        return invalid("argv is empty; a task needs at least the program to run".into());
    }
    for (what, value) in [("cwd", &launch.cwd), ("stdout", &launch.stdout)]
        .into_iter()
        .chain(launch.stderr.as_ref().map(|stderr| ("stderr", stderr)))
        .chain(launch.make_dirs.iter().map(|dir| ("make_dirs", dir)))
        .chain(launch.lease_file.as_ref().map(|lease| ("lease_file", lease)))
        .chain(launch.journal.as_ref().map(|journal| ("journal", journal)))
        .chain(launch.stdin.as_ref().map(|stdin| ("stdin", stdin)))
    {
        if !value.starts_with('/') {
            return invalid(format!("{what} {value:?} is not an absolute path"));
        }
    }
    let strings = launch.argv.iter().chain(launch.env.iter().flat_map(|(k, v)| [k, v]));
    let paths = [&launch.cwd, &launch.stdout, &launch.user].into_iter().chain(launch.stderr.as_ref());
    if let Some(bad) = strings.chain(paths).find(|s| s.contains('\0')) {
        return invalid(format!("{bad:?} contains a NUL byte"));
    }
    if let Some((key, _)) = launch.env.iter().find(|(key, _)| key.is_empty() || key.contains('=')) {
        return invalid(format!("environment variable name {key:?} is empty or contains '='"));
    }
    Ok(())
}

fn read_result(dir: &Path) -> Result<Option<TaskResult>, SuperviseError> {
    let path = dir.join(RESULT_FILE);
    match read_limited(&path, MAX_SMALL_FILE_BYTES) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|cause| SuperviseError::Json { path, cause }),
        Err(SuperviseError::Io { cause, .. }) if cause.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn read_supervisor_pid(dir: &Path) -> Result<(u32, u64), SuperviseError> {
    let path = dir.join(SUPERVISOR_PID_FILE);
    let bytes = read_limited(&path, MAX_SMALL_FILE_BYTES)?;
    match parse_numbers(&bytes).as_deref() {
        Some(&[pid, start]) if pid > 0 && pid <= i32::MAX as u64 => Ok((pid as u32, start)),
        _ => Err(SuperviseError::BadPidFile { path, reason: "expected \"PID START_TICKS\"".into() }),
    }
}

fn parse_task_pid(path: &Path, bytes: &[u8]) -> Result<(u32, i32, u64), SuperviseError> {
    match parse_numbers(bytes).as_deref() {
        // pid and pgid > 1: kill(-1) would signal every process we may signal, kill(0) our own group.
        Some(&[pid, pgid, start]) if (2..=i32::MAX as u64).contains(&pid) && (2..=i32::MAX as u64).contains(&pgid) => {
            Ok((pid as u32, pgid as i32, start))
        }
        _ => Err(SuperviseError::BadPidFile {
            path: path.to_path_buf(),
            reason: "expected \"PID PGID START_TICKS\"".into(),
        }),
    }
}

fn parse_numbers(bytes: &[u8]) -> Option<Vec<u64>> {
    std::str::from_utf8(bytes).ok()?.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// The fields of `/proc/PID/stat` we use.
struct ProcStat {
    state: char,
    ppid: u32,
    start_ticks: u64,
}

impl ProcStat {
    fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may itself hold spaces and parentheses: split after the last.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

/// Alive means: a process holds `pid`, it is the one that started at `start_ticks`, and it is not a zombie (our
/// supervisors' parent may be an init that does not reap).
fn process_alive(pid: u32, start_ticks: u64) -> bool {
    proc_stat(pid).is_some_and(|stat| stat.start_ticks == start_ticks && !stat.is_dead())
}

fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, SuperviseError> {
    let file = File::open(path).map_err(io_error("open", path))?;
    let size = file.metadata().map_err(io_error("stat", path))?.len();
    if size > limit {
        return Err(SuperviseError::TooLarge { path: path.to_path_buf(), size, limit });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // Reads one byte past the limit, so a file that grew after the stat is caught too.
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io_error("read", path))?;
    if bytes.len() as u64 > limit {
        return Err(SuperviseError::TooLarge { path: path.to_path_buf(), size: bytes.len() as u64, limit });
    }
    Ok(bytes)
}

/// Writes a file so that readers see either nothing or all of it (a temporary file, then rename). `durable` adds the
/// fsyncs that make it survive a power loss: needed for the launch and the result, not for pid files, which name
/// processes that a crash of the node ends anyway, and which must appear as fast as possible.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("no parent directory"))?;
    let name = path.file_name().ok_or_else(|| io::Error::other("no file name"))?;
    let tmp = dir.join(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        // A fresh file, never one found there (a link would redirect the write).
        let _ = fs::remove_file(&tmp);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these descriptors and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// An error's text without std's " (os error N)" suffix, as Slurm (strerror) prints it.
fn os_message(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if e.raw_os_error().is_some() => text[..at].to_string(),
        _ => text,
    }
}

use drover_common::wall::now_ms;

/// `text` with its control characters escaped (`\n`, `\u{1b}`).
fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `DIR/supervisor.log`, appended; a supervisor that cannot open it still does its job, silently.
struct Log(Option<File>);

impl Log {
    fn open(dir: &Path) -> Log {
        let opened = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join(SUPERVISOR_LOG));
        Log(opened.ok())
    }

    /// One line, whatever the message holds: control characters (a newline in a job's argument, an escape
    /// sequence) are written escaped, so a job can neither forge lines nor garble a terminal.
    fn line(&mut self, message: impl Display) {
        if let Some(file) = &mut self.0 {
            let now = now_ms();
            let text = escape_controls(&message.to_string());
            let _ = writeln!(file, "{}.{:03} supervisor[{}]: {text}", now / 1000, now % 1000, std::process::id());
        }
    }
}
