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
use drover_proto::wire::{StepEvent, StepLaunch, decode, encode};
use drover_state::{Job, JobState};

use crate::identity::current_user;
use crate::sbatch_args::{SbatchOption, SubmitContext, build_spec, parse_command_line};

/// How long srun waits for an allocation before giving up (Slurm waits forever unless `--immediate`).
const ALLOCATION_WAIT_S: u64 = 24 * 3600;
const AGENT_CONNECT_TIMEOUT_MS: u64 = 3_000;
/// srun's exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
const INTERRUPTED: i32 = 130;

pub fn run(args: &[String]) -> i32 {
    match crate::connect::runtime().block_on(srun(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("srun: error: {e:#}");
            1
        }
    }
}

/// srun's own flags, taken out before the sbatch-style options are parsed.
#[derive(Default)]
struct SrunFlags {
    label: bool,
    unbuffered: bool,
}

fn take_srun_flags(args: &[String]) -> (SrunFlags, Vec<String>) {
    let mut flags = SrunFlags::default();
    let mut rest = Vec::new();
    let mut in_command = false;
    for arg in args {
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
                a if !a.starts_with('-') => in_command = true,
                _ => {}
            }
        }
        rest.push(arg.clone());
    }
    (flags, rest)
}

async fn srun(args: &[String]) -> anyhow::Result<i32> {
    let (controllers, args) = super::sbatch::take_controllers_flag(args);
    let (flags, args) = take_srun_flags(&args);
    let cmd = parse_command_line(&args)?;
    let Some(program) = cmd.script_path.clone() else { anyhow::bail!("No command given to execute") };
    let (user, uid, gid) = current_user();
    let cwd = std::env::current_dir()?.display().to_string();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (now_ms, utc_offset_s) = super::sbatch::local_clock();
    // srun reads SLURM_* input variables in Slurm, never SBATCH_* ones.
    let ctx =
        SubmitContext { user, uid, gid, cwd: cwd.clone(), env: env.clone(), now_ms, utc_offset_s, sbatch_env: false };
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

    if let Some(job_id) = std::env::var("SLURM_JOB_ID").ok().and_then(|v| v.parse::<u64>().ok()) {
        let (job, _) = client.get_job(job_id, false, false).await?;
        if job.state != JobState::Running {
            anyhow::bail!("job {job_id} is {} and cannot run steps", job.state.name());
        }
        let layout = step_layout(&job, nodes_given, spec.ntasks, spec.ntasks_per_node)?;
        let step = StepPlan { argv, env: step_env, cwd, output, error, flags, layout };
        return run_step(&client, &job, step).await;
    }

    // Outside a job: an interactive allocation first.
    spec.interactive = true;
    spec.stdout = None;
    spec.stderr = None;
    if spec.name == "sbatch" || spec.name.is_empty() {
        spec.name = argv[0].rsplit('/').next().unwrap_or(&argv[0]).to_string();
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
    let step = StepPlan { argv, env: step_env, cwd, output, error, flags, layout };
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
    env.retain(|(k, _)| !k.starts_with("SLURM_STEP") && k != "CUDA_VISIBLE_DEVICES");
    env
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
}

async fn run_step(client: &Client, job: &Job, plan: StepPlan) -> anyhow::Result<i32> {
    let step_id = client.create_step(job.id).await?;
    let nodes = client.list_nodes(false).await?;
    let addrs: HashMap<&str, &str> = nodes.iter().map(|n| (n.info.name.as_str(), n.info.agent_addr.as_str())).collect();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Result<StepEvent, String>)>(1024);
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
        };
        let tx = tx.clone();
        let node = node.clone();
        let (tls, credentials) = (client.tls().clone(), client.credentials().clone());
        tokio::spawn(async move {
            if let Err(e) = follow_node(&tls, &credentials, &addr, launch, &node, &tx).await {
                let _ = tx.send((node, Err(e))).await;
            }
        });
    }
    drop(tx);
    let total: u32 = plan.layout.tasks_per_node.iter().sum();
    let mut exited = 0u32;
    let mut worst = 0i32;
    let mut interrupt = Box::pin(tokio::signal::ctrl_c());
    loop {
        let item = tokio::select! {
            item = rx.recv() => item,
            _ = &mut interrupt => {
                eprintln!("srun: interrupted; cancelling step {}.{step_id}", job.id);
                return Ok(INTERRUPTED);
            }
        };
        let Some((node, event)) = item else { break };
        match event {
            Ok(StepEvent::Output { rank, stderr, text }) => {
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
            Ok(StepEvent::Exited { rank, exit_code, signal }) => {
                exited += 1;
                let code = if signal != 0 { 128 + signal } else { exit_code };
                if code != 0 {
                    eprintln!("srun: error: {node}: task {rank}: {}", describe_exit(exit_code, signal));
                }
                worst = worst.max(code);
            }
            Ok(StepEvent::Refused { message }) | Err(message) => {
                eprintln!("srun: error: {node}: {message}");
                worst = worst.max(1);
            }
        }
    }
    if exited < total && worst == 0 {
        worst = 1;
    }
    Ok(worst)
}

fn describe_exit(exit_code: i32, signal: i32) -> String {
    if signal != 0 { format!("Killed by signal {signal}") } else { format!("Exited with exit code {exit_code}") }
}

/// Launches this node's part of the step on its agent (mutual TLS; the agent must hold an agent's certificate)
/// with the user's credential, and forwards its events.
async fn follow_node(
    tls: &drover_auth::tls::ClientTls,
    credentials: &drover_client::Credentials,
    addr: &str,
    launch: StepLaunch,
    node: &str,
    tx: &tokio::sync::mpsc::Sender<(String, Result<StepEvent, String>)>,
) -> Result<(), String> {
    let timeout = Duration::from_millis(AGENT_CONNECT_TIMEOUT_MS);
    let channel = tls
        .channel(addr, None, timeout, Some(drover_auth::tls::RoleKind::Agent))
        .map_err(|e| format!("cannot reach the agent at {addr}: {e}"))?;
    let mut agent = AgentServiceClient::new(channel);
    let mut request = tonic::Request::new(StepRequest { json: encode(&launch) });
    credentials.attach(&mut request).map_err(|e| e.to_string())?;
    let mut stream = agent.launch_step(request).await.map_err(|s| s.message().to_string())?.into_inner();
    while let Some(envelope) =
        stream.message().await.map_err(|s| format!("lost the agent at {addr}: {}", s.message()))?
    {
        let event: StepEvent = decode(&envelope.json)?;
        if tx.send((node.to_string(), Ok(event))).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}
