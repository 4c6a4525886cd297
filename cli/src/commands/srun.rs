//! `srun`: runs a parallel step. Inside a job (`SLURM_JOB_ID` set) it launches the step's tasks on the job's
//! nodes through their agents; outside one it first creates an allocation (an interactive job), runs the step in
//! the foreground, and ends the allocation with the step's exit. Output is streamed back; the exit code is the
//! worst task's. Ctrl-C cancels the step (the agents stop its tasks when srun goes away).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use drover_client::Client;
use drover_proto::v1::StepRequest;
use drover_proto::v1::agent_service_client::AgentServiceClient;
use drover_proto::wire::{StepEvent, StepLaunch, StepStdin, decode, encode};
use drover_state::{Job, JobState};

use crate::sbatch_args::{SbatchOption, build_spec, parse_command_line};

/// How long srun waits for an allocation before giving up (Slurm waits forever unless `--immediate`).
const ALLOCATION_WAIT_S: u64 = 24 * 3600;
const AGENT_CONNECT_TIMEOUT_MS: u64 = 3_000;
/// srun's exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
const INTERRUPTED: i32 = 130;

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("srun", crate::connect::runtime().block_on(srun(args)))
}

/// srun's own flags, taken out before the sbatch-style options are parsed.
struct SrunFlags {
    label: bool,
    unbuffered: bool,
    /// `--cpu-bind=verbose`: say how tasks are bound.
    cpu_bind_verbose: bool,
    /// `--jobid=N`: run the step in job N's allocation (as `SLURM_JOB_ID=N` does).
    job_id: Option<u64>,
    /// Options taken and not acted on, for a warning each.
    ignored: Vec<String>,
    /// `--input`/`-i`: which tasks get srun's standard input (all by default, as Slurm).
    input: StepStdin,
}

impl Default for SrunFlags {
    fn default() -> SrunFlags {
        SrunFlags {
            label: false,
            unbuffered: false,
            cpu_bind_verbose: false,
            job_id: None,
            ignored: Vec::new(),
            input: StepStdin::All,
        }
    }
}

fn take_srun_flags(args: &[String]) -> anyhow::Result<(SrunFlags, Vec<String>)> {
    let mut flags = SrunFlags::default();
    let mut rest = Vec::new();
    let mut in_command = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if !in_command {
            match arg.as_str() {
                "-l" | "--label" => {
                    flags.label = true;
                    continue;
                }
                "-u" | "--unbuffered" => {
                    flags.unbuffered = true;
                    continue;
                }
                "--pty" => continue,
                // Slurm's old spelling is still accepted.
                "--cpu-bind" | "--cpu_bind" => {
                    let Some(value) = args.next() else {
                        anyhow::bail!("option '{arg}' requires an argument");
                    };
                    parse_cpu_bind(value, &mut flags.cpu_bind_verbose)?;
                    continue;
                }
                a if a.starts_with("--cpu-bind=") || a.starts_with("--cpu_bind=") => {
                    parse_cpu_bind(&a["--cpu-bind=".len()..], &mut flags.cpu_bind_verbose)?;
                    continue;
                }
                // Steps never reserve CPUs or GPUs out of their job's allocation in Drover, so they always
                // overlap, as Slurm's `--overlap` asks, and `--exact`/`--whole` change nothing.
                "--overlap" | "--exact" | "--whole" => continue,
                "-i" | "--input" => {
                    let Some(value) = args.next() else {
                        anyhow::bail!("option '{arg}' requires an argument");
                    };
                    flags.input = parse_input(value)?;
                    continue;
                }
                a if a.starts_with("--input=") => {
                    flags.input = parse_input(&a["--input=".len()..])?;
                    continue;
                }
                a if a.starts_with("-i") && a.len() > 2 => {
                    flags.input = parse_input(&a[2..])?;
                    continue;
                }
                "--jobid" | "--mpi" => {
                    let Some(value) = args.next() else {
                        anyhow::bail!("option '{arg}' requires an argument");
                    };
                    take_valued(&mut flags, &arg[2..], value)?;
                    continue;
                }
                a if a.starts_with("--jobid=") || a.starts_with("--mpi=") => {
                    let (name, value) = a[2..].split_once('=').expect("matched with '='");
                    take_valued(&mut flags, name, value)?;
                    continue;
                }
                "-K" | "--kill-on-bad-exit" => {
                    flags.ignored.push("--kill-on-bad-exit".into());
                    continue;
                }
                a if a.starts_with("--kill-on-bad-exit=") || (a.starts_with("-K") && a.len() == 3) => {
                    flags.ignored.push("--kill-on-bad-exit".into());
                    continue;
                }
                a if crate::sbatch_args::takes_next_value(a) => {
                    // `-N 2`: the value is the option's, not the start of the command.
                    rest.push(arg.clone());
                    if let Some(value) = args.next() {
                        rest.push(value.clone());
                    }
                    continue;
                }
                a if !a.starts_with('-') => in_command = true,
                _ => {}
            }
        }
        rest.push(arg.clone());
    }
    Ok((flags, rest))
}

/// `--input=all|none|N`: every task, none (`/dev/null`), or task N alone. (Slurm's file-name patterns are not
/// taken: a shell redirect does the same.)
fn parse_input(value: &str) -> anyhow::Result<StepStdin> {
    match value {
        v if v.eq_ignore_ascii_case("all") => Ok(StepStdin::All),
        v if v.eq_ignore_ascii_case("none") => Ok(StepStdin::None),
        v => v.parse::<u32>().map(StepStdin::Rank).map_err(|_| {
            anyhow::anyhow!(
                "Invalid --input argument: {v} (all, none or a task number; redirect srun's own input for a file)"
            )
        }),
    }
}

/// srun's own options that take a value: `--jobid=N`, `--mpi=TYPE`.
fn take_valued(flags: &mut SrunFlags, name: &str, value: &str) -> anyhow::Result<()> {
    match name {
        "jobid" => {
            let id = value.parse::<u64>().map_err(|_| anyhow::anyhow!("Invalid --jobid argument: {value}"))?;
            flags.job_id = Some(id);
        }
        // Drover launches no PMI server: ranks find each other through the environment (MASTER_ADDR, RANK...)
        // or their own rendezvous, which is what `--mpi=none` means in Slurm.
        _ if value.eq_ignore_ascii_case("none") => {}
        _ => flags.ignored.push(format!("--mpi={value}")),
    }
    Ok(())
}

/// `--cpu-bind=[{quiet|verbose},]TYPE`, checked as Slurm's `slurm_verify_cpu_bind` checks it; `verbose` and
/// `quiet` set or clear `verbose` (each `--cpu-bind` adds to the ones before, as in Slurm).
///
/// Drover's agents confine a job's tasks on a node to the job's CPUs (a cpuset) but do not bind each task within
/// them (as Slurm with `TaskPlugin=task/cgroup` and no affinity plugin), so the type is only validated: a step launched by a tool that always passes one (snakemake's jobstep executor passes
/// `--cpu-bind=q`) runs as it would on such a Slurm, and a mistyped one still fails as it would there.
fn parse_cpu_bind(value: &str, verbose: &mut bool) -> anyhow::Result<()> {
    // A comma followed by a value continues a map or mask list (`map_cpu:0,1`); any other separates words.
    let is_value = |rest: &str| {
        rest.starts_with(|c: char| c.is_ascii_digit())
            || rest.trim_start_matches(|c: char| c.is_ascii_hexdigit()).is_empty()
            || rest.trim_start_matches(|c: char| c.is_ascii_hexdigit()).starts_with(',')
    };
    let mut words = vec![String::new()];
    for (i, c) in value.char_indices() {
        if c == ',' && !is_value(&value[i + 1..]) {
            words.push(String::new());
        } else {
            words.last_mut().expect("never empty").push(c);
        }
    }
    for word in &words {
        let lower = word.to_ascii_lowercase();
        let list = |names: &[&str]| {
            names.iter().any(|n| lower.starts_with(n)).then(|| lower.split([':', '=']).nth(1).unwrap_or_default())
        };
        match lower.as_str() {
            "q" | "quiet" => *verbose = false,
            "v" | "verbose" => *verbose = true,
            "one_thread" | "no" | "none" | "rank" | "rank_ldom" | "socket" | "sockets" | "core" | "cores"
            | "thread" | "threads" | "ldom" | "ldoms" => {}
            _ => match list(&[
                "map_cpu",
                "mapcpu",
                "mask_cpu",
                "maskcpu",
                "map_ldom",
                "mapldom",
                "mask_ldom",
                "maskldom",
            ]) {
                Some(items) if !items.is_empty() => {}
                Some(_) => anyhow::bail!("missing list for \"--cpu-bind={word}:<list>\""),
                None => anyhow::bail!("unrecognized --cpu-bind argument \"{word}\""),
            },
        }
    }
    Ok(())
}

async fn srun(args: &[String]) -> anyhow::Result<i32> {
    let (controllers, args) = crate::command::take_controllers_flag(args);
    let (flags, args) = take_srun_flags(&args)?;
    if flags.cpu_bind_verbose {
        eprintln!("cpu-bind=NONE - tasks share their job's CPUs on each node and are not bound one by one");
    }
    for option in &flags.ignored {
        let why = if option.starts_with("--mpi") {
            "Drover starts no PMI server; ranks meet through MASTER_ADDR/MASTER_PORT, RANK and WORLD_SIZE"
        } else {
            "a step ends when all of its tasks have ended"
        };
        eprintln!("srun: warning: {option} is ignored: {why}");
    }
    let cmd = parse_command_line(&args)?;
    let Some(program) = cmd.script_path.clone() else { anyhow::bail!("No command given to execute") };
    let cwd = std::env::current_dir()?.display().to_string();
    let env: Vec<(String, String)> = std::env::vars().collect();
    // srun reads SLURM_* input variables in Slurm, never SBATCH_* ones.
    let ctx = crate::slurm::host::submit_context(cwd.clone(), env.clone(), false);
    let client = crate::connect::client(controllers.as_deref())?;
    let mut argv = vec![program];
    argv.extend(cmd.script_args.iter().cloned());
    let output =
        cmd.options.iter().rev().find_map(|o| if let SbatchOption::Output(p) = o { Some(p.clone()) } else { None });
    let error =
        cmd.options.iter().rev().find_map(|o| if let SbatchOption::Error(p) = o { Some(p.clone()) } else { None });
    let nodes_given =
        cmd.options.iter().rev().find_map(|o| if let SbatchOption::Nodes { min, .. } = o { Some(*min) } else { None });
    let mut parsed = build_spec(&cmd, Some("#!/bin/sh\n"), &ctx)?;
    if !parsed.quiet {
        for warning in &parsed.warnings {
            eprintln!("srun: warning: {warning}");
        }
    }
    let spec = &mut parsed.spec;
    let step_env = step_environment(spec);

    let inside = flags.job_id.or_else(|| std::env::var("SLURM_JOB_ID").ok().and_then(|v| v.parse::<u64>().ok()));
    if let Some(job_id) = inside {
        let (job, _) = client.get_job(job_id, false, false).await?;
        if job.state != JobState::Running {
            anyhow::bail!("job {job_id} is {} and cannot run steps", job.state.name());
        }
        if spec.gpu_freq.is_some() && !parsed.quiet {
            // Slurm sets a step's own clocks for the step; Drover sets clocks per job (its allocation's request).
            eprintln!(
                "srun: warning: --gpu-freq is ignored for a step: the job's GPUs keep the clocks its allocation asked for"
            );
        }
        let layout = step_layout(&job, nodes_given, spec.ntasks, spec.ntasks_per_node)?;
        let container = spec.container.clone();
        let step = StepPlan { argv, env: step_env, cwd, output, error, flags, layout, container };
        return run_step(&client, &job, step).await;
    }

    // Outside a job: an interactive allocation first.
    spec.interactive = true;
    spec.stdout = None;
    spec.stderr = None;
    if spec.name == "sbatch" || spec.name.is_empty() {
        spec.name = argv[0].rsplit('/').next().unwrap_or(&argv[0]).into();
    }
    let job_id = client.submit(spec).await?;
    let job = match wait_for_allocation(&client, job_id).await {
        Ok(job) => job,
        Err(e) => {
            let _ = client.cancel(&[job_id]).await;
            return Err(e);
        }
    };
    let layout = step_layout(&job, None, spec.ntasks, spec.ntasks_per_node)?;
    let container = spec.container.clone();
    let step = StepPlan { argv, env: step_env, cwd, output, error, flags, layout, container };
    let result = run_step(&client, &job, step).await;
    if matches!(result, Ok(INTERRUPTED)) {
        // Ctrl-C: the allocation is cancelled, as Slurm's srun does; the agents stop the tasks as the streams drop.
        if let Err(e) = client.cancel(&[job_id]).await {
            eprintln!("srun: error: could not cancel allocation {job_id}: {e}");
        }
        return result;
    }
    let (exit_code, signal) = match &result {
        Ok(code) if *code > 128 => (0, code - 128),
        Ok(code) => (*code, 0),
        Err(_) => (1, 0),
    };
    if let Err(e) = client.complete_job(job_id, job.incarnation, exit_code, signal).await {
        eprintln!("srun: error: could not end allocation {job_id}: {e}");
    }
    result
}

/// The variables of srun's own environment that travel to the tasks (`--export`, default ALL).
pub fn step_environment(spec: &drover_state::JobSpec) -> Vec<(String, String)> {
    let mut env = spec.exported_environment();
    // The agent sets the job's and step's own variables; stale ones from this shell must not shadow them.
    env.retain(|(k, _)| !k.starts_with("SLURM_STEP") && k != "CUDA_VISIBLE_DEVICES" && k != "SLURM_UMASK");
    // As Slurm's srun: the tasks learn the umask srun ran with (they are started with the node's own).
    env.push(("SLURM_UMASK".to_string(), format!("{:04o}", current_umask())));
    env
}

/// This process's umask (read by setting one and putting it back: there is no call that only reads it).
fn current_umask() -> libc::mode_t {
    // SAFETY: umask cannot fail; the old mask is restored at once.
    unsafe {
        let mask = libc::umask(0o022);
        libc::umask(mask);
        mask
    }
}

async fn wait_for_allocation(client: &Client, job_id: u64) -> anyhow::Result<Job> {
    let start = Instant::now();
    let mut told = false;
    let mut interrupt = Box::pin(tokio::signal::ctrl_c());
    loop {
        let (job, _) = client.get_job(job_id, false, false).await?;
        match job.state {
            JobState::Running => {
                if told {
                    eprintln!("srun: job {job_id} has been allocated resources");
                }
                return Ok(job);
            }
            JobState::Pending => {}
            other => anyhow::bail!("job {job_id} ended ({}) before it was allocated resources", other.name()),
        }
        if !told && start.elapsed() > Duration::from_secs(1) {
            eprintln!("srun: job {job_id} queued and waiting for resources");
            told = true;
        }
        if start.elapsed() > Duration::from_secs(ALLOCATION_WAIT_S) {
            anyhow::bail!("job {job_id} was not allocated resources within {ALLOCATION_WAIT_S} s");
        }
        tokio::select! {
            _ = &mut interrupt => anyhow::bail!("Job allocation {job_id} has been revoked (interrupted)"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// Which nodes run how many tasks.
struct Layout {
    nodes: Vec<String>,
    tasks_per_node: Vec<u32>,
}

/// Slurm's block layout: the first `-N` nodes of the job (all by default); `--ntasks-per-node` each, or
/// `-n` spread evenly, or the job's own task counts.
fn step_layout(job: &Job, nodes: Option<u32>, ntasks: Option<u32>, per_node: Option<u32>) -> anyhow::Result<Layout> {
    let count = nodes.unwrap_or(job.nodes.len() as u32) as usize;
    if count == 0 || count > job.nodes.len() {
        anyhow::bail!(
            "Requested node configuration is not available: {count} nodes requested, the job has {}",
            job.nodes.len()
        );
    }
    let nodes: Vec<String> = job.nodes[..count].to_vec();
    let tasks_per_node = match (ntasks, per_node) {
        (_, Some(p)) => vec![p; count],
        (Some(n), None) => {
            let n = n.max(count as u32);
            (0..count as u32).map(|i| n / count as u32 + u32::from(i < n % count as u32)).collect()
        }
        (None, None) => job.allocation[..count].iter().map(|a| a.tasks.max(1)).collect(),
    };
    Ok(Layout { nodes, tasks_per_node })
}

struct StepPlan {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    output: Option<String>,
    error: Option<String>,
    flags: SrunFlags,
    layout: Layout,
    /// The step's own pyxis options; `None`: the job's container, if it has one.
    container: Option<Box<drover_state::container::ContainerSpec>>,
}

async fn run_step(client: &Client, job: &Job, plan: StepPlan) -> anyhow::Result<i32> {
    let name = plan.argv.first().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or_default();
    let total: u32 = plan.layout.tasks_per_node.iter().sum();
    let (step_id, credential) = client.create_step(job.id, name, &plan.layout.nodes, total).await?;
    // The agents get the step's own credential, never this user's: a node could replay that to the controllers.
    let credential = tonic::metadata::MetadataValue::try_from(credential.as_str())
        .map_err(|_| anyhow::anyhow!("the controllers answered with an unusable step credential"))?;
    let credentials = drover_client::Credentials::given(credential);
    let (worst, end) = follow_step(client, &credentials, job, step_id, &plan).await?;
    // The record is for sacct: a step whose end cannot be recorded still ran, so its status stands.
    if let Err(e) = client.end_step(job.id, step_id, end.exit_code, end.signal, end.cancelled).await {
        eprintln!("srun: warning: step {}.{step_id} ended but its end could not be recorded: {e}", job.id);
    }
    Ok(worst)
}

/// How a step ended, as its record says it: the largest exit code, a signal that killed a task, interrupted.
#[derive(Default)]
struct StepOutcome {
    exit_code: i32,
    signal: i32,
    cancelled: bool,
}

/// Launches the step's tasks and streams their output until they have all ended: srun's exit status, and the
/// step's outcome.
async fn follow_step(
    client: &Client,
    credentials: &drover_client::Credentials,
    job: &Job,
    step_id: u32,
    plan: &StepPlan,
) -> anyhow::Result<(i32, StepOutcome)> {
    let mut outcome = StepOutcome::default();
    let nodes = client.list_nodes(false).await?;
    let addrs: HashMap<&str, &str> = nodes.iter().map(|n| (n.info.name.as_str(), n.info.agent_addr.as_str())).collect();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, anyhow::Result<StepEvent>)>(1024);
    // srun's standard input goes to the tasks that take it (Slurm's --input), one stream per node.
    let forward_input = plan.flags.input != StepStdin::None && input_is_ours();
    let mut inputs = Vec::new();
    for (index, node) in plan.layout.nodes.iter().enumerate() {
        let addr = addrs.get(node.as_str()).ok_or_else(|| anyhow::anyhow!("node {node} is unknown"))?.to_string();
        let launch = StepLaunch {
            job_id: job.id,
            step_id,
            argv: plan.argv.clone(),
            env: plan.env.clone(),
            cwd: plan.cwd.clone(),
            nodes: plan.layout.nodes.clone(),
            node_index: index as u32,
            tasks_per_node: plan.layout.tasks_per_node.clone(),
            output: plan.output.clone(),
            error: plan.error.clone(),
            unbuffered: plan.flags.unbuffered,
            stdin: if forward_input { plan.flags.input } else { StepStdin::None },
            container: plan.container.clone(),
        };
        let input = forward_input.then(|| {
            let (input_tx, input_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(INPUT_QUEUE_CHUNKS);
            inputs.push(input_tx);
            input_rx
        });
        let tx = tx.clone();
        let node = node.clone();
        let (tls, credentials) = (client.tls().clone(), credentials.clone());
        tokio::spawn(async move {
            if let Err(e) = follow_node(&tls, &credentials, &addr, launch, input, &node, &tx).await {
                let _ = tx.send((node, Err(e))).await;
            }
        });
    }
    drop(tx);
    if !inputs.is_empty() {
        read_input(inputs);
    }
    let total: u32 = plan.layout.tasks_per_node.iter().sum();
    let mut exited = 0u32;
    let mut worst = 0i32;
    let mut interrupt = Box::pin(tokio::signal::ctrl_c());
    // USR1 and USR2 are what training frameworks checkpoint on: Slurm's srun forwards them to its tasks and
    // keeps running, so a `kill -USR1 <srun>` or `scancel --signal=USR1` reaches the ranks, never ends the step.
    use tokio::signal::unix::{SignalKind, signal};
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    loop {
        let item = tokio::select! {
            item = rx.recv() => item,
            _ = &mut interrupt => {
                eprintln!("srun: interrupted; cancelling step {}.{step_id}", job.id);
                outcome.cancelled = true;
                return Ok((INTERRUPTED, outcome));
            }
            _ = usr1.recv() => { forward_signal(client, job.id, libc::SIGUSR1).await; continue }
            _ = usr2.recv() => { forward_signal(client, job.id, libc::SIGUSR2).await; continue }
        };
        let Some((node, event)) = item else { break };
        // A node that could not be reached or was lost counts as one that refused the step.
        match event.unwrap_or_else(|lost| StepEvent::Refused { message: lost.to_string() }) {
            StepEvent::Output { rank, stderr, text } => {
                let text = if plan.flags.label {
                    text.lines().map(|l| format!("{rank}: {l}\n")).collect::<String>()
                } else {
                    text
                };
                if stderr {
                    let _ = std::io::stderr().write_all(text.as_bytes());
                } else {
                    let _ = std::io::stdout().write_all(text.as_bytes());
                    let _ = std::io::stdout().flush();
                }
            }
            StepEvent::Exited { rank, exit_code, signal } => {
                exited += 1;
                let code = if signal != 0 { 128 + signal } else { exit_code };
                if code != 0 {
                    eprintln!("srun: error: {node}: task {rank}: {}", describe_exit(exit_code, signal));
                }
                worst = worst.max(code);
                outcome.exit_code = outcome.exit_code.max(exit_code);
                if outcome.signal == 0 {
                    outcome.signal = signal;
                }
            }
            StepEvent::Refused { message } => {
                eprintln!("srun: error: {node}: {message}");
                worst = worst.max(1);
                outcome.exit_code = outcome.exit_code.max(1);
            }
        }
    }
    if exited < total && worst == 0 {
        worst = 1;
        outcome.exit_code = outcome.exit_code.max(1);
    }
    Ok((worst, outcome))
}

/// Sends `signal` to the job's step tasks (Drover addresses steps per job, so concurrent steps of the same job get
/// it too); a failure is said, not fatal: the step goes on either way.
async fn forward_signal(client: &Client, job_id: u64, signal: i32) {
    let target = drover_proto::v1::SignalTarget::Steps;
    match client.signal(&[job_id], signal, target).await {
        Ok(outcomes) => {
            for o in outcomes.iter().filter(|o| !o.ok) {
                eprintln!("srun: error: forwarding signal {signal} to job {job_id}: {}", o.error);
            }
        }
        Err(e) => eprintln!("srun: error: forwarding signal {signal} to job {job_id}: {e}"),
    }
}

fn describe_exit(exit_code: i32, signal: i32) -> String {
    if signal != 0 { format!("Killed by signal {signal}") } else { format!("Exited with exit code {exit_code}") }
}

/// Chunks of srun's input queued per node before the reader waits (64 KiB each).
const INPUT_QUEUE_CHUNKS: usize = 16;
/// srun reads its input in chunks of this size (the agent's limit per message).
const INPUT_CHUNK_BYTES: usize = 64 * 1024;

/// Whether srun may read its standard input: a file or pipe, or a terminal whose foreground this is (reading the
/// terminal from the background would stop srun with SIGTTIN).
fn input_is_ours() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp only read process state.
    unsafe { libc::isatty(0) == 0 || libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Reads srun's standard input on a thread of its own (a read that waits on a quiet pipe must not hold up the
/// runtime when the step is over) and hands every chunk to each node's stream; its end closes them all.
fn read_input(nodes: Vec<tokio::sync::mpsc::Sender<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; INPUT_CHUNK_BYTES];
        loop {
            match std::io::Read::read(&mut stdin, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    for node in &nodes {
                        let _ = node.blocking_send(buf[..n].to_vec());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("srun: error: reading standard input: {e}");
                    return;
                }
            }
        }
    });
}

/// Launches this node's part of the step on its agent (mutual TLS; the agent must hold an agent's certificate)
/// with the step's credential, forwards its events, and streams srun's input to it once its tasks have started.
/// How long srun keeps trying a node that has not yet heard of the job's allocation.
const ALLOCATION_WAIT_MS: u64 = 5_000;

async fn follow_node(
    tls: &drover_auth::tls::ClientTls,
    credentials: &drover_client::Credentials,
    addr: &str,
    launch: StepLaunch,
    input: Option<tokio::sync::mpsc::Receiver<Vec<u8>>>,
    node: &str,
    tx: &tokio::sync::mpsc::Sender<(String, anyhow::Result<StepEvent>)>,
) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(AGENT_CONNECT_TIMEOUT_MS);
    let channel = tls
        .channel(addr, None, timeout, Some(drover_auth::tls::RoleKind::Agent))
        .map_err(|e| anyhow::anyhow!("cannot reach the agent at {addr}: {e}"))?;
    let mut agent = AgentServiceClient::new(channel);
    let (job_id, step_id) = (launch.job_id, launch.step_id);
    // The leader has committed the job's start, but the node may hear of it a moment after srun reaches it: a
    // launch refused for want of the allocation is tried again for a while (Slurm's slurmd takes the allocation
    // from the step's credential instead; Drover's agents act only on what the leader assigned them).
    let give_up = tokio::time::Instant::now() + Duration::from_millis(ALLOCATION_WAIT_MS);
    let mut stream = loop {
        let mut request = tonic::Request::new(StepRequest { json: encode(&launch) });
        credentials.attach(&mut request)?;
        match agent.launch_step(request).await {
            Ok(stream) => break stream.into_inner(),
            Err(s)
                if s.code() == tonic::Code::FailedPrecondition
                    && s.message().contains("has no allocation on node")
                    && tokio::time::Instant::now() < give_up =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => anyhow::bail!("{}", s.message()),
        }
    };
    if let Some(input) = input {
        let chunks = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(input), move |data| {
            drover_proto::v1::StepInputChunk { job_id, step_id, data }
        });
        let mut request = tonic::Request::new(chunks);
        credentials.attach(&mut request)?;
        let mut agent = agent.clone();
        let node = node.to_string();
        tokio::spawn(async move {
            if let Err(status) = agent.step_input(request).await {
                eprintln!("srun: error: {node}: standard input not delivered: {}", status.message());
            }
        });
    }
    while let Some(envelope) =
        stream.message().await.map_err(|s| anyhow::anyhow!("lost the agent at {addr}: {}", s.message()))?
    {
        let event: StepEvent = decode(&envelope.json)?;
        if tx.send((node.to_string(), Ok(event))).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn snakemakes_jobstep_line_keeps_its_step_options_and_drops_the_cpu_binding() {
        // What snakemake-executor-plugin-slurm-jobstep 0.6 runs inside every job.
        let line = strings(&["-n1", "--cpu-bind=q", "--cpus-per-task=2", "--nodes=1", "python", "-m", "snakemake"]);
        let (flags, rest) = take_srun_flags(&line).unwrap();
        assert!(!flags.cpu_bind_verbose);
        assert_eq!(rest, strings(&["-n1", "--cpus-per-task=2", "--nodes=1", "python", "-m", "snakemake"]));
    }

    #[test]
    fn an_options_separate_value_is_not_the_command_and_input_picks_the_readers() {
        let (flags, rest) = take_srun_flags(&strings(&["-N", "2", "-l", "--input=0", "cmd", "-l"])).unwrap();
        assert!(flags.label, "-l after `-N 2` is still srun's");
        assert_eq!(flags.input, StepStdin::Rank(0));
        assert_eq!(rest, strings(&["-N", "2", "cmd", "-l"]));
        let (flags, _) = take_srun_flags(&strings(&["-i", "none", "cmd"])).unwrap();
        assert_eq!(flags.input, StepStdin::None);
        assert_eq!(take_srun_flags(&strings(&["cmd"])).unwrap().0.input, StepStdin::All, "Slurm's default");
        assert!(take_srun_flags(&strings(&["--input=some/file", "cmd"])).is_err());
    }

    #[test]
    fn cpu_bind_takes_its_value_either_way_and_belongs_to_srun_only_before_the_command() {
        let (flags, rest) = take_srun_flags(&strings(&["--cpu_bind", "verbose,cores", "app", "--cpu-bind=x"])).unwrap();
        assert!(flags.cpu_bind_verbose);
        assert_eq!(rest, strings(&["app", "--cpu-bind=x"]));
        assert!(take_srun_flags(&strings(&["--cpu-bind"])).is_err());
    }

    #[test]
    fn launcher_options_are_taken_jobid_names_the_allocation_and_the_rest_warn() {
        // What torchrun and MPI launch scripts commonly pass.
        let line =
            strings(&["--jobid", "12", "--overlap", "--mpi=pmix", "-K1", "--exact", "-N2", "torchrun", "--jobid=3"]);
        let (flags, rest) = take_srun_flags(&line).unwrap();
        assert_eq!(flags.job_id, Some(12));
        assert_eq!(flags.ignored, ["--mpi=pmix", "--kill-on-bad-exit"]);
        assert_eq!(rest, strings(&["-N2", "torchrun", "--jobid=3"]), "the command's own options are its own");
        let (flags, _) = take_srun_flags(&strings(&["--jobid=7", "--mpi", "none", "app"])).unwrap();
        assert_eq!((flags.job_id, flags.ignored.len()), (Some(7), 0), "--mpi=none is what Drover does");
        let err = take_srun_flags(&strings(&["--jobid=x", "app"])).err().unwrap();
        assert_eq!(err.to_string(), "Invalid --jobid argument: x");
        assert!(take_srun_flags(&strings(&["--jobid"])).is_err());
    }

    #[test]
    fn cpu_bind_types_are_checked_as_slurm_checks_them() {
        let mut verbose = false;
        for good in ["q", "quiet,rank", "NONE", "map_cpu:0,1,cores", "mask_cpu=0x3,0xc", "sockets", "v,threads"] {
            assert!(parse_cpu_bind(good, &mut verbose).is_ok(), "{good}");
        }
        assert!(verbose, "the last one said verbose");
        parse_cpu_bind("v,q", &mut verbose).unwrap();
        assert!(!verbose, "the last of quiet and verbose wins");
        for (bad, said) in [("fast", "unrecognized"), ("quiet,", "unrecognized"), ("map_cpu:", "missing list")] {
            let err = parse_cpu_bind(bad, &mut verbose).unwrap_err().to_string();
            assert!(err.contains(said), "{bad}: {err}");
        }
    }
}
