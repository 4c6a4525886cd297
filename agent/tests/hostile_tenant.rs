//! A hostile tenant on a GPU node: an ordinary user with a job tries to get root's help through the files the
//! root agent and the root supervisors act on. Each story is an attack that worked before the node's privilege
//! boundary (`drover_agent::userfile`, `supervise::check_control_files`) and asserts that nothing outside the job
//! changed. Real supervisor processes, real uids (60001 and 60002, which need no passwd entry); the stories need
//! root, as the agent does, and say SKIPPED without it.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use drover_agent::supervise::{self, TaskLaunch};
use drover_agent::userfile;
use tempfile::TempDir;

mod supervised;

use supervised::{PATIENCE, log_of, wait_finished};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The tenant whose job runs on the node.
const ALICE: u32 = 60001;
/// Another tenant with a shell on the same node.
const MALLORY: u32 = 60002;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover-agent"))
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: the node's privilege boundary is only there when the agent runs as root");
            return;
        }
    };
}

/// A scratch directory every user may enter (temporary directories are root's alone), as `/var/lib/drover` is.
fn node_dir() -> TempDir {
    let dir = TempDir::new().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Runs `sh -c script` as `uid`; true when it succeeded.
fn as_user(uid: u32, script: &str) -> bool {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .uid(uid)
        .gid(uid)
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn task(work: &Path, uid: u32, script: &str) -> TaskLaunch {
    TaskLaunch {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), PATH.into())],
        cwd: work.display().to_string(),
        uid,
        gid: uid,
        user: String::new(),
        stdout: "/dev/null".into(),
        stderr: None,
        append: false,
        lease_file: None,
        make_dirs: Vec::new(),
        cgroup: None,
        gpus: Vec::new(),
        journal: None,
        allow_root: false,
        stdin: None,
        node: String::new(),
        container: None,
    }
}

/// A root-owned file outside the job, the target of the attacks.
fn precious(dir: &Path) -> PathBuf {
    let path = dir.join("precious");
    fs::write(&path, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    path
}

fn assert_untouched(path: &Path) {
    assert_eq!(fs::read_to_string(path).unwrap(), "root:x:0:0:root:/root:/bin/bash\n", "{} changed", path.display());
}

/// Finding 1: the user renamed a launch file of their own over the agent's, or planted links where root writes.
/// The task directory is root's now: the job's user can put nothing in it.
#[test]
fn the_jobs_user_cannot_put_anything_in_a_task_directorys_control_files() {
    needs_root!();
    let node = node_dir();
    let target = precious(node.path());
    let control = node.path().join("tasks/7.0.batch");
    userfile::make_control_dir(&control).unwrap();
    let work = userfile::make_work_dir(&control, ALICE, ALICE, Some(b"#!/bin/sh\necho hello\n")).unwrap();
    let c = control.display();
    let t = target.display();

    // What the job itself may do: its own directory is its own.
    assert!(as_user(ALICE, &format!("echo mine > {}/notes", work.display())));
    // What it tried: a launch of its choosing, a link for root's atomic write, a link for the supervisor's log.
    let attacks = [
        format!("echo '{{\"argv\":[\"/bin/sh\"],\"uid\":0}}' > {c}/launch.json"),
        format!("mv {}/script {c}/launch.json", work.display()),
        format!("ln -s {t} {c}/.result.json.tmp.1234"),
        format!("ln -s {t} {c}/{}", supervise::SUPERVISOR_LOG),
        format!("echo '1 1 1' > {c}/{}", "task.pid"),
        format!("chmod 777 {c}"),
    ];
    for attack in &attacks {
        assert!(!as_user(ALICE, attack), "the job's user could run `{attack}` in its task directory");
    }
    let names: Vec<String> =
        fs::read_dir(&control).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, vec![userfile::WORK_DIR.to_string()], "only the work directory is in the control directory");
    let meta = fs::metadata(&control).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, userfile::CONTROL_DIR_MODE));
    assert_untouched(&target);
}

/// Finding 1, at the supervisor: a launch file that is not root's alone (what the rename produced) is refused,
/// whatever it asks for.
#[test]
fn a_root_supervisor_refuses_a_launch_file_the_jobs_user_could_have_written() {
    needs_root!();
    let node = node_dir();
    let marker = node.path().join("ran-as-root");
    let dir = node.path().join("task");
    userfile::make_control_dir(&dir).unwrap();
    let mut launch = task(node.path(), 0, &format!("id -u > {}", marker.display()));
    launch.allow_root = true;
    let file = dir.join(supervise::LAUNCH_FILE);
    fs::write(&file, serde_json::to_vec(&launch).unwrap()).unwrap();
    std::os::unix::fs::chown(&file, Some(ALICE), Some(ALICE)).unwrap();

    let started = Command::new(exe()).arg("supervise").arg(&dir).stdout(Stdio::null()).status().unwrap();
    assert!(started.success());
    let result = wait_finished(&dir);

    assert_eq!(result.exit_code, 1, "{result:?}");
    let error = result.error.unwrap_or_default();
    assert!(error.contains("is not root's alone"), "{error}");
    assert!(!marker.exists(), "the forged launch ran");
}

/// Finding 1: the supervisor itself holds the line on root jobs, not only the agent that wrote the launch.
#[test]
fn a_root_task_runs_only_on_a_cluster_that_allows_root_jobs() {
    needs_root!();
    let node = node_dir();
    let marker = node.path().join("ran-as-root");
    let launch = task(node.path(), 0, &format!("id -u > {}", marker.display()));

    supervise::spawn(exe(), &node.path().join("refused"), &launch).unwrap();
    let refused = wait_finished(&node.path().join("refused"));
    assert_eq!(refused.exit_code, 1);
    assert_eq!(refused.error.as_deref(), Some("jobs may not run as root on this cluster (allow_root_jobs is off)"));
    assert!(!marker.exists());

    supervise::spawn(exe(), &node.path().join("allowed"), &TaskLaunch { allow_root: true, ..launch }).unwrap();
    assert_eq!(wait_finished(&node.path().join("allowed")).exit_code, 0);
    assert_eq!(fs::read_to_string(&marker).unwrap(), "0\n");
}

/// Finding 1: a link planted as the supervisor's log is not followed, and a job's text with a newline and a
/// passwd-format line stays one escaped line of the log.
#[test]
fn the_supervisor_log_follows_no_link_and_a_job_cannot_forge_lines_in_it() {
    needs_root!();
    let node = node_dir();
    let target = precious(node.path());
    let forged = "/no/such/program\nevil::0:0::/root:/bin/sh";
    let mut launch = task(node.path(), ALICE, "");
    launch.argv = vec![forged.into()];

    let linked = node.path().join("linked");
    userfile::make_control_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&target, linked.join(supervise::SUPERVISOR_LOG)).unwrap();
    supervise::spawn(exe(), &linked, &launch).unwrap();
    assert_eq!(wait_finished(&linked).exit_code, libc::ENOENT);
    assert_untouched(&target);

    let plain = node.path().join("plain");
    supervise::spawn(exe(), &plain, &launch).unwrap();
    assert_eq!(wait_finished(&plain).exit_code, libc::ENOENT);
    let log = log_of(&plain);
    assert!(log.contains("/no/such/program\\nevil::0:0"), "the job's text is in the log, escaped:\n{log}");
    assert!(!log.lines().any(|line| line.starts_with("evil:")), "a forged line:\n{log}");
    let meta = fs::metadata(plain.join(supervise::SUPERVISOR_LOG)).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600), "the log is root's alone");
}

/// Finding 3: a job's script and the output streamed back to `srun` are its user's alone on the node.
#[test]
fn another_user_on_the_node_cannot_read_a_jobs_script_or_output() {
    needs_root!();
    let node = node_dir();
    let control = node.path().join("tasks/8.0.batch");
    userfile::make_control_dir(&control).unwrap();
    let work = userfile::make_work_dir(&control, ALICE, ALICE, Some(b"#!/bin/sh\nexport API_KEY=hunter2\n")).unwrap();
    let script = work.join("script");
    assert!(as_user(ALICE, &format!("grep -q hunter2 {}", script.display())), "the owner reads their script");
    assert!(as_user(ALICE, &format!("{}", script.display())), "and may run it");
    assert!(!as_user(MALLORY, &format!("cat {}", script.display())), "another user read the script");
    assert!(!as_user(MALLORY, &format!("ls {}", control.display())), "another user listed the task directory");

    // The task writes its own output, as its user, where only its user can read it.
    let step = node.path().join("tasks/8.0.0");
    userfile::make_control_dir(&step).unwrap();
    let step_work = userfile::make_work_dir(&step, ALICE, ALICE, None).unwrap();
    let mut launch = task(&step_work, ALICE, "echo secret-output");
    launch.stdout = step_work.join("stdout").display().to_string();
    supervise::spawn(exe(), &step.join("task"), &launch).unwrap();
    assert_eq!(wait_finished(&step.join("task")).exit_code, 0);
    let out = step_work.join("stdout");
    assert_eq!(fs::metadata(&out).unwrap().uid(), ALICE, "the output file was created by the task as its user");
    assert!(!as_user(MALLORY, &format!("cat {}", out.display())), "another user read the step's output");
    assert!(as_user(ALICE, &format!("grep -q secret-output {}", out.display())));
}

/// The agent reads output back from the user's directory; a link there to a file the user may not read gets the
/// user nothing (finding 3's other side: root as the user's reader).
#[test]
fn the_agent_reads_back_only_files_the_jobs_user_owns() {
    needs_root!();
    let node = node_dir();
    let control = node.path().join("tasks/9.0.0");
    userfile::make_control_dir(&control).unwrap();
    let work = userfile::make_work_dir(&control, ALICE, ALICE, None).unwrap();
    assert!(as_user(ALICE, &format!("ln -s /etc/shadow {}/stdout", work.display())));
    let refused = userfile::open_owned_by(&work.join("stdout"), ALICE);
    assert!(refused.is_err(), "root followed the user's link to /etc/shadow");
    assert!(as_user(ALICE, &format!("mkfifo {}/stderr", work.display())));
    let fifo = userfile::open_owned_by(&work.join("stderr"), ALICE);
    assert!(fifo.is_err(), "a FIFO is not output (and must not block the agent)");
}

/// The start time of `pid` (field 22 of /proc/PID/stat), as the supervisor records it.
fn start_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit(')').next().unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !matches!(stat.rsplit(')').next().and_then(|r| r.trim_start().chars().next()), Some('Z' | 'X')))
        .unwrap_or(false)
}

/// Finding 2: `task.pid` names an unrelated root process (its pid, group and start time); a signal to the job
/// must not reach it. The pid file is root's now, and a pid is signalled only if it is in the job's cgroup.
#[test]
fn a_pid_file_naming_another_process_cannot_aim_a_signal_at_it() {
    needs_root!();
    let root = match drover_agent::cgroup::detect(&format!("drover-test/hostile-{}", std::process::id())) {
        Ok(root) => root,
        Err(why) => return eprintln!("SKIPPED: no job cgroups on this host: {why}"),
    };
    let node = node_dir();
    let release = node.path().join("release");
    let dir = node.path().join("task");
    let mut launch = task(node.path(), ALICE, &format!("while [ ! -e {} ]; do sleep 0.05; done", release.display()));
    launch.cgroup =
        Some(supervise::TaskCgroup { root: root.clone(), job: 11, incarnation: 0, limit_mb: 0, cpus: Vec::new() });
    supervise::spawn(exe(), &dir, &launch).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !dir.join("task.pid").exists() {
        assert!(Instant::now() < deadline, "the task never started:\n{}", log_of(&dir));
        sleep(Duration::from_millis(20));
    }

    let mut victim = Command::new("sleep").arg("60").process_group(0).spawn().unwrap();
    let pid = victim.id();
    fs::write(dir.join("task.pid"), format!("{pid} {pid} {}\n", start_ticks(pid))).unwrap();
    let sent = supervise::signal(&dir, libc::SIGKILL);
    assert!(sent.is_err(), "a signal went to a process outside the job: {sent:?}");
    assert!(alive(pid), "the unrelated process was killed");

    victim.kill().unwrap();
    let _ = victim.wait();
    fs::write(&release, "").unwrap();
    wait_finished(&dir);
    let _ = drover_agent::cgroup::remove_job(&root, 11, 0);
    for base in std::iter::once(&root.path).chain(&root.cpuacct).chain(&root.cpuset) {
        let _ = fs::remove_dir(base);
        let _ = fs::remove_dir(base.parent().unwrap());
    }
}
