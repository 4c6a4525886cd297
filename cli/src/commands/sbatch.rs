//! `sbatch`: submits a batch script (a file, stdin, or `--wrap`).

use std::io::Read;

use crate::command::take_controllers_flag;
use crate::sbatch_args::{MAX_SCRIPT_BYTES, OptionError, SbatchError, build_spec, parse_command_line};

/// Why `sbatch` failed, for its exit status and wording, as Slurm 22.05's (checked on this machine).
enum Failure {
    /// The options or directives are wrong: exit 255, as Slurm's option processing.
    Options(anyhow::Error),
    /// Anything else (an unreadable script, no cluster, the controllers' refusal): exit 1.
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::Other(e.into())
    }
}

/// Runs `sbatch ARGS...` and returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    match submit(args) {
        Ok(code) => code,
        Err(Failure::Options(e)) => report_bad_submission(&e),
        Err(Failure::Other(e)) => {
            // The controllers' refusal reads as Slurm's: "Batch job submission failed: <reason>".
            let refused =
                matches!(e.downcast_ref::<drover_client::ClientError>(), Some(drover_client::ClientError::Rejected(_)));
            if refused {
                eprintln!("sbatch: error: Batch job submission failed: {e}");
            } else {
                eprintln!("sbatch: error: {e}");
            }
            1
        }
    }
}

/// Prints why the options or the script are wrong, and returns the exit status: Slurm's words and status where
/// scripts may test them (checked against Slurm 22.05 by the differential suite), else 255 with Drover's reason.
fn report_bad_submission(e: &anyhow::Error) -> i32 {
    let script_error = |lines: &[&str]| {
        for line in lines {
            eprintln!("sbatch: error: {line}");
        }
        1
    };
    match e.downcast_ref::<SbatchError>() {
        Some(SbatchError::CommandLine(OptionError::Unknown { flag })) => {
            eprintln!("{}", crate::command::unrecognized_option("sbatch", flag));
            255
        }
        // A count that is a number but not a positive one: Slurm's sbatch says so and exits 1.
        Some(SbatchError::CommandLine(OptionError::InvalidValue { flag, value, .. }))
            if value.parse::<i64>().is_ok_and(|n| n <= 0) && count_option(flag).is_some() =>
        {
            let option = count_option(flag).unwrap_or_default();
            script_error(&[&format!("Invalid numeric value \"{value}\" for {option}.")])
        }
        Some(SbatchError::NotABatchScript) => script_error(&[
            "This does not look like a batch script.  The first",
            "line must start with #! followed by the path to an interpreter.",
            "For instance: #!/bin/sh",
        ]),
        Some(SbatchError::EmptyScript) => script_error(&["Batch script is empty!"]),
        Some(SbatchError::WhitespaceScript) => script_error(&["Batch script contains only whitespace!"]),
        Some(SbatchError::WrapWithScript { .. }) => {
            script_error(&["Script arguments not permitted with --wrap option"])
        }
        _ => {
            eprintln!("sbatch: error: {e}");
            255
        }
    }
}

/// The long name Slurm's "Invalid numeric value" message gives a task or CPU count option.
fn count_option(flag: &str) -> Option<&'static str> {
    match flag {
        "-c" | "--cpus-per-task" => Some("--cpus-per-task"),
        "-n" | "--ntasks" => Some("--ntasks"),
        _ => None,
    }
}

/// Submits; the exit code is 0, or with `--wait` the job's.
fn submit(args: &[String]) -> Result<i32, Failure> {
    let (controllers, args) = take_controllers_flag(args);
    let cmd = parse_command_line(&args).map_err(|e| Failure::Options(e.into()))?;
    if let Some(info) = cmd.info {
        println!("{}", info.text());
        return Ok(0);
    }
    let script_text = if cmd.wrap.is_some() {
        None
    } else if let Some(path) = &cmd.script_path {
        let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("Unable to open file {path}: {e}"))?;
        if meta.len() > MAX_SCRIPT_BYTES as u64 {
            return Err(Failure::Other(anyhow::anyhow!(
                "batch script {path} is {} bytes, over the {MAX_SCRIPT_BYTES}-byte limit",
                meta.len()
            )));
        }
        Some(std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("Unable to read file {path}: {e}"))?)
    } else {
        // Slurm reads the script from stdin when no file is named.
        let mut text = String::new();
        std::io::stdin().take(MAX_SCRIPT_BYTES as u64 + 1).read_to_string(&mut text)?;
        Some(text)
    };
    let cwd = std::env::current_dir()?.display().to_string();
    let ctx = crate::slurm::host::submit_context(cwd, std::env::vars().collect(), true);
    let parsed = build_spec(&cmd, script_text.as_deref(), &ctx).map_err(|e| Failure::Options(e.into()))?;
    // Slurm's -Q leaves only errors on stderr, and not even the job id on stdout.
    if !parsed.quiet {
        for warning in &parsed.warnings {
            eprintln!("sbatch: warning: {warning}");
        }
    }
    let job_id = crate::connect::submit(controllers.as_deref(), &parsed.spec)?;
    match (parsed.quiet, parsed.parsable) {
        (true, _) => {}
        (false, true) => println!("{job_id}"),
        (false, false) => println!("Submitted batch job {job_id}"),
    }
    if !parsed.wait {
        return Ok(0);
    }
    let tasks = parsed.spec.array.as_ref().map_or(1, |a| a.task_ids.len() as u64);
    Ok(wait_for_end(controllers.as_deref(), job_id, tasks)?)
}

/// How often `sbatch --wait` asks whether the job has ended (Slurm's polls, too, starting at 2 s).
const WAIT_POLL_MS: u64 = 500;

/// `--wait`: polls until the job (and every task of an array, whose ids follow the first) has ended; the exit
/// code is the highest task's, as Slurm's: the script's exit status, or 128 + the signal that ended it.
fn wait_for_end(controllers: Option<&str>, first: u64, tasks: u64) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    crate::connect::runtime().block_on(async {
        let mut code = 0;
        for id in first..first + tasks {
            loop {
                let (job, _) = client.get_job(id, false, false).await?;
                if job.state.is_terminal() {
                    let this = if job.exit_signal != 0 { 128 + job.exit_signal } else { job.exit_code };
                    code = code.max(this);
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(WAIT_POLL_MS)).await;
            }
        }
        Ok(code)
    })
}
