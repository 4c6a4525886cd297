//! `salloc [options] [command [args...]]`: obtains an allocation (an interactive job, the kind `srun` outside a
//! job creates), runs the command here (by default the user's login shell) with the job's `SLURM_*` variables,
//! so that `srun` inside runs its steps in the allocation, and relinquishes the allocation when the command
//! exits, exiting with its status. It speaks on stderr as Slurm 22.05's salloc does (`salloc: Granted job
//! allocation 12`, `salloc: Relinquishing job allocation 12`), since wrappers wait for those lines.
//!
//! Signals: before the grant, SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 withdraw the request. Afterwards they
//! release the allocation at once and are passed on to the command's process group; a command still running
//! after [`KILL_WAIT_S`] is killed, so salloc never returns with the user's processes outliving the allocation.
//! When the allocation is revoked (scancel, time limit), the command gets `--kill-command`'s signal (SIGHUP for
//! a terminal session, SIGTERM otherwise, as Slurm built with `SALLOC_KILL_CMD` sends).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use drover_client::Client;
use drover_state::hostlist::compress_hostlist;
use drover_state::job::MemRequest;
use drover_state::{Job, JobState};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::sbatch_args::{SbatchOption, build_spec, parse_command_line};

/// How long salloc waits for an allocation before giving up (Slurm waits forever unless `--immediate`).
const ALLOCATION_WAIT_S: u64 = 24 * 3600;
/// A grant within this long counts as immediate: no "Pending job allocation" lines (the scheduler runs on a short
/// tick, where Slurm's controller answers a request it can satisfy at once in its reply).
const GRACE_MS: u64 = 1_000;
/// Polling the job while waiting: from the first value, doubling up to the second.
const POLL_MS: (u64, u64) = (50, 1_000);
/// How often the running allocation is checked for revocation.
const REVOKE_POLL_MS: u64 = 2_000;
/// How long the command has to exit after being signalled before it is killed.
const KILL_WAIT_S: u64 = 10;
/// Slurm rings the terminal bell when an allocation took longer than this (`--bell` default).
const BELL_AFTER_S: u64 = 10;

pub fn run(args: &[String]) -> i32 {
    match crate::connect::runtime().block_on(salloc(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("salloc: error: {e:#}");
            error_exit()
        }
    }
}

/// Slurm's exit status for salloc's own failures: `SLURM_EXIT_ERROR`, else 1.
fn error_exit() -> i32 {
    exit_from_env("SLURM_EXIT_ERROR")
}

fn exit_from_env(var: &str) -> i32 {
    std::env::var(var).ok().and_then(|v| v.parse::<i32>().ok()).filter(|v| *v != 0).unwrap_or(1)
}

/// salloc's own flags, taken out before the sbatch-style options are parsed.
#[derive(Debug, Default, PartialEq, Eq)]
struct SallocFlags {
    /// `--no-shell`: exit once the allocation is granted; it lives on until scancel or its time limit.
    no_shell: bool,
    /// `-K[SIG]`/`--kill-command[=SIG]`: the signal for the command when the allocation is revoked.
    kill_signal: Option<i32>,
    /// `-I[SECS]`/`--immediate[=SECS]`: give up unless granted within SECS (0: at once).
    immediate: Option<u64>,
    /// `--bell` (true) / `--no-bell` (false); default: ring after a long wait.
    bell: Option<bool>,
}

impl SallocFlags {
    /// Reads one argument as a salloc flag; `Ok(false)` when it is not one.
    fn take(&mut self, arg: &str) -> anyhow::Result<bool> {
        match arg {
            "--no-shell" => self.no_shell = true,
            "--bell" => self.bell = Some(true),
            "--no-bell" => self.bell = Some(false),
            "-K" | "--kill-command" => self.kill_signal = Some(libc::SIGTERM),
            "-I" | "--immediate" => self.immediate = Some(0),
            _ => {
                if let Some(sig) = arg.strip_prefix("--kill-command=").or_else(|| arg.strip_prefix("-K")) {
                    self.kill_signal = Some(parse_signal(sig)?);
                } else if let Some(secs) = arg.strip_prefix("--immediate=").or_else(|| arg.strip_prefix("-I")) {
                    let secs = secs.parse().map_err(|_| anyhow::anyhow!("Invalid --immediate value: {secs}"))?;
                    self.immediate = Some(secs);
                } else {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}

/// A signal by number or name (`9`, `KILL`, `SIGKILL`), as `--kill-command` takes it.
fn parse_signal(text: &str) -> anyhow::Result<i32> {
    if let Ok(n) = text.parse::<i32>()
        && (1..=64).contains(&n)
    {
        return Ok(n);
    }
    let name = text.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    let known = [
        ("HUP", libc::SIGHUP),
        ("INT", libc::SIGINT),
        ("QUIT", libc::SIGQUIT),
        ("KILL", libc::SIGKILL),
        ("USR1", libc::SIGUSR1),
        ("USR2", libc::SIGUSR2),
        ("TERM", libc::SIGTERM),
        ("CONT", libc::SIGCONT),
        ("STOP", libc::SIGSTOP),
    ];
    known
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .ok_or_else(|| anyhow::anyhow!("Invalid signal specification: {text}"))
}

/// The command line split: salloc's flags, the sbatch-style options (salloc's flags removed), and the command.
/// Only flags before the command are salloc's: `salloc bash -c 'x --no-shell'` keeps the command whole.
fn split_command_line(args: &[String]) -> anyhow::Result<(SallocFlags, Vec<String>, Vec<String>)> {
    // salloc's flags are single words, so where the command starts is where the sbatch parser, given the rest,
    // finds its first operand.
    let mut probe = SallocFlags::default();
    let mut kept: Vec<usize> = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        if !probe.take(arg)? {
            kept.push(i);
        }
    }
    let kept_args: Vec<String> = kept.iter().map(|i| args[*i].clone()).collect();
    let parsed = parse_command_line(&kept_args)?;
    let start = match parsed.script_path {
        Some(_) => kept[kept_args.len() - parsed.script_args.len() - 1],
        None => args.len(),
    };
    let mut flags = SallocFlags::default();
    let mut options = Vec::new();
    for arg in &args[..start] {
        if !flags.take(arg)? {
            options.push(arg.clone());
        }
    }
    Ok((flags, options, args[start..].to_vec()))
}

async fn salloc(args: &[String]) -> anyhow::Result<i32> {
    let (controllers, args) = crate::command::take_controllers_flag(args);
    let (flags, options, command) = split_command_line(&args)?;
    let cmd = parse_command_line(&options)?;
    if cmd.wrap.is_some() || cmd.options.iter().any(|o| matches!(o, SbatchOption::Array(_))) {
        anyhow::bail!("--wrap and --array are sbatch's; salloc allocates one job for a command run here");
    }
    let cwd = std::env::current_dir()?.display().to_string();
    // salloc reads SALLOC_* input variables in Slurm, never SBATCH_* ones.
    let ctx = crate::slurm::host::submit_context(cwd.clone(), std::env::vars().collect(), false);
    let command = if command.is_empty() && !flags.no_shell { vec![login_shell(ctx.uid)] } else { command };
    let mut parsed = build_spec(&cmd, Some("#!/bin/sh\n"), &ctx)?;
    if !parsed.quiet {
        for warning in &parsed.warnings {
            eprintln!("salloc: warning: {warning}");
        }
    }
    let spec = &mut parsed.spec;
    spec.interactive = true;
    spec.stdout = None;
    spec.stderr = None;
    if !cmd.options.iter().any(|o| matches!(o, SbatchOption::JobName(_))) {
        spec.name = if flags.no_shell { "no-shell" } else { "interactive" }.into();
    }
    let client = crate::connect::client(controllers.as_deref())?;
    // Signals are caught from here on: before the grant they withdraw the request, after it they release it.
    let mut signals = Signals::new()?;
    let job_id = client.submit(spec).await.map_err(|e| anyhow::anyhow!("Job submit/allocate failed: {e}"))?;
    let started = Instant::now();
    let job = match wait_for_allocation(&client, job_id, flags.immediate, &mut signals).await {
        Ok(Waited::Granted(job)) => job,
        Ok(Waited::Interrupted) => {
            let _ = client.cancel(&[job_id]).await;
            eprintln!("salloc: Job aborted due to signal");
            return Ok(error_exit());
        }
        Ok(Waited::NotImmediate) => {
            let _ = client.cancel(&[job_id]).await;
            eprintln!("salloc: error: Unable to allocate resources: Requested nodes are busy");
            return Ok(exit_from_env("SLURM_EXIT_IMMEDIATE"));
        }
        Ok(Waited::Ended) => {
            eprintln!("salloc: Job allocation {job_id} has been revoked.");
            eprintln!("salloc: error: Job submit/allocate failed: Job/step already completing or completed");
            return Ok(error_exit());
        }
        Err(e) => {
            let _ = client.cancel(&[job_id]).await;
            return Err(e);
        }
    };
    eprintln!("salloc: Granted job allocation {job_id}");
    ring_bell(flags.bell, started.elapsed());
    if flags.no_shell {
        return Ok(0);
    }
    let cluster_name = match client.nodes_and_config(false).await {
        Ok((_, Some(config))) => config.cluster_name,
        _ => String::new(),
    };
    let mut vars = allocation_environment(&job, &cmd.options, &cwd, &cluster_name);
    if let Some(list) = &controllers {
        // So that srun and squeue inside find the cluster the allocation is on.
        vars.push(("DROVER_CONTROLLERS".to_string(), list.clone()));
    }
    let session = Session { client: &client, job: &job, kill_signal: flags.kill_signal };
    session.run(&command, &vars, &mut signals).await
}

/// How waiting for the grant ended.
enum Waited {
    Granted(Box<Job>),
    /// A signal came first.
    Interrupted,
    /// `--immediate` and not granted in time.
    NotImmediate,
    /// The job ended (cancelled, refused) before it was granted.
    Ended,
}

async fn wait_for_allocation(
    client: &Client,
    job_id: u64,
    immediate: Option<u64>,
    signals: &mut Signals,
) -> anyhow::Result<Waited> {
    let start = Instant::now();
    let mut told = false;
    let mut poll_ms = POLL_MS.0;
    loop {
        let job = match client.get_job(job_id, false, false).await {
            Ok((job, _)) => job,
            Err(drover_client::ClientError::NotFound(_)) => return Ok(Waited::Ended),
            Err(e) => return Err(e.into()),
        };
        match job.state {
            JobState::Running => {
                if told {
                    eprintln!("salloc: job {job_id} has been allocated resources");
                }
                return Ok(Waited::Granted(Box::new(job)));
            }
            JobState::Pending => {}
            _ => return Ok(Waited::Ended),
        }
        let waited_ms = start.elapsed().as_millis() as u64;
        match immediate {
            Some(secs) if waited_ms > GRACE_MS.max(secs * 1000) => return Ok(Waited::NotImmediate),
            Some(_) => {}
            None if !told && waited_ms > GRACE_MS => {
                eprintln!("salloc: Pending job allocation {job_id}");
                eprintln!("salloc: job {job_id} queued and waiting for resources");
                told = true;
            }
            None => {}
        }
        if waited_ms > ALLOCATION_WAIT_S * 1000 {
            anyhow::bail!("job {job_id} was not allocated resources within {ALLOCATION_WAIT_S} s");
        }
        tokio::select! {
            _ = signals.recv() => return Ok(Waited::Interrupted),
            _ = tokio::time::sleep(Duration::from_millis(poll_ms)) => {}
        }
        poll_ms = (poll_ms * 2).min(POLL_MS.1);
    }
}

/// Slurm's `--bell`: ring on a terminal when asked, or by default after a long wait.
fn ring_bell(bell: Option<bool>, waited: Duration) {
    let ring = bell.unwrap_or(waited.as_secs() > BELL_AFTER_S);
    // SAFETY: isatty only inspects the descriptor.
    if ring && unsafe { libc::isatty(libc::STDOUT_FILENO) } == 1 {
        print!("\x07");
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
}

/// The user's login shell from the passwd database (Slurm's default command), else `$SHELL`, else `/bin/sh`.
fn login_shell(uid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: the buffers outlive the call; getpwuid_r writes only within them.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc == 0 && !result.is_null() && !pwd.pw_shell.is_null() {
        // SAFETY: on success pw_shell points to a NUL-terminated string inside `buf`.
        let shell = unsafe { std::ffi::CStr::from_ptr(pwd.pw_shell) }.to_string_lossy().into_owned();
        if !shell.is_empty() {
            return shell;
        }
    }
    std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".to_string())
}

/// Slurm's `SLURM_TASKS_PER_NODE` syntax: runs of equal counts compressed, `4(x2),3`.
fn counts_per_node(counts: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let run = counts[i..].iter().take_while(|c| **c == counts[i]).count();
        parts.push(if run > 1 { format!("{}(x{run})", counts[i]) } else { counts[i].to_string() });
        i += run;
    }
    parts.join(",")
}

/// The variables salloc sets for its command (Slurm's `env_array_for_job` and salloc's own): the job's identity,
/// nodes and layout, and the options that steps inherit. `SLURM_NTASKS` only when a task count was asked for.
fn allocation_environment(job: &Job, options: &[SbatchOption], cwd: &str, cluster: &str) -> Vec<(String, String)> {
    let spec = &job.spec;
    let mut env = Vec::new();
    let mut set = |k: &str, v: String| env.push((k.to_string(), v));
    let nodelist = compress_hostlist(&job.nodes);
    let tasks: Vec<u32> = job.allocation.iter().map(|a| a.tasks.max(1)).collect();
    let cpus: Vec<u32> = job.allocation.iter().map(|a| a.cpus).collect();
    set("SLURM_JOB_ID", job.id.to_string());
    set("SLURM_JOBID", job.id.to_string());
    set("SLURM_JOB_NAME", spec.name.to_string());
    set("SLURM_JOB_NODELIST", nodelist.clone());
    set("SLURM_NODELIST", nodelist);
    set("SLURM_JOB_NUM_NODES", job.nodes.len().to_string());
    set("SLURM_NNODES", job.nodes.len().to_string());
    set("SLURM_JOB_PARTITION", job.partition.to_string());
    set("SLURM_JOB_ACCOUNT", job.account_name().to_string());
    set("SLURM_JOB_QOS", job.qos_name().to_string());
    if let Some(r) = &spec.reservation {
        set("SLURM_JOB_RESERVATION", r.to_string());
    }
    set("SLURM_JOB_CPUS_PER_NODE", counts_per_node(&cpus));
    set("SLURM_TASKS_PER_NODE", counts_per_node(&tasks));
    if spec.ntasks.is_some() || spec.ntasks_per_node.is_some() {
        let total: u32 = tasks.iter().sum();
        set("SLURM_NTASKS", total.to_string());
        set("SLURM_NPROCS", total.to_string());
    }
    if let Some(n) = spec.ntasks_per_node {
        set("SLURM_NTASKS_PER_NODE", n.to_string());
    }
    if options.iter().any(|o| matches!(o, SbatchOption::CpusPerTask(_))) {
        set("SLURM_CPUS_PER_TASK", spec.cpus_per_task.to_string());
    }
    if spec.gpus_per_node > 0 {
        set("SLURM_GPUS_PER_NODE", spec.gpus_per_node.to_string());
    }
    match spec.mem {
        Some(MemRequest::PerNode(mb)) => set("SLURM_MEM_PER_NODE", mb.to_string()),
        Some(MemRequest::PerCpu(mb)) => set("SLURM_MEM_PER_CPU", mb.to_string()),
        Some(MemRequest::PerGpu(mb)) => set("SLURM_MEM_PER_GPU", mb.to_string()),
        None => {}
    }
    if !cluster.is_empty() {
        set("SLURM_CLUSTER_NAME", cluster.to_string());
    }
    set("SLURM_SUBMIT_DIR", cwd.to_string());
    set("SLURM_SUBMIT_HOST", crate::slurm::host::host_name());
    env
}

/// The signals that end salloc's wait or its session (Slurm's `sig_array`, less SIGPIPE).
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        let on = |kind: SignalKind| signal(kind).map_err(|e| anyhow::anyhow!("cannot catch signals: {e}"));
        Ok(Signals {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
            quit: on(SignalKind::quit())?,
            usr1: on(SignalKind::user_defined1())?,
            usr2: on(SignalKind::user_defined2())?,
        })
    }

    /// The next signal's number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
            _ = self.usr1.recv() => libc::SIGUSR1,
            _ = self.usr2.recv() => libc::SIGUSR2,
        }
    }
}

/// The granted allocation and the command running in it.
struct Session<'a> {
    client: &'a Client,
    job: &'a Job,
    kill_signal: Option<i32>,
}

/// How the command's run ended, for what salloc does with the allocation.
enum Outcome {
    /// The command exited on its own: salloc relinquishes the allocation.
    Exited(ExitStatus),
    /// salloc was signalled: it has released the allocation already.
    Released(ExitStatus),
    /// The controller ended the allocation (scancel, time limit): nothing left to release.
    Revoked(ExitStatus),
}

impl Session<'_> {
    async fn run(&self, command: &[String], vars: &[(String, String)], signals: &mut Signals) -> anyhow::Result<i32> {
        let terminal = Terminal::foreground();
        let mut child = tokio::process::Command::new(&command[0]);
        child.args(&command[1..]).envs(vars.iter().cloned()).process_group(0);
        if terminal.is_some() {
            // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions.
            unsafe {
                child.pre_exec(|| {
                    // The command leads its own process group; give it the terminal, as a shell does a job.
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid());
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                    Ok(())
                });
            }
        }
        let mut child = match child.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("salloc: error: _fork_command: Unable to find command \"{}\": {e}", command[0]);
                self.relinquish(error_exit(), 0).await;
                return Ok(error_exit());
            }
        };
        let pgid = child.id().map(|p| p as i32);
        let outcome = self.supervise(&mut child, pgid, terminal.is_some(), signals).await;
        if let Some(terminal) = terminal {
            terminal.reclaim();
        }
        let status = match outcome? {
            Outcome::Exited(status) => {
                let (code, signal) = (status.code().unwrap_or(0), status.signal().unwrap_or(0));
                self.relinquish(code, signal).await;
                status
            }
            Outcome::Released(status) | Outcome::Revoked(status) => status,
        };
        Ok(exit_code(status))
    }

    /// Waits for the command, watching for signals and for the allocation's revocation.
    async fn supervise(
        &self,
        child: &mut tokio::process::Child,
        pgid: Option<i32>,
        interactive: bool,
        signals: &mut Signals,
    ) -> anyhow::Result<Outcome> {
        let job_id = self.job.id;
        let revoke_signal = self.kill_signal.unwrap_or(if interactive { libc::SIGHUP } else { libc::SIGTERM });
        loop {
            tokio::select! {
                status = child.wait() => return Ok(Outcome::Exited(status?)),
                sig = signals.recv() => {
                    eprintln!("salloc: Relinquishing job allocation {job_id}");
                    if let Err(e) = self.client.cancel(&[job_id]).await {
                        eprintln!("salloc: error: Unable to clean up job allocation {job_id}: {e}");
                    }
                    let status = stop(child, pgid, sig, signals).await?;
                    return Ok(Outcome::Released(status));
                }
                _ = tokio::time::sleep(Duration::from_millis(REVOKE_POLL_MS)) => {
                    let state = match self.client.get_job(job_id, false, false).await {
                        Ok((job, _)) => job.state,
                        Err(drover_client::ClientError::NotFound(_)) => JobState::Cancelled,
                        // The controllers unreachable for a moment is no revocation; look again next time.
                        Err(_) => JobState::Running,
                    };
                    if state == JobState::Running {
                        continue;
                    }
                    if state == JobState::Timeout {
                        eprintln!("salloc: Job {job_id} has exceeded its time limit and its allocation has been revoked.");
                    } else {
                        eprintln!("salloc: Job allocation {job_id} has been revoked.");
                    }
                    let status = stop(child, pgid, revoke_signal, signals).await?;
                    return Ok(Outcome::Revoked(status));
                }
            }
        }
    }

    /// Ends the allocation with the command's exit (it becomes COMPLETED, or FAILED with that exit code).
    async fn relinquish(&self, exit_code: i32, signal: i32) {
        let job_id = self.job.id;
        eprintln!("salloc: Relinquishing job allocation {job_id}");
        if let Err(e) = self.client.complete_job(job_id, self.job.incarnation, exit_code, signal).await {
            eprintln!("salloc: error: Unable to clean up job allocation {job_id}: {e}");
        }
    }
}

/// Signals the command's process group, waits up to [`KILL_WAIT_S`] (a second signal cuts it short), then kills
/// the group.
async fn stop(
    child: &mut tokio::process::Child,
    pgid: Option<i32>,
    sig: i32,
    signals: &mut Signals,
) -> anyhow::Result<ExitStatus> {
    let kill_group = |sig: i32| {
        if let Some(pgid) = pgid {
            // SAFETY: signals the command's own process group, which salloc created.
            unsafe { libc::killpg(pgid, sig) };
        }
    };
    kill_group(sig);
    tokio::select! {
        status = child.wait() => return Ok(status?),
        _ = signals.recv() => {}
        _ = tokio::time::sleep(Duration::from_secs(KILL_WAIT_S)) => {}
    }
    kill_group(libc::SIGKILL);
    Ok(child.wait().await?)
}

/// salloc's exit status from its command's (Slurm's rule): the exit code; 0 when killed by SIGHUP, SIGINT,
/// SIGQUIT or SIGKILL (most likely the user's doing); 1 for any other signal.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(libc::SIGHUP | libc::SIGINT | libc::SIGQUIT | libc::SIGKILL)) => 0,
        _ => 1,
    }
}

/// The controlling terminal while the command has it (salloc runs in the foreground of an interactive shell).
struct Terminal {
    pgrp: libc::pid_t,
}

impl Terminal {
    /// `Some` when stdin is a terminal whose foreground process group is salloc's.
    fn foreground() -> Option<Terminal> {
        // SAFETY: isatty, tcgetpgrp and getpgrp only inspect the process and the descriptor.
        unsafe {
            let pgrp = libc::getpgrp();
            (libc::isatty(libc::STDIN_FILENO) == 1 && libc::tcgetpgrp(libc::STDIN_FILENO) == pgrp)
                .then_some(Terminal { pgrp })
        }
    }

    /// Takes the terminal back for salloc's process group (ignoring SIGTTOU, which a background group asking
    /// for the terminal gets).
    fn reclaim(self) {
        // SAFETY: changes only this process's SIGTTOU disposition (restored after) and the terminal's group.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(libc::STDIN_FILENO, self.pgrp);
            libc::signal(libc::SIGTTOU, old);
        }
    }
}

#[cfg(test)]
mod tests {
    use drover_state::{JobSpec, NodeAllocation};

    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn salloc_flags_belong_to_salloc_only_before_the_command() {
        let (flags, options, command) =
            split_command_line(&strings(&["-N", "2", "--no-shell", "-K9", "-p", "gpu", "bash", "-c", "x --no-shell"]))
                .unwrap();
        assert_eq!(flags, SallocFlags { no_shell: true, kill_signal: Some(9), ..SallocFlags::default() });
        assert_eq!(options, strings(&["-N", "2", "-p", "gpu"]));
        assert_eq!(command, strings(&["bash", "-c", "x --no-shell"]));
        let (flags, options, command) = split_command_line(&strings(&["--immediate=5", "--gres=gpu:1"])).unwrap();
        assert_eq!(flags.immediate, Some(5));
        assert_eq!(options, strings(&["--gres=gpu:1"]));
        assert!(command.is_empty(), "no command: the login shell runs");
        assert!(split_command_line(&strings(&["--kill-command=BOGUS"])).is_err());
        assert_eq!(parse_signal("SIGUSR1").unwrap(), libc::SIGUSR1);
        assert_eq!(parse_signal("hup").unwrap(), libc::SIGHUP);
    }

    #[test]
    fn the_command_sees_the_allocation_as_slurms_salloc_sets_it() {
        let share = |node: &str, tasks| NodeAllocation { node: node.into(), gpus: vec![0], cpus: 8, tasks, mem_mb: 0 };
        let job = Job {
            id: 42,
            spec: JobSpec { name: "interactive".into(), ntasks: Some(3), gpus_per_node: 1, ..JobSpec::default() },
            partition: "gpu".into(),
            nodes: vec!["node01".into(), "node02".into()].into(),
            allocation: vec![share("node01", 2), share("node02", 1)].into(),
            ..Job::default()
        };
        let env = allocation_environment(&job, &[], "/home/ada", "test");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SLURM_JOB_ID"), Some("42"));
        assert_eq!(get("SLURM_JOB_NODELIST"), Some("node[01-02]"));
        assert_eq!(get("SLURM_NNODES"), Some("2"));
        assert_eq!(get("SLURM_NTASKS"), Some("3"));
        assert_eq!(get("SLURM_TASKS_PER_NODE"), Some("2,1"));
        assert_eq!(get("SLURM_JOB_CPUS_PER_NODE"), Some("8(x2)"));
        assert_eq!(get("SLURM_CLUSTER_NAME"), Some("test"));
        assert_eq!(get("SLURM_CPUS_PER_TASK"), None, "only when -c was given");
        let job = Job { spec: JobSpec { ntasks: None, ..job.spec.clone() }, ..job };
        assert_eq!(allocation_environment(&job, &[], "/", "").iter().find(|(k, _)| k == "SLURM_NTASKS"), None);
    }

    #[test]
    fn the_exit_status_follows_the_commands_as_slurm_reports_it() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGINT)), 0, "the user's interrupt is a normal exit");
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGSEGV)), 1);
        assert_eq!(counts_per_node(&[4, 4, 3]), "4(x2),3");
    }
}
