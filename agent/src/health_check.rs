//! Slurm's `HealthCheckProgram` for the node agent, with Slurm's contract so that LBNL NHC (`/usr/sbin/nhc`)
//! works unchanged.
//!
//! The program runs as the agent's user (root) with no arguments, stdin from `/dev/null`, `/` as its working
//! directory and a minimal environment: `PATH=/usr/sbin:/usr/bin:/sbin:/bin`, `SLURMD_NODENAME=<node>` (what
//! slurmd sets, and what NHC reads) and `DROVER_NODE=<node>`. It gets its own process group, so that at the
//! timeout the whole group (the program and whatever it started) is killed with SIGKILL. Its stdout and stderr
//! share one pipe, read as it runs so a chatty program never blocks on a full pipe; only the last
//! [`MAX_OUTPUT_BYTES`] are kept, as the reason is the last line.
//!
//! Exit status 0 is healthy. Anything else is unhealthy, with a reason an operator reads in `sinfo -R`:
//! `health check: ` and the last non-empty line of output (NHC's `ERROR:  nhc:  Health check failed:  ` noise
//! stripped), at most [`MAX_REASON_CHARS`] characters; without output, or on a timeout, a sentence saying what
//! happened. NHC also drains the node itself through `scontrol update nodename=... state=drain reason=...`,
//! which needs nothing from here.
//!
//! Use: [`HealthCheck::from_config`]; [`HealthCheck::run_at_start`] before registering (when
//! `health_check_on_start`), then spawn [`HealthCheck::run_forever`] with the same `latest`, which holds the
//! latest failure reason (`None` while healthy) for each heartbeat's problems. Dropping a run (a cancelled task,
//! the runtime shutting down) kills the program's process group, so no shutdown signal is needed.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind};
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::AgentConfig;

/// The program's environment `PATH` (slurmd's programs get no more than this).
pub const HEALTH_CHECK_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// Output kept per run: the last this many bytes (the reason is the last line; the rest is read and dropped).
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// The reason taken from the program's output is cut to this many characters (`sinfo -R` is one line).
pub const MAX_REASON_CHARS: usize = 200;
/// After the group is killed (at the timeout, or to remove what a finished program left behind): how long to
/// wait for it to die and for the output pipe to close. Bounded because a process stuck in the kernel (a hung
/// NFS mount, the very thing NHC looks for) ignores SIGKILL until its I/O ends, and a process that left the
/// group (`setsid`) may hold the pipe open.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// SIGCHLD wakes the exit watch; this poll is the fallback should the signal handler be unavailable.
const EXIT_POLL: Duration = Duration::from_millis(100);
const READ_CHUNK: usize = 8 * 1024;

/// What a run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthResult {
    Healthy,
    /// `reason` starts with `health check: ` and fits on one line.
    Unhealthy {
        reason: String,
    },
}

impl HealthResult {
    /// The failure reason; `None` when healthy.
    pub fn reason(&self) -> Option<&str> {
        match self {
            HealthResult::Healthy => None,
            HealthResult::Unhealthy { reason } => Some(reason),
        }
    }

    pub fn is_healthy(&self) -> bool {
        matches!(self, HealthResult::Healthy)
    }
}

/// Why a run ended without an exit status of the program's own.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("could not start {program}: {source}")]
    Start { program: String, source: io::Error },
    #[error("lost track of {program}: {source}")]
    Wait { program: String, source: io::Error },
}

/// How the program's run ended, before it is judged.
#[derive(Debug)]
enum Ended {
    Exited(ExitStatus),
    TimedOut,
    Failed(RunError),
}

/// The configured health check of one node.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    program: PathBuf,
    node_name: String,
    /// Zero: no periodic runs.
    interval: Duration,
    timeout: Duration,
    on_start: bool,
    /// Set while a run's program (or what is left of a killed one) has not been reaped. Shared by clones, so no
    /// two instances ever run at once.
    busy: Arc<AtomicBool>,
}

impl HealthCheck {
    /// The node's health check; `None` when no `health_check_program` is set. Expects a config that
    /// [`AgentConfig::finish`] accepted (an absolute path, a timeout of at least 1 s).
    pub fn from_config(config: &AgentConfig, node_name: &str) -> Option<HealthCheck> {
        let program = config.health_check_program.clone()?;
        Some(HealthCheck {
            program,
            node_name: node_name.to_string(),
            interval: Duration::from_secs(config.health_check_interval_s),
            timeout: Duration::from_secs(config.health_check_timeout_s.max(1)),
            on_start: config.health_check_on_start,
            busy: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Between periodic runs; zero when there are none.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the program runs at agent start (`health_check_on_start`).
    pub fn runs_on_start(&self) -> bool {
        self.on_start
    }

    /// Whether a run's program has not been reaped yet (it runs, or it was killed and has not died).
    pub fn is_running(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Runs the program once and judges it, within the timeout plus [`KILL_GRACE`]. Never starts a second
    /// instance: while an earlier run's program has not exited, this reports that instead of running.
    pub async fn run_once(&self) -> HealthResult {
        match self.try_run().await {
            Some(result) => result,
            None => HealthResult::Unhealthy {
                reason: bounded_reason(&format!("an earlier run of {} has not exited yet", self.program.display())),
            },
        }
    }

    /// The run at agent start, when `health_check_on_start` (else nothing runs and `None` is returned): stores
    /// the result in `latest` and returns the failure reason, for the node to register with.
    pub async fn run_at_start(&self, latest: &Mutex<Option<String>>) -> Option<String> {
        if !self.on_start {
            return None;
        }
        let result = self.run_once().await;
        record(latest, &self.node_name, &result);
        result.reason().map(str::to_string)
    }

    /// Runs the program every interval (the first one interval from now: the start run is
    /// [`run_at_start`](Self::run_at_start)'s) and keeps `latest` at the latest failure reason, `None` while
    /// healthy. Returns at once when the interval is zero (Slurm's `HealthCheckInterval=0`). A tick that finds
    /// the earlier run's program still alive (killed but stuck in the kernel) is skipped, keeping its timeout as
    /// the reason; ticks missed while a run lasts are skipped too, not made up.
    pub async fn run_forever(self, latest: Arc<Mutex<Option<String>>>) {
        if self.interval.is_zero() {
            return;
        }
        let mut ticks = tokio::time::interval_at(Instant::now() + self.interval, self.interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            ticks.tick().await;
            match self.try_run().await {
                Some(result) => record(&latest, &self.node_name, &result),
                None => tracing::warn!(
                    program = %self.program.display(),
                    "health check skipped: the previous run's program has not exited"
                ),
            }
        }
    }

    /// One run, or `None` when an earlier run's program is still alive.
    async fn try_run(&self) -> Option<HealthResult> {
        let busy = BusyGuard::take(&self.busy)?;
        let started = std::time::Instant::now();
        let (ended, output) = self.execute(busy).await;
        let result = judge(&self.program, self.timeout, &ended, &output);
        tracing::debug!(
            program = %self.program.display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            output_bytes = output.len(),
            ?result,
            "health check ran"
        );
        Some(result)
    }

    /// Starts the program and collects its output until it exits or the timeout passes; then kills its group.
    /// `busy` is released once the program is reaped (by a task of its own if it outlives [`KILL_GRACE`]).
    async fn execute(&self, busy: BusyGuard) -> (Ended, Vec<u8>) {
        let program = self.program.display().to_string();
        let start_error = |source| (Ended::Failed(RunError::Start { program: program.clone(), source }), Vec::new());
        // Registered before the program starts, so its exit cannot slip between a check and the wait.
        let mut sigchld = tokio::signal::unix::signal(SignalKind::child()).ok();
        let (read_end, write_end) = match pipe() {
            Ok(ends) => ends,
            Err(e) => return start_error(e),
        };
        let write_err = match write_end.try_clone() {
            Ok(fd) => fd,
            Err(e) => return start_error(e),
        };
        let mut command = tokio::process::Command::new(&self.program);
        command
            .env_clear()
            .env("PATH", HEALTH_CHECK_PATH)
            .env("SLURMD_NODENAME", &self.node_name)
            .env("DROVER_NODE", &self.node_name)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::from(write_err))
            .process_group(0)
            .kill_on_drop(true);
        let spawned = command.spawn();
        // The command holds our copies of the pipe's write end: the reader sees EOF only once they are closed.
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return start_error(e),
        };
        let Some(pid) = child.id().map(|p| p as i32) else {
            return start_error(io::Error::other("the program exited before its pid was known"));
        };
        // Declared after `child`, so dropped before it: the group is killed while the leader is unreaped and
        // the group id cannot yet be reused.
        let mut group = GroupKiller { pgid: pid, armed: true };
        let mut output = OutputTail::new(MAX_OUTPUT_BYTES);
        let mut reader = match tokio::net::unix::pipe::Receiver::from_owned_fd(read_end) {
            Ok(reader) => Some(reader),
            Err(e) => {
                tracing::warn!("health check: cannot read the program's output: {e}");
                None
            }
        };
        let mut buf = vec![0u8; READ_CHUNK];
        let exit = exited_unreaped(pid, sigchld.as_mut());
        tokio::pin!(exit);

        let deadline = Instant::now() + self.timeout;
        let exited_in_time = loop {
            tokio::select! {
                read = read_some(&mut reader, &mut buf) => absorb(read, &mut reader, &buf, &mut output),
                () = &mut exit => break true,
                () = tokio::time::sleep_until(deadline) => break false,
            }
        };
        // Killed whether or not it finished: at the timeout to stop it, after an exit to remove what it left
        // running (which would also hold the output pipe open). The leader is unreaped, so `pid` is still ours.
        group.kill();
        let grace = Instant::now() + KILL_GRACE;
        let mut exited = exited_in_time;
        while !exited || reader.is_some() {
            tokio::select! {
                read = read_some(&mut reader, &mut buf) => absorb(read, &mut reader, &buf, &mut output),
                () = &mut exit, if !exited => exited = true,
                () = tokio::time::sleep_until(grace) => break,
            }
        }
        // From here on the leader may be reaped, after which its pid (the group id) may be reused.
        group.armed = false;
        let output = output.into_bytes();
        if !exited {
            tracing::error!(
                program = %program,
                pid,
                "health check program did not die within {} s of SIGKILL (stuck in the kernel?); no new run \
                 starts until it does",
                KILL_GRACE.as_secs()
            );
            tokio::spawn(async move {
                let _ = child.wait().await;
                drop(busy);
            });
            return (Ended::TimedOut, output);
        }
        let status = child.wait().await;
        drop(busy);
        match status {
            Ok(_) if !exited_in_time => (Ended::TimedOut, output),
            Ok(status) => (Ended::Exited(status), output),
            Err(source) => (Ended::Failed(RunError::Wait { program, source }), output),
        }
    }
}

/// Stores a result in `latest`, logging changes (not every run: a node can fail the same way for days).
fn record(latest: &Mutex<Option<String>>, node: &str, result: &HealthResult) {
    let mut latest = latest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let reason = result.reason().map(str::to_string);
    if *latest == reason {
        return;
    }
    match (&*latest, &reason) {
        (_, Some(reason)) => tracing::warn!(%node, "node unhealthy: {reason}"),
        (Some(_), None) => tracing::info!(%node, "health check passes again"),
        (None, None) => {}
    }
    *latest = reason;
}

/// Judges a run: its end and the last [`MAX_OUTPUT_BYTES`] of its output.
fn judge(program: &Path, timeout: Duration, ended: &Ended, output: &[u8]) -> HealthResult {
    let program = program.display();
    let reason = match ended {
        Ended::Exited(status) if status.success() => return HealthResult::Healthy,
        // What the program last printed is no reason here: it was cut off mid-check.
        Ended::TimedOut => format!("{program} timed out after {} s", timeout.as_secs()),
        Ended::Failed(error) => error.to_string(),
        Ended::Exited(status) => match reason_from_output(output) {
            Some(line) => line,
            None => match (status.code(), status.signal()) {
                (Some(code), _) => format!("{program} exited with status {code}"),
                (None, Some(signal)) => format!("{program} killed by signal {signal}"),
                (None, None) => format!("{program} failed ({status})"),
            },
        },
    };
    HealthResult::Unhealthy { reason: bounded_reason(&reason) }
}

/// `health check: ` and `text`, cut to [`MAX_REASON_CHARS`] characters (not counting the prefix).
fn bounded_reason(text: &str) -> String {
    let cut: String = text.chars().take(MAX_REASON_CHARS).collect();
    format!("health check: {}", cut.trim_end())
}

/// The last non-empty line of `output`, made readable for one line of `sinfo -R`: terminal escapes and control
/// characters removed, runs of blanks made one, NHC's `ERROR:  nhc:  Health check failed:  ` prefix dropped.
fn reason_from_output(output: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(output);
    text.lines()
        .rev()
        // A progress line rewritten with `\r` shows its last version on a terminal: take that one.
        .filter_map(|line| line.split('\r').rev().map(clean_line).find(|part| !part.is_empty()))
        .next()
        .map(|line| {
            let stripped = strip_nhc_prefix(&line);
            if stripped.is_empty() { line } else { stripped.to_string() }
        })
}

/// Removes ANSI escape sequences and control characters and collapses blanks.
fn clean_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI (`ESC [ ... final`), the colour codes some checks print; other escapes lose just the ESC.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Drops NHC's prefixes (`ERROR:`, `nhc:`, `Health check failed:`), in any order and case.
fn strip_nhc_prefix(line: &str) -> &str {
    const NOISE: [&str; 3] = ["error:", "nhc:", "health check failed:"];
    let mut rest = line.trim_start();
    'strip: loop {
        for noise in NOISE {
            if rest.len() >= noise.len()
                && rest.is_char_boundary(noise.len())
                && rest[..noise.len()].eq_ignore_ascii_case(noise)
            {
                rest = rest[noise.len()..].trim_start();
                continue 'strip;
            }
        }
        return rest;
    }
}

/// The last `limit` bytes written to it, in at most twice that memory.
#[derive(Debug)]
pub struct OutputTail {
    buf: Vec<u8>,
    limit: usize,
}

impl OutputTail {
    pub fn new(limit: usize) -> OutputTail {
        OutputTail { buf: Vec::new(), limit }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        // A chunk longer than the limit contributes only its tail.
        let bytes = &bytes[bytes.len().saturating_sub(self.limit)..];
        self.buf.extend_from_slice(bytes);
        // Trimmed only once twice the limit, so each byte is moved at most once on average.
        if self.buf.len() > 2 * self.limit {
            let excess = self.buf.len() - self.limit;
            self.buf.drain(..excess);
        }
    }

    /// The bytes kept so far (at most twice the limit).
    pub fn retained(&self) -> usize {
        self.buf.len()
    }

    /// The last `limit` bytes.
    pub fn into_bytes(mut self) -> Vec<u8> {
        let excess = self.buf.len().saturating_sub(self.limit);
        self.buf.drain(..excess);
        self.buf
    }
}

/// Reads from the pipe, or waits forever once it is closed (so `select!` can keep polling it).
async fn read_some(reader: &mut Option<tokio::net::unix::pipe::Receiver>, buf: &mut [u8]) -> io::Result<usize> {
    match reader {
        Some(reader) => reader.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Keeps what was read; closes the pipe at EOF or on an error.
fn absorb(
    read: io::Result<usize>,
    reader: &mut Option<tokio::net::unix::pipe::Receiver>,
    buf: &[u8],
    output: &mut OutputTail,
) {
    match read {
        Ok(0) | Err(_) => *reader = None,
        Ok(n) => output.push(&buf[..n]),
    }
}

/// Resolves once `pid` (our child) has exited, leaving it unreaped so that its pid, and so its process group's
/// id, stays ours. Woken by SIGCHLD, with a poll in case the signal is missed or unavailable.
async fn exited_unreaped(pid: i32, mut sigchld: Option<&mut Signal>) {
    loop {
        // Not our child any more (reaped elsewhere) counts as gone: nothing is left to wait for.
        if crate::supervise::exited_unreaped(pid).unwrap_or(true) {
            return;
        }
        match sigchld.as_deref_mut() {
            Some(signal) => {
                tokio::select! {
                    _ = signal.recv() => {}
                    () = tokio::time::sleep(EXIT_POLL) => {}
                }
            }
            None => tokio::time::sleep(EXIT_POLL).await,
        }
    }
}

/// A pipe whose ends are closed on exec (the program gets its write end as stdout and stderr only).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Kills the program's process group when dropped armed (a cancelled run), or on `kill`.
struct GroupKiller {
    pgid: i32,
    armed: bool,
}

impl GroupKiller {
    fn kill(&self) {
        // SAFETY: plain syscall. The group leader is our unreaped child, so the id names its group only.
        unsafe { libc::killpg(self.pgid, libc::SIGKILL) };
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}

/// Holds the "a run is in progress" flag; released on drop.
struct BusyGuard(Arc<AtomicBool>);

impl BusyGuard {
    fn take(flag: &Arc<AtomicBool>) -> Option<BusyGuard> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok()?;
        Some(BusyGuard(flag.clone()))
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Instant as StdInstant;

    use super::*;

    fn config(program: &Path, timeout_s: u64) -> AgentConfig {
        let text = format!(
            "controllers = [\"127.0.0.1:6817\"]\nstate_dir = \"/tmp/unused\"\nhealth_check_program = {:?}\n\
             health_check_timeout_s = {timeout_s}\n",
            program.display().to_string()
        );
        toml::from_str(&text).expect("test config parses")
    }

    /// Writes an executable script. Written by a shell of its own, not this process: a descriptor open for
    /// writing here could be inherited by a process another test forks at that moment, and exec'ing the script
    /// would then fail with ETXTBSY.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        let mut writer = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg("cat > \"$1\" && chmod 755 \"$1\"")
            .arg("sh")
            .arg(&path)
            .stdin(Stdio::piped())
            .spawn()
            .expect("sh starts");
        writer.stdin.take().unwrap().write_all(format!("#!/bin/sh\n{body}").as_bytes()).unwrap();
        assert!(writer.wait().unwrap().success());
        path
    }

    fn check(program: &Path, timeout_s: u64) -> HealthCheck {
        HealthCheck::from_config(&config(program, timeout_s), "node7").expect("a program is configured")
    }

    /// Gone, or a zombie waiting for a parent that does not reap (a container's pid 1 may not).
    fn process_gone(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        }
    }

    fn wait_gone(pid: i32) -> bool {
        let until = StdInstant::now() + Duration::from_secs(5);
        while StdInstant::now() < until {
            if process_gone(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn read_pid(path: &Path) -> i32 {
        std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
    }

    #[tokio::test]
    async fn a_passing_program_sees_slurms_environment_and_the_node_is_healthy() {
        let dir = tempfile::tempdir().unwrap();
        // NHC finds its node by SLURMD_NODENAME; nothing of the agent's environment leaks in.
        let program = script(
            dir.path(),
            "ok",
            "[ \"$SLURMD_NODENAME\" = node7 ] || { echo \"no SLURMD_NODENAME\"; exit 1; }\n\
             [ \"$DROVER_NODE\" = node7 ] || { echo \"no DROVER_NODE\"; exit 1; }\n\
             [ \"$PATH\" = /usr/sbin:/usr/bin:/sbin:/bin ] || { echo \"PATH is $PATH\"; exit 1; }\n\
             [ -z \"$HOME\" ] || { echo \"HOME leaked\"; exit 1; }\n\
             [ $# -eq 0 ] || { echo \"arguments: $*\"; exit 1; }\n\
             [ \"$(pwd)\" = / ] || { echo \"cwd is $(pwd)\"; exit 1; }\n\
             read line && { echo \"stdin is not empty\"; exit 1; }\n\
             echo all checks passed\n",
        );
        let health = check(&program, 10);
        assert_eq!(health.run_once().await, HealthResult::Healthy);
        assert!(!health.is_running());
    }

    #[tokio::test]
    async fn a_failing_nhc_reports_its_reason_without_the_noise() {
        let dir = tempfile::tempdir().unwrap();
        let program = script(
            dir.path(),
            "nhc",
            "echo 'Running check: check_fs_mount_rw'\n\
             echo 'ERROR:  nhc:  Health check failed:  check_fs_mount_rw:  /scratch not mounted' >&2\n\
             echo\n\
             exit 1\n",
        );
        let result = check(&program, 10).run_once().await;
        assert_eq!(result.reason(), Some("health check: check_fs_mount_rw: /scratch not mounted"));
    }

    #[tokio::test]
    async fn failures_without_output_say_how_the_program_ended() {
        let dir = tempfile::tempdir().unwrap();
        let quiet = script(dir.path(), "quiet", "exit 3\n");
        let result = check(&quiet, 10).run_once().await;
        assert_eq!(result.reason(), Some(format!("health check: {} exited with status 3", quiet.display()).as_str()));

        let killed = script(dir.path(), "killed", "kill -9 $$\n");
        let result = check(&killed, 10).run_once().await;
        assert_eq!(result.reason(), Some(format!("health check: {} killed by signal 9", killed.display()).as_str()));
    }

    #[tokio::test]
    async fn a_hung_program_and_its_children_are_killed_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let program = script(
            dir.path(),
            "hang",
            &format!("sleep 1000 &\necho $! > {}\necho 'checking /nfs'\nsleep 1000\n", pid_file.display()),
        );
        let health = check(&program, 1);
        let started = StdInstant::now();
        let result = health.run_once().await;
        let elapsed = started.elapsed();
        assert_eq!(result.reason(), Some(format!("health check: {} timed out after 1 s", program.display()).as_str()));
        assert!(elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(4), "took {elapsed:?}");
        let child = read_pid(&pid_file);
        assert!(wait_gone(child), "the program's background child {child} outlived the timeout");
        assert!(!health.is_running());
    }

    #[tokio::test]
    async fn a_passing_program_that_leaves_a_child_behind_neither_hangs_nor_leaks_it() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        // The child keeps the output pipe open: waiting for EOF alone would wait for it.
        let program = script(dir.path(), "leaky", &format!("sleep 1000 &\necho $! > {}\nexit 0\n", pid_file.display()));
        let started = StdInstant::now();
        assert_eq!(check(&program, 30).run_once().await, HealthResult::Healthy);
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        let child = read_pid(&pid_file);
        assert!(wait_gone(child), "the program's background child {child} was left running");
    }

    #[tokio::test]
    async fn a_missing_program_cannot_start_and_the_node_is_unhealthy() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-nhc");
        let result = check(&missing, 10).run_once().await;
        let reason = result.reason().expect("unhealthy");
        assert!(
            reason.starts_with(&format!("health check: could not start {}: ", missing.display())),
            "reason: {reason}"
        );
        assert!(reason.contains("No such file"), "reason: {reason}");
    }

    #[tokio::test]
    async fn huge_output_is_read_to_the_end_but_only_its_tail_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        // 8 MiB of output (the program would block on a full pipe if it were not read), one 100 KiB line, then
        // the reason.
        let program = script(
            dir.path(),
            "chatty",
            "head -c 8388608 /dev/zero | tr '\\0' 'x'\necho\n\
             head -c 102400 /dev/zero | tr '\\0' 'y'\necho\n\
             echo 'ERROR:  nhc:  Health check failed:  check_hw_ib:  Device mlx5_0 port 1 is Down'\nexit 1\n",
        );
        let result = check(&program, 30).run_once().await;
        assert_eq!(result.reason(), Some("health check: check_hw_ib: Device mlx5_0 port 1 is Down"));

        // A last line too long for `sinfo -R` is cut.
        let long = script(dir.path(), "long", "head -c 100000 /dev/zero | tr '\\0' 'z'\necho\nexit 2\n");
        let reason = check(&long, 30).run_once().await.reason().unwrap().to_string();
        assert_eq!(reason, format!("health check: {}", "z".repeat(MAX_REASON_CHARS)));

        let mut tail = OutputTail::new(MAX_OUTPUT_BYTES);
        for i in 0..10_000u32 {
            tail.push(format!("line {i}\n").as_bytes());
            assert!(tail.retained() <= 2 * MAX_OUTPUT_BYTES);
        }
        tail.push(&vec![b'q'; 3 * MAX_OUTPUT_BYTES]);
        tail.push(b"\nlast\n");
        let kept = tail.into_bytes();
        assert_eq!(kept.len(), MAX_OUTPUT_BYTES);
        assert!(kept.ends_with(b"q\nlast\n"));
    }

    #[tokio::test]
    async fn two_runs_never_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        let program = script(dir.path(), "slow", &format!("echo run >> {}\nsleep 1\n", log.display()));
        let health = check(&program, 10);
        // A clone shares the guard, as the start run and the periodic loop would.
        let other = health.clone();
        let (a, b) = tokio::join!(health.run_once(), other.run_once());
        let mut results = [a, b];
        results.sort_by_key(|r| !r.is_healthy());
        assert_eq!(results[0], HealthResult::Healthy);
        assert!(results[1].reason().unwrap().contains("has not exited yet"), "{:?}", results[1]);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "run\n", "the program ran more than once at a time");
        // Once the first is done, the next runs.
        assert_eq!(health.run_once().await, HealthResult::Healthy);
    }

    #[tokio::test]
    async fn the_periodic_loop_keeps_the_latest_reason_and_clears_it_when_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("broken");
        std::fs::write(&flag, "").unwrap();
        let program = script(
            dir.path(),
            "flaky",
            &format!(
                "if [ -e {} ]; then echo 'ERROR:  nhc:  Health check failed:  GPU 3 lost'; exit 1; fi\n",
                flag.display()
            ),
        );
        let mut config = config(&program, 5);
        config.health_check_interval_s = 1;
        let health = HealthCheck::from_config(&config, "node7").unwrap();
        let latest = Arc::new(Mutex::new(None));
        // The start run fails: the node registers with the reason.
        assert_eq!(health.run_at_start(&latest).await.as_deref(), Some("health check: GPU 3 lost"));
        let task = tokio::spawn(health.run_forever(latest.clone()));
        std::fs::remove_file(&flag).unwrap();
        let until = StdInstant::now() + Duration::from_secs(10);
        while latest.lock().unwrap().is_some() {
            assert!(StdInstant::now() < until, "the reason was never cleared");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
    }

    #[test]
    fn reasons_from_output_are_one_readable_line() {
        assert_eq!(reason_from_output(b"a\nlast one\n\n  \n").as_deref(), Some("last one"));
        assert_eq!(reason_from_output(b"\x1b[31mERROR:\x1b[0m disk\tfull\r\n").as_deref(), Some("disk full"));
        assert_eq!(reason_from_output(b"10%\r50%\rfan 2 failed\r").as_deref(), Some("fan 2 failed"));
        // Only the noise: the line stays as it was rather than becoming empty.
        assert_eq!(reason_from_output(b"ERROR:  nhc:\n").as_deref(), Some("ERROR: nhc:"));
        assert_eq!(reason_from_output(b"\n \n"), None);
        assert_eq!(reason_from_output(&[0xff, b'o', b'k']).as_deref(), Some("\u{fffd}ok"));
    }

    #[test]
    fn a_relative_program_path_is_refused_when_the_config_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "controllers = [\"127.0.0.1:6817\"]\nstate_dir = \"/tmp/unused\"\nhealth_check_program = \"nhc\"\n\
             [security]\nkey_file = \"/k\"\nca = \"/ca\"\ncert = \"/c\"\nkey = \"/key\"\n",
        )
        .unwrap();
        let error = AgentConfig::load(&file).unwrap().finish().unwrap_err().to_string();
        assert!(error.contains("health_check_program") && error.contains("absolute"), "{error}");

        // Existing configs, without any health check setting, still load with the defaults.
        let config = config(Path::new("/usr/sbin/nhc"), 60);
        config.check_health_check().unwrap();
        let plain: AgentConfig = toml::from_str("controllers = [\"a:1\"]\nstate_dir = \"/s\"\n").unwrap();
        assert_eq!(plain.health_check_program, None);
        assert_eq!(plain.health_check_interval_s, 300);
        assert_eq!(plain.health_check_timeout_s, 60);
        assert!(plain.health_check_on_start);
        assert!(HealthCheck::from_config(&plain, "node7").is_none());

        let zero: AgentConfig = toml::from_str(
            "controllers = [\"a:1\"]\nstate_dir = \"/s\"\nhealth_check_program = \"/x\"\nhealth_check_timeout_s = 0\n",
        )
        .unwrap();
        assert!(zero.check_health_check().is_err());
    }
}
