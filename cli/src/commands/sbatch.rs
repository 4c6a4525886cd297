//! `sbatch`: submits a batch script (a file, stdin, or `--wrap`).

use std::io::Read;

use crate::command::take_controllers_flag;
use crate::identity::current_user;
use crate::sbatch_args::{MAX_SCRIPT_BYTES, SubmitContext, build_spec, parse_command_line};
use crate::slurm::time::local_clock;

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
        Ok(()) => 0,
        Err(Failure::Options(e)) => {
            eprintln!("sbatch: error: {e}");
            255
        }
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

fn submit(args: &[String]) -> Result<(), Failure> {
    let (controllers, args) = take_controllers_flag(args);
    let cmd = parse_command_line(&args).map_err(|e| Failure::Options(e.into()))?;
    if let Some(info) = cmd.info {
        println!("{}", info.text());
        return Ok(());
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
    let (user, uid, gid) = current_user();
    let cwd = std::env::current_dir()?.display().to_string();
    let (now_ms, utc_offset_s) = local_clock();
    let env = std::env::vars().collect();
    let ctx = SubmitContext { user, uid, gid, cwd, env, now_ms, utc_offset_s, sbatch_env: true };
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
    Ok(())
}
