//! One task under its supervisor, end to end: the test process plays the agent, starts the real
//! `drover-agent supervise DIR` through `supervise::spawn`, and reads back what a restarted agent would read.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use drover_agent::supervise::{self, SuperviseError, TaskLaunch, TaskResult, TaskStatus};
use tempfile::TempDir;

mod supervised;

use supervised::{PATIENCE, log_of, wait_finished};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const NOBODY: u32 = 65534;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover-agent"))
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `sh -c SCRIPT` as the test's own user, in `work`, with stdout in `work/out` and stderr in `work/err`.
fn shell_task(work: &Path, script: &str) -> TaskLaunch {
    TaskLaunch {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), PATH.into())],
        cwd: path_str(work),
        // SAFETY: getters that cannot fail.
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        user: String::new(),
        stdout: path_str(&work.join("out")),
        stderr: Some(path_str(&work.join("err"))),
        append: false,
        lease_file: None,
        make_dirs: Vec::new(),
        cgroup: None,
        gpus: Vec::new(),
        journal: None,
        // The tests run as root or as themselves; as root, a task of their own uid is a root task.
        allow_root: true,
        stdin: None,
        node: String::new(),
        container: None,
    }
}

fn path_str(path: &Path) -> String {
    path.to_str().expect("temporary paths are UTF-8").to_string()
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn run_to_end(dir: &Path, launch: &TaskLaunch) -> TaskResult {
    supervise::spawn(exe(), dir, launch).unwrap_or_else(|e| panic!("spawn failed: {e}"));
    wait_finished(dir)
}

/// Waits for a file a script writes (`echo ... > file`) to be complete, i.e. end with a newline.
fn wait_for_line(path: &Path) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().to_string();
        }
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        sleep(Duration::from_millis(20));
    }
}

/// A pid is alive when a process holds it and it is not a zombie (our reaper, pid 1, may not reap).
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            !matches!(stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

fn wait_until_dead(pid: i32) {
    let deadline = Instant::now() + PATIENCE;
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} is still alive");
        sleep(Duration::from_millis(20));
    }
}

fn send(pid: u32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill({pid}, {signal})");
}

#[test]
fn a_failing_task_leaves_its_output_its_exit_code_and_its_usage() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    // Burns a little CPU so the accounting has something to count.
    let script = "echo to stdout; echo to stderr >&2; i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done; exit 3";

    let result = run_to_end(&dir, &shell_task(work.path(), script));

    assert_eq!(read(work.path().join("out")), "to stdout\n");
    assert_eq!(read(work.path().join("err")), "to stderr\n");
    assert_eq!((result.exit_code, result.signal, result.error.as_deref()), (3, 0, None));
    assert!(result.cpu_ms > 0 && result.cpu_ms < 60_000, "cpu_ms {}", result.cpu_ms);
    assert!(result.max_rss_kb > 0 && result.max_rss_kb < 1 << 20, "max_rss_kb {}", result.max_rss_kb);
    assert!(result.started_ms > 1_600_000_000_000 && result.ended_ms >= result.started_ms, "{result:?}");
}

#[test]
fn stderr_shares_the_stdout_file_unless_it_has_its_own() {
    let work = TempDir::new().unwrap();
    let mut launch = shell_task(work.path(), "echo one; echo two >&2; echo three");
    launch.stderr = None;

    let result = run_to_end(&work.path().join("task"), &launch);

    assert_eq!(result.exit_code, 0);
    assert_eq!(read(work.path().join("out")), "one\ntwo\nthree\n");
    assert!(!work.path().join("err").exists());
}

#[test]
fn the_task_sees_exactly_the_environment_it_was_given() {
    let work = TempDir::new().unwrap();
    let mut launch = shell_task(work.path(), "");
    // A bare name, found through the task's PATH.
    launch.argv = vec!["env".into()];
    launch.env = vec![
        ("PATH".into(), PATH.into()),
        ("DROVER_GREETING".into(), "hello world".into()),
        ("EMPTY".into(), String::new()),
    ];
    // The test process itself has plenty the task must not see (cargo sets CARGO_* for every test run).
    assert!(std::env::vars_os().count() > 3);

    let result = run_to_end(&work.path().join("task"), &launch);

    assert_eq!(result.exit_code, 0, "{result:?}");
    let mut seen: Vec<String> = read(work.path().join("out")).lines().map(String::from).collect();
    seen.sort();
    // And, as Slurm's tasks, SLURM_TASK_PID: its own pid, the one the supervisor recorded.
    let task_pid = seen.iter().position(|l| l.starts_with("SLURM_TASK_PID=")).map(|i| seen.remove(i));
    let recorded = read(work.path().join("task").join("task.pid"));
    let pid = recorded.split_whitespace().next().unwrap();
    assert_eq!(task_pid, Some(format!("SLURM_TASK_PID={pid}")), "{recorded}");
    assert_eq!(seen, ["DROVER_GREETING=hello world".to_string(), "EMPTY=".into(), format!("PATH={PATH}")]);
}

#[test]
fn append_mode_keeps_earlier_output_and_truncate_mode_replaces_it() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    fs::write(&out, "from an earlier run\n").unwrap();

    let mut appending = shell_task(work.path(), "echo appended");
    appending.append = true;
    assert_eq!(run_to_end(&work.path().join("first"), &appending).exit_code, 0);
    assert_eq!(read(&out), "from an earlier run\nappended\n");

    let truncating = shell_task(work.path(), "echo fresh");
    assert_eq!(run_to_end(&work.path().join("second"), &truncating).exit_code, 0);
    assert_eq!(read(&out), "fresh\n");
}

#[test]
fn a_missing_program_ends_with_execves_errno_and_says_so_in_the_stderr_file() {
    let work = TempDir::new().unwrap();
    let mut launch = shell_task(work.path(), "");
    launch.argv = vec!["/bin/nonexistent".into(), "--flag".into()];

    let result = run_to_end(&work.path().join("absolute"), &launch);

    // As slurmstepd: the task's exit code is execve's errno (ENOENT).
    assert_eq!(result.exit_code, 2);
    assert_eq!(result.error.as_deref(), Some("execve(/bin/nonexistent): No such file or directory"));
    assert_eq!(
        read(work.path().join("err")),
        "slurmstepd: error: execve(): /bin/nonexistent: No such file or directory\n"
    );

    // A bare name that is nowhere on the task's PATH fails the same way.
    launch.argv = vec!["no-such-drover-command".into()];
    let result = run_to_end(&work.path().join("bare"), &launch);
    assert_eq!(result.exit_code, 2);
    assert_eq!(result.error.as_deref(), Some("execve(no-such-drover-command): No such file or directory"));
}

#[test]
fn a_missing_working_directory_ends_with_1_and_says_so_in_the_stderr_file() {
    let work = TempDir::new().unwrap();
    let mut launch = shell_task(work.path(), "echo should not run");
    launch.cwd = "/nonexistent-drover-dir".into();

    let result = run_to_end(&work.path().join("task"), &launch);

    assert_eq!(result.exit_code, 1);
    assert_eq!(result.error.as_deref(), Some("chdir(/nonexistent-drover-dir): No such file or directory"));
    assert!(read(work.path().join("err")).contains("couldn't chdir to `/nonexistent-drover-dir'"));
    assert_eq!(read(work.path().join("out")), "");
}

#[test]
fn an_output_directory_made_just_after_the_launch_is_waited_for_and_one_never_made_fails_the_task() {
    let work = TempDir::new().unwrap();
    let logs = work.path().join("logs/rule_a");
    let mut launch = shell_task(work.path(), "echo ran");
    launch.stdout = path_str(&logs.join("1.log"));
    launch.stderr = None;
    supervise::spawn(exe(), &work.path().join("late"), &launch).unwrap();
    // The tool makes its log directory a moment after the job already started.
    sleep(Duration::from_millis(800));
    fs::create_dir_all(&logs).unwrap();
    let result = wait_finished(&work.path().join("late"));
    assert_eq!((result.exit_code, result.error.as_deref()), (0, None), "{result:?}");
    assert_eq!(read(logs.join("1.log")), "ran\n");

    // A directory that never appears fails the task after the grace, naming the file.
    launch.stdout = path_str(&work.path().join("never/1.log"));
    let started = Instant::now();
    let result = run_to_end(&work.path().join("never-made"), &launch);
    assert!(started.elapsed() >= Duration::from_millis(supervise::OUTPUT_DIR_GRACE_MS), "{result:?}");
    assert_ne!(result.exit_code, 0);
    assert!(result.error.as_deref().is_some_and(|e| e.contains("never/1.log")), "{result:?}");
}

#[test]
fn sigterm_through_signal_ends_the_task_and_what_it_started_in_its_group() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let bg_pid_file = work.path().join("bg.pid");
    let script = format!("sleep 30 & echo $! > {}; sleep 30; wait", bg_pid_file.display());
    supervise::spawn(exe(), &dir, &shell_task(work.path(), &script)).unwrap();
    // Once the supervisor has recorded the task (before that, signal() says NotStarted).
    wait_for_line(&dir.join(supervise::TASK_PID_FILE));
    let background: i32 = wait_for_line(&bg_pid_file).parse().unwrap();
    assert!(alive(background), "the background sleep should be running before the signal");

    assert!(supervise::signal(&dir, libc::SIGTERM).unwrap(), "the task was running, signal() must say so");
    let result = wait_finished(&dir);

    assert_eq!((result.exit_code, result.signal), (0, libc::SIGTERM), "{result:?}");
    // SAFETY: kill(pid, 0) only checks for existence.
    let probe = unsafe { libc::kill(background, 0) };
    assert_eq!((probe, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ESRCH)));
    assert!(!supervise::signal(&dir, libc::SIGTERM).unwrap(), "a finished task is gone");
}

#[test]
fn nothing_the_task_started_outlives_it() {
    let work = TempDir::new().unwrap();
    let (in_group, escaped) = (work.path().join("in_group.pid"), work.path().join("escaped.pid"));
    // One leftover stays in the task's process group, one leaves it (and its session) with setsid.
    let script = format!(
        "sleep 300 & echo $! > {}; setsid sleep 300 & echo $! > {}; exit 0",
        in_group.display(),
        escaped.display()
    );

    let result = run_to_end(&work.path().join("task"), &shell_task(work.path(), &script));

    assert_eq!((result.exit_code, result.signal), (0, 0), "{result:?}");
    assert_eq!(read(work.path().join("err")), "", "both sleeps must have started");
    for file in [&in_group, &escaped] {
        let pid: i32 = wait_for_line(file).parse().unwrap();
        assert!(!alive(pid), "{} ({pid}) outlived its task", file.display());
    }
}

/// Set in a copy of this test binary that plays an agent: it starts the task and waits to be killed.
const AGENT_DIR_VAR: &str = "DROVER_TEST_AGENT_TASK_DIR";

fn release_file(work: &Path) -> PathBuf {
    work.join("release")
}

fn waiting_task(work: &Path) -> TaskLaunch {
    let release = release_file(work);
    // Bounded, so a failed test cannot leave a task waiting forever for a file in a deleted directory.
    let script = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo finished",
        release.display()
    );
    shell_task(work, &script)
}

#[test]
fn the_task_outlives_the_agent_that_started_it() {
    if let Some(dir) = std::env::var_os(AGENT_DIR_VAR) {
        let dir = PathBuf::from(dir);
        let pid = supervise::spawn(exe(), &dir, &waiting_task(dir.parent().unwrap())).unwrap();
        println!("spawned {pid}");
        sleep(PATIENCE);
        return;
    }
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let mut agent = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "the_task_outlives_the_agent_that_started_it", "--nocapture", "--test-threads=1"])
        .env(AGENT_DIR_VAR, &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let spawned = BufReader::new(agent.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        // libtest prints the line after its own "test NAME ... ".
        .find_map(|line| line.rsplit_once("spawned ").map(|(_, pid)| pid.trim().parse::<u32>().unwrap()))
        .expect("the agent never reported the supervisor's pid");

    // The agent crashes.
    agent.kill().unwrap();
    agent.wait().unwrap();

    // A restarted agent knows nothing but the directory: the task is still there, under the same supervisor, which
    // was never the agent's child.
    assert_eq!(supervise::status(&dir), TaskStatus::Running { pid: spawned });
    let stat = read(format!("/proc/{spawned}/stat"));
    let parent: u32 = stat.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_ne!(parent, agent.id(), "the supervisor must not be the agent's child");
    assert_eq!(supervise::read_launch(&dir).unwrap(), waiting_task(work.path()));

    fs::write(release_file(work.path()), "").unwrap();
    let result = wait_finished(&dir);
    assert_eq!((result.exit_code, result.signal), (0, 0), "{result:?}");
    assert_eq!(read(work.path().join("out")), "finished\n");
}

#[test]
fn terminating_the_supervisor_stops_its_task_and_still_records_how_it_ended() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let supervisor = supervise::spawn(exe(), &dir, &waiting_task(work.path())).unwrap();
    wait_for_line(&dir.join(supervise::TASK_PID_FILE));

    send(supervisor, libc::SIGTERM);
    let result = wait_finished(&dir);

    assert_eq!((result.exit_code, result.signal), (0, libc::SIGTERM), "{result:?}");
    // The supervisor exits right after writing the result.
    wait_until_dead(supervisor as i32);
}

#[test]
fn a_killed_supervisor_is_reported_lost_and_its_task_can_still_be_stopped() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let supervisor = supervise::spawn(exe(), &dir, &waiting_task(work.path())).unwrap();
    let task_pid: i32 = wait_for_line(&dir.join(supervise::TASK_PID_FILE)).split(' ').next().unwrap().parse().unwrap();

    send(supervisor, libc::SIGKILL);
    wait_until_dead(supervisor as i32);

    match supervise::status(&dir) {
        TaskStatus::Lost(why) => assert!(why.contains("died without a result"), "{why}"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(alive(task_pid), "SIGKILL on the supervisor leaves the task orphaned, not dead");
    assert!(supervise::signal(&dir, libc::SIGKILL).unwrap());
    wait_until_dead(task_pid);
    assert!(!supervise::signal(&dir, libc::SIGKILL).unwrap(), "the task is gone now");
}

/// A directory the unprivileged `nobody` can enter (temporary directories are root-only).
fn open_to_everyone(dir: &Path) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
}

fn chown_to_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
}

#[test]
fn a_root_supervisor_runs_the_task_as_its_user_with_the_users_groups() {
    if !is_root() {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let work = TempDir::new().unwrap();
    open_to_everyone(work.path());
    let home = work.path().join("home");
    fs::create_dir(&home).unwrap();
    chown_to_nobody(&home);
    let mut launch = shell_task(&home, "id -u; id -g; id -G");
    (launch.uid, launch.gid, launch.user, launch.stderr) = (NOBODY, NOBODY, "nobody".into(), None);

    let result = run_to_end(&work.path().join("task"), &launch);

    assert_eq!(result.exit_code, 0, "{result:?}");
    // Not root's uid, not root's group 0 among the supplementary groups.
    assert_eq!(read(home.join("out")), "65534\n65534\n65534\n");
    assert_eq!(fs::metadata(home.join("out")).unwrap().uid(), NOBODY, "the user owns the output file");
}

#[test]
fn a_task_cannot_write_its_output_where_its_user_may_not() {
    if !is_root() {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let work = TempDir::new().unwrap();
    open_to_everyone(work.path());
    let private = work.path().join("root-only");
    fs::create_dir(&private).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let mut launch = shell_task(work.path(), "echo should not run");
    (launch.uid, launch.gid, launch.user) = (NOBODY, NOBODY, "nobody".into());
    launch.stdout = path_str(&private.join("out"));

    let result = run_to_end(&work.path().join("task"), &launch);

    assert_eq!(result.exit_code, 1);
    assert_eq!(result.error, Some(format!("open({}): Permission denied", launch.stdout)));
    assert!(!private.join("out").exists(), "the supervisor must not create the file with root's rights");
}

#[test]
fn a_supervisor_that_is_not_root_refuses_a_task_of_another_user() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let mut launch = shell_task(work.path(), "echo should not run");
    launch.uid = 0;
    if is_root() {
        // Play an unprivileged agent: the supervisor runs as nobody and is asked to run root's task.
        open_to_everyone(work.path());
        fs::create_dir(&dir).unwrap();
        chown_to_nobody(&dir);
        fs::write(dir.join(supervise::LAUNCH_FILE), serde_json::to_vec(&launch).unwrap()).unwrap();
        let started =
            Command::new(exe()).arg("supervise").arg(&dir).uid(NOBODY).gid(NOBODY).stdout(Stdio::null()).status();
        assert!(started.unwrap().success(), "the supervisor itself should start; log:\n{}", log_of(&dir));
    } else {
        supervise::spawn(exe(), &dir, &launch).unwrap();
    }

    let result = wait_finished(&dir);

    assert_eq!(result.exit_code, 1);
    let error = result.error.unwrap_or_default();
    assert!(error.starts_with("cannot switch user"), "{error}");
    assert!(!work.path().join("out").exists(), "the task must not have run");
}

#[test]
fn a_launch_without_a_program_is_refused_before_anything_runs() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let mut launch = shell_task(work.path(), "");
    launch.argv.clear();

    let refused = supervise::spawn(exe(), &dir, &launch);

    assert!(matches!(refused, Err(SuperviseError::InvalidLaunch { .. })), "{refused:?}");
    assert!(!dir.join(supervise::LAUNCH_FILE).exists());
    let mut relative = shell_task(work.path(), "true");
    relative.stdout = "out.txt".into();
    let refused = supervise::spawn(exe(), &dir, &relative).unwrap_err();
    assert!(refused.to_string().contains("\"out.txt\" is not an absolute path"), "{refused}");
}

#[test]
fn an_oversized_launch_file_is_refused() {
    let work = TempDir::new().unwrap();
    let file = fs::File::create(work.path().join(supervise::LAUNCH_FILE)).unwrap();
    file.set_len(supervise::MAX_LAUNCH_BYTES + 1).unwrap();

    let refused = supervise::read_launch(work.path());

    assert!(matches!(refused, Err(SuperviseError::TooLarge { .. })), "{refused:?}");
}

#[test]
fn a_task_directory_is_used_for_one_task_only() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("task");
    let launch = shell_task(work.path(), "true");
    run_to_end(&dir, &launch);

    let again = supervise::spawn(exe(), &dir, &launch);

    assert!(matches!(again, Err(SuperviseError::AlreadyLaunched { .. })), "{again:?}");
}

/// The supervisor runs as root on a real node: nothing of the agent's environment (LD_PRELOAD, LD_LIBRARY_PATH,
/// or here the CARGO_* variables this test process was started with) may reach it.
#[test]
fn the_supervisor_starts_with_a_clean_environment() {
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")), "the test itself runs with cargo's variables");
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("task");
    let launch = shell_task(tmp.path(), "sleep 30");
    let pid = supervise::spawn(exe(), &dir, &launch).unwrap();
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    let vars: Vec<String> =
        environ.split(|b| *b == 0).filter(|v| !v.is_empty()).map(|v| String::from_utf8_lossy(v).into_owned()).collect();
    assert_eq!(vars, ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "the supervisor's environment");
    // The task may not have started yet: signal until it has.
    let deadline = Instant::now() + PATIENCE;
    while !matches!(supervise::signal(&dir, libc::SIGKILL), Ok(true)) {
        assert!(Instant::now() < deadline, "the task never started");
        sleep(Duration::from_millis(10));
    }
    wait_finished(&dir);
}

/// The node's lease, enforced where the task is: when it expires (its agent dead, hung or cut off), the supervisor
/// kills the task by itself and records that it was fenced.
#[test]
fn the_supervisor_kills_its_task_when_the_nodes_lease_expires() {
    let tmp = TempDir::new().unwrap();
    let lease = tmp.path().join(drover_agent::lease::LEASE_FILE);
    drover_agent::lease::write(&lease, drover_agent::lease::boottime_ms() + 700).unwrap();
    let dir = tmp.path().join("task");
    let mut launch = shell_task(tmp.path(), "sleep 60");
    launch.lease_file = Some(path_str(&lease));
    launch.make_dirs = vec![path_str(&tmp.path().join("ckpt/7/0"))];
    let started = Instant::now();
    supervise::spawn(exe(), &dir, &launch).unwrap();
    let result = wait_finished(&dir);
    assert!(result.fenced, "{result:?}");
    assert_eq!(result.signal, libc::SIGKILL);
    assert!(started.elapsed() < Duration::from_secs(10), "killed at the lease's end, not at the task's");
    assert!(tmp.path().join("ckpt/7/0").is_dir(), "its directories were made before it started");

    // A renewed lease keeps a task running to its natural end.
    drover_agent::lease::write(&lease, drover_agent::lease::boottime_ms() + 60_000).unwrap();
    let dir = tmp.path().join("task2");
    let mut launch = shell_task(tmp.path(), "sleep 0.5; exit 3");
    launch.lease_file = Some(path_str(&lease));
    let result = run_to_end(&dir, &launch);
    assert_eq!((result.exit_code, result.fenced), (3, false));
}

/// A memory cgroup of this test's own, or why the host has none (not root, no memory controller).
fn memory_root(name: &str) -> Result<drover_agent::cgroup::CgroupRoot, String> {
    if !is_root() {
        return Err("not root".into());
    }
    drover_agent::cgroup::detect(&format!("drover-test/{name}-{}", std::process::id())).map_err(|e| e.to_string())
}

/// As [`memory_root`], with CPU pinning on, or why the host cannot pin (no cpuset controller).
fn pinning_root(name: &str) -> Result<drover_agent::cgroup::CgroupRoot, String> {
    let mut root = memory_root(name)?;
    let subdir = format!("drover-test/{name}-{}", std::process::id());
    if let Err(why) = drover_agent::cgroup::enable_cpuset(&mut root, &subdir) {
        remove_roots(&root);
        return Err(why.to_string());
    }
    Ok(root)
}

/// Removes a test's cgroup roots (and their `drover-test` parents when no other test uses them).
fn remove_roots(root: &drover_agent::cgroup::CgroupRoot) {
    for base in std::iter::once(&root.path).chain(&root.cpuacct).chain(&root.cpuset) {
        let _ = fs::remove_dir(base);
        let _ = fs::remove_dir(base.parent().unwrap());
    }
}

fn confined(work: &Path, script: &str, root: &drover_agent::cgroup::CgroupRoot, job: u64) -> TaskLaunch {
    TaskLaunch {
        cgroup: Some(supervise::TaskCgroup { root: root.clone(), job, incarnation: 0, limit_mb: 64, cpus: Vec::new() }),
        ..shell_task(work, script)
    }
}

#[test]
fn a_task_over_its_jobs_memory_is_killed_and_says_out_of_memory() {
    let root = match memory_root("oom") {
        Ok(root) => root,
        Err(why) => return eprintln!("SKIPPED: memory cannot be confined on this host: {why}"),
    };
    let work = TempDir::new().unwrap();
    // `tail` keeps the whole "line" of zeros: 400 MiB against a 64 MiB limit.
    let hog = run_to_end(&work.path().join("hog"), &confined(work.path(), "head -c 400M /dev/zero | tail", &root, 1));
    assert!(hog.oom, "{hog:?}\n{}", log_of(&work.path().join("hog")));
    assert!(hog.max_rss_kb < 80 << 10, "confined near 64 MiB, far below 400: {hog:?}");
    // Within the limit: runs to the end. The job's cgroup stays for the agent to read the usage, then remove.
    let fine =
        run_to_end(&work.path().join("fine"), &confined(work.path(), "head -c 16M /dev/zero | tail | wc -c", &root, 2));
    assert_eq!((fine.exit_code, fine.signal, fine.oom), (0, 0, false), "{fine:?}");
    assert_eq!(read(work.path().join("out")).trim(), (16 << 20).to_string());
    assert!(root.path.join("job_2.0").is_dir(), "the job's cgroup outlives its task");
    for job in [1, 2] {
        assert!(drover_agent::cgroup::remove_job(&root, job, 0).unwrap(), "an empty job cgroup is removed");
    }
    assert!(!root.path.join("job_2.0").exists());
    remove_roots(&root);
}

/// Busy work in the shell, so the task has CPU time to count (a few hundred ms).
const SPIN: &str = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";

/// Usage accounting: the job's cgroup counts every task of the job on the node, one after the other (the steps of
/// a job), and what they started; the agent reads it when the job ends here.
#[test]
fn a_jobs_cgroup_counts_the_cpu_time_and_peak_memory_of_all_its_tasks() {
    let root = match memory_root("usage") {
        Ok(root) => root,
        Err(why) => return eprintln!("SKIPPED: no job cgroups on this host: {why}"),
    };
    let work = TempDir::new().unwrap();
    let mut launch = confined(work.path(), &format!("{SPIN}; head -c 48M /dev/zero | tail | wc -c"), &root, 3);
    launch.cgroup.as_mut().unwrap().limit_mb = 0; // measured without being limited
    let first = run_to_end(&work.path().join("first"), &launch);
    let second = run_to_end(&work.path().join("second"), &confined(work.path(), SPIN, &root, 3));
    assert_eq!((first.exit_code, second.exit_code), (0, 0), "{first:?} {second:?}");
    let usage = drover_agent::cgroup::job_usage(&root, 3, 0, None).expect("the job has a cgroup");
    let rusage_ms = first.cpu_ms + second.cpu_ms;
    match usage.cpu_ms {
        // Both tasks, as the kernel counted them (their own rusage, give or take a tick each).
        Some(cpu_ms) => assert!(
            cpu_ms + 50 >= rusage_ms && cpu_ms <= rusage_ms + 500,
            "cgroup {cpu_ms} ms against rusage {rusage_ms} ms"
        ),
        None => assert_eq!(root.cpuacct, None, "CPU time is missing only without a cpuacct hierarchy"),
    }
    let peak_kb = usage.mem_peak_kb.expect("memory is always measured");
    assert!(peak_kb >= 40 << 10, "the 48 MiB line was held at once: {peak_kb} KiB");
    assert_eq!(drover_agent::cgroup::job_usage(&root, 4, 0, None), None, "a job that ran nothing here: no figures");
    assert!(drover_agent::cgroup::remove_job(&root, 3, 0).unwrap());
    assert_eq!(drover_agent::cgroup::job_usage(&root, 3, 0, None), None);
    remove_roots(&root);
}

/// CPU pinning: a pinned job's tasks see exactly its CPUs (`nproc`, `Cpus_allowed_list`), and the next job gets
/// CPUs no other job has.
#[test]
fn a_pinned_jobs_tasks_run_only_on_its_cpus() {
    let root = match pinning_root("cpus") {
        Ok(root) => root,
        Err(why) => return eprintln!("SKIPPED: tasks cannot be pinned to CPUs on this host: {why}"),
    };
    let work = TempDir::new().unwrap();
    let (all, _) = drover_agent::cgroup::cpu_pool(&root, (0, 0)).expect("the root's CPUs are readable");
    let pinned = |job: u64| {
        let pool = drover_agent::cgroup::cpu_pool(&root, (job, 0));
        let cpus = drover_agent::cgroup::cpus_to_pin(None, pool, 1).unwrap();
        let mut launch = confined(work.path(), "nproc; grep Cpus_allowed_list /proc/self/status", &root, job);
        launch.cgroup.as_mut().unwrap().cpus = cpus.clone();
        launch.stdout = path_str(&work.path().join(format!("out{job}")));
        // The agent makes the cgroup before it starts the task; the supervisor finds it made.
        drover_agent::cgroup::create_job(&root, job, 0, 64, &cpus).unwrap();
        let dir = work.path().join(format!("task{job}"));
        let result = run_to_end(&dir, &launch);
        assert_eq!(result.exit_code, 0, "{result:?}\n{}", log_of(&dir));
        (cpus, read(work.path().join(format!("out{job}"))))
    };
    let (first, out) = pinned(5);
    let list = drover_agent::cgroup::format_cpu_list(&first);
    assert_eq!(out, format!("1\nCpus_allowed_list:\t{list}\n"), "pinned to CPU {list} of {all:?}");
    if all.len() > 1 {
        // The first job's cgroup is still there (its CPUs taken): the second gets another CPU.
        let (second, out) = pinned(6);
        assert_ne!(second, first);
        assert_eq!(out, format!("1\nCpus_allowed_list:\t{}\n", drover_agent::cgroup::format_cpu_list(&second)));
    }
    for job in [5, 6] {
        assert!(drover_agent::cgroup::remove_job(&root, job, 0).unwrap());
    }
    remove_roots(&root);
}
