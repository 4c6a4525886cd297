//! `sbatch`: submits a batch script (a file, stdin, or `--wrap`).

use std::io::Read;

use crate::identity::current_user;
use crate::sbatch_args::{MAX_SCRIPT_BYTES, SubmitContext, build_spec, parse_command_line};

/// Runs `sbatch ARGS...` and returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    match submit(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sbatch: error: {e}");
            1
        }
    }
}

fn submit(args: &[String]) -> anyhow::Result<()> {
    let (controllers, args) = take_controllers_flag(args);
    let cmd = parse_command_line(&args)?;
    let script_text = if cmd.wrap.is_some() {
        None
    } else if let Some(path) = &cmd.script_path {
        let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("Unable to open file {path}: {e}"))?;
        if meta.len() > MAX_SCRIPT_BYTES as u64 {
            anyhow::bail!("batch script {path} is {} bytes, over the {MAX_SCRIPT_BYTES}-byte limit", meta.len());
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
    let ctx = SubmitContext { user, uid, gid, cwd, env: std::env::vars().collect() };
    let parsed = build_spec(&cmd, script_text.as_deref(), &ctx)?;
    let client = crate::connect::client(controllers.as_deref())?;
    let job_id = crate::connect::runtime().block_on(client.submit(&parsed.spec))?;
    if parsed.parsable {
        println!("{job_id}");
    } else {
        println!("Submitted batch job {job_id}");
    }
    Ok(())
}

/// `--controllers=LIST` is Drover's own flag; accepted only before Slurm's options (leading), so it can never be
/// mistaken for a script argument.
pub fn take_controllers_flag(args: &[String]) -> (Option<String>, Vec<String>) {
    let mut controllers = None;
    let mut rest = args;
    while let Some(v) = rest.first().and_then(|a| a.strip_prefix("--controllers=")) {
        controllers = Some(v.to_string());
        rest = &rest[1..];
    }
    (controllers, rest.to_vec())
}
