//! Real Slurm client libraries from PyPI, unmodified, against a local cluster through Slurm's command names.
//!
//! The submitit stories each run one scenario of `tests/compat/submitit_story.py` (submitit 1.5.4); the
//! snakemake stories run the workflow `tests/compat/snakemake/Snakefile` through snakemake's Slurm executor
//! plugin (snakemake 9.27.1, snakemake-executor-plugin-slurm 2.8.0, whose jobstep half runs each rule under
//! `srun` inside its job); the torchrun story runs `tests/compat/torchrun/launch.sh` with torch 2.5.1 in a
//! virtualenv of its own. Everything runs with the shims first on PATH. The libraries live in a virtual
//! environment under the test's target directory, created on first use with `pip install` (`.ci/run` installs
//! python3-venv; a machine without access to PyPI fails here, saying so).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Shell, drover_dir, setup};
use drover_cli::local::UpOptions;

/// The client libraries and the versions the stories were written against (snakemake's own dependencies are
/// left to pip; the two halves of its Slurm executor are pinned, since they are what talks to the shims).
const PACKAGES: &[&str] = &[
    "submitit==1.5.4",
    "snakemake==9.27.1",
    "snakemake-executor-plugin-slurm==2.8.0",
    "snakemake-executor-plugin-slurm-jobstep==0.6.1",
];

/// PyTorch for the `torchrun` story, in a virtual environment of its own: its wheels and their CUDA libraries
/// are about 3.5 GB, and CPU-only `gloo` is all the story needs (there are no GPUs here).
const TORCH_PACKAGES: &[&str] = &["torch==2.5.1", "numpy==2.1.3"];

/// A Python with `PACKAGES`, made once per target directory (several test processes may ask at once).
fn python() -> PathBuf {
    venv_python("compat-venv", PACKAGES)
}

/// A Python with `packages` in the virtual environment `name` under the target directory, made on first use
/// under a lock; a changed package list remakes it.
fn venv_python(name: &str, packages: &[&str]) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin/python");
    let marker = venv.join(format!("installed-{}", packages.join("-")));
    let lock = std::fs::File::create(Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.lock"))).unwrap();
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
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"])
                .args(packages),
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
        .env("PATH", shell_path(shell))
        .env_remove("SLURM_JOB_ID");
    let out = run_with_timeout(&mut command, Duration::from_secs(240));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        let logs = logs_of(&folder);
        panic!("submitit story {story} failed:\n{text}\n--- submitit's job logs ---\n{logs}");
    }
    text
}

/// The user's PATH: the shims first, then `drover` itself (jobs run `drover rendezvous`), then the system's.
fn shell_path(shell: &Shell) -> String {
    format!("{}:{}:/usr/bin:/bin", shell.bin.display(), drover_dir().display())
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

/// What a snakemake run printed and how it ended.
struct Snakemake {
    success: bool,
    text: String,
    /// The run's id: the name of every job it submits (`sacct --name` finds them, as the plugin does).
    run_id: String,
}

/// Runs snakemake on the story's Snakefile from the work directory, as the user would on a login node: its Slurm
/// executor, at most five jobs at once, and a first status check after a second (the plugin's default waits 40).
fn snakemake(shell: &Shell, extra: &[&str]) -> Snakemake {
    let snakefile = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/snakemake/Snakefile");
    let mut command = Command::new(python());
    command
        .args(["-m", "snakemake", "--snakefile"])
        .arg(&snakefile)
        .args(["--executor", "slurm", "--jobs", "5", "--slurm-init-seconds-before-status-checks", "1"])
        .args(extra)
        .current_dir(&shell.cwd)
        .env("DROVER_CONTROLLERS", &shell.controllers)
        .env("DROVER_CONFIG", &shell.config)
        .env("PATH", shell_path(shell))
        .env_remove("SLURM_JOB_ID");
    let started = std::time::Instant::now();
    let out = run_with_timeout(&mut command, Duration::from_secs(240));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("snakemake {extra:?} took {:.1} s:\n{text}", started.elapsed().as_secs_f64());
    let run_id = text
        .lines()
        .find_map(|l| l.strip_prefix("SLURM run ID: "))
        .unwrap_or_else(|| panic!("snakemake printed no run id:\n{text}"))
        .trim()
        .to_string();
    Snakemake { success: out.status.success(), text, run_id }
}

/// `sacct` rows of one snakemake run (its jobs are named after the run id), as field maps.
fn jobs_of_run(shell: &Shell, run_id: &str) -> Vec<std::collections::HashMap<String, String>> {
    const FIELDS: &str = "JobIDRaw,JobName,Comment,State,ExitCode,Account,Partition,ReqTRES,Timelimit,WCKey";
    let out = shell.ok("sacct", &["-X", "-P", "-n", "-S", "now-1hours", "--name", run_id, "--format", FIELDS]);
    out.lines()
        .map(|line| FIELDS.split(',').map(str::to_string).zip(line.split('|').map(str::to_string)).collect())
        .collect()
}

#[test]
fn snakemake_runs_a_workflow_through_its_slurm_executor() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, shell) = setup(dir.path(), options());
    // The account snakemake is told to charge; the plugin checks it with sacctmgr before it submits anything.
    let user = drover_cli::identity::current_user().0;
    shell.ok("drover", &["account", "add", "physics", "--users", &user]);
    let theirs = shell.ok("sacctmgr", &["-n", "-P", "-s", "list", "user", &user, "format=account"]);
    assert!(theirs.lines().any(|a| a == "physics"), "{theirs}");

    // No partition given: the plugin looks for sinfo's default one.
    let run = snakemake(&shell, &["--default-resources", "slurm_account=physics"]);
    assert!(run.success, "the workflow failed:\n{}", run.text);
    assert!(run.text.contains("7 of 7 steps (100%) done"), "{}", run.text);

    // The summary job checked the others' outputs; it wrote down which Drover job ran what.
    let summary = std::fs::read_to_string(shell.cwd.join("summary.txt")).unwrap();
    let ids = |tag: &str| -> Vec<String> {
        let line =
            summary.lines().find_map(|l| l.strip_prefix(&format!("{tag} "))).unwrap_or_else(|| panic!("{summary}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    let (squares, gpu, mine) = (ids("squares"), ids("gpu"), ids("summary"));
    assert_eq!(squares.len(), 4, "{summary}");
    assert!(gpu[1].starts_with("gpus=") && gpu[1].len() == "gpus=0".len(), "one GPU for the probe: {summary}");

    // Drover's record: the six jobs of the run, each named after it and commented with its rule, all COMPLETED
    // under the account and the default partition.
    let jobs = jobs_of_run(&shell, &run.run_id);
    assert_eq!(jobs.len(), 6, "{jobs:#?}");
    for job in &jobs {
        assert_eq!((job["State"].as_str(), job["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{job:?}");
        assert_eq!((job["Account"].as_str(), job["Partition"].as_str()), ("physics", "gpu"), "{job:?}");
        assert_eq!(job["Timelimit"], "00:05:00", "the rules' runtime=5: {job:?}");
        assert!(job["ReqTRES"].contains("mem=1G"), "the rules' mem_mb=1024: {job:?}");
    }
    let job =
        |comment: &str| jobs.iter().find(|j| j["Comment"] == comment).unwrap_or_else(|| panic!("{comment}: {jobs:#?}"));
    for (n, id) in squares.iter().enumerate() {
        assert_eq!(&job(&format!("rule_square_wildcards_{}", n + 1))["JobIDRaw"], id, "{summary}");
    }
    let probe = job("rule_gpu_probe");
    assert_eq!(probe["JobIDRaw"], gpu[0]);
    assert!(probe["ReqTRES"].contains("cpu=2") && probe["ReqTRES"].contains("gres/gpu=1"), "{probe:?}");
    assert_eq!(probe["WCKey"], "probe", "slurm_extra reaches sbatch: {probe:?}");
    assert_eq!(job("rule_summary")["JobIDRaw"], mine[0]);
}

#[test]
fn snakemake_sees_a_failing_rule_fail_and_keeps_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, shell) = setup(dir.path(), options());
    // No account given: the plugin tries to guess one and goes on without.
    let run = snakemake(&shell, &["--default-resources", "slurm_partition=gpu", "--", "broken.txt"]);
    assert!(!run.success, "the broken rule should fail the run:\n{}", run.text);
    assert!(run.text.contains("Error in rule broken"), "{}", run.text);
    assert!(run.text.contains("SLURM status is: 'FAILED'"), "snakemake read the failure from sacct:\n{}", run.text);

    let jobs = jobs_of_run(&shell, &run.run_id);
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    let job = &jobs[0];
    assert_eq!((job["Comment"].as_str(), job["State"].as_str()), ("rule_broken", "FAILED"), "{job:?}");
    assert_ne!(job["ExitCode"], "0:0", "{job:?}");
    // The plugin keeps a failed job's log: the file Drover wrote for --output, holding what the rule said
    // through the jobstep's srun.
    let log = shell.cwd.join(format!(".snakemake/slurm_logs/rule_broken/{}.log", job["JobIDRaw"]));
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}\n{}", log.display(), run.text));
    assert!(text.contains("broken: about to fail"), "{text}");
}

/// A multi-node `torchrun` launch script as users write it for Slurm, run unmodified by sbatch: the head node
/// from `scontrol show hostnames`, its address from a one-task `srun -w`, then one `torchrun` per node under
/// `srun`, meeting through the c10d rendezvous. The training script (`tests/compat/torchrun/train.py`) checks
/// what torchrun gave each of the 4 ranks, all-reduces across both nodes with gloo, and takes one DDP step.
#[test]
fn an_unmodified_multi_node_torchrun_script_trains_across_two_nodes() {
    let python = venv_python("compat-torch-venv", TORCH_PACKAGES);
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, shell) = setup(dir.path(), options());
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/torchrun");
    for file in ["launch.sh", "train.py"] {
        std::fs::copy(here.join(file), shell.cwd.join(file)).unwrap();
    }
    // The job finds torchrun and python on its PATH, as a user's activated environment puts them there.
    let venv_bin = python.parent().unwrap().display().to_string();
    let path = format!("{venv_bin}:{}", shell_path(&shell));
    let out = shell.command("sbatch", &["--parsable", "launch.sh"]).env("PATH", &path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id: u64 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let state = loop {
        let state = shell.ok("sacct", &["-X", "-n", "-P", "-j", &id.to_string(), "-o", "State"]).trim().to_string();
        if !["PENDING", "RUNNING", ""].contains(&state.as_str()) || std::time::Instant::now() > deadline {
            break state;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let log = std::fs::read_to_string(shell.cwd.join(format!("ddp-{id}.out"))).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "the launch script's log:\n{log}");
    let ranks: Vec<&str> = log.lines().filter(|l| l.starts_with("rank ")).collect();
    assert_eq!(ranks.len(), 4, "{log}");
    for rank in 0..4 {
        let line = ranks.iter().find(|l| l.starts_with(&format!("rank {rank}/4 "))).unwrap_or_else(|| panic!("{log}"));
        assert!(line.contains(&format!("local {} ", rank % 2)) && line.ends_with("sum 6 ddp ok"), "{line}");
    }
    // Each node ran one torchrun (one srun task per node), each with two workers.
    let nodes: std::collections::BTreeSet<&str> =
        ranks.iter().filter_map(|l| l.split(" node ").nth(1)?.split(' ').next()).collect();
    assert_eq!(nodes.into_iter().collect::<Vec<_>>(), ["node01", "node02"], "{log}");
}
