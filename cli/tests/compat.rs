//! Real Slurm client libraries from PyPI, unmodified, against a local cluster through Slurm's command names.
//!
//! Each story runs one scenario of `tests/compat/submitit_story.py` (submitit 1.5.4) with the shims first on
//! PATH. The libraries live in a virtual environment under the test's target directory, created on first use
//! with `pip install` (`.ci/run` installs python3-venv; a machine without access to PyPI fails here, saying so).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Shell, drover_dir, setup};
use drover_cli::local::UpOptions;

/// The client libraries and the versions the stories were written against.
const PACKAGES: &[&str] = &["submitit==1.5.4"];

/// A Python with `PACKAGES`, made once per target directory (several test processes may ask at once).
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compat-venv");
    let python = venv.join("bin/python");
    let marker = venv.join(format!("installed-{}", PACKAGES.join("-")));
    let lock = std::fs::File::create(Path::new(env!("CARGO_TARGET_TMPDIR")).join("compat-venv.lock")).unwrap();
    // SAFETY: flock(2) on a descriptor we own; released when `lock` is dropped.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    if !marker.exists() {
        let run = |cmd: &mut Command, what: &str| {
            let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                out.status.success(),
                "{what} failed (the compatibility stories need python3-venv and access to PyPI):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv), "python3 -m venv");
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(PACKAGES),
            "pip install",
        );
        std::fs::write(&marker, "").unwrap();
    }
    python
}

fn options() -> UpOptions {
    UpOptions { agents: 2, gpus_per_agent: 4, kill_wait_ms: 2_000, ..UpOptions::default() }
}

/// Runs one story of the submitit script as the user would: the shims first on PATH, from the work directory.
fn submitit(shell: &Shell, story: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/submitit_story.py");
    let folder = shell.cwd.join(format!("submitit-{story}"));
    let mut command = Command::new(python());
    command
        .arg(&script)
        .arg(story)
        .arg(&folder)
        .current_dir(&shell.cwd)
        .env("DROVER_CONTROLLERS", &shell.controllers)
        .env("DROVER_CONFIG", &shell.config)
        .env("PATH", format!("{}:{}:/usr/bin:/bin", shell.bin.display(), drover_dir().display()))
        .env_remove("SLURM_JOB_ID");
    let out = run_with_timeout(&mut command, Duration::from_secs(240));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        let logs = logs_of(&folder);
        panic!("submitit story {story} failed:\n{text}\n--- submitit's job logs ---\n{logs}");
    }
    text
}

/// The job logs submitit wrote (its own view of what went wrong inside the jobs).
fn logs_of(folder: &Path) -> String {
    let mut logs = String::new();
    for entry in std::fs::read_dir(folder).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "out" || e == "err") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            logs.push_str(&format!(
                "== {}\n{}\n",
                path.display(),
                text.chars().rev().take(3_000).collect::<String>().chars().rev().collect::<String>()
            ));
        }
    }
    logs
}

/// Runs `command` to its end, killing it after `limit`; its output is read as it comes, so a chatty story never
/// blocks on a full pipe.
fn run_with_timeout(command: &mut Command, limit: Duration) -> std::process::Output {
    use std::io::Read;
    let mut child = command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            // Not yet reaped (try_wait said so), so the pid is still this child's.
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// One story on a fresh cluster: the directory outlives the cluster (declared first, dropped last).
macro_rules! story {
    ($name:expr) => {{
        let dir = tempfile::tempdir().unwrap();
        let (_cluster, shell) = setup(dir.path(), options());
        let text = submitit(&shell, $name);
        eprintln!("{text}");
        text
    }};
}

#[test]
fn submitit_runs_a_function_and_returns_its_result() {
    let text = story!("function");
    assert!(text.contains("returned 1024"), "{text}");
}

#[test]
fn submitit_runs_an_array_of_8_two_at_a_time() {
    let text = story!("array");
    assert!(text.contains("array: 8 tasks"), "{text}");
}

#[test]
fn submitit_runs_a_multi_task_job_that_reads_its_job_environment() {
    let text = story!("multitask");
    assert!(text.contains("ranks and nodes right"), "{text}");
}

#[test]
fn submitit_cancels_a_running_job() {
    let text = story!("cancel");
    assert!(text.contains("CANCELLED"), "{text}");
}

#[test]
fn submitit_checkpoints_on_preemption_requeues_and_resumes() {
    let text = story!("preempt");
    assert!(text.contains("resumed, finished"), "{text}");
}
