//! A hostile tenant on a real local cluster: an ordinary user, Alice (uid 60001), attacks the node through her own
//! jobs, and a second tenant, Mallory (uid 60002), with a shell on the same node, goes after Alice's. Each story is
//! one attack, told in its doc comment, and asserts that nothing outside the job changed: root's files, the
//! agent's own directories, the next job's GPU, the other tenant's tasks. `agent/tests/hostile_tenant.rs` holds
//! the same attacks against a single supervisor; these go through `sbatch`, the controllers and a real agent.
//!
//! Three stories found holes, fixed in the agent: a step's output that a finished task left behind was read into
//! the agent's memory whole (`steps::follow` now reads a bounded share per poll), an output file that is a FIFO
//! nobody reads hung the job's supervisor for ever (`supervise::open_output` no longer blocks), and a step's output
//! streamed back to `srun` could fill the agent's state disk (it now flows through a pipe, and the writer waits).
//!
//! The uids need no passwd entry, but switching to them needs root (CI runs as root): without it every story says
//! SKIPPED.

use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use drover_cli::local::{LocalCluster, Process, UpOptions};

mod common;

use common::{Shell, setup};

/// The tenant whose jobs attack the node.
const ALICE: u32 = 60_001;
/// Another tenant with a shell on the same node.
const MALLORY: u32 = 60_002;
/// What root's file holds before (and, every story asserts, after) each attack.
const PRECIOUS: &str = "root:x:0:0:root:/root:/bin/bash\n";
/// What root's private directory holds: a secret no tenant may read, in the shape of a checkpoint marker.
const SECRET_MARKER: &str = "/stolen-secret 7\n";
/// Patience for a job to reach a state: the stories run beside other test clusters on a small machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: this story runs jobs and commands as other uids, which needs root (CI runs as root)");
            return;
        }
    };
}

/// A one-node cluster (one controller, `gpus` simulated GPUs) whose work directory every tenant may write, as a
/// shared scratch file system is.
fn node(dir: &Path, gpus: u32) -> (LocalCluster, Shell) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    let options =
        UpOptions { controllers: 1, agents: 1, gpus_per_agent: gpus, kill_wait_ms: 1_000, ..UpOptions::default() };
    let (cluster, sh) = setup(dir, options);
    fs::set_permissions(&sh.cwd, fs::Permissions::from_mode(0o777)).unwrap();
    (cluster, sh)
}

/// What these stories ask of a shell beyond running commands.
impl Shell {
    /// A Slurm command run as `uid` (the kernel's word: the process really runs as that uid), with a secret in its
    /// environment that `sbatch` exports into the job.
    fn run_as(&self, uid: u32, name: &str, args: &[&str]) -> Output {
        self.command(name, args).env("ALICE_SECRET", "hunter2").uid(uid).gid(uid).output().expect("command runs")
    }

    /// `sbatch --parsable ...` as `uid`: the new job's id.
    fn submit_as(&self, uid: u32, args: &[&str]) -> u64 {
        let mut all = vec!["--parsable"];
        all.extend_from_slice(args);
        let out = self.run_as(uid, "sbatch", &all);
        assert!(out.status.success(), "uid {uid}: sbatch {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("a job id")
    }

    /// `sacct -P` fields of one job.
    fn acct(&self, id: u64, fields: &str) -> Vec<String> {
        let out = self.ok("sacct", &["-X", "-j", &id.to_string(), "-n", "-P", "-o", fields]);
        out.trim().split('|').map(str::to_string).collect()
    }

    /// The same shell (to give it another working directory).
    fn clone_shell(&self) -> Shell {
        Shell {
            bin: self.bin.clone(),
            controllers: self.controllers.clone(),
            config: self.config.clone(),
            cwd: self.cwd.clone(),
        }
    }

    fn state(&self, id: u64) -> String {
        self.acct(id, "State").remove(0)
    }

    /// Waits until the job reaches a state that is not PENDING/RUNNING/COMPLETING, and returns it.
    fn wait_done(&self, id: u64) -> String {
        let start = Instant::now();
        loop {
            let state = self.state(id);
            if !["PENDING", "RUNNING", "COMPLETING", "REQUEUED", ""].contains(&state.as_str()) {
                return state;
            }
            assert!(start.elapsed() < PATIENCE, "job {id} still {state} after {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_state(&self, id: u64, want: &str) {
        wait_for(&format!("job {id} {want}"), || self.state(id) == want);
    }

    /// A file the job wrote in the work directory, once it is there and not empty.
    fn wait_file(&self, name: &str) -> String {
        let path = self.cwd.join(name);
        wait_for(&format!("{}", path.display()), || fs::metadata(&path).is_ok_and(|m| m.len() > 0));
        // The writer may still be finishing its line.
        std::thread::sleep(Duration::from_millis(50));
        fs::read_to_string(&path).unwrap()
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "{what} did not happen within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `sh -c script` as `uid` in `cwd`: what a tenant types in a shell on the node.
fn as_user(uid: u32, cwd: &Path, script: &str) -> Output {
    Command::new("/bin/sh").arg("-c").arg(script).current_dir(cwd).uid(uid).gid(uid).output().unwrap()
}

/// A root-owned file, readable by all, outside every job's directories: the target of the attacks.
fn precious(dir: &Path) -> PathBuf {
    let path = dir.join("precious");
    fs::write(&path, PRECIOUS).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn assert_untouched(path: &Path) {
    let meta = fs::symlink_metadata(path).unwrap();
    assert!(meta.is_file() && meta.uid() == 0, "{} is no longer root's plain file", path.display());
    assert_eq!(fs::read_to_string(path).unwrap(), PRECIOUS, "{} changed", path.display());
}

/// A directory only root may enter, holding a secret shaped like a checkpoint marker (`LATEST`).
fn vault(dir: &Path) -> PathBuf {
    let path = dir.join("vault");
    fs::create_dir(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(path.join("LATEST"), SECRET_MARKER).unwrap();
    fs::set_permissions(path.join("LATEST"), fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The vault holds exactly what [`vault`] put there, still root's.
fn assert_vault_untouched(vault: &Path) {
    let meta = fs::symlink_metadata(vault).unwrap();
    assert!(meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o777 == 0o700, "the vault itself changed");
    let names: Vec<String> =
        fs::read_dir(vault).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["LATEST"], "something was written into or deleted from the vault");
    let latest = vault.join("LATEST");
    assert_eq!(fs::metadata(&latest).unwrap().uid(), 0);
    assert_eq!(fs::read_to_string(latest).unwrap(), SECRET_MARKER, "the vault's file changed");
}

/// Whether process `pid` lives (a zombie does not).
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !matches!(stat.rsplit(')').next().and_then(|r| r.trim_start().chars().next()), Some('Z' | 'X')))
        .unwrap_or(false)
}

/// Field `n` (1-based, as proc(5) counts) of `/proc/PID/stat`.
fn stat_field(pid: u32, n: usize) -> String {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit(')').next().unwrap().split_whitespace().nth(n - 3).unwrap().to_string()
}

fn agent(cluster: &LocalCluster) -> &Process {
    cluster.processes.iter().find(|p| p.role == "agent").expect("the cluster has an agent")
}

/// The agent's directory of task directories (`ID.INCARNATION.batch`, `ID.INCARNATION.STEP.RANK`).
fn tasks_dir(cluster: &LocalCluster) -> PathBuf {
    agent(cluster).data_dir.join("tasks")
}

/// The names in the agent's task directory that belong to job `id`.
fn task_dirs_of(cluster: &LocalCluster, id: u64) -> Vec<String> {
    let prefix = format!("{id}.");
    fs::read_dir(tasks_dir(cluster))
        .map(|entries| {
            entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect()
        })
        .unwrap_or_default()
}

/// `(pid, pgid)` of a task's main process, from its supervisor's `task.pid`.
fn task_pid(task_dir: &Path) -> (u32, u32) {
    let path = task_dir.join("task.pid");
    wait_for(&format!("{}", path.display()), || path.exists());
    let text = fs::read_to_string(path).unwrap();
    let numbers: Vec<u32> = text.split_whitespace().map(|w| w.parse().unwrap()).collect();
    (numbers[0], numbers[1])
}

/// A process's peak resident memory in KiB (`VmHWM`).
fn peak_rss_kb(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Alice's batch script starts a daemon the classic way: `setsid` gives it a session and process group of its own,
/// and the shell in between exits, so init (here: the nearest subreaper) adopts it. A signal to the job's process
/// group misses it, and it ignores SIGTERM anyway. It keeps the job's environment, so it holds the job's GPU (a
/// simulated GPU is held by any process with the node's mark and `CUDA_VISIBLE_DEVICES`).
///
/// First the script simply exits: the daemon must be dead by the time the job is COMPLETED. Then a job that does
/// the same is cancelled while the next job waits for the node's only GPU: the daemon must die, and the next job
/// must not start while it lives.
#[test]
fn a_daemon_that_escapes_its_jobs_session_dies_with_the_job_and_keeps_no_gpu() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = node(dir.path(), 1);
    let escape = |name: &str| {
        format!(
            "setsid sh -c 'trap \"\" TERM HUP INT; sleep 300 & echo $! > {name}.pid'; \
             while [ ! -s {name}.pid ]; do sleep 0.05; done"
        )
    };

    // The script escapes, then waits for the test's word to exit normally.
    let script = format!("{}; while [ ! -e release ]; do sleep 0.05; done", escape("first"));
    let first = sh.submit_as(ALICE, &["--gres=gpu:1", "-o", "first.out", "--wrap", &script]);
    let daemon: u32 = sh.wait_file("first.pid").trim().parse().unwrap();
    let (_, job_pgid) = task_pid(&tasks_dir(&cluster).join(format!("{first}.0.batch")));
    // It really escaped: its own session and group, Alice's, holding the job's GPU.
    assert!(alive(daemon), "the daemon never ran");
    assert_ne!(stat_field(daemon, 5), job_pgid.to_string(), "the daemon is still in the job's process group");
    assert_ne!(stat_field(daemon, 6), job_pgid.to_string(), "the daemon is still in the job's session");
    assert_eq!(fs::metadata(format!("/proc/{daemon}")).unwrap().uid(), ALICE);
    let environ = fs::read(format!("/proc/{daemon}/environ")).unwrap();
    let environ: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
    assert!(environ.contains(&&b"CUDA_VISIBLE_DEVICES=0"[..]), "the daemon holds the job's GPU");
    assert!(environ.iter().any(|v| v.starts_with(b"DROVER_SIMULATED_NODE=")), "and carries the node's mark");
    fs::write(sh.cwd.join("release"), "").unwrap();
    assert_eq!(sh.wait_done(first), "COMPLETED");
    assert!(!alive(daemon), "the daemon {daemon} outlived its job {first}");

    // The same escape in a job that is cancelled, with the next job waiting for the GPU.
    let script = format!("trap '' TERM; {}; sleep 300", escape("second"));
    let second = sh.submit_as(ALICE, &["--gres=gpu:1", "-o", "second.out", "--wrap", &script]);
    let daemon: u32 = sh.wait_file("second.pid").trim().parse().unwrap();
    assert!(alive(daemon), "the second daemon never ran");
    let next = sh.submit_as(ALICE, &["--gres=gpu:1", "-o", "next.out", "--wrap", "echo got gpu $CUDA_VISIBLE_DEVICES"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sh.state(next), "PENDING", "the GPU is taken");
    sh.ok("scancel", &[&second.to_string()]);
    let start = Instant::now();
    loop {
        let state = sh.state(next);
        if state != "PENDING" {
            assert!(!alive(daemon), "job {next} is {state} while the escaped daemon {daemon} still holds its GPU");
            break;
        }
        assert!(start.elapsed() < PATIENCE, "job {next} never got the GPU");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(daemon), "the daemon {daemon} outlived its cancelled job {second}");
    assert_eq!(sh.wait_done(next), "COMPLETED");
    assert_eq!(sh.wait_file("next.out").trim(), "got gpu 0");
}

/// Alice points the files root might write for her job at root's files: her `-o` and `-e` files are symbolic links
/// to a root-owned file, and her `--chdir` is a link to a directory only root may enter. The node opens output files
/// and enters the working directory with her rights, never root's: the jobs fail, root's file is unchanged, and
/// nothing appears in root's directory.
#[test]
fn output_files_and_a_working_directory_that_link_to_roots_files_get_the_job_nothing() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = node(dir.path(), 1);
    let target = precious(dir.path());
    let vault = vault(dir.path());
    let planted = as_user(
        ALICE,
        &sh.cwd,
        &format!("ln -s {t} out.txt && ln -s {t} err.txt && ln -s {v} jail", t = target.display(), v = vault.display()),
    );
    assert!(planted.status.success(), "{}", String::from_utf8_lossy(&planted.stderr));

    let id = sh.submit_as(ALICE, &["-o", "out.txt", "-e", "err.txt", "--wrap", "echo pwned; echo pwned >&2"]);
    assert_eq!(sh.wait_done(id), "FAILED");
    assert_untouched(&target);

    // A working directory she may not enter: the job fails there, and says so in an output file she may write.
    let jail = sh.cwd.join("jail").display().to_string();
    let report = sh.cwd.join("chdir.out").display().to_string();
    let id = sh.submit_as(ALICE, &["-D", &jail, "-o", &report, "--wrap", "echo pwned > note; echo pwned"]);
    assert_eq!(sh.wait_done(id), "FAILED");
    let said = fs::read_to_string(&report).unwrap();
    assert!(said.contains("couldn't chdir") && said.contains("Permission denied"), "{said}");
    // And with the default output file, which would be created inside root's directory.
    let id = sh.submit_as(ALICE, &["-D", &jail, "--wrap", "echo pwned > note; echo pwned"]);
    assert_eq!(sh.wait_done(id), "FAILED");
    assert_vault_untouched(&vault);
    assert_untouched(&target);
}

/// The agent reads a job's checkpoint marker (`$DROVER_CHECKPOINT_DIR/LATEST`) as root and publishes the path it
/// names in the job's record, where `sacct` shows it. Alice's job makes the marker a link to a root-owned file,
/// plants a link as the next incarnation's checkpoint directory pointing at a directory only root may read (whose
/// `LATEST` holds a secret), and is requeued into it. Nothing root-owned is accepted as a marker, so no checkpoint
/// is recorded and the secret never reaches her; root's file and directory are unchanged.
#[test]
fn a_checkpoint_marker_or_directory_that_links_to_roots_files_is_not_followed() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = node(dir.path(), 1);
    let target = precious(dir.path());
    let vault = vault(dir.path());
    let script = format!(
        r#"#!/bin/sh
set -e
if [ "$DROVER_INCARNATION" = 0 ]; then
  ln -s {target} "$DROVER_CHECKPOINT_DIR/LATEST"
  ln -s {vault} "$(dirname "$DROVER_CHECKPOINT_DIR")/1"
  echo "$DROVER_CHECKPOINT_DIR" > planted.txt
else
  echo "$DROVER_CHECKPOINT_DIR" > requeued.txt
fi
sleep 300
"#,
        target = target.display(),
        vault = vault.display(),
    );
    fs::write(sh.cwd.join("ckpt.sh"), script).unwrap();
    let id = sh.submit_as(ALICE, &["-o", "ckpt.out", "ckpt.sh"]);
    let checkpoint_dir = sh.wait_file("planted.txt");
    // The agent looks at the marker once a second: give it three looks.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sh.acct(id, "Checkpoint,CheckpointStep"), ["", ""], "a link to root's file was taken as a marker");
    assert_untouched(&target);

    sh.ok("scontrol", &["requeue", &id.to_string()]);
    let requeued = sh.wait_file("requeued.txt");
    assert!(requeued.trim().ends_with(&format!("/{id}/1")), "{requeued}");
    let next_dir = Path::new(requeued.trim());
    assert!(fs::symlink_metadata(next_dir).unwrap().file_type().is_symlink(), "the planted link was the directory");
    std::thread::sleep(Duration::from_secs(3));
    let recorded = sh.acct(id, "Checkpoint,CheckpointStep");
    assert_eq!(recorded, ["", ""], "root's LATEST in the linked directory was taken as the job's marker");
    // The agent did look, and refused.
    let log = fs::read_to_string(&agent(&cluster).log_file).unwrap();
    assert!(log.contains("ignoring the checkpoint marker"), "the agent never read the planted marker:\n{log}");
    sh.ok("scancel", &[&id.to_string()]);
    assert_eq!(sh.wait_done(id), "CANCELLED by 0");
    let shown = sh.ok("scontrol", &["show", "job", &id.to_string()]);
    assert!(!shown.contains("stolen-secret"), "the secret was published: {shown}");
    assert!(checkpoint_dir.trim().ends_with(&format!("/{id}/0")), "{checkpoint_dir}");
    assert_untouched(&target);
    assert_vault_untouched(&vault);
}

/// The job's own directory on the node (`tasks/ID.0.batch/work`, found through `$0`; a step's through its stdout
/// file) is Alice's, and root removes it when the job is over. Her job fills it with links to root's file and
/// directory, one a level down, and replaces the step's stdout file, which the agent reads as root to stream it
/// back to `srun`, with a link to root's secret. The agent streams nothing through the link, and its clean-up
/// removes the links, not what they point to.
#[test]
fn links_in_a_jobs_own_task_directory_lead_root_nowhere() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = node(dir.path(), 1);
    let target = precious(dir.path());
    let vault = vault(dir.path());
    let (t, v) = (target.display(), vault.display());
    let script = format!(
        r#"#!/bin/sh
set -e
w=$(dirname "$0")
ln -s {v} "$w/vault"; ln -s {t} "$w/precious"; mkdir "$w/deep"; ln -s {v} "$w/deep/vault"
srun sh -ec 'w=$(dirname "$(readlink /proc/$$/fd/1)"); rm "$w/stdout"; ln -s {v}/LATEST "$w/stdout"; ln -s {v} "$w/vault"; echo "$w" > step.dir; sleep 1; echo after' > step.out
echo "batch $w"
"#
    );
    fs::write(sh.cwd.join("links.sh"), script).unwrap();
    let id = sh.submit_as(ALICE, &["-o", "links.out", "links.sh"]);
    assert_eq!(sh.wait_done(id), "COMPLETED", "{}", fs::read_to_string(sh.cwd.join("links.out")).unwrap_or_default());
    let out = fs::read_to_string(sh.cwd.join("links.out")).unwrap();
    let work = out.lines().find_map(|l| l.strip_prefix("batch ")).expect("the script names its directory");
    assert!(Path::new(work).starts_with(tasks_dir(&cluster)), "{work}");
    let step_dir = fs::read_to_string(sh.cwd.join("step.dir")).unwrap();
    assert!(Path::new(step_dir.trim()).starts_with(tasks_dir(&cluster)), "{step_dir}");
    let step = fs::read_to_string(sh.cwd.join("step.out")).unwrap();
    assert!(!step.contains("stolen-secret"), "the agent streamed root's secret to the job: {step:?}");
    // The agent removes the job's task directories once the job is over.
    wait_for("the clean-up of the job's task directories", || task_dirs_of(&cluster, id).is_empty());
    assert_untouched(&target);
    assert_vault_untouched(&vault);
}

/// Alice floods stdout: her batch script writes hundreds of megabytes as fast as it can, straight into her output
/// file, and a step does the same through the agent, which streams a step's output back to `srun`. Meanwhile
/// another job runs and the cluster answers `sinfo` and `squeue`; every byte ends in her file and only there (not
/// in the agent's log), and the agent does not hold the flood in memory.
#[test]
fn a_job_flooding_stdout_fills_only_its_own_file_and_the_agent_keeps_working() {
    needs_root!();
    const BATCH_BYTES: u64 = 200_000_000;
    const STEP_BYTES: u64 = 100_000_000;
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = node(dir.path(), 1);
    let agent_pid = agent(&cluster).pid.expect("the agent runs");
    let peak_before = peak_rss_kb(agent_pid);
    let script = format!("yes | head -c {BATCH_BYTES}; srun sh -c 'yes | head -c {STEP_BYTES}'; touch flood.done");
    let started = Instant::now();
    let flood = sh.submit_as(ALICE, &["-o", "flood.out", "--wrap", &script]);
    sh.wait_state(flood, "RUNNING");

    let other = sh.submit_as(ALICE, &["-o", "other.out", "--wrap", "echo other done"]);
    assert_eq!(sh.wait_done(other), "COMPLETED");
    assert_eq!(sh.wait_file("other.out"), "other done\n");
    assert!(sh.ok("sinfo", &["-N", "-h", "-o", "%N %t"]).contains("node01"));
    assert!(sh.ok("squeue", &["-h", "-o", "%i"]).lines().any(|l| l.trim() == flood.to_string()));

    assert_eq!(sh.wait_done(flood), "COMPLETED");
    eprintln!("the flood of {} MB took {:?}", (BATCH_BYTES + STEP_BYTES) / 1_000_000, started.elapsed());
    assert!(sh.cwd.join("flood.done").exists(), "the step ran to its end");
    let size = fs::metadata(sh.cwd.join("flood.out")).unwrap().len();
    assert_eq!(size, BATCH_BYTES + STEP_BYTES, "every byte in the tenant's file, once");
    let log = fs::read(&agent(&cluster).log_file).unwrap();
    assert!(log.len() < 1 << 20, "the agent's log grew to {} bytes", log.len());
    assert!(!log.windows(8).any(|w| w == b"y\ny\ny\ny\n"), "the flood reached the agent's log");
    let grown_mb = peak_rss_kb(agent_pid).saturating_sub(peak_before) / 1024;
    eprintln!("the agent's peak memory grew by {grown_mb} MiB");
    assert!(grown_mb < 64, "the agent held the step's flood in memory: its peak grew by {grown_mb} MiB");
}

/// A small file system, mounted for the story and unmounted (lazily: the cluster's processes may still sit in it)
/// when it ends.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(path: &Path, size: &str) -> Result<SmallDisk, String> {
        fs::create_dir_all(path).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0777"), "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(SmallDisk(path.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Alice submits from a directory on a small disk (an 8 MiB tmpfs) and her job writes until the disk is full. The
/// job ends (FAILED: its writer got ENOSPC), and the node is none the worse: the agent lives and the next job, from
/// a directory with room, completes.
#[test]
fn a_job_that_fills_its_disk_fails_alone_and_the_node_keeps_working() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = node(dir.path(), 1);
    let small = match SmallDisk::mount(&dir.path().join("small"), "8m") {
        Ok(small) => small,
        Err(why) => return eprintln!("SKIPPED: cannot mount an 8 MiB tmpfs to fill ({why})"),
    };
    let full = Shell {
        bin: sh.bin.clone(),
        controllers: sh.controllers.clone(),
        config: sh.config.clone(),
        cwd: small.0.clone(),
    };
    let id = full.submit_as(ALICE, &["-o", "fill.out", "--wrap", "echo filling; yes > fill.bin"]);
    assert_eq!(full.wait_done(id), "FAILED");
    assert_eq!(full.acct(id, "ExitCode")[0], "1:0", "the writer failed for want of space");
    let written = fs::metadata(small.0.join("fill.bin")).unwrap().len();
    assert!(written > 4 << 20, "the disk was filled: {written} bytes");
    let out = fs::read_to_string(small.0.join("fill.out")).unwrap();
    assert!(out.starts_with("filling"), "{out}");

    assert!(alive(agent(&cluster).pid.unwrap()), "the agent died");
    let next = sh.submit_as(ALICE, &["-o", "after.out", "--wrap", "echo still working"]);
    assert_eq!(sh.wait_done(next), "COMPLETED");
    assert_eq!(sh.wait_file("after.out"), "still working\n");
    wait_for("node01 idle", || sh.ok("sinfo", &["-N", "-h", "-o", "%N %t"]).trim() == "node01 idle");
    drop(small);
}

/// Mallory has a shell on the node where Alice's job runs. She goes looking for Alice's script, her step's output
/// and the environment her job was launched with (it holds Alice's `ALICE_SECRET`) in the agent's task
/// directories and in `/proc`, and tries to signal Alice's tasks and their root supervisors. All of it is refused,
/// and Alice's job runs on.
#[test]
fn another_tenant_on_the_node_can_neither_read_nor_signal_a_jobs_tasks() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = node(dir.path(), 1);
    let script = "#!/bin/sh\n# alice-secret-script\nsrun sh -c 'echo alice-secret-output; echo started > step.started; sleep 300'\n";
    fs::write(sh.cwd.join("alice.sh"), script).unwrap();
    let id = sh.submit_as(ALICE, &["-o", "alice.out", "alice.sh"]);
    sh.wait_file("step.started");
    let tasks = tasks_dir(&cluster);
    let batch = tasks.join(format!("{id}.0.batch"));
    let step = tasks.join(format!("{id}.0.0.0"));
    let (batch_pid, _) = task_pid(&batch);
    let (step_pid, _) = task_pid(&step);
    let supervisor: u32 =
        fs::read_to_string(batch.join("supervisor.pid")).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    // What there is to find (root sees it), so that the refusals below mean something. The step's output is not
    // kept on the node: it flows through a pipe (Alice's, mode 0600) that the agent reads for srun.
    let secrets = [
        (batch.join("work/script"), "alice-secret-script"),
        (step.join("work/stdout"), "alice-secret-output"),
        (batch.join("launch.json"), "hunter2"),
        (PathBuf::from(format!("/proc/{batch_pid}/environ")), "hunter2"),
        (PathBuf::from(format!("/proc/{step_pid}/environ")), "hunter2"),
    ];
    for (path, secret) in &secrets {
        let meta = fs::symlink_metadata(path).unwrap();
        if std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()) {
            assert_eq!((meta.uid(), meta.mode() & 0o777), (ALICE, 0o600), "{}", path.display());
            continue;
        }
        let text = String::from_utf8_lossy(&fs::read(path).unwrap()).into_owned();
        assert!(text.contains(secret), "{} does not hold {secret}", path.display());
    }
    assert!(sh.wait_file("alice.out").contains("alice-secret-output"), "srun got the step's output");

    for (path, _) in &secrets {
        let out = as_user(MALLORY, Path::new("/"), &format!("cat {}", path.display()));
        assert!(!out.status.success(), "Mallory read {}: {}", path.display(), String::from_utf8_lossy(&out.stdout));
        assert!(!String::from_utf8_lossy(&out.stdout).contains("alice-secret"));
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    }
    for listed in [&batch, &step] {
        let out = as_user(MALLORY, Path::new("/"), &format!("ls {}", listed.display()));
        assert!(!out.status.success(), "Mallory listed {}", listed.display());
    }
    for pid in [batch_pid, step_pid, supervisor] {
        for signal in ["TERM", "KILL", "STOP"] {
            let out = as_user(MALLORY, Path::new("/"), &format!("kill -{signal} {pid}"));
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "Mallory sent SIG{signal} to {pid}");
            assert!(said.contains("not permitted"), "kill -{signal} {pid} as Mallory: {said}");
        }
    }
    // Alice herself may (it is her process): the refusals were about Mallory, not a wrong pid.
    assert!(as_user(ALICE, Path::new("/"), &format!("kill -0 {step_pid}")).status.success());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sh.state(id), "RUNNING");
    assert!(alive(batch_pid) && alive(step_pid) && alive(supervisor));
    assert!(stat_field(step_pid, 3) != "T", "Alice's step was stopped");
    sh.ok("scancel", &[&id.to_string()]);
    assert_eq!(sh.wait_done(id), "CANCELLED by 0");
}

/// Alice makes her output file a FIFO nobody reads. Opening a FIFO for writing waits for a reader, and the node
/// opens a job's output files before the job starts: a blocking open would hang the job's supervisor before there
/// is any task to signal, so the job could be neither cancelled nor timed out, and its GPU would never go to the
/// next job. The job must fail at once instead, and the next job gets the GPU; a FIFO that has a reader still
/// works as an output file.
#[test]
fn an_output_fifo_nobody_reads_fails_the_job_instead_of_hanging_the_node() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = node(dir.path(), 1);
    let made = as_user(ALICE, &sh.cwd, "mkfifo trap.fifo read.fifo");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));

    let trapped = sh.submit_as(ALICE, &["--gres=gpu:1", "-t", "0:05", "-o", "trap.fifo", "--wrap", "sleep 300"]);
    let next = sh.submit_as(ALICE, &["--gres=gpu:1", "-o", "next.out", "--wrap", "echo next ran"]);
    let state = sh.wait_done(trapped);
    assert_eq!(state, "FAILED", "the job with an unread FIFO as its output");
    assert_eq!(sh.wait_done(next), "COMPLETED");
    assert_eq!(sh.wait_file("next.out"), "next ran\n");

    // With a reader (here the test, holding the FIFO open), the FIFO is an output file like any other.
    let reader =
        fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(sh.cwd.join("read.fifo")).unwrap();
    let id = sh.submit_as(ALICE, &["-o", "read.fifo", "--wrap", "echo through the fifo"]);
    assert_eq!(sh.wait_done(id), "COMPLETED");
    let mut got = String::new();
    std::io::Read::read_to_string(&mut &reader, &mut got).unwrap();
    assert_eq!(got, "through the fifo\n");
}

/// The output of a step that `srun` streams back passes through the node: before, the task wrote it into its
/// directory there (the agent's state directory, beside the node's lease and journal), with nothing to slow the
/// writer down, so `srun yes` filled the state disk, the lease and task results could no longer be written, and every
/// job on the node failed. Now it flows through a pipe the agent reads as fast as `srun` takes it, and the writer
/// waits. Alice's step runs `yes` (srun throws it away) while the node's state disk is a 32 MiB tmpfs; Mallory's job
/// on the same node must neither notice nor be killed for it.
#[test]
fn a_step_flooding_its_streamed_output_does_not_fill_the_nodes_state_disk() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // The agent's state directory, where `setup` will put it, on a small disk of its own: one for each of its two
    // attempts (on a loaded machine the first start may miss its window, and the second is in `cluster1`).
    let mut disks = Vec::new();
    for attempt in 0..2 {
        let state = dir.path().join(format!("cluster{attempt}/agent-node01/state"));
        match SmallDisk::mount(&state, "32m") {
            Ok(small) => disks.push(small),
            Err(why) => return eprintln!("SKIPPED: cannot mount a 32 MiB tmpfs for the agent's state ({why})"),
        }
        fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (cluster, sh) = node(dir.path(), 2);
    let state = agent(&cluster).data_dir.clone();
    assert!(disks.iter().any(|d| d.0 == state), "the cluster put the agent's state elsewhere: {}", state.display());

    // Mallory submits from a directory of her own (the checkpoint directory `.drover` goes there).
    let own = sh.cwd.join("mallory");
    assert!(as_user(MALLORY, &sh.cwd, "mkdir mallory").status.success());
    let mallory = Shell { cwd: own.clone(), ..sh.clone_shell() };
    let victim = mallory.submit_as(MALLORY, &["--gres=gpu:1", "-o", "victim.out", "--wrap", "sleep 10; echo survived"]);
    mallory.wait_state(victim, "RUNNING");
    let flood = sh.submit_as(ALICE, &["--gres=gpu:1", "-o", "flood.out", "--wrap", "srun yes > /dev/null; sleep 300"]);
    sh.wait_state(flood, "RUNNING");
    assert_eq!(sh.wait_done(victim), "COMPLETED", "Mallory's job paid for Alice's flood");
    assert_eq!(mallory.wait_file("victim.out"), "survived\n");
    sh.ok("scancel", &[&flood.to_string()]);
    drop(cluster);
    drop(disks);
}
